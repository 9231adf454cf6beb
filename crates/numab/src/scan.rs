//! The scanner (`task_numa_work`, `change_prot_numa`) and its period
//! (`update_task_scan_period`), run by the balancer's thread.
//!
//! A pass marks at most `scan_size` of mapped pages inaccessible, looking at most at eight
//! times that of address space, resuming where the last pass stopped; pages are marked in
//! runs (one `mprotect` per run). A page is claimed (`PRESENT -> BUSY`, a CAS) before its
//! run is protected and set `HINT` only after, so `HINT` always means inaccessible: a thread
//! whose fault is stale (it faulted in an earlier cycle and another thread has mapped the
//! page since) waits while the page is `BUSY` and never takes an accessible page for a hint
//! fault, which would let writes land on the old frame during a copy (Linux checks
//! `pte_same` under the PTE lock for the same reason). The end of a region's pages ends its
//! scan sequence (`numa_scan_seq`).
//!
//! Memory tiering alone (`numa_balancing=2`): a pass hides only pages on lower tiers (a
//! top-tier page is no promotion candidate), and the pages of a top-tier node below its
//! promo watermark with demotion on, so that the pages nobody touches show up for the
//! demotion (`demote`): hidden and still hinted passes later, as kswapd's aging finds the
//! pages whose referenced bits stay clear. Every page hidden is stamped with the tiering
//! clock, from which a hint fault measures its latency.

use crate::fault::Hide;
use crate::os::PAGE;
use crate::state::Cursor;
use crate::table::{Cpupid, HINT, PRESENT};
use crate::{RegionShared, Shared};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use zonal::zone::Watermark;

/// `NUMA_PERIOD_SLOTS` and `NUMA_PERIOD_THRESHOLD`: the period aims at 7 local faults of 10.
const PERIOD_SLOTS: u64 = 10;
const PERIOD_THRESHOLD: u64 = 7;

/// Most pages one `mprotect`/`MADV_DONTNEED` of the scanner covers: a window (2 MiB), the
/// unit of destination blocks (`dest`), so a window whose pages migrated one by one is one
/// call over one mapping.
const RUN_PAGES: usize = crate::dest::WINDOW;

/// One pass over the regions, from the cursor. Returns the pages marked.
pub fn scan_pass(bal: &Shared, regions: &[Arc<RegionShared>], cur: &mut Cursor) -> usize {
    if regions.is_empty() {
        return 0;
    }
    let budget = (bal.cfg.scan_size_mb.load(Ordering::Relaxed) as usize) << (20 - 12);
    let mut virt = budget.saturating_mul(8);
    let scope = Scope::new(bal);
    let mut marked = 0;
    if cur.region >= regions.len() {
        *cur = Cursor::default();
    }
    // Up to the end of the last region, as Linux's pass ends at the end of the address
    // space; the next pass starts over from the first.
    while marked < budget && virt > 0 {
        let r = &regions[cur.region];
        let dead = r.scan_lock.lock().unwrap_or_else(|p| p.into_inner());
        let (m, end) =
            if *dead { (0, r.entries.len()) } else { mark_from(bal, r, &scope, cur.page, budget - marked, &mut virt) };
        drop(dead);
        marked += m;
        cur.page = end;
        if end >= r.entries.len() {
            r.scan_seq.fetch_add(1, Ordering::Relaxed);
            r.group.decay();
            cur.page = 0;
            cur.region += 1;
            if cur.region == regions.len() {
                cur.region = 0;
                break;
            }
        }
    }
    marked
}

/// What a pass hides: per node, whether its present pages are hidden; and the tiering
/// clock to stamp them with.
struct Scope {
    hide: Vec<bool>,
    now_ms: u32,
}

