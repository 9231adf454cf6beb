//! `numab`: seed 004's experiment on a fake two-node topology. Both CPUs sit on node 1; an
//! "eater" holds all of node 1 but a few MiB, so a balanced region allocated under the local
//! policy and first-touched from node 1's CPUs lands mostly on node 0. Two pmbench-like
//! threads, one pinned per CPU, read and write the region with a normal distribution over its
//! pages ("before"); then the eater is freed and NUMA balancing moves the pages to node 1
//! ("during"), until it has converged ("after"). Variants: {delayed, eager} mapping ×
//! {userfaultfd, mprotect} backend, rotated across repetitions, each run on a fresh allocator.
//!
//! Reported per variant (medians over repetitions): pages migrated, TLB shootdowns received
//! per migrated page during the migration phase (the `TLB:` row of `/proc/interrupts`, summed
//! over CPUs) and remote flushes requested (the `tlb:tlb_flush` tracepoint with reason
//! `TLB_REMOTE_SEND_IPI`, counted by perf on every CPU where tracefs is mounted and perf
//! allows it; under KVM a preempted vCPU is skipped, so fewer are received than requested),
//! both machine-wide, so anything else flushing on the machine counts too, and both split
//! into those while a scan pass ran and the rest (faults, migrations and collapses) and
//! summed (every flush of the migration phase, what seed 004 counts), with a control: the
//! flushes outside scan passes before the eater's free, when no page can migrate, at the same
//! rate; accesses/s per phase and over the whole run, migration cost per page
//! (`numab_migrate_ns / pgmigrate_success`), the local share of hint faults per 100 ms
//! window, the most VMAs the region needed (`Region::vma_runs`), and a log2 histogram of
//! sampled access latencies. Every page carries
//! a pattern and per-thread counters updated with atomics, checked byte by byte at the end;
//! the allocator's invariants are checked after everything is freed.
//!
//! Knobs (environment, as `zonal bench` has no per-experiment flags):
//! `ZONAL_NUMAB_SECONDS` sets one run's length (default 1.3 s: 30% before, 50% during, 20%
//! after; the default run of 9 repetitions × 4 variants stays near a minute);
//! `ZONAL_NUMAB_REMOTE_PENALTY_NS` busy-waits that long on every access to a page whose frame
//! is on the other node than the accessing CPU (looked up in the region's page table), so
//! that locality shows in throughput on fake nodes, which have no latency difference (off by
//! default).

#![deny(clippy::undocumented_unsafe_blocks)]

use super::{paired_ratio, print_table, verdict, BenchOpts, Record, Summary};
use serde_json::json;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zonal::{Gfp, MemPolicy, NodeId, Zonal};
use zonal_numab::{Backend, Balancer, MigrateMode, Region, Stats, PAGE};

/// Memory of each fake node.
const NODE_SIZE: &str = "64M";
/// The balanced region: half a node, 16 times a CPU's L2 here (2 MiB), so that accesses go
/// to the shared cache or memory as pmbench's do.
const REGION_BYTES: usize = 32 << 20;
const PAGES: usize = REGION_BYTES / PAGE;
/// What the eater leaves free on node 1: first touches take it before falling back to node 0.
const EATER_LEAVES: usize = 4 << 20;
/// Worker threads, one per CPU of node 1 (the machine has two).
const THREADS: usize = 2;
/// Words of a page: word 0 holds the page's tag, words 1..=THREADS each thread's counter,
/// the rest a fixed pattern the readers check.
const WORDS: usize = PAGE / 8;
const FIRST_DATA: usize = 1 + THREADS;
const TAG: u64 = 0x5ea1_0004_0000_0000;
/// The sampling window for throughput, local share and VMAs.
const WINDOW: Duration = Duration::from_millis(100);
/// One access in this many is timed for the latency histogram.
const SAMPLE_EVERY: u64 = 64;
/// Log2 latency buckets: bucket b holds latencies in [2^(b-1), 2^b) ns (bucket 0: 0 ns).
const BUCKETS: usize = 40;
/// Entries of the table that maps random bits to a normally distributed page.
const NORMAL_TABLE: usize = 1 << 16;
/// The scanner: a pass every 100 ms over the whole region. The bench's main thread runs the
/// passes (`Balancer::scan_now`) at this fixed period instead of the balancer's thread at an
/// adaptive one, so that the TLB shootdowns received while a pass runs can be told apart
/// from those of hint faults and migrations, which `/proc/interrupts` alone cannot. A pass
/// covers the whole region because `scan_now` starts from the region's first page every
/// time: passes of a few MiB would mark the same low pages over and over. Linux's passes
/// (256 MiB, at most one a second) also cover a region this small whole; the period is
/// Linux's minimum over 10, so that migration finishes within a short run.
const SCAN_PERIOD: Duration = Duration::from_millis(100);
const SCAN_SIZE_MB: u64 = (REGION_BYTES >> 20) as u64;
/// Frames kept ready per node: a migration that finds its reserve empty fails, so the
/// reserve must outlast a burst of migrations between two refills by the balancer's thread.
const RESERVE_PAGES: usize = 1024;

