//! Reports in the layouts of Linux's `/proc/zoneinfo`, `/proc/vmstat`, `/proc/buddyinfo` and
//! `nodeN/numastat`, the same figures as JSON, and the Prometheus text exposition.
//!
//! Kernel counterpart: `zoneinfo_show_print`, `vmstat_show`, `frag_show_print` (mm/vmstat.c),
//! `node_read_numastat` (drivers/base/node.c). The text keeps the kernel's field widths
//! (`Node %d, zone %8s`, `%-12s %lu` per item, `%6lu` per order) so that parsers written for
//! the kernel files read these. Values are read without stopping allocation, as the kernel's
//! are. Zone counters are printed as snapshots (every CPU's unfolded diff added, see
//! [`crate::vmstat`]), so a report taken once allocation stops is exact; the kernel prints the
//! folded value, which the JSON also carries (`items_folded`).

use crate::page_alloc::Zonal;
use crate::vmstat::{NumaStat, VmEvent, ZoneStatItem, NR_ALLOCATED_NAME};
use crate::zone::{Watermark, Zone};
use crate::NodeId;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

/// One CPU's lists for a zone, as zoneinfo's `pagesets` prints them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pageset {
    /// CPU.
    pub cpu: usize,
    /// Frames on the lists (the rseq cache included).
    pub count: usize,
    /// Drain threshold.
    pub high: usize,
    /// Refill and drain unit.
    pub batch: usize,
    /// `vm stats threshold`: the zone-counter diff this CPU folds at.
    pub stat_threshold: usize,
}

/// The figures of one zone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ZoneStat {
    /// Node id.
    pub node: u16,
    /// Zone name (`Normal`).
    pub zone: &'static str,
    /// Free frames.
    pub pages_free: usize,
    /// `min` watermark.
    pub min: usize,
    /// `low` watermark.
    pub low: usize,
    /// `high` watermark.
    pub high: usize,
    /// `promo` watermark.
    pub promo: usize,
    /// Spanned frames.
    pub spanned: usize,
    /// Present frames.
    pub present: usize,
    /// Managed frames.
    pub managed: usize,
    /// First frame.
    pub start_pfn: usize,
    /// Free blocks per order, `0..=max_order`.
    pub free_blocks: Vec<usize>,
    /// The zone counters by name, as snapshots (`nr_free_pages`, `nr_zone_pcp_pages`,
    /// `nr_zone_allocated`, `nr_free_order_<k>`), in report order.
    pub items: Vec<(String, usize)>,
    /// The zone counters as folded (what the fast paths read), in the same order.
    pub items_folded: Vec<(String, usize)>,
    /// Whether the pressure threshold is in force.
    pub under_pressure: bool,
    /// `percpu_drift_mark` (0: none).
    pub percpu_drift_mark: usize,
    /// Per CPU: the lists' count, high, batch, and the stat threshold.
    pub pagesets: Vec<Pageset>,
    /// The NUMA counters by name, when the report reads them (zoneinfo, JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<BTreeMap<&'static str, u64>>,
}

impl Zonal {
    fn zone_stat(&self, z: &Zone) -> ZoneStat {
        let snap = |i| self.zone_page_state_snapshot(z.id, i).unwrap_or(0);
        let folded = |i| z.page_state(i);
        let mut items = Vec::new();
        let mut items_folded = Vec::new();
        for item in ZoneStatItem::all(z.max_order) {
            items.push((item.name(), snap(item)));
            items_folded.push((item.name(), folded(item)));
            if item == ZoneStatItem::NrPcpPages {
                // The derived item, after the two it derives from.
                items.push((NR_ALLOCATED_NAME.into(), self.zone_allocated_pages(z.id).unwrap_or(0)));
                let f = z.managed.saturating_sub(folded(ZoneStatItem::NrFreePages) + folded(ZoneStatItem::NrPcpPages));
                items_folded.push((NR_ALLOCATED_NAME.into(), f));
            }
        }
        let pagesets = (0..self.nr_cpus())
            .filter_map(|cpu| {
                let p = self.pcp_info(cpu, z.id)?;
                Some(Pageset {
                    cpu,
                    count: p.count,
                    high: p.high,
                    batch: p.batch,
                    stat_threshold: z.stat_threshold(cpu),
                })
            })
            .collect();
        ZoneStat {
            node: z.node.0,
            zone: z.kind.name(),
            pages_free: snap(ZoneStatItem::NrFreePages),
            min: z.watermark(Watermark::Min),
            low: z.watermark(Watermark::Low),
            high: z.watermark(Watermark::High),
            promo: z.watermark(Watermark::Promo),
            spanned: z.spanned,
            present: z.present,
            managed: z.managed,
            start_pfn: z.start_pfn.0,
            free_blocks: z.free_blocks(),
            items,
            items_folded,
            under_pressure: z.under_pressure(),
            percpu_drift_mark: z.percpu_drift_mark(),
            pagesets,
            numa: None,
        }
    }

