//! The counters: zone counters (`zone_stat_item`) kept as per-CPU diffs folded past a
//! threshold, event counters (`vm_event_item`) and NUMA counters (`numa_stat_item`), each
//! CPU's on cache lines of its own, apart from the per-CPU page lists.
//!
//! Kernel counterpart: mm/vmstat.c (`__mod_zone_page_state`, `calculate_normal_threshold`,
//! `calculate_pressure_threshold`, `refresh_zone_stat_thresholds`, `zone_page_state_snapshot`,
//! `count_vm_events`, `all_vm_events`) and, for the layout, seed 002's split of
//! `per_cpu_pages` from `per_cpu_zonestat`.
//!
//! Zone counters: each change goes to the changing CPU's `s8` diff for the zone; once the
//! diff passes the zone's `stat_threshold` it is added to the zone's and the global atomic
//! counters and restarts (with Linux's overstep for single steps). Every diff of an item is
//! written under one lock (the zone lock for the free counts, the lists' lock for the pages
//! on per-CPU lists), so diffs need no atomic read-modify-write and the periodic fold can take
//! them under that lock. A folded counter is behind the truth by at most
//! `nr_cpus * stat_threshold`; a snapshot adds every diff and is exact once changes stop.
//!
//! Event counters: an update is a relaxed load and store on the CPU's own line, like the
//! kernel's `raw_cpu_add`, without a locked instruction. Two threads that run on the same CPU
//! at once (one preempted mid-update) can lose one of their updates; a single thread, or
//! threads on different CPUs, lose nothing. Readers sum every CPU's slots, so a read is exact
//! once updates stop, up to those rare lost updates.

use crate::sync::{AtomicI8, AtomicIsize, AtomicU64, AtomicU8, Ordering};
use crate::types::{Order, MAX_ORDER_LIMIT};
use std::sync::atomic::AtomicU16;

/// The zone counters (`enum zone_stat_item`) that mean something in zonal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZoneStatItem {
    /// Frames in the buddy lists (`NR_FREE_PAGES`). Changed under the zone lock.
    NrFreePages,
    /// Frames on per-CPU lists, their rseq caches included. Changed under each list's lock
    /// (the caches' lock-free churn is settled at the next lock of their lists).
    NrPcpPages,
    /// Free blocks of one order in the buddy lists (`free_area[order].nr_free`, what
    /// `/proc/buddyinfo` prints). Changed under the zone lock.
    NrFreeOrder(Order),
}

/// Number of zone counters: the two page counts and one per order up to the largest
/// `max_order` zonal accepts.
pub const NR_ZONE_STAT_ITEMS: usize = 2 + MAX_ORDER_LIMIT as usize + 1;

impl ZoneStatItem {
    /// Index in the counter arrays.
    #[inline]
    pub const fn index(self) -> usize {
        match self {
            ZoneStatItem::NrFreePages => 0,
            ZoneStatItem::NrPcpPages => 1,
            ZoneStatItem::NrFreeOrder(o) => 2 + o.0 as usize,
        }
    }

    /// The item at an index (the inverse of [`ZoneStatItem::index`]).
    pub fn from_index(i: usize) -> Option<ZoneStatItem> {
        match i {
            0 => Some(ZoneStatItem::NrFreePages),
            1 => Some(ZoneStatItem::NrPcpPages),
            i if i < NR_ZONE_STAT_ITEMS => Some(ZoneStatItem::NrFreeOrder(Order((i - 2) as u8))),
            _ => None,
        }
    }

    /// Every item of a zone with blocks up to `max_order`, in report order.
    pub fn all(max_order: Order) -> impl Iterator<Item = ZoneStatItem> {
        (0..2 + max_order.0 as usize + 1).filter_map(ZoneStatItem::from_index)
    }

    /// The name in `/proc/zoneinfo` and `/proc/vmstat` style.
    pub fn name(self) -> String {
        match self {
            ZoneStatItem::NrFreePages => "nr_free_pages".into(),
            ZoneStatItem::NrPcpPages => "nr_zone_pcp_pages".into(),
            ZoneStatItem::NrFreeOrder(o) => format!("nr_free_order_{}", o.0),
        }
    }
}

/// The name of the derived item `managed - free - pcp`: frames handed out.
pub const NR_ALLOCATED_NAME: &str = "nr_zone_allocated";

