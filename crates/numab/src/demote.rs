//! Demotion (Linux's `demote_folio_list` in kswapd's reclaim, with
//! `/sys/kernel/mm/numa/demotion_enabled`): a top-tier node below its promo watermark moves
//! its coldest region pages to its demotion target, the nearest node of the next tier down,
//! so that hot pages of lower tiers have room to be promoted.
//!
//! *Coldest*: hidden by the scanner and still hinted, so untouched since, for at least two
//! scan sequences of their region ([`crate::table::PageEntry::cold`]), the most sequences
//! first. Under tiering alone the scanner hides a top-tier node's pages only while the node
//! is below its promo watermark (`scan`), which is the aging that finds them.
//!
//! *How much*: until the node's free pages are a watermark step (`promo - high`) above
//! promo, so that a trickle of promotions does not wake a demotion for each page; a node a
//! promotion found without room (`TierNode::short`) is demoted from too.
//!
//! *How*: runs of consecutive pages of a region are claimed (`HINT -> BUSY`, each checked
//! again after its claim: still on the node, not pinned), copied into consecutive frames of
//! the target (blocks up to order 9) and mapped with one `mmap` per block, so a run stays one
//! mapping; the old frames go back to zonal. The pages are then `PRESENT` on the lower tier,
//! where the scanner hides them in turn: one touched again soon after is promoted back.
//!
//! Locking: one pass at a time (`Shared::demoting`); a region's `scan_lock` while its pages
//! move, so it is not torn down meanwhile. Runs in a thread (the balancer's or the caller
//! of `Balancer::demote_now`), never in a signal handler.

use crate::dest::CHUNK_PAGES;
use crate::os::PAGE;
use crate::table::{HINT, PRESENT};
use crate::{RegionShared, Shared};
use std::sync::atomic::Ordering;
use zonal::zone::Watermark;

impl Shared {
    /// One pass over the top-tier nodes: each with a demotion target that is below its
    /// promo watermark, or that a promotion found without room, demotes its coldest pages.
    /// `direct`: at most that many pages, from the caller's thread (`pgdemote_direct`);
    /// `None`: the balancer's thread (`pgdemote_kswapd`). Returns the pages demoted.
    pub(crate) fn demote_pass(&self, direct: Option<usize>) -> usize {
        let _one = self.demoting.lock().unwrap_or_else(|p| p.into_inner());
        let mut total = 0;
        for n in 0..self.tier_nodes.len() as u16 {
            let Some(to) = self.tiers.demote_to(n).filter(|_| self.tiers.is_top(n)) else { continue };
            let (free, promo, high) =
                (self.free_pages(n), self.mark(n, Watermark::Promo), self.mark(n, Watermark::High));
            let short = self.tier_nodes[n as usize].short.swap(false, Ordering::Relaxed);
            if free >= promo && !short {
                continue;
            }
            let step = promo.saturating_sub(high).max(1);
            let mut want = (promo + step).saturating_sub(free).max(short as usize);
            if let Some(max) = direct {
                want = want.min(max - total);
            }
            if want == 0 {
                continue;
            }
            let done = self.demote_node(n, to, want);
            let node = &self.tier_nodes[n as usize];
            match direct {
                Some(_) => node.pgdemote_direct.fetch_add(done as u64, Ordering::Relaxed),
                None => node.pgdemote_kswapd.fetch_add(done as u64, Ordering::Relaxed),
            };
            total += done;
            if direct.is_some_and(|max| total >= max) {
                break;
            }
        }
        if total > 0 {
            self.kick();
        }
        total
    }

