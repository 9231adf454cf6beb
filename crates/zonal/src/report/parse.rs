//! Parsers of the reports' text, for tests and for scripts that compare runs: each reads what
//! the kernel's file of the same layout holds.

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
    use crate::{Config, Gfp, NodeId, Zonal};

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
