//! The requests a published handle answers: one line, words separated by spaces.
//!
//! Every report of the `zonal` command, in the same layouts, and the tunables:
//! see [`REQUESTS`]. A reply body is the report's text exactly as the local command prints
//! it, so a parser of one reads the other.

use super::server::ServerStats;
use crate::page_alloc::Zonal;
use crate::types::NodeId;
use crate::vmstat::NumaStat;
use crate::zone::Watermark;
use std::sync::atomic::Ordering;

/// The requests, one per line with its arguments, as the `help` request prints them.
pub const REQUESTS: &str = "\
info                      pid, handle, command, nodes, CPUs and the server's counts (JSON)
zoneinfo [json]           /proc/zoneinfo layout, or the zone figures as JSON
buddyinfo [json]          /proc/buddyinfo layout, or its figures as JSON
vmstat [json|prometheus]  /proc/vmstat layout, JSON, or the Prometheus exposition
numastat [json]           the numastat command's table, or JSON per node
numastat node N [json]    nodeN/numastat layout, or its JSON
topology [json]           nodes, CPUs, distances and zonelists
sysctl all                every tunable, `name = value` per line
sysctl get NAME           one tunable's value
sysctl set NAME VALUE     sets a tunable (the old value stays if VALUE is refused), prints it
top                       one sample of the per-node figures `zonal top` shows (JSON)
help                      this list
";

/// Answers one request line: the reply body, or why not.
pub(crate) fn answer(z: &Zonal, line: &str, stats: &ServerStats) -> Result<String, String> {
    let words: Vec<&str> = line.split_ascii_whitespace().collect();
    let bad = || format!("unknown request `{}`; requests:\n{REQUESTS}", line.chars().take(80).collect::<String>());
    let json = |w: Option<&&str>| -> Result<bool, String> {
        match w {
            None => Ok(false),
            Some(&"json") => Ok(true),
            Some(_) => Err(bad()),
        }
    };
    match words.as_slice() {
        ["help"] => Ok(REQUESTS.to_string()),
        ["info"] => Ok(info(z, stats)),
        ["zoneinfo", rest @ ..] if rest.len() <= 1 => {
            Ok(if json(rest.first())? { z.zone_stats_json() + "\n" } else { z.zoneinfo() })
        }
        ["buddyinfo", rest @ ..] if rest.len() <= 1 => {
            Ok(if json(rest.first())? { z.buddyinfo_json() + "\n" } else { z.buddyinfo() })
        }
        ["vmstat"] => Ok(z.vmstat()),
        ["vmstat", "json"] => Ok(z.vmstat_json() + "\n"),
        ["vmstat", "prometheus"] => Ok(z.prometheus()),
        ["numastat", rest @ ..] if rest.len() <= 1 => {
            Ok(if json(rest.first())? { z.numastat_json() + "\n" } else { z.numastat() })
        }
        ["numastat", "node", n, rest @ ..] if rest.len() <= 1 => {
            let node: u16 = n.parse().map_err(|_| format!("numastat node `{n}`: not a node number"))?;
            let nid = NodeId(node);
            if json(rest.first())? {
                let v = z.node_numa_stats(nid).map_err(|e| e.to_string())?;
                let obj: serde_json::Map<String, serde_json::Value> =
                    NumaStat::ALL.iter().zip(v).map(|(s, x)| (s.numastat_name().to_string(), x.into())).collect();
                Ok(serde_json::to_string_pretty(&obj).map_err(|e| e.to_string())? + "\n")
            } else {
                z.numastat_node(nid).map_err(|e| e.to_string())
            }
        }
        ["topology", rest @ ..] if rest.len() <= 1 => {
            Ok(if json(rest.first())? { z.topology_json() + "\n" } else { z.topology_text() })
        }
        ["sysctl", "all"] => Ok(z.sysctl_all().into_iter().map(|(n, v)| format!("{n} = {v}\n")).collect()),
        ["sysctl", "get", name] => z.sysctl_get(name).map(|v| v + "\n").map_err(|e| e.to_string()),
        ["sysctl", "set", name, value] => {
            z.sysctl_set(name, value).map_err(|e| e.to_string())?;
            z.sysctl_get(name).map(|v| v + "\n").map_err(|e| e.to_string())
        }
        ["top"] => Ok(top_sample(z)),
        _ => Err(bad()),
    }
}

fn info(z: &Zonal, stats: &ServerStats) -> String {
    let comm = std::fs::read_to_string("/proc/self/comm").map(|s| s.trim().to_string()).unwrap_or_default();
    let v = serde_json::json!({
        "pid": std::process::id(),
        "handle": z.id(),
        "command": comm,
        "version": env!("CARGO_PKG_VERSION"),
        "nodes": z.topology().nr_nodes(),
        "cpus": z.nr_cpus(),
        "zones": z.zones().len(),
        "requests_served": stats.served.load(Ordering::Relaxed),
        "requests_refused": stats.refused.load(Ordering::Relaxed),
        "requests_failed": stats.failed.load(Ordering::Relaxed),
    });
    v.to_string() + "\n"
}

/// One sample of what `zonal top` shows: per node the memory figures, the pages allocated
/// and freed (`pgalloc`, `pgfree`, kept in every `numa_stats_mode`) and the NUMA counters,
/// and the events and layer counters of the whole handle, with the time it was taken and the
/// `numa_stats_mode` in force.
fn top_sample(z: &Zonal) -> String {
    let nodes: Vec<serde_json::Value> = (0..z.topology().nr_nodes())
        .map(|n| {
            let nid = NodeId(n as u16);
            let zones = z.node_zones(nid).unwrap_or(&[]);
            let (mut managed, mut min, mut low, mut high) = (0, 0, 0, 0);
            let (mut pgalloc, mut pgfree) = (0u64, 0u64);
            for id in zones {
                let zone = &z.zones()[id.0 as usize];
                let (a, f) = z.zone_page_events(*id);
                (pgalloc, pgfree) = (pgalloc.wrapping_add(a), pgfree.wrapping_add(f));
                managed += zone.managed;
                min += zone.watermark(Watermark::Min);
                low += zone.watermark(Watermark::Low);
                high += zone.watermark(Watermark::High);
            }
            let numa: serde_json::Map<String, serde_json::Value> = z
                .node_numa_stats(nid)
                .map(|v| NumaStat::ALL.iter().zip(v).map(|(s, x)| (s.numastat_name().to_string(), x.into())).collect())
                .unwrap_or_default();
            serde_json::json!({
                "node": n,
                "managed": managed,
                "free": z.nr_free_pages(nid).unwrap_or(0),
                "pcp": z.nr_pcp_pages(nid).unwrap_or(0),
                "min": min, "low": low, "high": high,
                "pgalloc": pgalloc, "pgfree": pgfree,
                "numa": numa,
            })
        })
        .collect();
    let counters: serde_json::Map<String, serde_json::Value> =
        z.vmstat_items().into_iter().map(|(n, v)| (n, v.into())).collect();
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    // Under `coarse` the NUMA counters are not kept: the reader says so instead of showing
    // their zeros as rates.
    let mode = z.sysctl_get("numa_stats_mode").unwrap_or_default();
    serde_json::json!({ "time_ns": t.as_nanos() as u64, "nodes": nodes, "counters": counters, "numa_stats_mode": mode })
        .to_string()
        + "\n"
}