impl Scope {
    fn new(bal: &Shared) -> Scope {
        let nodes = bal.tier_nodes.len();
        let aging = |n: u16| {
            bal.cfg.demotion_enabled.load(Ordering::Relaxed)
                && bal.tiers.demote_to(n).is_some()
                && bal.free_pages(n) < bal.mark(n, Watermark::Promo)
        };
        // Only tiering alone leaves pages accessible (a pass driven with balancing off,
        // `scan_now`, hides as normal balancing would).
        let all = bal.enabled() || !bal.tiering();
        let hide = (0..nodes as u16).map(|n| all || !bal.tiers.is_top(n) || aging(n)).collect();
        Scope { hide, now_ms: bal.clock.now_ms() as u32 }
    }

    /// Whether the pass hides page `e` (present), by its frame's node.
    fn hides(&self, bal: &Shared, e: &crate::table::PageEntry) -> bool {
        let f = e.frame.load(Ordering::Relaxed);
        bal.z.page_to_nid(f as *const u8).map_or(true, |n| self.hide.get(n.0 as usize).copied().unwrap_or(true))
    }
}

/// Marks up to `want` present pages of `r` from page `from`, spending `virt`; returns the
/// pages marked and where it stopped.
fn mark_from(
    bal: &Shared,
    r: &RegionShared,
    scope: &Scope,
    from: usize,
    want: usize,
    virt: &mut usize,
) -> (usize, usize) {
    let mut marked = 0;
    let mut i = from;
    let mut run = Run::new(r.scan_seq.load(Ordering::Relaxed) as u32, scope.now_ms);
    while i < r.entries.len() && marked < want && *virt > 0 {
        // A window that pages are migrating into, split into many mappings, waits for the
        // next pass (`RegionShared::scan_skips`).
        if i % RUN_PAGES == 0 && r.scan_skips(i / RUN_PAGES) {
            bal.stats.scan_skips.fetch_add(1, Ordering::Relaxed);
            *virt = virt.saturating_sub(RUN_PAGES);
            i += RUN_PAGES;
            continue;
        }
        *virt -= 1;
        let e = &r.entries[i];
        match e.state.load(Ordering::Relaxed) {
            // A page the pass leaves accessible (a top-tier page under tiering alone) ends
            // the call.
            PRESENT if !scope.hides(bal, e) => marked -= run.hide(bal, r),
            // A pinned page is put back at once (the pin is read after the claim: see
            // `table`), and ends the call: it must stay mapped.
            PRESENT if e.claim(PRESENT) => {
                if e.pinned() {
                    e.release(PRESENT);
                    marked -= run.hide(bal, r);
                } else {
                    let f = e.frame.load(Ordering::Relaxed);
                    // Where its last hint fault would have it, and in its slot if its window
                    // has a block on its node: set to move nowhere.
                    let last = Cpupid(e.last.load(Ordering::Relaxed));
                    let on = bal.z.page_to_nid(f as *const u8).ok().map(|n| n.0);
                    let settled =
                        !last.is_unset() && r.target(i, last.nid()).is_none_or(|t| Some(t) == on) && !r.off_slot(i, f);
                    run.present(i, f, settled);
                    marked += 1;
                }
            }
            // Hidden already: covered by the call only between pages to hide, where it
            // saves splitting the call (and a shootdown per call it would split into).
            HINT if run.is_open() => {
                if e.claim(HINT) {
                    run.hinted(i);
                } else {
                    marked -= run.hide(bal, r);
                }
            }
            HINT => {}
            _ => marked -= run.hide(bal, r),
        }
        i += 1;
        // A call per window at most: `mprotect` and `MADV_DONTNEED` hold the mmap lock for
        // the whole range, and a migration's `mmap` waiting for it behind a long one stalls
        // every fault queued after it (the lock is fair), as Linux's scanner works a huge
        // page-aligned chunk at a time.
        if i % RUN_PAGES == 0 {
            marked -= run.hide(bal, r);
        }
    }
    marked -= run.hide(bal, r);
    (marked, i)
}