const PHASES: [&str; 3] = ["before", "during", "after"];

#[derive(Clone, Copy, Debug, PartialEq)]
struct Variant {
    backend: Backend,
    mode: MigrateMode,
}

impl Variant {
    fn name(&self) -> String {
        format!("{} {}", backend_name(self.backend), mode_name(self.mode))
    }
}

fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Userfaultfd => "userfaultfd",
        Backend::Mprotect => "mprotect",
        Backend::UserfaultfdThread => "userfaultfd-thread",
        Backend::Auto => "auto",
    }
}

fn mode_name(m: MigrateMode) -> &'static str {
    match m {
        MigrateMode::Delayed => "delayed",
        MigrateMode::Eager => "eager",
    }
}

/// Phase lengths of one run.
#[derive(Clone, Copy, Debug)]
struct Phases {
    before: Duration,
    during: Duration,
    after: Duration,
}

impl Phases {
    /// From `ZONAL_NUMAB_SECONDS` (the whole run), each phase at least two windows.
    fn from_env() -> Result<Phases, String> {
        let secs = match std::env::var("ZONAL_NUMAB_SECONDS") {
            Ok(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| (0.5..=3600.0).contains(s))
                .ok_or_else(|| format!("ZONAL_NUMAB_SECONDS=`{v}`: need seconds from 0.5 to 3600"))?,
            Err(_) => 1.3,
        };
        let part = |f: f64| Duration::from_secs_f64((secs * f).max(2.0 * WINDOW.as_secs_f64()));
        Ok(Phases { before: part(0.3), during: part(0.5), after: part(0.2) })
    }
}

mod flush;
mod report;
mod workload;

use flush::*;
use workload::*;

/// Builds the two-node allocator with every CPU on node 1.
fn allocator(opts: &BenchOpts) -> Result<Arc<Zonal>, String> {
    let ncpu = zonal::cpu::nr_cpus_online().max(1);
    let spec = format!("nodes=2,sizes={NODE_SIZE}:{NODE_SIZE},cpus=:0-{}", ncpu - 1);
    let mut config = opts.config.clone();
    config.topology = zonal::Topology::parse(&spec).map_err(|e| e.to_string())?;
    Zonal::new(config).map(Arc::new).map_err(|e| format!("numab: cannot build the two-node allocator: {e}"))
}

/// The eater's blocks: (address, order).
type Eater = Vec<(NonNull<u8>, u32)>;

/// The eater: every block node 1 gives, largest first, then back the smallest until
/// `EATER_LEAVES` bytes are free again.
fn eat(z: &Zonal, nid: NodeId) -> Eater {
    let mut held = Vec::new();
    for o in (0..=z.max_order().get() as u32).rev() {
        while let Ok(p) = z.alloc_pages_node(nid, Gfp::THISNODE, o) {
            held.push((p, o));
        }
    }
    let mut given = 0;
    while given < EATER_LEAVES {
        let Some((p, o)) = held.pop() else { break };
        let _ = z.free_pages(p.as_ptr(), o);
        given += PAGE << o;
    }
    held
}

fn release(z: &Zonal, held: Eater) -> Result<(), String> {
    for (p, o) in held {
        z.free_pages(p.as_ptr(), o).map_err(|e| format!("numab: freeing the eater: {e}"))?;
    }
    Ok(())
}

/// Runs `work(t)` on THREADS threads, thread t pinned to CPU t (mod the CPUs), all of node
/// 1, and `meanwhile()` on the calling thread; returns what each gave.
fn on_workers<R: Send, M>(
    work: impl Fn(usize) -> R + Sync,
    meanwhile: impl FnOnce() -> M,
) -> Result<(Vec<R>, M), String> {
    let ncpu = zonal::cpu::nr_cpus_online().max(1) as u32;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let work = &work;
                s.spawn(move || {
                    zonal::cpu::set_affinity(t as u32 % ncpu).map_err(|e| format!("numab: pinning a thread: {e}"))?;
                    Ok(work(t))
                })
            })
            .collect();
        let m = meanwhile();
        let rs = hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("numab: a worker panicked".into())));
        Ok((rs.collect::<Result<Vec<R>, String>>()?, m))
    })
}

