//! The zonelist cache (seed 003): per zonelist, the zones found full recently, so that an
//! allocation that must walk past many full nodes skips them instead of checking each.
//!
//! Kernel counterpart: `struct zonelist_cache`, `zlc_setup`, `zlc_zone_worth_trying`,
//! `zlc_mark_zone_full` (mm/page_alloc.c, 2.6.20 to 4.3). As there: a bitmap of zones found
//! full, a compact zone-to-node table, and the time of the last zap; the bitmap is zapped
//! once an interval (`zonelist_cache_interval_ms`, 1 s) when the walk sets the cache up, which
//! it does only after its first zone failed (`zlc_active`, `did_zlc_setup`); a zone is marked
//! when its watermark check or its `rmqueue` fails; a walk that finds nothing with the cache
//! walks again without it, so the cache never turns a fit into out of memory.
//!
//! Better than the seed: Linux deleted the cache in 4.4 partly because "a failed THP
//! allocation [can] mark a zone full for order-0 allocations and cause a fallback to remote
//! nodes". Here a mark remembers what failed (the [`Demand`]: watermark level, whether the
//! mark was halved, order), and a zone is skipped only by a demand at least as strict, which
//! the zone cannot meet either: a zone full for a high watermark or a large order is still
//! tried by a small allocation that would fit. A failed `rmqueue` (no block of the order)
//! marks the order, which every larger order shares.
//!
//! Concurrency: a hint, racy by design as the seed's: relaxed atomics, no lock. A lost or
//! stale mark costs a wasted check or a skipped zone until the next zap, never a wrong answer
//! (the second walk).

use crate::types::Order;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

/// A watermark level, weakest first: the count a zone must keep above for an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// No watermark (`ALLOC_NO_WATERMARKS`): any free block will do.
    None = 0,
    /// `WMARK_MIN`.
    Min = 1,
    /// `WMARK_LOW`.
    Low = 2,
    /// `WMARK_HIGH`.
    High = 3,
}

impl Level {
    fn from_bits(b: u16) -> Level {
        match b & 3 {
            0 => Level::None,
            1 => Level::Min,
            2 => Level::Low,
            _ => Level::High,
        }
    }
}

/// What an allocation asks of a zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    /// The watermark it checks.
    pub level: Level,
    /// Whether that mark is halved (`__GFP_HIGH`).
    pub halved: bool,
    /// The order of the block.
    pub order: Order,
}

impl Demand {
    /// Whether a zone that cannot meet `other` cannot meet `self` either: a mark at least as
    /// high (one zone's marks rise with the level; a halved mark is lower than the whole one,
    /// and a halved mark of one level is not compared with another level's), and a block at
    /// least as large.
    pub fn at_least(self, other: Demand) -> bool {
        let mark = if self.halved == other.halved {
            self.level >= other.level
        } else {
            // Whole against halved: only the same or a higher level is surely stricter.
            !self.halved && self.level >= other.level
        };
        mark && self.order >= other.order
    }

    #[inline]
    fn encode(self) -> u16 {
        self.level as u16 | (self.halved as u16) << 2 | (self.order.0 as u16 & 0x1f) << 3
    }

    fn decode(b: u16) -> Demand {
        Demand { level: Level::from_bits(b), halved: b & 4 != 0, order: Order(((b >> 3) & 0x1f) as u8) }
    }
}

/// A zone's mark: bit 15 with bits 0..8 a count failure's demand; bit 14 with bits 8..13
/// the smallest order whose `rmqueue` found no block.
const COUNT_VALID: u16 = 1 << 15;
const BLOCK_VALID: u16 = 1 << 14;
const BLOCK_SHIFT: u16 = 8;

/// The cache of one zonelist.
#[derive(Debug)]
pub struct ZonelistCache {
    /// The node of each zonelist entry (`z_to_n`), so the walk checks a nodemask without
    /// reading the zone.
    z_to_n: Box<[u16]>,
    /// Bit `i`: entry `i` was found full since the last zap (`fullzones`).
    fullzones: Box<[AtomicU64]>,
    /// What entry `i` was found full for (valid while its bit is set).
    marks: Box<[AtomicU16]>,
    /// When the bitmap was last zapped, in the clock's milliseconds (`last_full_zap`).
    last_full_zap: AtomicU64,
    /// Bumped by every zap and every mark that changes something.
    generation: AtomicU64,
    /// The entries among the first 64 that the last demand asked about skips, valid while
    /// `memo_key` is `generation << 8 | demand`: walks that keep meeting the same full zones
    /// for the same demand skip them all with one load.
    memo_key: AtomicU64,
    memo_mask: AtomicU64,
}

