//! Run-time tunables by name: one table (name, default, bounds, unit, doc), get and set from
//! Rust, C and the CLI, read from `ZONAL_<NAME>` when an allocator is built.
//!
//! Kernel counterpart: `/proc/sys/vm/*` and their bounded handlers (`proc_dointvec_minmax`).
//! Every set is validated first; an invalid value is rejected with a message naming the
//! valid ones, and the old value stays (as Linux's `-EINVAL` does).

use crate::error::{Error, Result};
use crate::page_alloc::Zonal;
pub use crate::tunables::{parse_value, tunable, Bounds, Knob, Tunable, TunableSource, TUNABLES};

impl Zonal {
    /// The current value of a tunable.
    pub fn sysctl_get(&self, name: &str) -> Result<String> {
        match tunable(name) {
            Ok(t) => Ok(self.tunable_value(t)),
            Err(e) => self.tunable_sources().iter().find_map(|s| s.get(name)).ok_or_else(|| self.unknown(name, e)),
        }
    }

    /// The error for a name that is no tunable: zonal's, with the added sources' names.
    fn unknown(&self, name: &str, zonal: Error) -> Error {
        let sources = self.tunable_sources();
        if sources.is_empty() {
            return zonal;
        }
        let names: Vec<&str> =
            TUNABLES.iter().map(|t| t.name).chain(sources.iter().flat_map(|s| s.all()).map(|(n, _)| n)).collect();
        Error::InvalidConfig(format!("unknown tunable `{name}`; tunables: {}", names.join(", ")))
    }

    /// The current value of a row of the table: an exhaustive match, so a new row without
    /// its getter is a compile error rather than a panic.
    fn tunable_value(&self, t: &Tunable) -> String {
        match t.knob {
            Knob::NumaStatsMode => self.numa_stats_mode().name().to_string(),
            Knob::NumaStatStrategy => self.numa_strategy().name().to_string(),
            Knob::NumaStatThreshold => self.numa_stat_threshold().to_string(),
            Knob::MinFreeKbytes => self.min_free_kbytes().to_string(),
            Knob::WatermarkScaleFactor => self.watermark_scale_factor().to_string(),
            Knob::PercpuPagelistHighFraction => self.percpu_pagelist_high_fraction().to_string(),
            Knob::StatInterval => self.stat_interval().as_millis().to_string(),
            Knob::FreeCheck => if self.free_check_atomic() { "atomic" } else { "sequential" }.to_string(),
            Knob::BulkAccounting => if self.bulk_accounting_per_page() { "per_page" } else { "batch" }.to_string(),
            Knob::ZonelistCache => (self.zonelist_cache() as u8).to_string(),
            Knob::ZonelistCacheIntervalMs => self.zonelist_cache_interval_ms().to_string(),
        }
    }

    /// Sets a tunable; an invalid value is rejected and the old value kept.
    pub fn sysctl_set(&self, name: &str, value: &str) -> Result<()> {
        let t = match tunable(name) {
            Ok(t) => t,
            Err(e) => {
                return match self.tunable_sources().iter().find_map(|s| s.set(name, value)) {
                    Some(r) => r.map_err(Error::InvalidConfig),
                    None => Err(self.unknown(name, e)),
                }
            }
        };
        if t.knob == Knob::NumaStatsMode {
            // Seed 001's handler: it logs an invalid value as well as rejecting it.
            return self.set_numa_stats_mode(value.trim());
        }
        let n = parse_value(t, value)?;
        // Exhaustive, as in `tunable_value`: a row without its setter does not compile.
        match t.knob {
            Knob::NumaStatsMode => self.set_numa_stats_mode(value.trim()),
            // Word tunables: `n` is the index of the word in the table's list.
            Knob::NumaStatStrategy => {
                let s = crate::vmstat::NumaStrategy::ALL
                    .get(n as usize)
                    .copied()
                    .ok_or_else(|| Error::InvalidConfig(format!("{}: no strategy number {n}", t.name)))?;
                self.set_numa_strategy(s);
                Ok(())
            }
            Knob::FreeCheck => {
                self.set_free_check_atomic(n == 1);
                Ok(())
            }
            Knob::BulkAccounting => {
                self.set_bulk_accounting_per_page(n == 1);
                Ok(())
            }
            Knob::MinFreeKbytes => self.set_min_free_kbytes(n),
            Knob::WatermarkScaleFactor => self.set_watermark_scale_factor(as_u32(t, n)?),
            Knob::PercpuPagelistHighFraction => self.set_percpu_pagelist_high_fraction(as_u32(t, n)?),
            Knob::NumaStatThreshold => self.set_numa_stat_threshold(n),
            Knob::ZonelistCache => {
                self.set_zonelist_cache(n == 1);
                Ok(())
            }
            Knob::ZonelistCacheIntervalMs => self.set_zonelist_cache_interval_ms(n),
            Knob::StatInterval => {
                self.set_stat_interval(std::time::Duration::from_millis(n));
                Ok(())
            }
        }
    }

    /// Every tunable with its current value (`sysctl -a`): zonal's, then the added
    /// sources'.
    pub fn sysctl_all(&self) -> Vec<(&'static str, String)> {
        let own = TUNABLES.iter().map(|t| (t.name, self.tunable_value(t)));
        own.chain(self.tunable_sources().iter().flat_map(|s| s.all())).collect()
    }