/// The main thread's record of a run: a sample per window, the samples that end each phase,
/// and a scan pass's mean time.
struct Timeline {
    samples: Vec<Sample>,
    /// `samples[marks[i]]` ends phase i.
    marks: [usize; 3],
    pass_ms: f64,
    collapse: Collapse,
}

/// The collapse after the last phase, while the workers still run: the region's mappings
/// before and after, the pages copied, how long it took, and accesses/s in the phase before
/// it against the same length of time after it.
#[derive(Clone, Copy, Debug, Default)]
struct Collapse {
    runs_before: usize,
    runs_after: usize,
    pages: usize,
    ms: f64,
    rate_before: f64,
    rate_after: f64,
}

/// The main thread's part of a run, while the workers access the region: balancing on,
/// scan passes every `SCAN_PERIOD` (the flushes while each runs counted apart), a sample every
/// window, the eater freed at the end of the first phase, and the workers stopped at the
/// end of the last.
fn drive(
    z: &Zonal,
    bal: &Balancer,
    region: &Region,
    ctl: &Ctl,
    setup: &Setup,
    eater: Eater,
) -> Result<Timeline, String> {
    let (ph, meter) = (setup.phases, &setup.meter.for_run());
    let mut eater = Some(eater);
    let mut release_err = Ok(());
    bal.set_enabled(true);
    let t0 = Instant::now();
    // Flushes while a scan pass ran, cumulative: the scanner's own, told apart from those of
    // hint faults and migrations, which happen outside the passes.
    let mut scan_flushes = Flushes::zero_like(meter.read());
    let mut next_scan = t0;
    let (mut scan_time, mut passes) = (Duration::ZERO, 0u32);
    let take = |at: Duration, scan_flushes: Flushes| Sample {
        at,
        accesses: ctl.done.iter().map(|d| d.0.load(Ordering::Relaxed)).sum(),
        stats: bal.stats(),
        flushes: meter.read(),
        scan_flushes,
        vmas: region.vma_runs(),
    };
    let mut samples = vec![take(Duration::ZERO, scan_flushes)];
    let mut marks = [0; 3];
    let ends = [ph.before, ph.before + ph.during, ph.before + ph.during + ph.after];
    let mut k = 1u32;
    for (i, &end) in ends.iter().enumerate() {
        loop {
            let next = (WINDOW * k).min(end);
            // Scan passes until the window ends.
            loop {
                let now = Instant::now();
                if now >= t0 + next {
                    break;
                }
                if now < next_scan {
                    std::thread::sleep(next_scan.min(t0 + next) - now);
                    continue;
                }
                let before = meter.read();
                let t = Instant::now();
                bal.scan_now();
                scan_time += t.elapsed();
                passes += 1;
                scan_flushes = scan_flushes.plus(meter.read().since(before));
                next_scan += SCAN_PERIOD;
            }
            samples.push(take(t0.elapsed(), scan_flushes));
            if next >= end {
                break;
            }
            k += 1;
        }
        marks[i] = samples.len() - 1;
        if i == 0 {
            // The eater goes: node 1 has room and the pages start moving.
            release_err = release(z, eater.take().unwrap_or_default());
        }
        ctl.phase.store(i + 1, Ordering::Relaxed);
    }
    // One collapse pass over the converged region, then as long again as the last phase.
    let (runs_before, t) = (region.vma_runs(), Instant::now());
    let pages = bal.collapse_now(usize::MAX);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let runs_after = region.vma_runs();
    let from = take(t0.elapsed(), scan_flushes);
    std::thread::sleep(ph.after);
    let to = take(t0.elapsed(), scan_flushes);
    ctl.stop.store(true, Ordering::Relaxed);
    release_err?;
    let rate = |x: &Sample, y: &Sample| (y.accesses - x.accesses) as f64 / (y.at - x.at).as_secs_f64().max(1e-9);
    let last = &samples[marks[2]];
    let collapse = Collapse {
        runs_before,
        runs_after,
        pages,
        ms,
        rate_before: rate(&samples[marks[1]], last),
        rate_after: rate(&from, &to),
    };
    Ok(Timeline { samples, marks, pass_ms: scan_time.as_secs_f64() * 1e3 / passes.max(1) as f64, collapse })
}