/// Linux's largest `stat_threshold`: a diff is an `s8`, and after an update its size is at
/// most the threshold.
pub const MAX_STAT_THRESHOLD: usize = 125;

/// `fls`: the 1-based index of the highest set bit, 0 for 0.
fn fls(x: usize) -> usize {
    (usize::BITS - x.leading_zeros()) as usize
}

/// `calculate_normal_threshold`: `2 * fls(cpus) * (1 + fls(managed in 128 MiB units))`,
/// at most 125. More CPUs and more memory tolerate more drift.
pub fn normal_threshold(nr_cpus: usize, managed_pages: usize) -> usize {
    let mem = managed_pages >> (27 - crate::types::PAGE_SHIFT);
    (2 * fls(nr_cpus) * (1 + fls(mem))).min(MAX_STAT_THRESHOLD)
}

/// `calculate_pressure_threshold`: the gap between the low and min watermarks shared out
/// among the CPUs, at least 1, at most 125, so that the drift cannot take the zone from
/// above `low` to below `min` unseen.
pub fn pressure_threshold(nr_cpus: usize, low: usize, min: usize) -> usize {
    (low.saturating_sub(min) / nr_cpus.max(1)).clamp(1, MAX_STAT_THRESHOLD)
}

/// `percpu_drift_mark`: when `nr_cpus * threshold` could exceed the gap between `low` and
/// `min`, free counts below `high + nr_cpus * threshold` are read as snapshots by the
/// watermark checks; 0 when the drift is always tolerable.
pub fn percpu_drift_mark(nr_cpus: usize, threshold: usize, min: usize, low: usize, high: usize) -> usize {
    let max_drift = nr_cpus * threshold;
    if max_drift > low.saturating_sub(min) {
        high + max_drift
    } else {
        0
    }
}

/// Zone counters folded from the per-CPU diffs: one zone's (`zone->vm_stat`) or the whole
/// allocator's (`vm_zone_stat`). Written only by folds; may dip below zero while other
/// CPUs' diffs hold the difference (readers clamp at 0, as Linux's do).
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct ZoneCounters {
    v: [AtomicIsize; NR_ZONE_STAT_ITEMS],
}

impl ZoneCounters {
    /// The folded value, clamped at 0 (`zone_page_state`, `global_zone_page_state`).
    #[inline]
    pub fn get(&self, item: ZoneStatItem) -> usize {
        self.raw(item).max(0) as usize
    }

    /// The folded value as kept.
    #[inline]
    pub fn raw(&self, item: ZoneStatItem) -> isize {
        self.v[item.index()].load(Ordering::Relaxed)
    }

    /// Adds a folded diff.
    #[inline]
    pub fn add(&self, item: ZoneStatItem, v: isize) {
        self.v[item.index()].fetch_add(v, Ordering::Relaxed);
    }
}

/// One CPU's zone-counter diffs for one zone and the zone's threshold as this CPU applies
/// it (`struct per_cpu_zonestat`'s `vm_stat_diff` and `stat_threshold`), on lines of its own.
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct PerCpuZoneDiffs {
    diff: [AtomicI8; NR_ZONE_STAT_ITEMS],
    stat_threshold: AtomicU8,
}

const _: () = assert!(std::mem::size_of::<PerCpuZoneDiffs>() % 128 == 0);

impl PerCpuZoneDiffs {
    /// The threshold this CPU folds at.
    #[inline]
    pub fn threshold(&self) -> usize {
        self.stat_threshold.load(Ordering::Relaxed) as usize
    }

    /// Sets the threshold (at most 125).
    pub fn set_threshold(&self, t: usize) {
        self.stat_threshold.store(t.min(MAX_STAT_THRESHOLD) as u8, Ordering::Relaxed);
    }

    /// The unfolded part of an item.
    #[inline]
    pub fn diff(&self, item: ZoneStatItem) -> isize {
        self.diff[item.index()].load(Ordering::Relaxed) as isize
    }

    /// `__mod_zone_page_state`: adds `delta` to the diff; past the threshold the diff (with
    /// Linux's overstep of half the threshold for single steps, so a counter moving one way
    /// folds half as often) goes to `fold` and the diff restarts. The caller holds the lock
    /// that guards this item's diffs.
    #[inline]
    pub fn add(&self, item: ZoneStatItem, delta: isize, fold: impl FnOnce(isize)) {
        let d = &self.diff[item.index()];
        let t = self.threshold() as isize;
        let mut x = d.load(Ordering::Relaxed) as isize + delta;
        if x.abs() > t {
            let overstep = match delta {
                1 => t / 2,
                -1 => -(t / 2),
                _ => 0,
            };
            fold(x + overstep);
            x = -overstep;
        }
        d.store(x as i8, Ordering::Relaxed);
    }

