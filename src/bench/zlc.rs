//! `zlc`: seed 003's memory hog on fake topologies of 8 and 28 nodes. Every CPU sits on node
//! 0; every node ahead of the last one in node 0's zonelist is full, so each allocation must
//! walk past them (or, in the `local` rows, node 0 has room and nothing is full). Threads
//! allocate order-0 pages beyond their node and touch each (one store per page, as the
//! seed's hog), then free them; the zonelist cache on and off alternate in every repetition.
//! Printed in the seed's layout: memory, threads, time on / off, % better.

use super::{fmt_ns, paired_ratio, print_table, BenchOpts, Record, Summary};
use serde_json::json;
use std::sync::Barrier;
use std::time::{Duration, Instant};
use zonal::{Gfp, NodeId, Zonal};

/// Pages each thread allocates and touches per round.
const PAGES: usize = 1024;

/// Node sizes: room in the usable node for every thread's pages at once, and zones large
/// enough for Linux's usual per-CPU batch (15 at 256 MiB), so that refills do not dominate.
/// Only the touched pages take memory.
const NODE_SIZE: &str = "256M";

/// `iters` rounds on each of `threads` threads started together: each round allocates
/// `PAGES` pages (timed), touches each (timed), frees them (not timed). Returns (alloc ns per
/// page, alloc + touch ns per page), averaged over threads and rounds.
fn rounds(z: &Zonal, threads: usize, iters: u64) -> Result<(f64, f64), String> {
    let barrier = Barrier::new(threads);
    let per: Vec<Result<(Duration, Duration), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut pages = Vec::with_capacity(PAGES);
                    let (mut alloc, mut total) = (Duration::ZERO, Duration::ZERO);
                    barrier.wait();
                    for _ in 0..iters {
                        let t = Instant::now();
                        for _ in 0..PAGES {
                            match z.alloc_pages(Gfp::KERNEL, 0) {
                                Ok(p) => pages.push(p),
                                Err(e) => {
                                    for p in pages.drain(..) {
                                        let _ = z.free_pages(p.as_ptr(), 0);
                                    }
                                    return Err(format!("zlc: the usable node ran out: {e}"));
                                }
                            }
                        }
                        alloc += t.elapsed();
                        for p in &pages {
                            // SAFETY: `p` is a frame zonal handed out, writable and ours until freed.
                            unsafe { std::ptr::write_volatile(p.as_ptr().cast::<u64>(), 0x5a5a) };
                        }
                        total += t.elapsed();
                        for p in pages.drain(..) {
                            z.free_pages(p.as_ptr(), 0).map_err(|e| e.to_string())?;
                        }
                    }
                    Ok((alloc, total))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("zlc: a thread panicked".into()))).collect()
    });
    let per: Vec<(Duration, Duration)> = per.into_iter().collect::<Result<_, _>>()?;
    let ns = |d: Duration| d.as_nanos() as f64 / (PAGES as u64 * iters.max(1)) as f64;
    let n = per.len() as f64;
    Ok((per.iter().map(|p| ns(p.0)).sum::<f64>() / n, per.iter().map(|p| ns(p.1)).sum::<f64>() / n))
}

/// Blocks that hold zones full: (address, order).
type Held = Vec<(*mut u8, u32)>;

/// The allocator of one row: `nodes` nodes, every CPU on node 0, and when `remote`, every
/// zone but the last of node 0's zonelist taken down to its min watermark. Returns it with
/// the frames that hold the zones full, and how many zones lie ahead of the usable one.
fn build(nodes: usize, remote: bool, opts: &BenchOpts) -> Result<(Zonal, Held, usize), String> {
    let ncpu = zonal::cpu::nr_cpus_online();
    let spec = format!("nodes={nodes},size={NODE_SIZE},cpus=0-{}{}", ncpu - 1, ":".repeat(nodes - 1));
    let mut config = opts.config.clone();
    config.topology = zonal::Topology::parse(&spec).map_err(|e| e.to_string())?;
    let z = Zonal::new(config).map_err(|e| format!("cannot build the {nodes}-node allocator: {e}"))?;
    let order: Vec<NodeId> = z
        .zonelists(NodeId(0))
        .map_err(|e| e.to_string())?
        .fallback
        .iter()
        .map(|id| z.zones()[id.0 as usize].node)
        .collect();
    let mut held = Vec::new();
    let ahead = if remote { order.len() - 1 } else { 0 };
    for &n in &order[..ahead] {
        // Large blocks first, then frames, down to the min watermark.
        for o in (0..=z.max_order().get() as u32).rev().step_by(5) {
            while let Ok(p) = z.alloc_pages_node(n, Gfp::THISNODE, o) {
                held.push((p.as_ptr(), o));
            }
        }
    }
    z.drain_all_pages();
    Ok((z, held, ahead))
}