/// What every run of the experiment shares.
struct Setup<'a> {
    opts: &'a BenchOpts,
    phases: Phases,
    /// The busy-wait per access to a remote page.
    penalty: Duration,
    /// `normal_table(PAGES)`.
    table: Vec<u32>,
    meter: FlushMeter,
}

/// One run of one variant on a fresh allocator.
fn run_one(v: Variant, setup: &Setup) -> Result<RunResult, String> {
    let z = allocator(setup.opts)?;
    let eater = eat(&z, NodeId(1));
    let cfg = zonal_numab::Config {
        enabled: false,
        mode: v.mode,
        backend: v.backend,
        // The balancer's thread never scans (a region is never old enough): see SCAN_PERIOD.
        scan_delay_ms: u64::MAX,
        scan_period_min_ms: SCAN_PERIOD.as_millis() as u64,
        scan_period_max_ms: SCAN_PERIOD.as_millis() as u64,
        scan_size_mb: SCAN_SIZE_MB,
        reserve_pages: RESERVE_PAGES,
        // The seed's experiment moves pages one at a time; chunk migration (2 MiB at once)
        // would amortize eager's flushes over 512 pages and hide what the mapping order costs:
        // right after a pass hides a window, its first hint fault finds all 512 pages hinted.
        chunk_migration: false,
        // Everything else as shipped: the balancer's thread collapses fragmented windows
        // (`collapse_mb`, its flushes counted with the migration phase's), and pages
        // migrating one by one take their windows' destination blocks (`window_migration`).
        ..Default::default()
    };
    let bal = Balancer::new(z.clone(), cfg).map_err(|e| format!("numab: {}: {e}", v.name()))?;
    let region = bal.region(REGION_BYTES, MemPolicy::Local).map_err(|e| format!("numab: region: {e}"))?;
    let base = region.as_ptr() as usize;
    // First touch from node 1's CPUs, writing each page's content: tag, zero counters, pattern.
    let init = |t: usize| {
        for p in t * PAGES / THREADS..(t + 1) * PAGES / THREADS {
            for w in 0..WORDS {
                let val = match w {
                    0 => TAG ^ p as u64,
                    w if w < FIRST_DATA => 0,
                    w => pattern(p, w),
                };
                // SAFETY: a word of a page of the region, alive for this call; the first
                // access faults the page in. Each page is written by one thread only (each
                // thread has its own half).
                unsafe { (*((base + p * PAGE + w * 8) as *const AtomicU64)).store(val, Ordering::Relaxed) };
            }
        }
    };
    on_workers(init, || ())?;
    let placed = region.node_pages();

    let ctl = Ctl { stop: AtomicBool::new(false), phase: AtomicUsize::new(0), done: Default::default() };
    let (outs, timeline) = on_workers(
        |t| worker(t, base, &region, &setup.table, &ctl, setup.penalty, z.local_node()),
        || drive(&z, &bal, &region, &ctl, setup, eater),
    )?;
    let Timeline { samples, marks, pass_ms, collapse } = timeline?;
    bal.set_enabled(false);
    let end_stats = bal.stats();
    let placed_end = region.node_pages();

    let mut hist = [[0u64; BUCKETS]; 3];
    for o in &outs {
        for (h, oh) in hist.iter_mut().zip(&o.hist) {
            for (x, y) in h.iter_mut().zip(oh) {
                *x += y;
            }
        }
    }
    let bad_reads = outs.iter().map(|o| o.bad_reads).sum();
    // Every byte of every page against what it must hold.
    let tallies: Vec<Vec<u64>> = outs.into_iter().map(|o| o.tally).collect();
    let mut corrupted_bytes = 0u64;
    for p in 0..PAGES {
        for w in 0..WORDS {
            // SAFETY: a word of the region, which is alive; the workers have stopped, and an
            // inaccessible page faults and is mapped back by the handler.
            let got = unsafe { (*((base + p * PAGE + w * 8) as *const AtomicU64)).load(Ordering::Relaxed) };
            let want = expected(p, w, &tallies);
            corrupted_bytes += (got ^ want).to_le_bytes().iter().filter(|&&b| b != 0).count() as u64;
        }
    }
    drop(region);
    drop(bal);
    let invariants = z.check_invariants();

    let (b, d, a) = (&samples[0], &samples[marks[0]], &samples[marks[1]]);
    let e = &samples[marks[2]];
    let rate = |x: &Sample, y: &Sample| (y.accesses - x.accesses) as f64 / (y.at - x.at).as_secs_f64().max(1e-9);
    let share = |x: &Sample, y: &Sample| {
        let f = y.stats.numa_hint_faults - x.stats.numa_hint_faults;
        let l = y.stats.numa_hint_faults_local - x.stats.numa_hint_faults_local;
        (f > 0).then(|| l as f64 / f as f64)
    };
    let share_windows: Vec<Option<f64>> = samples[marks[0]..].windows(2).map(|w| share(&w[0], &w[1])).collect();
    let migrated = end_stats.numa_pages_migrated;
    let moved = migrated - d.stats.numa_pages_migrated;
    let converged = samples[marks[0]..]
        .iter()
        .find(|s| (s.stats.numa_pages_migrated - d.stats.numa_pages_migrated) * 100 >= moved * 95)
        .map_or(e.at, |s| s.at);
    Ok(RunResult {
        placed,
        placed_end,
        migrated,
        migrated_during: a.stats.numa_pages_migrated - d.stats.numa_pages_migrated,
        pgmigrate_fail: end_stats.pgmigrate_fail,
        scan_flushes_during: a.scan_flushes.since(d.scan_flushes),
        flushes_during: a.flushes.since(d.flushes).since(a.scan_flushes.since(d.scan_flushes)),
        rate: [rate(b, d), rate(d, a), rate(a, e)],
        rate_run: rate(b, e),
        control: d.flushes.since(b.flushes).since(d.scan_flushes.since(b.scan_flushes)),
        before_s: (d.at - b.at).as_secs_f64(),
        during_s: (a.at - d.at).as_secs_f64(),
        converge_ms: (converged - d.at).as_secs_f64() * 1e3,
        cost_ns: end_stats.migrate_ns as f64 / end_stats.pgmigrate_success.max(1) as f64,
        pass_ms,
        share_after: share(a, e),
        share_final_window: share_windows.iter().rev().find_map(|s| *s),
        share_windows,
        peak_vmas: samples.iter().map(|s| s.vmas).max().unwrap_or(0),
        collapse,
        timeline: windows(&samples),
        eater_freed_s: d.at.as_secs_f64(),
        hist,
        corrupted_bytes,
        bad_reads,
        invariants,
    })
}

