//! `zonal bench`: the experiments of the seeds and the peers, side by side in one run.
//!
//! Method: every experiment measures all its subjects in each repetition, in an order that
//! rotates from one repetition to the next (so no subject always runs first or last), and
//! reports per subject the median, min and max over the repetitions. Each figure's ratio to
//! the reference subject is taken within a repetition (subject / reference from the same
//! repetition) and the median of those ratios is reported, so machine-wide drift during the
//! run cancels out. Times are wall-clock `Instant` readings around a loop of calibrated length.

pub mod bulk;
pub mod cross;
pub mod history;
pub mod interrupt;
pub mod lockstep;
pub mod mixed;
pub mod numab;
pub mod output;
pub mod page_api;
pub mod parallel;
pub mod peers;
pub mod plot;
pub mod scale;
pub mod single;
pub mod targets;
pub mod tier;
pub mod vmstat_exp;
pub mod zlc;

use serde::Serialize;
use std::time::{Duration, Instant};

/// Every experiment, in the order `zonal bench` runs them.
pub const EXPERIMENTS: &[(&str, &str)] = &[
    ("single", "one thread, order-0 alloc + free pairs (page_bench01)"),
    ("parallel", "T threads each doing single, T = 1 .. nproc and 2 × nproc (page_bench03)"),
    ("bulk", "N = 1 .. 128 pages per bulk call, array and list forms (page_bench04_bulk)"),
    ("cross", "one thread allocates, another on the other CPU frees"),
    (
        "mixed",
        "every CPU on one zone, each thread keeping 4096 frames, freeing half itself and handing half to the next CPU in batches of 64",
    ),
    ("threshold", "seed 000: the NUMA counter threshold swept, all CPUs on one zone"),
    ("modes", "seed 001: numa_stats_mode strict, coarse, auto before and after a read"),
    (
        "stats",
        "seed 002: accurate shared NUMA counters against per-CPU events, per-page against batched bulk accounting",
    ),
    ("zlc", "seed 003: the zonelist cache on and off, 8 and 28 fake nodes, most full ahead"),
    (
        "numab",
        "seed 004: NUMA balancing moving a region to its threads' node, delayed against eager mapping, \
         userfaultfd and mprotect",
    ),
    ("scale", "issue 38: costs against 2 to 1024 CPUs (virtual ones, vcpus=N) and 1, 2 and 8 fake nodes"),
    (
        "tier",
        "issue 41: memory tiering, a hot set on a memory-only node promoted to the CPUs' node, cold data demoted; \
         mode 1, mode 2 delayed and eager, and the ideal (run only when named)",
    ),
];

/// The experiments `zonal bench` runs only when named: `tier` takes ~55 s (two repetitions), and
/// the full run is kept to a few minutes.
pub const ON_REQUEST: &[&str] = &["tier"];

/// The experiments with tcmalloc among their peers.
pub const WITH_TCMALLOC: &[&str] = &["single", "parallel", "bulk", "cross", "mixed"];

/// The subject whose name `--only` must keep for the experiments that measure zonal alone
/// (threshold, modes, stats, zlc, numab) to run.
pub const ZONAL_ALONE: &str = "zonal pcp";

/// The first line of the report after its header: what the names it uses stand for.
pub const GLOSSARY: &str = "seed 000-004: the Linux patches whose experiments zonal reproduces (000 the NUMA counter \
     threshold, 001 numa_stats_mode, 002 per-CPU NUMA counters and batched bulk accounting, 003 the zonelist cache, \
     004 NUMA balancing's delayed mapping); page_bench01/03/04_bulk: the kernel's page allocator microbenchmark \
     module (page_bench) from Jesper Dangaard Brouer's prototype-kernel";

/// The `process` field of the records of the main process and of the tcmalloc child.
pub const MAIN_PROCESS: &str = "main";
pub const CHILD_PROCESS: &str = "tcmalloc-child";

