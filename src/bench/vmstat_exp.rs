//! The statistics experiments of seeds 000, 001 and 002, each printed beside the seed's
//! figures: `threshold` (seed 000: the per-CPU NUMA diff threshold swept, all CPUs allocating
//! from one zone so that every fold writes the same shared line), `modes` (seed 001:
//! numa_stats_mode strict, coarse, auto before and after the first read) and `stats` (seed
//! 002: accurate shared counters against per-CPU event counters, and per-page against
//! batched accounting in bulk calls).

use super::page_api::ZonalPages;
use super::parallel::cell;
use super::{fmt_ns, paired_ratio, print_table, BenchOpts, Record, Summary};
use serde_json::json;
use zonal::Zonal;

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
/// Built with the command line's settings but for the topology.
fn one_zone(z: &Zonal, opts: &BenchOpts) -> Result<Zonal, String> {
    super::one_node(opts, z.topology().nodes()[0].mem_bytes)
}

fn pairs_per_cell(a: &ZonalPages<'_>, opts: &BenchOpts) -> u64 {
    let (ns, _) = cell(a, 1, 20_000);
    super::per_cell(opts, ns, 1000, 1 << 26)
}

/// Runs `configs` (label, setter) at each thread count, rotating per repetition; returns
/// `times[config][threads][rep]`.
fn sweep(z: &Zonal, opts: &BenchOpts, label: &str, configs: &[Setting<'_>], ts: &[usize]) -> Vec<Vec<Vec<f64>>> {
    let a = ZonalPages { z, label: "zonal pcp", bulk: None };
    let n = pairs_per_cell(&a, opts);
    let k = configs.len();
    let mut times = vec![vec![Vec::new(); ts.len()]; k];
    super::rotate(opts, label, k, |c| {
        (configs[c].1)(z);
        for (ti, &t) in ts.iter().enumerate() {
            times[c][ti].push(cell(&a, t, n).0);
        }
    });
    times
}

/// For every setting and thread count, "ns (±% against setting `base`)" with the change
/// taken as the median of per-repetition ratios, and its records.
fn against_base(
    times: &[Vec<Vec<f64>>],
    base: usize,
    configs: &[Setting<'_>],
    ts: &[usize],
    (experiment, param): (&str, &str),
    opts: &BenchOpts,
) -> (Vec<Vec<String>>, Vec<Record>) {
    let mut cells = Vec::new();
    let mut records = Vec::new();
    for (c, (name, _)) in configs.iter().enumerate() {
        let mut row = Vec::new();
        for (ti, &threads) in ts.iter().enumerate() {
            let s = Summary::of(&times[c][ti]);
            let ratio = paired_ratio(&times[c][ti], &times[base][ti]);
            row.push(format!("{} ({:+.1}%)", fmt_ns(s.median), (ratio - 1.0) * 100.0));
            records.push(Record {
                experiment: experiment.into(),
                subject: "zonal pcp".into(),
                params: json!({"threads": threads, param: name}),
                ns_per_op: s,
                reference: format!("{param} {}", configs[base].0),
                ratio_to_reference: ratio,
                reps: opts.reps,
                samples: times[c][ti].clone(),
            });
        }
        cells.push(row);
    }
    (cells, records)
}

/// Prints one row per setting (its name, then its cells at 1 and `nproc` threads).
fn print_rows(first: &str, configs: &[Setting<'_>], cells: Vec<Vec<String>>, nproc: usize) {
    let rows: Vec<Vec<String>> = configs
        .iter()
        .zip(cells)
        .map(|((name, _), cells)| std::iter::once(name.clone()).chain(cells).collect())
        .collect();
    let h2 = format!("{nproc} threads");
    print_table(&[first, "1 thread", &h2], &rows);
}

/// `threshold` (seed 000).
pub fn run_threshold(z: &Zonal, opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let z = one_zone(z, opts)?;
    let nproc = zonal::cpu::nr_cpus_online();
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
    let (cells, mut records) = against_base(&times, base, &configs, &ts, ("threshold", "numa_stat_threshold"), opts);
    // The seed's figure beside each of zonal's, for `--plot`.
    for r in &mut records {
        let seed = SEED_000.iter().find(|(t, _)| r.params["numa_stat_threshold"] == *t).map(|(_, c)| *c);
        r.params["seed_000_cycles_88_threads"] = json!(seed);
    }
    let rows: Vec<Vec<String>> = SEED_000
        .iter()
        .zip(cells)
        .map(|(&(t, seed), cells)| {
            let change = (seed as f64 / SEED_000[base].1 as f64 - 1.0) * 100.0;
            [t.to_string(), format!("{seed} ({change:+.1}%)")].into_iter().chain(cells).collect()
        })
        .collect();
    let h1 = format!("zonal, {nproc} threads");
    let h2 = format!("zonal, {} threads", 2 * nproc);
    print_table(&["threshold", "seed 000 cycles, 88 thr", &h1, &h2], &rows);
    println!();
    Ok(records)
}

/// `modes` (seed 001).
pub fn run_modes(z: &Zonal, opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let z = one_zone(z, opts)?;
    let nproc = zonal::cpu::nr_cpus_online();
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
    let coarse = configs.iter().position(|(n, _)| n == "coarse").expect("coarse is a mode");
    let (cells, records) = against_base(&times, coarse, &configs, &ts, ("modes", "numa_stats_mode"), opts);
    print_rows("mode", &configs, cells, nproc);
    let strict = configs.iter().position(|(n, _)| n == "strict").expect("strict is a mode");
    let over: Vec<f64> = (0..ts.len()).map(|ti| paired_ratio(&times[strict][ti], &times[coarse][ti]) - 1.0).collect();
    let shown: Vec<String> =
        ts.iter().zip(&over).map(|(t, o)| format!("{:+.1}% at {t} thread(s)", o * 100.0)).collect();
    println!(
        "target: strict over coarse: {} (at most +3% at every thread count: {})",
        shown.join(", "),
        super::verdict(over.iter().all(|&o| o <= 0.03))
    );
    println!();
    Ok(records)
}

/// `stats` (seed 002): what accurate counters cost against per-CPU event counters, on one
/// zone that every CPU allocates from; and what accounting a bulk call page by page costs
/// against once per call with the batch count.
pub fn run_stats(z: &Zonal, opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let z = one_zone(z, opts)?;
    let nproc = zonal::cpu::nr_cpus_online();
    let ts = [1, nproc];
    let strategy = |name: &'static str| -> Setting<'static> {
        let label = match name {
            "shared" => "shared: an atomic add per event (accurate)",
            "threshold" => "threshold 65533: per-CPU u16 diffs (seed 000)",
            _ => "percpu: per-CPU event counters (seed 002)",
        };
        (
            label.into(),
            Box::new(move |z: &Zonal| {
                z.sysctl_set("numa_stats_mode", "strict").expect("valid");
                z.sysctl_set("numa_stat_strategy", name).expect("valid");
                z.sysctl_set("numa_stat_threshold", "65533").expect("valid");
            }),
        )
    };
    let mut configs = vec![strategy("shared"), strategy("threshold"), strategy("percpu")];
    configs
        .push(("off (coarse)".into(), Box::new(|z: &Zonal| z.sysctl_set("numa_stats_mode", "coarse").expect("valid"))));
    let times = sweep(&z, opts, "stats", &configs, &ts);
    println!(
        "stats (seed 002): NUMA counters, accurate and shared against per-CPU events, all CPUs on one zone; \
         ns per pair per thread, change against percpu; {} repetitions",
        opts.reps
    );
    let percpu = 2;
    let (cells, mut records) = against_base(&times, percpu, &configs, &ts, ("stats", "numa_stat_strategy"), opts);
    print_rows("counting", &configs, cells, nproc);
    println!();

    // Bulk: 128 frames per call, accounted once or page by page, with each strategy.
    const N: usize = 128;
    let array = ZonalPages { z: &z, label: "zonal bulk array", bulk: Some(super::page_api::BulkForm::Array) };
    let rounds = {
        let ns = super::bulk::cell(&array, N, 100);
        (super::per_cell(opts, ns, 256, u64::MAX) / N as u64).max(16)
    };
    let cases: Vec<(&str, &str)> =
        ["percpu", "threshold", "shared"].iter().flat_map(|s| [(*s, "batch"), (*s, "per_page")]).collect();
    let mut bulk_times = vec![Vec::new(); cases.len()];
    super::rotate(opts, "stats bulk", cases.len(), |c| {
        let (strategy, accounting) = cases[c];
        z.sysctl_set("numa_stats_mode", "strict").expect("valid");
        z.sysctl_set("numa_stat_strategy", strategy).expect("valid");
        z.sysctl_set("bulk_accounting", accounting).expect("valid");
        bulk_times[c].push(super::bulk::cell(&array, N, rounds));
    });
    z.sysctl_set("bulk_accounting", "batch").expect("valid");
    println!(
        "stats (seed 002): bulk calls of {N} pages (array form, allocated then freed), accounted once per call \
         or page by page; ns per page, change of per_page against batch; seed 002: batching cut the array \
         form 11-12% (N = 2 .. 128); {} repetitions",
        opts.reps
    );
    let mut rows = Vec::new();
    for (c, &(strategy, accounting)) in cases.iter().enumerate() {
        let batch = c - c % 2;
        let s = Summary::of(&bulk_times[c]);
        let ratio = paired_ratio(&bulk_times[c], &bulk_times[batch]);
        rows.push(vec![
            strategy.to_string(),
            accounting.to_string(),
            format!("{} ({:+.1}%)", fmt_ns(s.median), (ratio - 1.0) * 100.0),
        ]);
        records.push(Record {
            experiment: "stats".into(),
            subject: "zonal bulk array".into(),
            params: json!({"batch": N, "numa_stat_strategy": strategy, "bulk_accounting": accounting}),
            ns_per_op: s,
            reference: format!("bulk_accounting batch, {strategy}"),
            ratio_to_reference: ratio,
            reps: opts.reps,
            samples: bulk_times[c].clone(),
        });
    }
    print_table(&["strategy", "bulk_accounting", "ns per page"], &rows);
    println!();
    Ok(records)
}
