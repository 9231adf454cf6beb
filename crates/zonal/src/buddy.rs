//! The buddy allocator of one zone: `free_area[order]` lists of free blocks, split on
//! allocation (`expand`), merged with their buddy on free (`__free_one_page`).
//!
//! Kernel counterpart: `struct free_area`, `__rmqueue_smallest`, `expand`, `__free_one_page`
//! in mm/page_alloc.c. zonal has one migrate type, so one list per order.
//!
//! Locking: every function here takes a [`ZoneLocked`](crate::zone::ZoneLocked) guard or is
//! called through one; the lists and links are inside the zone's mutex. A frame's *state*
//! byte is an atomic outside the lock, because the free path claims an allocated block
//! (compare-and-swap `ALLOCATED|order -> NONE`) before it takes any lock: that CAS is what
//! makes a double free an error instead of a corruption, even from two threads at once.
//!
//! The frame states and their tags are [`crate::mem_map`]'s.
//!
//! Invariant: `sum(nr_free[o] << o) == zone.nr_free`, each list holds exactly the frames in
//! state `BUDDY|o`, and no two blocks (free or allocated) overlap.

use crate::mem_map::MemMap;
use crate::sync::Ordering;
use crate::types::{Order, Pfn, MAX_ORDER_LIMIT};

use crate::mem_map::{state, BUDDY, NONE};

const NIL: u32 = u32::MAX;
/// `FreeArea::listed` of a frame on no list.
const NOT_LISTED: u8 = u8::MAX;
/// Most frames a zone may span: its frames are indexed by `u32` links, `NIL` excluded.
pub(crate) const MAX_ZONE_FRAMES: usize = NIL as usize;

/// Links of one frame on a free list (indices relative to the zone's first frame).
#[derive(Clone, Copy, Debug)]
struct Link {
    prev: u32,
    next: u32,
}

/// The free lists of a zone (`struct free_area free_area[NR_PAGE_ORDERS]`). Lives inside the
/// zone lock.
#[derive(Debug)]
pub struct FreeArea {
    head: [u32; MAX_ORDER_LIMIT as usize + 1],
    nr_free: [usize; MAX_ORDER_LIMIT as usize + 1],
    /// Changes to `nr_free` per order not yet accounted to the zone counters (the zone lock's
    /// holder accounts them when it unlocks).
    change: [i32; MAX_ORDER_LIMIT as usize + 1],
    /// Whether any `change` is non-zero.
    changed: bool,
    links: Box<[Link]>,
    /// Per frame, the order of the list it heads a block on, or `NOT_LISTED`. Kept under
    /// the lock with the links, so unlike the state bytes (which a caller's racing free can
    /// store to late, see `free_check`) it is always true: `Buddy::free_one` checks it.
    listed: Box<[u8]>,
}

impl FreeArea {
    /// Empty lists for a zone of `span` frames (at most `MAX_ZONE_FRAMES`: the topology checks).
    pub fn new(span: usize) -> FreeArea {
        debug_assert!(span <= MAX_ZONE_FRAMES);
        FreeArea {
            head: [NIL; MAX_ORDER_LIMIT as usize + 1],
            nr_free: [0; MAX_ORDER_LIMIT as usize + 1],
            change: [0; MAX_ORDER_LIMIT as usize + 1],
            changed: false,
            links: vec![Link { prev: NIL, next: NIL }; span].into_boxed_slice(),
            listed: vec![NOT_LISTED; span].into_boxed_slice(),
        }
    }

    /// Free blocks of one order (`free_area[order].nr_free`).
    #[inline]
    pub fn nr_free(&self, order: Order) -> usize {
        self.nr_free[order.0 as usize]
    }

    /// Whether there is a free block of `order` or above, up to `max`.
    #[inline]
    pub fn has_block_at_least(&self, order: Order, max: Order) -> bool {
        (order.0..=max.0).any(|o| self.nr_free[o as usize] != 0)
    }

