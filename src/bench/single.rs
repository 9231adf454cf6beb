//! `single`: one thread, order-0 alloc + free pairs (Jesper Brouer's page_bench01), zonal
//! beside the peers.

use super::page_api::{peer_names, IdealStack, ZonalPages, IDEAL};
use super::peers::page_pairs;
use super::{fmt_ns, measure, paired_ratio, peers, print_table, BenchOpts, Record, Subject, Summary};
use serde_json::json;
use zonal::Zonal;

/// The reference every ratio of this experiment is taken against.
pub const REFERENCE: &str = "mimalloc";

/// Every subject of the experiment, before `--only` chooses: zonal on `z` and on `buddy` (its
/// per-CPU lists off), the peers, the kernel.
fn subjects<'a>(z: &'a Zonal, buddy: &'a Zonal) -> Vec<Box<dyn Subject + 'a>> {
    let mut subjects = vec![
        page_pairs(IdealStack),
        page_pairs(ZonalPages { z, label: "zonal pcp", bulk: None }),
        page_pairs(ZonalPages { z: buddy, label: "zonal buddy only", bulk: None }),
    ];
    subjects.extend(crate::peer_subjects!(page_pairs));
    subjects.push(peers::kernel());
    subjects
}

/// The names of [`subjects`], without building an allocator.
pub fn names() -> Vec<String> {
    let mut names = vec![IDEAL.to_string(), "zonal pcp".into(), "zonal buddy only".into()];
    names.extend(peer_names());
    names.push(peers::KERNEL.into());
    names
}

/// Runs the experiment, prints its table and returns its records.
pub fn run(z: &Zonal, opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let buddy = super::buddy_only(opts)?;
    let mut subjects = subjects(z, &buddy);
    subjects.retain(|s| opts.keeps(&s.name()));
    let names: Vec<String> = subjects.iter().map(|s| s.name()).collect();
    if super::only_reference_left(names.iter()) {
        return Ok(Vec::new());
    }
    let times = measure(&mut subjects, opts, "single");
    let reference = super::index_of(&names, REFERENCE).expect("the reference is always kept");
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
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_subjects_names() {
        let z = super::super::tests::small_zonal();
        let buddy = super::super::tests::small_zonal();
        let built: Vec<String> = subjects(&z, &buddy).iter().map(|s| s.name()).collect();
        assert_eq!(built, names());
    }
}
