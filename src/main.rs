//! `zonal`: benchmarks, reports and tunables of the zonal page allocator.

mod bench;
mod exporter;
mod live;
mod workload;

use clap::{Args, CommandFactory, Parser, Subcommand};
use std::ffi::OsString;
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
                  one of two 64 MiB nodes) and reports on it or measures it, or reads the handle a running \
                  process published. `zonal COMMAND --help` lists the options of each.",
    after_help = "A command's options may also come before its name, as in \
                  `zonal --topology nodes=4,size=256M zoneinfo` or `zonal --pid 4242 top`.\n\n\
                  Errors go to stderr and start with `zonal: error:`. Exit status: 0 on success; 2 when \
                  the command line cannot be parsed (an unknown command or option, an option of another \
                  command, a missing or malformed value); 1 for any other error; 130 when `bench` was \
                  interrupted (SIGINT: it writes the experiments that finished to --json and --plot first)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The allocator a command builds for itself, and its tunables.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Allocator options")]
struct AllocArgs {
    /// Topology: a spec such as `nodes=4,size=256M` (keys nodes, size, sizes, cpus,
    /// distance), `sys` for this machine's real nodes, or a file of such items, one per line.
    /// Default: two fake nodes of 64 MiB.
    #[arg(long, value_name = "SPEC|FILE")]
    topology: Option<String>,

    /// Largest block order (MAX_ORDER), 0 to 15.
    #[arg(long, default_value_t = zonal::types::DEFAULT_MAX_ORDER.to_string(), value_name = "N")]
    max_order: String,

    /// Fault every frame in when the allocator starts (MADV_POPULATE_WRITE).
    #[arg(long)]
    populate: bool,

    /// Lock the allocator's memory (mlock).
    #[arg(long)]
    mlock: bool,

    /// Ask for transparent huge pages on the allocator's memory (MADV_HUGEPAGE).
    #[arg(long)]
    thp: bool,

    /// Set a tunable before the command runs (repeatable): NAME=VALUE, as `zonal sysctl`.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    set: Vec<String>,
}

/// The directory of published handles.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Published handles")]
struct DirArg {
    /// The directory of published handles, where ZONAL_PUBLISH=1 publishes too. Default:
    /// $ZONAL_RUNTIME_DIR, else $XDG_RUNTIME_DIR/zonal, else zonal-<uid> under the temporary
    /// directory.
    #[arg(long = "dir", value_name = "DIR")]
    runtime_dir: Option<std::path::PathBuf>,
}

/// A running process's handle, read instead of an allocator of the command's own.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Published handles")]
struct LiveArgs {
    /// Read (or tune) the handle a running process published instead of building an
    /// allocator of this command's own (`zonal ps` lists them).
    #[arg(long, value_name = "PID")]
    pid: Option<i32>,

    /// With --pid: which of the process's published handles (needed when it has several).
    #[arg(long, value_name = "H", requires = "pid")]
    handle: Option<u64>,

    /// With --pid: seconds to wait for the process's answer (0.1 to 3600) [default: 5].
    #[arg(long, value_name = "SECS", requires = "pid")]
    timeout: Option<f64>,

    #[command(flatten)]
    dir: DirArg,
}

/// `top`'s process: --pid is required.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Published handles")]
struct TopTarget {
    /// The process whose published handle to watch (`zonal ps` lists them).
    #[arg(long, value_name = "PID")]
    pid: i32,

    /// Which of the process's published handles (needed when it has several).
    #[arg(long, value_name = "H")]
    handle: Option<u64>,

    /// Seconds to wait for each of the process's answers (0.1 to 3600) [default: 5].
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,

