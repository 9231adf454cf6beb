//! Destination blocks at work on a region's windows (see `dest`): the slot a migrating page
//! takes, the windows a scan pass leaves alone while pages move in, the collapses left to
//! local faults, and the blocks retired.

use crate::dest::{IDLE_VISITS, SKIP_MAPPINGS, WINDOW};
use crate::os::{self, PAGE};
use crate::table::{BUSY, HINT, PRESENT, UNMAPPED};
use crate::RegionShared;
use std::sync::atomic::Ordering;

impl RegionShared {
    /// The frame of page `idx` (claimed, migrating alone to node `dst`) in its window's
    /// destination block, its slot taken; `None` when window migration is off, the window has
    /// a block on another node, the slot went already, or no block can be had (no room, an
    /// empty reserve after one refill). Async-signal-safe.
    pub(crate) fn slot_frame(&self, idx: usize, dst: u16) -> Option<usize> {
        if !self.bal.aligned_migration {
            return None;
        }
        let (d, k) = (self.dest.get(idx / WINDOW)?, idx % WINDOW);
        let mut waited = false;
        loop {
            let b = d.block.load(Ordering::Acquire);
            if b != 0 {
                let here = self.bal.z.page_to_nid(b as *const u8).is_ok_and(|n| n.0 == dst);
                return (here && d.take_slot(k)).then_some(b + k * PAGE);
            }
            if !self.bal.has_room_for(dst, WINDOW) {
                return None;
            }
            match self.bal.chunks[dst as usize].take() {
                Some(nb) => {
                    // The reserve refills behind it.
                    self.bal.kick();
                    if d.block.compare_exchange(0, nb, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                        self.bal.stats.window_blocks.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.bal.give_back_chunk(dst, nb);
                    }
                }
                // One wait for the balancer's thread (its refill of blocks, ~a block's
                // allocation away): the window's first migration to a node decides where
                // all the others of the window go.
                None if !waited && self.bal.chunks[dst as usize].capacity() > 0 => {
                    waited = true;
                    let seen = self.bal.chunk_refills.load(Ordering::Acquire);
                    self.bal.chunk_misses[dst as usize].fetch_add(1, Ordering::AcqRel);
                    self.bal.kick();
                    os::futex_wait(&self.bal.chunk_refills, seen, std::time::Duration::from_millis(10));
                }
                None => return None,
            }
        }
    }

    /// Whether a scan pass leaves window `w` alone this time: pages migrated into it since
    /// the scanner's last visit, and it is more than `SKIP_MAPPINGS` runs of consecutive
    /// frames (mappings). Mid-wave, a window is a mapping per run of pages moved and not
    /// yet moved; hiding it would cost a shootdown for each, while its pages are on their
    /// way to where they are used (those still to move are hidden already, or moved on
    /// their own faults). A later pass finds it merged (its moved pages in their slots, one
    /// mapping) and hides it with one call. It waits only while pages keep moving into it:
    /// a pass after a period without a migration into the window hides it whatever its
    /// mappings.
    pub(crate) fn scan_skips(&self, w: usize) -> bool {
        let Some(d) = self.dest.get(w) else { return false };
        if !d.recent.swap(false, Ordering::Relaxed) {
            return false;
        }
        self.frame_runs(w) > SKIP_MAPPINGS
    }

    /// Whether the collapse leaves window `w` (its pages, or some, on node `nid` in several
    /// mappings) to its destination block: while balancing runs with window migration, the
    /// window gets a block on `nid` (one from the node's reserve; none there yet, it asks the
    /// next refill for one and waits for the next visit), and the scanner hides its pages
    /// each pass, so each page moves into its slot on its next local hint fault (as a delayed
    /// migration, over an empty entry: no shootdown), where a collapse hides the window at a
    /// shootdown per mapping. Not when the window's block is on another node, nor after two
    /// visits in a row in which no page moved in (its pages are not faulting: a collapse
    /// copies them).
    pub(crate) fn defer_collapse(&self, w: usize, nid: u16) -> bool {
        let Some(d) = self.dest.get(w) else { return false };
        if !self.bal.aligned_migration || !self.bal.enabled() {
            return false;
        }
        let b = d.block.load(Ordering::Acquire);
        if b == 0 {
            if !self.bal.has_room_for(nid, WINDOW) {
                return false;
            }
            let Some(nb) = self.bal.chunks[nid as usize].take() else {
                self.bal.chunk_misses[nid as usize].fetch_add(1, Ordering::AcqRel);
                self.bal.kick();
                return d.stalls.fetch_add(1, Ordering::Relaxed) < 2;
            };
            if d.block.compare_exchange(0, nb, Ordering::AcqRel, Ordering::Acquire).is_err() {
                self.bal.give_back_chunk(nid, nb);
                return true;
            }
            self.bal.stats.window_blocks.fetch_add(1, Ordering::Relaxed);
            d.stalls.store(0, Ordering::Relaxed);
            d.progress.store(false, Ordering::Relaxed);
            return true;
        }
        if !self.bal.z.page_to_nid(b as *const u8).is_ok_and(|n| n.0 == nid) {
            return false;
        }
        if d.progress.swap(false, Ordering::Relaxed) {
            d.stalls.store(0, Ordering::Relaxed);
            return true;
        }
        d.stalls.fetch_add(1, Ordering::Relaxed) < 2
    }

