//! Run-time tunables by name: one table (name, default, bounds, unit, doc), get and set from
//! Rust, C and the CLI, read from `ZONAL_<NAME>` when an allocator is built.
//!
//! Kernel counterpart: `/proc/sys/vm/*` and their bounded handlers (`proc_dointvec_minmax`).
//! Every set is validated first; an invalid value is rejected with a message naming the
//! valid ones, and the old value stays (as Linux's `-EINVAL` does).

use crate::error::{Error, Result};
use crate::page_alloc::Zonal;

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
    },
    Tunable {
        name: "numa_stat_threshold",
        default: "65533",
        bounds: Bounds::Range(1, crate::vmstat::NUMA_STATS_THRESHOLD as u64),
        unit: "events",
        doc: "per-CPU diff folded into the shared counter past this (seed 000: U16_MAX - 2)",
    },
    Tunable {
        name: "min_free_kbytes",
        default: "computed",
        bounds: Bounds::Range(1, u64::MAX),
        unit: "KiB",
        doc: "memory kept free below the min watermark, shared over the zones by size; default \
              sqrt(16 * memory in KiB) clamped to 128..=262144, as Linux computes it",
    },
    Tunable {
        name: "watermark_scale_factor",
        default: "10",
        bounds: Bounds::Range(1, crate::zone::MAX_WATERMARK_SCALE_FACTOR as u64),
        unit: "1/10000 of a zone",
        doc: "distance between the min, low and high watermarks",
    },
    Tunable {
        name: "percpu_pagelist_high_fraction",
        default: "0",
        bounds: Bounds::ZeroOrRange(crate::pcp::MIN_PERCPU_PAGELIST_HIGH_FRACTION as u64, u32::MAX as u64),
        unit: "fraction",
        doc: "0: each per-CPU list's high tunes itself (Linux 6.7); N >= 8: high is managed/N \
              split over the node's CPUs",
    },
    Tunable {
        name: "free_check",
        default: "sequential",
        bounds: Bounds::Choice(&["sequential", "atomic"]),
        unit: "mode",
        doc: "how an order-0 free on the per-CPU fast path claims its frame. sequential: a load \
              and a store, as Linux's free_pages_prepare checks; every double free that is not \
              a data race in the caller is an error. atomic: a CAS, so of two frees of one \
              frame racing on different CPUs exactly one succeeds, for a few ns more per free. \
              The locked paths always use the CAS",
    },
    Tunable {
        name: "bulk_accounting",
        default: "batch",
        bounds: Bounds::Choice(&["batch", "per_page"]),
        unit: "mode",
        doc: "how bulk calls update the event and NUMA counters: batch (seed 002): once per call \
              with the batch count; per_page: once per page, as before seed 002 (for the stats \
              experiment)",
    },
    Tunable {
        name: "zonelist_cache",
        default: "1",
        bounds: Bounds::Range(0, 1),
        unit: "bool",
        doc: "1: zonelist walks skip zones recently found full for a demand at least as strict \
              (seed 003, made safe for small allocations); 0: every walk checks every zone",
    },
    Tunable {
        name: "zonelist_cache_interval_ms",
        default: "1000",
        bounds: Bounds::Range(1, 3_600_000),
        unit: "ms",
        doc: "how long a zone stays marked full at most: each cache is zapped when a walk sets \
              it up this long after its last zap (seed 003: 1 s)",
    },
    Tunable {
        name: "stat_interval",
        default: "1000",
        bounds: Bounds::Range(1, 3_600_000),
        unit: "ms",
        doc: "how often the background worker folds the zone counters' per-CPU diffs, sets each \
              zone's normal or pressure stat_threshold, and decays idle per-CPU lists",
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
        return Err(Error::InvalidConfig(format!(
            "{}: {n} is out of range (outside its bounds); {}",
            t.name,
            describe_bounds(t.bounds)
        )));
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

impl Zonal {
    /// The current value of a tunable.
    pub fn sysctl_get(&self, name: &str) -> Result<String> {
        let t = tunable(name)?;
        Ok(match t.name {
            "numa_stats_mode" => self.numa_stats_mode().name().to_string(),
            "numa_stat_strategy" => self.numa_strategy().name().to_string(),
            "numa_stat_threshold" => self.numa_stat_threshold().to_string(),
            "min_free_kbytes" => self.min_free_kbytes().to_string(),
            "watermark_scale_factor" => self.watermark_scale_factor().to_string(),
            "percpu_pagelist_high_fraction" => self.percpu_pagelist_high_fraction().to_string(),
            "stat_interval" => self.stat_interval().as_millis().to_string(),
            "free_check" => if self.free_check_atomic() { "atomic" } else { "sequential" }.to_string(),
            "bulk_accounting" => if self.bulk_accounting_per_page() { "per_page" } else { "batch" }.to_string(),
            "zonelist_cache" => (self.zonelist_cache() as u8).to_string(),
            "zonelist_cache_interval_ms" => self.zonelist_cache_interval_ms().to_string(),
            _ => unreachable!("every table entry is handled"),
        })
    }

    /// Sets a tunable; an invalid value is rejected and the old value kept.
    pub fn sysctl_set(&self, name: &str, value: &str) -> Result<()> {
        let t = tunable(name)?;
        if t.name == "numa_stats_mode" {
            // Seed 001's handler: it logs an invalid value as well as rejecting it.
            return self.set_numa_stats_mode(value.trim());
        }
        let n = parse_value(t, value)?;
        match t.name {
            // Word tunables: `n` is the index of the word in the table's list.
            "numa_stat_strategy" => {
                self.set_numa_strategy(crate::vmstat::NumaStrategy::ALL[n as usize]);
                Ok(())
            }
            "free_check" => {
                self.set_free_check_atomic(n == 1);
                Ok(())
            }
            "bulk_accounting" => {
                self.set_bulk_accounting_per_page(n == 1);
                Ok(())
            }
            "min_free_kbytes" => self.set_min_free_kbytes(n),
            "watermark_scale_factor" => self.set_watermark_scale_factor(n as u32),
            "percpu_pagelist_high_fraction" => self.set_percpu_pagelist_high_fraction(n as u32),
            "numa_stat_threshold" => self.set_numa_stat_threshold(n),
            "zonelist_cache" => {
                self.set_zonelist_cache(n == 1);
                Ok(())
            }
            "zonelist_cache_interval_ms" => self.set_zonelist_cache_interval_ms(n),
            "stat_interval" => {
                self.set_stat_interval(std::time::Duration::from_millis(n));
                Ok(())
            }
            _ => unreachable!("every table entry is handled"),
        }
    }

    /// Every tunable with its current value (`sysctl -a`).
    pub fn sysctl_all(&self) -> Vec<(&'static str, String)> {
        TUNABLES.iter().map(|t| (t.name, self.sysctl_get(t.name).expect("table names are valid"))).collect()
    }

    /// Applies `ZONAL_<NAME>` from the environment for every tunable (at build time).
    pub(crate) fn sysctl_from_env(&self) -> Result<()> {
        for t in TUNABLES {
            let var = format!("ZONAL_{}", t.name.to_ascii_uppercase());
            if let Ok(v) = std::env::var(&var) {
                self.sysctl_set(t.name, &v).map_err(|e| Error::InvalidConfig(format!("{var}: {e}")))?;
            }
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::topology::{Machine, Topology};
    use crate::Config;

    fn zonal() -> Zonal {
        let t = Topology::parse_for("nodes=2,size=16M", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
        Zonal::new(Config::new(t)).unwrap()
    }

    #[test]
    fn every_tunable_gets_and_sets() {
        let z = zonal();
        for (name, value) in z.sysctl_all() {
            // Setting the current value back is always accepted.
            z.sysctl_set(name, &value).unwrap();
            assert_eq!(z.sysctl_get(name).unwrap(), value);
        }
        z.sysctl_set("watermark_scale_factor", "200").unwrap();
        assert_eq!(z.watermark_scale_factor(), 200);
        z.sysctl_set("percpu_pagelist_high_fraction", "16").unwrap();
        assert_eq!(z.percpu_pagelist_high_fraction(), 16);
        z.sysctl_set("stat_interval", "250").unwrap();
        assert_eq!(z.sysctl_get("stat_interval").unwrap(), "250");
        z.sysctl_set("min_free_kbytes", "2048").unwrap();
        assert_eq!(z.min_free_kbytes(), 2048);
        z.sysctl_set("free_check", "atomic").unwrap();
        assert!(z.free_check_atomic());
    }

    #[test]
    fn bad_values_are_rejected_and_the_old_value_stays() {
        let z = zonal();
        let before = z.sysctl_all();
        for (name, bad, says) in [
            ("watermark_scale_factor", "0", "valid: 1..=3000"),
            ("watermark_scale_factor", "3001", "out of range"),
            ("watermark_scale_factor", "ten", "not a number"),
            ("percpu_pagelist_high_fraction", "4", "valid: 0 or 8"),
            ("stat_interval", "0", "valid: 1..=3600000"),
            ("min_free_kbytes", "0", "at least 1"),
            ("min_free_kbytes", "99999999", "min_free_kbytes"),
            ("min_free_kbytes", "-5", "not a number"),
            ("numa_stats_mode", "lazy", "valid: auto, strict, coarse"),
            ("numa_stats_mode", "", "valid: auto, strict, coarse"),
            ("numa_stat_strategy", "both", "valid: percpu, threshold, shared"),
            ("bulk_accounting", "each", "valid: batch, per_page"),
            ("free_check", "cas", "valid: sequential, atomic"),
            ("numa_stat_threshold", "0", "valid: 1..=65533"),
            ("numa_stat_threshold", "65534", "out of range"),
        ] {
            let e = z.sysctl_set(name, bad).unwrap_err().to_string();
            assert!(e.contains(says), "{name}={bad}: {e}");
        }
        assert!(z
            .sysctl_get("colour")
            .unwrap_err()
            .to_string()
            .contains("tunables: numa_stats_mode, numa_stat_strategy"));
        assert_eq!(z.sysctl_all(), before);
    }
}
