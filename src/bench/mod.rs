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
pub mod page_api;
pub mod parallel;
pub mod peers;
pub mod single;
pub mod vmstat_exp;

use serde::Serialize;
use std::time::{Duration, Instant};

/// Every experiment, in the order `zonal bench` runs them.
pub const EXPERIMENTS: &[(&str, &str)] = &[
    ("single", "one thread, order-0 alloc + free pairs (page_bench01)"),
    ("parallel", "T threads each doing single, T = 1 .. nproc and 2 × nproc (page_bench03)"),
    ("bulk", "N = 1 .. 128 pages per bulk call, array and list forms (page_bench04_bulk)"),
    ("cross", "one thread allocates, another on the other CPU frees"),
    ("threshold", "seed 000: the NUMA counter threshold swept, all CPUs on one zone"),
    ("modes", "seed 001: numa_stats_mode strict, coarse, auto before and after a read"),
];

/// Google tcmalloc's per-CPU caches need the rseq area that glibc (2.35+) registers for
/// itself, so `zonal bench` re-executes itself once with `GLIBC_TUNABLES=glibc.pthread.rseq=0`
/// (unless that is already set, or `ZONAL_BENCH_NO_REEXEC=1`). In that process zonal reads
/// its CPU with `sched_getcpu` instead of glibc's rseq area. Returns only when no re-exec
/// happened (or it failed); the re-executed process's exit is this one's.
pub fn ensure_tcmalloc_rseq() {
    const TUNABLE: &str = "glibc.pthread.rseq=0";
    let current = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if current.contains(TUNABLE) || std::env::var_os("ZONAL_BENCH_NO_REEXEC").is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    let value = if current.is_empty() { TUNABLE.to_string() } else { format!("{current}:{TUNABLE}") };
    let err = std::os::unix::process::CommandExt::exec(
        std::process::Command::new(exe).args(std::env::args_os().skip(1)).env("GLIBC_TUNABLES", value),
    );
    eprintln!("zonal: could not re-execute with {TUNABLE} ({err}); tcmalloc may run on per-thread caches");
}

/// One line on how the CPU is found and which caches tcmalloc runs on.
pub fn cpu_identity_note() -> String {
    let rseq = zonal::sys::rseq_offset().is_some();
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
}

/// One measured cell: the JSON record `--json FILE` writes.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    pub experiment: String,
    pub subject: String,
    pub params: serde_json::Value,
    pub ns_per_op: Summary,
    pub reference: String,
    pub ratio_to_reference: f64,
    pub reps: usize,
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
    let k = subjects.len();
    let mut out = vec![Vec::with_capacity(opts.reps); k];
    for rep in 0..opts.reps {
        if opts.progress {
            eprint!("\r  {label}: repetition {}/{}   ", rep + 1, opts.reps);
        }
        for i in 0..k {
            let s = (i + rep) % k;
            let t = subjects[s].run(counts[s]);
            out[s].push(t.as_nanos() as f64 / counts[s] as f64);
        }
    }
    if opts.progress {
        eprint!("\r{:width$}\r", "", width = label.len() + 32);
    }
    out
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

/// Times a closure run `n` times.
#[inline]
pub fn time_loop(n: u64, mut f: impl FnMut()) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed()
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
mod tests {
    use super::*;

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
