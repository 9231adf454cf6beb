//! `scale` (issue 38 §4): how zonal's costs grow with CPUs and nodes past this machine, by
//! simulation. Fake topologies declare virtual CPUs (`vcpus=`: 2, 16, 64, 256 and 1024
//! CPUs over 1, 2 and 8 nodes of 64 MiB), and the bench acts as each CPU to fill its lists
//! (`Zonal::act_as_cpu`, the locked per-CPU path). Per topology: the metadata the handle
//! allocates (glibc's `mallinfo2`, in use before and after the build; the arena's frames
//! are a memfd nothing touches), one housekeeping pass with nothing to do (the worker's
//! decay and fold in one sweep, `Zonal::vmstat_update`), a `vmstat` and a `zoneinfo`
//! report, `drain_all_pages` with every CPU's lists holding frames, an allocation and free
//! when every zone is below its `low` watermark (the slow path, which read every CPU's
//! counter diffs until this bench timed it), a refill of one CPU's lists while every other
//! CPU holds frames, and the order-0 pair on the fast path of the CPU the bench runs on.
//! Each figure is the median of the repetitions; its growth from 2 to 1024 CPUs is printed
//! beside the CPUs' own (512×). The pass and the pair, a few hundred ns and a few ns, are
//! timed in turns with a 2-CPU handle of as many nodes in each repetition, and grow by the
//! median of those ratios: a ratio of medians taken apart read the machine's drift between
//! them (the pair "grew" 1.4–2.1× in half the runs). The metadata target is measured on a
//! handle of 256 CPUs and 8 nodes of 4 GiB built for it (a 32 GiB memfd, untouched).

use super::{fmt_ns, print_table, verdict, BenchOpts, Record, Summary};
use serde_json::json;
use std::time::{Duration, Instant};
use zonal::topology::Machine;
use zonal::zone::Watermark;
use zonal::{Config, Gfp, NodeId, Topology, Zonal};

/// The CPU counts swept.
pub const CPUS: [usize; 5] = [2, 16, 64, 256, 1024];
/// The node counts swept.
pub const NODES: [usize; 3] = [1, 2, 8];
/// Each node's memory in the sweep: small, so that 8 nodes build in milliseconds, and
/// large enough for a per-CPU batch above 1.
const NODE_SIZE: u64 = 64 << 20;
/// The metadata target's machine: 256 CPUs, 8 nodes of 4 GiB (issue 38).
const TARGET_CPUS: usize = 256;
const TARGET_NODES: usize = 8;
const TARGET_NODE_SIZE: u64 = 4 << 30;
/// Bytes of metadata per managed frame the target allows: a quarter of Linux's 64-byte
/// `struct page`.
const TARGET_BYTES_PER_FRAME: f64 = 16.0;
/// What a housekeeping pass with nothing to do may cost per CPU.
const TARGET_PASS_NS_PER_CPU: f64 = 1000.0;
/// How far the order-0 pair may move from 2 to 1024 CPUs and still count as not growing:
/// about the spread of its medians between runs on these machines (6.2–7.6 ns).
const PAIR_NOISE: f64 = 1.25;

/// The columns that are times, in the order the table prints them: (record subject, header).
const TIMES: [(&str, &str); 7] = [
    ("housekeeping pass", "pass ns"),
    ("vmstat report", "vmstat µs"),
    ("zoneinfo report", "zoneinfo µs"),
    ("drain_all_pages", "drain µs"),
    ("alloc+free below low", "below low ns"),
    ("refill, others holding", "refill ns"),
    ("order-0 pair", "pair ns"),
];

/// One topology's figures: ns per operation per repetition for each of [`TIMES`], and the
/// metadata.
struct Cell {
    cpus: usize,
    nodes: usize,
    managed: usize,
    heap: Option<usize>,
    times: Vec<Vec<f64>>,
    /// Per column, per repetition: the time over that of a handle of the smallest CPU count
    /// on as many nodes, timed right beside it ([`paired`]); empty for the columns timed
    /// alone.
    vs_smallest: Vec<Vec<f64>>,
}

