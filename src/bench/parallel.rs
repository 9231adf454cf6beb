//! `parallel`: T threads each doing order-0 alloc + free pairs (page_bench03), for T = 1 ..
//! nproc and 2 × nproc (the oversubscribed run: threads share CPUs and so per-CPU lists, which
//! exercises the try-lock fallback). Reports ns per pair per thread and the total rate.

use super::page_api::{peer_names, IdealStack, PageAlloc, ZonalPages, IDEAL};
use super::{best_peer, fmt_ns, paired_ratio, print_table, BenchOpts, Record, Summary};
use serde_json::json;
use std::sync::Barrier;
use std::time::Instant;
use zonal::Zonal;

/// Runs `n` pairs on each of `threads` threads started together, thread `t` bound to CPU
/// `t % nproc` as page_bench03 binds its threads (an unbound pair of threads is sometimes
/// put on one CPU for a while, which the figure would then measure); returns (mean ns per
/// pair per thread, total pairs per µs).
pub fn cell<A: PageAlloc>(a: &A, threads: usize, n: u64) -> (f64, f64) {
    let barrier = Barrier::new(threads);
    let nproc = zonal::cpu::nr_cpus_online().max(1);
    let start = Instant::now();
    let per_thread: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    // Best effort: a CPU the process may not use leaves the thread unbound.
                    let _ = zonal::cpu::set_affinity((t % nproc) as u32);
                    barrier.wait();
                    let t = Instant::now();
                    for _ in 0..n {
                        let p = a.alloc();
                        if !p.is_null() {
                            a.free(std::hint::black_box(p));
                        }
                    }
                    t.elapsed().as_nanos() as f64 / n as f64
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("bench thread")).collect()
    });
    let wall = start.elapsed().as_nanos() as f64;
    let mean = per_thread.iter().sum::<f64>() / threads as f64;
    (mean, (threads as u64 * n) as f64 / wall * 1000.0)
}

/// The subject with every CPU on one node.
const ONE_NODE: &str = "zonal pcp one node";

type Cell<'a> = Box<dyn Fn(usize, u64) -> (f64, f64) + 'a>;

fn subject<'a, A: PageAlloc + 'a>(a: A) -> (String, Cell<'a>) {
    (a.name(), Box::new(move |t, n| cell(&a, t, n)))
}

