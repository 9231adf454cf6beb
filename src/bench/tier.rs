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
//! Each variant first runs 4 s alone, from the first touch: its convergence, promotions,
//! demotions and steady-state promotions come from that run. Its steady accesses/s come from
//! the turns that follow, with all four alive: round after round, each variant runs 300 ms
//! with its balancer on while the others wait paused. On a shared VM the rate drifts ±15%
//! over seconds, so one variant's 1.5 s against another's measured seconds later read
//! 95-116% for the same mechanism; turns put every slow phase on all the variants alike.
//!
//! The fast node's `watermark_scale_factor` is 300 (3% of the node between watermarks, as
//! tiered deployments raise it to keep room for promotions): with Linux's default 10 a
//! demotion round makes room for ~30 pages and the hot set needs ~150 scan periods.
//! Not in the default `zonal bench` run (it runs when named): a repetition takes ~26 s (four
//! 4 s runs, 8 rounds of four 300 ms turns, the first touches and byte checks), and the full
//! run is kept to a few minutes.

#![deny(clippy::undocumented_unsafe_blocks)]

use super::{print_table, verdict, BenchOpts, Record, Summary};
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
/// The steady state's turns: each variant runs `TURN` per round, `ROUNDS` rounds (a turn
/// spans at least one scan period, so each holds its balancer's periodic work).
const TURN: Duration = Duration::from_millis(300);
const ROUNDS: usize = 8;
/// The fast node's watermark_scale_factor (see the module's docs).
const WSF: &str = "300";
/// The scanner: a pass at most every 100 ms, at least every 200 ms (a promotion that finds
/// no room counts as a failed migration, which doubles Linux's period: up to this bound).
const PERIOD_MIN_MS: u64 = 100;
const PERIOD_MAX_MS: u64 = 200;
/// Repetitions at most (one is ~26 s), so that the experiment stays near a minute.
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
    /// Accesses/s over the convergence run's last `STEADY`; the steady state's accesses/s
    /// (the mean of its turns') and each turn's, in order ([`interleave`]).
    run_tail: f64,
    steady: f64,
    windows: Vec<f64>,
    /// Per window of the convergence run: end s, accesses/s, hot share fast.
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

/// One variant's allocator, balancer and region, kept alive from its convergence run through
/// the interleaved steady state to the byte check.
struct Live {
    v: Variant,
    z: Arc<Zonal>,
    bal: Balancer,
    region: Region,
    /// Per thread, the accesses it made to each hot page (the page's counter word must hold it).
    tally: Vec<Vec<u64>>,
    bad_reads: u64,
    result: RunResult,
}

impl Variant {
    /// Its `numa_balancing` while it runs (0 while another variant's windows run).
    fn bits(self) -> u8 {
        match self {
            Variant::Mode1 => 1,
            Variant::Mode2(_) => 2,
            Variant::Ideal => 0,
        }
    }
}

/// Runs the access threads over the hot set of `region` for `dur`, calling `tick` with the
/// time since the start and the accesses so far at the end of every `WINDOW` (the last at
/// `dur`). Returns the reads that found a wrong value.
fn access(
    region: &Region,
    tally: &mut [Vec<u64>],
    penalty: Duration,
    dur: Duration,
    mut tick: impl FnMut(Duration, u64),
) -> u64 {
    let base = region.as_ptr() as usize;
    let stop = AtomicBool::new(false);
    let done: [Padded; THREADS] = Default::default();
    let ncpu = zonal::cpu::nr_cpus_online().max(1) as u32;
    std::thread::scope(|s| {
        let hs: Vec<_> = tally
            .iter_mut()
            .enumerate()
            .map(|(t, tally)| {
                let (stop, done) = (&stop, &done);
                s.spawn(move || {
                    let _ = zonal::cpu::set_affinity(t as u32 % ncpu);
                    let (mut bad, mut n) = (0u64, 0u64);
                    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ ((t as u64 + 1) << 32) ^ tally.iter().sum::<u64>();
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
                    bad
                })
            })
            .collect();
        let t0 = Instant::now();
        let mut k = 1;
        while WINDOW * k <= dur {
            std::thread::sleep((t0 + WINDOW * k).saturating_duration_since(Instant::now()));
            tick(t0.elapsed(), done.iter().map(|d| d.0.load(Ordering::Relaxed)).sum());
            k += 1;
        }
        stop.store(true, Ordering::Relaxed);
        // A thread that panicked counts as reads gone wrong: the byte check then tells.
        hs.into_iter().map(|h| h.join().unwrap_or(1)).sum()
    })
}

