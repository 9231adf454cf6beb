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
//! The same blocks merge windows without a collapse: a *local* hint fault on a page off its
//! slot while its window has a block on the page's node moves the page into its slot (a
//! window of many mappings without a block gets one at such a fault, and the collapse, which
//! would first hide the window at a shootdown per mapping, gives its windows to this while
//! balancing runs: [`RegionShared::defer_collapse`]). The page is hidden, its entry empty, so
//! the move costs no shootdown; the scanner hides such pages with a zap (`scan`), not with
//! the entry kept.
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

use crate::os::PAGE;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Pages of a chunk migration: an aligned 2 MiB, order 9.
pub const CHUNK_PAGES: usize = 512;

/// Pages of a window: 2 MiB, an order-9 block, a chunk migration, a scanner call.
pub(crate) const WINDOW: usize = CHUNK_PAGES;

const WORDS: usize = WINDOW / 64;

/// Visits of the balancer's thread (one each `COLLAPSE_EVERY`, 100 ms) without a slot taken
/// before a window's block is retired: a second.
pub(crate) const IDLE_VISITS: u32 = 10;

/// Mappings past which a window that pages are migrating into is left alone by a scan pass
/// (see [`RegionShared::scan_skips`]).
pub(crate) const SKIP_MAPPINGS: usize = 16;

/// One window's destination block.
#[derive(Default)]
pub(crate) struct Dest {
    /// Arena address of the block (order 9, held and split), 0 when none.
    pub(crate) block: AtomicUsize,
    /// Bit k: slot k was handed out.
    pub(crate) taken: [AtomicU64; WORDS],
    /// Visits of the balancer's thread since a slot was last taken.
    pub(crate) idle: AtomicU32,
    /// A slot was taken since the scanner's last visit (see [`RegionShared::scan_skips`]).
    pub(crate) recent: AtomicBool,
    /// A slot was taken since the collapse's last visit, and the collapse's visits in a row
    /// without one (see [`RegionShared::defer_collapse`]).
    pub(crate) progress: AtomicBool,
    pub(crate) stalls: AtomicU32,
}

impl Dest {
    /// Takes slot `k` for the page that owns it (claimed): whether this call took it.
    pub(crate) fn take_slot(&self, k: usize) -> bool {
        let bit = 1u64 << (k % 64);
        let got = self.taken[k / 64].fetch_or(bit, Ordering::AcqRel) & bit == 0;
        if got {
            self.idle.store(0, Ordering::Relaxed);
            self.recent.store(true, Ordering::Relaxed);
            self.progress.store(true, Ordering::Relaxed);
        }
        got
    }

    /// Ends the block: the frames of the slots never taken, which are the caller's to free,
    /// and the window without a block. The caller holds every page of the window claimed
    /// (or the region is being torn down): no migration is reading the block.
    pub(crate) fn retire(&self) -> Vec<usize> {
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