/// `memo_key` while the memo is being written.
const MEMO_BUSY: u64 = u64::MAX;
/// `memo_key` before anything was memoised (no generation reaches it).
const MEMO_EMPTY: u64 = u64::MAX - 1;

impl ZonelistCache {
    /// A cache for a zonelist whose entries lie on these nodes, in zonelist order.
    pub fn new(nodes: impl IntoIterator<Item = u16>) -> ZonelistCache {
        let z_to_n: Box<[u16]> = nodes.into_iter().collect();
        let words = z_to_n.len().div_ceil(64);
        ZonelistCache {
            fullzones: (0..words).map(|_| AtomicU64::new(0)).collect(),
            marks: (0..z_to_n.len()).map(|_| AtomicU16::new(0)).collect(),
            z_to_n,
            last_full_zap: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            memo_key: AtomicU64::new(MEMO_EMPTY),
            memo_mask: AtomicU64::new(0),
        }
    }

    /// Entries in the zonelist.
    pub fn len(&self) -> usize {
        self.z_to_n.len()
    }

    /// The node of entry `i`.
    #[inline]
    pub fn node(&self, i: usize) -> u16 {
        self.z_to_n[i]
    }

    /// `zlc_setup`: zaps the bitmap if the last zap is `interval_ms` or more behind `now_ms`.
    /// Returns whether it zapped.
    pub fn setup(&self, now_ms: u64, interval_ms: u64) -> bool {
        let last = self.last_full_zap.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last) < interval_ms {
            return false;
        }
        // One zapper per interval; the others see the new time and go on.
        if self.last_full_zap.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return false;
        }
        for w in self.fullzones.iter() {
            w.store(0, Ordering::Relaxed);
        }
        self.generation.fetch_add(1, Ordering::Release);
        true
    }

    /// The entries among the first 64 that [`ZonelistCache::worth_trying`] would skip for
    /// `d`, as a bit mask: from the memo when nothing changed since it was taken, else
    /// computed over the marked entries and memoised. A hint like the rest: a mask read
    /// while another thread writes the memo may be off, and the walk's second pass covers it.
    #[inline]
    pub fn skip_mask(&self, d: Demand) -> u64 {
        // Acquire: pairs with the Release of the bump that follows a mark, so the marks read
        // below are at least as new as the generation in the key.
        let key = self.generation.load(Ordering::Acquire) << 8 | d.encode() as u64 & 0xff;
        if self.memo_key.load(Ordering::Acquire) == key {
            let m = self.memo_mask.load(Ordering::Relaxed);
            if self.memo_key.load(Ordering::Acquire) == key {
                return m;
            }
        }
        self.skip_mask_slow(d, key)
    }

    /// [`ZonelistCache::skip_mask`] when the memo is not for `key`: computed and memoised.
    #[cold]
    #[inline(never)]
    fn skip_mask_slow(&self, d: Demand, key: u64) -> u64 {
        let mut m = 0u64;
        let mut w = self.fullzones.first().map_or(0, |w| w.load(Ordering::Relaxed));
        while w != 0 {
            let j = w.trailing_zeros() as usize;
            w &= w - 1;
            if !self.worth_trying(j, d) {
                m |= 1 << j;
            }
        }
        // One writer at a time: whoever turns the key to BUSY owns the memo until it stores its
        // key; a walk that finds it BUSY just uses the mask it computed.
        if self.memo_key.swap(MEMO_BUSY, Ordering::AcqRel) != MEMO_BUSY {
            self.memo_mask.store(m, Ordering::Relaxed);
            self.memo_key.store(key, Ordering::Release);
        }
        m
    }

    #[inline]
    fn bit(&self, i: usize) -> bool {
        self.fullzones[i / 64].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    /// `zlc_zone_worth_trying`: false when entry `i` was found full for a demand that `d` is
    /// at least as strict as, or has no block of `d`'s order.
    #[inline]
    pub fn worth_trying(&self, i: usize, d: Demand) -> bool {
        if !self.bit(i) {
            return true;
        }
        let m = self.marks[i].load(Ordering::Relaxed);
        if m & BLOCK_VALID != 0 && d.order.0 as u16 >= (m >> BLOCK_SHIFT) & 0x1f {
            return false;
        }
        !(m & COUNT_VALID != 0 && d.at_least(Demand::decode(m)))
    }

    /// `zlc_mark_zone_full`: entry `i` could not meet `d`, by its free count (`block` false)
    /// or for want of a block of `d.order` (`block` true). Keeps the more general of an
    /// earlier count mark and this one (the latest when neither covers the other), and the
    /// smaller block order. Returns whether the mark changed: a zone already marked for a
    /// demand this one is at least as strict as is left alone, without a write, so walks that
    /// keep finding the same zones full share their lines read-only.
    #[inline]
    pub fn mark_full(&self, i: usize, d: Demand, block: bool) -> bool {
        // The usual case, inline: a walk that finds its first zone full again, for the same
        // count demand as the walks before it.
        if !block {
            let bit = 1u64 << (i % 64);
            let same = COUNT_VALID | d.encode();
            if self.fullzones[i / 64].load(Ordering::Relaxed) & bit != 0
                && self.marks[i].load(Ordering::Relaxed) & (COUNT_VALID | 0xff) == same
            {
                return false;
            }
        }
        self.mark_full_slow(i, d, block)
    }

    /// [`ZonelistCache::mark_full`] past its inline case.
    #[cold]
    #[inline(never)]
    fn mark_full_slow(&self, i: usize, d: Demand, block: bool) -> bool {
        let merge = |old: u16| -> u16 {
            let mut new = old;
            if block {
                let o = d.order.0 as u16 & 0x1f;
                if !(old & BLOCK_VALID != 0 && (old >> BLOCK_SHIFT) & 0x1f <= o) {
                    new = (new & !(0x1f << BLOCK_SHIFT)) | BLOCK_VALID | o << BLOCK_SHIFT;
                }
            } else if !(old & COUNT_VALID != 0 && d.at_least(Demand::decode(old))) {
                new = (new & !0xff) | COUNT_VALID | d.encode();
            }
            new
        };
        let bit = 1u64 << (i % 64);
        if self.fullzones[i / 64].load(Ordering::Relaxed) & bit != 0 {
            let old = self.marks[i].load(Ordering::Relaxed);
            if merge(old) == old {
                return false;
            }
        }
        let was = self.fullzones[i / 64].fetch_or(bit, Ordering::Relaxed) & bit != 0;
        // A mark left from before the last zap means nothing.
        let _ = self.marks[i]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| Some(merge(if was { old } else { 0 })));
        self.generation.fetch_add(1, Ordering::Release);
        true
    }

    /// Whether entry `i` is marked full (for any demand).
    pub fn is_marked(&self, i: usize) -> bool {
        self.bit(i)
    }

    /// Entries marked full.
    #[cfg(test)]
    pub fn nr_marked(&self) -> usize {
        self.fullzones.iter().map(|w| w.load(Ordering::Relaxed).count_ones() as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(level: Level, halved: bool, order: u8) -> Demand {
        Demand { level, halved, order: Order(order) }
    }

    #[test]
    fn strictness_is_a_partial_order() {
        assert!(d(Level::Low, false, 0).at_least(d(Level::Min, false, 0)));
        assert!(!d(Level::Min, false, 0).at_least(d(Level::Low, false, 0)));
        assert!(d(Level::Low, false, 3).at_least(d(Level::Low, false, 0)));
        assert!(!d(Level::Low, false, 0).at_least(d(Level::Low, false, 9)));
        // Whole is stricter than halved at a level, not the other way round.
        assert!(d(Level::Min, false, 0).at_least(d(Level::Min, true, 0)));
        assert!(!d(Level::Min, true, 0).at_least(d(Level::Min, false, 0)));
        // low/2 and min are not comparable.
        assert!(!d(Level::Low, true, 0).at_least(d(Level::Min, false, 0)));
        for e in [d(Level::High, true, 15), d(Level::None, false, 0), d(Level::Min, true, 7)] {
            assert_eq!(Demand::decode(e.encode()), e);
        }
    }

    #[test]
    fn marks_skip_only_what_they_cover() {
        let c = ZonelistCache::new([0, 1, 2]);
        let small = d(Level::Low, false, 0);
        let thp = d(Level::Low, false, 9);
        assert!(c.worth_trying(1, small));
        // A failed THP allocation marks the zone, for THP-sized blocks and up only.
        c.mark_full(1, thp, false);
        assert!(c.is_marked(1));
        assert!(!c.worth_trying(1, thp));
        assert!(!c.worth_trying(1, d(Level::High, false, 10)));
        assert!(c.worth_trying(1, small), "an order-0 allocation still tries the zone");
        assert!(c.worth_trying(1, d(Level::Min, false, 9)), "a lower mark still tries it");
        // A later order-0 failure at low covers the THP mark.
        c.mark_full(1, small, false);
        assert!(!c.worth_trying(1, small) && !c.worth_trying(1, thp));
        assert!(c.worth_trying(1, d(Level::Min, false, 0)));
        // No block of order 3: orders 3 and up are skipped at any level, smaller ones not.
        c.mark_full(2, d(Level::None, false, 3), true);
        assert!(!c.worth_trying(2, d(Level::None, false, 4)));
        assert!(c.worth_trying(2, d(Level::None, false, 2)));
        assert!(!c.worth_trying(0, small) || !c.is_marked(0));
        assert_eq!(c.nr_marked(), 2);
    }

    #[test]
    fn a_mark_reports_only_what_it_changes() {
        let c = ZonelistCache::new(0..3);
        let small = d(Level::Low, false, 0);
        let gen = || c.generation.load(Ordering::Relaxed);
        assert!(c.mark_full(1, small, false), "the first mark changes the cache");
        let g = gen();
        // The walks' usual case (the inline test): the same demand again writes nothing.
        assert!(!c.mark_full(1, small, false));
        assert!(!c.mark_full(1, d(Level::Low, false, 2), false), "a stricter demand is covered");
        assert_eq!(gen(), g, "no write, so the memo stays valid");
        // What the first mark does not cover still marks: a want of a block, a laxer demand.
        assert!(c.mark_full(1, small, true));
        assert!(!c.mark_full(1, small, true));
        assert!(c.mark_full(1, d(Level::Min, false, 0), false));
        assert!(!c.mark_full(1, small, false), "min covers low");
        assert!(!c.worth_trying(1, d(Level::Min, false, 0)));
        // A block mark alone does not cover a count: the count is still marked.
        assert!(c.mark_full(2, small, true));
        assert!(c.mark_full(2, small, false));
        // After a zap the bits are clear, and the stale marks do not stop a new one.
        assert!(c.setup(5_000, 1000));
        assert!(c.mark_full(1, small, false));
        assert!(c.worth_trying(1, d(Level::Min, false, 0)), "the old min mark is gone");
    }

    #[test]
    fn the_zap_clears_after_the_interval_and_old_marks_do_not_return() {
        let c = ZonelistCache::new(0..70);
        let small = d(Level::Low, false, 0);
        assert!(c.setup(5_000, 1000), "the first setup after the interval zaps");
        c.mark_full(65, small, false);
        c.mark_full(3, d(Level::Low, false, 2), true);
        assert!(!c.setup(5_999, 1000));
        assert!(!c.worth_trying(65, small));
        assert!(c.setup(6_000, 1000));
        assert_eq!(c.nr_marked(), 0);
        assert!(c.worth_trying(65, small) && c.worth_trying(3, d(Level::Low, false, 5)));
        // Marked again after the zap for a larger order: the old order-0 mark is gone.
        c.mark_full(65, d(Level::Low, false, 4), false);
        assert!(c.worth_trying(65, small));
        assert_eq!(c.node(65), 65);
    }

    #[test]
    fn the_skip_mask_follows_every_change() {
        let c = ZonelistCache::new(0..70);
        let small = d(Level::Low, false, 0);
        c.mark_full(2, small, false);
        c.mark_full(5, d(Level::Low, false, 9), false);
        c.mark_full(66, small, false);
        assert_eq!(c.skip_mask(small), 1 << 2, "entry 5 is full for order 9 only; 66 is past the mask");
        assert_eq!(c.skip_mask(small), 1 << 2, "memoised");
        assert_eq!(c.skip_mask(d(Level::Low, false, 9)), 1 << 2 | 1 << 5);
        c.mark_full(7, small, false);
        assert_eq!(c.skip_mask(small), 1 << 2 | 1 << 7, "a new mark invalidates the memo");
        assert!(c.setup(10_000, 1000));
        assert_eq!(c.skip_mask(small), 0, "so does a zap");
    }

    #[test]
    fn concurrent_marking_keeps_every_bit() {
        let c = ZonelistCache::new(0..128);
        std::thread::scope(|s| {
            for t in 0..4 {
                let c = &c;
                s.spawn(move || {
                    for i in (t..128).step_by(4) {
                        c.mark_full(i, d(Level::Low, false, (i % 4) as u8), false);
                        c.mark_full(i, d(Level::Min, false, 0), i % 2 == 0);
                    }
                });
            }
        });
        assert_eq!(c.nr_marked(), 128);
        for i in 0..128 {
            assert!(!c.worth_trying(i, d(Level::Low, false, 3)), "entry {i}");
        }
    }
}