/// Builds variant `v`, first-touches its region and runs it `RUN` from the start: the
/// convergence, promotions, demotions and thrash figures come from this run; its steady
/// accesses/s from [`interleave`].
fn converge(v: Variant, opts: &BenchOpts, penalty: Duration) -> Result<Live, String> {
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

    let mut tally = vec![vec![0u64; HOT]; THREADS];
    let sample = |at: Duration, accesses: u64| {
        let st = bal.stats();
        Sample {
            at,
            accesses,
            hot_fast: hot_on_fast(&region),
            promoted: st.pgpromote_success,
            demoted: st.pgdemote_kswapd + st.pgdemote_direct,
            faults: st.numa_hint_faults,
            hidden: st.numa_pte_updates,
            collapsed: st.collapsed_pages,
        }
    };
    let mut samples = vec![sample(Duration::ZERO, 0)];
    let bad_reads = access(&region, &mut tally, penalty, RUN, |at, n| samples.push(sample(at, n)));
    // Paused until its windows of the steady state.
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
    let secs = (last.at - from.at).as_secs_f64().max(1e-9);
    let per_s = |f: fn(&Sample) -> u64| (f(last) - f(from)) as f64 / secs;
    let result = RunResult {
        hot_slow_start,
        room_start,
        run_tail: rate(from, last),
        steady: f64::NAN,
        windows: Vec::new(),
        timeline,
        converge_ms: converged.map(|c| c.at.as_secs_f64() * 1e3),
        promoted: last.promoted,
        demoted: last.demoted,
        thrash_per_s,
        steady_faults: per_s(|s| s.faults),
        steady_hidden: per_s(|s| s.hidden),
        steady_collapsed: per_s(|s| s.collapsed),
        corrupted_bytes: 0,
        bad_reads: 0,
        invariants: Ok(0),
    };
    Ok(Live { v, z, bal, region, tally, bad_reads, result })
}

/// The steady state, measured in turns: `ROUNDS` rounds in which every variant, converged and
/// paused, runs its balancer and its threads for one `TURN` while the others wait paused
/// (the order rotated each round). A variant's steady accesses/s is its accesses over its
/// turns' time, and the machine's slow phases (another tenant, the host) fall on every
/// variant alike instead of on whichever ran its steady seconds then.
fn interleave(lives: &mut [Live], penalty: Duration) -> Result<(), String> {
    let n = lives.len();
    for round in 0..ROUNDS {
        for j in 0..n {
            let live = &mut lives[(j + round) % n];
            live.bal.set_numa_balancing(live.v.bits()).map_err(|e| e.to_string())?;
            let mut last = (Duration::ZERO, 0);
            live.bad_reads += access(&live.region, &mut live.tally, penalty, TURN, |at, k| last = (at, k));
            live.bal.set_numa_balancing(0).map_err(|e| e.to_string())?;
            live.result.windows.push(last.1 as f64 / last.0.as_secs_f64().max(1e-9));
        }
    }
    for live in lives.iter_mut() {
        let w = &live.result.windows;
        live.result.steady = w.iter().sum::<f64>() / w.len().max(1) as f64;
    }
    Ok(())
}

/// Checks every byte of the variant's region against what it must hold, then tears it down
/// and checks the allocator's invariants.
fn finish(live: Live) -> RunResult {
    let Live { z, bal, region, tally, bad_reads, mut result, .. } = live;
    let base = region.as_ptr() as usize;
    let mut corrupted_bytes = 0u64;
    for p in 0..PAGES {
        for w in 0..WORDS {
            let want = match w {
                0 => TAG ^ p as u64,
                w if w < FIRST_DATA => match p.checked_sub(HOT_FIRST) {
                    Some(h) => tally.get(w - 1).map_or(0, |t| t[h]),
                    None => 0,
                },
                w => pattern(p, w),
            };
            let got = at(base, p, w).load(Ordering::Relaxed);
            corrupted_bytes += (got ^ want).to_le_bytes().iter().filter(|&&b| b != 0).count() as u64;
        }
    }
    drop(region);
    drop(bal);
    result.corrupted_bytes = corrupted_bytes;
    result.bad_reads = bad_reads;
    result.invariants = z.check_invariants().map_err(|e| e.to_string());
    result
}