/// The subjects an experiment can measure, by name, for `--only` to choose among: the
/// measured subjects of single, parallel, bulk, cross and mixed; `zonal pcp` for the others, which
/// measure zonal alone and run when `--only` keeps it.
pub fn subject_names(experiment: &str) -> Vec<String> {
    match experiment {
        "single" => single::names(),
        "parallel" => parallel::names(),
        "bulk" => bulk::names(),
        "cross" => cross::names(),
        "mixed" => mixed::names(),
        _ => vec![ZONAL_ALONE.into()],
    }
}

/// Refuses an `--only` that cannot mean what it says, before anything runs: an empty name,
/// a name that starts no subject of `experiments`, or names that keep nothing but mimalloc
/// (the reference, measured beside every subject; alone it leaves every table empty).
pub fn check_only(experiments: &[&str], only: &[String]) -> Result<(), String> {
    if only.is_empty() {
        return Ok(());
    }
    let mut all: Vec<String> = Vec::new();
    for e in experiments {
        for n in subject_names(e) {
            if !all.contains(&n) {
                all.push(n);
            }
        }
    }
    let listing = || {
        format!(
            "subjects of {}: {} (a name keeps every subject it starts; threshold, modes, stats, zlc and numab measure \
             zonal alone and run when `{ZONAL_ALONE}` is kept; mimalloc, the reference, is always measured)",
            experiments.join(", "),
            all.join(", ")
        )
    };
    if only.iter().any(|p| p.trim().is_empty()) {
        return Err(format!("--only has an empty name; {}", listing()));
    }
    let unknown: Vec<&str> =
        only.iter().map(String::as_str).filter(|p| !all.iter().any(|n| n.starts_with(p))).collect();
    if !unknown.is_empty() {
        let names: Vec<String> = unknown.iter().map(|u| format!("`{u}`")).collect();
        return Err(format!("--only {} matches no subject; {}", names.join(", "), listing()));
    }
    if all.iter().filter(|n| *n != "mimalloc").all(|n| !only.iter().any(|p| n.starts_with(p.as_str()))) {
        return Err(format!(
            "--only {} keeps nothing but mimalloc, the reference, which is measured beside every subject anyway: \
             name the subjects to compare with it; {}",
            only.join(","),
            listing()
        ));
    }
    Ok(())
}

/// Of `chosen`, the experiments this process runs: those `--only` leaves a subject in.
pub fn runnable<'a>(chosen: &[&'a str], opts: &BenchOpts) -> Vec<&'a str> {
    chosen.iter().copied().filter(|e| WITH_TCMALLOC.contains(e) || opts.keeps(ZONAL_ALONE)).collect()
}

/// Of `chosen`, the experiments the tcmalloc child runs (none when it does not run: see
/// [`start_tcmalloc_child`]).
pub fn child_experiments<'a>(chosen: &[&'a str], opts: &BenchOpts) -> Vec<&'a str> {
    if !opts.only.is_empty() || !zonal::cpu::glibc_rseq_registered() {
        return Vec::new();
    }
    chosen.iter().copied().filter(|e| WITH_TCMALLOC.contains(e)).collect()
}

