//! `tier`: memory tiering (issue 41) on a fake fast node with both CPUs and a memory-only
//! node three times larger (the tier below, as a CXL expander appears). A region 1.5 times
//! the fast node is first-touched in address order from node 0's CPUs: its cold 80% first,
//! which fills the fast node, then its hot 20%, which falls back to the slow node. Two
//! threads, one per CPU, then access the hot set only, uniformly, with pmbench's pattern (a
//! read of a checked word and an atomic add per access); the cold data stays idle, as most
//! memory does (TPP's traces: 55-80% idle within minutes). Every access to a page whose frame
//! is on the slow tier busy-waits an emulated CXL penalty (`ZONAL_TIER_PENALTY_NS`, default
//! 150 ns). Every byte is checked at the end, and the allocator's invariants after teardown.
//!
//! Variants, each on a fresh allocator, rotated: `mode 1` (normal balancing, which cannot
//! move the hot set: the fast node has no room), `mode 2 delayed` and `mode 2 eager` (memory
//! tiering with demotion, delayed and eager mapping), and `ideal` (balancing off, the hot set
//! first-touched first, so it sits in the fast node from the start and nothing moves).
//!
//! The fast node's `watermark_scale_factor` is 300 (3% of the node between watermarks, as
//! tiered deployments raise it to keep room for promotions): with Linux's default 10 a
//! demotion round makes room for ~30 pages and the hot set needs ~150 scan periods.
//! Not in the default `zonal bench` run (it runs when named): its 4 variants take ~17 s a
//! repetition, and the full run is kept to a few minutes.

#![deny(clippy::undocumented_unsafe_blocks)]

use super::{paired_ratio, print_table, verdict, BenchOpts, Record, Summary};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zonal::zone::Watermark;
use zonal::{MemPolicy, NodeId, Zonal};
use zonal_numab::{Balancer, MigrateMode, Region, PAGE};

/// The fast node (CPUs) and the slow one (memory only, distance 20: the tier below).
const FAST: usize = 64 << 20;
const SLOW: usize = 192 << 20;
/// The working set: 1.5 times the fast node.
const PAGES: usize = FAST / PAGE * 3 / 2;
/// The hot set: the region's last 20%.
const HOT: usize = PAGES / 5;
const HOT_FIRST: usize = PAGES - HOT;
const THREADS: usize = 2;
const WORDS: usize = PAGE / 8;
const FIRST_DATA: usize = 1 + THREADS;
const TAG: u64 = 0x71e2_0041_0000_0000;
/// One run's length, the steady state it ends with, and the sampling window.
const RUN: Duration = Duration::from_millis(4000);
const STEADY: Duration = Duration::from_millis(1500);
const WINDOW: Duration = Duration::from_millis(100);
/// The fast node's watermark_scale_factor (see the module's docs).
const WSF: &str = "300";
/// The scanner: a pass at most every 100 ms, at least every 200 ms (a promotion that finds
/// no room counts as a failed migration, which doubles Linux's period: up to this bound).
const PERIOD_MIN_MS: u64 = 100;
const PERIOD_MAX_MS: u64 = 200;
/// Repetitions at most (one is ~17 s), so that the steady-state ratios pair runs of the
/// same rotation (the machine's phases cancel) and the experiment stays under a minute.
const MAX_REPS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Mode1,
    Mode2(MigrateMode),
    Ideal,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Mode1 => "mode 1 (normal)",
            Variant::Mode2(MigrateMode::Delayed) => "mode 2 delayed",
            Variant::Mode2(MigrateMode::Eager) => "mode 2 eager",
            Variant::Ideal => "ideal (hot set fast from the start)",
        }
    }
}

const VARIANTS: [Variant; 4] =
    [Variant::Mode1, Variant::Mode2(MigrateMode::Delayed), Variant::Mode2(MigrateMode::Eager), Variant::Ideal];

