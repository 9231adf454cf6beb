//! The `/proc` and `/sys` layouts: `/proc/zoneinfo`, `/proc/vmstat`, `/proc/buddyinfo`,
//! `nodeN/numastat` and the `numastat` command's table, with the kernel's field widths.

use crate::page_alloc::Zonal;
use crate::vmstat::{NumaStat, VmEvent, ZoneStatItem, NR_ALLOCATED_NAME};
use crate::NodeId;
use std::fmt::Write;

impl Zonal {
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
            let _ = write!(s, "\n  transfer       {}", z.transfer);
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
    /// snapshots), the NUMA items, the events, then the counters of the layers on this
    /// handle ([`Zonal::add_counter_source`]). A read of the NUMA counters.
    pub fn vmstat_items(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let settled = self.settled();
        for item in ZoneStatItem::all(self.max_order()) {
            out.push((item.name(), self.global_snapshot(item) as u64));
            if item == ZoneStatItem::NrPcpPages {
                let allocated: usize = self.zones().iter().map(|z| self.allocated(z)).sum();
                out.push((NR_ALLOCATED_NAME.into(), allocated as u64));
            }
        }
        // The layers' sources below may read the snapshots themselves.
        drop(settled);
        for n in NumaStat::ALL {
            let v = self.zones().iter().map(|z| self.numa_stat(z.id, n)).fold(0u64, u64::wrapping_add);
            out.push((n.name().into(), v));
        }
        for e in VmEvent::ALL {
            out.push((e.name().into(), self.event(e)));
        }
        out.extend(self.source_counters());
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
