//! `bulk`: N = 1 .. 128 order-0 pages per call, allocated then freed, time per page, in the
//! layout of seed 002's page_bench04_bulk table (array and list forms), beside the peers
//! doing N single allocations then N frees.

use super::page_api::{peer_names, BulkForm, IdealStack, PageAlloc, Scratch, ZonalPages, IDEAL};
use super::{best_peer, fmt_ns, paired_ratio, print_table, BenchOpts, Record, Summary};
use serde_json::json;
use std::time::Instant;
use zonal::Zonal;

/// The batch sizes of seed 002's table.
pub const SIZES: [usize; 9] = [1, 2, 3, 4, 8, 16, 32, 64, 128];

/// `rounds` rounds of: allocate `n` pages in one call (or `n` calls), free them; ns per page.
pub fn cell<A: PageAlloc>(a: &A, n: usize, rounds: u64) -> f64 {
    let mut scratch = Scratch { ptrs: Vec::with_capacity(n), ..Scratch::default() };
    let t = Instant::now();
    for _ in 0..rounds {
        a.alloc_free_many(n, &mut scratch);
    }
    t.elapsed().as_nanos() as f64 / (rounds * n as u64) as f64
}

type Cell<'a> = Box<dyn Fn(usize, u64) -> f64 + 'a>;

fn subject<'a, A: PageAlloc + 'a>(a: A) -> (String, Cell<'a>) {
    (a.name(), Box::new(move |n, r| cell(&a, n, r)))
}

/// Every subject of the experiment ((name, cell), whether a peer), before `--only` chooses.
fn subjects(z: &Zonal) -> Vec<((String, Cell<'_>), bool)> {
    let mut subjects: Vec<((String, Cell<'_>), bool)> = vec![
        (subject(ZonalPages { z, label: "zonal bulk array", bulk: Some(BulkForm::Array) }), false),
        (subject(ZonalPages { z, label: "zonal bulk list", bulk: Some(BulkForm::List) }), false),
        (subject(ZonalPages { z, label: "zonal single", bulk: None }), false),
        (subject(IdealStack), false),
    ];
    subjects.extend(crate::peer_subjects!(subject).into_iter().map(|s| (s, true)));
    subjects
}

/// The names of [`subjects`], without building an allocator.
pub fn names() -> Vec<String> {
    let mut names = vec!["zonal bulk array".to_string(), "zonal bulk list".into(), "zonal single".into(), IDEAL.into()];
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
    let pages_per_cell = |s: usize| {
        let ns = subjects[s].0 .1(16, 1000);
        super::per_cell(opts, ns, 256, u64::MAX)
    };
    let budget: Vec<u64> = (0..k).map(pages_per_cell).collect();
    let mut times = vec![vec![Vec::new(); k]; SIZES.len()];
    super::rotate(opts, "bulk", k, |s| {
        for (ni, &n) in SIZES.iter().enumerate() {
            // Fewer rounds per size so every cell takes about a third of the cell time.
            let rounds = (budget[s] / 3 / n as u64).max(16);
            times[ni][s].push(subjects[s].0 .1(n, rounds));
        }
    });
    println!(
        "bulk: N order-0 pages allocated in one call then freed (page_bench04_bulk), ns per page \
         (× best peer of the row); {} repetitions",
        opts.reps
    );
    let mut header = vec!["N".to_string()];
    header.extend(subjects.iter().map(|((n, _), _)| n.clone()));
    let names = || subjects.iter().map(|((n, _), _)| n);
    let (array, single) = (super::index_of(names(), "zonal bulk array"), super::index_of(names(), "zonal single"));
    if array.is_some() && single.is_some() {
        header.push("array ÷ single pair (N = 1)".into());
    }
    let mut rows = Vec::new();
    let mut records = Vec::new();
    for (ni, &n) in SIZES.iter().enumerate() {
        let best = best_peer(&times[ni], |s| subjects[s].1);
        let mut row = vec![n.to_string()];
        for s in 0..k {
            let sum = Summary::of(&times[ni][s]);
            let ratio = paired_ratio(&times[ni][s], &times[ni][best]);
            row.push(format!("{} ({ratio:.2}×)", fmt_ns(sum.median)));
            records.push(Record {
                experiment: "bulk".into(),
                subject: subjects[s].0 .0.clone(),
                params: json!({"batch": n, "order": 0}),
                ns_per_op: sum,
                reference: subjects[best].0 .0.clone(),
                ratio_to_reference: ratio,
                reps: opts.reps,
                samples: times[ni][s].clone(),
            });
        }
        // Against zonal's single pair at N = 1 from the same repetitions.
        if let (Some(a), Some(s)) = (array, single) {
            row.push(format!("{:.2}", paired_ratio(&times[ni][a], &times[0][s])));
        }
        rows.push(row);
    }
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    print_table(&h, &rows);
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