/// Runs the experiment, prints its table and returns its records.
pub fn run(opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let ncpu = zonal::cpu::nr_cpus_online();
    let mut rows = Vec::new();
    let mut records = Vec::new();
    let mut targets = Vec::new();
    for nodes in [8, 28] {
        for remote in [true, false] {
            let (z, held, ahead) = build(nodes, remote, opts)?;
            for threads in [1, ncpu] {
                // Warm up both ways (first touches fault pages in), then size the cells from a
                // trial with the cache off (the slower).
                for on in [true, false, true, false] {
                    z.set_zonelist_cache(on);
                    rounds(&z, threads, 2)?;
                }
                let trial = rounds(&z, threads, 4)?.1 * PAGES as f64;
                // The local rows look for a difference of 2% in a few ns: four times the rounds.
                let iters = super::per_cell(opts, trial, 1, 100_000) * if remote { 1 } else { 4 };
                // [on, off][rep]: (alloc, total). Each repetition runs on, off, off, on (or
                // the mirror), so a drift of the machine within it weighs on both alike.
                let mut t: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
                let half = iters.div_ceil(2);
                let label = format!(
                    "zlc {nodes} nodes, {}, {threads} thread(s), cache on and off",
                    if remote { format!("{ahead} full ahead") } else { "local".into() }
                );
                let mut shown = 0;
                for rep in 0..opts.reps {
                    shown = super::progress(opts, &label, rep);
                    let mut acc = [(0.0, 0.0); 2];
                    for k in [0, 1, 1, 0] {
                        let k = (k + rep) % 2;
                        z.set_zonelist_cache(k == 0);
                        let (a, b) = rounds(&z, threads, half)?;
                        acc[k] = (acc[k].0 + a, acc[k].1 + b);
                    }
                    for k in 0..2 {
                        t[k].push((acc[k].0 / 2.0, acc[k].1 / 2.0));
                    }
                }
                super::clear_progress(opts, shown);
                let col = |k: usize, f: fn(&(f64, f64)) -> f64| t[k].iter().map(f).collect::<Vec<f64>>();
                let (on_a, off_a, on_t, off_t) = (col(0, |x| x.0), col(1, |x| x.0), col(0, |x| x.1), col(1, |x| x.1));
                let ratio = paired_ratio(&on_a, &off_a);
                let ratio_t = paired_ratio(&on_t, &off_t);
                let mib = (threads * PAGES * zonal::PAGE_SIZE) >> 20;
                rows.push(vec![
                    nodes.to_string(),
                    if remote { format!("{ahead} full ahead") } else { "local (room)".into() },
                    mib.to_string(),
                    threads.to_string(),
                    fmt_ns(Summary::of(&on_a).median),
                    fmt_ns(Summary::of(&off_a).median),
                    format!("{:.0}%", (1.0 - ratio) * 100.0),
                    format!("{} / {}", fmt_ns(Summary::of(&on_t).median), fmt_ns(Summary::of(&off_t).median)),
                    format!("{:.0}%", (1.0 - ratio_t) * 100.0),
                ]);
                if remote && ahead >= 16 {
                    targets.push(format!(
                        "{nodes} nodes, {threads} thread(s): alloc on/off {ratio:.2} (≤ 0.50: {})",
                        super::verdict(ratio <= 0.50)
                    ));
                } else if !remote {
                    targets.push(format!(
                        "{nodes} nodes local, {threads} thread(s): alloc on against off {:+.1}% (within ±2%: {})",
                        (ratio - 1.0) * 100.0,
                        super::verdict((ratio - 1.0).abs() <= 0.02)
                    ));
                }
                for (k, name) in [(0, "on"), (1, "off")] {
                    let a = col(k, |x| x.0);
                    records.push(Record {
                        experiment: "zlc".into(),
                        subject: format!("zonal zonelist_cache {name}"),
                        params: json!({"nodes": nodes, "full_zones_ahead": ahead, "threads": threads,
                                       "pages_per_thread": PAGES, "measure": "alloc ns per page"}),
                        ns_per_op: Summary::of(&a),
                        reference: "zonal zonelist_cache off".into(),
                        ratio_to_reference: paired_ratio(&a, &off_a),
                        reps: opts.reps,
                        samples: a.clone(),
                    });
                }
            }
            z.set_zonelist_cache(true);
            for (p, o) in held {
                z.free_pages(p, o).map_err(|e| e.to_string())?;
            }
        }
    }
    println!(
        "zlc (seed 003): memory hog, every CPU on node 0, allocating order-0 pages beyond its node and touching \
         each; zonelist cache on and off in the same repetitions; ns per page; % better = 1 - on/off; {} \
         repetitions. Seed 003 (28 nodes, 56 CPUs): up to 10-13% less sys time",
        opts.reps
    );
    print_table(
        &["nodes", "zones", "MiB", "threads", "alloc on", "alloc off", "% better", "alloc+touch on / off", "% better"],
        &rows,
    );
    for t in targets {
        println!("  target: {t}");
    }
    println!();
    Ok(records)
}
