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

/// `ZONAL_NUMAB_REMOTE_PENALTY_NS`, 0 when unset.
fn remote_penalty() -> Result<Duration, String> {
    match std::env::var("ZONAL_NUMAB_REMOTE_PENALTY_NS") {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| n <= 1_000_000)
            .map(Duration::from_nanos)
            .ok_or_else(|| format!("ZONAL_NUMAB_REMOTE_PENALTY_NS=`{v}`: need ns from 0 to 1000000")),
        Err(_) => Ok(Duration::ZERO),
    }
}

/// TLB shootdowns received, summed over CPUs, from the text of `/proc/interrupts` (its `TLB:`
/// row; `None` without one, as on machines other than x86).
fn parse_tlb_row(text: &str) -> Option<u64> {
    let rest = text.lines().find_map(|l| l.trim_start().strip_prefix("TLB:"))?;
    let counts: Vec<u64> = rest.split_whitespace().map_while(|t| t.parse().ok()).collect();
    (!counts.is_empty()).then(|| counts.iter().sum())
}

fn tlb_shootdowns() -> Option<u64> {
    parse_tlb_row(&std::fs::read_to_string("/proc/interrupts").ok()?)
}

/// Flush counts at one instant (or their difference over a span): TLB shootdowns received
/// (`/proc/interrupts`) and remote flushes requested (the `tlb:tlb_flush` tracepoint with
/// reason `TLB_REMOTE_SEND_IPI`), both machine-wide, and of those requested the ones this
/// process's threads requested (`own`); each `None` where it cannot be read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Flushes {
    received: Option<u64>,
    requested: Option<u64>,
    own: Option<u64>,
}

impl Flushes {
    /// `self - earlier`, per count.
    fn since(self, earlier: Flushes) -> Flushes {
        let d = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| a.saturating_sub(b));
        Flushes {
            received: d(self.received, earlier.received),
            requested: d(self.requested, earlier.requested),
            own: d(self.own, earlier.own),
        }
    }

    /// `self + other`, per count.
    fn plus(self, other: Flushes) -> Flushes {
        let s = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| a + b);
        Flushes {
            received: s(self.received, other.received),
            requested: s(self.requested, other.requested),
            own: s(self.own, other.own),
        }
    }

    /// Nothing yet, every count readable as `zero` says.
    fn zero_like(f: Flushes) -> Flushes {
        Flushes { received: f.received.map(|_| 0), requested: f.requested.map(|_| 0), own: f.own.map(|_| 0) }
    }
}

/// Reads the flush counts.
struct FlushMeter {
    /// The tracepoint's counters, or why there are none.
    requests: Result<TracepointCounter, String>,
}

impl FlushMeter {
    fn new() -> FlushMeter {
        FlushMeter { requests: TracepointCounter::open() }
    }

    /// The meter of one run: the machine's counts, and the tracepoint counted on every thread
    /// the process has now (the run's workers, the balancer's threads and this one), so that
    /// the flushes of other processes on the machine can be told from this run's.
    fn for_run(&self) -> RunMeter<'_> {
        RunMeter { meter: self, own: self.requests.as_ref().ok().and_then(|t| t.on_threads().ok()) }
    }

    /// What the requested count is, or why it is n/a.
    fn note(&self) -> String {
        match &self.requests {
            Ok(t) => format!(
                "tlb:tlb_flush with reason TLB_REMOTE_SEND_IPI ({}) counted on every CPU with perf (req columns)",
                t.reason
            ),
            Err(why) => format!("tlb:tlb_flush (remote flushes requested): n/a, {why}"),
        }
    }
}

/// A [`FlushMeter`] with this run's threads' own requests.
struct RunMeter<'a> {
    meter: &'a FlushMeter,
    own: Option<TracepointCounter>,
}

impl RunMeter<'_> {
    fn read(&self) -> Flushes {
        Flushes {
            received: tlb_shootdowns(),
            requested: self.meter.requests.as_ref().ok().map(TracepointCounter::read),
            own: self.own.as_ref().map(TracepointCounter::read),
        }
    }
}

/// `tlb:tlb_flush` events with reason `TLB_REMOTE_SEND_IPI`, counted on every CPU by perf
/// counters on the tracepoint (system-wide, so root or `CAP_PERFMON`, and tracefs mounted
/// for the tracepoint's id), or on given threads of this process.
struct TracepointCounter {
    counters: Vec<std::fs::File>,
    reason: u32,
    id: u64,
}

/// The first 64 bytes of `struct perf_event_attr` (`PERF_ATTR_SIZE_VER0`): all a counting
/// tracepoint event needs; the kernel takes the rest as zero.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// `_IOW('$', 6, char *)`.
const PERF_EVENT_IOC_SET_FILTER: u64 = 0x4008_2406;

