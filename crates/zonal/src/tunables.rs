//! The run-time tunables' table: name, default, bounds, unit, doc and which setting each
//! is, with their parsing and bounds checks. A leaf: [`crate::config`] bounds a
//! configuration with it and [`crate::sysctl`] gets and sets an allocator's values through
//! it, without either importing the other.
//!
//! Kernel counterpart: the `ctl_table` rows of `/proc/sys/vm` (`vm_table`) and
//! `proc_dointvec_minmax`'s bounds.

use crate::error::{Error, Result};

/// The settings behind the tunables, one per row of [`TUNABLES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    /// `numa_stats_mode`.
    NumaStatsMode,
    /// `numa_stat_strategy`.
    NumaStatStrategy,
    /// `numa_stat_threshold`.
    NumaStatThreshold,
    /// `min_free_kbytes`.
    MinFreeKbytes,
    /// `watermark_scale_factor`.
    WatermarkScaleFactor,
    /// `percpu_pagelist_high_fraction`.
    PercpuPagelistHighFraction,
    /// `free_check`.
    FreeCheck,
    /// `bulk_accounting`.
    BulkAccounting,
    /// `zonelist_cache`.
    ZonelistCache,
    /// `zonelist_cache_interval_ms`.
    ZonelistCacheIntervalMs,
    /// `stat_interval`.
    StatInterval,
}

/// What values a tunable takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bounds {
    /// An integer in `min..=max`.
    Range(u64, u64),
    /// 0, or an integer in `min..=max`.
    ZeroOrRange(u64, u64),
    /// One of these words.
    Choice(&'static [&'static str]),
}

impl Bounds {
    /// The accepted values in words: `1 to 1000`, `8 or more`, `0, or 8 or more`,
    /// `one of auto, strict, coarse`.
    pub fn describe(&self) -> String {
        let range = |lo: u64, hi: u64| if hi == u64::MAX { format!("{lo} or more") } else { format!("{lo} to {hi}") };
        match *self {
            Bounds::Range(lo, hi) => range(lo, hi),
            Bounds::ZeroOrRange(lo, hi) => format!("0, or {}", range(lo, hi)),
            Bounds::Choice(words) => format!("one of {}", words.join(", ")),
        }
    }
}

/// One run-time tunable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tunable {
    /// Name, as `/proc/sys/vm` spells it.
    pub name: &'static str,
    /// Default, as text (`computed` when it depends on the memory size).
    pub default: &'static str,
    /// Accepted values.
    pub bounds: Bounds,
    /// Unit of the value.
    pub unit: &'static str,
    /// What it does.
    pub doc: &'static str,
    /// Which setting of an allocator it is: `sysctl_get`/`sysctl_set` match on it with no
    /// catch-all arm, so a row without its getter and setter does not compile.
    pub knob: Knob,
}

/// Every tunable, in the order `sysctl -a` prints them.
pub const TUNABLES: &[Tunable] = &[
    Tunable {
        name: "numa_stats_mode",
        default: "auto",
        bounds: Bounds::Choice(&["auto", "strict", "coarse"]),
        unit: "mode",
        doc: "NUMA counters (seed 001): strict counts always; coarse stops counting and zeroes \
              them; auto counts once anyone has read them (any report, the API, C or the CLI)",
        knob: Knob::NumaStatsMode,
    },
    Tunable {
        name: "numa_stat_strategy",
        default: "percpu",
        bounds: Bounds::Choice(&["percpu", "threshold", "shared"]),
        unit: "strategy",
        doc: "percpu (seed 002): per-CPU event counters never written by another CPU, summed on \
              read (the fast path's local hits cost nothing: they are its pgalloc count); \
              threshold (seed 000): per-CPU u16 diffs folded into shared per-zone counters past \
              numa_stat_threshold, which every allocating CPU then writes; shared: an atomic add \
              on the zone's shared counter per event, exact at every instant. Reads add the \
              unfolded parts, so all are exact once allocation stops (percpu and threshold up \
              to a rare lost update between two threads preempting each other on one CPU); \
              threshold's shared counters alone lag by up to nr_cpus * numa_stat_threshold",
        knob: Knob::NumaStatStrategy,
    },
    Tunable {
        name: "numa_stat_threshold",
        default: "65533",
        bounds: Bounds::Range(1, crate::vmstat::NUMA_STATS_THRESHOLD as u64),
        unit: "events",
        doc: "per-CPU diff folded into the shared counter past this (seed 000: U16_MAX - 2)",
        knob: Knob::NumaStatThreshold,
    },
    Tunable {
        name: "min_free_kbytes",
        default: "computed",
        bounds: Bounds::Range(1, u64::MAX),
        unit: "KiB",
        doc: "memory kept free below the min watermark, shared over the zones by size; default \
              sqrt(16 * memory in KiB) clamped to 128..=262144, as Linux computes it",
        knob: Knob::MinFreeKbytes,
    },
    Tunable {
        name: "watermark_scale_factor",
        default: "10",
        bounds: Bounds::Range(1, crate::zone::MAX_WATERMARK_SCALE_FACTOR as u64),
        unit: "1/10000 of a zone",
        doc: "distance between the min, low and high watermarks",
        knob: Knob::WatermarkScaleFactor,
    },
    Tunable {
        name: "percpu_pagelist_high_fraction",
        default: "0",
        bounds: Bounds::ZeroOrRange(crate::pcp::MIN_PERCPU_PAGELIST_HIGH_FRACTION as u64, u32::MAX as u64),
        unit: "fraction",
        doc: "0: each per-CPU list's high tunes itself (Linux 6.7); N >= 8: high is managed/N \
              split over the node's CPUs",
        knob: Knob::PercpuPagelistHighFraction,
    },
    Tunable {
        name: "free_check",
        default: "sequential",
        bounds: Bounds::Choice(&["sequential", "atomic"]),
        unit: "mode",
        doc: "how a free of orders 0 to 3 on the per-CPU fast path claims its block. sequential: \
              a load and a store, as Linux's free_pages_prepare checks; every double free that is \
              not a data race in the caller is an error. atomic: a CAS, so of two frees of one \
              block racing on different CPUs exactly one succeeds, for a few ns more per free. \
              The locked paths always use the CAS",
        knob: Knob::FreeCheck,
    },
    Tunable {
        name: "bulk_accounting",
        default: "batch",
        bounds: Bounds::Choice(&["batch", "per_page"]),
        unit: "mode",
        doc: "how bulk calls update the event and NUMA counters: batch (seed 002): once per call \
              with the batch count; per_page: once per page, as before seed 002 (for the stats \
              experiment)",
        knob: Knob::BulkAccounting,
    },
    Tunable {
        name: "zonelist_cache",
        default: "1",
        bounds: Bounds::Range(0, 1),
        unit: "bool",
        doc: "1: zonelist walks skip zones recently found full for a demand at least as strict \
              (seed 003, made safe for small allocations); 0: every walk checks every zone",
        knob: Knob::ZonelistCache,
    },
    Tunable {
        name: "zonelist_cache_interval_ms",
        default: "1000",
        bounds: Bounds::Range(1, 3_600_000),
        unit: "ms",
        doc: "how long a zone stays marked full at most: each cache is zapped when a walk sets \
              it up this long after its last zap (seed 003: 1 s)",
        knob: Knob::ZonelistCacheIntervalMs,
    },
    Tunable {
        name: "stat_interval",
        default: "1000",
        bounds: Bounds::Range(1, 3_600_000),
        unit: "ms",
        doc: "how often the background worker folds the zone counters' per-CPU diffs, sets each \
              zone's normal or pressure stat_threshold, and decays idle per-CPU lists",
        knob: Knob::StatInterval,
    },
];