    #[command(flatten)]
    dir: DirArg,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the topology: nodes, their memory and CPUs, distances and zonelists
    ///
    /// Each node's zonelist is the order in which an allocation from that node tries the
    /// nodes.
    Topology {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        alloc: AllocArgs,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// Print every zone in the layout of Linux's /proc/zoneinfo
    ///
    /// Pages free, watermarks min/low/high, spanned/present/managed, the zone counters, then
    /// the NUMA counters, then each CPU's pageset: count, high, batch and vm stats threshold.
    /// In the default numa_stats_mode `auto` the NUMA counters start counting at their first
    /// read, so a `--workload` run before the first report leaves them at zero (seed 001);
    /// add `--set numa_stats_mode=strict` to count it.
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
        #[command(flatten)]
        alloc: AllocArgs,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// Print the NUMA counters per node, as the `numastat` command does
    ///
    /// The counters are numa_hit, numa_miss, numa_foreign, interleave_hit, local_node and
    /// other_node; with --node, one node's in the layout of
    /// /sys/devices/system/node/nodeN/numastat. In the default numa_stats_mode `auto`,
    /// counting starts at the first read of the counters (any report), so after `--workload`
    /// alone they are still zero: add `--set numa_stats_mode=strict` to count the workload
    /// (seed 001).
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
        #[command(flatten)]
        alloc: AllocArgs,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// Print every counter in the layout of Linux's /proc/vmstat, as JSON, or for Prometheus
    ///
    /// The zone counters summed over zones, the NUMA counters and the events. The Prometheus
    /// text exposition has the zone figures too (`zonal_vmstat_*`,
    /// `zonal_zoneinfo_*{node,zone}`, named as node_exporter's vmstat and zoneinfo collectors
    /// name theirs). In the default numa_stats_mode `auto` the NUMA counters start counting at
    /// their first read, so a `--workload` run before it leaves them at zero (seed 001); add
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
        #[command(flatten)]
        alloc: AllocArgs,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// Print free blocks per order per zone in the layout of Linux's /proc/buddyinfo
    Buddyinfo {
        /// Run a synthetic workload first: allocs=N,orders=A-B,policy=P,free=PCT,seed=S
        /// (defaults and policies: see `zonal zoneinfo --help`).
        #[arg(long, value_name = "SPEC")]
        workload: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        alloc: AllocArgs,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// Show or set run-time tunables, like sysctl
    ///
    /// `-a` lists every one, NAME prints one, NAME=VALUE sets it (rejected with the old value
    /// kept if invalid) and prints it. A setting lasts as long as the allocator it is made on:
    /// without --pid that is this command's own, so it ends with the command (use --set
    /// NAME=VALUE with another command, or ZONAL_<NAME> in the environment of a program, to
    /// keep one); with --pid it changes the running process's handle. Tunables are also read
    /// from ZONAL_<NAME> when an allocator is built.
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
        #[command(flatten)]
        alloc: AllocArgs,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// List the published handles of this user's processes
    ///
    /// A handle is published with ZONAL_PUBLISH=1, the config key publish=1, Zonal::publish
    /// or zonal_publish. Each row gives pid, handle, command, nodes, CPUs, requests served and
    /// socket. Sockets of processes that died are removed.
    Ps {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Seconds to wait for the handles' answers, all asked at once (0.1 to 3600)
        /// [default: 5]. A handle that does not answer in time is listed as such.
        #[arg(long, value_name = "SECS")]
        timeout: Option<f64>,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Watch a running process's handle, node by node, refreshing
    ///
    /// Per node: pages managed, free and on per-CPU lists, watermark headroom, the change in
    /// pages used, the allocation rate and the NUMA hit, miss and foreign rates and the local
    /// share; for the whole handle the event rates, and NUMA balancing's rates when the
    /// process balances regions.
    Top {
        /// Seconds between frames (0.05 to 3600).
        #[arg(long, default_value_t = 1.0, value_name = "SECS")]
        interval: f64,
        /// Frames to show, then exit (0: until interrupted).
        #[arg(long, default_value_t = 0, value_name = "N")]
        count: u64,
        #[command(flatten)]
        target: TopTarget,
    },
    /// Serve the counters of every published handle of this user to Prometheus
    ///
    /// The text exposition is served at http://ADDR/metrics, with `pid` and `handle` labels
    /// (names as `vmstat --prometheus`) and `zonal_up{pid,handle}` for whether each answered.
    /// Prints the address it serves on first (port 0 picks a free port).
    Exporter {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9835", value_name = "ADDR")]
        listen: String,
        /// Seconds a scrape waits for the handles' answers, all asked at once (0.1 to 3600)
        /// [default: 2]. A handle that does not answer in time is reported with zonal_up 0.
        #[arg(long, value_name = "SECS")]
        timeout: Option<f64>,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Run the benchmark experiments, zonal beside its peers, and judge the targets
    ///
    /// Runs the experiments named (all of them when none is) and prints each as a table of ns
    /// per operation (median, min – max over repetitions) and ratios to the reference peer
    /// measured in the same repetitions. Experiments: single (one thread, order-0 alloc + free
    /// pairs, page_bench01, beside snmalloc, tcmalloc, mimalloc, jemalloc, glibc, the kernel
    /// and an ideal per-thread stack), parallel (T threads, page_bench03), bulk (N pages per
    /// call, page_bench04_bulk), cross (allocated on one CPU, freed on another), mixed (every
    /// CPU on one zone, each thread keeping 4096 frames and freeing half of them itself,
    /// handing half to the next CPU's thread in batches of 64), threshold (seed 000's NUMA
    /// counter threshold), modes (seed 001's numa_stats_mode), stats (seed 002: shared against per-CPU NUMA
    /// counters, per-page against batched bulk accounting), zlc (seed 003: the zonelist cache
    /// on 8 and 28 fake nodes), numab (seed 004: NUMA balancing moving a region to its
    /// threads' node, delayed against eager mapping on the userfaultfd and mprotect backends;
    /// one run's length from ZONAL_NUMAB_SECONDS, default 1.3, and an optional busy-wait per
    /// remote access from ZONAL_NUMAB_REMOTE_PENALTY_NS).
    Bench(BenchArgs),
}

/// `zonal bench`'s options.
#[derive(Args, Debug)]
struct BenchArgs {
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
    #[command(flatten)]
    alloc: AllocArgs,
}

fn main() -> ExitCode {
    // zonal does not panic on bad input; should a bug panic anyway, say so in one line.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("zonal: internal error: {info}");
    }));
    let cli = match parse(std::env::args_os().collect()) {
        Ok(cli) => cli,
        Err(e) => return e,
    };
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
    let done = publish.map_err(|e| e.to_string()).and_then(|publish| match &cli.command {
        Command::Bench(b) => bench(b, publish),
        command => run(command, publish).map(|()| ExitCode::SUCCESS),
    });
    match done {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("zonal: error: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the command line; on a usage error, says so and gives the exit status.
fn parse(args: Vec<OsString>) -> Result<Cli, ExitCode> {
    let args = hoist(args).map_err(|msg| {
        eprintln!("zonal: error: {msg}");
        ExitCode::from(2)
    })?;
    Cli::try_parse_from(&args).map_err(|e| {
        // An option of another command, after this one's name: say where it applies.
        let misplaced = (e.kind() == clap::error::ErrorKind::UnknownArgument)
            .then(|| e.get(clap::error::ContextKind::InvalidArg))
            .flatten()
            .and_then(|arg| misplaced_option(&args, &arg.to_string()));
        match misplaced {
            Some(msg) => {
                eprintln!("zonal: error: {msg}");
                ExitCode::from(2)
            }
            None => clap_error(&e),
        }
    })
}

/// Prints what clap has to say: help and the version as clap prints them, and a usage
/// error in zonal's own words' style (`zonal: error: ...`, exit 2), so that a script reads
/// one prefix whichever part of zonal refused the command line.
fn clap_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let text = e.render().to_string();
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => eprint!("zonal: error: give a command\n\n{text}"),
        _ => eprint!("zonal: error: {}", text.strip_prefix("error: ").unwrap_or(&text)),
    }
    ExitCode::from(2)
}

/// Every option was global once, so `zonal --pid 4242 top` and `zonal --topology SPEC
/// zoneinfo` are in scripts and habits. Each command now has only its own options, and
/// those written before its name are moved after it; one the command does not take is
/// refused with where it applies. Options are recognised by clap's own definitions: a long
/// option of some command, with its value when it takes one.
fn hoist(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let cli = Cli::command();
    let takes_value = |name: &str| {
        cli.get_subcommands()
            .flat_map(|c| c.get_arguments())
            .find(|a| a.get_long() == Some(name))
            .map(|a| a.get_action().takes_values())
    };
    let mut names = Vec::new();
    let mut i = 1;
    while let Some(word) = args.get(i).and_then(|a| a.to_str()) {
        let Some(long) = word.strip_prefix("--") else { break };
        let (name, inline) = long.split_once('=').map_or((long, false), |(n, _)| (n, true));
        let Some(value) = takes_value(name) else { break };
        names.push(name.to_string());
        i += if value && !inline { 2 } else { 1 };
    }
    let command = args.get(i).and_then(|a| a.to_str()).and_then(|n| cli.find_subcommand(n));
    let Some(command) = command.filter(|_| !names.is_empty()) else { return Ok(args) };
    if let Some(name) = names.iter().find(|n| !command.get_arguments().any(|a| a.get_long() == Some(n.as_str()))) {
        return Err(misplaced(command.get_name(), name));
    }
    let mut out = vec![args[0].clone(), args[i].clone()];
    out.extend(args[1..i].iter().cloned());
    out.extend(args[i + 1..].iter().cloned());
    Ok(out)
}

/// For an option clap found no place for (`--pid`, `--pid=1`): where it applies, when it is
/// an option of another command than the one on the command line.
fn misplaced_option(args: &[OsString], arg: &str) -> Option<String> {
    let cli = Cli::command();
    let name = arg.strip_prefix("--")?.split('=').next()?;
    let command = args.iter().skip(1).filter_map(|a| a.to_str()).find_map(|a| cli.find_subcommand(a))?;
    let elsewhere = cli.get_subcommands().flat_map(|c| c.get_arguments()).any(|a| a.get_long() == Some(name));
    elsewhere.then(|| misplaced(command.get_name(), name))
}

/// `--NAME does not apply to COMMAND`, with why where there is more to say than that.
fn misplaced(command: &str, name: &str) -> String {
    let why = match (command, name) {
        ("ps" | "exporter", "pid" | "handle") => ": `ps` and `exporter` cover every published handle",
        ("bench", "pid" | "handle") => ": bench measures allocators of its own",
        ("bench", "dir") => ": bench builds a new allocator for every cell and publishes none of them",
        ("top", _) => ": top watches a running process's handle and builds no allocator",
        ("ps" | "exporter", _) => ": `ps` and `exporter` read published handles and build no allocator",
        _ => "",
    };
    format!("--{name} does not apply to `{command}`{why}; `zonal {command} --help` lists its options")
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
fn config(a: &AllocArgs) -> Result<Config, String> {
    let topo = topology(a.topology.as_deref())?;
    let mut config = Config::new(topo).max_order(parse_max_order(&a.max_order)?);
    config.arena = zonal::ArenaOptions { populate: a.populate, mlock: a.mlock, thp: a.thp };
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
fn run_live(command: &Command, alloc: &AllocArgs, target: &LiveArgs, pid: i32) -> Result<(), String> {
    // Options that shape a local allocator mean nothing for a running process's.
    let local = [
        (alloc.topology.is_some(), "--topology"),
        (alloc.max_order != zonal::types::DEFAULT_MAX_ORDER.to_string(), "--max-order"),
        (alloc.populate, "--populate"),
        (alloc.mlock, "--mlock"),
        (alloc.thp, "--thp"),
        (!alloc.set.is_empty(), "--set"),
    ];
    if let Some((_, flag)) = local.iter().find(|(on, _)| *on) {
        return Err(format!(
            "{flag} shapes an allocator of this command's own; with --pid the figures come from the running \
             process's handle (tune it with `zonal --pid {pid} sysctl NAME=VALUE`)"
        ));
    }
    let dir = live::dir(target.dir.runtime_dir.as_deref());
    let no_workload = |w: &Option<String>| match w {
        Some(_) => {
            Err("--workload runs on an allocator of this command's own; it cannot be used with --pid".to_string())
        }
        None => Ok(()),
    };
    let timeout = live::timeout(target.timeout, live::TIMEOUT)?;
    let h = || live::target(&dir, pid, target.handle, timeout);
    match command {
        Command::Topology { json, .. } => {
            let text = h()?.ask(if *json { "topology json" } else { "topology" })?;
            // The tiers from the spec the process reports (its own balancer, if any, ranks
            // the same topology the same way).
            let spec = match *json {
                true => serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| v["spec"].as_str().map(String::from)),
                false => text.lines().find_map(|l| l.strip_prefix("spec: ").map(String::from)),
            };
            let any = zonal::topology::Machine { nr_cpus: 1, mem_total: u64::MAX };
            match spec.and_then(|s| Topology::parse_for(&s, any).ok()) {
                Some(t) => out(&with_tiers(text, &t, *json)),
                None => out(&text),
            }
        }
        Command::Zoneinfo { workload, json, .. } => {
            no_workload(workload)?;
            out(&h()?.ask(if *json { "zoneinfo json" } else { "zoneinfo" })?)
        }
        Command::Buddyinfo { workload, json, .. } => {
            no_workload(workload)?;
            out(&h()?.ask(if *json { "buddyinfo json" } else { "buddyinfo" })?)
        }
        Command::Vmstat { workload, json, prometheus, .. } => {
            no_workload(workload)?;
            let req = if *prometheus {
                "vmstat prometheus"
            } else if *json {
                "vmstat json"
            } else {
                "vmstat"
            };
            out(&h()?.ask(req)?)
        }
        Command::Numastat { node, workload, json, .. } => {
            no_workload(workload)?;
            let mut req = "numastat".to_string();
            if let Some(n) = node {
                req += &format!(" node {n}");
            }
            if *json {
                req += " json";
            }
            out(&h()?.ask(&req)?)
        }
        Command::Sysctl { items, all, doc, json, .. } => {
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
                    Some(v) => h.ask(&format!("sysctl set {name} {v}")),
                    None => h.ask(&format!("sysctl get {name}")),
                };
                // A balancer's tunable is the process's only while a balancer runs on the handle.
                let got = got.map_err(|e| match zonal_numab::tunable::tunable(name) {
                    Ok(_) if e.contains("unknown tunable") => format!(
                        "process {pid} handle {} runs no NUMA balancing (a zonal-numab Balancer), whose \
                         tunable `{name}` is",
                        h.handle.handle
                    ),
                    _ => e,
                })?;
                shown.push((name.to_string(), got.trim().to_string()));
            }
            if *all || items.is_empty() {
                shown = h
                    .ask("sysctl all")?
                    .lines()
                    .filter_map(|l| l.split_once(" = ").map(|(n, v)| (n.to_string(), v.to_string())))
                    .collect();
            }
            print_sysctl(shown, *json)
        }
        Command::Top { .. } | Command::Ps { .. } | Command::Exporter { .. } | Command::Bench(_) => {
            Err("this command takes no --pid; it was dispatched before this point".into())
        }
    }
}

/// Writes a report to stdout.
fn out(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes()).and_then(|_| o.flush()).map_err(|e| format!("cannot write: {e}"))
}

