//! The live commands: reports and tunables of a running process's published handle
//! (`--pid`), `zonal ps` and `zonal top`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zonal::live::{self, Published};

/// How long a live command waits for a process's answer unless `--timeout` says otherwise.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// The `--timeout SECS` a live command was given, checked, or `default`.
pub fn timeout(secs: Option<f64>, default: Duration) -> Result<Duration, String> {
    match secs {
        None => Ok(default),
        Some(s) if (0.1..=3600.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err(format!("--timeout {s}: give 0.1 to 3600 seconds")),
    }
}

/// The directory of published handles: `--dir`, else zonal's default.
pub fn dir(arg: Option<&Path>) -> PathBuf {
    arg.map(Path::to_path_buf).unwrap_or_else(live::runtime_dir)
}

/// The published handle the command line names, asked with `timeout`.
pub fn target(dir: &Path, pid: i32, handle: Option<u64>, timeout: Duration) -> Result<Remote, String> {
    live::find(dir, pid, handle).map(|handle| Remote { handle, timeout }).map_err(|e| e.to_string())
}

/// A running process's published handle, and how long to wait for each of its answers.
pub struct Remote {
    pub handle: Published,
    pub timeout: Duration,
}

impl Remote {
    /// Sends one request and returns the reply body; the whole exchange takes at most the
    /// timeout, whatever the process does (stopped, its queue full). A request that failed
    /// only when its time ran out failed because the process did not answer, which is what
    /// the error says, whichever step was waiting (the connection's accept, the reply, an
    /// `EAGAIN` from a socket timeout).
    pub fn ask(&self, line: &str) -> Result<String, String> {
        let (p, start) = (&self.handle, Instant::now());
        p.request(line, self.timeout).map_err(|e| {
            if start.elapsed() + TICK_SLACK >= self.timeout {
                let secs = self.timeout.as_secs_f64();
                format!("process {} did not answer within {secs} s (stopped, or busy)", p.pid)
            } else {
                format!("process {} handle {}: {e}", p.pid, p.handle)
            }
        })
    }
}

/// How early a socket timeout may end before its deadline: the kernel counts it in ticks
/// (`sock_set_timeout` rounds up, but the first tick may be nearly over when the wait
/// starts), so one tick, 10 ms at the lowest HZ, with room to spare.
const TICK_SLACK: Duration = Duration::from_millis(100);

/// Where a listed handle's pid comes from, for `ps --json`.
fn pid_source(p: &Published) -> &'static str {
    match p.probe {
        live::Probe::Accepted => "peer",
        live::Probe::Hidden | live::Probe::Busy => "name",
    }
}

/// `zonal ps`: the user's published handles. Every handle is asked at once, so the command
/// takes at most `timeout` however many of them are stopped.
pub fn ps(dir: &Path, json: bool, timeout: Duration) -> Result<String, String> {
    let all = live::list(dir).map_err(|e| e.to_string())?;
    let answers = live::request_all(&all, "info", timeout);
    let infos: Vec<(Published, Result<serde_json::Value, String>)> = all
        .into_iter()
        .zip(answers)
        .map(|(p, a)| {
            let info = a
                .map_err(|e| format!("process {} handle {}: {e}", p.pid, p.handle))
                .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()));
            (p, info)
        })
        .collect();
    if json {
        let v: Vec<serde_json::Value> = infos
            .iter()
            .map(|(p, i)| {
                let mut o = serde_json::json!({
                    "pid": p.pid, "pid_from": pid_source(p), "handle": p.handle, "socket": p.path,
                });
                match i {
                    Ok(info) => o["info"] = info.clone(),
                    Err(e) => o["error"] = e.clone().into(),
                }
                o
            })
            .collect();
        return serde_json::to_string_pretty(&v).map(|s| s + "\n").map_err(|e| e.to_string());
    }
    let mut rows = vec![["PID", "HANDLE", "COMMAND", "NODES", "CPUS", "SERVED", "SOCKET"].map(String::from).to_vec()];
    for (p, info) in &infos {
        let f =
            |k: &str| info.as_ref().ok().and_then(|i| i.get(k)).map(|v| v.to_string().trim_matches('"').to_string());
        let unanswered = || info.as_ref().err().map(|e| format!("(no answer: {e})")).unwrap_or_default();
        rows.push(vec![
            p.pid.to_string(),
            p.handle.to_string(),
            f("command").unwrap_or_else(unanswered),
            f("nodes").unwrap_or_default(),
            f("cpus").unwrap_or_default(),
            f("requests_served").unwrap_or_default(),
            p.path.display().to_string(),
        ]);
    }
    if infos.is_empty() {
        let why = if dir.exists() { "" } else { " (it does not exist: nothing has published there yet)" };
        return Ok(format!("no published handles in {}{why}\n", dir.display()));
    }
    Ok(table(&rows))
}