/// Google tcmalloc's per-CPU caches need the thread's rseq area, which glibc (2.35+)
/// registers for itself, and a thread has only one. zonal's own fast path reads glibc's area.
/// So `zonal bench` measures everything in this process as users run it (glibc's rseq on:
/// zonal on its restartable sequences, tcmalloc on per-thread caches), and runs each
/// experiment that has tcmalloc again in a child process with
/// `GLIBC_TUNABLES=glibc.pthread.rseq=0`, measuring only tcmalloc (now on its per-CPU caches)
/// and mimalloc, the reference, beside it: one child per experiment, in lockstep with this
/// process's run of it ([`lockstep`]: the child's repetition `r` right after this process's,
/// so that the two processes' ratios, which the targets compare, are taken over the same
/// phases of this machine). The child's tables are printed after the main process's; its
/// JSON records are returned for the parent's file. Nothing happens when glibc's rseq is
/// already off here (tcmalloc is per-CPU in this process then, and zonal finds its CPU with
/// `sched_getcpu`).
///
/// The child's records carry `"process": "tcmalloc-child"` (the main process's `"main"`), so
/// that its mimalloc, measured again beside tcmalloc, is told apart from the main one. It
/// numbers its experiment `done + 1` of `total` (its progress is not shown: the main
/// process's says it follows). Its records always come back: the targets read them. Returns
/// once the child has built its allocators and sized its cells, stopped
/// before its first repetition; `None` when no child runs for `experiment`.
pub fn start_tcmalloc_child(
    experiment: &str,
    opts: &BenchOpts,
    global_args: &[String],
    (done, total): (usize, usize),
) -> Result<Option<TcmallocChild>, String> {
    if child_experiments(&[experiment], opts).is_empty() {
        return Ok(None);
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program to re-run it: {e}"))?;
    let current = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    let value = if current.is_empty() { TCMALLOC_TUNABLE.to_string() } else { format!("{current}:{TCMALLOC_TUNABLE}") };
    let json = std::env::temp_dir().join(format!("zonal-bench-tcmalloc-{}.json", std::process::id()));
    let mut cmd = std::process::Command::new(exe);
    cmd.args(global_args).args(["bench", experiment]);
    cmd.args(["--reps", &opts.reps.to_string(), "--cell-ms", &opts.cell_time.as_millis().to_string()]);
    cmd.args(["--only", "tcmalloc", "--quiet"]);
    cmd.arg("--tcmalloc-child").arg(format!("{done}/{total}"));
    cmd.arg("--json").arg(&json);
    cmd.env("GLIBC_TUNABLES", value);
    let child = lockstep::Lockstep::start(cmd)?;
    Ok(Some(TcmallocChild {
        experiment: experiment.to_string(),
        lockstep: std::sync::Arc::new(std::sync::Mutex::new(child)),
        json,
    }))
}

/// What turns tcmalloc's per-CPU caches on in the child: glibc's own rseq registration off.
const TCMALLOC_TUNABLE: &str = "glibc.pthread.rseq=0";

/// A tcmalloc child running one experiment in lockstep with the main process
/// ([`start_tcmalloc_child`]).
#[derive(Debug)]
pub struct TcmallocChild {
    experiment: String,
    lockstep: std::sync::Arc<std::sync::Mutex<lockstep::Lockstep>>,
    /// Where the child writes its records.
    json: std::path::PathBuf,
}

impl TcmallocChild {
    /// The handle the main process's [`BenchOpts::child`] holds while it runs the experiment.
    pub fn handle(&self) -> std::sync::Arc<std::sync::Mutex<lockstep::Lockstep>> {
        std::sync::Arc::clone(&self.lockstep)
    }

    /// For an experiment cut short (SIGINT): stops the child (`Lockstep`'s drop) and
    /// removes its file; its records are not wanted.
    pub fn abandon(self) {
        drop(self.lockstep);
        let _ = std::fs::remove_file(&self.json);
    }

    /// Once the main process's run of the experiment is over (and its `BenchOpts::child`
    /// cleared): lets the child finish, prints its tables and returns its records.
    pub fn finish(self) -> Result<Vec<serde_json::Value>, String> {
        let lockstep = std::sync::Arc::try_unwrap(self.lockstep)
            .map_err(|_| "the tcmalloc child is still in use".to_string())?
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = lockstep.finish().inspect_err(|_| {
            let _ = std::fs::remove_file(&self.json);
        })?;
        println!(
            "tcmalloc on its rseq per-CPU caches: {} again in a child process with {TCMALLOC_TUNABLE}, \
             beside mimalloc measured in that process, each repetition right after the one above\n",
            self.experiment
        );
        print!("{out}");
        let path = self.json;
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()));
        let _ = std::fs::remove_file(&path);
        serde_json::from_str(&text?).map_err(|e| format!("bad JSON from the tcmalloc child: {e}"))
    }
}

