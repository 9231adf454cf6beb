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

//!
//! One file per format: the figures are gathered here ([`ZoneStat`], JSON), the
//! `/proc`-style text is in `proc`, the Prometheus exposition in `prometheus`, and the parsers
//! the tests and scripts use in `parse`.

mod parse;
mod proc;
mod prometheus;

pub use parse::{parse_buddyinfo, parse_name_values, parse_prometheus, parse_zoneinfo, ParsedZone};

use crate::page_alloc::Zonal;
use crate::types::Order;
use crate::vmstat::{NumaStat, ZoneStatItem, NR_ALLOCATED_NAME};
use crate::zone::{Watermark, Zone};
use serde::Serialize;
use std::collections::BTreeMap;

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
    /// Frames on the zone's transfer list, between one CPU's drain and another's refill
    /// (zonal's; counted in `nr_zone_pcp_pages`, in no CPU's pageset).
    pub transfer: usize,
    /// Per CPU: the lists' count, high, batch, and the stat threshold.
    pub pagesets: Vec<Pageset>,
    /// The NUMA counters by name, when the report reads them (zoneinfo, JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<BTreeMap<&'static str, u64>>,
}

impl Zonal {
    /// One zone's figures; the caller holds [`Zonal::settled`].
    fn zone_stat(&self, z: &Zone) -> ZoneStat {
        let snap = |i| self.snapshot(z, i);
        // The THP lists' frames are no part of the pcp counter; its readers add them.
        let folded = |i| z.page_state(i) + if i == ZoneStatItem::NrPcpPages { self.thp_on_lists(z.id) } else { 0 };
        let mut items = Vec::new();
        let mut items_folded = Vec::new();
        for item in ZoneStatItem::all(z.max_order) {
            items.push((item.name(), snap(item)));
            items_folded.push((item.name(), folded(item)));
            if item == ZoneStatItem::NrPcpPages {
                // The derived item, after the two it derives from.
                items.push((NR_ALLOCATED_NAME.into(), self.allocated(z)));
                let f = z.managed.saturating_sub(folded(ZoneStatItem::NrFreePages) + folded(ZoneStatItem::NrPcpPages));
                items_folded.push((NR_ALLOCATED_NAME.into(), f));
            }
        }
        // No allocator lock is taken (only `settled`, which holds off the housekeeping pass):
        // the pagesets as of their last unlock (plus the rseq caches) and the free blocks from
        // their counters, both exact once allocation stops, so that a report never holds up
        // an allocation (Linux's buddyinfo takes the zone lock).
        let pagesets = (0..self.nr_cpus())
            .filter_map(|cpu| {
                let (count, high, batch) = self.pageset_hint(cpu, z.id)?;
                Some(Pageset { cpu, count, high, batch, stat_threshold: z.stat_threshold(cpu) })
            })
            .collect();
        let free_blocks = (0..=z.max_order.0).map(|o| snap(ZoneStatItem::NrFreeOrder(Order(o)))).collect();
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
            free_blocks,
            items,
            items_folded,
            under_pressure: z.under_pressure(),
            percpu_drift_mark: z.percpu_drift_mark(),
            transfer: z.transfer().len_hint(),
            pagesets,
            numa: None,
        }
    }

    /// The figures of every zone.
    pub fn zone_stats(&self) -> Vec<ZoneStat> {
        let _settled = self.settled();
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

    /// The free blocks per order of every zone as JSON, `/proc/buddyinfo`'s figures:
    /// `[{"node": 0, "zone": "Normal", "free_blocks": [..]}, ..]`.
    pub fn buddyinfo_json(&self) -> String {
        let v: Vec<serde_json::Value> = self
            .zone_stats()
            .into_iter()
            .map(|z| serde_json::json!({ "node": z.node, "zone": z.zone, "free_blocks": z.free_blocks }))
            .collect();
        serde_json::to_string_pretty(&v).expect("buddyinfo serializes")
    }

    /// The zone figures as JSON (an array of [`ZoneStat`], NUMA counters included).
    pub fn zone_stats_json(&self) -> String {
        serde_json::to_string_pretty(&self.zone_stats_with_numa()).expect("zone stats serialize")
    }
}

impl Zonal {
    /// Each node's zonelist as the nodes of its zones, in fallback order.
    fn zonelist_nodes(&self) -> Vec<Vec<u16>> {
        (0..self.topology().nr_nodes())
            .map(|n| {
                self.zonelists(crate::NodeId(n as u16))
                    .map(|zl| zl.fallback.iter().map(|zid| self.zones()[zid.0 as usize].node.0).collect())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// The topology as `zonal topology` prints it: nodes, memory, CPUs, distances, each
    /// node's zonelist and the spec that rebuilds it.
    pub fn topology_text(&self) -> String {
        use std::fmt::Write;
        let t = self.topology();
        let mut s = t.describe();
        s.push_str("zonelists (nodes in fallback order):\n");
        for (n, order) in self.zonelist_nodes().iter().enumerate() {
            let order: Vec<String> = order.iter().map(u16::to_string).collect();
            let _ = writeln!(s, "node {n}: {}", order.join(" "));
        }
        let _ = writeln!(s, "spec: {}", t.to_spec());
        s
    }

    /// The topology as JSON: `{"topology": .., "spec": .., "zonelists": [[node, ..], ..]}`.
    pub fn topology_json(&self) -> String {
        let t = self.topology();
        let v = serde_json::json!({ "topology": t, "spec": t.to_spec(), "zonelists": self.zonelist_nodes() });
        serde_json::to_string_pretty(&v).expect("topology serializes")
    }
}