/// Runs the experiment, prints its table and targets, and returns its records.
pub fn run(opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let penalty = super::penalty_from_env("ZONAL_TIER_PENALTY_NS", Duration::from_nanos(150))?;
    let reps = opts.reps.min(MAX_REPS);
    let short = BenchOpts { reps, ..opts.clone() };
    let mut results: Vec<Vec<RunResult>> = vec![Vec::new(); VARIANTS.len()];
    let mut lives: Vec<Live> = Vec::new();
    let mut err = None;
    super::rotate(&short, "tier", VARIANTS.len(), |i| {
        if err.is_some() {
            return;
        }
        match converge(VARIANTS[i], opts, penalty) {
            Ok(live) => lives.push(live),
            Err(e) => err = Some(e),
        }
        // The repetition's last variant has converged: the steady state, in turns.
        if lives.len() == VARIANTS.len() {
            if let Err(e) = interleave(&mut lives, penalty) {
                err = Some(e);
            }
            for live in lives.drain(..) {
                let k = VARIANTS.iter().position(|&v| v == live.v).unwrap_or(0);
                results[k].push(finish(live));
            }
        }
    });
    // An interrupted repetition's variants still have their bytes checked and go.
    for live in lives.drain(..) {
        let _ = finish(live);
    }
    if let Some(e) = err {
        return Err(e);
    }
    if results.iter().any(Vec::is_empty) {
        return Ok(Vec::new());
    }
    report(&results, penalty, reps)
}

/// Variant `a`'s steady accesses/s over variant `b`'s: the median, over every round of every
/// repetition, of the ratio of their turns in that round (turns seconds apart, so a phase of
/// the machine slows both).
fn turn_ratio(results: &[Vec<RunResult>], a: usize, b: usize) -> f64 {
    let r: Vec<f64> = results[a]
        .iter()
        .zip(&results[b])
        .flat_map(|(x, y)| x.windows.iter().zip(&y.windows).map(|(p, q)| p / q.max(1e-9)))
        .collect();
    Summary::of(&r).median
}

fn report(results: &[Vec<RunResult>], penalty: Duration, reps: usize) -> Result<Vec<Record>, String> {
    let col = |i: usize, f: &dyn Fn(&RunResult) -> f64| results[i].iter().map(f).collect::<Vec<f64>>();
    let med = |i: usize, f: &dyn Fn(&RunResult) -> f64| Summary::of(&col(i, f)).median;
    let (m1, del, eag, ideal) = (0, 1, 2, 3);
    println!(
        "tier (issue 41): a fast node of {} MiB with both CPUs and a memory-only node of {} MiB (the tier below); a \
         {} MiB region first-touched cold first, its hot {}% ({HOT} pages) last, so on the slow node ({} pages there \
         at the start); {THREADS} pinned threads read + atomically add uniformly over the hot set, {} ns busy-waited \
         per slow-tier access; each variant converges in a run of {:.1} s of its own, then the steady state is \
         measured in turns: {ROUNDS} rounds of {} ms per variant, its balancer on, the others paused (\"/ ideal\" is \
         the median of the per-turn ratios to the ideal's turn of the same round); scan period \
         {PERIOD_MIN_MS}-{PERIOD_MAX_MS} ms, demotion on, fast node watermark_scale_factor {WSF}; medians of {reps} \
         repetition(s), variants rotated. TPP (ASPLOS'23): tiered within ~1% of all-local",
        FAST >> 20,
        SLOW >> 20,
        (PAGES * PAGE) >> 20,
        HOT * 100 / PAGES,
        results[del][0].hot_slow_start,
        penalty.as_nanos(),
        RUN.as_secs_f64(),
        TURN.as_millis(),
    );
    let fmt_ms = |x: f64| if x.is_nan() { "-".to_string() } else { format!("{x:.0}") };
    let rows: Vec<Vec<String>> = VARIANTS
        .iter()
        .enumerate()
        .map(|(i, v)| {
            vec![
                v.name().to_string(),
                format!("{:.1}M", med(i, &|r| r.steady) / 1e6),
                format!("{:.3}", turn_ratio(results, i, ideal)),
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
    let pr = |a: usize, b: usize| turn_ratio(results, a, b);
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
                "turn_ms": TURN.as_millis() as u64,
                "turns_accesses_per_s": results[i].iter().map(|r| r.windows.clone()).collect::<Vec<_>>(),
                "convergence_run_last_accesses_per_s": results[i].iter().map(|r| r.run_tail).collect::<Vec<_>>(),
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
            ratio_to_reference: 1.0 / turn_ratio(results, i, ideal),
            reps: results[i].len(),
            samples: col(i, &ns),
        })
        .collect())
}
