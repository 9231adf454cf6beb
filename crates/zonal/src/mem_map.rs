//! zonal's `mem_map`: one state byte per frame, outside the frames.
//!
//! Kernel counterpart: `struct page` and the `mem_map`/`vmemmap` array of them. Linux gives
//! every frame a 64-byte `struct page`, so two CPUs working on neighbouring frames never
//! write the same cache line. zonal keeps one byte per frame (1/4096 of the memory) and gets
//! the same separation from how frames reach the per-CPU lists instead: a refill of order-0
//! frames takes whole aligned runs of [`RUN_ORDER`] (`pcp::rmqueue_bulk`), whose state bytes
//! fill two whole cache lines (the pair a spatial prefetcher moves together), so the lines a
//! CPU writes on its fast path are lines no other CPU of the zone writes, until a frame is
//! freed on another CPU or drifts through the buddy under memory pressure.
//!
//! Measured (2026-11-25, `zonal bench cross` and `zonal --topology nodes=1,size=128M bench
//! parallel`): one byte per frame with run refills keeps two CPUs of one zone at 97–103% of
//! the one-CPU rate, as 64-byte entries did, and a frame freed on another CPU than the one
//! that allocated it shares its line transfer with up to 127 neighbours (cross-CPU free
//! 0.30–0.38× mimalloc, against 0.69–0.80× with a line per frame and 0.48–0.55× with a byte
//! map whose refills split runs between CPUs).
//!
//! Frame state (one byte at the start of each entry):
//! - `BUDDY|o`: first frame of a free block of order `o` on `free_area[o]` (`PageBuddy`);
//! - `ALLOCATED|o`: first frame of a block of order `o` handed out;
//! - `PCP|o`: first frame of a block on a per-CPU list or cache (not mergeable, like Linux);
//! - `ALLOCATED|HELD|o`: an allocated block a layer holds ([`hold`]): allocated for every
//!   reader ([`decode`] masks the bit away), but no plain free claims it, since every claim
//!   compares the whole byte with `ALLOCATED|o`; only the holder's free ([`claim_held`])
//!   does;
//! - `NONE`: any other frame (inside a block, or a block in transit under a lock).
//!
//! Locking: the state is an atomic outside every lock, because a free *claims* its block
//! (`ALLOCATED|o` to `NONE` or `PCP|0`) before it takes any lock: the claims below are what
//! make a double free an error instead of a corruption. A claim that moves a frame into the
//! locked lists or the buddy is one exactly one racer wins; the order-0 fast path's claim
//! and pop are a load and a store (`free_check = sequential`), whose racing copies the
//! locked paths drop.
//!
//! Invariant: each block has exactly one head whose tag says where the block is.

use crate::error::{Error, Result};
use crate::sync::{AtomicU8, Ordering};
use crate::types::{Order, Pfn};
use std::sync::Arc;

/// State of a frame that heads no block.
pub const NONE: u8 = 0;
/// Tag of the head of a free block in the buddy lists.
pub const BUDDY: u8 = 0x40;
/// Tag of the head of an allocated block.
pub const ALLOCATED: u8 = 0x80;
/// Tag of the head of a block on a per-CPU list.
pub const PCP: u8 = 0xC0;
/// Flag of an allocated block's head that a layer holds (`ALLOCATED|HELD|o`), in a bit that
/// neither the tag (0xC0) nor the order (0x0F) uses.
pub(crate) const HELD: u8 = 0x10;
const TAG: u8 = 0xC0;
const ORDER_MASK: u8 = 0x0F;

const _: () = assert!(HELD & (TAG | ORDER_MASK) == 0);

/// Builds a state byte.
#[inline]
pub const fn state(tag: u8, order: Order) -> u8 {
    tag | order.0
}

/// Splits a state byte into its tag and order. A held block's head decodes as
/// `ALLOCATED` (the `HELD` flag is masked away): every report and walk counts it allocated.
#[inline]
pub const fn decode(s: u8) -> (u8, Order) {
    (s & TAG, Order(s & ORDER_MASK))
}

