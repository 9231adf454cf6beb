//! The balancer's run-time tunables by name (`zonal sysctl` shows them beside zonal's): one
//! table of name, default, bounds, unit and doc, and the checks a value must pass. An
//! invalid value is an error naming the valid ones, and the old value stays.
//!
//! Kernel counterparts: `kernel.numa_balancing` (a bit mask), the debugfs/sysctl knobs
//! `numa_balancing_hot_threshold_ms` and `numa_balancing_promote_rate_limit_MBps`, and
//! `/sys/kernel/mm/numa/demotion_enabled`.

use crate::{Error, Result};

/// One tunable of the balancer.
#[derive(Debug)]
pub struct Tunable {
    /// The name, as Linux's where it has one.
    pub name: &'static str,
    /// The default, as text.
    pub default: &'static str,
    /// The smallest and largest values.
    pub min: u64,
    pub max: u64,
    /// The unit.
    pub unit: &'static str,
    /// What it does.
    pub doc: &'static str,
}

/// Every run-time tunable of the balancer.
pub const TUNABLES: &[Tunable] = &[
    Tunable {
        name: "numa_balancing",
        default: "1",
        min: 0,
        max: 3,
        unit: "bits",
        doc: "bit 0 (1): pages move to the node of the CPUs that use them; bit 1 (2): memory tiering, \
              hot pages of lower tiers promoted to the top tier, and with only this bit the scanner hides \
              only lower-tier pages; 3: both; 0: pages are placed on first touch only",
    },
    Tunable {
        name: "numa_balancing_hot_threshold_ms",
        default: "1000",
        min: 0,
        max: u32::MAX as u64,
        unit: "ms",
        doc: "a lower-tier page is hot when its hint fault comes sooner than this after the scan that hid \
              it; adjusted per node toward the promotion rate limit (up to twice this, down to 1/8)",
    },
    Tunable {
        name: "numa_balancing_promote_rate_limit_MBps",
        default: "65536",
        min: 0,
        max: u32::MAX as u64,
        unit: "MiB/s",
        doc: "most memory promoted to one node per second; candidates past it wait for the next second",
    },
    Tunable {
        name: "demotion_enabled",
        default: "0",
        min: 0,
        max: 1,
        unit: "0/1",
        doc: "1: a top-tier node below its promo watermark moves its coldest region pages (untouched for \
              the most scan passes) to the nearest node of the next tier until it has room again",
    },
];

/// The table's row of `name`, or an error listing the names.
pub fn tunable(name: &str) -> Result<&'static Tunable> {
    TUNABLES.iter().find(|t| t.name == name).ok_or_else(|| {
        let names: Vec<&str> = TUNABLES.iter().map(|t| t.name).collect();
        Error::InvalidConfig(format!("unknown balancer tunable `{name}`; tunables: {}", names.join(", ")))
    })
}

/// `value` for tunable `name`, checked against its bounds (`demotion_enabled` also takes
/// `true`/`false`, as Linux's does).
pub fn parse(name: &str, value: &str) -> Result<u64> {
    let t = tunable(name)?;
    let v = value.trim();
    let n = match (t.max, v) {
        (1, "true" | "y") => Some(1),
        (1, "false" | "n") => Some(0),
        _ => v.parse::<u64>().ok(),
    };
    match n {
        Some(n) if (t.min..=t.max).contains(&n) => Ok(n),
        _ => Err(Error::InvalidConfig(format!(
            "{name}: `{v}` is not valid: {} (kept the old value)",
            match name {
                "numa_balancing" => "0 (off), 1 (normal), 2 (memory tiering) or 3 (both)".to_string(),
                "demotion_enabled" => "0 or 1".to_string(),
                _ => format!("a whole number of {} from {} to {}", t.unit, t.min, t.max),
            }
        ))),
    }
}