    /// Takes the diff of an item, leaving 0 (the periodic fold; the caller holds the lock
    /// that guards this item's diffs).
    #[inline]
    pub fn take(&self, item: ZoneStatItem) -> isize {
        let d = &self.diff[item.index()];
        let x = d.load(Ordering::Relaxed) as isize;
        if x != 0 {
            d.store(0, Ordering::Relaxed);
        }
        x
    }
}

/// The event counters, in report order, with their stable names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum VmEvent {
    /// Frames allocated from a `Normal` zone (`pgalloc_normal`).
    PgallocNormal,
    /// Frames freed (`pgfree`).
    Pgfree,
    /// Refills of a per-CPU list from the buddy lists.
    PcpRefill,
    /// Drains of per-CPU lists to the buddy lists (on `high`, on demand, on decay).
    PcpDrain,
    /// Calls of the bulk allocator.
    AllocBulk,
    /// Allocations that failed for lack of memory.
    AllocFail,
    /// Allocations that found their per-CPU list busy and took the buddy path.
    PcpTrylockFail,
    /// `membarrier` calls a pcp lock holder made to restart another CPU's rseq sections
    /// (zonal's own: the cost of touching a remote cache, one IPI each).
    PcpFence,
    /// Zones a zonelist walk skipped because the zonelist cache had them full.
    ZlcSkipped,
    /// Zones the zonelist cache marked full.
    ZlcFullMarks,
    /// Zaps of a zonelist cache's bitmap.
    ZlcZaps,
}

/// Number of [`VmEvent`]s.
pub const NR_VM_EVENTS: usize = 11;

impl VmEvent {
    /// Every event, in report order.
    pub const ALL: [VmEvent; NR_VM_EVENTS] = [
        VmEvent::PgallocNormal,
        VmEvent::Pgfree,
        VmEvent::PcpRefill,
        VmEvent::PcpDrain,
        VmEvent::AllocBulk,
        VmEvent::AllocFail,
        VmEvent::PcpTrylockFail,
        VmEvent::PcpFence,
        VmEvent::ZlcSkipped,
        VmEvent::ZlcFullMarks,
        VmEvent::ZlcZaps,
    ];

    /// The counter's name in `/proc/vmstat` style.
    pub fn name(self) -> &'static str {
        match self {
            VmEvent::PgallocNormal => "pgalloc_normal",
            VmEvent::Pgfree => "pgfree",
            VmEvent::PcpRefill => "pcp_refill",
            VmEvent::PcpDrain => "pcp_drain",
            VmEvent::AllocBulk => "alloc_bulk",
            VmEvent::AllocFail => "alloc_fail",
            VmEvent::PcpTrylockFail => "pcp_trylock_fail",
            VmEvent::PcpFence => "pcp_fence",
            VmEvent::ZlcSkipped => "zlc_zones_skipped",
            VmEvent::ZlcFullMarks => "zlc_full_marks",
            VmEvent::ZlcZaps => "zlc_zaps",
        }
    }
}

/// One CPU's event counters, on lines of their own.
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct PerCpuEvents {
    events: [AtomicU64; NR_VM_EVENTS],
    /// Frames the order-0 fast paths took from this CPU's local zone: part of
    /// `pgalloc_normal`, and the NUMA hits and locals of those allocations.
    local_first: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<PerCpuEvents>() % 128 == 0);

