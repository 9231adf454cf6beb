//! The statistics experiments of seeds 000 and 001, each printed beside the seed's table:
//! `threshold` (seed 000: the per-CPU NUMA diff threshold swept, all CPUs allocating from
//! one zone so that every fold writes the same shared line) and `modes` (seed 001:
//! numa_stats_mode strict, coarse, auto before and after the first read).

use super::page_api::ZonalPages;
use super::parallel::cell;
use super::{fmt_ns, print_table, BenchOpts, Record, Summary};
use serde_json::json;
use zonal::{Config, Zonal};

/// Seed 000's sweep, and its cycles per alloc+free on 88 threads (2-socket Broadwell).
const SEED_000: [(&str, u32); 10] = [
    ("32", 799),
    ("64", 640),
    ("125", 537),
    ("256", 468),
    ("512", 428),
    ("4096", 399),
    ("20000", 394),
    ("30000", 395),
    ("65533", 369),
    ("off", 342),
];

/// A named setting of the tunables, applied before its cells run.
type Setting<'a> = (String, Box<dyn Fn(&Zonal) + 'a>);

/// One node, so that every CPU's folds land on the same zone's shared counters.
fn one_zone(z: &Zonal) -> Zonal {
    let spec = format!("nodes=1,size={}", zonal::topology::fmt_size(z.topology().nodes()[0].mem_bytes));
    let t = zonal::Topology::parse(&spec).expect("a one-node topology of the default's size");
    Zonal::new(Config::new(t)).expect("one-node handle")
}

fn pairs_per_cell(z: &Zonal, opts: &BenchOpts) -> u64 {
    let a = ZonalPages { z, label: "zonal", bulk: None };
    let (ns, _) = cell(&a, 1, 20_000);
    ((opts.cell_time.as_nanos() as f64 / ns.max(0.1)) as u64).clamp(1000, 1 << 26)
}

