//! The Prometheus text exposition, named as node_exporter's vmstat and zoneinfo collectors
//! name their metrics.

use super::{Pageset, ZoneStat};
use crate::page_alloc::Zonal;
use crate::vmstat::NumaStat;
use std::fmt::Write;

impl Zonal {
    /// Every counter in the Prometheus text exposition format, named as node_exporter's
    /// vmstat and zoneinfo collectors name theirs, under the `zonal` namespace:
    /// `zonal_vmstat_<name>` (untyped, as node_exporter's), and per zone
    /// `zonal_zoneinfo_<field>{node, zone}` (`*_pages` gauges for the watermarks and sizes,
    /// the zone items, `numa_*_total` counters, zonal's `transfer_pages`) and per CPU and zone
    /// `zonal_zoneinfo_pageset_{count,high,batch}` and `zonal_zoneinfo_stat_threshold`.
    pub fn prometheus(&self) -> String {
        let mut s = String::new();
        for (n, v) in self.vmstat_items() {
            let _ = write!(
                s,
                "# HELP zonal_vmstat_{n} /proc/vmstat information field {n}.\n# TYPE zonal_vmstat_{n} untyped\n\
                 zonal_vmstat_{n} {v}\n"
            );
        }
        let zones = self.zone_stats_with_numa();
        let labels = |z: &ZoneStat| format!("node=\"{}\",zone=\"{}\"", z.node, z.zone);
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
            let _ = write!(s, "# HELP zonal_zoneinfo_{name} {help}\n# TYPE zonal_zoneinfo_{name} {kind}\n");
            for (l, v) in samples {
                let _ = writeln!(s, "zonal_zoneinfo_{name}{{{l}}} {v}");
            }
        };
        type Field = (&'static str, fn(&ZoneStat) -> usize);
        let fields: [Field; 7] = [
            ("min_pages", |z| z.min),
            ("low_pages", |z| z.low),
            ("high_pages", |z| z.high),
            ("promo_pages", |z| z.promo),
            ("spanned_pages", |z| z.spanned),
            ("present_pages", |z| z.present),
            ("managed_pages", |z| z.managed),
        ];
        for (name, get) in fields {
            let help = format!("Zone information field {}.", name.trim_end_matches("_pages"));
            family(name, "gauge", &help, zones.iter().map(|z| (labels(z), get(z) as u64)).collect());
        }
        let transfer = zones.iter().map(|z| (labels(z), z.transfer as u64)).collect();
        family("transfer_pages", "gauge", "Frames on the zone's transfer list (zonal's).", transfer);
        let item_names: Vec<String> =
            zones.first().map(|z| z.items.iter().map(|(n, _)| n.clone()).collect()).unwrap_or_default();
        for (i, name) in item_names.iter().enumerate() {
            let samples = zones.iter().filter_map(|z| Some((labels(z), z.items.get(i)?.1 as u64))).collect();
            family(name, "gauge", &format!("Zone information field {name}."), samples);
        }
        for n in NumaStat::ALL {
            let samples = zones
                .iter()
                .map(|z| (labels(z), z.numa.as_ref().and_then(|m| m.get(n.name()).copied()).unwrap_or(0)))
                .collect();
            family(&format!("{}_total", n.name()), "counter", &format!("Zone NUMA counter {}.", n.name()), samples);
        }
        type PerCpu = (&'static str, &'static str, fn(&Pageset) -> usize);
        let per_cpu: [PerCpu; 4] = [
            ("pageset_count", "Frames on the CPU's lists for the zone.", |p| p.count),
            ("pageset_high", "The CPU's lists' high.", |p| p.high),
            ("pageset_batch", "The CPU's lists' batch.", |p| p.batch),
            ("stat_threshold", "The zone-counter diff the CPU folds at (vm stats threshold).", |p| p.stat_threshold),
        ];
        for (name, help, get) in per_cpu {
            let samples = zones
                .iter()
                .flat_map(|z| {
                    z.pagesets.iter().map(move |p| (format!("{},cpu=\"{}\"", labels(z), p.cpu), get(p) as u64))
                })
                .collect();
            family(name, "gauge", help, samples);
        }
        s
    }
}
