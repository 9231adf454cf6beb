//! Issue 12's history target: every experiment's figures inside the full run within 15% of the
//! same experiment run alone. After a run of several experiments, each of the speed
//! experiments it ran (single, parallel, bulk, cross, mixed, zlc) runs again in a fresh process
//! of its own (`zonal bench <experiment>` with the subjects the run measured, its peers
//! included, so that only what ran before differs; no tcmalloc child), and every zonal cell is
//! compared with the same cell of the full run. Issue 38 adds another order: where the run had
//! both, cross's process runs parallel right after it, compared with parallel alone (the full
//! run has parallel first, and frames freed on another CPU than the one that allocated them
//! change what the CPUs' lists share).
//!
//! The figure compared is a cell's ratio to its reference in the same process, the median of
//! their per-repetition ratios as in the tables, not its nanoseconds: this machine's speed
//! changes by 2–4× between phases lasting from a fraction of a second to tens of seconds
//! (every subject's `cross` moves with it), which a ratio within one repetition cancels and a
//! comparison of nanoseconds taken a minute apart would report as history. The reference is
//! the ideal per-thread stack where the experiment measures it (single, parallel, bulk): a
//! stack of addresses that no experiment leaves in another state, so it moves with the
//! machine and nothing else. A peer would bring its own history into zonal's figure:
//! mimalloc's and jemalloc's bulk rounds of 32–128 pages moved 1.4–2× between two processes
//! (mimalloc's 128-page round 39.6 ns inside a full run, 55.5 alone, the ideal stack 2.70
//! and 3.17), which read as zonal's bulk moving +29% while zonal's own nanoseconds over the
//! ideal stack's moved 0–6%. Where there is no ideal stack (cross), every peer measured in
//! both processes is a reference and the cell's shift is the median peer's, so that one
//! peer's own process is outvoted: over 9 pairs of consecutive `bench cross` processes
//! (no history in either), zonal's ratio to mimalloc alone moved by 16% on average and
//! stayed within 15% in 4, its median peer's by 14% and within 15% in 6. (Zonal's ratio to
//! every peer at once moved ±37% in one pair: such a process cannot be outvoted.) Else the
//! record's own reference (zlc's "on" over its "off").

use serde_json::Value;

/// The experiments whose history is checked (those of issue 12's table, and issue 38's
/// mixed traffic), in report order.
pub const EXPERIMENTS: &[&str] = &["single", "parallel", "bulk", "cross", "mixed", "zlc"];

/// The `process` field given to the records of the experiments run alone.
pub const ALONE_PROCESS: &str = "alone";

/// The `process` field of the records of `parallel` run right after `cross` in a fresh
/// process of their own: the history's other order (issue 38). The full run has `parallel`
/// before `cross`, and a frame freed on another CPU than the one that allocated it changes
/// what the allocating CPU's lists share with the freeing CPU's; this order measures what
/// `cross` leaves in the run's handle for `parallel`, against `parallel` alone.
pub const AFTER_CROSS_PROCESS: &str = "after-cross";

/// Whether a record is one of the history's runs (alone, or in its other order), which are
/// for its comparison and not another set of curves.
pub fn is_history(r: &Value) -> bool {
    r["process"] == ALONE_PROCESS || r["process"] == AFTER_CROSS_PROCESS
}

/// Set in the environment of the history's own processes: one that runs two experiments
/// (`cross`, then `parallel`) runs no history of its own.
const NESTED: &str = "ZONAL_BENCH_HISTORY_RUN";

/// How far a figure inside the full run may be from the same figure alone.
pub const TOLERANCE: f64 = 0.15;

/// The fresh processes the history runs for `experiments` (those of [`EXPERIMENTS`]): each
/// one's experiments in order, each with the `process` its records get. Each experiment runs
/// alone, first in its own process; where the run had both `cross` and `parallel`, `cross`'s
/// process runs `parallel` right after it (the other order), `parallel` still running alone
/// in its own.
fn processes<'a>(experiments: &[&'a str]) -> Vec<Vec<(&'a str, &'static str)>> {
    let ran: Vec<&str> = experiments.iter().copied().filter(|e| EXPERIMENTS.contains(e)).collect();
    ran.iter()
        .map(|&e| {
            let mut p = vec![(e, ALONE_PROCESS)];
            if e == "cross" {
                p.extend(ran.iter().filter(|&&o| o == "parallel").map(|&o| (o, AFTER_CROSS_PROCESS)));
            }
            p
        })
        .collect()
}

