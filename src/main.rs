//! `zonal`: benchmarks, reports and tunables of the zonal page allocator.

mod bench;
mod exporter;
mod live;
mod workload;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;
use workload::Workload;
use zonal::{Config, Topology, Zonal};

/// The embedded default topology: two fake nodes of 64 MiB.
const DEFAULT_TOPOLOGY: &str = include_str!("../topologies/default.topo");

#[derive(Parser, Debug)]
#[command(
    name = "zonal",
    version,
    about = "A NUMA-aware page-frame allocator for user space: benchmarks and reports",
    long_about = "A NUMA-aware page-frame allocator for user space, built on the design of the Linux page \
                  allocator. Every command builds an allocator on a topology (by default an embedded fake \
                  one of two 64 MiB nodes) and reports on it or measures it."
)]
struct Cli {
    /// Topology: a spec such as `nodes=4,size=256M` (keys nodes, size, sizes, cpus,
    /// distance), `sys` for this machine's real nodes, or a file of such items, one per line.
    /// Default: two fake nodes of 64 MiB.
    #[arg(long, global = true, value_name = "SPEC|FILE")]
    topology: Option<String>,

    /// Largest block order (MAX_ORDER), 0 to 15.
    #[arg(long, global = true, default_value_t = zonal::types::DEFAULT_MAX_ORDER.to_string(), value_name = "N")]
    max_order: String,

    /// Fault every frame in when the allocator starts (MADV_POPULATE_WRITE).
    #[arg(long, global = true)]
    populate: bool,

    /// Lock the allocator's memory (mlock).
    #[arg(long, global = true)]
    mlock: bool,

    /// Ask for transparent huge pages on the allocator's memory (MADV_HUGEPAGE).
    #[arg(long, global = true)]
    thp: bool,

    /// Set a tunable before the command runs (repeatable): NAME=VALUE, as `zonal sysctl`.
    #[arg(long = "set", global = true, value_name = "NAME=VALUE")]
    set: Vec<String>,

    /// Run the report (topology, zoneinfo, numastat, vmstat, buddyinfo), `sysctl` or `top`
    /// against the handle a running process published, instead of an allocator of this
    /// command's own (see `zonal ps`).
    #[arg(long, global = true, value_name = "PID")]
    pid: Option<i32>,

    /// With --pid: which of the process's published handles (needed when it has several).
    #[arg(long, global = true, value_name = "H", requires = "pid")]
    handle: Option<u64>,