impl PerCpuEvents {
    /// Adds `n` to an event (`__count_vm_events`).
    #[inline]
    pub fn add(&self, ev: VmEvent, n: u64) {
        let c = &self.events[ev as usize];
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// This CPU's count of an event.
    #[inline]
    pub fn get(&self, ev: VmEvent) -> u64 {
        let v = self.events[ev as usize].load(Ordering::Relaxed);
        match ev {
            VmEvent::PgallocNormal => v.wrapping_add(self.local_first()),
            _ => v,
        }
    }

    /// Adds `n` frames taken by the fast paths from this CPU's local zone.
    #[inline]
    pub fn add_local_first(&self, n: u64) {
        let c = &self.local_first;
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Frames taken by the fast paths from this CPU's local zone so far.
    #[inline]
    pub fn local_first(&self) -> u64 {
        self.local_first.load(Ordering::Relaxed)
    }
}

/// Sums an event over CPUs (`all_vm_events`).
pub fn sum_events(cpus: &[PerCpuEvents], ev: VmEvent) -> u64 {
    cpus.iter().map(|c| c.get(ev)).fold(0, u64::wrapping_add)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_counts_sum_on_read() {
        let cpus: Vec<PerCpuEvents> = (0..3).map(|_| PerCpuEvents::default()).collect();
        cpus[0].add(VmEvent::Pgfree, 3);
        cpus[2].add(VmEvent::Pgfree, 4);
        cpus[1].add(VmEvent::AllocBulk, 1);
        assert_eq!(sum_events(&cpus, VmEvent::Pgfree), 7);
        assert_eq!(sum_events(&cpus, VmEvent::AllocBulk), 1);
        assert_eq!(VmEvent::ALL.len(), NR_VM_EVENTS);
        for (i, e) in VmEvent::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i);
        }
    }
}

/// The NUMA counters (`enum numa_stat_item`), kept apart from the zone counters (seed 000).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum NumaStat {
    /// Allocated on the preferred zone's node.
    NumaHit,
    /// Allocated here although another node was preferred.
    NumaMiss,
    /// Preferred here but allocated on another node (charged to the preferred zone).
    NumaForeign,
    /// The interleave policy got the node it asked for.
    NumaInterleaveHit,
    /// Allocated on the allocating CPU's node.
    NumaLocal,
    /// Allocated on another node than the allocating CPU's.
    NumaOther,
}

/// Number of [`NumaStat`]s.
pub const NR_NUMA_STATS: usize = 6;

impl NumaStat {
    /// Every counter, in the kernel's order.
    pub const ALL: [NumaStat; NR_NUMA_STATS] = [
        NumaStat::NumaHit,
        NumaStat::NumaMiss,
        NumaStat::NumaForeign,
        NumaStat::NumaInterleaveHit,
        NumaStat::NumaLocal,
        NumaStat::NumaOther,
    ];

    /// The name in `/proc/zoneinfo` and `/proc/vmstat`.
    pub fn name(self) -> &'static str {
        match self {
            NumaStat::NumaHit => "numa_hit",
            NumaStat::NumaMiss => "numa_miss",
            NumaStat::NumaForeign => "numa_foreign",
            NumaStat::NumaInterleaveHit => "numa_interleave",
            NumaStat::NumaLocal => "numa_local",
            NumaStat::NumaOther => "numa_other",
        }
    }

    /// The name in `/sys/devices/system/node/nodeN/numastat`.
    pub fn numastat_name(self) -> &'static str {
        match self {
            NumaStat::NumaHit => "numa_hit",
            NumaStat::NumaMiss => "numa_miss",
            NumaStat::NumaForeign => "numa_foreign",
            NumaStat::NumaInterleaveHit => "interleave_hit",
            NumaStat::NumaLocal => "local_node",
            NumaStat::NumaOther => "other_node",
        }
    }
}

/// One CPU's NUMA counters for one zone, on lines of their own, apart from the per-CPU lists
/// (seed 002: `per_cpu_zonestat`). Updated as event counters: a relaxed load and store by
/// the CPU's own threads, never written by another CPU except to zero them; summed on read.
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct PerCpuZoneStat {
    numa: [AtomicU64; NR_NUMA_STATS],
    /// Seed 000's way: per-CPU u16 diffs folded into the zone's shared counters past
    /// `numa_stat_threshold` (`vm_numa_stat_diff`).
    diff: [AtomicU16; NR_NUMA_STATS],
}

const _: () = assert!(std::mem::size_of::<PerCpuZoneStat>() % 128 == 0);