/// Runs each of `experiments` that [`EXPERIMENTS`] lists in a fresh process of its own, with
/// the main run's repetitions, cell time, global arguments and subjects, and `parallel` again
/// right after `cross` ([`processes`]); returns their records, tagged [`ALONE_PROCESS`] or
/// [`AFTER_CROSS_PROCESS`]. The children's tables are not printed (the comparison is), nor
/// their stderr unless one fails; with the run's progress on, stderr says which one runs.
/// After SIGINT it starts no more runs and returns the records of those that finished.
pub fn run_alone(experiments: &[&str], opts: &super::BenchOpts, global_args: &[String]) -> Result<Vec<Value>, String> {
    if std::env::var_os(NESTED).is_some() {
        return Ok(Vec::new());
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program to re-run it: {e}"))?;
    let mut records = Vec::new();
    for process in processes(experiments) {
        // SIGINT: the runs that finished are kept, the others not started.
        if super::interrupt::interrupted() {
            break;
        }
        let chosen: Vec<&str> = process.iter().map(|(e, _)| *e).collect();
        let what = chosen.join(", then ");
        if opts.progress {
            let then: String = chosen[1..].iter().map(|e| format!(", then {e} right after it")).collect();
            eprintln!("history: {} alone{then}, in a fresh process", chosen[0]);
        }
        // The subjects the run measured, so that only the history differs: every subject of
        // the experiments, or those the run's `--only` kept. A non-empty `--only` also keeps the
        // tcmalloc child from running (its own process already has no history).
        let mut all: Vec<String> = Vec::new();
        for e in &chosen {
            all.extend(super::subject_names(e).into_iter().filter(|n| !all.contains(n)).collect::<Vec<_>>());
        }
        let names: Vec<String> = if opts.only.is_empty() {
            all
        } else {
            opts.only.iter().filter(|p| all.iter().any(|n| n.starts_with(p.as_str()))).cloned().collect()
        };
        if names.is_empty() {
            continue;
        }
        let out = std::env::temp_dir().join(format!("zonal-bench-alone-{}-{}.json", std::process::id(), chosen[0]));
        // Its tables and its notes are not the report's: kept, and shown only if it fails.
        let run = std::process::Command::new(&exe)
            .args(global_args)
            .arg("bench")
            .args(&chosen)
            .args(["--only", &names.join(","), "--quiet"])
            .args(["--reps", &opts.reps.to_string(), "--cell-ms", &opts.cell_time.as_millis().to_string()])
            .arg("--json")
            .arg(&out)
            .env(NESTED, "1")
            .output()
            .map_err(|err| format!("cannot run {what} alone: {err}"))?;
        if !run.status.success() {
            let _ = std::fs::remove_file(&out);
            // It stopped at SIGINT too (a Ctrl-C reaches the whole process group).
            if super::interrupt::interrupted() {
                break;
            }
            let said = String::from_utf8_lossy(&run.stderr);
            return Err(format!("the process running {what} alone failed ({}): {}", run.status, said.trim()));
        }
        let text = std::fs::read_to_string(&out).map_err(|err| format!("cannot read {}: {err}", out.display()));
        let _ = std::fs::remove_file(&out);
        let mut alone: Vec<Value> =
            serde_json::from_str(&text?).map_err(|err| format!("bad JSON from {what} alone: {err}"))?;
        for r in &mut alone {
            let tag = process.iter().find(|(e, _)| r["experiment"] == *e).map_or(ALONE_PROCESS, |(_, p)| p);
            r["process"] = Value::from(tag);
        }
        records.extend(alone);
    }
    Ok(records)
}

/// The references a cell is compared against, by subject, in both processes: the ideal
/// stack where the experiment measures it; else every peer measured in both (cross), so
/// that one peer's own history is outvoted; else the record's own reference (zlc's off).
fn references(records: &[Value], main_process: &str, r: &Value) -> Vec<String> {
    let measured = |process: &str, subject: &str| {
        records.iter().any(|q| {
            q["process"] == process
                && q["experiment"] == r["experiment"]
                && settings(q) == settings(r)
                && q["subject"] == subject
        })
    };
    let both = |s: &str| measured(main_process, s) && measured(ALONE_PROCESS, s);
    if both(super::page_api::IDEAL) {
        return vec![super::page_api::IDEAL.to_string()];
    }
    let mut peers: Vec<String> = records
        .iter()
        .filter(|q| q["process"] == ALONE_PROCESS && q["experiment"] == r["experiment"] && settings(q) == settings(r))
        .filter_map(|q| q["subject"].as_str())
        .filter(|s| !s.starts_with("zonal") && both(s))
        .map(str::to_string)
        .collect();
    if peers.is_empty() {
        peers.extend(r["reference"].as_str().map(str::to_string));
    }
    peers
}

/// A cell's figure in `process`: its ratio to `reference`'s record of the same experiment
/// and params there, paired by repetition as the tables' ratios are (`record_ratio`).
/// `None` for a reference itself, or when the reference is missing.
fn figure(records: &[Value], process: &str, r: &Value, reference: &str) -> Option<f64> {
    if r["subject"] == reference {
        return None;
    }
    let base = records.iter().find(|q| {
        q["process"] == process
            && q["experiment"] == r["experiment"]
            && settings(q) == settings(r)
            && q["subject"] == reference
    })?;
    super::record_ratio(r, base)
}

/// One experiment's history: how its zonal cells moved between the full run and alone.
#[derive(Debug, PartialEq)]
pub struct History {
    pub experiment: String,
    /// Each cell's figure inside the full run over its figure alone, sorted.
    pub shifts: Vec<f64>,
    /// `(subject and params, figure inside the full run, figure alone)` of the cell that
    /// moved most, or `None` when no zonal cell was measured both ways.
    pub worst: Option<(String, f64, f64)>,
}

impl History {
    /// The median cell's shift (inside over alone), `None` when nothing was compared.
    pub fn median(&self) -> Option<f64> {
        let n = self.shifts.len();
        (n > 0)
            .then(|| if n % 2 == 1 { self.shifts[n / 2] } else { (self.shifts[n / 2 - 1] + self.shifts[n / 2]) / 2.0 })
    }

    /// Whether the experiment's figures, as their median cell, stayed within [`TOLERANCE`]
    /// (`None`: not measured). The verdict reads the median and not the worst cell: a run
    /// of 9 repetitions moves single cells by ±20% from one process to the next (the same
    /// experiment run alone twice), which the median of a dozen cells does not, while a
    /// history (a state the earlier experiments left) moves them all.
    pub fn met(&self) -> Option<bool> {
        self.median().map(|m| moved(m, 1.0) <= TOLERANCE)
    }
}

/// How far `inside` is from `alone`, as a fraction of `alone`.
fn moved(inside: f64, alone: f64) -> f64 {
    (inside / alone - 1.0).abs()
}

/// A record's params without its measured values (floats such as parallel's throughput),
/// which no two runs share.
fn settings(r: &Value) -> Value {
    match &r["params"] {
        Value::Object(m) => {
            Value::Object(m.iter().filter(|(_, v)| !v.is_f64()).map(|(k, v)| (k.clone(), v.clone())).collect())
        }
        other => other.clone(),
    }
}

/// The history of every experiment `records` ran alone (records of `main_process` and of
/// [`ALONE_PROCESS`]): zonal's cells (subjects named `zonal ...`) compared one by one.
pub fn evaluate(records: &[Value], main_process: &str) -> Vec<History> {
    let alone: Vec<&Value> = records.iter().filter(|r| r["process"] == ALONE_PROCESS).collect();
    let mut out: Vec<History> = Vec::new();
    for &e in EXPERIMENTS {
        let cells = alone.iter().filter(|r| r["experiment"] == e);
        if cells.clone().next().is_none() {
            continue;
        }
        let mut worst: Option<(String, f64, f64)> = None;
        let mut shifts = Vec::new();
        for r in cells.filter(|r| r["subject"].as_str().is_some_and(|s| s.starts_with("zonal"))) {
            let Some(inside) = records.iter().find(|q| {
                q["process"] == main_process
                    && q["experiment"] == r["experiment"]
                    && q["subject"] == r["subject"]
                    && settings(q) == settings(r)
            }) else {
                continue;
            };
            // The cell's figures over each reference, inside and alone; the cell's shift is
            // the median reference's (the lower middle of an even count).
            let mut each: Vec<(f64, f64)> = references(records, main_process, r)
                .iter()
                .filter_map(|s| {
                    Some((figure(records, main_process, inside, s)?, figure(records, ALONE_PROCESS, r, s)?))
                })
                .collect();
            if each.is_empty() {
                continue;
            }
            each.sort_by(|x, y| (x.0 / x.1).total_cmp(&(y.0 / y.1)));
            let (i, a) = each[(each.len() - 1) / 2];
            shifts.push(i / a);
            if worst.as_ref().is_none_or(|w| moved(i, a) > moved(w.1, w.2)) {
                let name = format!("{} {}", r["subject"].as_str().unwrap_or("?"), settings(r));
                worst = Some((name, i, a));
            }
        }
        shifts.sort_by(f64::total_cmp);
        out.push(History { experiment: e.to_string(), shifts, worst });
    }
    out
}

/// Prints the history lines of [`evaluate`].
pub fn print(records: &[Value], main_process: &str) {
    let histories = evaluate(records, main_process);
    if histories.is_empty() {
        println!(
            "  history, each experiment inside the full run within {:.0}% of it alone: not measured in this run (it \
             needs two or more experiments)",
            TOLERANCE * 100.0
        );
        return;
    }
    println!(
        "  history: each experiment inside this run within {:.0}% of it run alone in a fresh process (each zonal \
         cell ÷ its reference in its own process: the ideal stack where measured, else the median peer, zlc's off; \
         inside ÷ alone; the verdict reads the median cell):",
        TOLERANCE * 100.0
    );
    for h in histories {
        print_line(&h.experiment, &h);
    }
    // The other order: parallel right after cross in a fresh process, against parallel alone.
    for h in evaluate(records, AFTER_CROSS_PROCESS).into_iter().filter(|h| h.worst.is_some()) {
        print_line(&format!("{} right after cross (in a fresh process)", h.experiment), &h);
    }
}

/// One experiment's history line, under `label`.
fn print_line(label: &str, h: &History) {
    match (&h.worst, h.median()) {
        (Some((cell, inside, alone)), Some(m)) => println!(
            "    {label}: median of {} cells {:+.0}%; the cell that moved most {:+.0}% ({cell}, {inside:.3} inside, \
             {alone:.3} alone): {}",
            h.shifts.len(),
            (m - 1.0) * 100.0,
            (inside / alone - 1.0) * 100.0,
            super::verdict(h.met() == Some(true))
        ),
        _ => println!("    {label}: no zonal cell measured both inside the run and alone"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::page_api::IDEAL;
    use super::*;
    use serde_json::json;

    fn rec(process: &str, experiment: &str, subject: &str, reference: &str, params: Value, ns: f64) -> Value {
        json!({"process": process, "experiment": experiment, "subject": subject, "reference": reference,
               "params": params, "ns_per_op": {"median": ns}})
    }

    #[test]
    fn each_cell_is_compared_by_its_ratio_in_its_own_process() {
        let p0 = json!({"order": 0});
        let p1 = json!({"order": 1});
        let p3 = json!({"order": 3});
        let zlc = json!({"nodes": 28});
        let t = |mpairs: f64| json!({"threads": 2, "total_mpairs_per_s": mpairs});
        // A zonal cell and its mimalloc, inside the run and alone (ns).
        let cell = |params: &Value, (zonal, mimalloc): (f64, f64), (zonal_alone, mimalloc_alone): (f64, f64)| {
            [
                rec("main", "single", "zonal pcp", "mimalloc", params.clone(), zonal),
                rec("main", "single", "mimalloc", "mimalloc", params.clone(), mimalloc),
                rec(ALONE_PROCESS, "single", "zonal pcp", "mimalloc", params.clone(), zonal_alone),
                rec(ALONE_PROCESS, "single", "mimalloc", "mimalloc", params.clone(), mimalloc_alone),
            ]
        };
        let mut records: Vec<Value> = [
            // single: order 0 moved +10% (0.44 inside against 0.40 alone) though its ns
            // doubled with mimalloc's; order 1 +20%; order 3 not at all (order 9 below).
            cell(&p0, (8.8, 20.0), (4.0, 10.0)),
            cell(&p1, (24.0, 20.0), (10.0, 10.0)),
            cell(&p3, (30.0, 20.0), (15.0, 10.0)),
        ]
        .concat();
        records.extend([
            // parallel: the params carry a measured throughput, which differs.
            rec("main", "parallel", "zonal pcp", "mimalloc", t(260.0), 7.0),
            rec("main", "parallel", "mimalloc", "mimalloc", t(110.0), 17.5),
            rec(ALONE_PROCESS, "parallel", "zonal pcp", "mimalloc", t(255.0), 7.2),
            rec(ALONE_PROCESS, "parallel", "mimalloc", "mimalloc", t(112.0), 18.0),
            // cross: the full run's reference was another peer; mimalloc is taken anyway;
            // +16%, past the tolerance.
            rec("main", "cross", "zonal pcp", "snmalloc", p0.clone(), 36.0),
            rec("main", "cross", "snmalloc", "snmalloc", p0.clone(), 60.0),
            rec("main", "cross", "mimalloc", "snmalloc", p0.clone(), 100.0),
            rec(ALONE_PROCESS, "cross", "zonal pcp", "mimalloc", p0.clone(), 31.0),
            rec(ALONE_PROCESS, "cross", "mimalloc", "mimalloc", p0.clone(), 100.0),
            // zlc: no mimalloc, on against off.
            rec("main", "zlc", "zonal zonelist_cache on", "zonal zonelist_cache off", zlc.clone(), 40.0),
            rec("main", "zlc", "zonal zonelist_cache off", "zonal zonelist_cache off", zlc.clone(), 100.0),
            rec(ALONE_PROCESS, "zlc", "zonal zonelist_cache on", "zonal zonelist_cache off", zlc.clone(), 30.0),
            rec(ALONE_PROCESS, "zlc", "zonal zonelist_cache off", "zonal zonelist_cache off", zlc.clone(), 80.0),
            // bulk ran alone, but the full run has no such cell.
            rec(ALONE_PROCESS, "bulk", "zonal bulk array", "mimalloc", p0.clone(), 3.0),
            rec(ALONE_PROCESS, "bulk", "mimalloc", "mimalloc", p0.clone(), 9.0),
        ]);
        // single's order 9 has the ideal stack, which wins over mimalloc: mimalloc's 9.0 ns
        // alone against 18.0 inside would read as zonal 50% faster inside; over the ideal
        // stack it moved +5%. A fourth cell: the median is now (1.05 + 1.1) / 2.
        let p9 = json!({"order": 9});
        records.extend([
            rec("main", "single", "zonal pcp", "mimalloc", p9.clone(), 42.0),
            rec("main", "single", "mimalloc", "mimalloc", p9.clone(), 18.0),
            rec("main", "single", IDEAL, "mimalloc", p9.clone(), 2.0),
            rec(ALONE_PROCESS, "single", "zonal pcp", "mimalloc", p9.clone(), 40.0),
            rec(ALONE_PROCESS, "single", "mimalloc", "mimalloc", p9.clone(), 9.0),
            rec(ALONE_PROCESS, "single", IDEAL, "mimalloc", p9.clone(), 2.0),
        ]);
        let h = evaluate(&records, "main");
        let names: Vec<&str> = h.iter().map(|h| h.experiment.as_str()).collect();
        assert_eq!(names, ["single", "parallel", "bulk", "cross", "zlc"], "report order");
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let (cell, inside, alone) = h[0].worst.clone().unwrap();
        assert!(cell.contains("\"order\":1"), "the cell that moved most: {cell}");
        assert!(close(inside, 1.2) && close(alone, 1.0));
        assert!(close(h[0].median().unwrap(), 1.075), "{:?}", h[0].shifts);
        assert!(h[0].shifts.iter().any(|&s| close(s, 1.05)), "order 9 over the ideal stack: {:?}", h[0].shifts);
        assert_eq!(h[0].met(), Some(true), "the median moved 7.5%, one cell 20%");
        assert!(close(h[1].median().unwrap(), 0.4 / 0.4), "matched without the throughput: {:?}", h[1].shifts);
        assert_eq!((h[2].worst.clone(), h[2].met()), (None, None));
        let (_, inside, alone) = h[3].worst.clone().unwrap();
        assert!(close(inside, 0.36) && close(alone, 0.31), "ratios to mimalloc, not to snmalloc");
        assert_eq!(h[3].met(), Some(false));
        let (cell, inside, alone) = h[4].worst.clone().unwrap();
        assert!(cell.starts_with("zonal zonelist_cache on"), "off is the reference: {cell}");
        assert!(close(inside, 0.40) && close(alone, 0.375));
        assert_eq!(h[4].met(), Some(true));
    }

    #[test]
    fn a_cell_without_the_ideal_stack_takes_the_median_of_its_peers() {
        let p = json!({"order": 0, "threads": 2});
        let cross = |process: &str, subject: &str, ns: f64| rec(process, "cross", subject, "mimalloc", p.clone(), ns);
        // Alone, zonal is 0.30 of every peer. Inside, mimalloc's own process ran it twice as
        // fast (zonal 0.60 of it: +100%), snmalloc's a little slower (-10%); jemalloc and
        // glibc kept theirs (+5%, 0%). tcmalloc was not measured alone: not a reference.
        let records = vec![
            cross("main", "zonal pcp", 30.0),
            cross("main", "mimalloc", 50.0),
            cross("main", "snmalloc", 30.0 / 0.27),
            cross("main", "jemalloc", 30.0 / 0.315),
            cross("main", "glibc malloc", 100.0),
            cross("main", "tcmalloc (per-thread)", 1.0),
            cross(ALONE_PROCESS, "zonal pcp", 60.0),
            cross(ALONE_PROCESS, "mimalloc", 200.0),
            cross(ALONE_PROCESS, "snmalloc", 200.0),
            cross(ALONE_PROCESS, "jemalloc", 200.0),
            cross(ALONE_PROCESS, "glibc malloc", 200.0),
        ];
        let h = evaluate(&records, "main");
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert_eq!(h.len(), 1);
        // Shifts over the four peers: 0.9, 1.0, 1.05, 2.0; the lower middle, glibc's, is the cell's.
        let (cell, inside, alone) = h[0].worst.clone().unwrap();
        assert!(cell.starts_with("zonal pcp"), "{cell}");
        assert!(close(inside, 0.30) && close(alone, 0.30), "{inside} {alone}");
        assert_eq!(h[0].met(), Some(true), "mimalloc's own process is outvoted");
        // With mimalloc alone as a peer, the same cell reads its +100%.
        let only: Vec<Value> = records
            .iter()
            .filter(|r| ["zonal pcp", "mimalloc"].contains(&r["subject"].as_str().unwrap()))
            .cloned()
            .collect();
        let h = evaluate(&only, "main");
        assert!(close(h[0].median().unwrap(), 2.0), "{:?}", h[0].shifts);
        assert_eq!(h[0].met(), Some(false));
    }

    #[test]
    fn nothing_alone_is_nothing_to_say() {
        let records = vec![rec("main", "single", "zonal pcp", "mimalloc", json!({"order": 0}), 8.0)];
        assert!(evaluate(&records, "main").is_empty());
    }

    #[test]
    fn parallel_runs_again_right_after_cross_where_the_run_had_both() {
        assert_eq!(
            processes(&["single", "threshold", "cross"]),
            [vec![("single", ALONE_PROCESS)], vec![("cross", ALONE_PROCESS)]]
        );
        assert_eq!(
            processes(&["parallel", "cross", "mixed"]),
            [
                vec![("parallel", ALONE_PROCESS)],
                vec![("cross", ALONE_PROCESS), ("parallel", AFTER_CROSS_PROCESS)],
                vec![("mixed", ALONE_PROCESS)],
            ]
        );
    }

    #[test]
    fn the_other_order_is_compared_with_the_same_experiment_alone() {
        let t = |threads: u64| json!({"threads": threads, "order": 0});
        let records = vec![
            rec("main", "parallel", "zonal pcp", IDEAL, t(2), 6.0),
            rec("main", "parallel", IDEAL, IDEAL, t(2), 2.0),
            rec(AFTER_CROSS_PROCESS, "parallel", "zonal pcp", IDEAL, t(2), 12.0),
            rec(AFTER_CROSS_PROCESS, "parallel", IDEAL, IDEAL, t(2), 2.0),
            rec(ALONE_PROCESS, "parallel", "zonal pcp", IDEAL, t(2), 6.0),
            rec(ALONE_PROCESS, "parallel", IDEAL, IDEAL, t(2), 2.0),
        ];
        let after = evaluate(&records, AFTER_CROSS_PROCESS);
        assert_eq!((after[0].median(), after[0].met()), (Some(2.0), Some(false)), "twice as slow after cross");
        assert_eq!(evaluate(&records, "main")[0].met(), Some(true));
        assert!(is_history(&records[2]) && is_history(&records[4]) && !is_history(&records[0]));
    }
}