/// The environment variable that sets tunable `t` when a balancer starts: `ZONAL_<NAME>`,
/// upper case, as zonal's own tunables (`zonal::sysctl::OTHER_ENV` lists these names, so
/// that zonal's warning of unknown `ZONAL_` variables leaves them alone).
pub fn env_var(t: &Tunable) -> String {
    format!("ZONAL_{}", t.name.to_ascii_uppercase())
}

/// The tunables `lookup` (the environment, in [`crate::Balancer::new`]) sets, as (name,
/// value) in the table's order.
pub(crate) fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, String, String)> {
    TUNABLES.iter().filter_map(|t| lookup(&env_var(t)).map(|v| (t.name, env_var(t), v))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tunable_has_a_variable_zonal_knows() {
        for t in TUNABLES {
            assert!(zonal::sysctl::OTHER_ENV.contains(&env_var(t).as_str()), "{} is not in OTHER_ENV", env_var(t));
        }
        let set = from_env(|k| (k == "ZONAL_NUMA_BALANCING_PROMOTE_RATE_LIMIT_MBPS").then(|| "5".to_string()));
        assert_eq!(set, vec![("numa_balancing_promote_rate_limit_MBps", env_var(&TUNABLES[2]), "5".to_string())]);
    }

    /// A balancer starts with the environment's tunables over its `Config`'s, and refuses to
    /// start on an invalid one, naming the variable.
    #[test]
    fn a_balancer_starts_with_the_environments_tunables() {
        let machine = zonal::topology::Machine { nr_cpus: 2, mem_total: 1 << 30 };
        let topo = zonal::Topology::parse_for("nodes=2,size=16M,cpus=0-1:", machine).unwrap();
        let z = std::sync::Arc::new(zonal::Zonal::new(zonal::Config::new(topo)).unwrap());
        let cfg = || crate::Config { scan_delay_ms: 3_600_000, ..Default::default() };
        let env = |k: &str| match k {
            "ZONAL_NUMA_BALANCING" => Some("2".to_string()),
            "ZONAL_NUMA_BALANCING_HOT_THRESHOLD_MS" => Some("250".to_string()),
            "ZONAL_DEMOTION_ENABLED" => Some("true".to_string()),
            _ => None,
        };
        let b = crate::Balancer::with_env(z.clone(), cfg(), env).unwrap();
        let got: Vec<String> = TUNABLES.iter().map(|t| b.sysctl_get(t.name).unwrap()).collect();
        assert_eq!(got, ["2", "250", "65536", "1"]);
        drop(b);
        let bad = |k: &str| (k == "ZONAL_NUMA_BALANCING").then(|| "5".to_string());
        let e = crate::Balancer::with_env(z.clone(), cfg(), bad).err().expect("refused").to_string();
        assert!(e.contains("ZONAL_NUMA_BALANCING: numa_balancing: `5` is not valid"), "{e}");
        // The refused balancer left no tunables or counters behind in the handle.
        let e = z.sysctl_get("numa_balancing").unwrap_err().to_string();
        assert!(e.contains("unknown tunable `numa_balancing`"), "{e}");
    }

    #[test]
    fn values_are_checked_against_the_table() {
        assert_eq!(parse("numa_balancing", " 3 ").unwrap(), 3);
        assert_eq!(parse("demotion_enabled", "true").unwrap(), 1);
        assert_eq!(parse("numa_balancing_promote_rate_limit_MBps", "0").unwrap(), 0);
        let e = parse("numa_balancing", "4").unwrap_err().to_string();
        assert!(e.contains("0 (off), 1 (normal), 2 (memory tiering) or 3 (both)"), "{e}");
        let e = parse("numa_balancing_hot_threshold_ms", "-5").unwrap_err().to_string();
        assert!(e.contains("ms from 0 to 4294967295"), "{e}");
        assert!(parse("demotion_enabled", "2").unwrap_err().to_string().contains("0 or 1"));
        let e = parse("numa_balancing_colour", "1").unwrap_err().to_string();
        assert!(e.contains("unknown balancer tunable") && e.contains("demotion_enabled"), "{e}");
    }
}