impl RunResult {
    /// Per page migrated in the migration phase: flushes in it, outside scan passes
    /// (`in_scans` false) or inside them, received or requested.
    fn per_page(&self, in_scans: bool, requested: bool) -> Option<f64> {
        let f = if in_scans { self.scan_flushes_during } else { self.flushes_during };
        self.per_migrated(f, requested)
    }

    /// Every flush of the migration phase, scan passes included (what seed 004 counts), per
    /// page migrated in it.
    fn per_page_all(&self, requested: bool) -> Option<f64> {
        self.per_migrated(self.flushes_during.plus(self.scan_flushes_during), requested)
    }

    /// The control (flushes outside scans before the eater's free, when nothing migrates),
    /// at its rate over the migration phase's length, per page migrated in it: what the
    /// machine and the balancer's thread flush anyway.
    fn control_per_page(&self, requested: bool) -> Option<f64> {
        let n = if requested { self.control.requested } else { self.control.received };
        n.map(|n| n as f64 * self.during_s / self.before_s.max(1e-9) / self.migrated_during.max(1) as f64)
    }

    /// Of every flush of the migration phase requested, those this process's threads
    /// requested, per page migrated in it: the run's own, whatever else the machine runs.
    fn own_per_page_all(&self) -> Option<f64> {
        let f = self.flushes_during.plus(self.scan_flushes_during);
        f.own.map(|n| n as f64 / self.migrated_during.max(1) as f64)
    }

    /// Of the flushes requested on the machine during the migration phase, the share other
    /// processes requested.
    fn others_share(&self) -> Option<f64> {
        let f = self.flushes_during.plus(self.scan_flushes_during);
        f.requested.zip(f.own).map(|(r, o)| r.saturating_sub(o) as f64 / r.max(1) as f64)
    }

    fn per_migrated(&self, f: Flushes, requested: bool) -> Option<f64> {
        let n = if requested { f.requested } else { f.received };
        n.map(|n| n as f64 / self.migrated_during.max(1) as f64)
    }
}

