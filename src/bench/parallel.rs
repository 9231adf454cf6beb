//! `parallel`: T threads each doing order-0 alloc + free pairs (page_bench03), for T = 1 ..
//! nproc and 2 × nproc (the oversubscribed run: threads share CPUs and so per-CPU lists, which
//! exercises the try-lock fallback). Reports ns per pair per thread and the total rate.

use super::page_api::{peer_names, IdealStack, PageAlloc, ZonalPages, IDEAL};
use super::{best_peer, fmt_ns, paired_ratio, print_table, BenchOpts, Record, Summary};
use serde_json::json;
use std::sync::Barrier;
use std::time::Instant;
use zonal::Zonal;

/// Runs `body(t, start)` on `threads` threads, thread `t` bound to CPU `t % nproc` as
/// page_bench03 binds its threads (an unbound pair of threads is sometimes put on one CPU for
/// a while, which the figure would then measure); each thread waits on `start` once, when its
/// set-up is done, so that their timed parts begin together. Returns what each thread
/// returned, in thread order, and the wall time of the whole, in ns.
pub fn on_bound_threads<R: Send>(threads: usize, body: impl Fn(usize, &Barrier) -> R + Sync) -> (Vec<R>, f64) {
    let barrier = Barrier::new(threads);
    let nproc = zonal::cpu::nr_cpus_online().max(1);
    let start = Instant::now();
    let out = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, body) = (&barrier, &body);
                s.spawn(move || {
                    // Best effort: a CPU the process may not use leaves the thread unbound.
                    let _ = zonal::cpu::set_affinity((t % nproc) as u32);
                    body(t, barrier)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("bench thread")).collect()
    });
    (out, start.elapsed().as_nanos() as f64)
}

/// Runs `n` pairs on each of `threads` threads started together ([`on_bound_threads`]);
/// returns (mean ns per pair per thread, total pairs per µs).
pub fn cell<A: PageAlloc>(a: &A, threads: usize, n: u64) -> (f64, f64) {
    let (per_thread, wall) = on_bound_threads(threads, |_, start| {
        start.wait();
        let t = Instant::now();
        for _ in 0..n {
            let p = a.alloc();
            if !p.is_null() {
                a.free(std::hint::black_box(p));
            }
        }
        t.elapsed().as_nanos() as f64 / n as f64
    });
    let mean = per_thread.iter().sum::<f64>() / threads as f64;
    (mean, (threads as u64 * n) as f64 / wall * 1000.0)
}

/// The subject with every CPU on one node.
pub const ONE_NODE: &str = "zonal pcp one node";

/// The one-node row measured again at T = 2 right after a cross phase (issue 38): frames one
/// CPU allocates and another frees leave the freeing CPU's lists holding frames of the other
/// CPU's 128-frame runs, whose state lines both CPUs then write.
pub const AFTER_CROSS: &str = "zonal pcp after cross (one node)";

/// Frames the cross phase before [`AFTER_CROSS`]'s cell passes from CPU 0 to CPU 1 (`bench
/// cross`'s loop): under that traffic both CPUs' `high` climb to `high_max` (2,048 frames) and
/// the transfer list fills, so 200,000 frames cycle every list of the zone many times.
pub const CROSS_FRAMES: u64 = 200_000;

/// A subject's cell: `cell(threads, n)` runs `n` operations on each of `threads` threads and
/// returns (mean ns per operation per thread, total operations per µs).
pub type Cell<'a> = Box<dyn Fn(usize, u64) -> (f64, f64) + 'a>;

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

/// The names of [`subjects`], without building an allocator. ([`AFTER_CROSS`] is measured
/// with [`ONE_NODE`], and kept with it.)
pub fn names() -> Vec<String> {
    let mut names = vec![IDEAL.to_string(), "zonal pcp".into(), ONE_NODE.into(), "zonal buddy only".into()];
    names.extend(peer_names());
    names
}

/// What a sweep over thread counts measured: `times[ti][s][rep]`, ns per operation per thread
/// of subject `s` at the `ti`-th thread count, and `rates[ti][s][rep]`, total operations per µs.
pub struct Sweep {
    pub times: Vec<Vec<Vec<f64>>>,
    pub rates: Vec<Vec<Vec<f64>>>,
}

impl Sweep {
    /// Subject `s`'s per-thread rate at the `ti`-th thread count over its rate at the first,
    /// the median of per-repetition ratios.
    pub fn scaling(&self, ti: usize, s: usize) -> f64 {
        paired_ratio(&self.times[0][s], &self.times[ti][s])
    }
}

