//! The workload: pmbench's pattern (a normal distribution over the region's pages, a read
//! and an atomic add per access), the pattern every page carries and the expected content
//! it is checked against, sampled latencies and per-window local shares.

use super::*;

/// The log2 bucket of a latency in ns: 0 for 0 ns, else b with 2^(b-1) <= ns < 2^b.
pub(super) fn bucket(ns: u64) -> usize {
    ((64 - ns.leading_zeros()) as usize).min(BUCKETS - 1)
}

/// The label of bucket `b`: its upper bound.
pub(super) fn bucket_label(b: usize) -> String {
    let ns = 1u64 << b;
    if ns >= 1_000_000 {
        format!("<{}ms", ns / 1_000_000)
    } else if ns >= 1000 {
        format!("<{}us", ns / 1000)
    } else {
        format!("<{ns}ns")
    }
}

/// pmbench's "normal" pattern: page indices in `NORMAL_TABLE` slots, slot i holding the page
/// where the cumulative weight of a normal distribution centred on the region's middle with
/// σ = pages / 6 (cut at ±3σ) first reaches (i + ½) / slots. Pages far in the tails, whose
/// weight is under a slot's, get a slot only now and then: 742 of the 8192 get none and are
/// never accessed (so never migrate either, in any variant).
pub(super) fn normal_table(pages: usize) -> Vec<u32> {
    let mu = (pages as f64 - 1.0) / 2.0;
    let sigma = pages as f64 / 6.0;
    let w: Vec<f64> = (0..pages).map(|p| (-((p as f64 - mu) / sigma).powi(2) / 2.0).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut table = Vec::with_capacity(NORMAL_TABLE);
    let (mut page, mut cum) = (0usize, w[0] / total);
    for i in 0..NORMAL_TABLE {
        let want = (i as f64 + 0.5) / NORMAL_TABLE as f64;
        while cum < want && page + 1 < pages {
            page += 1;
            cum += w[page] / total;
        }
        table.push(page as u32);
    }
    table
}

/// The fixed content of word `w` of page `p`.
#[inline]
pub(super) fn pattern(p: usize, w: usize) -> u64 {
    // splitmix64's finalizer: every word of every page differs.
    let mut x = ((p as u64) << 9 | w as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What page `p`'s word `w` must hold, given the increments each thread made to it.
pub(super) fn expected(p: usize, w: usize, tallies: &[Vec<u64>]) -> u64 {
    match w {
        0 => TAG ^ p as u64,
        w if w < FIRST_DATA => tallies[w - 1][p],
        w => pattern(p, w),
    }
}

#[inline]
pub(super) fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A counter on its own cache line.
#[repr(align(128))]
#[derive(Default)]
pub(super) struct Padded(pub(super) AtomicU64);

/// What the main thread and the workers share.
pub(super) struct Ctl {
    pub(super) stop: AtomicBool,
    /// 0 before, 1 during, 2 after.
    pub(super) phase: AtomicUsize,
    /// Accesses each worker has made so far.
    pub(super) done: [Padded; THREADS],
}

/// What a worker brings back.
pub(super) struct WorkerOut {
    /// Increments it made to each page's counter.
    pub(super) tally: Vec<u64>,
    /// Sampled access latencies per phase.
    pub(super) hist: [[u64; BUCKETS]; 3],
    /// Pattern words read with the wrong value.
    pub(super) bad_reads: u64,
}

/// The pmbench-like loop of worker `t`: a normally distributed page, one read of a pattern
/// word (checked) and one atomic increment of the thread's counter word per access.
pub(super) fn worker(
    t: usize,
    base: usize,
    region: &Region,
    table: &[u32],
    ctl: &Ctl,
    penalty: Duration,
    here: NodeId,
) -> WorkerOut {
    let mut out = WorkerOut { tally: vec![0; PAGES], hist: [[0; BUCKETS]; 3], bad_reads: 0 };
    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ ((t as u64 + 1) << 32);
    let mut n = 0u64;
    while !ctl.stop.load(Ordering::Relaxed) {
        let phase = ctl.phase.load(Ordering::Relaxed).min(2);
        // Small batches, so that a stop or a phase change is seen within 64 accesses even
        // with the largest remote penalty.
        for _ in 0..64 {
            let r = xorshift(&mut rng);
            let p = table[(r >> 48) as usize] as usize;
            let w = FIRST_DATA + (r as usize % (WORDS - FIRST_DATA));
            let page = base + p * PAGE;
            let t0 = (n % SAMPLE_EVERY == 0).then(Instant::now);
            if !penalty.is_zero() {
                let nid = region.page_to_nid(page as *const u8).ok().flatten();
                if nid.is_some_and(|nid| nid != here) {
                    let s = Instant::now();
                    while s.elapsed() < penalty {
                        std::hint::spin_loop();
                    }
                }
            }
            // SAFETY: `page` is a page of the region (p < PAGES), which lives until every
            // worker has returned; words are 8-byte aligned in a page-aligned page. An
            // inaccessible page faults and the balancer's handler maps it (or a new frame)
            // before the access runs again. Words are only accessed through atomics while
            // the workers run, so the two threads never race on plain memory.
            let (seen, counter) = unsafe {
                let seen = (*((page + w * 8) as *const AtomicU64)).load(Ordering::Relaxed);
                (seen, &*((page + (1 + t) * 8) as *const AtomicU64))
            };
            out.bad_reads += (seen != pattern(p, w)) as u64;
            counter.fetch_add(1, Ordering::Relaxed);
            out.tally[p] += 1;
            if let Some(t0) = t0 {
                out.hist[phase][bucket(t0.elapsed().as_nanos() as u64)] += 1;
            }
            n += 1;
        }
        ctl.done[t].0.store(n, Ordering::Relaxed);
    }
    out
}

/// One reading of the run's state, at the end of a window.
pub(super) struct Sample {
    pub(super) at: Duration,
    pub(super) accesses: u64,
    pub(super) stats: Stats,
    pub(super) flushes: Flushes,
    /// Of those since the start, the ones while scan passes ran.
    pub(super) scan_flushes: Flushes,
    pub(super) vmas: usize,
}

/// The figures of one run.
#[derive(Clone, Debug)]
pub(super) struct RunResult {
    /// Region pages per node after the first touch.
    pub(super) placed: Vec<usize>,
    /// ... and at the end.
    pub(super) placed_end: Vec<usize>,
    pub(super) migrated: u64,
    /// Of which during the migration phase.
    pub(super) migrated_during: u64,
    pub(super) pgmigrate_fail: u64,
    /// Flushes during the migration phase outside scan passes ...
    pub(super) flushes_during: Flushes,
    /// ... and inside them.
    pub(super) scan_flushes_during: Flushes,
    /// Accesses/s before, during, after.
    pub(super) rate: [f64; 3],
    /// Accesses/s over the whole run, the three phases together.
    pub(super) rate_run: f64,
    /// The control: flushes outside scan passes before the eater's free, when no page can
    /// migrate (the machine's other flushes and the balancer's thread's), and the lengths of
    /// that phase and of the migration phase, s.
    pub(super) control: Flushes,
    pub(super) before_s: f64,
    pub(super) during_s: f64,
    /// Time from the eater's free until 95% of the run's migrations were done.
    pub(super) converge_ms: f64,
    /// ns per successful migration.
    pub(super) cost_ns: f64,
    /// Mean time of a scan pass, ms.
    pub(super) pass_ms: f64,
    /// Local share of hint faults per window from the eater's free (None: no fault in it).
    pub(super) share_windows: Vec<Option<f64>>,
    pub(super) share_after: Option<f64>,
    pub(super) share_final_window: Option<f64>,
    pub(super) peak_vmas: usize,
    pub(super) collapse: Collapse,
    /// Every window of the run, for `--plot`'s figures over time.
    pub(super) timeline: Vec<Window>,
    /// When the eater was freed, s from the start.
    pub(super) eater_freed_s: f64,
    pub(super) hist: [[u64; BUCKETS]; 3],
    pub(super) corrupted_bytes: u64,
    pub(super) bad_reads: u64,
    pub(super) invariants: Result<usize, String>,
}

/// One window of a run: when it ended (s from the start), accesses/s in it, and in it the TLB
/// shootdowns received and remote flushes requested (machine-wide, scan passes included;
/// `None` where they cannot be read) and the pages migrated.
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    pub(super) end_s: f64,
    pub(super) accesses_per_s: f64,
    pub(super) received: Option<u64>,
    pub(super) requested: Option<u64>,
    pub(super) migrated: u64,
}

/// The windows between consecutive samples.
pub(super) fn windows(samples: &[Sample]) -> Vec<Window> {
    samples
        .windows(2)
        .map(|w| {
            let (x, y) = (&w[0], &w[1]);
            let f = y.flushes.since(x.flushes);
            Window {
                end_s: y.at.as_secs_f64(),
                accesses_per_s: (y.accesses - x.accesses) as f64 / (y.at - x.at).as_secs_f64().max(1e-9),
                received: f.received,
                requested: f.requested,
                migrated: y.stats.numa_pages_migrated - x.stats.numa_pages_migrated,
            }
        })
        .collect()
}
