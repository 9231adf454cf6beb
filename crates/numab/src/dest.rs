//! Destination blocks: the frames pages migrating alone take, chosen so that the pages of a
//! window migrated one by one, in any order, map consecutive frames and merge into one
//! mapping.
//!
//! A page migrated onto whatever frame its node's reserve held is a mapping of its own (the
//! kernel merges neighbouring mappings only when their file offsets, frame numbers here,
//! follow each other), and a call that takes pages away costs a TLB shootdown for each
//! mapping it finds a present entry in (`MADV_DONTNEED` and every unmap; only `mprotect`
//! gathers a whole call into one). A region migrated page by page made every later scan pass
//! cost a shootdown per migrated page, more than the migrations had saved (issue 39).
//!
//! So each aligned window of [`WINDOW`] pages (2 MiB) may keep one block of `WINDOW`
//! consecutive frames on a destination node, and page k of the window, migrating to that
//! node, takes frame k of the block (its *slot*): the window's migrated pages are then
//! consecutive in frames as they are in addresses, whatever order they move in, and the
//! kernel merges their mappings as they come. The first migration of a window to a node takes
//! a block from the node's reserve of order-9 blocks (`Shared::chunks`, lock-free, in the
//! fault handler) when the node has room for a block above its high watermark; slots go one
//! by one (`taken`, a bit each, set with `fetch_or` by the page's owner, which holds the page
//! `BUSY` from reading the block to taking the slot). A migration to another node than the
//! block's, or of a page whose slot went already (it was there and left), takes a reserve
//! frame as before.
//!
//! Frames: a slot's frame is handed out (its bit set: it became the page's frame, or went
//! back to be freed when the migration failed) or still the block's (bit clear). The block's
//! frames are freed when it is retired: by the balancer's thread once the window took no slot
//! for [`IDLE_VISITS`] visits, and at the region's teardown. Retiring claims every page of the
//! window first, so no migration is between reading the block and taking a slot of it.
//! Invariant, per window: `slots taken + slots still the block's == WINDOW` while it has a
//! block.
//!
//! No kernel counterpart: Linux migrates a page-table entry, which splits nothing. This is
//! the mapping layer's price for mapping frames one by one, paid as a huge page pays its
//! alignment.

use crate::os::{self, PAGE};
use crate::table::{BUSY, HINT, PRESENT, UNMAPPED};
use crate::RegionShared;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Pages of a window: 2 MiB, an order-9 block, a chunk migration, a scanner call.
pub(crate) const WINDOW: usize = crate::CHUNK_PAGES;

const WORDS: usize = WINDOW / 64;

/// Visits of the balancer's thread (one each `COLLAPSE_EVERY`, 100 ms) without a slot taken
/// before a window's block is retired: a second.
pub(crate) const IDLE_VISITS: u32 = 10;

/// Mappings past which a window that pages are migrating into is left alone by a scan pass
/// (see [`RegionShared::scan_skips`]).
const SKIP_MAPPINGS: usize = 16;

/// One window's destination block.
#[derive(Default)]
pub(crate) struct Dest {
    /// Arena address of the block (order 9, held and split), 0 when none.
    block: AtomicUsize,
    /// Bit k: slot k was handed out.
    taken: [AtomicU64; WORDS],
    /// Visits of the balancer's thread since a slot was last taken.
    idle: AtomicU32,
    /// A slot was taken since the scanner's last visit (see [`RegionShared::scan_skips`]).
    recent: AtomicBool,
}

impl Dest {
    /// Takes slot `k` for the page that owns it (claimed): whether this call took it.
    fn take_slot(&self, k: usize) -> bool {
        let bit = 1u64 << (k % 64);
        let got = self.taken[k / 64].fetch_or(bit, Ordering::AcqRel) & bit == 0;
        if got {
            self.idle.store(0, Ordering::Relaxed);
            self.recent.store(true, Ordering::Relaxed);
        }
        got
    }

    /// Ends the block: the frames of the slots never taken, which are the caller's to free,
    /// and the window without a block. The caller holds every page of the window claimed
    /// (or the region is being torn down): no migration is reading the block.
    fn retire(&self) -> Vec<usize> {
        let b = self.block.swap(0, Ordering::AcqRel);
        let mut free = Vec::new();
        for (w, word) in self.taken.iter().enumerate() {
            let t = word.swap(0, Ordering::AcqRel);
            if b != 0 {
                free.extend((0..64).filter(|i| t & (1 << i) == 0).map(|i| b + (w * 64 + i) * PAGE));
            }
        }
        self.idle.store(0, Ordering::Relaxed);
        free
    }
}

/// A region's destination blocks, one slot per whole window.
pub(crate) fn table(pages: usize) -> Box<[Dest]> {
    (0..pages / WINDOW).map(|_| Dest::default()).collect()
}

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
        let pages = &self.entries[w * WINDOW..(w + 1) * WINDOW];
        let mut runs = 0;
        let mut prev = 0;
        for e in pages {
            let f = e.frame.load(Ordering::Relaxed);
            runs += (f == 0 || f != prev + PAGE) as usize;
            prev = f;
        }
        runs > SKIP_MAPPINGS
    }

    /// Slot `k` of page `idx`'s window, for a neighbour moving along with page `idx`'s
    /// migration (the neighbour claimed): whether it was taken.
    pub(crate) fn take_neighbour_slot(&self, idx: usize) -> bool {
        self.dest.get(idx / WINDOW).is_some_and(|d| d.take_slot(idx % WINDOW))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_goes_once_and_retiring_gives_back_the_rest() {
        let d = Dest::default();
        d.block.store(1 << 21, Ordering::Relaxed);
        assert!(d.take_slot(3));
        assert!(!d.take_slot(3), "a slot goes once");
        assert!(d.take_slot(WINDOW - 1));
        let free = d.retire();
        assert_eq!(free.len(), WINDOW - 2);
        assert!(!free.contains(&((1 << 21) + 3 * PAGE)) && free.contains(&(1 << 21)));
        assert_eq!(d.block.load(Ordering::Relaxed), 0);
        assert!(d.retire().is_empty(), "no block, nothing to free");
        assert!(d.take_slot(3), "the bits start over with the next block");
    }
}