    /// Applies `ZONAL_<NAME>` from the environment for every tunable (at build time), after
    /// warning once per process of any `ZONAL_` variable zonal does not read.
    pub(crate) fn sysctl_from_env(&self) -> Result<()> {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            for name in std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()) {
                if let Some(w) = unknown_env_warning(&name) {
                    eprintln!("zonal: warning: {w}");
                }
            }
        });
        for t in TUNABLES {
            let var = format!("ZONAL_{}", t.name.to_ascii_uppercase());
            if let Ok(v) = std::env::var(&var) {
                self.sysctl_set(t.name, &v).map_err(|e| Error::InvalidConfig(format!("{var}: {e}")))?;
            }
        }
        Ok(())
    }
}

/// The `ZONAL_` variables read outside the tunables' table: by the library (publishing,
/// the socket directory, the rseq switch), by the NUMA balancer when it starts (its tunables,
/// `zonal_numab::tunable`), by the `zonal` command's bench, and by the project's tests and
/// CI scripts (`ZONAL_TEST_*` are the tests' own).
pub const OTHER_ENV: &[&str] = &[
    "ZONAL_NUMA_BALANCING",
    "ZONAL_NUMA_BALANCING_HOT_THRESHOLD_MS",
    "ZONAL_NUMA_BALANCING_PROMOTE_RATE_LIMIT_MBPS",
    "ZONAL_DEMOTION_ENABLED",
    "ZONAL_PUBLISH",
    "ZONAL_RUNTIME_DIR",
    "ZONAL_NO_RSEQ",
    "ZONAL_NUMAB_SECONDS",
    "ZONAL_NUMAB_REMOTE_PENALTY_NS",
    "ZONAL_TIER_PENALTY_NS",
    "ZONAL_BENCH_HISTORY_RUN",
    "ZONAL_CHAOS_SECS",
    "ZONAL_FUZZ_SECONDS",
    "ZONAL_BLESS",
];

/// What to say of an environment variable named like zonal's that zonal does not read
/// (`ZONAL_MIN_FREE_KBYTE=8192` would otherwise be ignored without a word), with the
/// nearest known name when one is close; `None` for any other variable.
fn unknown_env_warning(name: &str) -> Option<String> {
    let rest = name.strip_prefix("ZONAL_")?;
    if rest.starts_with("TEST_") || OTHER_ENV.contains(&name) {
        return None;
    }
    let known = TUNABLES
        .iter()
        .map(|t| format!("ZONAL_{}", t.name.to_ascii_uppercase()))
        .chain(OTHER_ENV.iter().map(|s| s.to_string()));
    if known.clone().any(|k| k == name) {
        return None;
    }
    let nearest = known.map(|k| (edit_distance(&k, name), k)).min().filter(|(d, _)| *d <= 3);
    Some(match nearest {
        Some((_, k)) => format!("{name} is not a variable zonal reads; did you mean {k}? (ignored)"),
        None => format!(
            "{name} is not a variable zonal reads (ignored); tunables are ZONAL_<NAME> for the names `zonal sysctl -a` lists"
        ),
    })
}

/// Levenshtein distance over bytes (names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// A bounded value as the `u32` its setter takes (the bounds keep it there; a table whose
/// bounds did not would get an error, not a truncation).
fn as_u32(t: &Tunable, n: u64) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::InvalidConfig(format!("{}: {n} is out of range", t.name)))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn unknown_zonal_variables_are_named_with_the_nearest_known_one() {
        let w = unknown_env_warning("ZONAL_MIN_FREE_KBYTE").expect("a mistyped tunable is warned of");
        assert!(w.contains("did you mean ZONAL_MIN_FREE_KBYTES?"), "{w}");
        let w = unknown_env_warning("ZONAL_PUBLSH").unwrap();
        assert!(w.contains("ZONAL_PUBLISH?"), "{w}");
        let w = unknown_env_warning("ZONAL_SOMETHING_ELSE_ENTIRELY").unwrap();
        assert!(w.contains("sysctl -a") && !w.contains("did you mean"), "{w}");
        for quiet in ["ZONAL_MIN_FREE_KBYTES", "ZONAL_PUBLISH", "ZONAL_TEST_ANYTHING", "PATH", "XZONAL_X"] {
            assert_eq!(unknown_env_warning(quiet), None, "{quiet}");
        }
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }
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

    #[test]
    fn every_knob_has_one_row() {
        for (i, t) in TUNABLES.iter().enumerate() {
            assert!(TUNABLES[i + 1..].iter().all(|u| u.knob != t.knob && u.name != t.name), "{} twice", t.name);
        }
    }

    /// A program that flips a tunable in a loop keeps the last `LOG_LINES` messages and a
    /// count of the rest, not every message it ever caused.
    #[test]
    fn the_tunable_log_is_bounded() {
        use crate::page_alloc::LOG_LINES;
        let z = zonal();
        let before = z.log().len() as u64;
        let flips = 4 * LOG_LINES as u64;
        for i in 0..flips {
            z.sysctl_set("zonelist_cache", if i % 2 == 0 { "0" } else { "1" }).unwrap();
        }
        let log = z.log();
        assert_eq!(log.len(), LOG_LINES);
        assert_eq!(z.log_dropped(), before + flips - LOG_LINES as u64);
        // The newest messages are the ones kept, in order.
        assert_eq!(log.last().map(String::as_str), Some("zonelist_cache: 1"));
        assert_eq!(log[LOG_LINES - 2], "zonelist_cache: 0");
    }
}