    /// The figures of every zone.
    pub fn zone_stats(&self) -> Vec<ZoneStat> {
        self.zones().iter().map(|z| self.zone_stat(z)).collect()
    }

    /// The figures of every zone with their NUMA counters (a read of them: in `auto` mode it
    /// turns counting on).
    pub fn zone_stats_with_numa(&self) -> Vec<ZoneStat> {
        let mut v = self.zone_stats();
        for (st, z) in v.iter_mut().zip(self.zones()) {
            st.numa = Some(NumaStat::ALL.iter().map(|&n| (n.name(), self.numa_stat(z.id, n))).collect());
        }
        v
    }

    /// `/proc/zoneinfo` (Linux 6.x): per zone the header, free pages and watermarks, the
    /// zone items, then the NUMA items after them as seed 000 prints them, then the pagesets
    /// with each CPU's `vm stats threshold`.
    pub fn zoneinfo(&self) -> String {
        let mut s = String::new();
        for z in self.zone_stats_with_numa() {
            let _ = write!(s, "Node {}, zone {:>8}", z.node, z.zone);
            let _ = write!(
                s,
                "\n  pages free     {}\n        boost    0\n        min      {}\n        low      {}\
                 \n        high     {}\n        promo    {}\n        spanned  {}\n        present  {}\
                 \n        managed  {}\n        cma      0\n        protection: (0)",
                z.pages_free, z.min, z.low, z.high, z.promo, z.spanned, z.present, z.managed
            );
            for (name, v) in &z.items {
                let _ = write!(s, "\n      {name:<12} {v}");
            }
            for n in NumaStat::ALL {
                let v = z.numa.as_ref().and_then(|m| m.get(n.name()).copied()).unwrap_or(0);
                let _ = write!(s, "\n      {:<12} {}", n.name(), v);
            }
            s.push_str("\n  pagesets");
            for p in &z.pagesets {
                let _ = write!(
                    s,
                    "\n    cpu: {}\n              count: {}\n              high:  {}\n              batch: {}\
                     \n  vm stats threshold: {}",
                    p.cpu, p.count, p.high, p.batch, p.stat_threshold
                );
            }
            let _ = write!(s, "\n  node_unreclaimable:  0\n  start_pfn:           {}\n", z.start_pfn);
        }
        s
    }

    /// Every counter of `/proc/vmstat`, in its order: the zone items summed over zones (as
    /// snapshots), the NUMA items, then the events. A read of the NUMA counters.
    pub fn vmstat_items(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for item in ZoneStatItem::all(self.max_order()) {
            out.push((item.name(), self.global_page_state_snapshot(item) as u64));
            if item == ZoneStatItem::NrPcpPages {
                let allocated: usize = self.zones().iter().map(|z| self.zone_allocated_pages(z.id).unwrap_or(0)).sum();
                out.push((NR_ALLOCATED_NAME.into(), allocated as u64));
            }
        }
        for n in NumaStat::ALL {
            let v = self.zones().iter().map(|z| self.numa_stat(z.id, n)).fold(0u64, u64::wrapping_add);
            out.push((n.name().into(), v));
        }
        for e in VmEvent::ALL {
            out.push((e.name().into(), self.event(e)));
        }
        out
    }

    /// One `/proc/vmstat` counter by name.
    pub fn vmstat_value(&self, name: &str) -> crate::Result<u64> {
        let items = self.vmstat_items();
        items.iter().find(|(n, _)| n == name).map(|(_, v)| *v).ok_or_else(|| {
            let names: Vec<&str> = items.iter().map(|(n, _)| n.as_str()).collect();
            crate::Error::InvalidConfig(format!("unknown vmstat counter `{name}`; counters: {}", names.join(", ")))
        })
    }

    /// `/proc/vmstat`: `name value` per line.
    pub fn vmstat(&self) -> String {
        self.vmstat_items().into_iter().map(|(n, v)| format!("{n} {v}\n")).collect()
    }

    /// The vmstat counters as a JSON object, in file order.
    pub fn vmstat_json(&self) -> String {
        let body: Vec<String> =
            self.vmstat_items().into_iter().map(|(n, v)| format!("  {}: {v}", serde_json::Value::String(n))).collect();
        format!("{{\n{}\n}}", body.join(",\n"))
    }