/// The fixed content of word `w` of page `p` (splitmix64's finalizer).
fn pattern(p: usize, w: usize) -> u64 {
    let mut x = ((p as u64) << 9 | w as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A word of the region as an atomic.
fn at(base: usize, p: usize, w: usize) -> &'static AtomicU64 {
    // SAFETY: the callers pass pages of a live region (p < PAGES, w < WORDS), 8-byte aligned
    // words of page-aligned pages; the region outlives every use (the workers and the check
    // end before it is dropped). A hidden page faults and the balancer maps it.
    unsafe { &*((base + p * PAGE + w * 8) as *const AtomicU64) }
}

/// A counter on its own cache line.
#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicU64);

/// One sample, at the end of a window.
struct Sample {
    at: Duration,
    accesses: u64,
    hot_fast: usize,
    promoted: u64,
    demoted: u64,
    /// Hint faults, pages hidden and pages collapsed so far.
    faults: u64,
    hidden: u64,
    collapsed: u64,
}

/// The figures of one run.
#[derive(Clone, Debug)]
struct RunResult {
    /// Hot pages on the slow node after the first touch, and the fast node's free pages
    /// above its high watermark then (the promotions it had room for).
    hot_slow_start: usize,
    room_start: usize,
    /// Accesses/s over the last `STEADY`, and per window (end s, accesses/s, hot share fast).
    steady: f64,
    timeline: Vec<(f64, f64, f64)>,
    /// ms until 95% of the hot set was on the fast node (None: never).
    converge_ms: Option<f64>,
    promoted: u64,
    demoted: u64,
    /// Promotions per second in the steady state, when it began after convergence.
    thrash_per_s: Option<f64>,
    /// In the steady state, per second: hint faults, pages hidden, pages collapsed.
    steady_faults: f64,
    steady_hidden: f64,
    steady_collapsed: f64,
    corrupted_bytes: u64,
    bad_reads: u64,
    invariants: Result<usize, String>,
}

fn allocator(opts: &BenchOpts) -> Result<Arc<Zonal>, String> {
    let ncpu = zonal::cpu::nr_cpus_online().max(1);
    let spec = format!("nodes=2,sizes={}M:{}M,cpus=0-{}:", FAST >> 20, SLOW >> 20, ncpu - 1);
    let mut config = opts.config.clone();
    config.topology = zonal::Topology::parse(&spec).map_err(|e| e.to_string())?;
    let z = Zonal::new(config).map_err(|e| format!("tier: cannot build the two-tier allocator: {e}"))?;
    z.sysctl_set("watermark_scale_factor", WSF).map_err(|e| e.to_string())?;
    Ok(Arc::new(z))
}

fn hot_on_fast(r: &Region) -> usize {
    let base = r.as_ptr() as usize;
    (HOT_FIRST..PAGES)
        .filter(|&p| r.page_to_nid((base + p * PAGE) as *const u8).ok().flatten() == Some(NodeId(0)))
        .count()
}

fn run_one(v: Variant, opts: &BenchOpts, penalty: Duration) -> Result<RunResult, String> {
    let z = allocator(opts)?;
    let cfg = zonal_numab::Config {
        enabled: v == Variant::Mode1,
        tiering: matches!(v, Variant::Mode2(_)),
        demotion_enabled: true,
        mode: if let Variant::Mode2(m) = v { m } else { MigrateMode::Delayed },
        scan_delay_ms: 50,
        scan_period_min_ms: PERIOD_MIN_MS,
        scan_period_max_ms: PERIOD_MAX_MS,
        chunk_migration: false,
        ..Default::default()
    };
    let bal = Balancer::new(z.clone(), cfg).map_err(|e| format!("tier: {}: {e}", v.name()))?;
    let region = bal.region(PAGES * PAGE, MemPolicy::Local).map_err(|e| format!("tier: region: {e}"))?;
    let base = region.as_ptr() as usize;
    // First touch from node 0's CPU: cold first (the hot set falls back to the slow node),
    // or, for the ideal, hot first.
    let order: Vec<usize> = match v {
        Variant::Ideal => (HOT_FIRST..PAGES).chain(0..HOT_FIRST).collect(),
        _ => (0..PAGES).collect(),
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = zonal::cpu::set_affinity(0);
            for &p in &order {
                for w in 0..WORDS {
                    let val = match w {
                        0 => TAG ^ p as u64,
                        w if w < FIRST_DATA => 0,
                        w => pattern(p, w),
                    };
                    at(base, p, w).store(val, Ordering::Relaxed);
                }
            }
        });
    });
    let hot_slow_start = HOT - hot_on_fast(&region);
    let high = z.zones()[0].watermark(Watermark::High);
    let room_start = z.nr_free_pages_approx(NodeId(0)).unwrap_or(0).saturating_sub(high);

    let stop = AtomicBool::new(false);
    let done: [Padded; THREADS] = Default::default();
    let ncpu = zonal::cpu::nr_cpus_online().max(1) as u32;
    let t0 = Instant::now();
    let (outs, samples) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (stop, done, region) = (&stop, &done, &region);
                s.spawn(move || {
                    let _ = zonal::cpu::set_affinity(t as u32 % ncpu);
                    let mut tally = vec![0u64; HOT];
                    let (mut bad, mut n) = (0u64, 0u64);
                    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ ((t as u64 + 1) << 32);
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..64 {
                            let r = xorshift(&mut rng);
                            let h = (r >> 32) as usize % HOT;
                            let p = HOT_FIRST + h;
                            let w = FIRST_DATA + (r as usize % (WORDS - FIRST_DATA));
                            let addr = (base + p * PAGE) as *const u8;
                            if region.page_to_nid(addr).ok().flatten().is_some_and(|n| n.0 != 0) {
                                let s = Instant::now();
                                while s.elapsed() < penalty {
                                    std::hint::spin_loop();
                                }
                            }
                            bad += (at(base, p, w).load(Ordering::Relaxed) != pattern(p, w)) as u64;
                            at(base, p, 1 + t).fetch_add(1, Ordering::Relaxed);
                            tally[h] += 1;
                            n += 1;
                        }
                        done[t].0.store(n, Ordering::Relaxed);
                    }
                    (tally, bad)
                })
            })
            .collect();
        let sample = |at: Duration| {
            let st = bal.stats();
            Sample {
                at,
                accesses: done.iter().map(|d| d.0.load(Ordering::Relaxed)).sum(),
                hot_fast: hot_on_fast(&region),
                promoted: st.pgpromote_success,
                demoted: st.pgdemote_kswapd + st.pgdemote_direct,
                faults: st.numa_hint_faults,
                hidden: st.numa_pte_updates,
                collapsed: st.collapsed_pages,
            }
        };
        let mut samples = vec![sample(Duration::ZERO)];
        let mut k = 1;
        while WINDOW * k <= RUN {
            let next = t0 + WINDOW * k;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            samples.push(sample(t0.elapsed()));
            k += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let outs: Vec<(Vec<u64>, u64)> = hs.into_iter().map(|h| h.join().unwrap_or_default()).collect();
        (outs, samples)
    });
    bal.set_numa_balancing(0).map_err(|e| e.to_string())?;
    let last = samples.last().ok_or("tier: no sample")?;
    let from = samples.iter().rev().find(|s| last.at - s.at >= STEADY).unwrap_or(&samples[0]);
    let rate = |x: &Sample, y: &Sample| (y.accesses - x.accesses) as f64 / (y.at - x.at).as_secs_f64().max(1e-9);
    let converged = samples.iter().find(|s| s.hot_fast * 100 >= HOT * 95);
    let thrash_per_s = converged
        .filter(|c| c.at <= from.at && last.at > from.at)
        .map(|_| (last.promoted - from.promoted) as f64 / (last.at - from.at).as_secs_f64());
    let timeline = samples
        .windows(2)
        .map(|w| (w[1].at.as_secs_f64(), rate(&w[0], &w[1]), w[1].hot_fast as f64 / HOT as f64))
        .collect();
    // Every byte against what it must hold.
    let mut corrupted_bytes = 0u64;
    for p in 0..PAGES {
        for w in 0..WORDS {
            let want = match w {
                0 => TAG ^ p as u64,
                w if w < FIRST_DATA => match p.checked_sub(HOT_FIRST) {
                    Some(h) => outs.get(w - 1).map_or(0, |o| o.0[h]),
                    None => 0,
                },
                w => pattern(p, w),
            };
            let got = at(base, p, w).load(Ordering::Relaxed);
            corrupted_bytes += (got ^ want).to_le_bytes().iter().filter(|&&b| b != 0).count() as u64;
        }
    }
    let (promoted, demoted) = (last.promoted, last.demoted);
    let secs = (last.at - from.at).as_secs_f64().max(1e-9);
    let per_s = |f: fn(&Sample) -> u64| (f(last) - f(from)) as f64 / secs;
    drop(region);
    drop(bal);
    Ok(RunResult {
        hot_slow_start,
        room_start,
        steady: rate(from, last),
        timeline,
        converge_ms: converged.map(|c| c.at.as_secs_f64() * 1e3),
        promoted,
        demoted,
        thrash_per_s,
        steady_faults: per_s(|s| s.faults),
        steady_hidden: per_s(|s| s.hidden),
        steady_collapsed: per_s(|s| s.collapsed),
        corrupted_bytes,
        bad_reads: outs.iter().map(|o| o.1).sum(),
        invariants: z.check_invariants().map_err(|e| e.to_string()),
    })
}

