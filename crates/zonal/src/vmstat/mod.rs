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
//!
//! Rooms: this file holds the thresholds that bound the zone counters' drift
//! (`normal_threshold`, `pressure_threshold`, `percpu_drift_mark`, `MAX_STAT_THRESHOLD`) and
//! `counters!`, which declares a counter enum once; `zone_counters.rs` the zone counters and
//! their per-CPU diffs, `events.rs` the event counters, `numa.rs` the NUMA counters and their
//! modes. Everything is re-exported here, so `vmstat::X` names every item.
//!
//! `VmEvent` and `NumaStat` are declared through `counters!`: each variant once, with its doc
//! and its name(s), and the enum, `ALL`, `NR_*` and the name functions generated from that.
//! `ZoneStatItem` is not: its `NrFreeOrder(Order)` variant stands for one counter per order,
//! so it is no field-less `repr(usize)` enum, and its index, names and list are computed
//! (`index`, `from_index`, `name`, `all`).

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

// After `counters!`: a macro_rules! macro is in scope only below its definition.
mod events;
mod numa;
mod zone_counters;

pub use events::{sum_events, PerCpuEvents, VmEvent, NR_VM_EVENTS};
pub use numa::{
    NumaStat, NumaStatsMode, NumaStrategy, PerCpuZoneStat, ZoneNumaShared, NR_NUMA_STATS, NUMA_STATS_THRESHOLD,
};
pub use zone_counters::{PerCpuZoneDiffs, ZoneCounters, ZoneStatItem, NR_ALLOCATED_NAME, NR_ZONE_STAT_ITEMS};

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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::types::{Order, MAX_ORDER_LIMIT};

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
