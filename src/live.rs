//! The live commands: reports and tunables of a running process's published handle
//! (`--pid`), `zonal ps` and `zonal top`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zonal::live::{self, Published};

/// How long a live command waits for each step of a request.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// The directory of published handles: `--dir`, else zonal's default.
pub fn dir(arg: Option<&Path>) -> PathBuf {
    arg.map(Path::to_path_buf).unwrap_or_else(live::runtime_dir)
}

/// The published handle the command line names.
pub fn target(dir: &Path, pid: i32, handle: Option<u64>) -> Result<Published, String> {
    live::find(dir, pid, handle).map_err(|e| e.to_string())
}

/// Sends one request and returns the reply body; the whole exchange takes at most
/// [`TIMEOUT`], whatever the process does (stopped, its queue full). A request that failed
/// only when its time ran out failed because the process did not answer, which is what the
/// error says, whichever step was waiting (the connection's accept, the reply, an `EAGAIN`
/// from a socket timeout).
pub fn ask(p: &Published, line: &str) -> Result<String, String> {
    let start = Instant::now();
    p.request(line, TIMEOUT).map_err(|e| {
        if start.elapsed() + TICK_SLACK >= TIMEOUT {
            format!("process {} did not answer within {} s (stopped, or busy)", p.pid, TIMEOUT.as_secs())
        } else {
            format!("process {} handle {}: {e}", p.pid, p.handle)
        }
    })
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
/// takes at most [`TIMEOUT`] however many of them are stopped.
pub fn ps(dir: &Path, json: bool) -> Result<String, String> {
    let all = live::list(dir).map_err(|e| e.to_string())?;
    let answers = live::request_all(&all, "info", TIMEOUT);
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
}

struct NodeSample {
    node: u64,
    managed: u64,
    free: u64,
    pcp: u64,
    low: u64,
    high: u64,
    numa: std::collections::BTreeMap<String, u64>,
}

fn sample(p: &Published) -> Result<Sample, String> {
    let text = ask(p, "top")?;
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
            numa: map(n.get("numa")),
        })
        .collect();
    Ok(Sample { at, nodes, counters: map(v.get("counters")) })
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

/// The counters of the NUMA balancing layer `top` shows rates of, when the handle has them.
const BALANCING: &[(&str, &str)] = &[
    ("numa_hint_faults", "hint faults"),
    ("numa_hint_faults_local", "local"),
    ("numa_pages_migrated", "migrated"),
    ("pgmigrate_fail", "failed"),
    ("numab_collapsed_pages", "collapsed"),
];

/// One frame of `zonal top`: per node its pages and the rates since `prev`.
fn frame(p: &Published, now: &Sample, prev: Option<&Sample>, interval: Duration) -> String {
    let secs = prev.map(|o| now.at.duration_since(o.at).as_secs_f64());
    let mut rows = vec![[
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
    ]
    .map(String::from)
    .to_vec()];
    for n in &now.nodes {
        let allocs = |s: &NodeSample| {
            s.numa.get("numa_hit").copied().unwrap_or(0) + s.numa.get("numa_miss").copied().unwrap_or(0)
        };
        let used = n.managed.saturating_sub(n.free + n.pcp);
        let old = prev.and_then(|o| o.nodes.iter().find(|x| x.node == n.node));
        let rates = match (old, secs) {
            (Some(o), Some(dt)) => {
                let a = rate(allocs(n), allocs(o), dt);
                // Frames that left the node's allocated set: allocations minus its growth.
                let used_before = o.managed.saturating_sub(o.free + o.pcp);
                let f = (a - (used as f64 - used_before as f64) / dt.max(1e-9)).max(0.0);
                let g = |k: &str| rate(n.numa.get(k).copied().unwrap_or(0), o.numa.get(k).copied().unwrap_or(0), dt);
                let (local, other) = (g("local_node"), g("other_node"));
                let local_pct =
                    if local + other > 0.0 { format!("{:.0}", 100.0 * local / (local + other)) } else { "-".into() };
                [
                    fmt_rate(a),
                    fmt_rate(f),
                    fmt_rate(g("numa_hit")),
                    fmt_rate(g("numa_miss")),
                    fmt_rate(g("numa_foreign")),
                    local_pct,
                ]
            }
            _ => std::array::from_fn(|_| "-".to_string()),
        };
        let mut row = vec![
            n.node.to_string(),
            n.managed.to_string(),
            n.free.to_string(),
            n.pcp.to_string(),
            format!("{:.1}", 100.0 * used as f64 / n.managed.max(1) as f64),
            (n.free as i64 - n.high as i64).to_string(),
        ];
        row.extend(rates);
        rows.push(row);
    }
    let mut out = format!(
        "zonal top: pid {} handle {}, every {:.1} s; pages of 4 KiB; FREE-HIGH: free pages above the high watermark \
         (below 0: under it{}).\n\n",
        p.pid,
        p.handle,
        interval.as_secs_f64(),
        now.nodes.iter().map(|n| format!(", node {} low {}", n.node, n.low)).collect::<String>()
    );
    out.push_str(&table(&rows));
    let c = |s: &Sample, k: &str| s.counters.get(k).copied();
    if let (Some(o), Some(dt)) = (prev, secs) {
        let ev = |k: &str| c(now, k).map(|v| fmt_rate(rate(v, c(o, k).unwrap_or(0), dt)));
        out.push_str(&format!(
            "\nall nodes: pgalloc/s {}  pgfree/s {}  refills/s {}  drains/s {}  failed/s {}\n",
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
pub fn top(p: &Published, interval: Duration, count: u64) -> Result<(), String> {
    let tty = std::io::stdout().is_terminal();
    let mut prev: Option<Sample> = None;
    let mut shown = 0u64;
    loop {
        let now = sample(p)?;
        let text = frame(p, &now, prev.as_ref(), interval);
        let mut out = std::io::stdout().lock();
        let r = if tty { write!(out, "\x1b[H\x1b[2J{text}") } else { writeln!(out, "{text}") };
        r.and_then(|_| out.flush()).map_err(|e| format!("cannot write: {e}"))?;
        drop(out);
        shown += 1;
        if count != 0 && shown >= count {
            return Ok(());
        }
        prev = Some(now);
        std::thread::sleep(interval);
    }
}