    /// Every counter in the Prometheus text exposition format, named as node_exporter's
    /// vmstat and zoneinfo collectors name theirs, under the `zonal` namespace:
    /// `zonal_vmstat_<name>` (untyped, as node_exporter's), and per zone
    /// `zonal_zoneinfo_<field>{node, zone}` (`*_pages` gauges for the watermarks and sizes,
    /// the zone items, `numa_*_total` counters) and per CPU and zone
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

    /// `/proc/buddyinfo`.
    pub fn buddyinfo(&self) -> String {
        let mut s = String::new();
        for z in self.zone_stats() {
            let _ = write!(s, "Node {}, zone {:>8} ", z.node, z.zone);
            for n in &z.free_blocks {
                let _ = write!(s, "{n:>6} ");
            }
            s.push('\n');
        }
        s
    }

    /// The zone figures as JSON (an array of [`ZoneStat`], NUMA counters included).
    pub fn zone_stats_json(&self) -> String {
        serde_json::to_string_pretty(&self.zone_stats_with_numa()).expect("zone stats serialize")
    }

    /// `/sys/devices/system/node/nodeN/numastat`: one `name value` per line.
    pub fn numastat_node(&self, nid: NodeId) -> crate::Result<String> {
        let v = self.node_numa_stats(nid)?;
        Ok(NumaStat::ALL.iter().zip(v).map(|(n, x)| format!("{} {x}\n", n.numastat_name())).collect())
    }

    /// The table of the `numastat` command: a row per counter, a column per node.
    pub fn numastat(&self) -> String {
        let nodes: Vec<[u64; crate::vmstat::NR_NUMA_STATS]> = (0..self.topology().nr_nodes())
            .map(|n| self.node_numa_stats(NodeId(n as u16)).expect("node exists"))
            .collect();
        let mut s = format!("{:15}", "");
        for n in 0..nodes.len() {
            let _ = write!(s, "{:>16}", format!("node{n}"));
        }
        s.push('\n');
        for (i, stat) in NumaStat::ALL.iter().enumerate() {
            let _ = write!(s, "{:<15}", stat.numastat_name());
            for node in &nodes {
                let _ = write!(s, "{:>16}", node[i]);
            }
            s.push('\n');
        }
        s
    }

    /// Every node's NUMA counters as JSON: `{"node0": {"numa_hit": N, ...}, ...}`.
    pub fn numastat_json(&self) -> String {
        let mut m = serde_json::Map::new();
        for n in 0..self.topology().nr_nodes() {
            let v = self.node_numa_stats(NodeId(n as u16)).expect("node exists");
            let node: serde_json::Map<String, serde_json::Value> =
                NumaStat::ALL.iter().zip(v).map(|(s, x)| (s.numastat_name().to_string(), x.into())).collect();
            m.insert(format!("node{n}"), node.into());
        }
        serde_json::to_string_pretty(&serde_json::Value::Object(m)).expect("numastat serializes")
    }
}

/// Parses `/proc/buddyinfo` text back into (node, zone, free blocks per order); used by tests
/// and by scripts that compare runs.
pub fn parse_buddyinfo(text: &str) -> Option<Vec<(u16, String, Vec<usize>)>> {
    text.lines()
        .map(|l| {
            let rest = l.strip_prefix("Node ")?;
            let (node, rest) = rest.split_once(", zone ")?;
            let mut it = rest.split_whitespace();
            let zone = it.next()?.to_string();
            let counts = it.map(|c| c.parse().ok()).collect::<Option<Vec<usize>>>()?;
            Some((node.parse().ok()?, zone, counts))
        })
        .collect()
}

/// One zone of a parsed zoneinfo.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedZone {
    /// Node id.
    pub node: u16,
    /// Zone name.
    pub zone: String,
    /// `(field, value)` in file order, outside the pagesets (`pages free`, `min`,
    /// `nr_free_pages`, `numa_hit`, `start_pfn`, ...).
    pub fields: Vec<(String, u64)>,
    /// The pagesets: `(cpu, count, high, batch, vm stats threshold)`.
    pub pagesets: Vec<(u64, u64, u64, u64, u64)>,
}

impl ParsedZone {
    /// A field's value.
    pub fn get(&self, field: &str) -> Option<u64> {
        self.fields.iter().find(|(f, _)| f == field).map(|(_, v)| *v)
    }
}