/// Refuses a name that is no tunable (of zonal or of its NUMA balancing layer), listing them.
fn check_tunable_name(name: &str) -> Result<(), String> {
    let numab = zonal_numab::tunable::TUNABLES.iter().map(|t| t.name);
    if zonal::sysctl::TUNABLES.iter().map(|t| t.name).chain(numab.clone()).any(|n| n == name) {
        return Ok(());
    }
    let names: Vec<&str> = zonal::sysctl::TUNABLES.iter().map(|t| t.name).chain(numab).collect();
    Err(format!("unknown tunable `{name}`; tunables: {}", names.join(", ")))
}

/// A topology report with its memory tiers (`zonal_numab::Tiers`): a section after the
/// text, or a `tiers` array in the JSON.
fn with_tiers(report: String, t: &Topology, json: bool) -> String {
    let tiers = zonal_numab::Tiers::of(t);
    if !json {
        return report + &tiers.describe();
    }
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&report) else { return report };
    let rows: Vec<serde_json::Value> = (0..t.nr_nodes() as u16)
        .map(|n| {
            serde_json::json!({ "node": n, "tier": tiers.tier(n), "top": tiers.is_top(n),
                "adistance": tiers.adistance(n), "demotes_to": tiers.demote_to(n) })
        })
        .collect();
    v["tiers"] = serde_json::Value::Array(rows);
    serde_json::to_string_pretty(&v).map_or(report, |s| s + "\n")
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
    let layer: Vec<&zonal_numab::tunable::Tunable> = zonal_numab::tunable::TUNABLES
        .iter()
        .filter(|t| items.is_empty() || items.iter().any(|i| i.trim() == t.name))
        .collect();
    let layer_values = |t: &zonal_numab::tunable::Tunable| format!("{}..={}", t.min, t.max);
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|t| {
                serde_json::json!({ "name": t.name, "default": json_value(t.default),
                    "values": t.bounds.describe(), "unit": t.unit, "doc": t.doc })
            })
            .chain(layer.iter().map(|t| {
                serde_json::json!({ "name": t.name, "default": json_value(t.default),
                    "values": layer_values(t), "unit": t.unit, "doc": t.doc, "layer": "numab" })
            }))
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
        .chain(layer.iter().map(|t| {
            format!(
                "{} (NUMA balancing layer; default {}, {}, unit {}): {}\n",
                t.name,
                t.default,
                layer_values(t),
                t.unit,
                t.doc
            )
        }))
        .collect::<String>())
}