/// Left-aligned columns separated by two spaces.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let w: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().enumerate().map(|(i, c)| format!("{c:<width$}", width = w[i])).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// One `top` sample as read from the server.
struct Sample {
    at: Instant,
    nodes: Vec<NodeSample>,
    counters: std::collections::BTreeMap<String, u64>,
    /// The handle's `numa_stats_mode` when the sample was taken (`None` from a server that
    /// does not say).
    numa_mode: Option<String>,
}

struct NodeSample {
    node: u64,
    managed: u64,
    free: u64,
    pcp: u64,
    low: u64,
    high: u64,
    /// Pages allocated from and freed to the node's zones (`None` from a server that does
    /// not count them by zone).
    pgalloc: Option<u64>,
    pgfree: Option<u64>,
    numa: std::collections::BTreeMap<String, u64>,
}

fn sample(r: &Remote) -> Result<Sample, String> {
    let text = r.ask("top")?;
    let at = Instant::now();
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("bad top sample: {e}"))?;
    let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let map = |v: Option<&serde_json::Value>| {
        v.and_then(serde_json::Value::as_object)
            .map(|m| m.iter().filter_map(|(k, x)| Some((k.clone(), x.as_u64()?))).collect())
            .unwrap_or_default()
    };
    let nodes = v
        .get("nodes")
        .and_then(serde_json::Value::as_array)
        .ok_or("bad top sample: no nodes")?
        .iter()
        .map(|n| NodeSample {
            node: num(n, "node"),
            managed: num(n, "managed"),
            free: num(n, "free"),
            pcp: num(n, "pcp"),
            low: num(n, "low"),
            high: num(n, "high"),
            pgalloc: n.get("pgalloc").and_then(serde_json::Value::as_u64),
            pgfree: n.get("pgfree").and_then(serde_json::Value::as_u64),
            numa: map(n.get("numa")),
        })
        .collect();
    let numa_mode = v.get("numa_stats_mode").and_then(serde_json::Value::as_str).map(str::to_string);
    Ok(Sample { at, nodes, counters: map(v.get("counters")), numa_mode })
}

/// Per second from two counter readings.
fn rate(new: u64, old: u64, secs: f64) -> f64 {
    new.saturating_sub(old) as f64 / secs.max(1e-9)
}