/// Runs `configs` (label, setter) at each thread count, rotating per repetition; returns
/// `times[config][threads][rep]`.
fn sweep(z: &Zonal, opts: &BenchOpts, label: &str, configs: &[Setting<'_>], ts: &[usize]) -> Vec<Vec<Vec<f64>>> {
    let n = pairs_per_cell(z, opts);
    let a = ZonalPages { z, label: "zonal", bulk: None };
    let k = configs.len();
    let mut times = vec![vec![Vec::new(); ts.len()]; k];
    for rep in 0..opts.reps {
        if opts.progress {
            eprint!("\r  {label}: repetition {}/{}   ", rep + 1, opts.reps);
        }
        for i in 0..k {
            let c = (i + rep) % k;
            (configs[c].1)(z);
            for (ti, &t) in ts.iter().enumerate() {
                times[c][ti].push(cell(&a, t, n).0);
            }
        }
    }
    if opts.progress {
        eprint!("\r{:40}\r", "");
    }
    times
}

/// `threshold` (seed 000).
pub fn run_threshold(z: &Zonal, opts: &BenchOpts) -> Vec<Record> {
    let z = one_zone(z);
    let nproc = zonal::sys::nr_cpus_online();
    let ts = [nproc, 2 * nproc];
    let configs: Vec<Setting<'static>> = SEED_000
        .iter()
        .map(|&(t, _)| {
            let f: Box<dyn Fn(&Zonal)> = if t == "off" {
                Box::new(|z: &Zonal| z.sysctl_set("numa_stats_mode", "coarse").expect("valid"))
            } else {
                Box::new(move |z: &Zonal| {
                    z.sysctl_set("numa_stats_mode", "strict").expect("valid");
                    z.sysctl_set("numa_stat_strategy", "threshold").expect("valid");
                    z.sysctl_set("numa_stat_threshold", t).expect("valid");
                })
            };
            (t.to_string(), f)
        })
        .collect();
    let times = sweep(&z, opts, "threshold", &configs, &ts);
    let base = SEED_000.iter().position(|(t, _)| *t == "125").expect("125 is in the sweep");
    println!(
        "threshold (seed 000): all {nproc} CPUs allocating and freeing on one zone, NUMA counters folded past \
         the threshold; ns per pair per thread, change against 125; {} repetitions",
        opts.reps
    );
    let mut rows = Vec::new();
    let mut records = Vec::new();
    for (c, &(t, seed)) in SEED_000.iter().enumerate() {
        let mut row =
            vec![t.to_string(), format!("{seed} ({:+.1}%)", (seed as f64 / SEED_000[base].1 as f64 - 1.0) * 100.0)];
        for (ti, &threads) in ts.iter().enumerate() {
            let s = Summary::of(&times[c][ti]);
            let b = Summary::of(&times[base][ti]).median;
            row.push(format!("{} ({:+.1}%)", fmt_ns(s.median), (s.median / b - 1.0) * 100.0));
            records.push(Record {
                experiment: "threshold".into(),
                subject: "zonal pcp".into(),
                params: json!({"threads": threads, "numa_stat_threshold": t}),
                ns_per_op: s,
                reference: "threshold 125".into(),
                ratio_to_reference: s.median / b,
                reps: opts.reps,
            });
        }
        rows.push(row);
    }
    let h1 = format!("zonal, {nproc} threads");
    let h2 = format!("zonal, {} threads", 2 * nproc);
    print_table(&["threshold", "seed 000 cycles, 88 thr", &h1, &h2], &rows);
    println!();
    records
}

/// `modes` (seed 001).
pub fn run_modes(z: &Zonal, opts: &BenchOpts) -> Vec<Record> {
    let z = one_zone(z);
    let nproc = zonal::sys::nr_cpus_online();
    let ts = [1, nproc];
    let auto_before = |z: &Zonal| {
        z.sysctl_set("numa_stats_mode", "coarse").expect("valid");
        z.sysctl_set("numa_stats_mode", "auto").expect("valid");
    };
    let auto_after = move |z: &Zonal| {
        auto_before(z);
        let _ = z.numastat();
    };
    let configs: Vec<Setting<'static>> = vec![
        ("strict".into(), Box::new(|z: &Zonal| z.sysctl_set("numa_stats_mode", "strict").expect("valid"))),
        ("coarse".into(), Box::new(|z: &Zonal| z.sysctl_set("numa_stats_mode", "coarse").expect("valid"))),
        ("auto, before the first read".into(), Box::new(auto_before)),
        ("auto, after the first read".into(), Box::new(auto_after)),
    ];
    let times = sweep(&z, opts, "modes", &configs, &ts);
    println!(
        "modes (seed 001): numa_stats_mode; ns per pair per thread, change against coarse; seed 001: coarse cut \
         page_bench01 185 -> 176 cycles (-4.8%), page_bench03 343 -> 315 (-8.1%); {} repetitions",
        opts.reps
    );
    let mut rows = Vec::new();
    let mut records = Vec::new();
    for (c, (name, _)) in configs.iter().enumerate() {
        let mut row = vec![name.clone()];
        for (ti, &threads) in ts.iter().enumerate() {
            let s = Summary::of(&times[c][ti]);
            let coarse = Summary::of(&times[1][ti]).median;
            row.push(format!("{} ({:+.1}%)", fmt_ns(s.median), (s.median / coarse - 1.0) * 100.0));
            records.push(Record {
                experiment: "modes".into(),
                subject: "zonal pcp".into(),
                params: json!({"threads": threads, "numa_stats_mode": name}),
                ns_per_op: s,
                reference: "coarse".into(),
                ratio_to_reference: s.median / coarse,
                reps: opts.reps,
            });
        }
        rows.push(row);
    }
    let h2 = format!("{nproc} threads");
    print_table(&["mode", "1 thread", &h2], &rows);
    println!();
    records
}