/// Reads `--tcmalloc-child DONE/TOTAL`: the child's experiments are numbered after DONE.
pub fn parse_child_steps(arg: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--tcmalloc-child `{arg}`: expected DONE/TOTAL with DONE < TOTAL (set by zonal bench itself)");
    let (done, total) = arg.split_once('/').ok_or_else(bad)?;
    let (done, total) =
        (done.trim().parse::<usize>().map_err(|_| bad())?, total.trim().parse::<usize>().map_err(|_| bad())?);
    if done >= total {
        return Err(bad());
    }
    Ok((done, total))
}

/// An emulated memory penalty from the environment variable `var` (ns, at most 1 ms; `default`
/// when unset): `ZONAL_NUMAB_REMOTE_PENALTY_NS` (`bench numab`), `ZONAL_TIER_PENALTY_NS`
/// (`bench tier`).
pub fn penalty_from_env(var: &str, default: std::time::Duration) -> Result<std::time::Duration, String> {
    match std::env::var(var) {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| n <= 1_000_000)
            .map(std::time::Duration::from_nanos)
            .ok_or_else(|| format!("{var}=`{v}`: need ns from 0 to 1000000")),
        Err(_) => Ok(default),
    }
}

/// One line on how the CPU is found and which caches tcmalloc runs on.
pub fn cpu_identity_note() -> String {
    let rseq = zonal::cpu::glibc_rseq_registered();
    format!(
        "glibc rseq registration: {}; zonal reads its CPU {}; tcmalloc runs on {} caches",
        if rseq { "on" } else { "off" },
        if rseq { "from glibc's rseq area" } else { "with sched_getcpu" },
        if peers::tcmalloc_per_cpu() { "rseq per-CPU" } else { "per-thread" }
    )
}

/// Options common to every experiment.
#[derive(Clone, Debug)]
pub struct BenchOpts {
    /// Repetitions per cell.
    pub reps: usize,
    /// Target wall time of one cell of one repetition.
    pub cell_time: Duration,
    /// Print progress to stderr.
    pub progress: bool,
    /// Measure only the subjects whose names start with one of these, and mimalloc (all when
    /// empty).
    pub only: Vec<String>,
    /// What the command line built the main allocator from; the experiments' other handles
    /// are built from it too.
    pub config: zonal::Config,
    /// Which experiment of the run this is (1-based) and of how many, for the progress lines.
    pub step: (usize, usize),
    /// The process measuring: [`MAIN_PROCESS`] or [`CHILD_PROCESS`].
    pub process: &'static str,
    /// The main process: the tcmalloc child of the running experiment, which [`rotate`]
    /// keeps in lockstep with it (see [`lockstep`]).
    pub child: Option<std::sync::Arc<std::sync::Mutex<lockstep::Lockstep>>>,
    /// The child: stop before each repetition until the main process says go (`--lockstep`).
    pub gated: bool,
}

/// zonal without per-CPU lists, built as the main handle otherwise is.
pub fn buddy_only(opts: &BenchOpts) -> Result<zonal::Zonal, String> {
    zonal::Zonal::new(opts.config.clone().pcp(false)).map_err(|e| format!("cannot build the buddy-only allocator: {e}"))
}

/// zonal with every CPU on one node of `bytes`, built from the command line's settings
/// otherwise: the CPUs share one zone, its lock, its counters and its frames, as the CPUs of
/// one socket do.
pub fn one_node(opts: &BenchOpts, bytes: u64) -> Result<zonal::Zonal, String> {
    let mut config = opts.config.clone();
    let spec = format!("nodes=1,size={}", zonal::topology::fmt_size(bytes));
    config.topology = zonal::Topology::parse(&spec).map_err(|e| e.to_string())?;
    zonal::Zonal::new(config).map_err(|e| format!("cannot build the one-node allocator: {e}"))
}