/// Frames whose state bytes share one 64-byte cache line.
pub(crate) const FRAMES_PER_LINE: usize = 64;

/// The order of an order-0 refill run (`pcp::rmqueue_bulk`): 128 frames (512 KiB), whose
/// state bytes fill two whole lines, aligned to the pair, so that a CPU taking whole runs
/// writes lines no other CPU of its zone writes.
pub(crate) const RUN_ORDER: Order = Order((2 * FRAMES_PER_LINE).trailing_zeros() as u8);

const _: () = assert!(1 << RUN_ORDER.0 == 2 * FRAMES_PER_LINE);

/// The run-owner hint of a run nobody's refill has taken since the map was made: no CPU.
pub(crate) const NO_OWNER: u16 = u16::MAX;

/// The state bytes of every frame of a handle's arena, indexed by frame number, gaps
/// included (always `NONE`). One map for all zones, so that the fast paths find a frame's
/// state from its number alone: the free's claim no longer waits for the frame's zone
/// (`block_zone`, then the zone), which put two more dependent loads on every pair. A zone
/// holds the map and its own range of it (built from a [`ZoneMap`]).
///
/// After the states, in the same allocation, the *run owners*: one `u16` per run of
/// [`RUN_ORDER`] frames (`pfn >> RUN_ORDER`), naming the CPU whose lists took the run (or
/// frames of it) at their last refill, [`NO_OWNER`] until one does. A hint for routing
/// frees back to the CPU whose state lines they are (`pcp`'s outbox and inboxes), never
/// needed for correctness: written with relaxed stores by refills under their pcp lock,
/// last writer wins. The states are padded to whole runs, so the owners start at the
/// states' address plus their length, and a fast free that has checked a frame against that
/// length finds its run's owner with no other load ([`MapRef::run_owner`]).
pub(crate) struct MemMap {
    #[cfg(not(loom))]
    raw: RawMap,
    #[cfg(loom)]
    states: Box<[AtomicU8]>,
    #[cfg(loom)]
    owners: Box<[std::sync::atomic::AtomicU16]>,
}

/// The states and the owners in one allocation of the global allocator: `len` state bytes
/// from `base`, then `len >> RUN_ORDER` owners (see [`MemMap`]).
#[cfg(not(loom))]
struct RawMap {
    base: std::ptr::NonNull<u8>,
    len: usize,
    /// The layout of the allocation, to free it with.
    layout: std::alloc::Layout,
}

// SAFETY: a `RawMap` owns its allocation, which holds only atomics; any thread may read and
// write them, and the map frees it once (`Drop`).
#[cfg(not(loom))]
unsafe impl Send for RawMap {}
// SAFETY: as for `Send`.
#[cfg(not(loom))]
unsafe impl Sync for RawMap {}

impl MemMap {
    /// `n` states, every one `NONE` (0), padded to whole runs (so the map's length is a
    /// multiple of the run's frames), and their runs' owners, every one [`NO_OWNER`].
    pub(crate) fn new(n: usize) -> MemMap {
        let n = n.next_multiple_of(RUN_ORDER.pages());
        let runs = n >> RUN_ORDER.0;
        #[cfg(not(loom))]
        {
            use std::sync::atomic::AtomicU16;
            let layout = std::alloc::Layout::array::<AtomicU8>(n)
                .and_then(|states| states.extend(std::alloc::Layout::array::<AtomicU16>(runs.max(1))?))
                .map(|(layout, at)| {
                    assert_eq!(at, n, "the owners follow the states, which fill whole runs");
                    layout
                })
                .expect("a zone's map fits in the address space");
            // SAFETY: the layout has a non-zero size (at least one owner). The allocator
            // returns zeroed memory (for large maps, fresh anonymous pages the OS backs on
            // first write): every state `NONE`, a valid `AtomicU8`.
            let base = unsafe { std::alloc::alloc_zeroed(layout) };
            let Some(base) = std::ptr::NonNull::new(base) else { std::alloc::handle_alloc_error(layout) };
            // SAFETY: the `runs` `u16`s from byte `n` (aligned: `n` is a multiple of 128) lie
            // inside the allocation (`layout` holds them).
            unsafe {
                let owners = base.as_ptr().add(n).cast::<AtomicU16>();
                for i in 0..runs {
                    owners.add(i).write(AtomicU16::new(NO_OWNER));
                }
            }
            MemMap { raw: RawMap { base, len: n, layout } }
        }
        #[cfg(loom)]
        {
            MemMap {
                states: (0..n).map(|_| AtomicU8::new(0)).collect(),
                owners: (0..runs).map(|_| std::sync::atomic::AtomicU16::new(NO_OWNER)).collect(),
            }
        }
    }