/// Parses `/proc/zoneinfo` text, the way the kernel file's readers do: a zone starts at
/// `Node N, zone NAME`; every other line is `name value` (or `name: value`); the lines
/// between `pagesets` and `node_unreclaimable` belong to the pagesets.
pub fn parse_zoneinfo(text: &str) -> Vec<ParsedZone> {
    let mut out: Vec<ParsedZone> = Vec::new();
    let mut in_pagesets = false;
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("Node ") {
            if let Some((n, z)) = rest.split_once(", zone ") {
                out.push(ParsedZone {
                    node: n.parse().unwrap_or(u16::MAX),
                    zone: z.trim().to_string(),
                    ..Default::default()
                });
                in_pagesets = false;
                continue;
            }
        }
        let Some(cur) = out.last_mut() else { continue };
        let t = l.trim();
        if t == "pagesets" {
            in_pagesets = true;
            continue;
        }
        if t.starts_with("protection:") {
            continue;
        }
        let Some((k, v)) = t.rsplit_once(|c: char| c.is_whitespace() || c == ':') else { continue };
        let k = k.trim().trim_end_matches(':');
        let Ok(v) = v.trim().parse::<u64>() else { continue };
        if k == "node_unreclaimable" {
            in_pagesets = false;
        }
        if !in_pagesets {
            cur.fields.push((k.to_string(), v));
            continue;
        }
        match k {
            "cpu" => cur.pagesets.push((v, 0, 0, 0, 0)),
            _ => {
                let Some(p) = cur.pagesets.last_mut() else { continue };
                match k {
                    "count" => p.1 = v,
                    "high" => p.2 = v,
                    "batch" => p.3 = v,
                    "vm stats threshold" => p.4 = v,
                    _ => {}
                }
            }
        }
    }
    out
}

/// Parses `/proc/vmstat` (or `nodeN/numastat`) text: `name value` per line.
pub fn parse_name_values(text: &str) -> Option<Vec<(String, u64)>> {
    text.lines()
        .map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// Parses Prometheus text exposition into `(metric name with labels, value)` samples,
/// checking that every sample follows a `# TYPE` line of its family.
pub fn parse_prometheus(text: &str) -> Option<Vec<(String, f64)>> {
    let mut typed: Option<String> = None;
    let mut out = Vec::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            typed = Some(rest.split_whitespace().next()?.to_string());
            continue;
        }
        if l.starts_with('#') || l.is_empty() {
            continue;
        }
        let (series, v) = l.rsplit_once(' ')?;
        let name = series.split('{').next()?;
        if typed.as_deref() != Some(name) {
            return None;
        }
        out.push((series.to_string(), v.parse().ok()?));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Machine, Topology};
    use crate::{Config, Gfp, NodeId};

    fn zonal() -> Zonal {
        let t = Topology::parse_for("nodes=2,sizes=8M:12M", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
        Zonal::new(Config::new(t).pcp(false)).unwrap()
    }

    #[test]
    fn buddyinfo_parses_back() {
        let z = zonal();
        let p = z.alloc_pages_node(NodeId(1), Gfp::THISNODE, 2).unwrap();
        let text = z.buddyinfo();
        assert!(text.starts_with("Node 0, zone   Normal      0 "), "{text}");
        let parsed = parse_buddyinfo(&text).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0], (0, "Normal".to_string(), vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]));
        // Node 1: three 4M blocks, one split down to order 2 (one 2-block taken).
        assert_eq!(parsed[1].2, vec![0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2]);
        z.free_pages(p.as_ptr(), 2).unwrap();
        assert_eq!(parse_buddyinfo(&z.buddyinfo()).unwrap()[1].2[10], 3);
    }

    #[test]
    fn zoneinfo_parses_back() {
        let z = zonal();
        let _p = z.alloc_pages_node(NodeId(0), Gfp::THISNODE, 0).unwrap();
        let zones = parse_zoneinfo(&z.zoneinfo());
        assert_eq!(zones.len(), 2);
        let get = |i: usize, k: &str| zones[i].get(k);
        assert_eq!(get(0, "pages free"), Some(2047));
        assert_eq!(get(0, "nr_free_pages"), Some(2047));
        assert_eq!(get(1, "managed"), Some(3072));
        assert_eq!(get(1, "spanned"), Some(3072));
        assert_eq!(get(1, "start_pfn"), Some(2048));
        let stats = z.zone_stats();
        assert_eq!(get(0, "min"), Some(stats[0].min as u64));
        assert_eq!(get(0, "low"), Some(stats[0].low as u64));
        assert_eq!(get(0, "high"), Some(stats[0].high as u64));
        assert!(stats[0].min < stats[0].low && stats[0].low < stats[0].high);
        let json: Vec<serde_json::Value> = serde_json::from_str(&z.zone_stats_json()).unwrap();
        assert_eq!(json[1]["free_blocks"][10], 3);
    }
}
