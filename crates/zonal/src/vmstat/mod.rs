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

/// Declares a counter enum once: each variant with its doc comment and its names, one per
/// name function, in the order the functions are listed. Generates the `#[repr(usize)]` enum
/// (variants numbered in declaration order, which is report order and the index into the
/// per-CPU arrays), the `NR_*` count, `ALL` (every variant in declaration order) and one
/// `fn(self) -> &'static str` per name function. A variant with too few or too many names
/// does not compile.
///
/// ```text
/// counters! {
///     /// The enum's doc.
///     pub enum Counter;
///     /// The count's doc.
///     pub const NR_COUNTERS;
///     /// `ALL`'s doc.
///     const ALL;
///     /// The first name function's doc.
///     fn name;
///     /// The second's.
///     fn other_name;
///     {
///         /// A variant's doc.
///         First => ["first", "first_other"],
///     }
/// }
/// ```
macro_rules! counters {
    // One name function per step: each variant's first remaining name.
    (@names $Enum:ident { $( $Variant:ident [$first:literal $(, $rest:literal)*] ),+ }
        $(#[$fn_meta:meta])* fn $name_fn:ident; $($more:tt)*) => {
        impl $Enum {
            $(#[$fn_meta])*
            pub fn $name_fn(self) -> &'static str {
                match self {
                    $( $Enum::$Variant => $first, )+
                }
            }
        }

        counters!(@names $Enum { $( $Variant [$($rest),*] ),+ } $($more)*);
    };
    (@names $Enum:ident { $( $Variant:ident [] ),+ }) => {};
    (
        $(#[$enum_meta:meta])*
        $vis:vis enum $Enum:ident;
        $(#[$nr_meta:meta])*
        $nr_vis:vis const $NR:ident;
        $(#[$all_meta:meta])*
        const ALL;
        $( $(#[$fn_meta:meta])* fn $name_fn:ident; )+
        {
            $( $(#[$variant_meta:meta])* $Variant:ident => [$($name:literal),+ $(,)?] ),+ $(,)?
        }
    ) => {
        $(#[$enum_meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(usize)]
        $vis enum $Enum {
            $( $(#[$variant_meta])* $Variant, )+
        }

        $(#[$nr_meta])*
        $nr_vis const $NR: usize = [$(stringify!($Variant)),+].len();

        impl $Enum {
            $(#[$all_meta])*
            pub const ALL: [$Enum; $NR] = [$($Enum::$Variant),+];
        }

        counters!(@names $Enum { $( $Variant [$($name),+] ),+ } $( $(#[$fn_meta])* fn $name_fn; )+);
    };
}

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

counters! {
    /// The event counters, in report order, with their stable names.
    pub enum VmEvent;
    /// Number of [`VmEvent`]s.
    pub const NR_VM_EVENTS;
    /// Every event, in report order.
    const ALL;
    /// The counter's name in `/proc/vmstat` style.
    fn name;
    {
        /// Frames allocated from a `Normal` zone (`pgalloc_normal`).
        PgallocNormal => ["pgalloc_normal"],
        /// Frames freed (`pgfree`).
        Pgfree => ["pgfree"],
        /// Refills of a per-CPU list from the buddy lists.
        PcpRefill => ["pcp_refill"],
        /// Drains of per-CPU lists to the buddy lists (on `high`, on demand, on decay).
        PcpDrain => ["pcp_drain"],
        /// Calls of the bulk allocator.
        AllocBulk => ["alloc_bulk"],
        /// Allocations that failed for lack of memory.
        AllocFail => ["alloc_fail"],
        /// Allocations that found their per-CPU list busy and took the buddy path.
        PcpTrylockFail => ["pcp_trylock_fail"],
        /// `membarrier` calls a pcp lock holder made to restart another CPU's rseq sections
        /// (zonal's own: the cost of touching a remote cache, one IPI each).
        PcpFence => ["pcp_fence"],
        /// Zones a zonelist walk skipped because the zonelist cache had them full.
        ZlcSkipped => ["zlc_zones_skipped"],
        /// Zones the zonelist cache marked full.
        ZlcFullMarks => ["zlc_full_marks"],
        /// Zaps of a zonelist cache's bitmap.
        ZlcZaps => ["zlc_zaps"],
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

    /// What `counters!` generates: `ALL` holds every variant once, in declaration order (the
    /// discriminant is the position: the index into the per-CPU arrays), `NR_*` counts them,
    /// and each name function gives every variant its own name. Event, NUMA and zone counter
    /// names share `/proc/vmstat`, so they are unique across all three.
    #[test]
    fn counters_are_in_declaration_order_with_unique_names() {
        use std::collections::HashSet;
        assert_eq!(VmEvent::ALL.len(), NR_VM_EVENTS);
        assert_eq!(NumaStat::ALL.len(), NR_NUMA_STATS);
        assert_eq!((VmEvent::ALL[0], VmEvent::ALL[NR_VM_EVENTS - 1]), (VmEvent::PgallocNormal, VmEvent::ZlcZaps));
        assert_eq!((NumaStat::ALL[0], NumaStat::ALL[NR_NUMA_STATS - 1]), (NumaStat::NumaHit, NumaStat::NumaOther));
        for (i, e) in VmEvent::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i, "{e:?}");
        }
        for (i, s) in NumaStat::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?}");
        }
        let numastat: HashSet<&str> = NumaStat::ALL.iter().map(|s| s.numastat_name()).collect();
        assert_eq!(numastat.len(), NR_NUMA_STATS, "numastat names repeat");
        let mut vmstat = HashSet::new();
        let zone_items = ZoneStatItem::all(Order(MAX_ORDER_LIMIT)).map(ZoneStatItem::name);
        let names = VmEvent::ALL.iter().map(|e| e.name()).chain(NumaStat::ALL.iter().map(|s| s.name()));
        for name in names.map(String::from).chain(zone_items).chain([NR_ALLOCATED_NAME.to_string()]) {
            assert!(vmstat.insert(name.clone()), "{name} names two counters");
        }
        assert_eq!(vmstat.len(), NR_VM_EVENTS + NR_NUMA_STATS + NR_ZONE_STAT_ITEMS + 1);
    }
}

counters! {
    /// The NUMA counters (`enum numa_stat_item`), kept apart from the zone counters (seed 000).
    pub enum NumaStat;
    /// Number of [`NumaStat`]s.
    pub const NR_NUMA_STATS;
    /// Every counter, in the kernel's order.
    const ALL;
    /// The name in `/proc/zoneinfo` and `/proc/vmstat`.
    fn name;
    /// The name in `/sys/devices/system/node/nodeN/numastat`.
    fn numastat_name;
    {
        // Variant => [name(), numastat_name()]
        /// Allocated on the preferred zone's node.
        NumaHit => ["numa_hit", "numa_hit"],
        /// Allocated here although another node was preferred.
        NumaMiss => ["numa_miss", "numa_miss"],
        /// Preferred here but allocated on another node (charged to the preferred zone).
        NumaForeign => ["numa_foreign", "numa_foreign"],
        /// The interleave policy got the node it asked for.
        NumaInterleaveHit => ["numa_interleave", "interleave_hit"],
        /// Allocated on the allocating CPU's node.
        NumaLocal => ["numa_local", "local_node"],
        /// Allocated on another node than the allocating CPU's.
        NumaOther => ["numa_other", "other_node"],
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
