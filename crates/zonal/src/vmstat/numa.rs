//! NUMA counters (`enum numa_stat_item`): hits, misses, foreign, interleave, local and other
//! allocations per zone, kept apart from the zone counters (seed 000), with the three ways of
//! counting them that the seeds measured ([`NumaStrategy`]) and `numa_stats_mode` (seed 001,
//! [`NumaStatsMode`]).
//!
//! Kernel counterpart: `enum numa_stat_item`, `zone->vm_numa_event` and seed 000's
//! `vm_numa_stat` with `vm_numa_stat_diff`, `__count_numa_events`, `__inc_numa_state`,
//! `NUMA_STATS_THRESHOLD` (mm/vmstat.c), and the `vm.numa_stats` sysctl.
//!
//! Locking: none. Per-CPU counters and diffs ([`PerCpuZoneStat`]) are a relaxed load and
//! store by the CPU's own threads, never written by another CPU except to zero them; the
//! zone's shared counters ([`ZoneNumaShared`]) take atomic adds.
//!
//! Invariant: a per-CPU diff never exceeds its threshold after an update (at most
//! [`NUMA_STATS_THRESHOLD`], so `threshold + 1` fits the `u16`); a count is the CPUs' counters
//! plus their diffs plus the shared counter, exact once updates stop.

use crate::sync::{AtomicU64, Ordering};
use std::sync::atomic::AtomicU16;

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