/// Sizes every subject's cell from a one-thread trial of `trial` operations, then in each
/// repetition runs every subject (rotated) at every thread count of `ts`, and after each
/// subject's thread counts calls `after(s, n)` (`n`: the subject's operations per thread per
/// cell), which may measure more of it within the same repetition.
pub fn sweep(
    cells: &[&Cell<'_>],
    ts: &[usize],
    opts: &BenchOpts,
    label: &str,
    trial: u64,
    mut after: impl FnMut(usize, u64),
) -> Sweep {
    let counts: Vec<u64> = cells
        .iter()
        .map(|f| {
            let (ns, _) = f(1, trial);
            super::per_cell(opts, ns, 1000, 1 << 28)
        })
        .collect();
    let k = cells.len();
    let mut sw = Sweep { times: vec![vec![Vec::new(); k]; ts.len()], rates: vec![vec![Vec::new(); k]; ts.len()] };
    super::rotate(opts, label, k, |s| {
        for (ti, &t) in ts.iter().enumerate() {
            let (ns, rate) = cells[s](t, counts[s]);
            sw.times[ti][s].push(ns);
            sw.rates[ti][s].push(rate);
        }
        after(s, counts[s]);
    });
    sw
}

/// The label of a thread count's row.
pub fn row_label(t: usize, nproc: usize) -> String {
    if t > nproc {
        format!("{t} (2×nproc)")
    } else {
        t.to_string()
    }
}

/// An experiment's name and the params key of its total rate (`total_mpairs_per_s`).
pub type Kind<'a> = (&'a str, &'a str);

/// A table cell: median ns (× the row's reference) and median total rate; the record of it,
/// with `params` and the rate under `kind`'s key.
pub fn figure(
    (experiment, rate_key): Kind<'_>,
    subject: &str,
    (times, rates): (&[f64], &[f64]),
    (reference, reference_times): (&str, &[f64]),
    params: serde_json::Value,
    opts: &BenchOpts,
) -> (String, Record) {
    let sum = Summary::of(times);
    let ratio = paired_ratio(times, reference_times);
    let rate = Summary::of(rates).median;
    let mut params = params;
    params[rate_key] = json!(rate);
    let record = Record {
        experiment: experiment.into(),
        subject: subject.into(),
        params,
        ns_per_op: sum,
        reference: reference.into(),
        ratio_to_reference: ratio,
        reps: opts.reps,
        samples: times.to_vec(),
    };
    (format!("{} ({ratio:.2}×) {rate:.0}M/s", fmt_ns(sum.median)), record)
}

/// A sweep's table, a row per thread count and a column per subject ([`figure`]: ratios to
/// `reference(ti)` of the row), and its records, each with `params(t)`.
pub fn table(
    kind: Kind<'_>,
    names: &[String],
    ts: &[usize],
    sw: &Sweep,
    opts: &BenchOpts,
    reference: impl Fn(usize) -> usize,
    params: impl Fn(usize) -> serde_json::Value,
) -> (Vec<Vec<String>>, Vec<Record>) {
    let nproc = zonal::cpu::nr_cpus_online();
    let (mut rows, mut records) = (Vec::new(), Vec::new());
    for (ti, &t) in ts.iter().enumerate() {
        let r = reference(ti);
        let mut row = vec![row_label(t, nproc)];
        for (s, name) in names.iter().enumerate() {
            let times = (&sw.times[ti][s][..], &sw.rates[ti][s][..]);
            let (text, record) = figure(kind, name, times, (&names[r], &sw.times[ti][r]), params(t), opts);
            row.push(text);
            records.push(record);
        }
        rows.push(row);
    }
    (rows, records)
}

/// Runs the experiment, prints its table and returns its records.
pub fn run(z: &Zonal, opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let buddy = super::buddy_only(opts)?;
    // Every CPU on one node, sharing one zone, as the CPUs of a socket do on a server: the
    // run's topology (the default gives each CPU a node of its own) hides what they share.
    let total: u64 = z.topology().nodes().iter().map(|n| n.mem_bytes).sum();
    let shared = super::one_node(opts, total)?;
    // The same topology for the row after a cross phase: `shared` stays fresh (no frame of
    // it is ever freed on another CPU than the one that allocated it).
    let crossed = super::one_node(opts, total)?;
    let mut subjects = subjects(z, &shared, &buddy);
    subjects.retain(|(n, _, _)| opts.keeps(n));
    if super::only_reference_left(subjects.iter().map(|(n, _, _)| n)) {
        return Ok(Vec::new());
    }
    let names: Vec<String> = subjects.iter().map(|(n, _, _)| n.clone()).collect();
    let nproc = zonal::cpu::nr_cpus_online();
    let mut ts: Vec<usize> = (1..=nproc).collect();
    ts.push(2 * nproc);
    // The row after cross needs two CPUs (a cross phase, then one thread on each).
    let one_node = super::index_of(&names, ONE_NODE).filter(|_| nproc >= 2);
    let crossed_pages = ZonalPages { z: &crossed, label: AFTER_CROSS, bulk: None };
    let mut after_cross: (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
    let cells: Vec<&Cell<'_>> = subjects.iter().map(|(_, c, _)| c).collect();
    let sw = sweep(&cells, &ts, opts, "parallel", 20_000, |s, n| {
        if Some(s) == one_node {
            super::cross::cell(&crossed_pages, CROSS_FRAMES);
            let _ = zonal::cpu::allow_all_cpus();
            let (ns, rate) = cell(&crossed_pages, 2, n);
            after_cross.0.push(ns);
            after_cross.1.push(rate);
        }
    });
    println!(
        "parallel: T threads each doing order-0 alloc + free pairs (page_bench03); {} repetitions; \
         ns per pair per thread (× best peer of the row), total Mpairs/s",
        opts.reps
    );
    let best: Vec<usize> = (0..ts.len()).map(|ti| best_peer(&sw.times[ti], |s| subjects[s].2)).collect();
    let params = |t: usize| json!({"threads": t, "order": 0});
    let kind = ("parallel", "total_mpairs_per_s");
    let (mut rows, mut records) = table(kind, &names, &ts, &sw, opts, |ti| best[ti], params);
    let two = ts.iter().position(|&t| t == 2);
    if let (Some(s), Some(ti)) = (one_node, two) {
        // The row of the same handle's T = 2 cell right after the cross phase, beside the
        // best peer of the T = 2 row in the same repetitions.
        let b = best[ti];
        let (text, record) =
            figure(kind, AFTER_CROSS, (&after_cross.0, &after_cross.1), (&names[b], &sw.times[ti][b]), params(2), opts);
        let mut row = vec!["2, after cross".to_string()];
        row.extend(names.iter().enumerate().map(|(i, _)| if i == s { text.clone() } else { "-".into() }));
        rows.push(row);
        records.push(record);
    }
    let mut header = vec!["T".to_string()];
    header.extend(names.iter().cloned());
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    print_table(&h, &rows);
    if let (Some(_), Some(_)) = (one_node, two) {
        println!(
            "2, after cross: {ONE_NODE} at T = 2 on a handle of the same topology right after a cross phase \
             ({CROSS_FRAMES} frames allocated on cpu 0 and freed on cpu 1, as `bench cross`), in each repetition"
        );
    }
    // The targets (issues 10 and 38): per-thread rate at T = 2 and T = nproc against T = 1
    // with every CPU on one zone, fresh and right after a cross phase, beside the same figure
    // for the run's topology and for the ideal stack, which shares nothing (what the machine
    // allows).
    let scaling = |name: &str, ti: usize| super::index_of(&names, name).map(|i| sw.scaling(ti, i));
    let controls = |ti: usize| {
        let mut c = Vec::new();
        if let Some(own) = scaling("zonal pcp", ti) {
            c.push(format!("the run's topology ({} nodes): {:.0}%", z.topology().nr_nodes(), own * 100.0));
        }
        if let Some(ideal) = scaling(IDEAL, ti) {
            c.push(format!("the ideal per-thread stack: {:.0}%", ideal * 100.0));
        }
        if !c.is_empty() {
            println!("  controls in the same run: {}", c.join("; "));
        }
    };
    // T = 2 where there are two CPUs, and T = nproc (the row of issue 10) where that is not 2.
    let mut at: Vec<usize> = two.filter(|_| nproc >= 2).into_iter().collect();
    if nproc != 2 {
        at.push(nproc - 1);
    }
    for ti in at {
        let Some(one) = scaling(ONE_NODE, ti) else { continue };
        println!(
            "target: per-thread rate at T = {} against T = 1, every CPU on one zone, fresh handle: {:.0}% (≥ 90%: {})",
            ts[ti],
            one * 100.0,
            super::verdict(one >= 0.90)
        );
        if let (2, Some(s)) = (ts[ti], one_node) {
            let after = paired_ratio(&sw.times[0][s], &after_cross.0);
            println!(
                "target: per-thread rate at T = 2 against T = 1, every CPU on one zone, right after a cross phase: \
                 {:.0}% (≥ 90%: {})",
                after * 100.0,
                super::verdict(after >= 0.90)
            );
        }
        controls(ti);
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