fn run(command: &Command, publish: bool) -> Result<(), String> {
    let (alloc, target) = match command {
        Command::Ps { json, timeout, dir } => {
            let timeout = live::timeout(*timeout, live::TIMEOUT)?;
            return out(&live::ps(&live::dir(dir.runtime_dir.as_deref()), *json, timeout)?);
        }
        Command::Exporter { listen, timeout, dir } => {
            let timeout = live::timeout(*timeout, exporter::HANDLE_TIMEOUT)?;
            return exporter::run(listen, &live::dir(dir.runtime_dir.as_deref()), timeout);
        }
        Command::Top { interval, count, target } => {
            if !(0.05..=3600.0).contains(interval) {
                return Err(format!("--interval {interval}: give 0.05 to 3600 seconds"));
            }
            let timeout = live::timeout(target.timeout, live::TIMEOUT)?;
            let h = live::target(&live::dir(target.dir.runtime_dir.as_deref()), target.pid, target.handle, timeout)?;
            return live::top(&h, Duration::from_secs_f64(*interval), *count);
        }
        Command::Bench(_) => return Err("bench was dispatched before this point".into()),
        Command::Topology { alloc, live, .. }
        | Command::Zoneinfo { alloc, live, .. }
        | Command::Numastat { alloc, live, .. }
        | Command::Vmstat { alloc, live, .. }
        | Command::Buddyinfo { alloc, live, .. }
        | Command::Sysctl { alloc, live, .. } => (alloc, live),
    };
    if let Some(pid) = target.pid {
        return run_live(command, alloc, target, pid);
    }
    let config = config(alloc)?;
    // Shared, so that it can publish (into --dir when given); it lives until the command's
    // report is printed.
    let z = std::sync::Arc::new(Zonal::new(config).map_err(|e| e.to_string())?);
    if publish {
        let opts = zonal::live::PublishOptions { dir: target.dir.runtime_dir.clone(), ..Default::default() };
        z.publish_with(opts).map_err(|e| format!("ZONAL_PUBLISH=1: {e}"))?;
    }
    for item in &alloc.set {
        set_tunable(&z, item)?;
    }
    match command {
        Command::Sysctl { items, all, doc, json, .. } => {
            if *doc {
                return sysctl_doc(items, *json);
            }
            let mut shown = Vec::new();
            // The NUMA balancing layer's tunables: this command has no balancer, so a value
            // is checked as a balancer checks it and shown, and ends with the command as
            // every setting of the command's own handle does.
            let mut layer: Vec<(String, String)> =
                zonal_numab::tunable::TUNABLES.iter().map(|t| (t.name.to_string(), t.default.to_string())).collect();
            for item in items {
                let name = item.split_once('=').map_or(item.as_str(), |(n, _)| n).trim();
                check_tunable_name(name)?;
                match (item.split_once('='), layer.iter_mut().find(|(n, _)| n == name)) {
                    (Some((_, v)), Some(slot)) => {
                        slot.1 = zonal_numab::tunable::parse(name, v).map_err(|e| e.to_string())?.to_string()
                    }
                    (Some(_), None) => set_tunable(&z, item)?,
                    (None, _) => {}
                }
                shown.push(name.to_string());
            }
            let pairs: Vec<(String, String)> = if *all || items.is_empty() {
                z.sysctl_all().into_iter().map(|(n, v)| (n.to_string(), v)).chain(layer).collect()
            } else {
                shown
                    .iter()
                    .map(|n| match layer.iter().find(|(l, _)| l == n) {
                        Some(p) => Ok(p.clone()),
                        None => z.sysctl_get(n).map(|v| (n.clone(), v)).map_err(|e| e.to_string()),
                    })
                    .collect::<Result<_, _>>()?
            };
            print_sysctl(pairs, *json)?;
        }
        Command::Topology { json, .. } => {
            let report = if *json { z.topology_json() + "\n" } else { z.topology_text() };
            out(&with_tiers(report, z.topology(), *json))?
        }
        Command::Ps { .. } | Command::Top { .. } | Command::Exporter { .. } | Command::Bench(_) => {
            return Err("this command builds no report of its own; it was dispatched before this point".into())
        }
        Command::Zoneinfo { workload, json, .. } => {
            with_workload(&z, workload.as_deref())?;
            if *json {
                println!("{}", z.zone_stats_json());
            } else {
                print!("{}", z.zoneinfo());
            }
        }
        Command::Numastat { node, workload, json, .. } => {
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
        Command::Vmstat { workload, json, prometheus, .. } => {
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
        Command::Buddyinfo { workload, json, .. } => {
            with_workload(&z, workload.as_deref())?;
            if *json {
                println!("{}", z.buddyinfo_json());
            } else {
                print!("{}", z.buddyinfo());
            }
        }
    }
    Ok(())
}

/// `zonal bench`.
fn bench(b: &BenchArgs, publish: bool) -> Result<ExitCode, String> {
    if publish {
        return Err("ZONAL_PUBLISH=1: the bench builds a new allocator for every cell and publishes none of them; \
                    unset ZONAL_PUBLISH (publish a program of your own to watch it live)"
            .into());
    }
    let BenchArgs { experiments, reps, cell_ms, json, plot, quiet, only, tcmalloc_child, lockstep, alloc } = b;
    let config = config(alloc)?;
    let z = Zonal::new(config.clone()).map_err(|e| e.to_string())?;
    for item in &alloc.set {
        set_tunable(&z, item)?;
    }
    let known: Vec<&str> = bench::EXPERIMENTS.iter().map(|(n, _)| *n).collect();
    let chosen: Vec<&str> = if experiments.is_empty() {
        known.iter().copied().filter(|e| !bench::ON_REQUEST.contains(e)).collect()
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
    let mut global = vec!["--max-order".to_string(), alloc.max_order.to_string()];
    if let Some(t) = &alloc.topology {
        global.extend(["--topology".to_string(), t.clone()]);
    }
    // SIGINT from here on writes what finished and exits 130 (`bench::interrupt`).
    bench::interrupt::install()?;
    let (mut records, mut children) = (Vec::new(), Vec::new());
    // The experiments that finished, and the one SIGINT stopped unfinished.
    let (mut finished, mut cut): (Vec<&str>, Option<&str>) = (Vec::new(), None);
    for (i, &e) in ours.iter().enumerate() {
        if bench::interrupt::interrupted() {
            break;
        }
        let step = done + i + 1;
        opts.step = (step, total);
        // tcmalloc's per-CPU figures, taken in a child in lockstep with this run of the
        // experiment (see `start_tcmalloc_child`); none inside a child.
        let tcmalloc = match child {
            Some(_) => None,
            None => bench::start_tcmalloc_child(e, &opts, &global, (step - 1, total))?,
        };
        opts.child = tcmalloc.as_ref().map(bench::TcmallocChild::handle);
        let measured = match e {
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
            "tier" => bench::tier::run(&opts)?,
            _ => unreachable!("checked against EXPERIMENTS"),
        };
        opts.child = None;
        if bench::interrupt::cut_short() {
            if let Some(t) = tcmalloc {
                t.abandon();
            }
            cut = Some(e);
            break;
        }
        if let Some(t) = tcmalloc {
            match t.finish() {
                Ok(r) => children.extend(r),
                // The child stopped at SIGINT too: a Ctrl-C reaches the whole process group.
                Err(_) if bench::interrupt::interrupted() => {
                    cut = Some(e);
                    break;
                }
                Err(err) => return Err(err),
            }
        }
        records.extend(measured);
        finished.push(e);
        if let Some(out) = &json_out {
            let mut so_far = bench::to_json(&records, opts.process)?;
            so_far.extend(children.iter().cloned());
            out.checkpoint(&so_far)?;
        }
    }
    let mut records = bench::to_json(&records, opts.process)?;
    records.extend(children);
    let stopped = bench::interrupt::interrupted();
    if child.is_none() && !stopped {
        // History matters once an experiment ran after another: each then runs alone.
        if ours.len() >= 2 && opts.keeps(bench::ZONAL_ALONE) {
            records.extend(bench::history::run_alone(&ours, &opts, &global)?);
        }
        if !bench::interrupt::interrupted() {
            bench::targets::print(&records);
        }
    }
    let interrupted = bench::interrupt::interrupted();
    if interrupted {
        let targets = if child.is_none() { "; the targets are not judged" } else { "" };
        let when = match (stopped, finished.last()) {
            (false, _) => format!(
                "during the history's runs alone, after all {total} experiments (the runs alone that finished are kept)"
            ),
            (true, Some(last)) => format!("after experiment {} of {total} ({last})", done + finished.len()),
            (true, None) => "before any experiment finished".to_string(),
        };
        let unfinished = cut
            .map(|e| {
                format!(
                    "; {e} was stopped unfinished: its tables above are from fewer repetitions than they say, and \
                     its records are left out"
                )
            })
            .unwrap_or_default();
        eprintln!("zonal bench: interrupted (SIGINT) {when}{unfinished}{targets}");
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
    // 128 + SIGINT, as a shell reports a command SIGINT ended.
    Ok(if interrupted { ExitCode::from(130) } else { ExitCode::SUCCESS })
}