/// Bytes in use by malloc (glibc's `mallinfo2`: every arena's allocated chunks and the
/// mmapped ones), where zonal's metadata lives (the frames are the arena's memfd).
fn heap_in_use() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallinfo2` has no preconditions; it reads malloc's statistics under its
        // own locks and returns them by value.
        let m = unsafe { libc::mallinfo2() };
        Some(m.uordblks + m.hblkhd)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// This process's resident set in bytes (`/proc/self/statm`).
fn rss() -> isize {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|r| r.parse::<isize>().ok()))
        .unwrap_or(0);
    pages * zonal::PAGE_SIZE as isize
}

/// Builds a handle of `nodes` nodes of `size` and `cpus` CPU ids (those past the machine's
/// virtual), the worker's pass out of the way (the bench runs passes itself), and measures
/// what the build allocated. `mem_total` is the memory the topology may claim: the
/// machine's, or more for the metadata target, whose frames nothing touches.
fn build(
    opts: &BenchOpts,
    cpus: usize,
    nodes: usize,
    size: u64,
    mem_total: u64,
) -> Result<(Zonal, Option<usize>, isize), String> {
    let machine = Machine { mem_total, ..Machine::current().map_err(|e| e.to_string())? };
    let spec = format!("nodes={nodes},size={},vcpus={cpus}", zonal::topology::fmt_size(size));
    let mut config: Config = opts.config.clone().pcp(true);
    config.topology = Topology::parse_for(&spec, machine).map_err(|e| format!("scale: {spec}: {e}"))?;
    config.stat_interval = Duration::from_secs(3600);
    let (heap0, rss0) = (heap_in_use(), rss());
    let z = Zonal::new(config).map_err(|e| format!("scale: cannot build {spec}: {e}"))?;
    let heap = heap_in_use().zip(heap0).map(|(a, b)| a.saturating_sub(b));
    Ok((z, heap, rss() - rss0))
}

/// Median ns of `f` run `n` times, over `reps` repetitions: ns per run, one per repetition.
fn per_rep(reps: usize, n: u64, mut f: impl FnMut()) -> Vec<f64> {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect()
}

/// [`per_rep`] for `f` and for `g`, its control, in turns within each repetition (which one
/// goes first alternates): `f`'s ns per run, and per repetition `f`'s time over `g`'s. A
/// ratio of two medians taken minutes apart carries the machine's drift between them (the
/// VM's rate moves by tens of percent over seconds); one of times a few microseconds apart
/// does not.
fn paired(reps: usize, n: u64, mut f: impl FnMut(), mut g: impl FnMut()) -> (Vec<f64>, Vec<f64>) {
    let time = |h: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..n {
            h();
        }
        t.elapsed().as_nanos() as f64 / n as f64
    };
    (0..reps)
        .map(|r| {
            let (a, b) = if r % 2 == 0 {
                let a = time(&mut f);
                (a, time(&mut g))
            } else {
                let b = time(&mut g);
                (time(&mut f), b)
            };
            (a, a / b)
        })
        .unzip()
}

/// Every CPU acts once: one order-0 allocation from its node and its free, so that its lists
/// keep the refill's frames.
fn every_cpu_holds_frames(z: &Zonal) -> Result<(), String> {
    for cpu in 0..z.nr_cpus() {
        let a = z.act_as_cpu(cpu).map_err(|e| e.to_string())?;
        let p = a.alloc_pages(Gfp::KERNEL, 0).map_err(|e| format!("scale: cpu {cpu}: {e}"))?;
        a.free_pages(p.as_ptr(), 0).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One topology's measurements, in `reps` repetitions each; the pass and the pair also
/// against a handle of `smallest` CPUs on as many nodes, timed beside them.
fn measure(opts: &BenchOpts, cpus: usize, nodes: usize, smallest: usize) -> Result<Cell, String> {
    let reps = opts.reps.max(1);
    let mem_total = Machine::current().map_err(|e| e.to_string())?.mem_total;
    let (control, _, _) = build(opts, smallest, nodes, NODE_SIZE, mem_total)?;
    let (z, heap, _) = build(opts, cpus, nodes, NODE_SIZE, mem_total)?;
    let managed = z.zones().iter().map(|zn| zn.managed).sum();
    let pass = |z: &Zonal| {
        z.vmstat_update();
    };
    // The first passes lock every list once (a new list has not been seen idle yet).
    for h in [&z, &control] {
        pass(h);
        pass(h);
    }
    let mut times = Vec::with_capacity(TIMES.len());
    let mut vs_smallest = vec![Vec::new(); TIMES.len()];
    let (t, r) = paired(reps, 20, || pass(&z), || pass(&control));
    times.push(t);
    vs_smallest[0] = r;
    let mut sink = 0usize;
    times.push(per_rep(reps, 3, || sink += z.vmstat().len()).into_iter().map(|ns| ns / 1e3).collect());
    times.push(per_rep(reps, 3, || sink += z.zoneinfo().len()).into_iter().map(|ns| ns / 1e3).collect());
    // drain_all_pages with every CPU's lists holding frames, filled again (untimed) before
    // each repetition.
    let mut drain = Vec::with_capacity(reps);
    for _ in 0..reps {
        every_cpu_holds_frames(&z)?;
        let t = Instant::now();
        sink += z.drain_all_pages();
        drain.push(t.elapsed().as_nanos() as f64 / 1e3);
    }
    times.push(drain);
    let pair = |z: &Zonal| {
        if let Ok(p) = z.alloc_pages(Gfp::KERNEL, 0) {
            let _ = z.free_pages(p.as_ptr(), 0);
        }
    };
    let (pair, r) = paired(reps, 20_000, || pair(&z), || pair(&control));
    vs_smallest[TIMES.len() - 1] = r;
    drop(control);
    // On CPU 0, acting as CPU 0: the lists' holder is on their CPU, so no fence (a real
    // CPU's cache runs, and a holder elsewhere would fence it, which is not what is measured).
    let pinned = zonal::cpu::set_affinity(0).is_ok();
    let refill = refill_while_others_hold(&z, reps);
    // Below low comes last: it holds most of node 0.
    let below = refill.as_ref().map_err(|e| e.clone()).and_then(|_| below_low(&z, reps));
    if pinned {
        let _ = zonal::cpu::allow_all_cpus();
    }
    times.push(below?);
    times.push(refill?);
    times.push(pair);
    std::hint::black_box(sink);
    Ok(Cell { cpus, nodes, managed, heap, times, vs_smallest })
}

/// A refill of CPU 0's order-0 list from an empty one while every other CPU's lists hold
/// frames: ns per refilling allocation, 50 per repetition (CPU 0's lists drained, untimed,
/// before each).
fn refill_while_others_hold(z: &Zonal, reps: usize) -> Result<Vec<f64>, String> {
    every_cpu_holds_frames(z)?;
    let a = z.act_as_cpu(0).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps {
        let mut ns = 0u128;
        for _ in 0..50 {
            a.drain();
            let t = Instant::now();
            let p = a.alloc_pages(Gfp::KERNEL, 0).map_err(|e| e.to_string())?;
            ns += t.elapsed().as_nanos();
            a.free_pages(p.as_ptr(), 0).map_err(|e| e.to_string())?;
        }
        out.push(ns as f64 / 50.0);
    }
    z.drain_all_pages();
    Ok(out)
}

/// An order-0 allocation and its free as CPU 0 while every zone is below its `low` watermark
/// and above `min`: each allocation walks its zonelist at `low` in vain and takes the slow
/// path, which reads each zone's free count with every CPU's diff
/// (`zone_page_state_snapshot`, Linux's drift-mark read) before its walk at `min`. ns per
/// pair, 2,000 per repetition. `watermark_scale_factor` is raised to 1000 (10% of a zone
/// from `min` to `low`) so that the zones can sit between them with a refill of whole runs to
/// spare; the frames that hold them there are freed after.
fn below_low(z: &Zonal, reps: usize) -> Result<Vec<f64>, String> {
    z.set_watermark_scale_factor(1000).map_err(|e| e.to_string())?;
    let a = z.act_as_cpu(0).map_err(|e| e.to_string())?;
    let max_order = z.max_order().pages().trailing_zeros();
    let mut held: Vec<(*mut u8, u32)> = Vec::new();
    let give_back = |held: Vec<(*mut u8, u32)>| {
        for (p, o) in held {
            let _ = z.free_pages(p, o);
        }
        z.drain_all_pages();
    };
    let between = |node: NodeId| -> Result<bool, String> {
        let zone = &z.zones()[z.node_zones(node).map_err(|e| e.to_string())?[0].0 as usize];
        let free = z.nr_free_pages_approx(node).map_err(|e| e.to_string())?;
        Ok(free > zone.watermark(Watermark::Min) && free < zone.watermark(Watermark::Low))
    };
    for n in 0..z.topology().nr_nodes() {
        let node = NodeId(n as u16);
        let zone = &z.zones()[z.node_zones(node).map_err(|e| e.to_string())?[0].0 as usize];
        let (min, low) = (zone.watermark(Watermark::Min), zone.watermark(Watermark::Low));
        let goal = min + (low - min) / 2;
        let first = held.len();
        // Large blocks while far above, then frames (CPU 0's lists drained after each, so that
        // what a refill took beyond the frame comes back), until the exact free count is
        // between `min` and `low`; frames given back where a refill overshot.
        for _ in 0..1_000_000 {
            let free = z.nr_free_pages_approx(node).map_err(|e| e.to_string())?;
            if free > min && free < low {
                break;
            }
            if free <= min {
                match held[first..].iter().rposition(|&(_, o)| o == 0) {
                    Some(i) => {
                        let (p, _) = held.swap_remove(first + i);
                        a.free_pages(p, 0).map_err(|e| e.to_string())?;
                        a.drain();
                    }
                    None => break,
                }
                continue;
            }
            let order = if free > goal + (2 << max_order) { max_order } else { 0 };
            match a.alloc_pages_node(node, Gfp::THISNODE, order) {
                Ok(p) => held.push((p.as_ptr(), order)),
                Err(e) => {
                    give_back(held);
                    return Err(format!("scale: could not take node {n} below low: {e}"));
                }
            }
            if order == 0 {
                a.drain();
            }
        }
    }
    let mut all_between = true;
    for n in 0..z.topology().nr_nodes() {
        all_between &= between(NodeId(n as u16))?;
    }
    let times = if all_between {
        per_rep(reps, 2000, || {
            if let Ok(p) = a.alloc_pages(Gfp::KERNEL, 0) {
                let _ = a.free_pages(p.as_ptr(), 0);
            }
        })
    } else {
        vec![f64::NAN; reps]
    };
    let still = between(NodeId(0))?;
    give_back(held);
    if !still {
        return Ok(vec![f64::NAN; reps]);
    }
    Ok(times)
}

/// The metadata of the target's machine (256 CPUs, 8 nodes of 4 GiB): bytes allocated by the
/// build and resident after it.
fn target_metadata(opts: &BenchOpts) -> Result<(usize, Option<usize>, isize), String> {
    let need = TARGET_NODES as u64 * TARGET_NODE_SIZE;
    let mem = zonal::topology::Machine::current().map_err(|e| e.to_string())?.mem_total.max(need);
    let (z, heap, rss) = build(opts, TARGET_CPUS, TARGET_NODES, TARGET_NODE_SIZE, mem)?;
    let managed = z.zones().iter().map(|zn| zn.managed).sum();
    drop(z);
    Ok((managed, heap, rss))
}

/// Runs the sweep, prints its table, the growth from 2 to 1024 CPUs and the targets, and
/// returns the records.
pub fn run(opts: &BenchOpts) -> Result<Vec<Record>, String> {
    // The CPUs a topology counts as the machine's (configured, as `Topology::parse` reads).
    let machine_cpus = Machine::current().map_err(|e| e.to_string())?.nr_cpus;
    let mut cells: Vec<Cell> = Vec::new();
    let grid: Vec<(usize, usize)> =
        NODES.iter().flat_map(|&n| CPUS.iter().map(move |&c| (c, n))).filter(|&(c, _)| c >= machine_cpus).collect();
    for (i, &(cpus, nodes)) in grid.iter().enumerate() {
        let shown = progress(opts, &format!("{cpus} cpus × {nodes} node(s), {} of {}", i + 1, grid.len()));
        let c = measure(opts, cpus, nodes, CPUS.iter().copied().find(|&c| c >= machine_cpus).unwrap_or(cpus));
        super::clear_progress(opts, shown);
        cells.push(c?);
    }
    let shown = progress(opts, &format!("the metadata of {TARGET_CPUS} cpus × {TARGET_NODES} nodes of 4 GiB"));
    let target = target_metadata(opts);
    super::clear_progress(opts, shown);
    let target = target?;
    let shown = progress(opts, "the control: lines read per block");
    let control = [16, 8192].map(|blocks| Summary::of(&line_reads(blocks, opts.reps.max(1))).median);
    super::clear_progress(opts, shown);
    print_report(opts, machine_cpus, &cells, target, control);
    Ok(records(opts, &cells, target))
}

/// The progress line of one step of the sweep (its repetitions run inside the step).
fn progress(opts: &BenchOpts, what: &str) -> usize {
    if !opts.progress {
        return 0;
    }
    let (i, n) = opts.step;
    let line = format!("  experiment {i} of {n}, scale: {what}");
    eprint!("\r{line}   ");
    line.chars().count() + 3
}

/// The control for the housekeeping pass: ns per block to read 4 lines of each of `blocks`
/// blocks of 4 KiB in turn, as an idle pass reads a few lines of each CPU's lists of each
/// zone (structures of about 4 KiB, `PerCpuPages`): what the memory hierarchy alone makes of
/// a linear scan as its working set outgrows the caches. 20 sweeps per repetition.
fn line_reads(blocks: usize, reps: usize) -> Vec<f64> {
    const WORDS: usize = 512;
    let mem: Vec<u64> = (0..blocks * WORDS).map(|i| i as u64).collect();
    per_rep(reps, 20, || {
        let mut sum = 0u64;
        for b in mem.chunks_exact(WORDS) {
            sum = sum.wrapping_add(b[0] ^ b[8] ^ b[40] ^ b[300]);
        }
        std::hint::black_box(sum);
    })
    .into_iter()
    .map(|ns| ns / blocks as f64)
    .collect()
}

fn median(v: &[f64]) -> f64 {
    Summary::of(v).median
}

/// The cell of `cpus` CPUs on `nodes` nodes.
fn cell(cells: &[Cell], cpus: usize, nodes: usize) -> Option<&Cell> {
    cells.iter().find(|c| c.cpus == cpus && c.nodes == nodes)
}

/// A column's growth from the smallest CPU count to the largest, per node count: the median
/// of the per-repetition ratios to the smallest count's handle timed beside it where the
/// column has them, else the ratio of the two cells' medians.
fn growth(cells: &[Cell], col: usize, nodes: usize) -> Option<f64> {
    let (lo, hi) = (cells.iter().filter(|c| c.nodes == nodes).min_by_key(|c| c.cpus)?, cell(cells, 1024, nodes)?);
    match hi.vs_smallest[col].is_empty() {
        true => Some(median(&hi.times[col]) / median(&lo.times[col])),
        false => Some(median(&hi.vs_smallest[col])),
    }
}

fn print_report(
    opts: &BenchOpts,
    machine_cpus: usize,
    cells: &[Cell],
    target: (usize, Option<usize>, isize),
    control: [f64; 2],
) {
    println!(
        "scale (issue 38 §4): virtual CPUs (vcpus=N) over 1, 2 and 8 fake nodes of {} each, the bench acting as each \
         CPU on its locked lists; medians of {} repetitions; metadata from malloc's bytes in use (mallinfo2) around \
         the build, the frames a memfd nothing touches; pass = one housekeeping pass with nothing to do (decay and \
         fold), ns per CPU; drain = drain_all_pages with every CPU's lists holding frames; below low = an order-0 \
         allocation and free as CPU 0 with every zone between its min and low watermarks (the slow path); refill \
         = CPU 0's empty lists refilled while every other CPU's hold frames (a refill takes fewer frames as the \
         CPUs per node grow: high is split among them); pair = the order-0 pair on this thread's CPU (the fast \
         path). This machine: {machine_cpus} CPUs",
        zonal::topology::fmt_size(NODE_SIZE),
        opts.reps
    );
    let header: Vec<&str> =
        ["cpus", "nodes", "metadata MiB", "B/frame"].into_iter().chain(TIMES.iter().map(|(_, h)| *h)).collect();
    let rows: Vec<Vec<String>> = cells
        .iter()
        .map(|c| {
            let mut r = vec![c.cpus.to_string(), c.nodes.to_string()];
            match c.heap {
                Some(h) => {
                    r.push(format!("{:.1}", h as f64 / (1 << 20) as f64));
                    r.push(format!("{:.1}", h as f64 / c.managed as f64));
                }
                None => r.extend(["-".into(), "-".into()]),
            }
            for (i, t) in c.times.iter().enumerate() {
                // The pass per CPU, as the target reads it.
                let m = if i == 0 { median(t) / c.cpus as f64 } else { median(t) };
                r.push(if m.is_nan() { "-".into() } else { fmt_ns(m) });
            }
            r
        })
        .collect();
    print_table(&header, &rows);
    // Growth from 2 to 1024 CPUs, per column and node count, beside the CPUs' own ratio.
    let lo = cells.iter().map(|c| c.cpus).min().unwrap_or(2);
    let cpu_ratio = 1024.0 / lo as f64;
    println!(
        "growth from {lo} to 1024 CPUs (the CPUs grow {cpu_ratio:.0}×; metadata and the pass as totals; the pass and the \
         pair as medians of per-repetition ratios to a {lo}-CPU handle of as many nodes timed beside them):"
    );
    let mut grow_rows = Vec::new();
    let meta = |nodes: usize| {
        let (a, b) = (cells.iter().filter(|c| c.nodes == nodes).min_by_key(|c| c.cpus)?, cell(cells, 1024, nodes)?);
        Some(b.heap? as f64 / a.heap? as f64)
    };
    grow_rows.push(
        std::iter::once("metadata".to_string())
            .chain(NODES.iter().map(|&n| meta(n).map_or("-".into(), |g| format!("{g:.1}×"))))
            .collect::<Vec<_>>(),
    );
    for (i, (name, _)) in TIMES.iter().enumerate() {
        grow_rows.push(
            std::iter::once(name.to_string())
                .chain(NODES.iter().map(|&n| growth(cells, i, n).map_or("-".into(), |g| format!("{g:.1}×"))))
                .collect(),
        );
    }
    let head: Vec<String> =
        std::iter::once("column".to_string()).chain(NODES.iter().map(|n| format!("{n} node(s)"))).collect();
    print_table(&head.iter().map(String::as_str).collect::<Vec<_>>(), &grow_rows);
    // The per-CPU control: what each CPU adds per zone, against what each frame costs.
    if let (Some(a), Some(b)) = (cell(cells, lo, 8), cell(cells, 1024, 8)) {
        if let (Some(ha), Some(hb)) = (a.heap, b.heap) {
            let per_cpu_zone = (hb as f64 - ha as f64) / ((1024 - lo) * 8) as f64;
            println!(
                "  control: per CPU and zone {:.0} bytes (from {lo} to 1024 CPUs on 8 nodes); per frame {:.2} bytes \
                 at {lo} CPUs",
                per_cpu_zone,
                ha as f64 / a.managed as f64
            );
        }
    }
    let (managed, heap, rss) = target;
    match heap {
        Some(h) => println!(
            "  target: metadata at {TARGET_CPUS} CPUs × {TARGET_NODES} nodes of {}: {:.2} bytes per managed frame \
             allocated ({:.1} MiB; {:.2} resident by RSS) (≤ {TARGET_BYTES_PER_FRAME:.0}: {})",
            zonal::topology::fmt_size(TARGET_NODE_SIZE),
            h as f64 / managed as f64,
            h as f64 / (1 << 20) as f64,
            rss as f64 / managed as f64,
            verdict(h as f64 / managed as f64 <= TARGET_BYTES_PER_FRAME)
        ),
        None => println!(
            "  target: metadata at {TARGET_CPUS} CPUs × {TARGET_NODES} nodes of {}: {:.2} bytes per managed frame \
             resident by RSS (malloc's figures unavailable) (≤ {TARGET_BYTES_PER_FRAME:.0}: {})",
            zonal::topology::fmt_size(TARGET_NODE_SIZE),
            rss as f64 / managed as f64,
            verdict(rss as f64 / managed as f64 <= TARGET_BYTES_PER_FRAME)
        ),
    }
    // The pass per CPU and zone, against the control's blocks read from a working set as
    // small and as large.
    let per_list = |c: &Cell| median(&c.times[0]) / (c.cpus * c.nodes) as f64;
    if let (Some(a), Some(b)) = (cell(cells, lo, 8), cell(cells, 1024, 8)) {
        println!(
            "  control: the pass per CPU and zone {} ns at {lo} CPUs × 8 nodes, {} at 1024 ({:.1}×); reading 4 lines of \
             each 4-KiB block in turn, {} ns a block over 16 blocks, {} over 8192 ({:.1}×): a linear scan whose lines \
             outgrow the caches",
            fmt_ns(per_list(a)),
            fmt_ns(per_list(b)),
            per_list(b) / per_list(a),
            fmt_ns(control[0]),
            fmt_ns(control[1]),
            control[1] / control[0]
        );
    }
    let worst_pass = cells.iter().map(|c| median(&c.times[0]) / c.cpus as f64).fold(0.0, f64::max);
    println!(
        "  target: a housekeeping pass with nothing to do, worst over the sweep: {} ns per CPU (≤ {:.0}: {})",
        fmt_ns(worst_pass),
        TARGET_PASS_NS_PER_CPU,
        verdict(worst_pass <= TARGET_PASS_NS_PER_CPU)
    );
    for (i, (name, _)) in TIMES.iter().enumerate() {
        let worst = NODES.iter().filter_map(|&n| growth(cells, i, n)).fold(f64::NAN, f64::max);
        if worst.is_nan() {
            continue;
        }
        if i == TIMES.len() - 1 {
            println!(
                "  target: {name}, the fast path, grows {worst:.2}× from {lo} to 1024 CPUs (not at all, ≤ \
                 {PAIR_NOISE}× for noise: {})",
                verdict(worst <= PAIR_NOISE)
            );
        } else {
            println!(
                "  target: {name} grows {worst:.1}× from {lo} to 1024 CPUs, worst over the node counts (at most \
                 linearly, ≤ {cpu_ratio:.0}×: {})",
                verdict(worst <= cpu_ratio)
            );
        }
    }
    println!();
}

/// The JSON records: a record per topology and column (the pass's ns per pass, not per CPU),
/// the metadata as bytes per managed frame (`unit` says which), each against the same column
/// at the smallest CPU count on as many nodes.
fn records(opts: &BenchOpts, cells: &[Cell], target: (usize, Option<usize>, isize)) -> Vec<Record> {
    let mut out = Vec::new();
    for c in cells {
        let base = cells.iter().filter(|b| b.nodes == c.nodes).min_by_key(|b| b.cpus).unwrap_or(c);
        let params = |unit: &str| json!({"cpus": c.cpus, "nodes": c.nodes, "node_size": zonal::topology::fmt_size(NODE_SIZE), "unit": unit});
        if let (Some(h), Some(bh)) = (c.heap, base.heap) {
            let per = h as f64 / c.managed as f64;
            out.push(Record {
                experiment: "scale".into(),
                subject: "metadata".into(),
                params: params("bytes per managed frame"),
                ns_per_op: Summary::of(&[per]),
                reference: format!("{} cpus", base.cpus),
                ratio_to_reference: h as f64 / bh as f64,
                reps: 1,
                samples: vec![per],
            });
        }
        for (i, (name, _)) in TIMES.iter().enumerate() {
            let unit = if (1..=3).contains(&i) { "µs" } else { "ns" };
            out.push(Record {
                experiment: "scale".into(),
                subject: name.to_string(),
                params: params(unit),
                ns_per_op: Summary::of(&c.times[i]),
                reference: format!("{} cpus", base.cpus),
                ratio_to_reference: match c.vs_smallest[i].is_empty() {
                    true => median(&c.times[i]) / median(&base.times[i]),
                    false => median(&c.vs_smallest[i]),
                },
                reps: opts.reps,
                samples: c.times[i].clone(),
            });
        }
    }
    let (managed, heap, rss) = target;
    let per = heap.map_or(rss as f64, |h| h as f64) / managed as f64;
    out.push(Record {
        experiment: "scale".into(),
        subject: "metadata target".into(),
        params: json!({"cpus": TARGET_CPUS, "nodes": TARGET_NODES, "node_size": zonal::topology::fmt_size(TARGET_NODE_SIZE),
            "unit": "bytes per managed frame", "resident_bytes_per_frame": rss as f64 / managed as f64,
            "allocated_bytes": heap, "managed_frames": managed}),
        ns_per_op: Summary::of(&[per]),
        reference: "target".into(),
        ratio_to_reference: per / TARGET_BYTES_PER_FRAME,
        reps: 1,
        samples: vec![per],
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each repetition runs both closures `n` times each, one after the other, and which
    /// goes first alternates, so that neither always runs on the other's warm caches.
    #[test]
    fn paired_times_both_in_turns_and_alternates_which_goes_first() {
        let order = std::cell::RefCell::new(String::new());
        let (times, ratios) = paired(4, 3, || order.borrow_mut().push('f'), || order.borrow_mut().push('g'));
        assert_eq!((times.len(), ratios.len()), (4, 4));
        assert_eq!(order.into_inner(), "fffggggggfff".repeat(2));
    }
}