/// Every subject of the experiment (name, cell, whether a peer), before `--only` chooses:
/// zonal on the run's topology, on `shared` (every CPU on one node) and on `buddy` (no
/// per-CPU lists), the ideal stack and the peers.
fn subjects<'a>(z: &'a Zonal, shared: &'a Zonal, buddy: &'a Zonal) -> Vec<(String, Cell<'a>, bool)> {
    let mut subjects: Vec<(String, Cell<'_>, bool)> = Vec::new();
    let ours = [
        subject(IdealStack),
        subject(ZonalPages { z, label: "zonal pcp", bulk: None }),
        subject(ZonalPages { z: shared, label: ONE_NODE, bulk: None }),
        subject(ZonalPages { z: buddy, label: "zonal buddy only", bulk: None }),
    ];
    subjects.extend(ours.into_iter().map(|(n, c)| (n, c, false)));
    subjects.extend(crate::peer_subjects!(subject).into_iter().map(|(n, c)| (n, c, true)));
    subjects
}

/// The names of [`subjects`], without building an allocator.
pub fn names() -> Vec<String> {
    let mut names = vec![IDEAL.to_string(), "zonal pcp".into(), ONE_NODE.into(), "zonal buddy only".into()];
    names.extend(peer_names());
    names
}

/// Runs the experiment, prints its table and returns its records.
pub fn run(z: &Zonal, opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let buddy = super::buddy_only(opts)?;
    // Every CPU on one node, sharing one zone, as the CPUs of a socket do on a server: the
    // run's topology (the default gives each CPU a node of its own) hides what they share.
    let total: u64 = z.topology().nodes().iter().map(|n| n.mem_bytes).sum();
    let shared = super::one_node(opts, total)?;
    let mut subjects = subjects(z, &shared, &buddy);
    subjects.retain(|(n, _, _)| opts.keeps(n));
    if super::only_reference_left(subjects.iter().map(|(n, _, _)| n)) {
        return Ok(Vec::new());
    }
    let nproc = zonal::cpu::nr_cpus_online();
    let mut ts: Vec<usize> = (1..=nproc).collect();
    ts.push(2 * nproc);
    // Calibrate on one thread: pairs per thread per cell.
    let counts: Vec<u64> = subjects
        .iter()
        .map(|(_, f, _)| {
            let (ns, _) = f(1, 20_000);
            super::per_cell(opts, ns, 1000, 1 << 28)
        })
        .collect();
    let k = subjects.len();
    // times[t][subject][rep], rates likewise.
    let mut times = vec![vec![Vec::new(); k]; ts.len()];
    let mut rates = vec![vec![Vec::new(); k]; ts.len()];
    super::rotate(opts, "parallel", k, |s| {
        for (ti, &t) in ts.iter().enumerate() {
            let (ns, rate) = subjects[s].1(t, counts[s]);
            times[ti][s].push(ns);
            rates[ti][s].push(rate);
        }
    });
    println!(
        "parallel: T threads each doing order-0 alloc + free pairs (page_bench03); {} repetitions; \
         ns per pair per thread (× best peer of the row), total Mpairs/s",
        opts.reps
    );
    let mut header = vec!["T".to_string()];
    header.extend(subjects.iter().map(|(n, _, _)| n.clone()));
    let mut rows = Vec::new();
    let mut records = Vec::new();
    for (ti, &t) in ts.iter().enumerate() {
        let best = best_peer(&times[ti], |s| subjects[s].2);
        let mut row = vec![if t > nproc { format!("{t} (2×nproc)") } else { t.to_string() }];
        for s in 0..k {
            let sum = Summary::of(&times[ti][s]);
            let ratio = paired_ratio(&times[ti][s], &times[ti][best]);
            let rate = Summary::of(&rates[ti][s]).median;
            row.push(format!("{} ({ratio:.2}×) {rate:.0}M/s", fmt_ns(sum.median)));
            records.push(Record {
                experiment: "parallel".into(),
                subject: subjects[s].0.clone(),
                params: json!({"threads": t, "order": 0, "total_mpairs_per_s": rate}),
                ns_per_op: sum,
                reference: subjects[best].0.clone(),
                ratio_to_reference: ratio,
                reps: opts.reps,
                samples: times[ti][s].clone(),
            });
        }
        rows.push(row);
    }
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    print_table(&h, &rows);
    // The target (issue 10): per-thread rate at T = nproc against T = 1 with every CPU on one
    // zone, beside the same figure for the run's topology and for the ideal stack, which
    // shares nothing (what the machine allows).
    let names = || subjects.iter().map(|(n, _, _)| n);
    let keep = |name: &str| super::index_of(names(), name).map(|i| paired_ratio(&times[0][i], &times[nproc - 1][i]));
    if let Some(one) = keep(ONE_NODE) {
        println!(
            "target: per-thread rate at T = {nproc} against T = 1, every CPU on one zone: {:.0}% (≥ 90%: {})",
            one * 100.0,
            super::verdict(one >= 0.90)
        );
        let mut controls = Vec::new();
        if let Some(own) = keep("zonal pcp") {
            controls.push(format!("the run's topology ({} nodes): {:.0}%", z.topology().nr_nodes(), own * 100.0));
        }
        if let Some(ideal) = keep(IDEAL) {
            controls.push(format!("the ideal per-thread stack: {:.0}%", ideal * 100.0));
        }
        if !controls.is_empty() {
            println!("  controls in the same run: {}", controls.join("; "));
        }
    }
    println!();
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_subjects_names() {
        let (z, shared, buddy) = (
            super::super::tests::small_zonal(),
            super::super::tests::small_zonal(),
            super::super::tests::small_zonal(),
        );
        let built: Vec<String> = subjects(&z, &shared, &buddy).into_iter().map(|(n, _, _)| n).collect();
        assert_eq!(built, names());
    }
}