/// Runs the experiment, prints its table and targets, and returns its records.
pub fn run(opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let penalty = super::penalty_from_env("ZONAL_TIER_PENALTY_NS", Duration::from_nanos(150))?;
    let reps = opts.reps.min(MAX_REPS);
    let short = BenchOpts { reps, ..opts.clone() };
    let mut results: Vec<Vec<RunResult>> = vec![Vec::new(); VARIANTS.len()];
    let mut err = None;
    super::rotate(&short, "tier", VARIANTS.len(), |i| {
        if err.is_some() {
            return;
        }
        match run_one(VARIANTS[i], opts, penalty) {
            Ok(r) => results[i].push(r),
            Err(e) => err = Some(e),
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    if results.iter().any(Vec::is_empty) {
        return Ok(Vec::new());
    }
    report(&results, penalty, reps)
}

fn report(results: &[Vec<RunResult>], penalty: Duration, reps: usize) -> Result<Vec<Record>, String> {
    let col = |i: usize, f: &dyn Fn(&RunResult) -> f64| results[i].iter().map(f).collect::<Vec<f64>>();
    let med = |i: usize, f: &dyn Fn(&RunResult) -> f64| Summary::of(&col(i, f)).median;
    let (m1, del, eag, ideal) = (0, 1, 2, 3);
    println!(
        "tier (issue 41): a fast node of {} MiB with both CPUs and a memory-only node of {} MiB (the tier below); a \
         {} MiB region first-touched cold first, its hot {}% ({HOT} pages) last, so on the slow node ({} pages there \
         at the start); {THREADS} pinned threads read + atomically add uniformly over the hot set, {} ns busy-waited \
         per slow-tier access; runs of {:.1} s, steady state the last {:.1} s; scan period {PERIOD_MIN_MS}-{PERIOD_MAX_MS} \
         ms, demotion on, fast node watermark_scale_factor {WSF}; medians of {reps} repetition(s), variants rotated. \
         TPP (ASPLOS'23): tiered within ~1% of all-local",
        FAST >> 20,
        SLOW >> 20,
        (PAGES * PAGE) >> 20,
        HOT * 100 / PAGES,
        results[del][0].hot_slow_start,
        penalty.as_nanos(),
        RUN.as_secs_f64(),
        STEADY.as_secs_f64(),
    );
    let fmt_ms = |x: f64| if x.is_nan() { "-".to_string() } else { format!("{x:.0}") };
    let rows: Vec<Vec<String>> = VARIANTS
        .iter()
        .enumerate()
        .map(|(i, v)| {
            vec![
                v.name().to_string(),
                format!("{:.1}M", med(i, &|r| r.steady) / 1e6),
                format!("{:.3}", paired_ratio(&col(i, &|r| r.steady), &col(ideal, &|r| r.steady))),
                fmt_ms(med(i, &|r| r.converge_ms.unwrap_or(f64::NAN))),
                format!("{:.0}", med(i, &|r| r.promoted as f64)),
                format!("{:.0}", med(i, &|r| r.demoted as f64)),
                format!("{:.1}", med(i, &|r| r.thrash_per_s.unwrap_or(f64::NAN))),
                format!(
                    "{:.0} / {:.0} / {:.0}",
                    med(i, &|r| r.steady_faults),
                    med(i, &|r| r.steady_hidden),
                    med(i, &|r| r.steady_collapsed)
                ),
                format!("{}", results[i].iter().map(|r| r.corrupted_bytes + r.bad_reads).sum::<u64>()),
            ]
        })
        .collect();
    print_table(
        &[
            "variant",
            "steady acc/s",
            "/ ideal",
            "converge ms",
            "promoted",
            "demoted",
            "promo/s after",
            "steady faults/hidden/collapsed per s",
            "bad bytes",
        ],
        &rows,
    );
    // The hot set's share on the fast node over time, mode 2 delayed, first repetition.
    let line: String = results[del][0]
        .timeline
        .iter()
        .step_by(2)
        .map(|(t, _, share)| format!("{t:.1}s {:.0}%", share * 100.0))
        .collect::<Vec<_>>()
        .join(", ");
    println!("  hot set on the fast node, mode 2 delayed: {line}");
    let pr = |a: usize, b: usize| paired_ratio(&col(a, &|r| r.steady), &col(b, &|r| r.steady));
    let target = |name: &str, figures: String, met: bool| println!("  target: {name}: {figures}: {}", verdict(met));
    for (i, v) in [(del, "delayed"), (eag, "eager")] {
        let r = pr(i, ideal);
        target(&format!("mode 2 {v} steady accesses/s >= 97% of the ideal"), format!("{:.1}%", r * 100.0), r >= 0.97);
        let r = pr(i, m1);
        target(&format!("mode 2 {v} steady accesses/s >= 1.3x mode 1"), format!("{r:.2}x"), r >= 1.3);
    }
    let conv = med(del, &|r| r.converge_ms.unwrap_or(f64::NAN));
    target(
        "mode 2 delayed converges (95% of the hot set on the fast node)",
        format!("{} ms", fmt_ms(conv)),
        results[del].iter().all(|r| r.converge_ms.is_some()),
    );
    let within = results[del].iter().all(|r| (r.promoted as f64 - r.hot_slow_start as f64).abs() <= 0.1 * HOT as f64);
    target(
        "pages promoted within 10% of the hot set on the slow node",
        format!("{:.0} promoted for {:.0}", med(del, &|r| r.promoted as f64), med(del, &|r| r.hot_slow_start as f64)),
        within,
    );
    let need = |r: &RunResult| r.promoted.saturating_sub(r.room_start as u64);
    target(
        "pages demoted >= the promotions the fast node had no room for",
        format!("{:.0} demoted, {:.0} needed", med(del, &|r| r.demoted as f64), med(del, &|r| need(r) as f64)),
        results[del].iter().all(|r| r.demoted >= need(r)),
    );
    let limit = HOT as f64 / 100.0;
    target(
        "no thrashing: promotions/s in the steady state, after convergence, <= 1% of the hot set",
        format!("{:.1}/s, limit {limit:.0}/s", med(del, &|r| r.thrash_per_s.unwrap_or(f64::NAN))),
        results[del].iter().chain(&results[eag]).all(|r| r.thrash_per_s.is_some_and(|t| t <= limit)),
    );
    let bad: u64 = results.iter().flatten().map(|r| r.corrupted_bytes + r.bad_reads).sum();
    target("0 bytes corrupted (every variant)", format!("{bad}"), bad == 0);
    let broken: Vec<String> = results.iter().flatten().filter_map(|r| r.invariants.as_ref().err().cloned()).collect();
    target(
        "check_invariants clean after teardown",
        if broken.is_empty() { "clean".into() } else { broken.join("; ") },
        broken.is_empty(),
    );
    println!();
    let ns = |r: &RunResult| 1e9 / r.steady.max(1e-9);
    Ok(VARIANTS
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            experiment: "tier".into(),
            subject: v.name().into(),
            params: json!({
                "penalty_ns": penalty.as_nanos() as u64,
                "fast_mib": FAST >> 20, "slow_mib": SLOW >> 20, "pages": PAGES, "hot_pages": HOT,
                "hot_on_slow_at_start": results[i].iter().map(|r| r.hot_slow_start).collect::<Vec<_>>(),
                "converge_ms": results[i].iter().map(|r| r.converge_ms).collect::<Vec<_>>(),
                "pgpromote_success": results[i].iter().map(|r| r.promoted).collect::<Vec<_>>(),
                "pgdemote": results[i].iter().map(|r| r.demoted).collect::<Vec<_>>(),
                "promotions_per_s_after_convergence": results[i].iter().map(|r| r.thrash_per_s).collect::<Vec<_>>(),
                "corrupted_bytes": results[i].iter().map(|r| r.corrupted_bytes).sum::<u64>(),
                "timeline": {
                    "window_ms": WINDOW.as_millis() as u64,
                    "runs": results[i].iter().map(|r| json!({
                        "end_s": r.timeline.iter().map(|w| w.0).collect::<Vec<_>>(),
                        "accesses_per_s": r.timeline.iter().map(|w| w.1).collect::<Vec<_>>(),
                        "hot_on_fast": r.timeline.iter().map(|w| w.2).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                },
            }),
            ns_per_op: Summary::of(&col(i, &ns)),
            reference: VARIANTS[ideal].name().into(),
            ratio_to_reference: paired_ratio(&col(i, &ns), &col(ideal, &ns)),
            reps: results[i].len(),
            samples: col(i, &ns),
        })
        .collect())
}