    /// Every state, by frame number.
    #[inline(always)]
    fn states(&self) -> &[AtomicU8] {
        #[cfg(not(loom))]
        {
            // SAFETY: `len` states from `base`, initialised (zeroed) in `new`, live as long as
            // the map.
            unsafe { std::slice::from_raw_parts(self.raw.base.as_ptr().cast::<AtomicU8>(), self.raw.len) }
        }
        #[cfg(loom)]
        {
            &self.states
        }
    }

    /// The owner hints, one per run.
    #[inline(always)]
    fn owners(&self) -> &[std::sync::atomic::AtomicU16] {
        #[cfg(not(loom))]
        {
            // SAFETY: `len >> RUN_ORDER` owners from byte `len`, initialised in `new`, live as
            // long as the map.
            unsafe {
                std::slice::from_raw_parts(self.raw.base.as_ptr().add(self.raw.len).cast(), self.raw.len >> RUN_ORDER.0)
            }
        }
        #[cfg(loom)]
        {
            &self.owners
        }
    }

    /// The state of frame `pfn`.
    #[inline(always)]
    pub(crate) fn state(&self, pfn: Pfn) -> &AtomicU8 {
        &self.states()[pfn.0]
    }

    /// Frames in the map (the arena's span, padded to whole runs).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.states().len()
    }

    /// The states of `len` frames from `start`, in frame order.
    #[inline]
    pub(crate) fn range(&self, start: Pfn, len: usize) -> &[AtomicU8] {
        &self.states()[start.0..start.0 + len]
    }

    /// The CPU whose lists last took frames of `pfn`'s run ([`NO_OWNER`] if none did): a hint.
    #[inline]
    pub(crate) fn run_owner(&self, pfn: Pfn) -> u16 {
        self.owners()[pfn.0 >> RUN_ORDER.0].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Names `cpu` the owner of `pfn`'s run, writing the line only when that changes it (the
    /// owners' lines are read by every free of the zone).
    #[inline]
    pub(crate) fn set_run_owner(&self, pfn: Pfn, cpu: u16) {
        let o = &self.owners()[pfn.0 >> RUN_ORDER.0];
        if o.load(std::sync::atomic::Ordering::Relaxed) != cpu {
            o.store(cpu, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(not(loom))]
impl Drop for MemMap {
    fn drop(&mut self) {
        // SAFETY: `base` is the allocation `new` made with this layout, freed once, here.
        unsafe { std::alloc::dealloc(self.raw.base.as_ptr(), self.raw.layout) };
    }
}

/// The frames a state function works on: a zone's, as the zone sees them (`Zone` implements
/// it). The functions below read and claim states through it and ask it which frames are
/// its, so that the frame states know nothing of zones.
pub(crate) trait Frames {
    /// The state byte of frame `pfn`, one of these frames.
    fn state(&self, pfn: Pfn) -> &AtomicU8;
    /// Whether `pfn` is one of these frames.
    fn contains(&self, pfn: Pfn) -> bool;
    /// The largest block order among them.
    fn max_order(&self) -> Order;
}

/// Which frames of a [`MemMap`] a zone is made of, to build it with.
pub(crate) struct ZoneMap {
    map: Arc<MemMap>,
    start: Pfn,
    len: usize,
}

impl ZoneMap {
    /// The `len` frames of `map` from `start`.
    pub(crate) fn new(map: Arc<MemMap>, start: Pfn, len: usize) -> ZoneMap {
        assert!(start.0.checked_add(len).is_some_and(|end| end <= map.len()), "a zone lies inside its map");
        ZoneMap { map, start, len }
    }

    /// The map, the first frame and the number of frames.
    pub(crate) fn into_parts(self) -> (Arc<MemMap>, Pfn, usize) {
        (self.map, self.start, self.len)
    }
}

/// Claims a live block for freeing: `ALLOCATED|order -> NONE` on its head, so exactly one of
/// any number of racing frees wins and every other bad free is refused with its reason.
#[inline]
pub(crate) fn claim(zone: &(impl Frames + ?Sized), pfn: Pfn, order: Order) -> Result<()> {
    match zone.state(pfn).compare_exchange(state(ALLOCATED, order), NONE, Ordering::Acquire, Ordering::Relaxed) {
        Ok(_) => Ok(()),
        Err(s) => Err(classify_bad_free(zone, pfn, order, s)),
    }
}

/// Splits a live block of `order` into `2^order` live order-0 frames (`split_page`): the
/// head's tag goes `ALLOCATED|order -> ALLOCATED|0` with a CAS (so a racing free of the
/// block, or a second split, fails with its reason), then every tail is tagged
/// `ALLOCATED|0`. Nothing else changes: the frames were allocated and stay so. A held block
/// splits into held frames (`ALLOCATED|HELD|0` each): splitting frees nothing, and the
/// holder still holds every frame, which no plain free can then claim either.
pub(crate) fn split(zone: &(impl Frames + ?Sized), pfn: Pfn, order: Order) -> Result<()> {
    let head = zone.state(pfn);
    let mut seen = head.load(Ordering::Relaxed);
    // The held flag as the head has it; again when a hold or unhold changed it meanwhile.
    let flag = loop {
        let flag = seen & HELD;
        let live = state(ALLOCATED | flag, order);
        match head.compare_exchange(live, state(ALLOCATED | flag, Order(0)), Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => break flag,
            Err(s) if s & !HELD == state(ALLOCATED, order) => seen = s,
            // Held or not, the reason is the block's: `s` without the flag.
            Err(s) => return Err(classify_bad_free(zone, pfn, order, s & !HELD)),
        }
    };
    for i in 1..order.pages() {
        // Release: pairs with the Acquire of a later free's claim of this frame.
        zone.state(Pfn(pfn.0 + i)).store(state(ALLOCATED | flag, Order(0)), Ordering::Release);
    }
    Ok(())
}

/// Marks a live block held (`ALLOCATED|order -> ALLOCATED|HELD|order`, a CAS): from then on
/// every plain free of it fails its claim and reports [`Error::Held`], and only
/// [`claim_held`] frees it. Anything else is refused with the reason a free would give (a
/// block already held: [`Error::Held`]); nothing changes then.
pub(crate) fn hold(zone: &(impl Frames + ?Sized), pfn: Pfn, order: Order) -> Result<()> {
    match zone.state(pfn).compare_exchange(
        state(ALLOCATED, order),
        state(ALLOCATED | HELD, order),
        Ordering::AcqRel,
        Ordering::Relaxed,
    ) {
        Ok(_) => Ok(()),
        Err(s) => Err(classify_bad_free(zone, pfn, order, s)),
    }
}

/// Takes a held block back to plain allocated (`ALLOCATED|HELD|order -> ALLOCATED|order`).
/// A block that is not held is refused: [`Error::NotHeld`] for a live one, else the reason
/// a free would give.
pub(crate) fn unhold(zone: &(impl Frames + ?Sized), pfn: Pfn, order: Order) -> Result<()> {
    match zone.state(pfn).compare_exchange(
        state(ALLOCATED | HELD, order),
        state(ALLOCATED, order),
        Ordering::AcqRel,
        Ordering::Relaxed,
    ) {
        Ok(_) => Ok(()),
        Err(s) => Err(classify_bad_held(zone, pfn, order, s)),
    }
}

/// [`claim`] for the holder's free: `ALLOCATED|HELD|order -> NONE`, which exactly one of
/// racing frees wins. A live block that is not held is refused ([`Error::NotHeld`]: the
/// holder's bookkeeping is wrong, and nothing changes), every other bad free as [`claim`]
/// refuses it (a second free of the block: [`Error::DoubleFree`]).
pub(crate) fn claim_held(zone: &(impl Frames + ?Sized), pfn: Pfn, order: Order) -> Result<()> {
    match zone.state(pfn).compare_exchange(state(ALLOCATED | HELD, order), NONE, Ordering::Acquire, Ordering::Relaxed) {
        Ok(_) => Ok(()),
        Err(s) => Err(classify_bad_held(zone, pfn, order, s)),
    }
}

/// Why the holder's free (or unhold) of `order` at `pfn` was refused, given the head's
/// state `s`.
#[cold]
fn classify_bad_held(z: &(impl Frames + ?Sized), pfn: Pfn, order: Order, s: u8) -> Error {
    match (s & HELD != 0, decode(s)) {
        (false, (ALLOCATED, o)) if o == order => Error::NotHeld { pfn },
        (true, (_, o)) => Error::OrderMismatch { pfn, allocated: o, freed: order },
        _ => classify_bad_free(z, pfn, order, s),
    }
}

/// Claims an order-0 frame for a free as `free_check` says, leaving its head state `to`
/// (`NONE` for the locked paths, `PCP` for a push onto the cache). `atomic`: one CAS, so
/// of two racing frees exactly one wins. `sequential`: a load and a store, so a free that
/// happens after another free of this frame sees its tag and fails, while two frees racing
/// on different CPUs (a data race in the caller) may both pass; the pops and drains drop
/// the second copy (see [`take_cached`] and `pcp::free_pcppages_bulk`).
#[inline(always)]
pub(crate) fn claim_order0(z: &(impl Frames + ?Sized), pfn: Pfn, to: u8, atomic: bool) -> Result<()> {
    try_claim_order0(z.state(pfn), to, atomic).map_err(|seen| classify_bad_free(z, pfn, Order(0), seen))
}

/// [`claim_order0`] on the frame's state `entry`, without the error: `Err` carries the state
/// seen instead, for the fast free, which leaves the error to the general path (nothing
/// changed on a failure).
#[inline(always)]
pub(crate) fn try_claim_order0(entry: &AtomicU8, to: u8, atomic: bool) -> Result<(), u8> {
    try_claim(entry, Order(0), to, atomic)
}

/// [`try_claim_order0`] for a block of any `order` (the head `ALLOCATED|order`): the fast
/// free of orders 1 to 3 claims its block straight to `PCP|order` the same way.
#[inline(always)]
pub(crate) fn try_claim(entry: &AtomicU8, order: Order, to: u8, atomic: bool) -> Result<(), u8> {
    let live = state(ALLOCATED, order);
    // Acquire: pairs with the Release of the allocation that handed the frame out. The
    // default (`sequential`) first, the way the fast free falls through.
    if !atomic {
        let s = entry.load(Ordering::Acquire);
        if s != live {
            return Err(s);
        }
        entry.store(to, Ordering::Relaxed);
        return Ok(());
    }
    entry.compare_exchange(live, to, Ordering::Acquire, Ordering::Relaxed).map(drop)
}

/// Takes back the claim of an order-0 frame claimed to the cache's tag (`PCP`) whose push
/// failed, for the locked path: `PCP -> NONE` with a CAS, so that when a caller's racing
/// frees under `free_check = sequential` both claimed it (and the other copy may already
/// be in a cache, popped, or drained), at most one copy goes on. `false`: a racer's copy
/// moved it on; this free leaves it alone. Off the fast path (the cache was full or locked,
/// or the section was interrupted). `NONE` and not `PCP` for the locked path because the
/// buddy must not find a stale per-CPU tag on a frame that merging leaves inside a block.
#[inline]
pub(crate) fn unpush(z: &(impl Frames + ?Sized), pfn: Pfn) -> bool {
    unpush_block(z, pfn, Order(0))
}

/// [`unpush`] for a block of `order`: `PCP|order -> NONE` with a CAS.
#[inline]
pub(crate) fn unpush_block(z: &(impl Frames + ?Sized), pfn: Pfn, order: Order) -> bool {
    let pcp = state(PCP, order);
    z.state(pfn).compare_exchange(pcp, NONE, Ordering::Relaxed, Ordering::Relaxed).is_ok()
}

/// Undoes a fast free's claim to the cache's tag (`PCP|order -> ALLOCATED|order`, a CAS)
/// for a free that is refused after its push gave way (the handle was inherited by a
/// forked child): the block is live again, as before the free. `false`: a racer's copy
/// moved it on meanwhile.
#[cold]
pub(crate) fn unclaim_cached(z: &(impl Frames + ?Sized), pfn: Pfn, order: Order) -> bool {
    z.state(pfn)
        .compare_exchange(state(PCP, order), state(ALLOCATED, order), Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
}

/// Claims a block of `order` leaving a per-CPU list (or the zone's transfer list) for the
/// buddy: `PCP -> NONE` with a CAS, which exactly one copy wins when two racing frees under
/// `free_check = sequential` left copies on two lists. `false`: the copy lost (the other
/// already left with the tag) and is dropped. Acquire: pairs with the free's claim.
#[inline]
pub(crate) fn claim_listed(z: &(impl Frames + ?Sized), pfn: Pfn, order: Order) -> bool {
    z.state(pfn).compare_exchange(state(PCP, order), NONE, Ordering::Acquire, Ordering::Relaxed).is_ok()
}

/// Tags a frame just popped from a per-CPU cache allocated. `false` for a frame whose tag
/// is not `PCP`: the second copy left by two racing frees under `free_check = sequential`,
/// dropped here (the first copy is live or back in the lists).
#[inline(always)]
pub(crate) fn take_cached(states: &[AtomicU8], pfn: Pfn) -> bool {
    take_cached_block(&states[pfn.0], Order(0))
}

/// [`take_cached`] for a block of `order` (`PCP|order -> ALLOCATED|order`), given its head's
/// state.
#[inline(always)]
pub(crate) fn take_cached_block(entry: &AtomicU8, order: Order) -> bool {
    if entry.load(Ordering::Relaxed) != state(PCP, order) {
        return false;
    }
    // Release: pairs with the Acquire of the claim in free_pages.
    entry.store(state(ALLOCATED, order), Ordering::Release);
    true
}

/// A handle's hold on its map: the map's `Arc`, and its states' address and length kept
/// beside it, so that a fast path finds a frame's state with one load for the address (and
/// one for the bound where the frame number is the caller's), where reading them through the
/// `Arc` first loaded the `Arc`'s own pointer: the order-0 pair is bound by its memory
/// operations (see `page_alloc::key`).
pub(crate) struct MapRef {
    states: std::ptr::NonNull<AtomicU8>,
    len: usize,
    /// Held, not read: it keeps the states alive.
    _map: Arc<MemMap>,
}

// SAFETY: a `MapRef` is an `Arc<MemMap>` (Send and Sync: its states are atomics) and a shared
// view of that map's states, which any thread may read.
unsafe impl Send for MapRef {}
// SAFETY: as for `Send`.
unsafe impl Sync for MapRef {}

impl MapRef {
    /// Holds `map`.
    pub(crate) fn new(map: Arc<MemMap>) -> MapRef {
        let s: &[AtomicU8] = map.states();
        MapRef { states: std::ptr::NonNull::from(s).cast(), len: s.len(), _map: map }
    }

    /// Every state, by frame number: a slice to hold in registers across a loop, where the
    /// handle's fields would be loaded again after each atomic store.
    #[inline(always)]
    pub(crate) fn states(&self) -> &[AtomicU8] {
        // SAFETY: the address and length are those of `self._map`'s boxed states, which the
        // `Arc` held here keeps alive, in place (a box's contents never move) and unchanged
        // in length, at least as long as `self`.
        unsafe { std::slice::from_raw_parts(self.states.as_ptr(), self.len) }
    }

    /// The state of frame `pfn`, unchecked: for the frames a per-CPU cache held, which
    /// saves the bound's load on the allocation's path.
    ///
    /// # Safety
    /// `pfn` is below the map's length (a frame of one of the handle's zones).
    #[inline(always)]
    pub(crate) unsafe fn state_unchecked(&self, pfn: Pfn) -> &AtomicU8 {
        debug_assert!(pfn.0 < self.len, "frame {} past the map's {}", pfn.0, self.len);
        // SAFETY: `pfn.0 < len` (the caller's), and the states are alive (see `states`).
        unsafe { &*self.states.as_ptr().add(pfn.0) }
    }

    /// The owner hint of `pfn`'s run (see [`MemMap`]), as the CPU id it names or
    /// [`NO_OWNER`], for a frame the caller has checked against the map's length: the owners
    /// follow the states, so their address is the states' plus the length, both already in
    /// registers after that check (one load, where the map's own field would be another).
    ///
    /// # Safety
    /// `pfn` is below the map's length.
    #[inline(always)]
    pub(crate) unsafe fn run_owner(&self, pfn: usize) -> u16 {
        debug_assert!(pfn < self.len, "frame {pfn} past the map's {}", self.len);
        #[cfg(not(loom))]
        {
            // SAFETY: the map's owners start at its states plus their length (`MemMap::new`,
            // aligned), one per run, so a frame below the length has its run's owner there;
            // the `Arc` keeps them alive.
            unsafe {
                let owners = self.states.as_ptr().add(self.len).cast::<std::sync::atomic::AtomicU16>();
                (*owners.add(pfn >> RUN_ORDER.0)).load(std::sync::atomic::Ordering::Relaxed)
            }
        }
        #[cfg(loom)]
        {
            self._map.run_owner(Pfn(pfn))
        }
    }
}

/// Says why a free of `order` at `pfn` was refused, given the head's state `s`. Reads other
/// frames' states without a lock: this only chooses the error, it changes nothing.
#[cold]
pub(crate) fn classify_bad_free(z: &(impl Frames + ?Sized), pfn: Pfn, order: Order, s: u8) -> Error {
    if s & HELD != 0 {
        // A layer holds the block: no plain free may claim it, whatever order it names.
        return Error::Held { pfn };
    }
    let (tag, o) = decode(s);
    match tag {
        ALLOCATED => return Error::OrderMismatch { pfn, allocated: o, freed: order },
        BUDDY | PCP => return Error::DoubleFree { pfn },
        _ => {}
    }
    // A frame that heads nothing: find the block that covers it, if one is allocated.
    for up in 1..=z.max_order().0 {
        let head = pfn.align_down(Order(up));
        if !z.contains(head) {
            break;
        }
        let (tag, o) = decode(z.state(head).load(Ordering::Relaxed));
        if tag != NONE && head.0 + o.pages() > pfn.0 {
            return if tag == ALLOCATED {
                Error::InteriorFrame { pfn, block: head, order: o }
            } else {
                Error::DoubleFree { pfn }
            };
        }
    }
    Error::DoubleFree { pfn }
}

// The handle is shared across threads: its zones are behind locks and atomics, the rest is
// immutable after construction.