fn fmt_rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.1}M", r / 1e6)
    } else if r >= 1e4 {
        format!("{:.0}k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

/// Whether the NUMA counters count in a sample's mode: `coarse` keeps none (seed 001: not
/// updated, and zeroed when it is set), so a rate taken from them would read 0 for any load.
/// (`auto` counts from the first read, and every sample reads them.)
fn numa_counted(s: &Sample) -> bool {
    s.numa_mode.as_deref() != Some("coarse")
}

/// The counters of the NUMA balancing layer `top` shows rates of, when the handle has them.
const BALANCING: &[(&str, &str)] = &[
    ("numa_hint_faults", "hint faults"),
    ("numa_hint_faults_local", "local"),
    ("numa_pages_migrated", "migrated"),
    ("pgmigrate_fail", "failed"),
    ("numab_collapsed_pages", "collapsed"),
    ("pgpromote_success", "promoted"),
    ("pgdemote_kswapd", "demoted"),
];

/// One frame of `zonal top`: per node its pages and the rates since `prev`.
///
/// Per node, in pages of 4 KiB, kept in every `numa_stats_mode`: managed, free, on per-CPU
/// lists, the headroom over the high watermark, and ALLOC/s and FREE/s, the pages allocated
/// from and freed to the node's zones per second (its `pgalloc_normal` and `pgfree`, which
/// the allocator counts by zone on every path). HIT/s to LOCAL% come from the NUMA counters,
/// which count an allocation once whatever its order, as Linux's do; they are `-` under
/// `numa_stats_mode=coarse`, which keeps none. With memory tiering, PROMO/s and DEMO/s are
/// the pages promoted to and demoted from the node (`pgpromote_success`, `pgdemote_*`).
fn frame(p: &Published, now: &Sample, prev: Option<&Sample>, interval: Duration) -> String {
    let secs = prev.map(|o| now.at.duration_since(o.at).as_secs_f64());
    let numa = numa_counted(now) && prev.is_none_or(numa_counted);
    let tiering = now.counters.keys().any(|k| k.starts_with("pgpromote_success_node"));
    let mut head = vec![
        "NODE",
        "MANAGED",
        "FREE",
        "PCP",
        "USED%",
        "FREE-HIGH",
        "ALLOC/s",
        "FREE/s",
        "HIT/s",
        "MISS/s",
        "FOREIGN/s",
        "LOCAL%",
    ];
    if tiering {
        head.extend(["PROMO/s", "DEMO/s"]);
    }
    let mut rows = vec![head.into_iter().map(String::from).collect::<Vec<_>>()];
    let used = |s: &NodeSample| s.managed.saturating_sub(s.free + s.pcp);
    let counter = |s: &Sample, name: &str, node: u64| s.counters.get(&format!("{name}_node{node}")).copied();
    let mut uncounted = false;
    for n in &now.nodes {
        let old = prev.and_then(|o| o.nodes.iter().find(|x| x.node == n.node));
        let mut rates: Vec<String> = match (old, secs, prev) {
            (Some(o), Some(dt), Some(ps)) => {
                let g = |k: &str| rate(n.numa.get(k).copied().unwrap_or(0), o.numa.get(k).copied().unwrap_or(0), dt);
                let pages = |new: Option<u64>, old: Option<u64>| match (new, old) {
                    (Some(a), Some(b)) => fmt_rate(rate(a, b, dt)),
                    _ => "-".to_string(),
                };
                let (local, other) = (g("local_node"), g("other_node"));
                let local_pct =
                    if local + other > 0.0 { format!("{:.0}", 100.0 * local / (local + other)) } else { "-".into() };
                let mut r = vec![
                    pages(n.pgalloc, o.pgalloc),
                    pages(n.pgfree, o.pgfree),
                    fmt_rate(g("numa_hit")),
                    fmt_rate(g("numa_miss")),
                    fmt_rate(g("numa_foreign")),
                    local_pct,
                ];
                if tiering {
                    let c = |s: &Sample, k: &str| counter(s, k, n.node).unwrap_or(0);
                    let demoted = |s: &Sample| c(s, "pgdemote_kswapd") + c(s, "pgdemote_direct");
                    r.push(fmt_rate(rate(c(now, "pgpromote_success"), c(ps, "pgpromote_success"), dt)));
                    r.push(fmt_rate(rate(demoted(now), demoted(ps), dt)));
                }
                r
            }
            _ => vec!["-".to_string(); if tiering { 8 } else { 6 }],
        };
        uncounted |= secs.is_some() && n.pgalloc.is_none();
        if !numa {
            rates[2..6].fill("-".to_string());
        }
        let mut row = vec![
            n.node.to_string(),
            n.managed.to_string(),
            n.free.to_string(),
            n.pcp.to_string(),
            format!("{:.1}", 100.0 * used(n) as f64 / n.managed.max(1) as f64),
            (n.free as i64 - n.high as i64).to_string(),
        ];
        row.extend(rates);
        rows.push(row);
    }
    let mode = now.numa_mode.as_deref().map(|m| format!("; numa_stats_mode {m}")).unwrap_or_default();
    let mut out =
        format!("zonal top: pid {} handle {}, every {:.1} s{mode}\n\n", p.pid, p.handle, interval.as_secs_f64());
    out.push_str(&table(&rows));
    out.push_str(&format!(
        "\nMANAGED to FREE/s in pages of 4 KiB. FREE-HIGH: free pages above the high watermark \
         (below 0: under it{}). ALLOC/s, FREE/s: pages allocated from and freed to the node per second.\n\
         HIT/s to LOCAL%: allocations, from the NUMA counters, which count an allocation once whatever its \
         order (a bulk call once per page).{}\n",
        now.nodes.iter().map(|n| format!("; node {} low {}", n.node, n.low)).collect::<String>(),
        if tiering { " PROMO/s, DEMO/s: pages promoted to and demoted from the node per second." } else { "" }
    ));
    if prev.is_none() {
        out.push_str("-: a rate needs two samples; the next frame has them.\n");
    } else if uncounted {
        out.push_str("-: ALLOC/s and FREE/s: this process's zonal does not count pages by node.\n");
    } else if !numa {
        out.push_str(&format!(
            "-: numa_stats_mode is coarse, which keeps no NUMA counters (`zonal --pid {} sysctl \
             numa_stats_mode=auto` counts them again).\n",
            p.pid
        ));
    }
    let c = |s: &Sample, k: &str| s.counters.get(k).copied();
    if let (Some(o), Some(dt)) = (prev, secs) {
        let ev = |k: &str| c(now, k).map(|v| fmt_rate(rate(v, c(o, k).unwrap_or(0), dt)));
        out.push_str(&format!(
            "\nall nodes: pgalloc/s {}  pgfree/s {}  refills/s {}  drains/s {}  failed/s {}\n\
             (pgalloc and pgfree in pages; refills and drains of per-CPU lists, and failed allocations, in calls)\n",
            ev("pgalloc_normal").unwrap_or_default(),
            ev("pgfree").unwrap_or_default(),
            ev("pcp_refill").unwrap_or_default(),
            ev("pcp_drain").unwrap_or_default(),
            ev("alloc_fail").unwrap_or_default(),
        ));
        let bal: Vec<String> =
            BALANCING.iter().filter_map(|(k, label)| Some(format!("{label}/s {}", ev(k)?))).collect();
        if !bal.is_empty() {
            out.push_str(&format!("balancing: {}\n", bal.join("  ")));
        }
    }
    out
}

/// `zonal top`: a frame every `interval`, `count` frames (0: until interrupted). On a
/// terminal each frame replaces the last; otherwise frames follow one another.
pub fn top(r: &Remote, interval: Duration, count: u64) -> Result<(), String> {
    let tty = std::io::stdout().is_terminal();
    let mut prev: Option<Sample> = None;
    let mut shown = 0u64;
    loop {
        let now = sample(r)?;
        let text = frame(&r.handle, &now, prev.as_ref(), interval);
        let mut out = std::io::stdout().lock();
        let w = if tty { write!(out, "\x1b[H\x1b[2J{text}") } else { writeln!(out, "{text}") };
        w.and_then(|_| out.flush()).map_err(|e| format!("cannot write: {e}"))?;
        drop(out);
        shown += 1;
        if count != 0 && shown >= count {
            return Ok(());
        }
        prev = Some(now);
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample of one node of 1000 pages, `used` of them in use, with these NUMA counts.
    fn sample(at: Instant, mode: &str, used: u64, hit: u64, miss: u64) -> Sample {
        let numa = [("numa_hit", hit), ("numa_miss", miss), ("numa_foreign", 0), ("local_node", hit + miss)]
            .map(|(k, v)| (k.to_string(), v))
            .into_iter()
            .collect();
        // The node's pages allocated (all still in use) and freed (5 per 8 in use beyond 100:
        // any figure, which the NUMA counters could not give), kept in every mode.
        let (pgalloc, pgfree) = (Some(used), Some(used.saturating_sub(100) * 5 / 8));
        let node = NodeSample {
            node: 0,
            managed: 1000,
            free: 1000 - used - 10,
            pcp: 10,
            low: 20,
            high: 30,
            pgalloc,
            pgfree,
            numa,
        };
        let counters = [("pgalloc_normal", 8 * (hit + miss)), ("pgfree", 0)].map(|(k, v)| (k.to_string(), v)).into();
        Sample { at, nodes: vec![node], counters, numa_mode: Some(mode.to_string()) }
    }

    fn published() -> Published {
        Published { pid: 4242, handle: 1, path: PathBuf::from("/nonexistent"), probe: live::Probe::Accepted }
    }

    /// The cells of node 0's row, by column name.
    fn row(frame: &str) -> std::collections::BTreeMap<String, String> {
        let mut lines = frame.lines().skip_while(|l| !l.starts_with("NODE"));
        let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        let cells: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        head.iter().map(|h| h.to_string()).zip(cells.iter().map(|c| c.to_string())).collect()
    }

    #[test]
    fn a_nodes_pages_are_pages_and_its_allocations_are_allocations() {
        // One second in which 10 order-3 blocks were allocated from node 0: 80 pages by the
        // node's pgalloc, 10 allocations by its NUMA counters; and 50 pages freed.
        let t0 = Instant::now();
        let (before, after) = (sample(t0, "auto", 100, 5, 0), sample(t0 + Duration::from_secs(1), "auto", 180, 15, 0));
        let f = frame(&published(), &after, Some(&before), Duration::from_secs(1));
        let r = row(&f);
        assert_eq!((r["ALLOC/s"].as_str(), r["FREE/s"].as_str(), r["HIT/s"].as_str()), ("80", "50", "10"), "{f}");
        assert_eq!((r["FREE"].as_str(), r["FREE-HIGH"].as_str(), r["LOCAL%"].as_str()), ("810", "780", "100"), "{f}");
        assert!(f.contains("all nodes: pgalloc/s 80 "), "{f}");
        assert!(f.contains("in pages of 4 KiB") && f.contains("once whatever its order"), "{f}");
        assert!(!f.contains("numa_stats_mode is coarse") && !f.contains("PROMO/s"), "{f}");
        // A server that does not count pages by node: the columns say they cannot be computed.
        let (mut old, mut new) = (before, after);
        (old.nodes[0].pgalloc, new.nodes[0].pgalloc, new.nodes[0].pgfree) = (None, None, None);
        let f = frame(&published(), &new, Some(&old), Duration::from_secs(1));
        assert_eq!((row(&f)["ALLOC/s"].as_str(), row(&f)["FREE/s"].as_str()), ("-", "-"), "{f}");
        assert!(f.contains("does not count pages by node"), "{f}");
    }

    #[test]
    fn tiering_shows_each_nodes_promotions_and_demotions() {
        let t0 = Instant::now();
        let (mut before, mut after) =
            (sample(t0, "auto", 100, 5, 0), sample(t0 + Duration::from_secs(2), "auto", 180, 15, 0));
        for (s, (promoted, kswapd, direct)) in [(&mut before, (10, 0, 0)), (&mut after, (410, 100, 20))] {
            for (k, v) in [("pgpromote_success", promoted), ("pgdemote_kswapd", kswapd), ("pgdemote_direct", direct)] {
                s.counters.insert(format!("{k}_node0"), v);
            }
        }
        let f = frame(&published(), &after, Some(&before), Duration::from_secs(2));
        let r = row(&f);
        assert_eq!((r["PROMO/s"].as_str(), r["DEMO/s"].as_str()), ("200", "60"), "{f}");
        assert!(f.contains("pages promoted to and demoted from the node"), "{f}");
    }

    #[test]
    fn under_coarse_the_numa_columns_say_they_cannot_be_computed() {
        let t0 = Instant::now();
        // Coarse keeps no NUMA counters: they read 0 whatever the load.
        let (before, after) =
            (sample(t0, "coarse", 100, 0, 0), sample(t0 + Duration::from_secs(1), "coarse", 180, 0, 0));
        let f = frame(&published(), &after, Some(&before), Duration::from_secs(1));
        let r = row(&f);
        assert_eq!(r["ALLOC/s"], "80", "pages are counted in every mode: {f}");
        for c in ["HIT/s", "MISS/s", "FOREIGN/s", "LOCAL%"] {
            assert_eq!(r[c], "-", "{c}: {f}");
        }
        assert!(f.contains("-: numa_stats_mode is coarse, which keeps no NUMA counters"), "{f}");
        assert!(f.contains("zonal --pid 4242 sysctl numa_stats_mode=auto"), "{f}");
        // A switch from coarse between the two samples: the counters started again at 0.
        let strict = sample(t0 + Duration::from_secs(2), "strict", 180, 7, 0);
        assert_eq!(row(&frame(&published(), &strict, Some(&after), Duration::from_secs(1)))["HIT/s"], "-");
        // The first frame has no rates, and says why.
        let first = frame(&published(), &before, None, Duration::from_secs(1));
        assert_eq!(row(&first)["ALLOC/s"], "-");
        assert!(first.contains("-: a rate needs two samples"), "{first}");
    }
}