    /// Demotes up to `want` of node `n`'s coldest region pages to node `to`; returns how many.
    fn demote_node(&self, n: u16, to: u16, want: usize) -> usize {
        let regions = self.live_regions();
        // (passes since hidden, region, page) of every cold page on the node.
        let mut cand: Vec<(u32, usize, usize)> = Vec::new();
        for (ri, r) in regions.iter().enumerate() {
            let seq = r.scan_seq.load(Ordering::Relaxed) as u32;
            for (i, e) in r.entries.iter().enumerate() {
                if e.state.load(Ordering::Relaxed) != HINT || !e.cold(seq) || e.pinned() {
                    continue;
                }
                let f = e.frame.load(Ordering::Relaxed);
                if f != 0 && self.z.page_to_nid(f as *const u8).is_ok_and(|x| x.0 == n) {
                    cand.push((seq.wrapping_sub(e.hidden_seq.load(Ordering::Relaxed)), ri, i));
                }
            }
        }
        // The coldest first; then in address order, for runs.
        cand.sort_unstable_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        cand.truncate(want);
        cand.sort_unstable_by_key(|c| (c.1, c.2));
        let mut done = 0;
        let mut k = 0;
        while k < cand.len() {
            let (ri, a) = (cand[k].1, cand[k].2);
            let mut b = a + 1;
            k += 1;
            while k < cand.len() && cand[k].1 == ri && cand[k].2 == b && b - a < CHUNK_PAGES {
                b += 1;
                k += 1;
            }
            match regions[ri].demote_run(a, b, n, to) {
                Some(d) => done += d,
                // The target has no frame left: the next pass tries again.
                None => break,
            }
        }
        done
    }
}

impl RegionShared {
    /// Demotes the pages `a..b` that are still hinted on node `from` to node `to`; the
    /// pages demoted, `None` when `to` had no frame.
    fn demote_run(&self, a: usize, b: usize, from: u16, to: u16) -> Option<usize> {
        let dead = self.scan_lock.lock().unwrap_or_else(|p| p.into_inner());
        if *dead {
            return Some(0);
        }
        let z = &self.bal.z;
        // Claimed, then checked again (a pin is read after the claim: see `table`).
        let claim = |j: usize| {
            let e = &self.entries[j];
            if !e.claim(HINT) {
                return false;
            }
            let f = e.frame.load(Ordering::Relaxed);
            let ok = !e.pinned() && z.page_to_nid(f as *const u8).is_ok_and(|x| x.0 == from);
            if !ok {
                e.release(HINT);
            }
            ok
        };
        let mut moved = 0;
        let mut j = a;
        while j < b {
            let s = j;
            while j < b && claim(j) {
                j += 1;
            }
            if s == j {
                j += 1;
                continue;
            }
            match self.demote_claimed(s, j, to) {
                Some(d) => moved += d,
                None => return if moved > 0 { Some(moved) } else { None },
            }
        }
        drop(dead);
        Some(moved)
    }

    /// Moves the claimed pages `s..e` to node `to`, a block of consecutive frames and one
    /// `mmap` at a time; pages it cannot move are released as they were. `None` when the
    /// node had no frame for the first block.
    fn demote_claimed(&self, s: usize, e: usize, to: u16) -> Option<usize> {
        let mut i = s;
        let mut moved = 0;
        while i < e {
            let left = e - i;
            let mut order = (usize::BITS - 1 - left.leading_zeros()).min(9);
            let block = loop {
                match self.bal.alloc_held(to, order) {
                    Some(b) => break Some(b as usize),
                    None if order > 0 => order -= 1,
                    None => break None,
                }
            };
            let Some(block) = block else {
                (i..e).for_each(|j| self.entries[j].release(HINT));
                return (moved > 0).then_some(moved);
            };
            let n = 1usize << order;
            for k in 0..n {
                let old = self.entries[i + k].frame.load(Ordering::Relaxed);
                // SAFETY: both frames are allocated and mapped read-write in the arena; the
                // pages are hidden and claimed, so nobody writes the old frames meanwhile.
                unsafe { std::ptr::copy_nonoverlapping(old as *const u8, (block + k * PAGE) as *mut u8, PAGE) };
            }
            // SAFETY: the pages are this region's and claimed; the frames are ours.
            if unsafe { self.map_pages(self.start + i * PAGE, block, n) }.is_err() {
                self.bal.stats.map_fail.fetch_add(1, Ordering::Relaxed);
                // The failed MAP_FIXED may have taken the old mappings: each old frame again.
                self.remap_old(i, n);
                (0..n).for_each(|k| self.bal.free_frame(block + k * PAGE));
                (i + n..e).for_each(|j| self.entries[j].release(HINT));
                return Some(moved);
            }
            for k in 0..n {
                let p = &self.entries[i + k];
                let old = p.frame.swap(block + k * PAGE, Ordering::Relaxed);
                self.bal.free_frame(old);
                p.release(PRESENT);
            }
            moved += n;
            i += n;
        }
        Some(moved)
    }
}