impl BenchOpts {
    /// Runs `f` on the tcmalloc child in lockstep with this process, if there is one.
    fn with_child(&self, f: impl FnOnce(&mut lockstep::Lockstep)) {
        if let Some(c) = &self.child {
            f(&mut c.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        }
    }

    /// Whether a subject is measured in this run.
    pub fn keeps(&self, name: &str) -> bool {
        // mimalloc is every table's reference, so it is always measured.
        self.only.is_empty() || name == "mimalloc" || self.only.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// Whether `--only` left nothing but the reference: the experiment then prints nothing.
pub fn only_reference_left<'a>(mut names: impl Iterator<Item = &'a String>) -> bool {
    names.all(|n| n == "mimalloc")
}

/// The index of a subject by name, among those kept.
pub fn index_of<'a>(names: impl IntoIterator<Item = &'a String>, name: &str) -> Option<usize> {
    names.into_iter().position(|n| n == name)
}

/// One measured cell: the JSON record `--json FILE` writes (with a `process` field added by
/// [`to_json`]: `main`, or `tcmalloc-child` for the records of the child process that
/// measures tcmalloc on its per-CPU caches beside a mimalloc of its own). `--plot` draws from
/// these records too.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    pub experiment: String,
    pub subject: String,
    pub params: serde_json::Value,
    pub ns_per_op: Summary,
    pub reference: String,
    pub ratio_to_reference: f64,
    pub reps: usize,
    /// ns per operation of each repetition, in order: repetition `r` of every subject of the
    /// experiment ran in one rotation (and, in lockstep, the tcmalloc child's right after),
    /// so two records' samples pair up into ratios that cancel the machine's phases (the
    /// targets and the history read them so, as the tables do).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<f64>,
}

/// The records as JSON values, each with `"process": process`.
pub fn to_json(records: &[Record], process: &str) -> Result<Vec<serde_json::Value>, String> {
    records
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).map_err(|e| e.to_string())?;
            if let Some(o) = v.as_object_mut() {
                o.insert("process".into(), process.into());
            }
            Ok(v)
        })
        .collect()
}

/// Median, min and max of a sample.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(v: &[f64]) -> Summary {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Summary { median, min: s.first().copied().unwrap_or(f64::NAN), max: s.last().copied().unwrap_or(f64::NAN) }
    }
}

/// A subject measured in pairs of operations: `run(n)` performs `n` pairs and returns the
/// time they took.
pub trait Subject {
    /// Name in the table and the JSON.
    fn name(&self) -> String;
    /// Runs `n` operations (pairs) and returns how long they took.
    fn run(&mut self, n: u64) -> Duration;
}

/// Picks how many operations fill `target`, from a short trial.
pub fn calibrate(s: &mut dyn Subject, target: Duration) -> u64 {
    // Warm up first: one-time costs (first-touch faults, lazy set-up) must not set the count.
    s.run(1000);
    let mut n = 64u64;
    loop {
        let t = s.run(n);
        if t >= target / 16 || n >= 1 << 30 {
            let per = t.as_secs_f64() / n as f64;
            return ((target.as_secs_f64() / per.max(1e-12)) as u64).clamp(64, 1 << 32);
        }
        n *= 4;
    }
}