/// The pages of one window the scanner has claimed for its next call: those to hide
/// (claimed from `PRESENT`) and, between them, those hidden already (claimed from `HINT`),
/// so that the call covers the window's mapping once instead of once per run of pages to
/// hide (a zap costs a shootdown per call and mapping it empties an entry in).
struct Run {
    /// The first page claimed, `None` when nothing is.
    start: Option<usize>,
    /// One past the last page to hide, and one past the last page claimed.
    end: usize,
    claimed_end: usize,
    /// Pages to hide, by bit from `start` (within one window).
    to_hide: [u64; RUN_PAGES / 64],
    count: usize,
    /// Runs of pages to hide on consecutive frames, each a mapping of its own under
    /// mprotect (a hint fault's `mprotect` splits the window), and the last such page.
    mappings: usize,
    last: (usize, usize),
    /// Every page to hide is where its last hint fault came from (none set to move).
    settled: bool,
    /// The region's scan sequence and the tiering clock, stamped on each page hidden.
    seq: u32,
    now_ms: u32,
}

impl Run {
    fn new(seq: u32, now_ms: u32) -> Run {
        Run {
            start: None,
            end: 0,
            claimed_end: 0,
            to_hide: [0; RUN_PAGES / 64],
            count: 0,
            mappings: 0,
            last: (0, 0),
            settled: true,
            seq,
            now_ms,
        }
    }

    fn is_open(&self) -> bool {
        self.start.is_some()
    }

    /// Page `i` (claimed from `PRESENT`, on `frame`, `settled` where its last hint fault
    /// would have it) is to be hidden.
    fn present(&mut self, i: usize, frame: usize, settled: bool) {
        self.settled &= settled;
        let s = *self.start.get_or_insert(i);
        self.to_hide[(i - s) / 64] |= 1 << ((i - s) % 64);
        self.count += 1;
        if self.count == 1 || self.last != (i - 1, frame.wrapping_sub(PAGE)) {
            self.mappings += 1;
        }
        self.last = (i, frame);
        self.end = i + 1;
        self.claimed_end = i + 1;
    }

    /// Page `i` (claimed from `HINT`) is covered.
    fn hinted(&mut self, i: usize) {
        self.claimed_end = i + 1;
    }

    /// Hides the pages claimed (one call, from the first to the last page to hide), marks
    /// them `HINT` and releases the hidden ones claimed along; on failure (out of VMAs) puts
    /// everything back as it was. Returns how many pages to hide were not hidden after all.
    fn hide(&mut self, bal: &Shared, r: &RegionShared) -> usize {
        let Some(s) = self.start.take() else { return 0 };
        let (e, count) = (self.end, self.count);
        let is_new = |i: usize| self.to_hide[(i - s) / 64] & (1 << ((i - s) % 64)) != 0;
        // Hidden pages claimed past the last page to hide need no call.
        for p in &r.entries[e..self.claimed_end] {
            p.release(HINT);
        }
        let mut failed = 0;
        if count > 0 {
            // Counted before the pages can fault, so a hint fault never runs ahead of its
            // count (`numa_pte_updates >= numa_hint_faults` at every instant).
            bal.stats.pte_updates.fetch_add(count as u64, Ordering::Relaxed);
            bal.stats.scan_calls.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the pages are mapped pages of this region, claimed (BUSY) by this
            // thread: no handler or other path changes them until they are released below.
            // Under mprotect (see `Hide`): pages none of which is set to move keep their
            // entries, one shootdown; else they are zapped, so that a migration maps over
            // an empty entry, protecting first (a shootdown, the mappings merged, then one
            // more for the zap) past two mappings, each a shootdown to zap.
            let how = match (self.settled, self.mappings > 2) {
                (true, _) => Hide::ProtectOnly,
                (false, true) => Hide::ProtectFirst,
                (false, false) => Hide::ZapFirst,
            };
            let res = unsafe { r.hide_new(r.start + s * PAGE, (e - s) * PAGE, how) };
            for (i, p) in r.entries[s..e].iter().enumerate().map(|(k, p)| (s + k, p)) {
                match (res.is_ok(), is_new(i)) {
                    (true, true) => {
                        p.hidden_seq.store(self.seq, Ordering::Relaxed);
                        p.hidden_ms.store(self.now_ms, Ordering::Relaxed);
                        p.kept.store(how == Hide::ProtectOnly && r.bal.uffd.is_none(), Ordering::Relaxed);
                        p.release(HINT);
                    }
                    (false, true) => p.release(PRESENT),
                    (ok, false) => {
                        // Hidden before; zapped now, if the call zapped.
                        if ok && how != Hide::ProtectOnly {
                            p.kept.store(false, Ordering::Relaxed);
                        }
                        p.release(HINT)
                    }
                }
            }
            if res.is_err() {
                bal.stats.pte_updates.fetch_sub(count as u64, Ordering::Relaxed);
                bal.stats.scan_fail.fetch_add(1, Ordering::Relaxed);
                failed = count;
            }
        }
        *self = Run::new(self.seq, self.now_ms);
        failed
    }
}