    /// The directory of published handles. Default: $ZONAL_RUNTIME_DIR, else
    /// $XDG_RUNTIME_DIR/zonal, else zonal-<uid> under the temporary directory.
    #[arg(long = "dir", global = true, value_name = "DIR")]
    runtime_dir: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the topology: nodes, their memory and CPUs, the distance matrix, and each node's
    /// zonelist (the order in which an allocation from that node tries the nodes).
    Topology {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print every zone in the layout of Linux's /proc/zoneinfo (pages free, watermarks
    /// min/low/high, spanned/present/managed, the zone counters, then the NUMA counters, then
    /// each CPU's pageset: count, high, batch and vm stats threshold). In the default
    /// numa_stats_mode `auto` the NUMA counters start counting at their first read, so a
    /// `--workload` run before the first report leaves them at zero (seed 001); add
    /// `--set numa_stats_mode=strict` to count it.
    Zoneinfo {
        /// Run a synthetic workload first: allocs=N,orders=A-B,policy=P,free=PCT,seed=S,
        /// each key at most once. Defaults: allocs=1000, orders=0-0, policy=local, free=50
        /// (percent of the blocks freed again, at random), seed=1. Policies: local,
        /// preferred=N, bind=NODES (required), interleave[=NODES] (all nodes if none); NODES
        /// as a list such as 0,2-3.
        #[arg(long, value_name = "SPEC")]
        workload: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the NUMA counters (numa_hit, numa_miss, numa_foreign, interleave_hit,
    /// local_node, other_node) per node, as the `numastat` command does, or for one node in
    /// the layout of /sys/devices/system/node/nodeN/numastat. In the default
    /// numa_stats_mode `auto`, counting starts at the first read of the counters (any report),
    /// so after `--workload` alone they are still zero: add `--set numa_stats_mode=strict` to
    /// count the workload (seed 001).
    Numastat {
        /// One node only, in the nodeN/numastat layout.
        #[arg(long, value_name = "N")]
        node: Option<u16>,
        /// Run a synthetic workload first: allocs=N,orders=A-B,policy=P,free=PCT,seed=S
        /// (defaults and policies: see `zonal zoneinfo --help`).
        #[arg(long, value_name = "SPEC")]
        workload: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print every counter in the layout of Linux's /proc/vmstat (the zone counters summed
    /// over zones, the NUMA counters, the events), as JSON, or as Prometheus text exposition
    /// with the zone figures too (`zonal_vmstat_*`, `zonal_zoneinfo_*{node,zone}`, named as
    /// node_exporter's vmstat and zoneinfo collectors name theirs). In the default
    /// numa_stats_mode `auto` the NUMA counters start counting at their first read, so a
    /// `--workload` run before it leaves them at zero (seed 001); add
    /// `--set numa_stats_mode=strict` to count it.
    Vmstat {
        /// Run a synthetic workload first: allocs=N,orders=A-B,policy=P,free=PCT,seed=S
        /// (defaults and policies: see `zonal zoneinfo --help`).
        #[arg(long, value_name = "SPEC")]
        workload: Option<String>,
        /// Print JSON instead of text.
        #[arg(long, conflicts_with = "prometheus")]
        json: bool,
        /// Print the Prometheus text exposition of every counter and zone figure.
        #[arg(long)]
        prometheus: bool,
    },
    /// Print free blocks per order per zone in the layout of Linux's /proc/buddyinfo.
    Buddyinfo {
        /// Run a synthetic workload first: allocs=N,orders=A-B,policy=P,free=PCT,seed=S
        /// (defaults and policies: see `zonal zoneinfo --help`).
        #[arg(long, value_name = "SPEC")]
        workload: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show or set run-time tunables, like sysctl: `-a` lists every one, NAME prints one,
    /// NAME=VALUE sets it (rejected with the old value kept if invalid) and prints it.
    /// A setting lasts as long as the allocator it is made on: without --pid that is this
    /// command's own, so it ends with the command (use --set NAME=VALUE with another
    /// command, or ZONAL_<NAME> in the environment of a program, to keep one); with --pid it
    /// changes the running process's handle. Tunables are also read from ZONAL_<NAME> when
    /// an allocator is built.
    Sysctl {
        /// NAME or NAME=VALUE.
        #[arg(value_name = "NAME[=VALUE]")]
        items: Vec<String>,
        /// Every tunable.
        #[arg(short = 'a', long = "all")]
        all: bool,
        /// The table: default, bounds, unit and what each tunable does.
        #[arg(long)]
        doc: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the published handles of this user's processes (a handle is published with
    /// ZONAL_PUBLISH=1, the config key publish=1, Zonal::publish or zonal_publish): pid,
    /// handle, command, nodes, CPUs, requests served and socket. Sockets of processes that
    /// died are removed.
    Ps {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A refreshing per-node view of a running process's handle (--pid): pages managed, free
    /// and on per-CPU lists, watermark headroom, allocation and free rates, NUMA hit, miss
    /// and foreign rates and the local share, the event rates, and NUMA balancing's rates
    /// when the process balances regions.
    Top {
        /// Seconds between frames (0.05 to 3600).
        #[arg(long, default_value_t = 1.0, value_name = "SECS")]
        interval: f64,
        /// Frames to show, then exit (0: until interrupted).
        #[arg(long, default_value_t = 0, value_name = "N")]
        count: u64,
    },
    /// Serve the Prometheus text exposition of every published handle of this user at
    /// http://ADDR/metrics, with `pid` and `handle` labels (names as `vmstat --prometheus`)
    /// and `zonal_up{pid,handle}` for whether each answered. Prints the address it serves
    /// on first (port 0 picks a free port).
    Exporter {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9835", value_name = "ADDR")]
        listen: String,
    },
    /// Run benchmark experiments (all of them when none is named) and print each as a table
    /// of ns per operation (median, min – max over repetitions) and ratios to the reference
    /// peer measured in the same repetitions. Experiments: single (one thread, order-0
    /// alloc + free pairs, page_bench01, beside snmalloc, tcmalloc, mimalloc, jemalloc, glibc,
    /// the kernel and an ideal per-thread stack), parallel (T threads, page_bench03), bulk
    /// (N pages per call, page_bench04_bulk), cross (allocated on one CPU, freed on another),
    /// mixed (every CPU on one zone, each thread keeping 4096 frames and freeing half of them
    /// itself, handing half to the next CPU's thread),
    /// threshold (seed 000's NUMA counter threshold), modes (seed 001's numa_stats_mode),
    /// stats (seed 002: shared against per-CPU NUMA counters, per-page against batched bulk
    /// accounting), zlc (seed 003: the zonelist cache on 8 and 28 fake nodes), numab (seed 004:
    /// NUMA balancing moving a region to its threads' node, delayed against eager mapping on
    /// the userfaultfd and mprotect backends; one run's length from ZONAL_NUMAB_SECONDS,
    /// default 1.3, and an optional busy-wait per remote access from
    /// ZONAL_NUMAB_REMOTE_PENALTY_NS).
    Bench {
        /// Experiments to run (default: all).
        #[arg(value_name = "EXPERIMENT")]
        experiments: Vec<String>,
        /// Repetitions of every cell (1 to 1000).
        #[arg(long, default_value_t = 9,
              value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
        reps: usize,
        /// Milliseconds per cell per repetition (1 to 60000).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=60_000))]
        cell_ms: u64,
        /// Write one JSON record per measured cell to FILE; `-` writes them to stdout, and the
        /// report then goes to stderr. A record has experiment, subject, params, ns_per_op
        /// (median, min, max), reference, ratio_to_reference, reps and process: `main`, or
        /// `tcmalloc-child` for the child process that measures tcmalloc on its rseq per-CPU
        /// caches beside a mimalloc of its own, or `alone` for the runs of the history target
        /// (each experiment again in a fresh process), or `after-cross` for its run of parallel
        /// right after cross. FILE is checked writable before the run.
        #[arg(long, value_name = "FILE")]
        json: Option<String>,
        /// Write one SVG per experiment that ran into DIR (DIR/single.svg, DIR/bulk.svg, ...),
        /// drawn from the same records as --json: medians with min–max whiskers, numab's
        /// accesses/s and TLB shootdowns over time. DIR is created if missing (its parent must
        /// exist) and checked writable before the run; the paths written are printed on stderr.
        #[arg(long, value_name = "DIR")]
        plot: Option<std::path::PathBuf>,
        /// No progress on stderr.
        #[arg(long)]
        quiet: bool,
        /// Measure only the subjects whose names start with one of these (comma-separated),
        /// and mimalloc, the reference; the experiments without them print nothing. A name
        /// that starts no subject of the chosen experiments is refused with the list of them;
        /// threshold, modes, stats, zlc and numab measure zonal alone and run when `zonal pcp`
        /// is kept.
        #[arg(long, value_delimiter = ',', value_name = "NAMES")]
        only: Vec<String>,
        /// Internal: this run is the tcmalloc child of a bench run, whose experiments it
        /// numbers from DONE + 1 of TOTAL; its records are marked `tcmalloc-child`.
        #[arg(long, hide = true, value_name = "DONE/TOTAL")]
        tcmalloc_child: Option<String>,
        /// Internal: stop before each repetition until a line arrives on stdin (the tcmalloc
        /// child, in lockstep with the bench run that started it).
        #[arg(long, hide = true, requires = "tcmalloc_child")]
        lockstep: bool,
    },
}

fn main() -> ExitCode {
    // zonal does not panic on bad input; should a bug panic anyway, say so in one line.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("zonal: internal error: {info}");
    }));
    let cli = Cli::parse();
    // ZONAL_PUBLISH=1 publishes the handle this command builds. It is taken out of the
    // environment here, before any thread starts, because the other allocators a command
    // builds (the bench's, a workload's peers) are built with Zonal::new, which refuses it.
    let publish = zonal::live::publish_from_env();
    std::env::remove_var("ZONAL_PUBLISH");
    if !matches!(cli.command, Command::Exporter { .. }) {
        // A report piped into `head` ends quietly when the reader leaves, as C tools do,
        // instead of failing on every write after (Rust ignores SIGPIPE by default). The
        // exporter keeps ignoring it: its clients come and go.
        // SAFETY: setting a signal's disposition to its default has no memory effects, and
        // no other thread runs yet.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match publish.map_err(|e| e.to_string()).and_then(|publish| run(cli, publish)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("zonal: error: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// `--max-order`: 0 to MAX_ORDER_LIMIT, said in words.
fn parse_max_order(s: &str) -> Result<u8, String> {
    let limit = zonal::types::MAX_ORDER_LIMIT;
    s.trim()
        .parse::<u8>()
        .ok()
        .filter(|&o| o <= limit)
        .ok_or_else(|| format!("--max-order `{s}`: give an order from 0 to {limit}"))
}

fn topology(arg: Option<&str>) -> Result<Topology, String> {
    match arg {
        Some(a) => Topology::from_arg(a),
        None => Topology::parse_file_text(
            DEFAULT_TOPOLOGY,
            "default topology",
            zonal::topology::Machine::current().map_err(|e| e.to_string())?,
        ),
    }
    .map_err(|e| e.to_string())
}

/// What the command line asks the allocator to be built from.
fn config(cli: &Cli) -> Result<Config, String> {
    let topo = topology(cli.topology.as_deref())?;
    let mut config = Config::new(topo).max_order(parse_max_order(&cli.max_order)?);
    config.arena = zonal::ArenaOptions { populate: cli.populate, mlock: cli.mlock, thp: cli.thp };
    Ok(config)
}

/// Under `numa_stats_mode=auto` the NUMA counters start at their first read (seed 001), so
/// a workload run before the report leaves them at zero: say so rather than print zeros
/// that look like a finding.
fn note_uncounted_numa(z: &Zonal, ran_workload: bool) {
    if ran_workload && z.sysctl_get("numa_stats_mode").is_ok_and(|m| m == "auto") {
        eprintln!(
            "note: numa_stats_mode is auto, so the NUMA counters (numa_hit, numa_miss, ...) start counting at their \
             first read, after this workload: they read 0. Add --set numa_stats_mode=strict to count the workload."
        );
    }
}

fn with_workload(z: &Zonal, workload: Option<&str>) -> Result<(), String> {
    if let Some(w) = workload {
        let w = Workload::parse(w)?;
        let (allocated, freed, failed) = w.run(z)?;
        eprintln!(
            "workload: {allocated} blocks allocated, {freed} freed, {} left allocated{}",
            allocated - freed,
            if failed > 0 { format!(", {failed} allocations failed (out of memory)") } else { String::new() }
        );
    }
    Ok(())
}

fn set_tunable(z: &Zonal, item: &str) -> Result<(), String> {
    let (name, value) = item.split_once('=').ok_or_else(|| format!("`{item}` is not NAME=VALUE"))?;
    z.sysctl_set(name.trim(), value).map_err(|e| e.to_string())
}

/// The commands that read or tune a running process's handle instead of building one.
fn run_live(cli: &Cli, pid: i32) -> Result<(), String> {
    // Options that shape a local allocator mean nothing for a running process's.
    let local = [
        (cli.topology.is_some(), "--topology"),
        (cli.max_order != zonal::types::DEFAULT_MAX_ORDER.to_string(), "--max-order"),
        (cli.populate, "--populate"),
        (cli.mlock, "--mlock"),
        (cli.thp, "--thp"),
        (!cli.set.is_empty(), "--set"),
    ];
    if let Some((_, flag)) = local.iter().find(|(on, _)| *on) {
        return Err(format!(
            "{flag} shapes an allocator of this command's own; with --pid the figures come from the running \
             process's handle (tune it with `zonal --pid {pid} sysctl NAME=VALUE`)"
        ));
    }
    let dir = live::dir(cli.runtime_dir.as_deref());
    let no_workload = |w: &Option<String>| match w {
        Some(_) => {
            Err("--workload runs on an allocator of this command's own; it cannot be used with --pid".to_string())
        }
        None => Ok(()),
    };
    let h = || live::target(&dir, pid, cli.handle);
    match &cli.command {
        Command::Topology { json } => out(&live::ask(&h()?, if *json { "topology json" } else { "topology" })?),
        Command::Zoneinfo { workload, json } => {
            no_workload(workload)?;
            out(&live::ask(&h()?, if *json { "zoneinfo json" } else { "zoneinfo" })?)
        }
        Command::Buddyinfo { workload, json } => {
            no_workload(workload)?;
            out(&live::ask(&h()?, if *json { "buddyinfo json" } else { "buddyinfo" })?)
        }
        Command::Vmstat { workload, json, prometheus } => {
            no_workload(workload)?;
            let req = if *prometheus {
                "vmstat prometheus"
            } else if *json {
                "vmstat json"
            } else {
                "vmstat"
            };
            out(&live::ask(&h()?, req)?)
        }
        Command::Numastat { node, workload, json } => {
            no_workload(workload)?;
            let mut req = "numastat".to_string();
            if let Some(n) = node {
                req += &format!(" node {n}");
            }
            if *json {
                req += " json";
            }
            out(&live::ask(&h()?, &req)?)
        }
        Command::Sysctl { items, all, doc, json } => {
            if *doc {
                return sysctl_doc(items, *json);
            }
            let h = h()?;
            let mut shown = Vec::new();
            for item in items {
                let (name, value) = match item.split_once('=') {
                    Some((n, v)) => (n.trim(), Some(v.trim())),
                    None => (item.trim(), None),
                };
                check_tunable_name(name)?;
                let got = match value {
                    Some(v) if v.is_empty() || v.contains(char::is_whitespace) => {
                        return Err(format!("`{item}`: the value must be one word"))
                    }
                    Some(v) => live::ask(&h, &format!("sysctl set {name} {v}"))?,
                    None => live::ask(&h, &format!("sysctl get {name}"))?,
                };
                shown.push((name.to_string(), got.trim().to_string()));
            }
            if *all || items.is_empty() {
                shown = live::ask(&h, "sysctl all")?
                    .lines()
                    .filter_map(|l| l.split_once(" = ").map(|(n, v)| (n.to_string(), v.to_string())))
                    .collect();
            }
            print_sysctl(shown, *json)
        }
        Command::Top { interval, count } => {
            if !(0.05..=3600.0).contains(interval) {
                return Err(format!("--interval {interval}: give 0.05 to 3600 seconds"));
            }
            live::top(&h()?, Duration::from_secs_f64(*interval), *count)
        }
        Command::Ps { .. } | Command::Exporter { .. } => {
            Err("--pid names one process; `ps` and `exporter` cover every published handle".into())
        }
        Command::Bench { .. } => Err("bench measures allocators of its own; it cannot be used with --pid".into()),
    }
}

/// Writes a report to stdout.
fn out(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes()).and_then(|_| o.flush()).map_err(|e| format!("cannot write: {e}"))
}

/// Refuses a name that is no tunable, listing them.
fn check_tunable_name(name: &str) -> Result<(), String> {
    if zonal::sysctl::TUNABLES.iter().any(|t| t.name == name) {
        return Ok(());
    }
    let names: Vec<&str> = zonal::sysctl::TUNABLES.iter().map(|t| t.name).collect();
    Err(format!("unknown tunable `{name}`; tunables: {}", names.join(", ")))
}

/// A tunable's value as JSON: a number when it is one.
fn json_value(v: &str) -> serde_json::Value {
    v.parse::<u64>().map(serde_json::Value::from).unwrap_or_else(|_| serde_json::Value::String(v.to_string()))
}

fn print_sysctl(pairs: Vec<(String, String)>, json: bool) -> Result<(), String> {
    if json {
        let map: serde_json::Map<String, serde_json::Value> =
            pairs.into_iter().map(|(n, v)| (n, json_value(&v))).collect();
        out(&format!("{}\n", serde_json::Value::Object(map)))
    } else {
        out(&pairs.into_iter().map(|(n, v)| format!("{n} = {v}\n")).collect::<String>())
    }
}

/// `sysctl --doc [NAME..]`: the table of tunables, or the named ones.
fn sysctl_doc(items: &[String], json: bool) -> Result<(), String> {
    for i in items {
        if i.contains('=') {
            return Err(format!("`{i}`: --doc prints the table; it sets nothing"));
        }
        check_tunable_name(i.trim())?;
    }
    let rows: Vec<&zonal::tunables::Tunable> = zonal::sysctl::TUNABLES
        .iter()
        .filter(|t| items.is_empty() || items.iter().any(|i| i.trim() == t.name))
        .collect();
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|t| {
                serde_json::json!({ "name": t.name, "default": json_value(t.default),
                    "values": t.bounds.describe(), "unit": t.unit, "doc": t.doc })
            })
            .collect();
        return out(&(serde_json::to_string_pretty(&v).map_err(|e| e.to_string())? + "\n"));
    }
    out(&rows
        .iter()
        .map(|t| {
            // A choice's words are its values; "unit mode" would say nothing.
            let unit = match t.bounds {
                zonal::tunables::Bounds::Choice(_) => String::new(),
                _ => format!(", unit {}", t.unit),
            };
            format!("{} (default {}, {}{unit}): {}\n", t.name, t.default, t.bounds.describe(), t.doc)
        })
        .collect::<String>())
}

fn run(cli: Cli, publish: bool) -> Result<(), String> {
    match &cli.command {
        Command::Ps { json } if cli.pid.is_none() => {
            return out(&live::ps(&live::dir(cli.runtime_dir.as_deref()), *json)?)
        }
        Command::Exporter { listen } if cli.pid.is_none() => {
            return exporter::run(listen, &live::dir(cli.runtime_dir.as_deref()))
        }
        Command::Top { .. } if cli.pid.is_none() => {
            return Err("top watches a running process: give --pid PID (`zonal ps` lists them)".into())
        }
        _ => {}
    }
    if let Some(pid) = cli.pid {
        return run_live(&cli, pid);
    }
    if publish && matches!(cli.command, Command::Bench { .. }) {
        return Err("ZONAL_PUBLISH=1: the bench builds a new allocator for every cell and publishes none of them; \
                    unset ZONAL_PUBLISH (publish a program of your own to watch it live)"
            .into());
    }
    let config = config(&cli)?;
    // Shared, so that it can publish (into --dir when given); it lives until the command's
    // report is printed.
    let z = std::sync::Arc::new(Zonal::new(config.clone()).map_err(|e| e.to_string())?);
    if publish {
        let opts = zonal::live::PublishOptions { dir: cli.runtime_dir.clone(), ..Default::default() };
        z.publish_with(opts).map_err(|e| format!("ZONAL_PUBLISH=1: {e}"))?;
    }
    for item in &cli.set {
        set_tunable(&z, item)?;
    }
    match &cli.command {
        Command::Sysctl { items, all, doc, json } => {
            if *doc {
                return sysctl_doc(items, *json);
            }
            let mut shown = Vec::new();
            for item in items {
                let name = item.split_once('=').map_or(item.as_str(), |(n, _)| n).trim();
                check_tunable_name(name)?;
                if item.contains('=') {
                    set_tunable(&z, item)?;
                }
                shown.push(name.to_string());
            }
            let pairs: Vec<(String, String)> = if *all || items.is_empty() {
                z.sysctl_all().into_iter().map(|(n, v)| (n.to_string(), v)).collect()
            } else {
                shown
                    .iter()
                    .map(|n| z.sysctl_get(n).map(|v| (n.clone(), v)).map_err(|e| e.to_string()))
                    .collect::<Result<_, _>>()?
            };
            print_sysctl(pairs, *json)?;
        }
        Command::Topology { json } => out(&if *json { z.topology_json() + "\n" } else { z.topology_text() })?,
        Command::Ps { .. } | Command::Top { .. } | Command::Exporter { .. } => {
            return Err("this command reads published handles; it was dispatched before this point".into())
        }
        Command::Zoneinfo { workload, json } => {
            with_workload(&z, workload.as_deref())?;
            if *json {
                println!("{}", z.zone_stats_json());
            } else {
                print!("{}", z.zoneinfo());
            }
        }
        Command::Numastat { node, workload, json } => {
            with_workload(&z, workload.as_deref())?;
            note_uncounted_numa(&z, workload.is_some());
            match (node, json) {
                (Some(n), false) => print!("{}", z.numastat_node(zonal::NodeId(*n)).map_err(|e| e.to_string())?),
                (Some(n), true) => {
                    let v = z.node_numa_stats(zonal::NodeId(*n)).map_err(|e| e.to_string())?;
                    let obj: serde_json::Map<String, serde_json::Value> = zonal::vmstat::NumaStat::ALL
                        .iter()
                        .zip(v)
                        .map(|(s, x)| (s.numastat_name().to_string(), x.into()))
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&obj).map_err(|e| e.to_string())?);
                }
                (None, true) => println!("{}", z.numastat_json()),
                (None, false) => print!("{}", z.numastat()),
            }
        }
        Command::Vmstat { workload, json, prometheus } => {
            with_workload(&z, workload.as_deref())?;
            note_uncounted_numa(&z, workload.is_some());
            if *prometheus {
                print!("{}", z.prometheus());
            } else if *json {
                println!("{}", z.vmstat_json());
            } else {
                print!("{}", z.vmstat());
            }
        }
        Command::Buddyinfo { workload, json } => {
            with_workload(&z, workload.as_deref())?;
            if *json {
                println!("{}", z.buddyinfo_json());
            } else {
                print!("{}", z.buddyinfo());
            }
        }
        Command::Bench { experiments, reps, cell_ms, json, plot, quiet, only, tcmalloc_child, lockstep } => {
            let known: Vec<&str> = bench::EXPERIMENTS.iter().map(|(n, _)| *n).collect();
            let chosen: Vec<&str> = if experiments.is_empty() {
                known.clone()
            } else {
                for e in experiments {
                    if !known.contains(&e.as_str()) {
                        let list: Vec<String> = bench::EXPERIMENTS.iter().map(|(n, d)| format!("{n} ({d})")).collect();
                        return Err(format!("unknown experiment `{e}`; experiments: {}", list.join("; ")));
                    }
                }
                experiments.iter().map(String::as_str).collect()
            };
            bench::check_only(&chosen, only)?;
            let child = tcmalloc_child.as_deref().map(bench::parse_child_steps).transpose()?;
            // Every output is settled before the run, so that a bad path fails now and not
            // after minutes of measuring.
            let json_out = json.as_deref().map(bench::output::JsonOut::open).transpose()?;
            if let Some(dir) = plot {
                bench::plot::prepare(dir)?;
            }
            let mut opts = bench::BenchOpts {
                reps: *reps,
                cell_time: Duration::from_millis(*cell_ms),
                progress: !quiet,
                only: only.clone(),
                config: config.clone(),
                step: (0, 0),
                process: if child.is_some() { bench::CHILD_PROCESS } else { bench::MAIN_PROCESS },
                child: None,
                gated: *lockstep,
            };
            let ours = bench::runnable(&chosen, &opts);
            let (done, total) = match child {
                Some(steps) => steps,
                None => (0, ours.len()),
            };
            println!(
                "zonal bench on {} node(s), {} cpu(s); {} ms per cell; ratios are medians of per-repetition ratios\n",
                z.topology().nr_nodes(),
                zonal::cpu::nr_cpus_online(),
                cell_ms
            );
            if child.is_none() {
                println!("{}\n", bench::GLOSSARY);
            }
            println!("{}\n", bench::cpu_identity_note());
            let mut global = vec!["--max-order".to_string(), cli.max_order.to_string()];
            if let Some(t) = &cli.topology {
                global.extend(["--topology".to_string(), t.clone()]);
            }
            let (mut records, mut children) = (Vec::new(), Vec::new());
            for (i, &e) in ours.iter().enumerate() {
                let step = done + i + 1;
                opts.step = (step, total);
                // tcmalloc's per-CPU figures, taken in a child in lockstep with this run of the
                // experiment (see `start_tcmalloc_child`); none inside a child.
                let tcmalloc = match child {
                    Some(_) => None,
                    None => bench::start_tcmalloc_child(e, &opts, &global, (step - 1, total))?,
                };
                opts.child = tcmalloc.as_ref().map(bench::TcmallocChild::handle);
                records.extend(match e {
                    "single" => bench::single::run(&z, &opts)?,
                    "parallel" => bench::parallel::run(&z, &opts)?,
                    "bulk" => bench::bulk::run(&z, &opts)?,
                    "cross" => bench::cross::run(&z, &opts)?,
                    "mixed" => bench::mixed::run(&z, &opts)?,
                    "threshold" => bench::vmstat_exp::run_threshold(&z, &opts)?,
                    "modes" => bench::vmstat_exp::run_modes(&z, &opts)?,
                    "stats" => bench::vmstat_exp::run_stats(&z, &opts)?,
                    "zlc" => bench::zlc::run(&opts)?,
                    "numab" => bench::numab::run(&opts)?,
                    "scale" => bench::scale::run(&opts)?,
                    _ => unreachable!("checked against EXPERIMENTS"),
                });
                opts.child = None;
                if let Some(t) = tcmalloc {
                    children.extend(t.finish()?);
                }
            }
            let mut records = bench::to_json(&records, opts.process)?;
            records.extend(children);
            if child.is_none() {
                // History matters once an experiment ran after another: each then runs alone.
                if ours.len() >= 2 && opts.keeps(bench::ZONAL_ALONE) {
                    records.extend(bench::history::run_alone(&ours, &opts, &global)?);
                }
                bench::targets::print(&records);
            }
            if let Some(out) = json_out {
                let to = out.write(&records)?;
                // The child's file is the parent's to read, not the user's.
                if child.is_none() {
                    eprintln!("wrote {} records to {to}", records.len());
                }
            }
            if let Some(dir) = plot {
                // The history's runs alone are for its comparison, not another set of curves.
                records.retain(|r| !bench::history::is_history(r));
                for path in bench::plot::write_all(dir, &records)? {
                    eprintln!("wrote {}", path.display());
                }
            }
        }
    }
    Ok(())
}
