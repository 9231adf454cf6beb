//! Reports in the layouts of Linux's `/proc/zoneinfo` and `/proc/buddyinfo`, and the same
//! figures as JSON.
//!
//! Kernel counterpart: `zoneinfo_show_print` and `frag_show_print` (mm/vmstat.c). The text
//! keeps the kernel's field widths (`Node %d, zone %8s`, `%6lu` per order) so that parsers
//! written for the kernel files read these. Values are read without stopping allocation, as
//! the kernel's are: each is exact at the moment it is read.

use crate::page_alloc::Zonal;
use crate::vmstat::{NumaStat, ZoneStatItem};
use crate::zone::{Watermark, Zone};
use crate::NodeId;
use serde::Serialize;
use std::fmt::Write;

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
    /// The NUMA counters by name, when the report reads them (zoneinfo, JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<std::collections::BTreeMap<&'static str, u64>>,
}

impl ZoneStat {
    fn of(z: &Zone) -> ZoneStat {
        ZoneStat {
            node: z.node.0,
            zone: z.kind.name(),
            pages_free: z.page_state_snapshot(ZoneStatItem::NrFreePages),
            min: z.watermark(Watermark::Min),
            low: z.watermark(Watermark::Low),
            high: z.watermark(Watermark::High),
            promo: z.watermark(Watermark::Promo),
            spanned: z.spanned,
            present: z.present,
            managed: z.managed,
            start_pfn: z.start_pfn.0,
            free_blocks: z.free_blocks(),
            numa: None,
        }
    }
}

impl Zonal {
    /// The figures of every zone.
    pub fn zone_stats(&self) -> Vec<ZoneStat> {
        self.zones().iter().map(ZoneStat::of).collect()
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

    /// `/proc/zoneinfo`, with the NUMA counters after the zone items as seed 000 prints them.
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
            let _ = write!(s, "\n      {:<12} {}", "nr_free_pages", z.pages_free);
            for n in NumaStat::ALL {
                let v = z.numa.as_ref().and_then(|m| m.get(n.name()).copied()).unwrap_or(0);
                let _ = write!(s, "\n      {:<12} {}", n.name(), v);
            }
            let _ = write!(s, "\n  node_unreclaimable:  0\n  start_pfn:           {}\n", z.start_pfn);
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

/// One zone of a parsed zoneinfo: node, zone name, `(field, value)` in file order.
pub type ParsedZone = (u16, String, Vec<(String, u64)>);

/// Parses `/proc/zoneinfo` text into one map of `field -> value` per zone, keyed as the
/// kernel file's readers key it (`pages free`, `min`, `nr_free_pages`, ...).
pub fn parse_zoneinfo(text: &str) -> Vec<ParsedZone> {
    let mut out: Vec<ParsedZone> = Vec::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("Node ") {
            if let Some((n, z)) = rest.split_once(", zone ") {
                out.push((n.parse().unwrap_or(u16::MAX), z.trim().to_string(), Vec::new()));
                continue;
            }
        }
        let Some(cur) = out.last_mut() else { continue };
        let t = l.trim();
        if t.starts_with("protection:") {
            continue;
        }
        let t = t.trim_end_matches(':');
        if let Some(pos) = t.rfind(|c: char| c.is_whitespace() || c == ':') {
            let (k, v) = t.split_at(pos);
            if let Ok(v) = v.trim_start_matches(':').trim().parse::<u64>() {
                cur.2.push((k.trim().trim_end_matches(':').to_string(), v));
            }
        }
    }
    out
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
        let get = |i: usize, k: &str| zones[i].2.iter().find(|(f, _)| f == k).map(|(_, v)| *v);
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