/// `update_task_scan_period`: after a scan window with `local` and `remote` hint faults and
/// `failed` migrations, the next period in ms: twice as long when nothing faulted or a
/// migration failed; longer by a slot per point of local faults above 7 in 10, shorter by a
/// slot per point below; clamped to `[min, max]`.
pub fn next_period(period: u64, local: u64, remote: u64, failed: u64, min: u64, max: u64) -> u64 {
    let p = if local + remote == 0 || failed > 0 {
        period.saturating_mul(2)
    } else {
        let slot = period.div_ceil(PERIOD_SLOTS);
        let ratio = local * PERIOD_SLOTS / (local + remote);
        if ratio >= PERIOD_THRESHOLD {
            period + slot * (ratio - PERIOD_THRESHOLD).max(1)
        } else {
            period.saturating_sub(slot * (PERIOD_THRESHOLD - ratio))
        }
    };
    p.clamp(min, max.max(min))
}

/// The most of the time between passes a pass may take, in percent.
pub const SCAN_OVERHEAD_PCT: u64 = 3;

/// The period after a pass that took `cost`: at least `cost / 3%`, so scanning takes at most
/// `SCAN_OVERHEAD_PCT` of the time (capped at `max` ms unless the pass alone is longer).
pub fn capped_period(period: u64, cost: std::time::Duration, max: u64) -> u64 {
    let floor = (cost.as_micros() as u64 * 100 / SCAN_OVERHEAD_PCT).div_ceil(1000);
    period.max(floor.min(max.max(period)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_takes_at_most_three_percent() {
        use std::time::Duration;
        // 3 ms of scanning: the next pass no sooner than 100 ms later.
        assert_eq!(capped_period(10, Duration::from_millis(3), 60_000), 100);
        // Cheap passes leave the period alone.
        assert_eq!(capped_period(1000, Duration::from_micros(50), 60_000), 1000);
        // The cap does not go past the slowest period.
        assert_eq!(capped_period(10, Duration::from_secs(10), 60_000), 60_000);
    }

    #[test]
    fn the_period_follows_the_local_share() {
        // No faults, or a failed migration: twice as long, up to the max.
        assert_eq!(next_period(1000, 0, 0, 0, 1000, 60_000), 2000);
        assert_eq!(next_period(40_000, 5, 5, 1, 1000, 60_000), 60_000);
        // All local: 3 slots of 10 above the threshold.
        assert_eq!(next_period(1000, 10, 0, 0, 1000, 60_000), 1300);
        // Exactly 7 in 10: one slot longer (Linux's `if (!slot) slot = 1`).
        assert_eq!(next_period(1000, 7, 3, 0, 1000, 60_000), 1100);
        // Mostly remote: shorter, down to the min.
        assert_eq!(next_period(5000, 2, 8, 0, 1000, 60_000), 2500);
        assert_eq!(next_period(1000, 0, 10, 0, 1000, 60_000), 1000);
    }
}