    /// Whether page `idx`, on frame `frame`, sits off its slot in its window's destination
    /// block while the block is on the page's node: a page its next local hint fault moves
    /// into the slot (so its entry must be emptied when it is hidden, see `scan`).
    pub(crate) fn off_slot(&self, idx: usize, frame: usize) -> bool {
        let Some(d) = self.dest.get(idx / WINDOW) else { return false };
        let b = d.block.load(Ordering::Relaxed);
        let z = &self.bal.z;
        b != 0
            && frame != b + (idx % WINDOW) * PAGE
            && z.page_to_nid(b as *const u8).ok() == z.page_to_nid(frame as *const u8).ok()
    }

    /// Runs of consecutive frames in window `w` (a page without a frame a run of its own):
    /// the mappings it is at least.
    fn frame_runs(&self, w: usize) -> usize {
        let mut runs = 0;
        let mut prev = 0;
        for e in &self.entries[w * WINDOW..(w + 1) * WINDOW] {
            let f = e.frame.load(Ordering::Relaxed);
            runs += (f == 0 || f != prev + PAGE) as usize;
            prev = f;
        }
        runs
    }

    /// Page `idx`'s slot (the page claimed, a neighbour moving along with another page's
    /// move into its slot): whether it was taken; never when the page is in it already.
    pub(crate) fn take_neighbour_slot(&self, idx: usize) -> bool {
        let Some(d) = self.dest.get(idx / WINDOW) else { return false };
        let (b, k) = (d.block.load(Ordering::Acquire), idx % WINDOW);
        b != 0 && self.entries[idx].frame.load(Ordering::Relaxed) != b + k * PAGE && d.take_slot(k)
    }

    /// The frame of page `idx` (claimed, hinted, on node `nid`) in its window's destination
    /// block when the block is on `nid`, the page not in its slot and the slot free, taken:
    /// a local hint fault's move into the window's mapping. A window without a block gets
    /// one here when it is more than `SKIP_MAPPINGS` mappings and the page ends one of them
    /// (pages first touched onto scattered frames, say): its pages then move into it on
    /// their local faults, one scan period, where a collapse would first have to hide the
    /// window at a shootdown per mapping. Never waits. Async-signal-safe.
    pub(crate) fn free_slot(&self, idx: usize, nid: u16) -> Option<usize> {
        if !self.bal.aligned_migration {
            return None;
        }
        let (w, k) = (idx / WINDOW, idx % WINDOW);
        let d = self.dest.get(w)?;
        let mut b = d.block.load(Ordering::Acquire);
        if b == 0 {
            let f = |j: usize| self.entries[j].frame.load(Ordering::Relaxed);
            let at_edge = (k > 0 && f(idx - 1) + PAGE != f(idx)) || (k + 1 < WINDOW && f(idx) + PAGE != f(idx + 1));
            if !at_edge || self.frame_runs(w) <= SKIP_MAPPINGS || !self.bal.has_room_for(nid, WINDOW) {
                return None;
            }
            let Some(nb) = self.bal.chunks[nid as usize].take() else {
                self.bal.chunk_misses[nid as usize].fetch_add(1, Ordering::AcqRel);
                self.bal.kick();
                return None;
            };
            self.bal.kick();
            match d.block.compare_exchange(0, nb, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.bal.stats.window_blocks.fetch_add(1, Ordering::Relaxed);
                    b = nb;
                }
                Err(cur) => {
                    self.bal.give_back_chunk(nid, nb);
                    b = cur;
                }
            }
        }
        let here = b != 0 && self.bal.z.page_to_nid(b as *const u8).is_ok_and(|n| n.0 == nid);
        (here && self.entries[idx].frame.load(Ordering::Relaxed) != b + k * PAGE && d.take_slot(k))
            .then_some(b + k * PAGE)
    }

    /// A visit of the balancer's thread: retires the blocks of windows that took no slot for
    /// `IDLE_VISITS` visits, freeing their untaken frames. A window with a page that someone
    /// is changing (`BUSY`) waits for the next visit.
    pub(crate) fn retire_idle_dests(&self) {
        for (w, d) in self.dest.iter().enumerate() {
            if d.block.load(Ordering::Relaxed) == 0 || d.idle.fetch_add(1, Ordering::Relaxed) + 1 < IDLE_VISITS {
                continue;
            }
            let pages = &self.entries[w * WINDOW..(w + 1) * WINDOW];
            let mut was = [0u8; WINDOW];
            let mut claimed = 0;
            for (e, s) in pages.iter().zip(was.iter_mut()) {
                *s = e.state.load(Ordering::Relaxed);
                if !matches!(*s, UNMAPPED | PRESENT | HINT) || !e.claim(*s) {
                    break;
                }
                claimed += 1;
            }
            let free = if claimed == WINDOW { d.retire() } else { Vec::new() };
            for (e, &s) in pages[..claimed].iter().zip(&was) {
                debug_assert_eq!(e.state.load(Ordering::Relaxed), BUSY);
                e.release(s);
            }
            for f in free {
                self.bal.free_frame(f);
            }
        }
    }

    /// At teardown (no handler inside the region, no scan of it): frees every block's
    /// untaken frames.
    pub(crate) fn free_dests(&self) {
        for d in self.dest.iter() {
            for f in d.retire() {
                self.bal.free_frame(f);
            }
        }
    }
}