/// Runs the experiment, prints its table and targets, and returns its records.
pub fn run(opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let phases = Phases::from_env()?;
    let penalty = crate::bench::penalty_from_env("ZONAL_NUMAB_REMOTE_PENALTY_NS", Duration::ZERO)?;
    let mut variants = Vec::new();
    let mut notes = Vec::new();
    match zonal_numab::userfaultfd_available() {
        Ok(()) => variants.extend([Backend::Userfaultfd, Backend::Mprotect]),
        Err((call, errno)) => {
            notes.push(format!(
                "userfaultfd variants skipped: {call} refused ({})",
                std::io::Error::from_raw_os_error(errno)
            ));
            variants.push(Backend::Mprotect);
        }
    }
    let variants: Vec<Variant> = variants
        .into_iter()
        .flat_map(|backend| [MigrateMode::Delayed, MigrateMode::Eager].map(|mode| Variant { backend, mode }))
        .collect();
    let setup = Setup { opts, phases, penalty, table: normal_table(PAGES), meter: FlushMeter::new() };
    let mut results: Vec<Vec<RunResult>> = vec![Vec::new(); variants.len()];
    let mut err = None;
    super::rotate(opts, "numab", variants.len(), |i| {
        if err.is_some() {
            return;
        }
        match run_one(variants[i], &setup) {
            Ok(r) => results[i].push(r),
            Err(e) => err = Some(e),
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    report::report(&setup, &variants, &results, &notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tlb_row_sums_every_cpu() {
        let text = "           CPU0       CPU1       \n  0:         40          0   IO-APIC    2-edge      timer\n\
                    NMI:          0          0   Non-maskable interrupts\n\
                    TLB:    2721482    2744677   TLB shootdowns\n\
                    TRM:          0          0   Thermal event interrupts\n";
        assert_eq!(parse_tlb_row(text), Some(2721482 + 2744677));
        assert_eq!(parse_tlb_row("CPU0\nNMI: 1 Non-maskable\n"), None);
        assert_eq!(parse_tlb_row("TLB: TLB shootdowns\n"), None);
    }

    #[test]
    fn the_remote_ipi_reason_is_read_from_the_format() {
        let f = "print fmt: \"pages:%ld reason:%s (%d)\", REC->pages, __print_symbolic(REC->reason, \
                 { 0, \"flush on task switch\" }, { 1, \"remote shootdown\" }, { 2, \"local shootdown\" }, \
                 { 3, \"local mm shootdown\" }, { 4, \"remote ipi send\" }), REC->reason\n";
        assert_eq!(remote_ipi_reason(f), Some(4));
        assert_eq!(remote_ipi_reason("print fmt: \"pages:%ld\""), None);
    }

    #[test]
    fn latencies_fall_in_their_log2_bucket() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 1);
        assert_eq!((bucket(127), bucket(128), bucket(255), bucket(256)), (7, 8, 8, 9));
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(
            (bucket_label(8), bucket_label(11), bucket_label(21)),
            ("<256ns".into(), "<2us".into(), "<2ms".into())
        );
    }

    #[test]
    fn the_normal_table_is_centred_and_spread() {
        let pages = 6000;
        let t = normal_table(pages);
        assert_eq!(t.len(), NORMAL_TABLE);
        assert!(t.windows(2).all(|w| w[0] <= w[1]), "quantiles ascend");
        // Median at the middle; the quartiles of a normal at ±0.674σ, σ = 1000 pages.
        let q = |f: f64| t[(f * NORMAL_TABLE as f64) as usize] as f64;
        assert!((q(0.5) - 2999.5).abs() <= 2.0, "median {}", q(0.5));
        assert!((q(0.25) - (2999.5 - 674.5)).abs() <= 10.0, "first quartile {}", q(0.25));
        assert!((q(0.75) - (2999.5 + 674.5)).abs() <= 10.0, "third quartile {}", q(0.75));
        assert!(t[0] < 100 && *t.last().unwrap() as usize > pages - 100, "the ±3σ cut reaches the ends");
    }

    #[test]
    fn the_expected_content_follows_the_tallies() {
        let tallies = vec![vec![0, 5], vec![7, 0]];
        assert_eq!(expected(1, 0, &tallies), TAG ^ 1);
        assert_eq!(expected(1, 1, &tallies), 5);
        assert_eq!(expected(0, 2, &tallies), 7);
        assert_eq!(expected(0, FIRST_DATA, &tallies), pattern(0, FIRST_DATA));
        assert_ne!(pattern(0, FIRST_DATA), pattern(1, FIRST_DATA));
    }
}
