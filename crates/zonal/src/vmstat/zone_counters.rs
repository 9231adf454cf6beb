//! Zone counters (`enum zone_stat_item`): the free pages, the pages on per-CPU lists and the
//! free blocks per order of a zone, kept as per-CPU `s8` diffs ([`PerCpuZoneDiffs`]) folded
//! into the zone's and the allocator's atomic counters ([`ZoneCounters`]) once a diff passes
//! the zone's `stat_threshold` (with Linux's overstep for single steps).
//!
//! Kernel counterpart: `enum zone_stat_item`, `zone->vm_stat` and `vm_zone_stat`,
//! `struct per_cpu_zonestat` (`vm_stat_diff`, `stat_threshold`), `__mod_zone_page_state`,
//! `zone_page_state`, `global_zone_page_state` (mm/vmstat.c, include/linux/vmstat.h).
//!
//! Locking: every diff of an item is written under one lock, the zone lock for the free
//! counts and the lists' lock for the pages on per-CPU lists, so a diff is a relaxed load and
//! store and the periodic fold takes it under that lock; the folded counters are atomics
//! written by folds only.
//!
//! Invariant: after every update a diff's size is at most its threshold (at most
//! [`MAX_STAT_THRESHOLD`], so it fits an `i8`); a folded counter is behind the truth by at
//! most `nr_cpus * stat_threshold` (it may dip below zero; readers clamp at 0).
//!
//! `ZoneStatItem` is written out by hand rather than through `counters!`: `NrFreeOrder(Order)`
//! stands for one counter per order, so its index, name and list are computed.

use super::MAX_STAT_THRESHOLD;
use crate::sync::{AtomicI8, AtomicIsize, AtomicU8, Ordering};
use crate::types::{Order, MAX_ORDER_LIMIT};

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