impl PerCpuZoneStat {
    /// Adds `n` to a counter (`__count_numa_events`).
    #[inline]
    pub fn add(&self, s: NumaStat, n: u64) {
        let c = &self.numa[s as usize];
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// This CPU's count: its event counter plus its unfolded diff.
    #[inline]
    pub fn get(&self, s: NumaStat) -> u64 {
        self.numa[s as usize].load(Ordering::Relaxed).wrapping_add(self.diff[s as usize].load(Ordering::Relaxed) as u64)
    }

    /// Adds `n` to this CPU's diff; past `threshold` the diff goes to `shared` and restarts
    /// from 0 (`__inc_numa_state`: `v = ++diff; if v > threshold { fold v; diff = 0 }`).
    #[inline]
    pub fn add_diff(&self, s: NumaStat, n: u64, threshold: u16, shared: &ZoneNumaShared) {
        let d = &self.diff[s as usize];
        let v = d.load(Ordering::Relaxed) as u64 + n;
        if v > threshold as u64 {
            shared.add(s, v);
            d.store(0, Ordering::Relaxed);
        } else {
            d.store(v as u16, Ordering::Relaxed);
        }
    }

    /// Zeroes every counter and diff (coarse mode).
    pub fn zero(&self) {
        for c in &self.numa {
            c.store(0, Ordering::Relaxed);
        }
        for d in &self.diff {
            d.store(0, Ordering::Relaxed);
        }
    }
}

/// A zone's shared NUMA counters (`zone->vm_numa_stat`), which seed 000's per-CPU diffs fold
/// into: the line every CPU that allocates from the zone writes, once per `threshold` events.
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct ZoneNumaShared {
    counters: [AtomicU64; NR_NUMA_STATS],
}

impl ZoneNumaShared {
    /// Adds `n` events (the `shared` strategy, and seed 000's folds).
    #[inline]
    pub fn add(&self, s: NumaStat, n: u64) {
        self.counters[s as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// The folded count.
    pub fn get(&self, s: NumaStat) -> u64 {
        self.counters[s as usize].load(Ordering::Relaxed)
    }

    /// Zeroes the counters.
    pub fn zero(&self) {
        for c in &self.counters {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// Seed 000's default and largest `numa_stat_threshold` (`NUMA_STATS_THRESHOLD`, U16_MAX - 2:
/// the diff is a u16 and must hold `threshold + 1`).
pub const NUMA_STATS_THRESHOLD: u16 = u16::MAX - 2;

/// How NUMA events are counted (all kept so the seeds' experiments can be rerun).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaStrategy {
    /// Seed 002: per-CPU event counters never written by another CPU, summed on read. An
    /// allocation on the order-0 fast path (always a local hit) costs nothing more: its one
    /// per-CPU `pgalloc` count is its `numa_hit` and `numa_local`.
    PerCpu,
    /// Seed 000: per-CPU u16 diffs folded into shared per-zone counters past a threshold.
    Threshold,
    /// Before seed 000: every event an atomic add on the zone's shared counter, exact at
    /// every instant and written by every allocating CPU.
    Shared,
}

impl NumaStrategy {
    /// Every strategy, in the sysctl table's order.
    pub const ALL: [NumaStrategy; 3] = [NumaStrategy::PerCpu, NumaStrategy::Threshold, NumaStrategy::Shared];

    /// The strategy's name in the sysctl table.
    pub fn name(self) -> &'static str {
        match self {
            NumaStrategy::PerCpu => "percpu",
            NumaStrategy::Threshold => "threshold",
            NumaStrategy::Shared => "shared",
        }
    }
}

/// `numa_stats_mode` (seed 001).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaStatsMode {
    /// Not updated until someone reads the NUMA counters, then updated (the default).
    Auto,
    /// Always updated.
    Strict,
    /// Not updated, and zeroed.
    Coarse,
}

impl NumaStatsMode {
    /// The mode's name.
    pub fn name(self) -> &'static str {
        match self {
            NumaStatsMode::Auto => "auto",
            NumaStatsMode::Strict => "strict",
            NumaStatsMode::Coarse => "coarse",
        }
    }

    /// Parses a mode in the seed's spellings (`auto`/`Auto`, `strict`/`Strict`,
    /// `coarse`/`Coarse`; any case, as Andrew Morton's strcasecmp fixup meant), ignoring the
    /// newline `echo` adds. Anything else is an error naming the valid values.
    pub fn parse(s: &str) -> Result<NumaStatsMode, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("auto") {
            Ok(NumaStatsMode::Auto)
        } else if t.eq_ignore_ascii_case("strict") {
            Ok(NumaStatsMode::Strict)
        } else if t.eq_ignore_ascii_case("coarse") {
            Ok(NumaStatsMode::Coarse)
        } else {
            Err(format!("invalid numa_stats_mode value `{t}`; valid: auto, strict, coarse"))
        }
    }
}
