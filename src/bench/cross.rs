//! `cross`: one thread allocates, another on the other CPU frees (RX buffers freed by
//! workers): pages pass through a bounded queue; ns per page end to end.

use super::page_api::{peer_names, PageAlloc, ZonalPages};
use super::{best_peer, fmt_ns, paired_ratio, print_table, BenchOpts, Record, Summary};
use crossbeam_queue::ArrayQueue;
use serde_json::json;
use std::time::Instant;
use zonal::Zonal;

/// Passes `n` pages from an allocating thread (CPU 0) to a freeing thread (CPU 1); returns
/// ns per page. Leaves the calling thread bound to CPU 0 (`allow_all_cpus` undoes it).
pub fn cell<A: PageAlloc>(a: &A, n: u64) -> f64 {
    let q: ArrayQueue<usize> = ArrayQueue::new(256);
    let pin = zonal::cpu::nr_cpus_online() > 1;
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            if pin {
                let _ = zonal::cpu::set_affinity(1);
            }
            let mut got = 0;
            while got < n {
                match q.pop() {
                    Some(p) => {
                        a.free(p as *mut u8);
                        got += 1;
                    }
                    None => std::hint::spin_loop(),
                }
            }
        });
        if pin {
            let _ = zonal::cpu::set_affinity(0);
        }
        let mut sent = 0;
        while sent < n {
            let p = a.alloc();
            if p.is_null() {
                continue;
            }
            let mut v = p as usize;
            while let Err(back) = q.push(v) {
                v = back;
                std::hint::spin_loop();
            }
            sent += 1;
        }
    });
    t.elapsed().as_nanos() as f64 / n as f64
}

type Cell<'a> = Box<dyn Fn(u64) -> f64 + 'a>;

fn subject<'a, A: PageAlloc + 'a>(a: A) -> (String, Cell<'a>) {
    (a.name(), Box::new(move |n| cell(&a, n)))
}

/// Every subject of the experiment ((name, cell), whether a peer), before `--only` chooses.
fn subjects(z: &Zonal) -> Vec<((String, Cell<'_>), bool)> {
    let mut subjects: Vec<((String, Cell<'_>), bool)> =
        vec![(subject(ZonalPages { z, label: "zonal pcp", bulk: None }), false)];
    subjects.extend(crate::peer_subjects!(subject).into_iter().map(|s| (s, true)));
    subjects
}

/// The names of [`subjects`], without building an allocator.
pub fn names() -> Vec<String> {
    let mut names = vec!["zonal pcp".to_string()];
    names.extend(peer_names());
    names
}

/// Runs the experiment, prints its table and returns its records.
pub fn run(z: &Zonal, opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let mut subjects = subjects(z);
    subjects.retain(|((n, _), _)| opts.keeps(n));
    if super::only_reference_left(subjects.iter().map(|((n, _), _)| n)) {
        return Ok(Vec::new());
    }
    let k = subjects.len();
    let counts: Vec<u64> =
        subjects.iter().map(|((_, f), _)| super::per_cell(opts, f(20_000), 10_000, 1 << 26)).collect();
    let mut times = vec![Vec::new(); k];
    super::rotate(opts, "cross", k, |s| times[s].push(subjects[s].0 .1(counts[s])));
    let _ = zonal::cpu::allow_all_cpus();
    println!("cross: one thread allocates (cpu 0), another frees (cpu 1), ns per page; {} repetitions", opts.reps);
    let best = best_peer(&times, |s| subjects[s].1);
    let mimalloc = super::index_of(subjects.iter().map(|((n, _), _)| n), "mimalloc").unwrap_or(best);
    let mut rows = Vec::new();
    let mut records = Vec::new();
    for s in 0..k {
        let sum = Summary::of(&times[s]);
        let ratio = paired_ratio(&times[s], &times[best]);
        let mi = paired_ratio(&times[s], &times[mimalloc]);
        rows.push(vec![
            subjects[s].0 .0.clone(),
            fmt_ns(sum.median),
            format!("{} – {}", fmt_ns(sum.min), fmt_ns(sum.max)),
            format!("{ratio:.2}"),
            format!("{mi:.2}"),
        ]);
        records.push(Record {
            experiment: "cross".into(),
            subject: subjects[s].0 .0.clone(),
            params: json!({"threads": 2, "order": 0}),
            ns_per_op: sum,
            reference: subjects[best].0 .0.clone(),
            ratio_to_reference: ratio,
            reps: opts.reps,
            samples: times[s].clone(),
        });
    }
    print_table(&["subject", "ns/page", "min – max", "× best peer", "× mimalloc"], &rows);
    println!();
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_subjects_names() {
        let z = super::super::tests::small_zonal();
        let built: Vec<String> = subjects(&z).into_iter().map(|((n, _), _)| n).collect();
        assert_eq!(built, names());
    }
}