/// Measures every subject `opts.reps` times, rotating the order, and returns ns per operation
/// per subject per repetition (`out[subject][rep]`).
pub fn measure(subjects: &mut [Box<dyn Subject + '_>], opts: &BenchOpts, label: &str) -> Vec<Vec<f64>> {
    let counts: Vec<u64> = subjects.iter_mut().map(|s| calibrate(s.as_mut(), opts.cell_time)).collect();
    let mut out = vec![Vec::with_capacity(opts.reps); subjects.len()];
    rotate(opts, label, subjects.len(), |s| {
        let t = subjects[s].run(counts[s]);
        out[s].push(t.as_nanos() as f64 / counts[s] as f64);
    });
    out
}

/// Runs `cell(subject)` for every subject in every repetition, starting each repetition one
/// subject later so that no subject always runs first (or right after the same one), with
/// progress on stderr.
///
/// With a tcmalloc child in lockstep ([`lockstep`]), the child's repetition `r` runs right
/// after this process's repetition `r`, and never beside one: the child is stopped while this
/// process measures, here and in whatever the experiment does between two calls of `rotate`.
///
/// After SIGINT it stops before the next repetition ([`interrupt`]).
pub fn rotate(opts: &BenchOpts, label: &str, k: usize, mut cell: impl FnMut(usize)) {
    let mut shown = 0;
    for rep in 0..opts.reps {
        if rep > 0 && interrupt::stop_before_repetition() {
            break;
        }
        shown = progress(opts, label, rep);
        lockstep::gate(opts.gated);
        opts.with_child(lockstep::Lockstep::wait);
        for i in 0..k {
            cell((i + rep) % k);
        }
        opts.with_child(lockstep::Lockstep::release);
    }
    opts.with_child(lockstep::Lockstep::wait);
    clear_progress(opts, shown);
}

/// The progress line of repetition `rep` (0-based) of the part `label` of an experiment,
/// over the line before it; returns its length, for [`clear_progress`].
pub fn progress(opts: &BenchOpts, label: &str, rep: usize) -> usize {
    if !opts.progress {
        return 0;
    }
    let line = progress_line(opts, label, rep);
    eprint!("\r{line}   ");
    line.chars().count() + 3
}

/// The text of a progress line.
pub fn progress_line(opts: &BenchOpts, label: &str, rep: usize) -> String {
    let (i, n) = opts.step;
    let child = if opts.process == CHILD_PROCESS { " (tcmalloc child)" } else { "" };
    let after = if opts.child.is_some() { ", each followed by the tcmalloc child's" } else { "" };
    format!("  experiment {i} of {n}{child}, {label}: repetition {}/{}{after}", rep + 1, opts.reps)
}

/// Blanks a progress line `width` characters long.
pub fn clear_progress(opts: &BenchOpts, width: usize) {
    if opts.progress && width > 0 {
        eprint!("\r{:width$}\r", "");
    }
}

/// How many operations fill one cell, given a trial's ns per operation, within `lo..=hi`.
pub fn per_cell(opts: &BenchOpts, ns: f64, lo: u64, hi: u64) -> u64 {
    ((opts.cell_time.as_nanos() as f64 / ns.max(0.1)) as u64).clamp(lo, hi)
}

/// The subject with the lowest median among those `is_peer` accepts (`times[subject][rep]`).
pub fn best_peer(times: &[Vec<f64>], is_peer: impl Fn(usize) -> bool) -> usize {
    (0..times.len())
        .filter(|&s| is_peer(s))
        .min_by(|&a, &b| Summary::of(&times[a]).median.total_cmp(&Summary::of(&times[b]).median))
        .expect("every experiment has peers")
}

/// Median over repetitions of `a[rep] / b[rep]`.
pub fn paired_ratio(a: &[f64], b: &[f64]) -> f64 {
    let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    Summary::of(&r).median
}

/// One record's figure over another's (JSON records of one process): the median of their
/// per-repetition ratios when both carry their samples, one per repetition, as the tables'
/// ratios are taken (a phase of the machine that slows a repetition slows both of its
/// cells); else, for records written without them, the ratio of their medians. `None` when a
/// median is missing or the base is not positive.
pub fn record_ratio(r: &serde_json::Value, base: &serde_json::Value) -> Option<f64> {
    let samples = |v: &serde_json::Value| -> Option<Vec<f64>> {
        v["samples"].as_array()?.iter().map(serde_json::Value::as_f64).collect()
    };
    if let (Some(a), Some(b)) = (samples(r), samples(base)) {
        if !a.is_empty() && a.len() == b.len() && b.iter().all(|&x| x > 0.0) {
            return Some(paired_ratio(&a, &b));
        }
    }
    let (ns, base) = (r["ns_per_op"]["median"].as_f64()?, base["ns_per_op"]["median"].as_f64()?);
    (base > 0.0).then(|| ns / base)
}

/// Times a closure run `n` times.
#[inline]
pub fn time_loop(n: u64, mut f: impl FnMut()) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed()
}