/// The table entry of a name.
pub fn tunable(name: &str) -> Result<&'static Tunable> {
    TUNABLES.iter().find(|t| t.name == name).ok_or_else(|| {
        let names: Vec<&str> = TUNABLES.iter().map(|t| t.name).collect();
        Error::InvalidConfig(format!("unknown tunable `{name}`; tunables: {}", names.join(", ")))
    })
}

/// Parses and bounds-checks a value for a tunable: the number, or for a word tunable the
/// index of the word in its list (any case).
pub fn parse_value(t: &Tunable, value: &str) -> Result<u64> {
    let v = value.trim();
    if let Bounds::Choice(words) = t.bounds {
        return words.iter().position(|w| w.eq_ignore_ascii_case(v)).map(|i| i as u64).ok_or_else(|| {
            Error::InvalidConfig(format!("{}: `{v}` is not a choice; {}", t.name, describe_bounds(t.bounds)))
        });
    }
    let n: u64 = v.parse().map_err(|_| {
        Error::InvalidConfig(format!("{}: `{v}` is not a number; {}", t.name, describe_bounds(t.bounds)))
    })?;
    check_bounds(t, n)
}

/// Checks a number against a tunable's bounds: the one place each bound is enforced, for
/// `sysctl_set`, the typed setters and [`crate::Config::validate`] alike.
pub(crate) fn check(name: &str, n: u64) -> Result<u64> {
    check_bounds(tunable(name)?, n)
}

fn check_bounds(t: &Tunable, n: u64) -> Result<u64> {
    let ok = match t.bounds {
        Bounds::Range(lo, hi) => (lo..=hi).contains(&n),
        Bounds::ZeroOrRange(lo, hi) => n == 0 || (lo..=hi).contains(&n),
        Bounds::Choice(words) => (n as usize) < words.len(),
    };
    if !ok {
        return Err(Error::InvalidConfig(format!("{}: {n} is out of range; {}", t.name, describe_bounds(t.bounds))));
    }
    Ok(n)
}

fn describe_bounds(b: Bounds) -> String {
    match b {
        Bounds::Range(lo, u64::MAX) => format!("valid: at least {lo}"),
        Bounds::Range(lo, hi) => format!("valid: {lo}..={hi}"),
        Bounds::ZeroOrRange(lo, hi) => format!("valid: 0 or {lo}..={hi} (0, or at least {lo})"),
        Bounds::Choice(words) => format!("valid: {}", words.join(", ")),
    }
}

/// A layer's tunables, reached by name through the handle's `sysctl`
/// ([`Zonal::sysctl_get`](crate::Zonal::sysctl_get), [`Zonal::sysctl_set`](crate::Zonal::sysctl_set),
/// [`Zonal::sysctl_all`](crate::Zonal::sysctl_all)) and so through the live `sysctl` requests
/// of `zonal --pid P sysctl`: NUMA balancing adds its own this way
/// ([`Zonal::add_tunable_source`](crate::Zonal::add_tunable_source)), as a kernel module adds
/// its knobs beside the kernel's. zonal's own names come first: a source's tunable of the
/// same name is never reached.
pub trait TunableSource: Send + Sync {
    /// Every tunable of the source with its value.
    fn all(&self) -> Vec<(&'static str, String)>;
    /// A tunable's value; `None` when the name is not the source's.
    fn get(&self, name: &str) -> Option<String>;
    /// Sets a tunable (an invalid value refused with why, the old value kept); `None` when
    /// the name is not the source's.
    fn set(&self, name: &str, value: &str) -> Option<std::result::Result<(), String>>;
}
