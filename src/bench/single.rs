//! `single`: one thread, order-0 alloc + free pairs (Jesper Brouer's page_bench01), zonal
//! beside the peers.

use super::{fmt_ns, measure, paired_ratio, peers, print_table, BenchOpts, Record, Summary};
use serde_json::json;
use zonal::{Config, Gfp, Zonal};

/// The reference every ratio of this experiment is taken against.
pub const REFERENCE: &str = "mimalloc";

/// Runs the experiment, prints its table and returns its records.
pub fn run(z: &Zonal, opts: &BenchOpts) -> Vec<Record> {
    let buddy = Zonal::new(Config::new(z.topology().clone()).pcp(false)).expect("same topology as the main handle");
    let mut subjects = vec![
        peers::ideal_stack(),
        peers::pairs("zonal pcp", || {
            if let Ok(p) = z.alloc_pages(Gfp::KERNEL, 0) {
                let _ = z.free_pages(std::hint::black_box(p.as_ptr()), 0);
            }
        }),
        peers::pairs("zonal buddy only", || {
            if let Ok(p) = buddy.alloc_pages(Gfp::KERNEL, 0) {
                let _ = buddy.free_pages(std::hint::black_box(p.as_ptr()), 0);
            }
        }),
        peers::snmalloc(),
        peers::tcmalloc(),
        peers::mimalloc(),
        peers::jemalloc(),
        peers::glibc(),
        peers::kernel(),
    ];
    subjects.retain(|s| opts.keeps(&s.name()));
    let names: Vec<String> = subjects.iter().map(|s| s.name()).collect();
    let times = measure(&mut subjects, opts, "single");
    let reference = names.iter().position(|n| n == REFERENCE).expect("the reference is a subject");
    println!("single: one thread, order-0 alloc + free pairs (page_bench01); {} repetitions", opts.reps);
    let mut rows = Vec::new();
    let mut records = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let s = Summary::of(&times[i]);
        let ratio = paired_ratio(&times[i], &times[reference]);
        rows.push(vec![
            name.clone(),
            fmt_ns(s.median),
            format!("{} – {}", fmt_ns(s.min), fmt_ns(s.max)),
            format!("{ratio:.2}"),
        ]);
        records.push(Record {
            experiment: "single".into(),
            subject: name.clone(),
            params: json!({"threads": 1, "order": 0}),
            ns_per_op: s,
            reference: REFERENCE.into(),
            ratio_to_reference: ratio,
            reps: opts.reps,
        });
    }
    print_table(&["subject", "ns/pair", "min – max", "× mimalloc"], &rows);
    println!();
    records
}
