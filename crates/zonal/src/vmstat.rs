//! Event counters (`vm_event_item`): per CPU, each CPU's on its own cache lines apart from the
//! per-CPU page lists, summed on read.
//!
//! Kernel counterpart: `count_vm_events`, `all_vm_events` (mm/vmstat.c) and, for the layout,
//! seed 002's split of `per_cpu_pages` from `per_cpu_zonestat`.
//!
//! Accuracy: an update is a relaxed load and store on the CPU's own line, like the kernel's
//! `raw_cpu_add`, without a locked instruction. Two threads that run on the same CPU at once
//! (one preempted mid-update) can lose one of their updates; a single thread, or threads on
//! different CPUs, lose nothing. Readers sum every CPU's slots, so a read is exact once
//! updates stop, up to those rare lost updates.

use crate::sync::{AtomicU64, Ordering};
use std::sync::atomic::AtomicU16;

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
}

/// Number of [`VmEvent`]s.
pub const NR_VM_EVENTS: usize = 7;

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
        }
    }
}

/// One CPU's event counters, on lines of their own.
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct PerCpuEvents {
    events: [AtomicU64; NR_VM_EVENTS],
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
        self.events[ev as usize].load(Ordering::Relaxed)
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
    /// Allocations that were both a hit and local, the common case, counted with one
    /// update instead of two; reads add it to `numa_hit` and `numa_local`.
    hit_local: AtomicU64,
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
        let both = match s {
            NumaStat::NumaHit | NumaStat::NumaLocal => self.hit_local.load(Ordering::Relaxed),
            _ => 0,
        };
        self.numa[s as usize]
            .load(Ordering::Relaxed)
            .wrapping_add(self.diff[s as usize].load(Ordering::Relaxed) as u64)
            .wrapping_add(both)
    }

    /// Adds `n` allocations that were a hit and local: `numa_hit` and `numa_local` both.
    #[inline]
    pub fn add_hit_local(&self, n: u64) {
        let c = &self.hit_local;
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Adds `n` to this CPU's diff; past `threshold` the diff goes to `shared` and restarts
    /// from 0 (`__inc_numa_state`: `v = ++diff; if v > threshold { fold v; diff = 0 }`).
    #[inline]
    pub fn add_diff(&self, s: NumaStat, n: u64, threshold: u16, shared: &ZoneNumaShared) {
        let d = &self.diff[s as usize];
        let v = d.load(Ordering::Relaxed) as u64 + n;
        if v > threshold as u64 {
            shared.counters[s as usize].fetch_add(v, Ordering::Relaxed);
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
        self.hit_local.store(0, Ordering::Relaxed);
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

/// How NUMA events are counted (both kept so the seeds' experiments can be rerun).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaStrategy {
    /// Seed 002: per-CPU event counters never written by another CPU, summed on read.
    PerCpu,
    /// Seed 000: per-CPU u16 diffs folded into shared per-zone counters past a threshold.
    Threshold,
}

impl NumaStrategy {
    /// The strategy's name in the sysctl table.
    pub fn name(self) -> &'static str {
        match self {
            NumaStrategy::PerCpu => "percpu",
            NumaStrategy::Threshold => "threshold",
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
