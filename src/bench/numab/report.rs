//! The report: the table per variant, the collapse and latency lines, the target lines and
//! the JSON records.

use super::*;

pub(super) fn fmt_share(s: Option<f64>) -> String {
    s.map_or("-".into(), |s| format!("{:.0}%", s * 100.0))
}

/// `x` with `digits` decimals, `n/a` for NaN (a count that could not be read).
pub(super) fn fmt_opt(x: f64, digits: usize) -> String {
    if x.is_nan() {
        "n/a".into()
    } else {
        format!("{x:.digits$}")
    }
}

pub(super) fn fmt_rate(r: f64) -> String {
    format!("{:.1}M", r / 1e6)
}

/// Prints the table per variant, the collapse, locality and latency lines and the target
/// lines, and returns the records.
pub(super) fn report(
    setup: &Setup,
    variants: &[Variant],
    results: &[Vec<RunResult>],
    notes: &[String],
) -> Result<Vec<Record>, String> {
    let Setup { opts, phases: ph, penalty, ref meter, .. } = *setup;
    let col = |i: usize, f: &dyn Fn(&RunResult) -> f64| results[i].iter().map(f).collect::<Vec<f64>>();
    let med = |i: usize, f: &dyn Fn(&RunResult) -> f64| Summary::of(&col(i, f)).median;
    let opt = |x: Option<f64>| x.unwrap_or(f64::NAN);
    let first = &results[0][0];
    println!(
        "numab (seed 004): 2 fake nodes of {NODE_SIZE}, both CPUs on node 1, an eater holding node 1 but {} MiB; a \
         {} MiB region under the local policy, first-touched from node 1 (pages on nodes 0 and 1 after it: {:?}); {THREADS} \
         pinned threads access it with pmbench's normal pattern (read + atomic add per access); the eater is freed \
         after {:.1} s, then {:.1} s of migration and {:.1} s after; a scan pass of {SCAN_SIZE_MB} MiB every {} ms; remote penalty {} ns; medians of {} repetitions, variants rotated. \
         Seed 004: TLB shootdowns -98%, throughput +5.5%",
        EATER_LEAVES >> 20,
        REGION_BYTES >> 20,
        first.placed,
        ph.before.as_secs_f64(),
        ph.during.as_secs_f64(),
        ph.after.as_secs_f64(),
        SCAN_PERIOD.as_millis(),
        penalty.as_nanos(),
        opts.reps,
    );
    let low: Vec<usize> = results.iter().flatten().map(|r| r.placed[0]).filter(|&n| n < PAGES / 2).collect();
    if !low.is_empty() {
        println!(
            "  note: in {} run(s) the first touch put under half the region on node 0 ({low:?} pages): the \
             experiment expects most of it there",
            low.len()
        );
    }
    for n in notes {
        println!("  note: {n}");
    }
    let mut rows = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        rows.push(vec![
            v.name(),
            format!("{:.0}", med(i, &|r| r.migrated as f64)),
            format!("{:.0}", med(i, &|r| r.pgmigrate_fail as f64)),
            format!(
                "{:.3} / {}",
                med(i, &|r| opt(r.per_page(false, false))),
                fmt_opt(med(i, &|r| opt(r.per_page(false, true))), 3)
            ),
            format!(
                "{:.2} / {}",
                med(i, &|r| opt(r.per_page(true, false))),
                fmt_opt(med(i, &|r| opt(r.per_page(true, true))), 2)
            ),
            format!(
                "{:.3} / {} / {}",
                med(i, &|r| opt(r.per_page_all(false))),
                fmt_opt(med(i, &|r| opt(r.per_page_all(true))), 3),
                fmt_opt(med(i, &|r| opt(r.own_per_page_all())), 3)
            ),
            fmt_rate(med(i, &|r| r.rate[0])),
            fmt_rate(med(i, &|r| r.rate[1])),
            fmt_rate(med(i, &|r| r.rate[2])),
            fmt_rate(med(i, &|r| r.rate_run)),
            format!("{:.1}", med(i, &|r| r.cost_ns) / 1e3),
            format!("{:.0}", med(i, &|r| r.converge_ms)),
            format!("{:.1}", med(i, &|r| r.pass_ms)),
            fmt_share(Some(med(i, &|r| opt(r.share_after)))),
            fmt_share(Some(med(i, &|r| opt(r.share_final_window)))),
            format!("{:.0}", med(i, &|r| r.peak_vmas as f64)),
            results[i].iter().map(|r| r.corrupted_bytes).sum::<u64>().to_string(),
        ]);
    }
    print_table(
        &[
            "variant",
            "migrated",
            "fail",
            "TLB/page recv / req",
            "scan TLB/page recv / req",
            "all TLB/page recv / req / own",
            "acc/s before",
            "during",
            "after",
            "run",
            "µs/migration",
            "conv ms",
            "ms/pass",
            "local after",
            "last 100ms",
            "peak VMAs",
            "bytes bad",
        ],
        &rows,
    );
    println!(
        "  migrated: numa_pages_migrated; fail: pgmigrate_fail, nearly all before the eater's free (node 1 below its \
         high watermark); TLB/page: TLB shootdowns received (recv: /proc/interrupts TLB:, summed over CPUs) and remote \
         flushes requested (req: tlb:tlb_flush), machine-wide, during the migration phase outside scan passes, per page \
         migrated in it; scan TLB/page: those while scan passes ran, per migrated page; all TLB/page: both, every \
         flush of the migration phase per page migrated in it (what seed 004 counts), and of those requested the ones \
         this process's threads requested (own: the tracepoint counted per thread); acc/s run: over the three phases; \
         µs/migration: numab_migrate_ns / pgmigrate_success; conv ms: from the \
         eater's free to 95% of the pages migrated; ms/pass: a scan pass's mean time; local: numa_hint_faults_local / numa_hint_faults after \
         convergence and in the last window; peak VMAs: Region::vma_runs at its highest; bytes bad: every byte of every \
         page checked after the run"
    );
    println!("  {}", meter.note());
    println!("  one collapse pass after convergence (numab_collapsed_pages), medians:");
    for (i, v) in variants.iter().enumerate() {
        let c = |f: &dyn Fn(&Collapse) -> f64| med(i, &|r| f(&r.collapse));
        println!(
            "    {:<20} VMA runs {:.0} -> {:.0}, {:.0} pages copied in {:.1} ms; accesses/s {} before it, {} after ({:.2}x)",
            v.name(),
            c(&|c| c.runs_before as f64),
            c(&|c| c.runs_after as f64),
            c(&|c| c.pages as f64),
            c(&|c| c.ms),
            fmt_rate(c(&|c| c.rate_before)),
            fmt_rate(c(&|c| c.rate_after)),
            c(&|c| c.rate_after / c.rate_before.max(1.0)),
        );
    }

    // Local share of hint faults per window from the eater's free, the first repetition.
    println!("  local share of hint faults per {} ms window from the eater's free (repetition 1):", WINDOW.as_millis());
    for (i, v) in variants.iter().enumerate() {
        let w: Vec<String> =
            results[i][0].share_windows.iter().map(|s| s.map_or("-".into(), |s| format!("{:.0}", s * 100.0))).collect();
        println!("    {:<20} {}", v.name(), w.join(" "));
    }
    // Latency histogram of sampled accesses during migration, all repetitions.
    let all: Vec<[u64; BUCKETS]> = (0..variants.len())
        .map(|i| {
            let mut h = [0u64; BUCKETS];
            for r in &results[i] {
                for (x, y) in h.iter_mut().zip(&r.hist[1]) {
                    *x += y;
                }
            }
            h
        })
        .collect();
    let lo = all.iter().filter_map(|h| h.iter().position(|&c| c > 0)).min().unwrap_or(0);
    let hi = all.iter().filter_map(|h| h.iter().rposition(|&c| c > 0)).max().unwrap_or(0).max(lo);
    println!("  access latency during migration, 1 in {SAMPLE_EVERY} accesses timed, % per log2 bucket:");
    let mut header = vec!["    variant".to_string()];
    header.extend((lo..=hi).map(bucket_label));
    let hrows: Vec<Vec<String>> = variants
        .iter()
        .zip(&all)
        .map(|(v, h)| {
            let n = h.iter().sum::<u64>().max(1) as f64;
            let mut row = vec![format!("    {}", v.name())];
            row.extend(h[lo..=hi].iter().map(|&c| {
                let pct = c as f64 * 100.0 / n;
                if c == 0 {
                    "0".into()
                } else if pct >= 1.0 {
                    format!("{pct:.1}")
                } else if pct >= 0.001 {
                    format!("{pct:.3}")
                } else {
                    "<0.001".into()
                }
            }));
            row
        })
        .collect();
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    print_table(&h, &hrows);

    // Targets, from this run's medians.
    let idx = |b: Backend, m: MigrateMode| variants.iter().position(|v| v.backend == b && v.mode == m);
    let mut lines = Vec::new();
    let mut controls = Vec::new();
    for (b, limit) in [(Backend::Userfaultfd, 0.05), (Backend::Mprotect, 0.60)] {
        let (Some(d), Some(e)) = (idx(b, MigrateMode::Delayed), idx(b, MigrateMode::Eager)) else {
            lines.push(format!("{} delayed against eager: not measured (backend unavailable)", backend_name(b)));
            continue;
        };
        let tlb = |i, req| Summary::of(&col(i, &|r: &RunResult| opt(r.per_page(false, req)))).median;
        let (td, te) = (tlb(d, false), tlb(e, false));
        let r = td / te;
        let req = match (tlb(d, true), tlb(e, true)) {
            (x, y) if x.is_nan() || y.is_nan() => String::new(),
            (x, y) => format!(" (requested: {x:.3} against {y:.3}, {:.1}%)", x / y * 100.0),
        };
        lines.push(format!(
            "{} delayed TLB shootdowns received per migrated page {td:.3} against eager's {te:.3}: {:.1}%{req} \
             (≤ {:.0}%: {})",
            backend_name(b),
            r * 100.0,
            limit * 100.0,
            verdict(r <= limit)
        ));
        let r = paired_ratio(&col(d, &|r| r.rate[1]), &col(e, &|r| r.rate[1]));
        lines.push(format!(
            "{} delayed accesses/s during migration against eager's: {:.3} (≥ 1: {})",
            backend_name(b),
            r,
            verdict(r >= 1.0)
        ));
        let r = paired_ratio(&col(d, &|r| r.cost_ns), &col(e, &|r| r.cost_ns));
        lines.push(format!(
            "{} delayed migration cost per page against eager's: {:.1}% (≤ 30%: {})",
            backend_name(b),
            r * 100.0,
            verdict(r <= 0.30)
        ));
        // Seed 004's count: every shootdown of the migration phase, the scanner's included.
        let all = |i, req| Summary::of(&col(i, &|r: &RunResult| opt(r.per_page_all(req)))).median;
        let (ad, ae) = (all(d, false), all(e, false));
        let own = |i| Summary::of(&col(i, &|r: &RunResult| opt(r.own_per_page_all()))).median;
        let req = match (all(d, true), all(e, true), own(d), own(e)) {
            (x, y, ..) if x.is_nan() || y.is_nan() => String::new(),
            (x, y, o, p) if o.is_nan() || p.is_nan() => {
                format!(" (requested: {x:.3} against {y:.3}, {:.1}%)", x / y * 100.0)
            }
            (x, y, o, p) => format!(
                " (requested: {x:.3} against {y:.3}, {:.1}%; by this process: {o:.3} against {p:.3}, {:.1}%)",
                x / y * 100.0,
                o / p * 100.0
            ),
        };
        lines.push(format!(
            "{} every TLB shootdown of the migration phase (scan passes included) per migrated page, delayed \
             {ad:.3} against eager's {ae:.3}: {:.1}%{req} (≤ 5%: {})",
            backend_name(b),
            ad / ae * 100.0,
            verdict(ad / ae <= 0.05)
        ));
        lines.push(format!(
            "{} delayed, every TLB shootdown of the migration phase per migrated page: {ad:.3} (≤ 0.2: {})",
            backend_name(b),
            verdict(ad <= 0.2)
        ));
        let r = paired_ratio(&col(d, &|r| r.rate_run), &col(e, &|r| r.rate_run));
        let same = paired_ratio(&col(d, &|r| r.rate[0]), &col(e, &|r| r.rate[0]));
        lines.push(format!(
            "{} delayed accesses/s over the whole run against eager's: {r:.3} (≥ 1: {}; control: {same:.3} before \
             the eater's free, where both run the same code)",
            backend_name(b),
            verdict(r >= 1.0)
        ));
        // The control for the shootdown targets: what the machine and the balancer's thread
        // flush when nothing migrates, at the same rate over the migration phase.
        let ctl = |i, req| Summary::of(&col(i, &|r: &RunResult| opt(r.control_per_page(req)))).median;
        let req = match (ctl(d, true), ctl(e, true)) {
            (x, y) if x.is_nan() || y.is_nan() => String::new(),
            (x, y) => format!(" (requested: {x:.3} and {y:.3})"),
        };
        controls.push(format!(
            "{}: outside scan passes before the eater's free (no page can migrate), at the migration phase's \
             length, per page migrated in it: delayed runs {:.3}, eager runs {:.3}{req}; delayed's total less its \
             control, against eager's less its: {:.1}%",
            backend_name(b),
            ctl(d, false),
            ctl(e, false),
            (ad - ctl(d, false)).max(0.0) / (ae - ctl(e, false)).max(1e-9) * 100.0
        ));
        let others = |i| Summary::of(&col(i, &|r: &RunResult| opt(r.others_share()))).median;
        if !others(d).is_nan() {
            controls.push(format!(
                "{}: of the flushes requested on the machine during the migration phase, other processes' (not \
                 this run's threads'): delayed runs {:.0}%, eager runs {:.0}%",
                backend_name(b),
                others(d) * 100.0,
                others(e) * 100.0
            ));
        }
    }
    let migrated: Vec<f64> = (0..variants.len()).map(|i| med(i, &|r| r.migrated as f64)).collect();
    let (lo_m, hi_m) = migrated.iter().fold((f64::INFINITY, 0.0f64), |(a, b), &m| (a.min(m), b.max(m)));
    lines.push(format!(
        "pages migrated across variants: {:.0} to {:.0}, spread {:.1}% (≤ 10%: {})",
        lo_m,
        hi_m,
        (hi_m / lo_m.max(1.0) - 1.0) * 100.0,
        verdict(hi_m <= lo_m * 1.10 && lo_m > 0.0)
    ));
    let shares: Vec<f64> = (0..variants.len()).map(|i| med(i, &|r| opt(r.share_after))).collect();
    let worst = shares.iter().copied().fold(f64::INFINITY, f64::min);
    lines.push(format!(
        "local share of hint faults after convergence, worst variant: {} (≥ 90%: {})",
        fmt_share(Some(worst)),
        verdict(worst >= 0.90)
    ));
    let bad: u64 = results.iter().flatten().map(|r| r.corrupted_bytes).sum();
    let bad_reads: u64 = results.iter().flatten().map(|r| r.bad_reads).sum();
    lines.push(format!(
        "bytes corrupted over every page of every run: {bad} (pattern reads that saw a wrong value: {bad_reads}) \
         (0: {})",
        verdict(bad == 0 && bad_reads == 0)
    ));
    let inv: Vec<String> = results
        .iter()
        .flatten()
        .filter_map(|r| match &r.invariants {
            Ok(0) => None,
            Ok(n) => Some(format!("{n} frames left allocated")),
            Err(e) => Some(e.clone()),
        })
        .collect();
    lines.push(format!(
        "check_invariants after the region, the eater and the balancer are gone: {} (Ok(0): {})",
        if inv.is_empty() { "Ok(0) in every run".to_string() } else { inv.join("; ") },
        verdict(inv.is_empty())
    ));
    for l in lines {
        println!("  target: {l}");
    }
    for c in controls {
        println!("  control, {c}");
    }
    let max_map = std::fs::read_to_string("/proc/sys/vm/max_map_count").ok().and_then(|s| s.trim().parse::<u64>().ok());
    let peak = results.iter().flatten().map(|r| r.peak_vmas).max().unwrap_or(0);
    println!(
        "  VMAs: the region needed at most {peak} for its {PAGES} pages in any run (vm.max_map_count {})",
        max_map.map_or("unknown".into(), |m| m.to_string())
    );
    println!();

    let mut records = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        let reference = Variant { backend: v.backend, mode: MigrateMode::Eager };
        let r = idx(v.backend, MigrateMode::Eager).unwrap_or(i);
        let cost = col(i, &|r| r.cost_ns);
        records.push(Record {
            experiment: "numab".into(),
            subject: v.name(),
            params: json!({
                "measure": "ns per migrated page (numab_migrate_ns / pgmigrate_success)",
                "region_pages": PAGES,
                "node_size": NODE_SIZE,
                "phases_s": [ph.before.as_secs_f64(), ph.during.as_secs_f64(), ph.after.as_secs_f64()],
                "remote_penalty_ns": penalty.as_nanos() as u64,
                "pages_migrated": Summary::of(&col(i, &|r| r.migrated as f64)),
                "pgmigrate_fail": Summary::of(&col(i, &|r| r.pgmigrate_fail as f64)),
                "tlb_shootdowns_received_per_migrated_page_outside_scans":
                    Summary::of(&col(i, &|r| opt(r.per_page(false, false)))),
                "tlb_shootdowns_received_per_migrated_page_in_scans":
                    Summary::of(&col(i, &|r| opt(r.per_page(true, false)))),
                "remote_flushes_requested_per_migrated_page_outside_scans":
                    Summary::of(&col(i, &|r| opt(r.per_page(false, true)))),
                "remote_flushes_requested_per_migrated_page_in_scans":
                    Summary::of(&col(i, &|r| opt(r.per_page(true, true)))),
                "tlb_shootdowns_received_per_migrated_page_all":
                    Summary::of(&col(i, &|r| opt(r.per_page_all(false)))),
                "remote_flushes_requested_per_migrated_page_all":
                    Summary::of(&col(i, &|r| opt(r.per_page_all(true)))),
                "remote_flushes_requested_by_this_process_per_migrated_page_all":
                    Summary::of(&col(i, &|r| opt(r.own_per_page_all()))),
                "share_of_requested_flushes_from_other_processes":
                    Summary::of(&col(i, &|r| opt(r.others_share()))),
                "control_tlb_shootdowns_received_per_migrated_page":
                    Summary::of(&col(i, &|r| opt(r.control_per_page(false)))),
                "control_remote_flushes_requested_per_migrated_page":
                    Summary::of(&col(i, &|r| opt(r.control_per_page(true)))),
                "accesses_per_s": {
                    "before": Summary::of(&col(i, &|r| r.rate[0])),
                    "during": Summary::of(&col(i, &|r| r.rate[1])),
                    "after": Summary::of(&col(i, &|r| r.rate[2])),
                    "run": Summary::of(&col(i, &|r| r.rate_run)),
                },
                "converge_ms": Summary::of(&col(i, &|r| r.converge_ms)),
                "scan_pass_ms": Summary::of(&col(i, &|r| r.pass_ms)),
                "local_share_after": Summary::of(&col(i, &|r| opt(r.share_after))),
                "local_share_final_window": Summary::of(&col(i, &|r| opt(r.share_final_window))),
                "peak_vma_runs": Summary::of(&col(i, &|r| r.peak_vmas as f64)),
                "collapse": {
                    "vma_runs_before": Summary::of(&col(i, &|r| r.collapse.runs_before as f64)),
                    "vma_runs_after": Summary::of(&col(i, &|r| r.collapse.runs_after as f64)),
                    "pages_copied": Summary::of(&col(i, &|r| r.collapse.pages as f64)),
                    "ms": Summary::of(&col(i, &|r| r.collapse.ms)),
                    "accesses_per_s_before": Summary::of(&col(i, &|r| r.collapse.rate_before)),
                    "accesses_per_s_after": Summary::of(&col(i, &|r| r.collapse.rate_after)),
                },
                "placed_per_node": results[i].iter().map(|r| r.placed.clone()).collect::<Vec<_>>(),
                "placed_per_node_end": results[i].iter().map(|r| r.placed_end.clone()).collect::<Vec<_>>(),
                "latency_log2_ns": PHASES.iter().enumerate().map(|(p, name)| {
                    let mut h = [0u64; BUCKETS];
                    for r in &results[i] {
                        for (x, y) in h.iter_mut().zip(&r.hist[p]) {
                            *x += y;
                        }
                    }
                    (name.to_string(), json!(h.to_vec()))
                }).collect::<serde_json::Map<_, _>>(),
                "corrupted_bytes": results[i].iter().map(|r| r.corrupted_bytes).sum::<u64>(),
                // Per run, every window from the start (what `--plot` draws over time).
                "timeline": {
                    "window_ms": WINDOW.as_millis() as u64,
                    "runs": results[i].iter().map(|r| json!({
                        "eater_freed_s": r.eater_freed_s,
                        "end_s": r.timeline.iter().map(|w| w.end_s).collect::<Vec<_>>(),
                        "accesses_per_s": r.timeline.iter().map(|w| w.accesses_per_s).collect::<Vec<_>>(),
                        "tlb_shootdowns_received": r.timeline.iter().map(|w| w.received).collect::<Vec<_>>(),
                        "remote_flushes_requested": r.timeline.iter().map(|w| w.requested).collect::<Vec<_>>(),
                        "pages_migrated": r.timeline.iter().map(|w| w.migrated).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                },
            }),
            ns_per_op: Summary::of(&cost),
            reference: reference.name(),
            ratio_to_reference: paired_ratio(&cost, &col(r, &|r| r.cost_ns)),
            reps: results[i].len(),
            samples: cost.clone(),
        });
    }
    Ok(records)
}