    /// Adds the block at zone-relative index `idx` to the head of `free_area[order]`.
    pub(crate) fn add(&mut self, idx: u32, order: Order) {
        let o = order.0 as usize;
        let old = self.head[o];
        self.links[idx as usize] = Link { prev: NIL, next: old };
        if old != NIL {
            self.links[old as usize].prev = idx;
        }
        self.head[o] = idx;
        self.listed[idx as usize] = order.0;
        self.nr_free[o] += 1;
        self.change[o] += 1;
        self.changed = true;
    }

    /// Unlinks the block at `idx` from `free_area[order]`.
    pub(crate) fn del(&mut self, idx: u32, order: Order) {
        let o = order.0 as usize;
        let Link { prev, next } = self.links[idx as usize];
        if prev == NIL {
            debug_assert_eq!(self.head[o], idx);
            self.head[o] = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next != NIL {
            self.links[next as usize].prev = prev;
        }
        self.listed[idx as usize] = NOT_LISTED;
        self.nr_free[o] -= 1;
        self.change[o] -= 1;
        self.changed = true;
    }

    /// The order of the list the block at `idx` is on, if it is on one.
    #[inline]
    fn listed(&self, idx: usize) -> Option<Order> {
        let o = self.listed[idx];
        (o != NOT_LISTED).then_some(Order(o))
    }

    /// Whether the lists changed since the changes were last taken.
    #[inline]
    pub(crate) fn changed(&self) -> bool {
        self.changed
    }

    /// The changes in free blocks per order since they were last taken, and clears them.
    #[inline]
    pub(crate) fn take_changes(&mut self) -> [i32; MAX_ORDER_LIMIT as usize + 1] {
        self.changed = false;
        std::mem::take(&mut self.change)
    }

    /// The first block on `free_area[order]`, if any.
    #[inline]
    pub(crate) fn first(&self, order: Order) -> Option<u32> {
        let h = self.head[order.0 as usize];
        (h != NIL).then_some(h)
    }

    /// Iterates the blocks on `free_area[order]` (for invariant checks and reports).
    pub fn iter(&self, order: Order) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head[order.0 as usize];
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let c = cur;
            cur = self.links[c as usize].next;
            Some(c)
        })
    }
}

/// The buddy operations of one zone, over its lists and its frame states. Holding a
/// `Buddy` means holding the zone lock (it is built only by `ZoneLocked`).
pub struct Buddy<'a> {
    pub(crate) area: &'a mut FreeArea,
    /// The handle's states, which hold the zone's from `start`.
    pub(crate) mem_map: &'a MemMap,
    pub(crate) start: Pfn,
    /// Frames in the zone.
    pub(crate) span: usize,
    pub(crate) max_order: Order,
}