/// The verdict a target line ends with; a miss is noted for the line that says what it
/// means on other hardware ([`targets::MISS_NOTE`]).
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        targets::missed();
        "not met"
    }
}

/// Formats a time in ns with sensible precision.
pub fn fmt_ns(ns: f64) -> String {
    if ns >= 1000.0 {
        format!("{:.0}", ns)
    } else if ns >= 100.0 {
        format!("{:.1}", ns)
    } else {
        format!("{:.2}", ns)
    }
}

/// Prints a table with a header row; the first column left-aligned, the others right-aligned.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let cols = header.len();
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(cols) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            if i == 0 {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str("  ");
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    line(w.iter().map(|&n| "-".repeat(n)).collect());
    for r in rows {
        line(r.clone());
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small allocator for the tests that build subjects.
    pub(crate) fn small_zonal() -> zonal::Zonal {
        let topo = zonal::Topology::parse("nodes=1,size=4M").expect("a valid spec");
        zonal::Zonal::new(zonal::Config::new(topo)).expect("a small allocator")
    }

    fn opts(only: &[&str]) -> BenchOpts {
        BenchOpts {
            reps: 3,
            cell_time: Duration::from_millis(1),
            progress: true,
            only: only.iter().map(|s| s.to_string()).collect(),
            config: zonal::Config::new(zonal::Topology::parse("nodes=1,size=4M").expect("a valid spec")),
            step: (2, 5),
            process: MAIN_PROCESS,
            child: None,
            gated: false,
        }
    }

    #[test]
    fn only_names_are_checked_against_the_chosen_experiments() {
        assert_eq!(check_only(&["bulk"], &[]), Ok(()));
        assert_eq!(check_only(&["bulk"], &["zonal".into()]), Ok(()));
        assert_eq!(check_only(&["single", "bulk"], &["kernel".into(), "jemalloc".into()]), Ok(()));
        // A prefix of a tcmalloc name, whichever caches it runs on.
        assert_eq!(check_only(&["cross"], &["tcmalloc".into()]), Ok(()));
        let e = check_only(&["bulk"], &["nosuch".into(), "zonal".into()]).unwrap_err();
        assert!(e.starts_with("--only `nosuch` matches no subject; subjects of bulk: zonal bulk array,"), "{e}");
        assert!(e.contains("glibc malloc") && e.contains("mimalloc, the reference, is always measured"), "{e}");
        // bulk has no kernel subject; single has.
        assert!(check_only(&["bulk"], &["kernel".into()]).is_err());
        // The experiments that measure zonal alone answer to `zonal pcp` only.
        assert_eq!(check_only(&["zlc"], &["zonal p".into()]), Ok(()));
        assert!(check_only(&["zlc", "numab"], &["snmalloc".into()]).is_err());
        let e = check_only(&["single"], &["mimalloc".into()]).unwrap_err();
        assert!(e.contains("keeps nothing but mimalloc"), "{e}");
        assert!(check_only(&["single"], &["".into()]).unwrap_err().contains("empty name"));
    }

    #[test]
    fn experiments_run_as_only_allows() {
        let all: Vec<&str> = EXPERIMENTS.iter().map(|(n, _)| *n).collect();
        assert_eq!(runnable(&all, &opts(&[])), all);
        assert_eq!(runnable(&all, &opts(&["snmalloc"])), WITH_TCMALLOC);
        assert_eq!(runnable(&["zlc", "bulk"], &opts(&["zonal"])), ["zlc", "bulk"]);
        // The child runs only when nothing is chosen with --only, and only tcmalloc's experiments.
        assert!(child_experiments(&all, &opts(&["zonal"])).is_empty());
        assert!(child_experiments(&["zlc", "numab"], &opts(&[])).is_empty());
    }

    #[test]
    fn progress_lines_say_which_experiment_of_how_many() {
        assert_eq!(progress_line(&opts(&[]), "zlc 8 nodes", 0), "  experiment 2 of 5, zlc 8 nodes: repetition 1/3");
        let child = BenchOpts { process: CHILD_PROCESS, ..opts(&[]) };
        assert_eq!(progress_line(&child, "bulk", 2), "  experiment 2 of 5 (tcmalloc child), bulk: repetition 3/3");
    }

    #[test]
    fn record_ratios_pair_the_repetitions_when_the_records_carry_them() {
        let rec = |samples: &[f64]| {
            let mut v = serde_json::json!({"ns_per_op": {"median": Summary::of(samples).median}});
            v["samples"] = serde_json::json!(samples);
            v
        };
        // A slow phase in the second repetition slows both cells: per repetition 0.3, 0.9
        // and 0.3 (median 0.3), where the medians' ratio, 9 / 20, reads 0.45.
        let (a, b) = (rec(&[6.0, 9.0, 12.0]), rec(&[20.0, 10.0, 40.0]));
        assert!((record_ratio(&a, &b).unwrap() - 0.3).abs() < 1e-12);
        // Records without samples, or with samples that do not pair up: the medians' ratio.
        let bare = |ns: f64| serde_json::json!({"ns_per_op": {"median": ns}});
        assert!((record_ratio(&bare(9.0), &bare(20.0)).unwrap() - 0.45).abs() < 1e-12);
        assert!((record_ratio(&a, &rec(&[20.0, 10.0])).unwrap() - 9.0 / 15.0).abs() < 1e-12);
        assert_eq!(record_ratio(&bare(9.0), &bare(0.0)), None);
        assert_eq!(record_ratio(&bare(9.0), &serde_json::json!({})), None);
    }

    #[test]
    fn records_carry_their_process() {
        let r = Record {
            experiment: "bulk".into(),
            subject: "mimalloc".into(),
            params: serde_json::json!({"batch": 1}),
            ns_per_op: Summary::of(&[1.0]),
            reference: "mimalloc".into(),
            ratio_to_reference: 1.0,
            reps: 1,
            samples: vec![1.0],
        };
        let v = to_json(&[r], CHILD_PROCESS).unwrap();
        assert_eq!(v[0]["process"], "tcmalloc-child");
        assert_eq!(v[0]["subject"], "mimalloc");
    }

    #[test]
    fn summary_and_ratio() {
        let s = Summary::of(&[3.0, 1.0, 2.0]);
        assert_eq!(s, Summary { median: 2.0, min: 1.0, max: 3.0 });
        assert_eq!(Summary::of(&[1.0, 2.0, 3.0, 4.0]).median, 2.5);
        // Paired ratios: a run that is slow for both subjects cancels out.
        assert_eq!(paired_ratio(&[2.0, 20.0, 4.0], &[1.0, 10.0, 1.0]), 2.0);
    }

    struct Fixed(u64);
    impl Subject for Fixed {
        fn name(&self) -> String {
            "fixed".into()
        }
        fn run(&mut self, n: u64) -> Duration {
            Duration::from_nanos(n * self.0)
        }
    }

    #[test]
    fn calibration_fills_the_target() {
        let n = calibrate(&mut Fixed(10), Duration::from_millis(10));
        assert_eq!(n, 1_000_000);
    }
}