impl TracepointCounter {
    const TRACEFS: [&'static str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

    fn open() -> Result<TracepointCounter, String> {
        if !cfg!(target_arch = "x86_64") {
            return Err("the tracepoint is x86's".into());
        }
        let dir = Self::TRACEFS
            .iter()
            .map(|t| format!("{t}/events/tlb/tlb_flush"))
            .find(|d| std::path::Path::new(d).exists())
            .ok_or("tracefs is not mounted here (/sys/kernel/tracing; as root: mount -t tracefs nodev /sys/kernel/tracing)")?;
        let id: u64 = std::fs::read_to_string(format!("{dir}/id"))
            .map_err(|e| format!("cannot read {dir}/id: {e}"))?
            .trim()
            .parse()
            .map_err(|_| format!("{dir}/id is not a number"))?;
        let format = std::fs::read_to_string(format!("{dir}/format")).unwrap_or_default();
        let reason = remote_ipi_reason(&format).unwrap_or(4);
        let counters = (0..zonal::cpu::nr_cpus_online())
            .map(|cpu| Self::counter(id, reason, -1, cpu as i32))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TracepointCounter { counters, reason, id })
    }

    /// The same events requested by the threads this process has now, each counted on its
    /// thread (the tracepoint fires in the context of the thread that sends the flush).
    fn on_threads(&self) -> Result<TracepointCounter, String> {
        let tids: Vec<i32> = std::fs::read_dir("/proc/self/task")
            .map_err(|e| format!("/proc/self/task: {e}"))?
            .filter_map(|d| d.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        let counters =
            tids.iter().map(|&t| Self::counter(self.id, self.reason, t, -1)).collect::<Result<Vec<_>, _>>()?;
        Ok(TracepointCounter { counters, reason: self.reason, id: self.id })
    }

    /// One counter of the tracepoint filtered on `reason`: on `cpu` for every task (`pid`
    /// -1), or on thread `pid` wherever it runs (`cpu` -1).
    fn counter(id: u64, reason: u32, pid: i32, cpu: i32) -> Result<std::fs::File, String> {
        let filter = std::ffi::CString::new(format!("reason == {reason}")).expect("no NUL in the filter");
        let attr = PerfEventAttr {
            type_: PERF_TYPE_TRACEPOINT,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            config: id,
            sample_period: 1,
            ..Default::default()
        };
        // SAFETY: perf_event_open reads `size` bytes of a valid, initialised attr that
        // outlives the call; pid -1 with a CPU counts every task on that CPU, a thread id
        // with CPU -1 that thread on every CPU.
        let fd = unsafe {
            libc::syscall(libc::SYS_perf_event_open, &attr as *const PerfEventAttr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)
        };
        if fd < 0 {
            return Err(format!("perf_event_open on the tracepoint: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by perf_event_open and nothing else owns it.
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
        // SAFETY: the ioctl reads a NUL-terminated string that outlives the call, from a
        // perf event fd this function owns.
        let r = unsafe {
            libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&file), PERF_EVENT_IOC_SET_FILTER as _, filter.as_ptr())
        };
        if r != 0 {
            return Err(format!("setting the filter `reason == {reason}`: {}", std::io::Error::last_os_error()));
        }
        Ok(file)
    }

    /// Events so far, summed over CPUs.
    fn read(&self) -> u64 {
        use std::io::Read;
        self.counters
            .iter()
            .map(|mut f| {
                let mut b = [0u8; 8];
                f.read_exact(&mut b).map_or(0, |()| u64::from_ne_bytes(b))
            })
            .sum()
    }
}

/// The value of `TLB_REMOTE_SEND_IPI` in a `tlb_flush` format file, from its print format's
/// `{ 4, "remote ipi send" }`.
fn remote_ipi_reason(format: &str) -> Option<u32> {
    // Its case differs between kernels ("remote IPI send" on 6.18).
    let format = format.to_ascii_lowercase();
    let at = format.find("\"remote ipi send\"")?;
    let open = format[..at].rfind('{')?;
    format[open + 1..at].trim().trim_end_matches(',').trim().parse().ok()
}

/// The log2 bucket of a latency in ns: 0 for 0 ns, else b with 2^(b-1) <= ns < 2^b.
fn bucket(ns: u64) -> usize {
    ((64 - ns.leading_zeros()) as usize).min(BUCKETS - 1)
}

/// The label of bucket `b`: its upper bound.
fn bucket_label(b: usize) -> String {
    let ns = 1u64 << b;
    if ns >= 1_000_000 {
        format!("<{}ms", ns / 1_000_000)
    } else if ns >= 1000 {
        format!("<{}us", ns / 1000)
    } else {
        format!("<{ns}ns")
    }
}

/// pmbench's "normal" pattern: page indices in `NORMAL_TABLE` slots, slot i holding the page
/// where the cumulative weight of a normal distribution centred on the region's middle with
/// σ = pages / 6 (cut at ±3σ) first reaches (i + ½) / slots. Pages far in the tails, whose
/// weight is under a slot's, get a slot only now and then: 742 of the 8192 get none and are
/// never accessed (so never migrate either, in any variant).
fn normal_table(pages: usize) -> Vec<u32> {
    let mu = (pages as f64 - 1.0) / 2.0;
    let sigma = pages as f64 / 6.0;
    let w: Vec<f64> = (0..pages).map(|p| (-((p as f64 - mu) / sigma).powi(2) / 2.0).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut table = Vec::with_capacity(NORMAL_TABLE);
    let (mut page, mut cum) = (0usize, w[0] / total);
    for i in 0..NORMAL_TABLE {
        let want = (i as f64 + 0.5) / NORMAL_TABLE as f64;
        while cum < want && page + 1 < pages {
            page += 1;
            cum += w[page] / total;
        }
        table.push(page as u32);
    }
    table
}

/// The fixed content of word `w` of page `p`.
#[inline]
fn pattern(p: usize, w: usize) -> u64 {
    // splitmix64's finalizer: every word of every page differs.
    let mut x = ((p as u64) << 9 | w as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What page `p`'s word `w` must hold, given the increments each thread made to it.
fn expected(p: usize, w: usize, tallies: &[Vec<u64>]) -> u64 {
    match w {
        0 => TAG ^ p as u64,
        w if w < FIRST_DATA => tallies[w - 1][p],
        w => pattern(p, w),
    }
}

#[inline]
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A counter on its own cache line.
#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicU64);

/// What the main thread and the workers share.
struct Ctl {
    stop: AtomicBool,
    /// 0 before, 1 during, 2 after.
    phase: AtomicUsize,
    /// Accesses each worker has made so far.
    done: [Padded; THREADS],
}

/// What a worker brings back.
struct WorkerOut {
    /// Increments it made to each page's counter.
    tally: Vec<u64>,
    /// Sampled access latencies per phase.
    hist: [[u64; BUCKETS]; 3],
    /// Pattern words read with the wrong value.
    bad_reads: u64,
}

/// The pmbench-like loop of worker `t`: a normally distributed page, one read of a pattern
/// word (checked) and one atomic increment of the thread's counter word per access.
fn worker(
    t: usize,
    base: usize,
    region: &Region,
    table: &[u32],
    ctl: &Ctl,
    penalty: Duration,
    here: NodeId,
) -> WorkerOut {
    let mut out = WorkerOut { tally: vec![0; PAGES], hist: [[0; BUCKETS]; 3], bad_reads: 0 };
    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ ((t as u64 + 1) << 32);
    let mut n = 0u64;
    while !ctl.stop.load(Ordering::Relaxed) {
        let phase = ctl.phase.load(Ordering::Relaxed).min(2);
        // Small batches, so that a stop or a phase change is seen within 64 accesses even
        // with the largest remote penalty.
        for _ in 0..64 {
            let r = xorshift(&mut rng);
            let p = table[(r >> 48) as usize] as usize;
            let w = FIRST_DATA + (r as usize % (WORDS - FIRST_DATA));
            let page = base + p * PAGE;
            let t0 = (n % SAMPLE_EVERY == 0).then(Instant::now);
            if !penalty.is_zero() {
                let nid = region.page_to_nid(page as *const u8).ok().flatten();
                if nid.is_some_and(|nid| nid != here) {
                    let s = Instant::now();
                    while s.elapsed() < penalty {
                        std::hint::spin_loop();
                    }
                }
            }
            // SAFETY: `page` is a page of the region (p < PAGES), which lives until every
            // worker has returned; words are 8-byte aligned in a page-aligned page. An
            // inaccessible page faults and the balancer's handler maps it (or a new frame)
            // before the access runs again. Words are only accessed through atomics while
            // the workers run, so the two threads never race on plain memory.
            let (seen, counter) = unsafe {
                let seen = (*((page + w * 8) as *const AtomicU64)).load(Ordering::Relaxed);
                (seen, &*((page + (1 + t) * 8) as *const AtomicU64))
            };
            out.bad_reads += (seen != pattern(p, w)) as u64;
            counter.fetch_add(1, Ordering::Relaxed);
            out.tally[p] += 1;
            if let Some(t0) = t0 {
                out.hist[phase][bucket(t0.elapsed().as_nanos() as u64)] += 1;
            }
            n += 1;
        }
        ctl.done[t].0.store(n, Ordering::Relaxed);
    }
    out
}

/// One reading of the run's state, at the end of a window.
struct Sample {
    at: Duration,
    accesses: u64,
    stats: Stats,
    flushes: Flushes,
    /// Of those since the start, the ones while scan passes ran.
    scan_flushes: Flushes,
    vmas: usize,
}

/// The figures of one run.
#[derive(Clone, Debug)]
struct RunResult {
    /// Region pages per node after the first touch.
    placed: Vec<usize>,
    /// ... and at the end.
    placed_end: Vec<usize>,
    migrated: u64,
    /// Of which during the migration phase.
    migrated_during: u64,
    pgmigrate_fail: u64,
    /// Flushes during the migration phase outside scan passes ...
    flushes_during: Flushes,
    /// ... and inside them.
    scan_flushes_during: Flushes,
    /// Accesses/s before, during, after.
    rate: [f64; 3],
    /// Accesses/s over the whole run, the three phases together.
    rate_run: f64,
    /// The control: flushes outside scan passes before the eater's free, when no page can
    /// migrate (the machine's other flushes and the balancer's thread's), and the lengths of
    /// that phase and of the migration phase, s.
    control: Flushes,
    before_s: f64,
    during_s: f64,
    /// Time from the eater's free until 95% of the run's migrations were done.
    converge_ms: f64,
    /// ns per successful migration.
    cost_ns: f64,
    /// Mean time of a scan pass, ms.
    pass_ms: f64,
    /// Local share of hint faults per window from the eater's free (None: no fault in it).
    share_windows: Vec<Option<f64>>,
    share_after: Option<f64>,
    share_final_window: Option<f64>,
    peak_vmas: usize,
    collapse: Collapse,
    /// Every window of the run, for `--plot`'s figures over time.
    timeline: Vec<Window>,
    /// When the eater was freed, s from the start.
    eater_freed_s: f64,
    hist: [[u64; BUCKETS]; 3],
    corrupted_bytes: u64,
    bad_reads: u64,
    invariants: Result<usize, String>,
}

/// One window of a run: when it ended (s from the start), accesses/s in it, and in it the TLB
/// shootdowns received and remote flushes requested (machine-wide, scan passes included;
/// `None` where they cannot be read) and the pages migrated.
#[derive(Clone, Copy, Debug)]
struct Window {
    end_s: f64,
    accesses_per_s: f64,
    received: Option<u64>,
    requested: Option<u64>,
    migrated: u64,
}

/// The windows between consecutive samples.
fn windows(samples: &[Sample]) -> Vec<Window> {
    samples
        .windows(2)
        .map(|w| {
            let (x, y) = (&w[0], &w[1]);
            let f = y.flushes.since(x.flushes);
            Window {
                end_s: y.at.as_secs_f64(),
                accesses_per_s: (y.accesses - x.accesses) as f64 / (y.at - x.at).as_secs_f64().max(1e-9),
                received: f.received,
                requested: f.requested,
                migrated: y.stats.numa_pages_migrated - x.stats.numa_pages_migrated,
            }
        })
        .collect()
}

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

fn fmt_share(s: Option<f64>) -> String {
    s.map_or("-".into(), |s| format!("{:.0}%", s * 100.0))
}

/// `x` with `digits` decimals, `n/a` for NaN (a count that could not be read).
fn fmt_opt(x: f64, digits: usize) -> String {
    if x.is_nan() {
        "n/a".into()
    } else {
        format!("{x:.digits$}")
    }
}

fn fmt_rate(r: f64) -> String {
    format!("{:.1}M", r / 1e6)
}

/// Runs the experiment, prints its table and targets, and returns its records.
pub fn run(opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let phases = Phases::from_env()?;
    let penalty = remote_penalty()?;
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
    report(&setup, &variants, &results, &notes)
}

fn report(
    setup: &Setup,
    variants: &[Variant],
    results: &[Vec<RunResult>],
    notes: &[String],
) -> Result<Vec<Record>, String> {
    let Setup { opts, phases: ph, penalty, ref meter, .. } = *setup;
    let col = |i: usize, f: &dyn Fn(&RunResult) -> f64| results[i].iter().map(f).collect::<Vec<f64>>();
    let med = |i: usize, f: &dyn Fn(&RunResult) -> f64| Summary::of(&col(i, f)).median;
    let opt = |x: Option<f64>| x.unwrap_or(f64::NAN);
    let first = &results[0][0];
    println!(
        "numab (seed 004): 2 fake nodes of {NODE_SIZE}, both CPUs on node 1, an eater holding node 1 but {} MiB; a \
         {} MiB region under the local policy, first-touched from node 1 (pages on nodes 0 and 1 after it: {:?}); {THREADS} \
         pinned threads access it with pmbench's normal pattern (read + atomic add per access); the eater is freed \
         after {:.1} s, then {:.1} s of migration and {:.1} s after; a scan pass of {SCAN_SIZE_MB} MiB every {} ms; remote penalty {} ns; medians of {} repetitions, variants rotated. \
         Seed 004: TLB shootdowns -98%, throughput +5.5%",
        EATER_LEAVES >> 20,
        REGION_BYTES >> 20,
        first.placed,
        ph.before.as_secs_f64(),
        ph.during.as_secs_f64(),
        ph.after.as_secs_f64(),
        SCAN_PERIOD.as_millis(),
        penalty.as_nanos(),
        opts.reps,
    );
    let low: Vec<usize> = results.iter().flatten().map(|r| r.placed[0]).filter(|&n| n < PAGES / 2).collect();
    if !low.is_empty() {
        println!(
            "  note: in {} run(s) the first touch put under half the region on node 0 ({low:?} pages): the \
             experiment expects most of it there",
            low.len()
        );
    }
    for n in notes {
        println!("  note: {n}");
    }
    let mut rows = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        rows.push(vec![
            v.name(),
            format!("{:.0}", med(i, &|r| r.migrated as f64)),
            format!("{:.0}", med(i, &|r| r.pgmigrate_fail as f64)),
            format!(
                "{:.3} / {}",
                med(i, &|r| opt(r.per_page(false, false))),
                fmt_opt(med(i, &|r| opt(r.per_page(false, true))), 3)
            ),
            format!(
                "{:.2} / {}",
                med(i, &|r| opt(r.per_page(true, false))),
                fmt_opt(med(i, &|r| opt(r.per_page(true, true))), 2)
            ),
            format!(
                "{:.3} / {} / {}",
                med(i, &|r| opt(r.per_page_all(false))),
                fmt_opt(med(i, &|r| opt(r.per_page_all(true))), 3),
                fmt_opt(med(i, &|r| opt(r.own_per_page_all())), 3)
            ),
            fmt_rate(med(i, &|r| r.rate[0])),
            fmt_rate(med(i, &|r| r.rate[1])),
            fmt_rate(med(i, &|r| r.rate[2])),
            fmt_rate(med(i, &|r| r.rate_run)),
            format!("{:.1}", med(i, &|r| r.cost_ns) / 1e3),
            format!("{:.0}", med(i, &|r| r.converge_ms)),
            format!("{:.1}", med(i, &|r| r.pass_ms)),
            fmt_share(Some(med(i, &|r| opt(r.share_after)))),
            fmt_share(Some(med(i, &|r| opt(r.share_final_window)))),
            format!("{:.0}", med(i, &|r| r.peak_vmas as f64)),
            results[i].iter().map(|r| r.corrupted_bytes).sum::<u64>().to_string(),
        ]);
    }
    print_table(
        &[
            "variant",
            "migrated",
            "fail",
            "TLB/page recv / req",
            "scan TLB/page recv / req",
            "all TLB/page recv / req / own",
            "acc/s before",
            "during",
            "after",
            "run",
            "µs/migration",
            "conv ms",
            "ms/pass",
            "local after",
            "last 100ms",
            "peak VMAs",
            "bytes bad",
        ],
        &rows,
    );
    println!(
        "  migrated: numa_pages_migrated; fail: pgmigrate_fail, nearly all before the eater's free (node 1 below its \
         high watermark); TLB/page: TLB shootdowns received (recv: /proc/interrupts TLB:, summed over CPUs) and remote \
         flushes requested (req: tlb:tlb_flush), machine-wide, during the migration phase outside scan passes, per page \
         migrated in it; scan TLB/page: those while scan passes ran, per migrated page; all TLB/page: both, every \
         flush of the migration phase per page migrated in it (what seed 004 counts), and of those requested the ones \
         this process's threads requested (own: the tracepoint counted per thread); acc/s run: over the three phases; \
         µs/migration: numab_migrate_ns / pgmigrate_success; conv ms: from the \
         eater's free to 95% of the pages migrated; ms/pass: a scan pass's mean time; local: numa_hint_faults_local / numa_hint_faults after \
         convergence and in the last window; peak VMAs: Region::vma_runs at its highest; bytes bad: every byte of every \
         page checked after the run"
    );
    println!("  {}", meter.note());
    println!("  one collapse pass after convergence (numab_collapsed_pages), medians:");
    for (i, v) in variants.iter().enumerate() {
        let c = |f: &dyn Fn(&Collapse) -> f64| med(i, &|r| f(&r.collapse));
        println!(
            "    {:<20} VMA runs {:.0} -> {:.0}, {:.0} pages copied in {:.1} ms; accesses/s {} before it, {} after ({:.2}x)",
            v.name(),
            c(&|c| c.runs_before as f64),
            c(&|c| c.runs_after as f64),
            c(&|c| c.pages as f64),
            c(&|c| c.ms),
            fmt_rate(c(&|c| c.rate_before)),
            fmt_rate(c(&|c| c.rate_after)),
            c(&|c| c.rate_after / c.rate_before.max(1.0)),
        );
    }

    // Local share of hint faults per window from the eater's free, the first repetition.
    println!("  local share of hint faults per {} ms window from the eater's free (repetition 1):", WINDOW.as_millis());
    for (i, v) in variants.iter().enumerate() {
        let w: Vec<String> =
            results[i][0].share_windows.iter().map(|s| s.map_or("-".into(), |s| format!("{:.0}", s * 100.0))).collect();
        println!("    {:<20} {}", v.name(), w.join(" "));
    }
    // Latency histogram of sampled accesses during migration, all repetitions.
    let all: Vec<[u64; BUCKETS]> = (0..variants.len())
        .map(|i| {
            let mut h = [0u64; BUCKETS];
            for r in &results[i] {
                for (x, y) in h.iter_mut().zip(&r.hist[1]) {
                    *x += y;
                }
            }
            h
        })
        .collect();
    let lo = all.iter().filter_map(|h| h.iter().position(|&c| c > 0)).min().unwrap_or(0);
    let hi = all.iter().filter_map(|h| h.iter().rposition(|&c| c > 0)).max().unwrap_or(0).max(lo);
    println!("  access latency during migration, 1 in {SAMPLE_EVERY} accesses timed, % per log2 bucket:");
    let mut header = vec!["    variant".to_string()];
    header.extend((lo..=hi).map(bucket_label));
    let hrows: Vec<Vec<String>> = variants
        .iter()
        .zip(&all)
        .map(|(v, h)| {
            let n = h.iter().sum::<u64>().max(1) as f64;
            let mut row = vec![format!("    {}", v.name())];
            row.extend(h[lo..=hi].iter().map(|&c| {
                let pct = c as f64 * 100.0 / n;
                if c == 0 {
                    "0".into()
                } else if pct >= 1.0 {
                    format!("{pct:.1}")
                } else if pct >= 0.001 {
                    format!("{pct:.3}")
                } else {
                    "<0.001".into()
                }
            }));
            row
        })
        .collect();
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    print_table(&h, &hrows);

    // Targets, from this run's medians.
    let idx = |b: Backend, m: MigrateMode| variants.iter().position(|v| v.backend == b && v.mode == m);
    let mut lines = Vec::new();
    let mut controls = Vec::new();
    for (b, limit) in [(Backend::Userfaultfd, 0.05), (Backend::Mprotect, 0.60)] {
        let (Some(d), Some(e)) = (idx(b, MigrateMode::Delayed), idx(b, MigrateMode::Eager)) else {
            lines.push(format!("{} delayed against eager: not measured (backend unavailable)", backend_name(b)));
            continue;
        };
        let tlb = |i, req| Summary::of(&col(i, &|r: &RunResult| opt(r.per_page(false, req)))).median;
        let (td, te) = (tlb(d, false), tlb(e, false));
        let r = td / te;
        let req = match (tlb(d, true), tlb(e, true)) {
            (x, y) if x.is_nan() || y.is_nan() => String::new(),
            (x, y) => format!(" (requested: {x:.3} against {y:.3}, {:.1}%)", x / y * 100.0),
        };
        lines.push(format!(
            "{} delayed TLB shootdowns received per migrated page {td:.3} against eager's {te:.3}: {:.1}%{req} \
             (≤ {:.0}%: {})",
            backend_name(b),
            r * 100.0,
            limit * 100.0,
            verdict(r <= limit)
        ));
        let r = paired_ratio(&col(d, &|r| r.rate[1]), &col(e, &|r| r.rate[1]));
        lines.push(format!(
            "{} delayed accesses/s during migration against eager's: {:.3} (≥ 1: {})",
            backend_name(b),
            r,
            verdict(r >= 1.0)
        ));
        let r = paired_ratio(&col(d, &|r| r.cost_ns), &col(e, &|r| r.cost_ns));
        lines.push(format!(
            "{} delayed migration cost per page against eager's: {:.1}% (≤ 30%: {})",
            backend_name(b),
            r * 100.0,
            verdict(r <= 0.30)
        ));
        // Seed 004's count: every shootdown of the migration phase, the scanner's included.
        let all = |i, req| Summary::of(&col(i, &|r: &RunResult| opt(r.per_page_all(req)))).median;
        let (ad, ae) = (all(d, false), all(e, false));
        let own = |i| Summary::of(&col(i, &|r: &RunResult| opt(r.own_per_page_all()))).median;
        let req = match (all(d, true), all(e, true), own(d), own(e)) {
            (x, y, ..) if x.is_nan() || y.is_nan() => String::new(),
            (x, y, o, p) if o.is_nan() || p.is_nan() => {
                format!(" (requested: {x:.3} against {y:.3}, {:.1}%)", x / y * 100.0)
            }
            (x, y, o, p) => format!(
                " (requested: {x:.3} against {y:.3}, {:.1}%; by this process: {o:.3} against {p:.3}, {:.1}%)",
                x / y * 100.0,
                o / p * 100.0
            ),
        };
        lines.push(format!(
            "{} every TLB shootdown of the migration phase (scan passes included) per migrated page, delayed \
             {ad:.3} against eager's {ae:.3}: {:.1}%{req} (≤ 5%: {})",
            backend_name(b),
            ad / ae * 100.0,
            verdict(ad / ae <= 0.05)
        ));
        lines.push(format!(
            "{} delayed, every TLB shootdown of the migration phase per migrated page: {ad:.3} (≤ 0.2: {})",
            backend_name(b),
            verdict(ad <= 0.2)
        ));
        let r = paired_ratio(&col(d, &|r| r.rate_run), &col(e, &|r| r.rate_run));
        let same = paired_ratio(&col(d, &|r| r.rate[0]), &col(e, &|r| r.rate[0]));
        lines.push(format!(
            "{} delayed accesses/s over the whole run against eager's: {r:.3} (≥ 1: {}; control: {same:.3} before \
             the eater's free, where both run the same code)",
            backend_name(b),
            verdict(r >= 1.0)
        ));
        // The control for the shootdown targets: what the machine and the balancer's thread
        // flush when nothing migrates, at the same rate over the migration phase.
        let ctl = |i, req| Summary::of(&col(i, &|r: &RunResult| opt(r.control_per_page(req)))).median;
        let req = match (ctl(d, true), ctl(e, true)) {
            (x, y) if x.is_nan() || y.is_nan() => String::new(),
            (x, y) => format!(" (requested: {x:.3} and {y:.3})"),
        };
        controls.push(format!(
            "{}: outside scan passes before the eater's free (no page can migrate), at the migration phase's \
             length, per page migrated in it: delayed runs {:.3}, eager runs {:.3}{req}; delayed's total less its \
             control, against eager's less its: {:.1}%",
            backend_name(b),
            ctl(d, false),
            ctl(e, false),
            (ad - ctl(d, false)).max(0.0) / (ae - ctl(e, false)).max(1e-9) * 100.0
        ));
        let others = |i| Summary::of(&col(i, &|r: &RunResult| opt(r.others_share()))).median;
        if !others(d).is_nan() {
            controls.push(format!(
                "{}: of the flushes requested on the machine during the migration phase, other processes' (not \
                 this run's threads'): delayed runs {:.0}%, eager runs {:.0}%",
                backend_name(b),
                others(d) * 100.0,
                others(e) * 100.0
            ));
        }
    }
    let migrated: Vec<f64> = (0..variants.len()).map(|i| med(i, &|r| r.migrated as f64)).collect();
    let (lo_m, hi_m) = migrated.iter().fold((f64::INFINITY, 0.0f64), |(a, b), &m| (a.min(m), b.max(m)));
    lines.push(format!(
        "pages migrated across variants: {:.0} to {:.0}, spread {:.1}% (≤ 10%: {})",
        lo_m,
        hi_m,
        (hi_m / lo_m.max(1.0) - 1.0) * 100.0,
        verdict(hi_m <= lo_m * 1.10 && lo_m > 0.0)
    ));
    let shares: Vec<f64> = (0..variants.len()).map(|i| med(i, &|r| opt(r.share_after))).collect();
    let worst = shares.iter().copied().fold(f64::INFINITY, f64::min);
    lines.push(format!(
        "local share of hint faults after convergence, worst variant: {} (≥ 90%: {})",
        fmt_share(Some(worst)),
        verdict(worst >= 0.90)
    ));
    let bad: u64 = results.iter().flatten().map(|r| r.corrupted_bytes).sum();
    let bad_reads: u64 = results.iter().flatten().map(|r| r.bad_reads).sum();
    lines.push(format!(
        "bytes corrupted over every page of every run: {bad} (pattern reads that saw a wrong value: {bad_reads}) \
         (0: {})",
        verdict(bad == 0 && bad_reads == 0)
    ));
    let inv: Vec<String> = results
        .iter()
        .flatten()
        .filter_map(|r| match &r.invariants {
            Ok(0) => None,
            Ok(n) => Some(format!("{n} frames left allocated")),
            Err(e) => Some(e.clone()),
        })
        .collect();
    lines.push(format!(
        "check_invariants after the region, the eater and the balancer are gone: {} (Ok(0): {})",
        if inv.is_empty() { "Ok(0) in every run".to_string() } else { inv.join("; ") },
        verdict(inv.is_empty())
    ));
    for l in lines {
        println!("  target: {l}");
    }
    for c in controls {
        println!("  control, {c}");
    }
    let max_map = std::fs::read_to_string("/proc/sys/vm/max_map_count").ok().and_then(|s| s.trim().parse::<u64>().ok());
    let peak = results.iter().flatten().map(|r| r.peak_vmas).max().unwrap_or(0);
    println!(
        "  VMAs: the region needed at most {peak} for its {PAGES} pages in any run (vm.max_map_count {})",
        max_map.map_or("unknown".into(), |m| m.to_string())
    );
    println!();

    let mut records = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        let reference = Variant { backend: v.backend, mode: MigrateMode::Eager };
        let r = idx(v.backend, MigrateMode::Eager).unwrap_or(i);
        let cost = col(i, &|r| r.cost_ns);
        records.push(Record {
            experiment: "numab".into(),
            subject: v.name(),
            params: json!({
                "measure": "ns per migrated page (numab_migrate_ns / pgmigrate_success)",
                "region_pages": PAGES,
                "node_size": NODE_SIZE,
                "phases_s": [ph.before.as_secs_f64(), ph.during.as_secs_f64(), ph.after.as_secs_f64()],
                "remote_penalty_ns": penalty.as_nanos() as u64,
                "pages_migrated": Summary::of(&col(i, &|r| r.migrated as f64)),
                "pgmigrate_fail": Summary::of(&col(i, &|r| r.pgmigrate_fail as f64)),
                "tlb_shootdowns_received_per_migrated_page_outside_scans":
                    Summary::of(&col(i, &|r| opt(r.per_page(false, false)))),
                "tlb_shootdowns_received_per_migrated_page_in_scans":
                    Summary::of(&col(i, &|r| opt(r.per_page(true, false)))),
                "remote_flushes_requested_per_migrated_page_outside_scans":
                    Summary::of(&col(i, &|r| opt(r.per_page(false, true)))),
                "remote_flushes_requested_per_migrated_page_in_scans":
                    Summary::of(&col(i, &|r| opt(r.per_page(true, true)))),
                "tlb_shootdowns_received_per_migrated_page_all":
                    Summary::of(&col(i, &|r| opt(r.per_page_all(false)))),
                "remote_flushes_requested_per_migrated_page_all":
                    Summary::of(&col(i, &|r| opt(r.per_page_all(true)))),
                "remote_flushes_requested_by_this_process_per_migrated_page_all":
                    Summary::of(&col(i, &|r| opt(r.own_per_page_all()))),
                "share_of_requested_flushes_from_other_processes":
                    Summary::of(&col(i, &|r| opt(r.others_share()))),
                "control_tlb_shootdowns_received_per_migrated_page":
                    Summary::of(&col(i, &|r| opt(r.control_per_page(false)))),
                "control_remote_flushes_requested_per_migrated_page":
                    Summary::of(&col(i, &|r| opt(r.control_per_page(true)))),
                "accesses_per_s": {
                    "before": Summary::of(&col(i, &|r| r.rate[0])),
                    "during": Summary::of(&col(i, &|r| r.rate[1])),
                    "after": Summary::of(&col(i, &|r| r.rate[2])),
                    "run": Summary::of(&col(i, &|r| r.rate_run)),
                },
                "converge_ms": Summary::of(&col(i, &|r| r.converge_ms)),
                "scan_pass_ms": Summary::of(&col(i, &|r| r.pass_ms)),
                "local_share_after": Summary::of(&col(i, &|r| opt(r.share_after))),
                "local_share_final_window": Summary::of(&col(i, &|r| opt(r.share_final_window))),
                "peak_vma_runs": Summary::of(&col(i, &|r| r.peak_vmas as f64)),
                "collapse": {
                    "vma_runs_before": Summary::of(&col(i, &|r| r.collapse.runs_before as f64)),
                    "vma_runs_after": Summary::of(&col(i, &|r| r.collapse.runs_after as f64)),
                    "pages_copied": Summary::of(&col(i, &|r| r.collapse.pages as f64)),
                    "ms": Summary::of(&col(i, &|r| r.collapse.ms)),
                    "accesses_per_s_before": Summary::of(&col(i, &|r| r.collapse.rate_before)),
                    "accesses_per_s_after": Summary::of(&col(i, &|r| r.collapse.rate_after)),
                },
                "placed_per_node": results[i].iter().map(|r| r.placed.clone()).collect::<Vec<_>>(),
                "placed_per_node_end": results[i].iter().map(|r| r.placed_end.clone()).collect::<Vec<_>>(),
                "latency_log2_ns": PHASES.iter().enumerate().map(|(p, name)| {
                    let mut h = [0u64; BUCKETS];
                    for r in &results[i] {
                        for (x, y) in h.iter_mut().zip(&r.hist[p]) {
                            *x += y;
                        }
                    }
                    (name.to_string(), json!(h.to_vec()))
                }).collect::<serde_json::Map<_, _>>(),
                "corrupted_bytes": results[i].iter().map(|r| r.corrupted_bytes).sum::<u64>(),
                // Per run, every window from the start (what `--plot` draws over time).
                "timeline": {
                    "window_ms": WINDOW.as_millis() as u64,
                    "runs": results[i].iter().map(|r| json!({
                        "eater_freed_s": r.eater_freed_s,
                        "end_s": r.timeline.iter().map(|w| w.end_s).collect::<Vec<_>>(),
                        "accesses_per_s": r.timeline.iter().map(|w| w.accesses_per_s).collect::<Vec<_>>(),
                        "tlb_shootdowns_received": r.timeline.iter().map(|w| w.received).collect::<Vec<_>>(),
                        "remote_flushes_requested": r.timeline.iter().map(|w| w.requested).collect::<Vec<_>>(),
                        "pages_migrated": r.timeline.iter().map(|w| w.migrated).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                },
            }),
            ns_per_op: Summary::of(&cost),
            reference: reference.name(),
            ratio_to_reference: paired_ratio(&cost, &col(r, &|r| r.cost_ns)),
            reps: results[i].len(),
            samples: cost.clone(),
        });
    }
    Ok(records)
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