impl Buddy<'_> {
    #[inline]
    fn idx(&self, pfn: Pfn) -> u32 {
        (pfn.0 - self.start.0) as u32
    }

    #[inline]
    fn set(&self, pfn: Pfn, s: u8) {
        self.mem_map.state(pfn).store(s, Ordering::Relaxed)
    }

    /// Takes the smallest free block of at least `order`, splits it down to `order`, and
    /// returns its first frame (`__rmqueue_smallest` + `expand`). The block's state is left
    /// `NONE`; the caller tags it (allocated or per-CPU).
    #[inline]
    pub fn rmqueue_smallest(&mut self, order: Order) -> Option<Pfn> {
        let (pfn, cur) = self.take_smallest(order)?;
        self.list_range(pfn + order.pages(), pfn + cur.pages());
        Some(Pfn(pfn))
    }

    /// Takes up to `n` blocks of `order` and appends their first frames to `out`; returns how
    /// many. The blocks, and the order they are appended in, are those of `n` calls of
    /// [`Buddy::rmqueue_smallest`] (Linux's `rmqueue_bulk` loop): each call takes the smallest
    /// block, and once a larger block is split the smallest piece left is always the next one
    /// up in it, so the loop walks a split block from its first frame upward. Taking that walk
    /// in one step (the head delisted once, what is left listed once as the largest aligned
    /// blocks that fit) moves a batch split from one block without a list operation or a
    /// state store per frame, which keeps the refill's hold of the zone lock short. States of
    /// the blocks taken are left `NONE`; the caller tags them.
    pub fn rmqueue_many(&mut self, order: Order, n: usize, out: &mut Vec<usize>) -> usize {
        let mut taken = 0;
        while taken < n {
            let Some((pfn, cur)) = self.take_smallest(order) else { break };
            let k = (1usize << (cur.0 - order.0)).min(n - taken);
            out.extend((0..k).map(|i| pfn + (i << order.0)));
            taken += k;
            self.list_range(pfn + (k << order.0), pfn + cur.pages());
        }
        taken
    }

    /// Delists the smallest free block of at least `order` (state `NONE`); its first frame
    /// and order.
    #[inline]
    fn take_smallest(&mut self, order: Order) -> Option<(usize, Order)> {
        let cur = (order.0..=self.max_order.0).map(Order).find(|&o| self.area.first(o).is_some())?;
        let idx = self.area.first(cur)?;
        self.area.del(idx, cur);
        let pfn = self.start.0 + idx as usize;
        self.set(Pfn(pfn), NONE);
        Some((pfn, cur))
    }

    /// Lists the free frames `from..to` (the rest of a split block, whose buddies are all
    /// taken) as the largest aligned blocks that fit, without merging (`expand`).
    fn list_range(&mut self, mut from: usize, to: usize) {
        while from < to {
            let o = (from.trailing_zeros() as u8).min((to - from).ilog2() as u8);
            self.area.add(self.idx(Pfn(from)), Order(o));
            self.set(Pfn(from), state(BUDDY, Order(o)));
            from += 1 << o;
        }
    }

    /// Frees a block, merging it with free buddies as far as they go (`__free_one_page`).
    /// The block's head state must already be `NONE` (claimed by the caller, with a claim
    /// exactly one racer wins).
    ///
    /// Refuses (returns `false`, changes no list) a block that is already free: one that is
    /// on a list or lies inside a free block. The claims keep that from happening but for
    /// one case they cannot see: under `free_check = sequential` a free preempted between
    /// the load and the store of its claim can tag a frame `PCP` after it went back to the
    /// buddy, and a drain of its copy then lands here. The check reads `listed`, which lives
    /// under this lock, not the state bytes; it restores the state the lists say. Always on:
    /// at most `max_order + 1` byte loads under a lock the caller holds anyway, against a
    /// frame counted twice for good.
    pub fn free_one(&mut self, mut pfn: Pfn, mut order: Order) -> bool {
        let span = self.span;
        let i = pfn.0 - self.start.0;
        if let Some(o) = self.area.listed(i) {
            self.set(pfn, state(BUDDY, o));
            return false;
        }
        for up in order.0 + 1..=self.max_order.0 {
            let head = pfn.align_down(Order(up));
            let hi = head.0.wrapping_sub(self.start.0);
            if hi >= span {
                break;
            }
            if self.area.listed(hi).is_some_and(|o| o.0 >= up) {
                self.set(pfn, NONE);
                return false;
            }
        }
        while order < self.max_order {
            let buddy = pfn.buddy(order);
            let bi = buddy.0.wrapping_sub(self.start.0);
            // The lists, not the state byte, say whether the buddy is free (see above).
            if bi >= span || self.area.listed(bi) != Some(order) {
                break;
            }
            self.area.del(bi as u32, order);
            self.set(buddy, NONE);
            pfn = Pfn(pfn.0 & buddy.0);
            order = Order(order.0 + 1);
        }
        self.area.add(self.idx(pfn), order);
        self.set(pfn, state(BUDDY, order));
        true
    }

    /// Puts `nr` frames starting at `start` on the lists as the largest aligned blocks that
    /// fit (`memblock_free_pages` at boot). The frames must not be on any list.
    pub fn free_range(&mut self, start: Pfn, nr: usize) {
        let end = start.0 + nr;
        let mut pfn = start.0;
        while pfn < end {
            let mut o = self.max_order.0;
            while o > 0 && (pfn & ((1 << o) - 1) != 0 || pfn + (1 << o) > end) {
                o -= 1;
            }
            let freed = self.free_one(Pfn(pfn), Order(o));
            debug_assert!(freed, "free_range: {pfn:#x} was already free");
            pfn += 1 << o;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::mem_map::{decode, MemMap, PCP};

    fn zone(span: usize) -> (FreeArea, MemMap) {
        (FreeArea::new(span), MemMap::new(span))
    }

    #[test]
    fn split_and_merge_round_trip() {
        let (mut area, states) = zone(16);
        let mut b = Buddy { area: &mut area, mem_map: &states, start: Pfn(0), span: states.len(), max_order: Order(3) };
        b.free_range(Pfn(0), 16);
        assert_eq!(b.area.nr_free(Order(3)), 2);
        let p = b.rmqueue_smallest(Order(0)).unwrap();
        // The block freed last is at the head of the list and is split.
        assert_eq!(p, Pfn(8));
        // One order-3 block split into 1 (taken) + 1 + 2 + 4.
        assert_eq!((b.area.nr_free(Order(0)), b.area.nr_free(Order(1)), b.area.nr_free(Order(2))), (1, 1, 1));
        assert_eq!(decode(states.state(Pfn(9)).load(Ordering::Relaxed)), (BUDDY, Order(0)));
        assert_eq!(decode(states.state(Pfn(12)).load(Ordering::Relaxed)), (BUDDY, Order(2)));
        let mut b = Buddy { area: &mut area, mem_map: &states, start: Pfn(0), span: states.len(), max_order: Order(3) };
        assert!(b.free_one(p, Order(0)));
        assert_eq!(b.area.nr_free(Order(3)), 2);
        assert_eq!(b.area.nr_free(Order(0)), 0);
    }

    /// A block already on a list, or inside a free block, is refused whatever its state
    /// byte says (a caller's racing free under `free_check = sequential` can store to it
    /// late), and its state is put back to what the lists say.
    #[test]
    fn freeing_a_free_block_is_refused() {
        let (mut area, states) = zone(16);
        let mut b = Buddy { area: &mut area, mem_map: &states, start: Pfn(0), span: states.len(), max_order: Order(3) };
        b.free_range(Pfn(0), 16);
        // Frame 8 heads a free order-3 block; frame 9 lies inside it.
        for (pfn, order, after) in [(8, 3, state(BUDDY, Order(3))), (8, 0, state(BUDDY, Order(3))), (9, 0, NONE)] {
            states.state(Pfn(pfn)).store(state(PCP, Order(0)), Ordering::Relaxed);
            assert!(!b.free_one(Pfn(pfn), Order(order)), "pfn {pfn} order {order}");
            assert_eq!(states.state(Pfn(pfn)).load(Ordering::Relaxed), after);
        }
        assert_eq!((b.area.nr_free(Order(3)), b.area.nr_free(Order(0))), (2, 0));
        assert_eq!(b.area.iter(Order(3)).collect::<Vec<_>>(), vec![8, 0]);
    }

    /// Builds a fragmented zone of `span` frames by the same steps each time: everything
    /// freed, then blocks of the given orders taken, then every other one of them freed.
    fn fragmented(span: usize, max_order: u8, takes: &[u8]) -> (FreeArea, MemMap) {
        let (mut area, map) = zone(span);
        let mut b =
            Buddy { area: &mut area, mem_map: &map, start: Pfn(0), span: map.len(), max_order: Order(max_order) };
        b.free_range(Pfn(0), span);
        let taken: Vec<(Pfn, Order)> = takes
            .iter()
            .filter_map(|&o| {
                let o = Order(o.min(max_order));
                b.rmqueue_smallest(o).map(|p| (p, o))
            })
            .collect();
        for &(p, o) in taken.iter().step_by(2) {
            assert!(b.free_one(p, o));
        }
        (area, map)
    }

    /// Every listed block as (order, first frame), and every frame's state.
    fn snapshot(area: &FreeArea, map: &MemMap, max_order: u8) -> (Vec<(u8, u32)>, Vec<u8>) {
        let mut blocks: Vec<(u8, u32)> =
            (0..=max_order).flat_map(|o| area.iter(Order(o)).map(move |i| (o, i))).collect();
        blocks.sort_unstable();
        (blocks, map.range(Pfn(0), map.len()).iter().map(|s| s.load(Ordering::Relaxed)).collect())
    }

    /// Whether two zones list the same blocks with the same states and counts.
    fn same_zones(a1: &FreeArea, m1: &MemMap, a2: &FreeArea, m2: &MemMap, max_order: u8) -> bool {
        snapshot(a1, m1, max_order) == snapshot(a2, m2, max_order) && a1.nr_free == a2.nr_free
    }

    /// `rmqueue_many` takes the blocks, in the order, that a loop of `rmqueue_smallest`
    /// takes, and leaves the same blocks listed with the same states.
    fn many_is_a_loop_of_smallest(max_order: u8, takes: &[u8], order: Order, n: usize) -> Result<(), String> {
        let ((mut a1, m1), (mut a2, m2)) = (fragmented(1024, max_order, takes), fragmented(1024, max_order, takes));
        let mut many = Vec::new();
        let got = Buddy { area: &mut a1, mem_map: &m1, start: Pfn(0), span: m1.len(), max_order: Order(max_order) }
            .rmqueue_many(order, n, &mut many);
        let mut b2 = Buddy { area: &mut a2, mem_map: &m2, start: Pfn(0), span: m2.len(), max_order: Order(max_order) };
        let one: Vec<usize> = (0..n).map_while(|_| b2.rmqueue_smallest(order)).map(|p| p.0).collect();
        if got != many.len() || many != one || !same_zones(&a1, &m1, &a2, &m2, max_order) {
            return Err(format!("rmqueue_many took {many:?} (said {got}), a loop took {one:?}"));
        }
        Ok(())
    }

    proptest::proptest! {
        /// The batch take of the buddy against the one-block take it stands for, at the
        /// pcp orders and at the refill run's (`mem_map::RUN_ORDER`).
        #[test]
        fn batch_takes_match_single_takes(
            max_order in 0u8..8,
            takes in proptest::collection::vec(0u8..8, 0..40),
            order in proptest::sample::select(vec![0u8, 1, 2, 3, crate::mem_map::RUN_ORDER.0]),
            n in 0usize..300,
        ) {
            let order = Order(order.min(max_order));
            proptest::prop_assert_eq!(many_is_a_loop_of_smallest(max_order, &takes, order, n), Ok(()));
        }
    }

    #[test]
    fn partial_range_uses_smaller_blocks() {
        let (mut area, states) = zone(16);
        let mut b = Buddy { area: &mut area, mem_map: &states, start: Pfn(0), span: states.len(), max_order: Order(3) };
        b.free_range(Pfn(0), 13);
        // 8 + 4 + 1
        assert_eq!((b.area.nr_free(Order(3)), b.area.nr_free(Order(2)), b.area.nr_free(Order(0))), (1, 1, 1));
        assert_eq!(b.area.iter(Order(0)).collect::<Vec<_>>(), vec![12]);
    }

    #[test]
    fn list_unlink_from_middle() {
        let mut a = FreeArea::new(8);
        for i in [0, 2, 4] {
            a.add(i, Order(1));
        }
        a.del(2, Order(1));
        assert_eq!(a.iter(Order(1)).collect::<Vec<_>>(), vec![4, 0]);
        assert_eq!(a.nr_free(Order(1)), 2);
        assert!(a.has_block_at_least(Order(0), Order(3)));
        assert!(!a.has_block_at_least(Order(2), Order(3)));
    }
}
