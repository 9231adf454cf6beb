//! The configuration an allocator is built from: topology, block sizes, memory options and
//! the boot-time values of the watermark tunables.
//!
//! As a string (the C ABI and the CLI take one): `;`-separated `key=value` items, e.g.
//! `topology=nodes=2,size=16M;max_order=10;populate=1`. The topology value is a topology
//! spec (see [`crate::topology`]) or `sys` for the real machine. Keys that are also tunables
//! carry the tunable's name (`stat_interval`; `stat_interval_ms`, its first name, stays
//! accepted). Every key is documented for C users at `zonal_create` in `crate::ffi`: keep
//! that list and [`Config::parse`]'s in step.

use crate::arena::ArenaOptions;
use crate::error::{Error, Result};
use crate::topology::Topology;
use crate::types::{DEFAULT_MAX_ORDER, MAX_ORDER_LIMIT};
use crate::zone::DEFAULT_WATERMARK_SCALE_FACTOR;

/// A flag's value: 1, true, yes or on; 0, false, no or off.
pub(crate) fn parse_flag(v: &str) -> Option<bool> {
    match v {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Everything an allocator is built from.
#[derive(Clone, Debug)]
pub struct Config {
    /// The machine: real or fake.
    pub topology: Topology,
    /// Largest block order (`MAX_ORDER`, default 10: 4 MiB blocks).
    pub max_order: u8,
    /// How the memory is set up.
    pub arena: ArenaOptions,
    /// `min_free_kbytes`; `None` computes Linux's default from the memory size.
    pub min_free_kbytes: Option<u64>,
    /// `watermark_scale_factor` (default 10, at most 3000).
    pub watermark_scale_factor: u32,
    /// Per-CPU page lists on (default) or off (every allocation takes the zone lock).
    pub pcp: bool,
    /// Publish the handle for live introspection ([`crate::live`]) when it is built as a
    /// shared handle ([`crate::Zonal::shared`], the C ABI's `zonal_create`). Key `publish`;
    /// the environment variable `ZONAL_PUBLISH=1` turns it on too. Default off.
    pub publish: bool,
    /// `percpu_pagelist_high_fraction`: 0 (default, `high` tunes itself) or at least 8.
    pub percpu_pagelist_high_fraction: u32,
    /// How often the background worker folds the zone counters and decays idle pcps
    /// (`stat_interval`, default 1 s).
    pub stat_interval: std::time::Duration,
}

impl Config {
    /// Defaults for a topology.
    pub fn new(topology: Topology) -> Config {
        Config {
            topology,
            max_order: DEFAULT_MAX_ORDER,
            arena: ArenaOptions::default(),
            min_free_kbytes: None,
            watermark_scale_factor: DEFAULT_WATERMARK_SCALE_FACTOR,
            pcp: true,
            publish: false,
            percpu_pagelist_high_fraction: 0,
            stat_interval: std::time::Duration::from_secs(1),
        }
    }

    /// Turns the per-CPU page lists on or off.
    pub fn pcp(mut self, on: bool) -> Config {
        self.pcp = on;
        self
    }

    /// Sets the largest order.
    pub fn max_order(mut self, max_order: u8) -> Config {
        self.max_order = max_order;
        self
    }

    /// Parses a config string (see the module docs). `topology` is required.
    pub fn parse(s: &str) -> Result<Config> {
        let mut topo = None;
        let mut rest = Vec::new();
        for item in s.split([';', '\n']).map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| Error::InvalidConfig(format!("config: `{item}` is not of the form key=value")))?;
            match k.trim() {
                "topology" => topo = Some(Topology::from_arg(v.trim())?),
                _ => rest.push((k.trim().to_string(), v.trim().to_string())),
            }
        }
        let topo = topo.ok_or_else(|| Error::InvalidConfig("config: `topology=` is required".into()))?;
        let mut c = Config::new(topo);
        for (k, v) in rest {
            let num = |v: &str| -> Result<u64> {
                v.parse().map_err(|_| Error::InvalidConfig(format!("config `{k}`: `{v}` is not a number")))
            };
            let flag = |v: &str| -> Result<bool> {
                parse_flag(v).ok_or_else(|| Error::InvalidConfig(format!("config `{k}`: `{v}` is not 0 or 1")))
            };
            match k.as_str() {
                "max_order" => c.max_order = u8::try_from(num(&v)?).unwrap_or(u8::MAX),
                "publish" => c.publish = flag(&v)?,
                "populate" => c.arena.populate = flag(&v)?,
                "mlock" => c.arena.mlock = flag(&v)?,
                "thp" => c.arena.thp = flag(&v)?,
                "min_free_kbytes" => c.min_free_kbytes = Some(num(&v)?),
                "watermark_scale_factor" => c.watermark_scale_factor = u32::try_from(num(&v)?).unwrap_or(u32::MAX),
                "pcp" => c.pcp = flag(&v)?,
                "percpu_pagelist_high_fraction" => {
                    c.percpu_pagelist_high_fraction = u32::try_from(num(&v)?).unwrap_or(u32::MAX)
                }
                "stat_interval" | "stat_interval_ms" => c.stat_interval = std::time::Duration::from_millis(num(&v)?),
                _ => {
                    return Err(Error::InvalidConfig(format!(
                        "config: unknown key `{k}`; valid keys: topology, max_order, populate, mlock, thp, \
                         min_free_kbytes, watermark_scale_factor, pcp, percpu_pagelist_high_fraction, stat_interval, publish"
                    )))
                }
            }
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks the values that do not depend on the memory being mapped.
    pub fn validate(&self) -> Result<()> {
        if self.max_order > MAX_ORDER_LIMIT {
            return Err(Error::InvalidConfig(format!(
                "config `max_order`: {} is above the limit {MAX_ORDER_LIMIT}",
                self.max_order
            )));
        }
        // The run-time tunables among these are bounded where sysctl bounds them.
        let config = |e: Error| Error::InvalidConfig(format!("config {e}"));
        crate::tunables::check("watermark_scale_factor", self.watermark_scale_factor as u64).map_err(config)?;
        crate::tunables::check("percpu_pagelist_high_fraction", self.percpu_pagelist_high_fraction as u64)
            .map_err(config)?;
        crate::tunables::check("stat_interval", self.stat_interval.as_millis().try_into().unwrap_or(u64::MAX))
            .map_err(config)?;
        if let Some(m) = self.min_free_kbytes {
            crate::tunables::check("min_free_kbytes", m).map_err(config)?;
        }
        Ok(())
    }
}

/// What `ZONAL_PUBLISH` asks: unset or empty is off, else a flag as the config key `publish`
/// takes it (an invalid value is an error). A program that builds its handles itself reads
/// it here, as the `zonal` command does.
pub fn publish_from_env() -> Result<bool> {
    match std::env::var("ZONAL_PUBLISH").as_deref() {
        Err(_) | Ok("") => Ok(false),
        Ok(v) => parse_flag(v)
            .ok_or_else(|| Error::InvalidConfig(format!("ZONAL_PUBLISH=`{v}`: use 1 to publish, 0 not to"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_config_string() {
        let c = Config::parse("topology=nodes=2,size=8M;max_order=5;populate=1;watermark_scale_factor=100").unwrap();
        assert_eq!(c.topology.nr_nodes(), 2);
        assert_eq!(c.max_order, 5);
        assert!(c.arena.populate);
        assert_eq!(c.watermark_scale_factor, 100);
    }

    #[test]
    fn rejects_bad_configs() {
        let e = |s: &str| Config::parse(s).unwrap_err().to_string();
        assert!(e("max_order=3").contains("`topology=` is required"));
        assert!(e("topology=nodes=1,size=4M;max_order=16").contains("above the limit"));
        assert!(e("topology=nodes=1,size=4M;colour=red").contains("unknown key `colour`"));
        assert!(e("topology=nodes=1,size=4M;populate=maybe").contains("not 0 or 1"));
        assert!(e("topology=nodes=1,size=4M;watermark_scale_factor=0").contains("0 is out of range; valid: 1..=3000"));
        assert!(e("topology=nodes=1,size=4M;junk").contains("key=value"));
    }
}
