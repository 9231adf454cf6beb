//! Per-CPU page lists (pcp): per CPU and per zone, stacks of free blocks of orders
//! `0..=PAGE_ALLOC_COSTLY_ORDER`, refilled from and drained to the buddy lists in batches, so
//! that most allocations and frees take no zone lock.
//!
//! Kernel counterpart: `struct per_cpu_pages`, `rmqueue_pcplist`, `rmqueue_bulk`,
//! `free_unref_page_commit`, `free_pcppages_bulk`, `nr_pcp_free`, `nr_pcp_alloc`,
//! `decay_pcp_high`, `zone_batchsize`, `zone_highsize`, `drain_pages_zone` (mm/page_alloc.c,
//! Linux 6.7+ for the auto-tuned `high`).
//!
//! Locking: each `PerCpuPages` has its own lock, taken with a *try*-lock on the allocation and
//! free paths as Linux 6.x's `pcp_spin_trylock`: a thread that finds it held (another thread
//! on the same CPU, or a thread preempted or migrated mid-operation) does not wait but goes to
//! the zone's buddy path. Drains take it blocking (spin, yielding). Lock order: pcp lock, then
//! zone lock; never the reverse. Correctness never depends on which CPU a thread is on: the
//! CPU number only chooses which lists to try.
//!
//! The critical section is shaped for a restartable sequence: pop or push on one list plus a
//! count update, with refills and drains outside the common case, so the lock can later give
//! way to an rseq critical section.
//!
//! Invariant (under the lock): `count == sum(len(lists[o]) << o)`, every block on `lists[o]`
//! has head state `PCP|o`, and after every free `count < high` or a drain has just brought it
//! below; in all cases `count <= high + batch`.
//!
//! This file holds the lists' struct and the lock around them: [`PerCpuPages`], its lock modes
//! ([`PerCpuPages::try_lock`], [`PerCpuPages::lock`], [`PerCpuPages::lock_lists`]), the guard
//! ([`PcpGuard`]) that flushes and refills the rseq cache and accounts the lists' frames, and
//! the fence a remote locker makes. The list algorithms that run under the guard (refill,
//! free, drain, the tuning of `high` and `batch`, the invariant check) are in `lists.rs` and
//! re-exported here; the lock-free critical sections over the cache are in [`rseq`].

use crate::mem_map::{self, PCP};
use crate::sync::{spin_wait, AtomicBool, AtomicU64, AtomicUsize, LockedCell, Ordering};
use crate::types::{Order, Pfn};
pub use crate::types::{PCP_MAX_ORDER, PCP_THP_ORDER};
use crate::vmstat::ZoneStatItem;
use crate::zone::{CpuLists, Transfer, Zone};
use crossbeam_utils::CachePadded;
use std::sync::Arc;

mod lists;
#[cfg(all(test, loom))]
mod loom_tests;
pub mod rseq;

pub use lists::{
    check, check_inbox, check_transfer, decay_high, decay_is_noop, drain, drain_transfer, free_to_pcp, rmqueue_pcplist,
    set_high_and_batch, zone_batchsize, zone_highsize,
};

/// Number of pcp lists counted in `count` (one per order `0..=PCP_MAX_ORDER`).
pub const NR_PCP_LISTS: usize = PCP_MAX_ORDER as usize + 1;
/// Blocks the THP list holds at most: its own bound, beside `high` (see [`PcpInner::thp`]).
pub(crate) const PCP_THP_HIGH: usize = 2;

/// Whether blocks of `order` go through the per-CPU lists (`pcp_allowed_order`): the orders
/// up to `PAGE_ALLOC_COSTLY_ORDER`, and the pageblock order.
#[inline]
pub fn pcp_allowed(order: Order) -> bool {
    order.0 <= PCP_MAX_ORDER || order == PCP_THP_ORDER
}
/// `PCP_BATCH_SCALE_MAX`: the most `free_factor` and the decay step scale a batch by.
pub const PCP_BATCH_SCALE_MAX: u32 = 5;
/// Smallest non-zero `percpu_pagelist_high_fraction` (`MIN_PERCPU_PAGELIST_HIGH_FRACTION`).
pub const MIN_PERCPU_PAGELIST_HIGH_FRACTION: u32 = 8;

/// The fields a lock protects.
#[derive(Debug)]
pub struct PcpInner {
    /// Frames on the lists.
    pub count: usize,
    /// Drain to the buddy when `count` reaches this.
    pub high: usize,
    /// Blocks moved per refill (scaled down by order) and the least a drain moves.
    pub batch: usize,
    /// Lower bound of the auto-tuned `high`.
    pub high_min: usize,
    /// Upper bound of the auto-tuned `high` (equal to `high_min` when the fraction is set).
    pub high_max: usize,
    /// Drains grow by `batch << free_factor` under sustained frees; halved per allocation.
    pub free_factor: u32,
    /// Order-0 refills grow by `batch << alloc_factor` under sustained allocation without
    /// frees (Linux 6.7 `nr_pcp_alloc`); halved per free that reaches the lists.
    pub alloc_factor: u32,
    /// Frames freed since the last allocation refilled the lists.
    pub free_count: usize,
    /// Least `count` seen since the last decay (`count_min`).
    pub count_min: usize,
    /// Frames (the small orders' lists and the cache) as last accounted to the zone's
    /// `nr_zone_pcp_pages` (the THP list's are kept apart: `PerCpuPages::thp_pages`).
    reported: usize,
    /// Frames these lists moved onto the zone's transfer list since the last report, less
    /// those they took from it or returned from it to the buddy: the transfer list's frames
    /// stay counted in `nr_zone_pcp_pages`, so the report adds this to the change of `count`.
    pub(crate) transferred: isize,
    /// The CPU these lists belong to (as `PerCpuPages::cpu`): the owner a refill names for
    /// the runs it takes, and whose frames a free keeps (see `mem_map::MemMap`'s owners).
    pub(crate) cpu: u32,
    /// Whether these lists take part in run ownership: a CPU's local lists (of the zone on
    /// its node, which its fast paths use, `PerCpuPages::routing`), and no other lists of
    /// the CPU. Their refills name their CPU the owner of the runs they take, and their
    /// frees send frames of other CPUs' runs back; another node's CPU's lists of the zone
    /// (which take only that CPU's fallback allocations and its frees of the zone's frames)
    /// do neither. So a run a CPU owns lies in its local lists' span, which the fast free's
    /// section takes on trust when the owner is its CPU.
    pub(crate) routes: bool,
    /// Order-0 frames freed here whose runs another CPU owns, on their way to that CPU's
    /// inbox (`lists::deliver`), tagged `PCP` and counted as this CPU's pcp frames until
    /// then; not in `count`, and fewer than [`OUTBOX_CAP`] after every holder. The locked
    /// half of the outbox: the rseq half (`PerCpuPages::outbox`) is flushed here.
    pub(crate) outbox: Vec<usize>,
    /// Scratch for `lists::deliver`'s grouping by owner (kept to spare an allocation).
    pub(crate) sorting: Vec<u64>,
    lists: [Vec<usize>; NR_PCP_LISTS],
    /// Blocks of [`PCP_THP_ORDER`] (`NR_PCP_THP`), counted apart from `count`: one such block
    /// is 512 frames, more than `high + batch` on most zones, so counting it in `count` (as
    /// Linux does) would make every THP free drain the small orders. Their own rules: a
    /// refill takes `max(batch >> order, 2)` blocks (Linux's), at most [`PCP_THP_HIGH`] stay,
    /// none stay while the zone is below its high watermark, and a block left untouched for a
    /// whole decay interval returns to the buddy.
    thp: Vec<usize>,
    /// Least `thp.len()` seen since the last decay: blocks that sat idle through it.
    thp_min: usize,
}

impl PcpInner {
    /// Blocks on the list of one order.
    pub fn list_len(&self, order: Order) -> usize {
        if order == PCP_THP_ORDER {
            return self.thp.len();
        }
        self.lists[order.0 as usize].len()
    }

    /// The order-0 list, oldest first: for tests.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn order0_list(&self) -> &[usize] {
        &self.lists[0]
    }

    /// Blocks on the order-0 list: for the loom models.
    #[cfg(all(test, loom))]
    pub(crate) fn order0_list_len(&self) -> usize {
        self.lists[0].len()
    }

    /// Frames on every list, the THP list's included (what `nr_zone_pcp_pages` counts).
    pub fn pages(&self) -> usize {
        self.count + (self.thp.len() << PCP_THP_ORDER.0)
    }

    /// Frames these lists hold under their lock: every list's and the locked outbox's.
    pub fn held(&self) -> usize {
        self.pages() + self.outbox.len()
    }
}

/// Frames of room each order's list starts with at most (orders above 0 a share of it):
/// two refills of whole runs (`mem_map::RUN_ORDER`, 128 frames) for order 0.
const LIST_START: usize = 256;

/// Blocks the rseq *outbox* of one pcp holds at most: order-0 frames the fast free took on
/// this CPU whose runs another CPU owns, pushed by the same section as a local free at other
/// offsets ([`PerCpuPages::outbox`]), handed to their owners in one locked step per this
/// many (`lists::deliver`). The locked outbox (`PcpInner::outbox`) is delivered at this
/// length too.
pub(crate) const OUTBOX_CAP: usize = 64;

/// Frames a CPU's inbox ([`PerCpuPages::inbox`]) holds at most: other CPUs' deliveries of
/// frames of its runs, which its next order-0 refill takes first. The bound is the owner's
/// `high` within [`INBOX_MIN`] and this ([`PerCpuPages::inbox_cap`]): frames waiting there
/// are the owner's per-CPU pages, so a zone whose lists may hold thousands lets its inboxes
/// hold as many (within 4 MiB), and a small one keeps them small. A delivery past it goes to
/// the zone's transfer list, or the buddy, as a drain past `high` does. At 256 frames, in
/// `bench mixed` a fifth of the frames crossing CPUs overflowed there, and whichever CPU took
/// them from the transfer list took their runs, so that both CPUs' frees of them crossed
/// again and a hand-off of 64 frames touched 20–35 state lines instead of 3–8.
pub(crate) const INBOX_CAP: usize = 16 * OUTBOX_CAP;

/// The least bound of an inbox (see [`INBOX_CAP`]).
pub(crate) const INBOX_MIN: usize = 4 * OUTBOX_CAP;

/// Blocks the rseq front cache of one pcp holds at most: room for a bulk call of 128 frames
/// and its free, in one critical section per 64.
pub const CACHE_CAP: usize = 256;

/// Blocks a lock holder moves from the order-0 list into the cache on unlock. Small, because
/// every locked operation first flushes the cache: the frees fill it the rest of the way.
const CACHE_FILL: usize = 32;

/// Blocks an order-0 allocation's holder moves into the cache on unlock
/// ([`PcpGuard::fill_for_allocations`]): its sections had popped the cache dry, so more
/// allocations likely follow, and a stream of them with no frees on this CPU (the allocating
/// side of a producer and consumer, `bench cross`) now takes the lock once per refill
/// rather than once per `CACHE_FILL` frames. Half the cache, leaving the frees room.
const CACHE_REFILL: usize = CACHE_CAP / 2;

/// The layout of a pcp's cache word, the one word every critical section commits: the
/// cache's length, and two event counts the single order-0 paths keep in their commit
/// instead of a read-modify-write of their own (which cost the pair 0.8 ns of 8.8): frames
/// popped by `pop_local` (the single allocation, `pgalloc` with the NUMA hit and local) and
/// frames pushed by `push_frame` (the single free, `pgfree`). Each count is 24 bits wide;
/// a section that counts gives way when its count's top bit is set, so no count carries
/// into the next field, and the locked path it falls back to folds both into
/// `PerCpuPages::folded` (as every fenced lock holder does), once per 2^23 frames at most.
/// The other sections change the length alone, by at most `CACHE_CAP`.
pub(crate) mod word {
    /// The length's bits.
    pub(crate) const LEN: u64 = 0xFFFF;
    /// Where the count of `pop_local`'s frames starts.
    pub(crate) const POPS_SHIFT: u32 = 16;
    /// Where the count of `push_frame`'s frames starts.
    pub(crate) const PUSHES_SHIFT: u32 = 40;
    /// A count's bits (at its shift).
    pub(crate) const COUNT: u64 = (1 << 24) - 1;
    /// The top bit of the pops' count: `pop_local` and `pop` give way when it is set.
    pub(crate) const POPS_GUARD: u32 = POPS_SHIFT + 23;
    /// What `pop_local`'s commit adds: one pop counted, the length one shorter.
    pub(crate) const POP_LOCAL: u64 = (1 << POPS_SHIFT) - 1;
    /// What `push_frame`'s commit adds: one push counted, the length one longer.
    pub(crate) const PUSH_FRAME: u64 = (1 << PUSHES_SHIFT) + 1;
}

const _: () = assert!(CACHE_CAP as u64 <= word::LEN);

/// Blocks each cache of orders 1 to 3 (the small orders above 0) holds at most. A pair
/// needs one; a run of frees a few more before the lock.
pub(crate) const SMALL_CACHE_CAP: usize = 16;

/// Blocks a holder of orders 1 to 3 moves from its order's list into that order's cache on
/// unlock (half the cache, leaving the frees room).
const SMALL_CACHE_FILL: usize = SMALL_CACHE_CAP / 2;

/// The bits (one per order, `1 << order`) of every cache of orders 1 to 3.
const SMALL_ORDERS: u8 = ((1u16 << (PCP_MAX_ORDER + 1)) - 2) as u8;

/// Blocks the rseq cache of the pageblock order (`PerCpuPages::thp_cache`) holds at most:
/// the THP list's own bound, which the list and its cache share.
pub(crate) const THP_CACHE_CAP: usize = PCP_THP_HIGH;

/// The index of the THP cache's first slot in `PerCpuPages::cache`, after the small orders'.
const THP_FIRST_SLOT: usize = CACHE_CAP + (NR_PCP_LISTS - 1) * SMALL_CACHE_CAP;

/// The rseq cache of one order from 1 to [`PCP_MAX_ORDER`]: its word and bound, beside
/// each other so that a push reads both from one line; its slots follow the order-0
/// cache's (`PerCpuPages::small_slots`). The word is laid out as the order-0 cache's
/// ([`word`]): the length, and the blocks the sections popped and pushed, which count
/// `pgalloc` and `pgfree` (times the block's frames) in the commit, for free.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct SmallCache {
    /// The length and the two counts ([`word`]); a section commits it.
    word: AtomicU64,
    /// The most blocks the cache may hold (at most [`SMALL_CACHE_CAP`]), so that `count`
    /// and every cache's frames stay within `high + batch`; set by lock holders.
    limit: AtomicUsize,
}

impl SmallCache {
    /// Blocks in the cache.
    #[inline]
    fn len(&self) -> usize {
        (self.word.load(Ordering::Relaxed) & word::LEN) as usize
    }

    /// Sets the length, keeping the counts (lock held, no section able to commit).
    #[inline]
    fn set_len(&self, n: usize) {
        let w = self.word.load(Ordering::Relaxed);
        self.word.store((w & !word::LEN) | n as u64, Ordering::Relaxed);
    }

    /// Whether the cache is empty with a zero bound: no section can commit to it (a pop
    /// finds nothing, a push no room).
    #[inline]
    fn closed(&self) -> bool {
        self.len() == 0 && self.limit.load(Ordering::Relaxed) == 0
    }
}

const _: () = assert!(SMALL_CACHE_CAP as u64 <= word::LEN);

/// One CPU's lists for one zone. Aligned to 128 bytes (two cache lines, the unit of the
/// adjacent-line prefetcher) so that no two CPUs' lists share a line, and so that per-CPU
/// statistics, kept in their own array, never dirty these lines (seed 002).
///
/// In front of the order-0 list sits a small *cache* of order-0 blocks that restartable
/// sequences pop and push without any lock ([`rseq`]); the lock-based code never sees it:
/// a holder that works on the cache ([`PerCpuPages::lock`], [`PerCpuPages::try_lock`]) first
/// flushes it into the lists ([`PcpGuard::with`]) and, after its work, refills it and sets
/// the bound (`cache_limit`) that keeps `count + cache <= high + batch`. A critical section
/// gives way (aborts to the locked path) whenever the lock is held; such a locker on another
/// CPU first fences that CPU with `membarrier`, so no critical section that began before the
/// lock was taken can commit. A holder that only reads the lists or folds their counter
/// ([`PerCpuPages::lock_lists`]) never touches the cache and needs no fence.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct PerCpuPages {
    /// The zone's `Zone::above_low`, copied here by the zone (under its lock, when it
    /// flips: `ZoneLists::install`): the allocation sections' watermark test. It lies just
    /// before `lock`, so that a section reads both with one 16-bit load (`gate | lock << 8`,
    /// see `rseq::x86_64`), where it read the lock byte, the zone's address and then its
    /// byte. 0 (no allocation pops) until the zone has its lists.
    gate: std::sync::atomic::AtomicU8,
    lock: AtomicBool,
    /// Whether restartable sequences may run on these lists: with rseq in this process, and
    /// unless their CPU is virtual (`Topology::is_virtual`), where no thread runs by itself.
    /// Without, the caches and the outbox stay shut (empty, bound 0), so that no holder
    /// flushes, fills or fences them (a fence of a CPU the machine lacks is a refused
    /// syscall per lock), as under `ZONAL_NO_RSEQ`. In the padding before `cpu`: the fields
    /// the sections read keep their offsets.
    sections: bool,
    /// A copy of [`PcpInner::routes`], read without the lock (it never changes after
    /// [`PerCpuPages::routing`]). In the padding, as `sections`.
    routes: bool,
    /// The CPU these lists belong to.
    cpu: u32,
    /// The frames of the zone these lists serve, `[span_start, span_start + span_pages)`
    /// (the zone's span, which no other zone's overlaps): the fast free pushes a frame onto
    /// the current CPU's local lists when it lies there (`rseq::push_frame`). Empty until
    /// the lists are given their zone (`watching`); a stand-in's bytes, all 1, make a
    /// span above any frame.
    span_start: usize,
    span_pages: usize,
    /// The cache's length (bits 0-15) and the frames the single order-0 paths' sections
    /// moved, each counted by its commit: popped by `pop_local` (bits 16-39) and pushed by
    /// `push_frame` (bits 40-63). See [`word`].
    cache_word: AtomicU64,
    cache_limit: AtomicUsize,
    /// Frames on the lists and the locked outbox (`PcpInner::held`: `count`, the THP list,
    /// the outbox) as of the last unlock, readable without the lock (drains skip empty
    /// lists).
    count_hint: AtomicUsize,
    /// `high` and `batch` as of the last unlock (`high | batch << 32`, each saturated to
    /// 32 bits), so that reports read a pageset without the lock the allocation paths take.
    shape_hint: AtomicU64,
    /// The caches' and the rseq outbox's frames as of the last unlock: what the zone
    /// counters know of them. A snapshot adds the churn since (`PerCpuPages::unsettled`).
    cache_settled: AtomicUsize,
    /// Whether, as of the last unlock, a `decay_high` would change nothing (see
    /// [`decay_is_noop`]): with no cache churn since, the worker skips these lists
    /// (`decay_pcp_high` skips idle lists) instead of locking and fencing them.
    decay_idle: AtomicBool,
    inner: LockedCell<PcpInner>,
    /// The rseq caches of orders 1 to [`PCP_MAX_ORDER`], `[order - 1]`, after the fields
    /// the order-0 paths read (their slots are in `cache`, after the order-0 cache's).
    small: [SmallCache; NR_PCP_LISTS - 1],
    /// The rseq cache of the pageblock order ([`PCP_THP_ORDER`]), laid out as the small
    /// orders' and right after them, so that a section finds it as the fourth
    /// (`rseq::x86_64`); its slots follow theirs. Its blocks belong to the THP list: counted
    /// apart from `count` (in [`PerCpuPages::thp_pages`]), within the list's bound together
    /// with it, and moved only by the THP list's holders ([`PerCpuPages::try_lock_thp`]) and
    /// by the holders that flush every cache (drains, decay, tuning, the bulk calls).
    thp_cache: SmallCache,
    /// The caches' slots: the order-0 cache's `CACHE_CAP`, then `SMALL_CACHE_CAP` per order
    /// 1 to 3, then the THP cache's `THP_CACHE_CAP`. In the struct, so that a section
    /// addresses a slot from the lists' address with no load of the slots' own (a load the
    /// order-0 pair, bound by its memory operations, paid twice). Where they were before the
    /// outbox: with the slots moved next to the word (so that the outbox could be the
    /// cache's code at another offset), the pair measured 10–15% slower in `bench single`.
    cache: [AtomicUsize; CACHE_SLOTS],
    /// The outbox's word, laid out as `cache_word` (the length, and the pushes counted as
    /// `pgfree`, see [`word`]): the fast free's section commits it for a frame whose run
    /// another CPU owns (`mem_map::MemMap`'s owners), where it commits `cache_word` for one
    /// of this CPU's runs.
    outbox_word: AtomicU64,
    /// The most frames the outbox may hold (0 until a lock holder opens it, then
    /// [`OUTBOX_CAP`]).
    outbox_limit: AtomicUsize,
    /// The outbox's slots. Lock holders that flush the cache move them to
    /// `PcpInner::outbox`, which goes to the owners' inboxes (`lists::deliver`).
    outbox: [AtomicUsize; OUTBOX_CAP],
    // The fields below sat before `inner` until the outbox: the locked outbox grew
    // `PcpInner` by 56 bytes, and these (56 bytes, which only lock holders and event readers
    // touch) moved here so that `cache` stays at offset 400, where it was measured.
    /// `membarrier` calls made to fence this CPU's sections (the `pcp_fence` event), written
    /// under the lock when a holder fences.
    fences: AtomicU64,
    /// The frames of this zone the CPU allocated and freed outside the caches' words
    /// (`pgalloc_normal` and `pgfree` of the locked and slow paths, as Linux counts
    /// `PGALLOC` by zone): with the words' counts, a zone's pages allocated and freed
    /// ([`Zonal::zone_page_events`](crate::Zonal::zone_page_events)). Written by the
    /// CPU's own paths as its event counters are (a load and a store), read by reports.
    slow_counts: [AtomicU64; 2],
    /// Frames on the THP list as of the last unlock. They are not in the zone's
    /// `nr_zone_pcp_pages` counter: every move of a 512-frame block would pass the per-CPU
    /// diff's threshold and fold into the zone's shared line, two atomic adds per pair on a
    /// line every CPU of the zone writes; the zone's readers add these instead
    /// (`Zonal::zone_page_state_snapshot`).
    thp_hint: AtomicUsize,
    /// The fast counts folded out of `cache_word` under the lock: pops, pushes.
    folded: [AtomicU64; 2],
    /// The frames the caches of orders 1 to 3 counted (blocks times their frames), folded
    /// out of their words under the lock: popped, pushed.
    folded_small: [AtomicU64; 2],
    /// Odd while a holder folds the counts (a sequence lock for their readers).
    fold_seq: AtomicU64,
    /// The inbox: order-0 frames of runs this CPU owns that other CPUs freed and delivered
    /// (`lists::deliver`), at most [`PerCpuPages::inbox_cap`], tagged `PCP` and counted as
    /// per-CPU pages, which this CPU's next order-0 refill takes first. Under a lock of its
    /// own (taken under a pcp lock, the delivering CPU's or this one's, never with another
    /// inbox, the transfer list or the zone lock), on lines of its own: every other CPU of
    /// the zone writes it.
    inbox: CachePadded<Transfer>,
}

/// Slots of every cache of a [`PerCpuPages`].
const CACHE_SLOTS: usize = THP_FIRST_SLOT + THP_CACHE_CAP;

const _: () = assert!(
    std::mem::offset_of!(PerCpuPages, thp_cache)
        == std::mem::offset_of!(PerCpuPages, small) + (NR_PCP_LISTS - 1) * std::mem::size_of::<SmallCache>()
);

// `sections` fills padding: the CPU, and every field after it, kept its offset (loom's atomics
// are larger, and no section runs there).
#[cfg(not(loom))]
const _: () = assert!(std::mem::offset_of!(PerCpuPages, cpu) == 4);
const _: () = assert!(std::mem::size_of::<PerCpuPages>() % 128 == 0);
const _: () = assert!(std::mem::align_of::<PerCpuPages>() == 128);

// SAFETY: `inner` is only reached through a `PcpGuard`, which exists only while `lock` is
// held by its creator, so accesses from different threads never overlap; the caches are
// made of atomics.
unsafe impl Sync for PerCpuPages {}
// SAFETY: as above; nothing in the struct is tied to the thread that built it.
unsafe impl Send for PerCpuPages {}

/// A zone's per-CPU lists: CPU c's are `pcps[first + c * stride]` (the handle keeps the
/// lists of every zone for one CPU together, `first` the zone's id and `stride` the zones).
/// The zone holds them as [`CpuLists`], to keep their gates; this layer reaches them back
/// through [`ZoneListsOf::lists`].
pub(crate) struct ZoneLists {
    pcps: Arc<[PerCpuPages]>,
    first: usize,
    stride: usize,
}

impl ZoneLists {
    /// Gives `zone` its lists in `pcps` (every zone's, `stride` zones per CPU).
    pub(crate) fn install(zone: &Zone, pcps: Arc<[PerCpuPages]>, stride: usize) {
        zone.install_lists(Arc::new(ZoneLists { pcps, first: zone.id.0 as usize, stride }));
    }

    fn iter(&self) -> impl Iterator<Item = &PerCpuPages> {
        self.pcps.iter().skip(self.first).step_by(self.stride.max(1))
    }

    /// CPU `cpu`'s lists, `None` for a CPU the handle does not have.
    #[inline]
    fn get(&self, cpu: usize) -> Option<&PerCpuPages> {
        self.pcps.get(self.first + cpu.checked_mul(self.stride.max(1))?)
    }
}

impl CpuLists for ZoneLists {
    fn set_gates(&self, level: u8) {
        for p in self.iter() {
            p.set_gate(level);
        }
    }

    fn gate_mismatch(&self, level: u8) -> Option<(usize, u8)> {
        self.iter().find(|p| p.gate() != level).map(|p| (p.cpu(), p.gate()))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A zone's lists of one CPU, through the [`ZoneLists`] the handle installed.
pub(crate) trait ZoneListsOf {
    /// CPU `cpu`'s lists of this zone; `None` before the handle installed them (lists built
    /// apart from a handle, in tests) and for a CPU the handle does not have.
    fn lists(&self, cpu: usize) -> Option<&PerCpuPages>;
}

impl ZoneListsOf for Zone {
    #[inline]
    fn lists(&self, cpu: usize) -> Option<&PerCpuPages> {
        self.cpu_lists()?.as_any().downcast_ref::<ZoneLists>()?.get(cpu)
    }
}

impl PerCpuPages {
    /// Lists of `cpu` with the given batch and bounds; `high` starts at `high_min`. They
    /// serve no zone's fast paths until [`PerCpuPages::watching`] gives them their zone.
    pub fn new(cpu: u32, batch: usize, high_min: usize, high_max: usize) -> PerCpuPages {
        // Room for what the lists may hold at their largest, up to LIST_START frames: past
        // that they grow as they fill (a reallocation under the lock, a few times per list
        // in its life). Reserved whole, 256 CPUs' lists of 8 zones of 4 GiB took 187 MiB,
        // 22 bytes per managed frame, for frames hardly ever on them (`bench scale`).
        let cap = |o: usize| ((high_max + (batch << PCP_BATCH_SCALE_MAX)) >> o).min(LIST_START >> o) + 4;
        PerCpuPages {
            gate: std::sync::atomic::AtomicU8::new(0),
            lock: AtomicBool::new(false),
            sections: rseq::enabled(),
            routes: false,
            cpu,
            span_start: 0,
            span_pages: 0,
            cache_word: AtomicU64::new(0),
            cache_limit: AtomicUsize::new(0),
            count_hint: AtomicUsize::new(0),
            shape_hint: AtomicU64::new(shape(high_min, batch)),
            cache_settled: AtomicUsize::new(0),
            decay_idle: AtomicBool::new(false),
            fences: AtomicU64::new(0),
            slow_counts: [AtomicU64::new(0), AtomicU64::new(0)],
            thp_hint: AtomicUsize::new(0),
            folded: [AtomicU64::new(0), AtomicU64::new(0)],
            folded_small: [AtomicU64::new(0), AtomicU64::new(0)],
            fold_seq: AtomicU64::new(0),
            inner: LockedCell::new(PcpInner {
                count: 0,
                high: high_min,
                batch,
                high_min,
                high_max,
                free_factor: 0,
                alloc_factor: 0,
                free_count: 0,
                count_min: 0,
                reported: 0,
                transferred: 0,
                cpu,
                routes: false,
                // Only lists that route frees use these (`routing`).
                outbox: Vec::new(),
                sorting: Vec::new(),
                lists: std::array::from_fn(|o| Vec::with_capacity(cap(o))),
                thp: Vec::with_capacity(PCP_THP_HIGH + 1),
                thp_min: 0,
            }),
            small: Default::default(),
            thp_cache: SmallCache::default(),
            cache: std::array::from_fn(|_| AtomicUsize::new(0)),
            outbox_word: AtomicU64::new(0),
            outbox_limit: AtomicUsize::new(0),
            outbox: std::array::from_fn(|_| AtomicUsize::new(0)),
            // Its zone's start comes with the zone (`watching`): lists that never watch one
            // never route, so nothing reaches their inbox.
            inbox: CachePadded::new(Transfer::new(0)),
        }
    }

    /// These lists given their zone's span, which the fast free's section reads (their
    /// gate, the allocation sections' watermark test, the zone keeps: `ZoneLists::install`).
    pub fn watching(mut self, zone: &Zone) -> PerCpuPages {
        (self.span_start, self.span_pages) = (zone.start_pfn.0, zone.spanned);
        self.inbox = CachePadded::new(Transfer::new(zone.start_pfn.0));
        self
    }

    /// These lists of a virtual CPU (`Topology::is_virtual`): no thread runs there by
    /// itself, so no section ever does, and their caches stay shut (see the field
    /// `sections`); only a thread acting as the CPU reaches them, on the locked path.
    pub fn virtual_cpu(mut self) -> PerCpuPages {
        self.sections = false;
        self
    }

    /// These lists made a party to run ownership ([`PcpInner::routes`]): their CPU's local
    /// lists (of the zone on its node), and no other lists of the CPU.
    pub fn routing(mut self) -> PerCpuPages {
        self.routes = true;
        // SAFETY: `self` is owned here, so no guard (nor any other access) exists.
        unsafe {
            self.inner.with_mut(|i| {
                i.routes = true;
                i.outbox.reserve(2 * OUTBOX_CAP);
                // Room for a delivery's keys; a take from the inbox grows it once, as far
                // as its radix sort needs (`lists::highest_first`).
                i.sorting.reserve(2 * OUTBOX_CAP);
            })
        };
        self
    }

    /// Whether these lists send frames of other CPUs' runs to their owners (see
    /// [`PerCpuPages::routing`]).
    #[inline]
    pub fn routes(&self) -> bool {
        self.routes
    }

    /// The gate: the zone's `above_low` level as last copied here.
    pub fn gate(&self) -> u8 {
        self.gate.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the gate (by the zone, under its lock).
    pub(crate) fn set_gate(&self, level: u8) {
        self.gate.store(level, std::sync::atomic::Ordering::Relaxed);
    }

    /// `pcp_spin_trylock`: the lists if no one holds them, with the cache flushed into them
    /// for the guard's work (fencing the lists' CPU first if need be). `zone` is the zone
    /// these lists belong to, whose counters the guard keeps up to date.
    #[inline]
    pub fn try_lock<'a>(&'a self, zone: &'a Zone) -> Option<PcpGuard<'a>> {
        self.try_lock_with(zone, Cache::Flush)
    }

    /// [`PerCpuPages::try_lock`] for a holder that never takes from or gives to the order-0
    /// list but the drains (the allocations and frees of orders 1 to 3): the cache stays where
    /// it is and only counts, in `count`, while the holder's `f` runs, so its decisions
    /// (refill room, `high`, drains) are those of a flushed cache, and its bound is set again
    /// after. Moving up to 256 blocks out and 32 back cost these orders more than the rest of
    /// their pair.
    #[inline]
    pub fn try_lock_small_orders<'a>(&'a self, zone: &'a Zone) -> Option<PcpGuard<'a>> {
        self.try_lock_with(zone, Cache::Count)
    }

    /// [`PerCpuPages::try_lock`] for a free of other CPUs' frames whose push found the rseq
    /// outbox full: the outbox moves to the locked one for the holder's delivery, and every
    /// cache stays where it is and counts in `count`, as under
    /// [`PerCpuPages::try_lock_small_orders`]. Flushing the order-0 cache there sent up to 256
    /// frames to the list and 32 back, so each batch of foreign frees cost the CPU's own
    /// allocations a refill soon after.
    #[inline]
    pub fn try_lock_outbox<'a>(&'a self, zone: &'a Zone) -> Option<PcpGuard<'a>> {
        self.try_lock_with(zone, Cache::Outbox)
    }

    #[inline]
    fn try_lock_with<'a>(&'a self, zone: &'a Zone, mode: Cache) -> Option<PcpGuard<'a>> {
        if self.lock.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            let cache = if self.fence_remote() { mode } else { Cache::Leave };
            Some(PcpGuard { pcp: self, zone, cache, allocating: false, small: 0, keep_small: false })
        } else {
            None
        }
    }

    /// Takes the lock as [`PerCpuPages::try_lock`] does, waiting (yielding) while another
    /// thread holds it: for drains, decay and tuning, never for the allocation paths.
    pub fn lock<'a>(&'a self, zone: &'a Zone) -> PcpGuard<'a> {
        loop {
            if let Some(g) = self.try_lock(zone) {
                return g;
            }
            spin_wait();
        }
    }

    /// Takes the lock, waiting, for a holder that reads the lists or folds their counter but
    /// never touches the cache: reports and the periodic fold. It needs no fence on any CPU:
    /// a critical section that read the lock free before it was taken may still commit, but
    /// that changes only the cache word and the slots, which this holder reads once (relaxed)
    /// to account the cache's churn, as [`PerCpuPages::unsettled`] does.
    pub fn lock_lists<'a>(&'a self, zone: &'a Zone) -> PcpGuard<'a> {
        loop {
            if let Some(g) = self.try_lock_lists(zone) {
                return g;
            }
            spin_wait();
        }
    }

    /// The try-lock of the THP list's allocations and frees ([`PcpGuard::with_thp`]): they
    /// never touch the other caches, so those need neither a flush nor a fence; the THP
    /// cache is flushed into the list before the holder's work and filled from it after,
    /// once no section can commit to it (as [`PerCpuPages::fence_remote`] decides, for that
    /// cache alone). Where that cannot be made sure (no fence), the holder works on the list
    /// alone and leaves the cache as it is.
    #[inline]
    pub fn try_lock_thp<'a>(&'a self, zone: &'a Zone) -> Option<PcpGuard<'a>> {
        let mut g = self.try_lock_lists(zone)?;
        if self.sections && (self.thp_cache.closed() || crate::sys::rseq_cpu_id() == Some(self.cpu) || self.fence()) {
            g.cache = Cache::Thp;
        }
        Some(g)
    }

    /// [`PerCpuPages::lock_lists`] without waiting: for the holders that never touch a cache.
    #[inline]
    pub fn try_lock_lists<'a>(&'a self, zone: &'a Zone) -> Option<PcpGuard<'a>> {
        // `then`, not `then_some`: a guard built for a failed attempt would unlock, on drop,
        // the lock its holder has.
        self.lock.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok().then(|| PcpGuard {
            pcp: self,
            zone,
            cache: Cache::Leave,
            allocating: false,
            small: 0,
            keep_small: false,
        })
    }

    /// Whether a `decay_high` would change these lists: not as of the last unlock, and the
    /// cache has not moved since, and the inbox is empty (a lock-free hint, for the worker).
    pub fn needs_decay(&self) -> bool {
        !self.decay_idle.load(Ordering::Relaxed)
            || self.unsettled() != 0
            || self.thp_cached() != 0
            || self.inbox.len_hint() != 0
    }

    /// Prefetches the lines [`PerCpuPages::needs_decay`] and [`PerCpuPages::unsettled`]
    /// read of every lists, for a housekeeping sweep that tests these lists next. Lists
    /// whose sections run also have their caches' words read; whether they do is on the
    /// first line, which the prefetch must not wait for, so those are left to the demand.
    #[inline]
    pub(crate) fn prefetch_idle_test(&self) {
        crate::sync::prefetch_read(&self.cache_word);
        crate::sync::prefetch_read(&self.decay_idle);
        crate::sync::prefetch_read(&*self.inbox);
    }

    /// The inbox (see the field): other CPUs' frees of this CPU's runs.
    #[inline]
    pub(crate) fn inbox(&self) -> &Transfer {
        &self.inbox
    }

    /// `membarrier` calls made to fence this CPU's critical sections.
    pub fn fences(&self) -> u64 {
        self.fences.load(Ordering::Relaxed)
    }

    /// Frames other CPUs freed of these lists' runs and handed to their inbox (the
    /// `pcp_routed` event), since the lists were made.
    pub fn routed(&self) -> u64 {
        self.inbox.received()
    }

    /// Checks the cache's blocks (each a frame of `zone` tagged `PCP|0`); returns how many
    /// there are. Call only while no allocation or free runs on these lists (it reads the
    /// cache without the fence a concurrent section would need).
    pub fn check_cache(&self, zone: &Zone) -> Result<usize, String> {
        let n = self.cache_len().min(CACHE_CAP);
        for slot in &self.cache[..n] {
            let pfn = Pfn(slot.load(Ordering::Relaxed));
            if !zone.contains(pfn) {
                return Err(format!("zone {}: cpu {} cache holds {:#x}, not of the zone", zone.id.0, self.cpu, pfn.0));
            }
            let s = zone.state(pfn).load(Ordering::Relaxed);
            if s != mem_map::state(PCP, Order(0)) {
                return Err(format!("zone {}: cpu {} cache block {:#x} has state {s:#x}", zone.id.0, self.cpu, pfn.0));
            }
        }
        let mut frames = n;
        for o in 1..=PCP_MAX_ORDER {
            let order = Order(o);
            let c = self.small_cache(order);
            let (len, limit) = (c.len(), c.limit.load(Ordering::Relaxed));
            if len > SMALL_CACHE_CAP || limit > SMALL_CACHE_CAP {
                return Err(format!(
                    "zone {}: cpu {} order-{o} cache holds {len} blocks, bound {limit}, above {SMALL_CACHE_CAP}",
                    zone.id.0, self.cpu
                ));
            }
            self.check_blocks(zone, &self.small_slots(order)[..len], order)?;
            frames += len << o;
        }
        Ok(frames)
    }

    /// Checks the rseq outbox's frames (each a frame of `zone` tagged `PCP|0`) and its bound;
    /// returns how many there are. As [`PerCpuPages::check_cache`], while no allocation or
    /// free runs on these lists.
    pub fn check_outbox(&self, zone: &Zone) -> Result<usize, String> {
        let (len, limit) = (self.outbox_len(), self.outbox_limit.load(Ordering::Relaxed));
        if len > OUTBOX_CAP || limit > OUTBOX_CAP {
            return Err(format!(
                "zone {}: cpu {} outbox holds {len} frames, bound {limit}, above {OUTBOX_CAP}",
                zone.id.0, self.cpu
            ));
        }
        self.check_blocks(zone, &self.outbox[..len], Order(0))?;
        Ok(len)
    }

    /// Checks the THP cache's blocks (each a block of `zone` of [`PCP_THP_ORDER`], tagged
    /// `PCP|order`) and that with the `listed` blocks of the THP list it keeps within the
    /// list's bound; returns its frames. As [`PerCpuPages::check_cache`], while no
    /// allocation or free runs on these lists.
    pub fn check_thp_cache(&self, zone: &Zone, listed: usize) -> Result<usize, String> {
        let (len, limit) = (self.thp_cache.len(), self.thp_cache.limit.load(Ordering::Relaxed));
        if limit > THP_CACHE_CAP || len > THP_CACHE_CAP || len + listed > PCP_THP_HIGH {
            return Err(format!(
                "zone {}: cpu {} THP cache holds {len} blocks (bound {limit}) beside {listed} on the list, \
                 above {PCP_THP_HIGH}",
                zone.id.0, self.cpu
            ));
        }
        self.check_blocks(zone, &self.cache[THP_FIRST_SLOT..THP_FIRST_SLOT + len], PCP_THP_ORDER)?;
        Ok(len << PCP_THP_ORDER.0)
    }

    /// Checks that every block in `slots` (a cache of `order`, or the outbox) is an aligned
    /// block of `zone` tagged `PCP|order`.
    fn check_blocks(&self, zone: &Zone, slots: &[AtomicUsize], order: Order) -> Result<(), String> {
        let o = order.0;
        for slot in slots {
            let pfn = Pfn(slot.load(Ordering::Relaxed));
            if !zone.contains(pfn) || !pfn.is_aligned(order) {
                return Err(format!(
                    "zone {}: cpu {} order-{o} cache holds {:#x}, not a block of the zone",
                    zone.id.0, self.cpu, pfn.0
                ));
            }
            let s = zone.state(pfn).load(Ordering::Relaxed);
            if s != mem_map::state(PCP, order) {
                return Err(format!(
                    "zone {}: cpu {} order-{o} cache block {:#x} has state {s:#x}",
                    zone.id.0, self.cpu, pfn.0
                ));
            }
        }
        Ok(())
    }

    /// Frames in the caches and the rseq outbox that the zone counters do not know of yet
    /// (negative: frames that left them): the lock-free churn since the last unlock.
    pub fn unsettled(&self) -> isize {
        self.section_frames() as isize - self.cache_settled.load(Ordering::Relaxed) as isize
    }

    /// Frames the sections move without the lock: the caches' and the rseq outbox's (none
    /// without rseq).
    #[inline]
    fn section_frames(&self) -> usize {
        if self.sections {
            self.frames_in_caches() + self.outbox_len()
        } else {
            0
        }
    }

    /// Frames in the rseq outbox.
    #[inline]
    pub fn outbox_len(&self) -> usize {
        (self.outbox_word.load(Ordering::Relaxed) & word::LEN) as usize
    }

    /// The CPU these lists belong to.
    pub fn cpu(&self) -> usize {
        self.cpu as usize
    }

    /// After taking the lock for a holder that flushes and fills the cache: unless this
    /// thread is certainly on the lists' CPU, a critical section may be running there that
    /// read the lock before it was taken; restart it. Returns whether the holder may touch
    /// the cache (false only when no fence could be made).
    ///
    /// An empty cache with a zero bound needs no fence: no section can change it (a pop
    /// finds nothing, a push finds no room), and one that read an older, non-empty state
    /// would have had to commit before the cache could read empty. An empty cache with room
    /// does: a push that read the lock free could commit after the holder read the length,
    /// and the refill would write over it.
    ///
    /// The CPU is known for certain only from the kernel-written `cpu_id` of this thread,
    /// read after the lock was taken: if it names the lists' CPU, this thread runs there, so
    /// every other thread's section on that CPU has been preempted since it read the lock
    /// (and restarts, finding it held) or had committed before this thread got the CPU (and
    /// the switch made its stores visible). A guessed id (0 when `sched_getcpu` fails)
    /// would let a remote holder skip the fence, so anything else fences.
    ///
    /// Out of line: once its first test read a field rather than `rseq::enabled()`, the
    /// compiler inlined it and then left `Zonal::pcp_try_lock` out of line instead, 40
    /// instructions more per order-1 pair under callgrind (`ZONAL_NO_RSEQ=1`).
    #[inline(never)]
    fn fence_remote(&self) -> bool {
        if !self.sections || self.caches_closed() || crate::sys::rseq_cpu_id() == Some(self.cpu) {
            return true;
        }
        self.fence()
    }

    /// Whether every cache is empty with a zero bound, so that no section can change one: a
    /// holder may then touch them without a fence (see [`PerCpuPages::fence_remote`]).
    #[inline]
    fn caches_closed(&self) -> bool {
        self.cache_len() == 0
            && self.cache_limit.load(Ordering::Relaxed) == 0
            && self.outbox_len() == 0
            && self.outbox_limit.load(Ordering::Relaxed) == 0
            && self.small.iter().all(SmallCache::closed)
            && self.thp_cache.closed()
    }

    /// Fences this CPU's critical sections, counting the calls; whether it was done.
    #[cold]
    fn fence(&self) -> bool {
        let mut calls = 0;
        let done = rseq::fence(self.cpu, &mut calls);
        // The lock is held: a plain add cannot race with another writer.
        self.fences.store(self.fences.load(Ordering::Relaxed) + calls, Ordering::Relaxed);
        done
    }

    /// The most frames the inbox takes: these lists' `high` as of the last unlock, within
    /// [`INBOX_MIN`] and [`INBOX_CAP`] (read without the lock by the CPUs that deliver).
    #[inline]
    pub(crate) fn inbox_cap(&self) -> usize {
        unshape(self.shape_hint.load(Ordering::Relaxed)).0.clamp(INBOX_MIN, INBOX_CAP)
    }

    /// `(count, high, batch)` without the lock: the lists as of the last unlock plus the
    /// caches, the outbox and the inbox as they are now; exact once allocation on these
    /// lists stops. What reports print, so that reading them never holds up an allocation.
    pub fn pageset_hint(&self) -> (usize, usize, usize) {
        let (high, batch) = unshape(self.shape_hint.load(Ordering::Relaxed));
        let count = self.count_hint.load(Ordering::Relaxed) + self.every_cache_frames() + self.inbox.len_hint();
        (count, high, batch)
    }

    /// Frames on the THP list as of the last unlock and in its cache now (exact once
    /// allocation stops), which the zone's `nr_zone_pcp_pages` counter leaves out.
    pub fn thp_pages(&self) -> usize {
        self.thp_hint.load(Ordering::Relaxed) + self.thp_cached()
    }

    /// Frames in every cache, the THP cache's with the others', and in the rseq outbox (what
    /// the lists' owner holds beside the lists).
    #[inline]
    pub fn every_cache_frames(&self) -> usize {
        self.section_frames() + self.thp_cached()
    }

    /// Frames in the THP cache now (none without rseq, whose sections alone fill it).
    #[inline]
    fn thp_cached(&self) -> usize {
        if self.sections {
            self.thp_cache.len() << PCP_THP_ORDER.0
        } else {
            0
        }
    }

    /// The order-0 cache's frames, bottom first: for tests, on lists no other thread uses
    /// meanwhile.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn cached_frames(&self) -> Vec<usize> {
        self.cache[..self.cache_len()].iter().map(|s| s.load(Ordering::Relaxed)).collect()
    }

    /// The rseq outbox's frames: for tests, as [`PerCpuPages::cached_frames`].
    #[cfg(all(test, not(loom)))]
    pub(crate) fn outbox_frames(&self) -> Vec<usize> {
        self.outbox[..self.outbox_len()].iter().map(|s| s.load(Ordering::Relaxed)).collect()
    }

    /// Blocks in the THP cache: for tests, on lists no other thread uses meanwhile.
    #[cfg(test)]
    pub(crate) fn thp_cache_len(&self) -> usize {
        self.thp_cache.len()
    }

    /// Blocks in the rseq cache.
    #[inline]
    pub fn cache_len(&self) -> usize {
        (self.cache_word.load(Ordering::Relaxed) & word::LEN) as usize
    }

    /// The block on top of the rseq cache of `order` (1 to [`PCP_MAX_ORDER`]), the next a
    /// pop takes: for tests, on lists no other thread uses meanwhile.
    #[cfg(test)]
    pub(crate) fn small_cache_top(&self, order: Order) -> Option<Pfn> {
        let len = self.small_cache(order).len();
        (len > 0).then(|| Pfn(self.small_slots(order)[len - 1].load(Ordering::Relaxed)))
    }

    /// Blocks in the rseq cache of `order` (1 to [`PCP_MAX_ORDER`]).
    #[cfg(test)]
    pub(crate) fn small_cache_len(&self, order: Order) -> usize {
        self.small_cache(order).len()
    }

    /// Frames in every rseq cache (each order's blocks times their size), each length read
    /// once: what the lists' owner holds beside `count`.
    #[inline]
    pub fn cache_frames(&self) -> usize {
        // Without rseq (or on a virtual CPU) no section runs and every cache stays empty.
        if self.sections {
            self.frames_in_caches()
        } else {
            0
        }
    }

    /// The frames of the caches of orders 1 to 3 whose bits `orders` lacks.
    #[inline]
    fn small_frames_but(&self, orders: u8) -> usize {
        (1..=PCP_MAX_ORDER).filter(|o| orders & 1 << o == 0).map(|o| self.small_cache(Order(o)).len() << o).sum()
    }

    /// [`PerCpuPages::cache_frames`] read whether or not sections run.
    #[inline]
    fn frames_in_caches(&self) -> usize {
        self.small.iter().enumerate().fold(self.cache_len(), |n, (i, c)| n + (c.len() << (i + 1)))
    }

    /// The slots of the cache of `order` (1 to [`PCP_MAX_ORDER`]), after the order-0
    /// cache's.
    #[inline]
    fn small_slots(&self, order: Order) -> &[AtomicUsize] {
        let start = CACHE_CAP + (order.0 as usize - 1) * SMALL_CACHE_CAP;
        &self.cache[start..start + SMALL_CACHE_CAP]
    }

    /// The length and bound of the cache of `order` (1 to [`PCP_MAX_ORDER`]).
    #[inline]
    fn small_cache(&self, order: Order) -> &SmallCache {
        &self.small[order.0 as usize - 1]
    }

    /// The frames the single order-0 paths' sections popped from and pushed onto this
    /// cache, counted in its word, since the lists were made (wrapping): the part of
    /// `pgalloc` (with the NUMA hit and local) and of `pgfree` those paths count for free.
    /// A sequence lock keeps a fold from being seen half done.
    pub fn fast_counts(&self) -> (u64, u64) {
        self.read_counts(&self.folded, &[(&self.cache_word, 0), (&self.outbox_word, 0)])
    }

    /// Pops and pushes: `folded` plus the counts of `words`, each counting blocks of
    /// `2^order` frames (`(word, order)`), read under the sequence lock (`fold_seq`), so that
    /// a fold, which moves counts from the words into the folded totals, is never seen half
    /// done.
    fn read_counts(&self, folded: &[AtomicU64; 2], words: &[(&AtomicU64, u8)]) -> (u64, u64) {
        loop {
            let seq = self.fold_seq.load(Ordering::Acquire);
            let mut counts = [folded[0].load(Ordering::Relaxed), folded[1].load(Ordering::Relaxed)];
            for &(w, order) in words {
                let w = w.load(Ordering::Relaxed);
                for (n, shift) in counts.iter_mut().zip([word::POPS_SHIFT, word::PUSHES_SHIFT]) {
                    *n = n.wrapping_add(((w >> shift) & word::COUNT) << order);
                }
            }
            crate::sync::fence(Ordering::Acquire);
            if seq % 2 == 0 && self.fold_seq.load(Ordering::Relaxed) == seq {
                return (counts[0], counts[1]);
            }
            std::hint::spin_loop();
        }
    }

    /// Adds `n` frames (wrapping: a negative count is a correction) to what the slow paths
    /// allocated (`free` false) or freed here.
    #[inline]
    pub fn count_slow(&self, free: bool, n: u64) {
        let c = &self.slow_counts[free as usize];
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Frames the slow paths allocated and freed here (see `count_slow`).
    pub fn slow_counts(&self) -> (u64, u64) {
        (self.slow_counts[0].load(Ordering::Relaxed), self.slow_counts[1].load(Ordering::Relaxed))
    }

    /// The frames the sections of the caches of orders 1 to 3 and of the THP cache popped
    /// and pushed (each block counted as its frames), since the lists were made (wrapping):
    /// the part of `pgalloc` and `pgfree` those caches count in their commits. Under the
    /// same sequence lock as [`PerCpuPages::fast_counts`].
    pub fn small_counts(&self) -> (u64, u64) {
        let [a, b, c] = &self.small;
        self.read_counts(
            &self.folded_small,
            &[(&a.word, 1), (&b.word, 2), (&c.word, 3), (&self.thp_cache.word, PCP_THP_ORDER.0)],
        )
    }

    /// Moves the counts out of the cache words (and the outbox's) into `folded` and
    /// `folded_small`, keeping the lengths (lock held, with no section able to commit: the
    /// fence is done or not needed).
    #[inline]
    fn fold_counts(&self) {
        let w = self.cache_word.load(Ordering::Relaxed);
        let out = self.outbox_word.load(Ordering::Relaxed);
        let counts = |c: &SmallCache| c.word.load(Ordering::Relaxed) & !word::LEN != 0;
        if (w | out) & !word::LEN != 0 || self.small.iter().any(counts) || counts(&self.thp_cache) {
            self.fold_counts_now(w, out);
        }
    }

    /// Moves the THP cache's counts into `folded_small` (lock held, with no section able to
    /// commit to that cache: [`PerCpuPages::try_lock_thp`]).
    #[inline]
    fn fold_thp_counts(&self) {
        let w = self.thp_cache.word.load(Ordering::Relaxed);
        if w & !word::LEN != 0 {
            self.fold_words(&[], &[(&self.thp_cache, PCP_THP_ORDER.0)]);
        }
    }

    /// [`PerCpuPages::fold_counts`] when a word holds counts, `w` the order-0 cache's and
    /// `out` the outbox's (with rseq, nearly every holder that flushes the order-0 cache: its
    /// sections count).
    fn fold_counts_now(&self, w: u64, out: u64) {
        let [a, b, c] = &self.small;
        self.fold_words(
            &[(&self.cache_word, w), (&self.outbox_word, out)],
            &[(a, 1), (b, 2), (c, 3), (&self.thp_cache, PCP_THP_ORDER.0)],
        );
    }

    /// Moves the counts of the order-0 words (`order0`: the word and its value, the order-0
    /// cache's and the outbox's, or none) into `folded` and those of the caches `others`
    /// (each with its blocks' order) into `folded_small`, keeping the lengths, under the
    /// sequence lock the readers check.
    fn fold_words(&self, order0: &[(&AtomicU64, u64)], others: &[(&SmallCache, u8)]) {
        let seq = self.fold_seq.load(Ordering::Relaxed);
        self.fold_seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        crate::sync::fence(Ordering::Release);
        let add = |f: &AtomicU64, n: u64| f.store(f.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        for &(at, w) in order0 {
            for (f, shift) in self.folded.iter().zip([word::POPS_SHIFT, word::PUSHES_SHIFT]) {
                add(f, (w >> shift) & word::COUNT);
            }
            at.store(w & word::LEN, Ordering::Relaxed);
        }
        for &(c, order) in others {
            let sw = c.word.load(Ordering::Relaxed);
            for (f, shift) in self.folded_small.iter().zip([word::POPS_SHIFT, word::PUSHES_SHIFT]) {
                add(f, ((sw >> shift) & word::COUNT) << order);
            }
            c.word.store(sw & word::LEN, Ordering::Relaxed);
        }
        self.fold_seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// Sets the counts in the cache word, keeping the length: for tests that take a count to
    /// its guard, on lists no other thread uses meanwhile.
    #[cfg(test)]
    pub(crate) fn set_word_counts(&self, pops: u64, pushes: u64) {
        let w = self.cache_word.load(Ordering::Relaxed) & word::LEN;
        self.cache_word.store(w | pops << word::POPS_SHIFT | pushes << word::PUSHES_SHIFT, Ordering::Relaxed);
    }

    /// The counts in the cache word, not folded yet: pops, pushes.
    #[cfg(test)]
    pub(crate) fn word_counts(&self) -> (u64, u64) {
        let w = self.cache_word.load(Ordering::Relaxed);
        ((w >> word::POPS_SHIFT) & word::COUNT, (w >> word::PUSHES_SHIFT) & word::COUNT)
    }

    /// Sets the cache's length, keeping the counts (lock held, no section able to commit).
    fn set_cache_len(&self, n: usize) {
        let w = self.cache_word.load(Ordering::Relaxed);
        self.cache_word.store((w & !word::LEN) | n as u64, Ordering::Relaxed);
    }

    /// Whether the lists looked empty at the last unlock and the caches, the outbox and the
    /// inbox are empty now: a hint (a free may land at any moment), used to skip drains that
    /// would find nothing.
    pub fn looks_empty(&self) -> bool {
        self.count_hint.load(Ordering::Relaxed) == 0 && self.every_cache_frames() == 0 && self.inbox.len_hint() == 0
    }
}

/// `high` and `batch` packed into one word for [`PerCpuPages::pageset_hint`].
#[inline]
fn shape(high: usize, batch: usize) -> u64 {
    let c = |v: usize| v.min(u32::MAX as usize) as u64;
    c(high) | c(batch) << 32
}

/// `(high, batch)` out of [`shape`]'s word.
#[inline]
fn unshape(s: u64) -> (usize, usize) {
    ((s & 0xFFFF_FFFF) as usize, (s >> 32) as usize)
}

/// Proof that a `PerCpuPages` lock is held; unlocks on drop.
pub struct PcpGuard<'a> {
    pcp: &'a PerCpuPages,
    zone: &'a Zone,
    /// What this holder does with the cache.
    cache: Cache,
    /// Whether the holder serves an order-0 allocation (see [`PcpGuard::fill_for_allocations`]).
    allocating: bool,
    /// The order from 1 to 3 whose cache the holder fills on unlock, 0 for none (see
    /// [`PcpGuard::fill_small`]).
    small: u8,
    /// Whether the holder leaves the caches of orders 1 to 3 in place (an order-0
    /// allocation or free, see [`PcpGuard::keep_small_caches`]).
    keep_small: bool,
}

/// What a lock holder does with the rseq cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cache {
    /// Flushes it into the order-0 list before its work and fills it after (`lock`,
    /// `try_lock`, with the fence done or not needed).
    Flush,
    /// Counts its blocks in `count` during its work and sets its bound after, moving none
    /// (`try_lock_small_orders`, with the fence done or not needed).
    Count,
    /// As `Count`, and moves the rseq outbox to the locked one before its work and opens it
    /// again after (`try_lock_outbox`, with the fence done or not needed).
    Outbox,
    /// Leaves it alone (`lock_lists`, `try_lock_lists`, or a fence that failed).
    Leave,
    /// Leaves every cache alone but the THP cache, which it flushes into the THP list before
    /// its work and fills after (`try_lock_thp`, with the fence done or not needed).
    Thp,
}

impl PcpGuard<'_> {
    /// Marks the holder as serving an order-0 allocation, whose sections found the cache
    /// empty: on unlock it moves up to [`CACHE_REFILL`] blocks into the cache instead of
    /// [`CACHE_FILL`], and asks for the state lines of those blocks ahead of the pops that
    /// will write them. In a stream those lines were last written by the CPU that freed the
    /// frames, so each is a miss; asked for together, the misses overlap, where the pops
    /// met them one at a time (`cross_pairs` 19.4–21.5 → 17.7–19.6 ns a frame; see
    /// docs/PERFORMANCE.md, the transfer list).
    #[inline]
    pub fn fill_for_allocations(&mut self) {
        self.allocating = true;
    }

    /// Marks the holder as serving an allocation or free of `order` (1 to
    /// [`PCP_MAX_ORDER`]): only that order's cache is flushed into its list before the work
    /// (the other small caches, as the order-0 cache, stay in place and count in `count`),
    /// and on unlock up to [`SMALL_CACHE_FILL`] blocks of the list go back into it, so that
    /// the next allocations and frees of the order take a section and no lock. Without it
    /// (or without rseq) these caches stay empty and shut.
    #[inline]
    pub fn fill_small(&mut self, order: Order) {
        debug_assert!((1..=PCP_MAX_ORDER).contains(&order.0));
        self.small = order.0;
    }

    /// Marks the holder as serving order-0 allocations or frees: the caches of orders 1 to
    /// 3 stay in place and only count in `count` while it works (its decisions are those
    /// of flushed caches), so that a stream of order 0 mixed with larger orders does not
    /// empty their caches at every refill or drain of its own. Without it a holder that
    /// works on the caches (drains, decay, tuning) flushes them all.
    #[inline]
    pub fn keep_small_caches(&mut self) {
        self.keep_small = true;
    }

    /// Runs `f` on the protected fields; then accounts the frames the lists gained or lost
    /// (`f`'s and the cache's since the last lock) to the zone's `nr_zone_pcp_pages`, through
    /// this CPU's diff. A guard that works on the cache flushes it into the lists first and
    /// refills it after, so `f` sees every block the pcp holds; one that does not
    /// ([`PerCpuPages::lock_lists`]) shows `f` the lists alone.
    #[inline]
    pub fn with<R>(&mut self, f: impl FnOnce(&mut PcpInner) -> R) -> R {
        let (pcp, zone, mode, allocating, small) = (self.pcp, self.zone, self.cache, self.allocating, self.small);
        // Without rseq (or on a virtual CPU) no section runs: every cache stays empty and
        // every word 0.
        let rseq_on = pcp.sections;
        // The small caches this holder flushes into their lists (a bit per order); the
        // others, if it works on the caches, count in `count` while it works.
        let flushed: u8 = match mode {
            Cache::Leave | Cache::Thp => 0,
            Cache::Flush if self.keep_small => 0,
            Cache::Count if small != 0 => 1 << small,
            Cache::Flush | Cache::Count => SMALL_ORDERS,
            Cache::Outbox => 0,
        };
        // Drains, decay, tuning and the bulk calls see the THP list whole.
        let flush_thp = mode == Cache::Flush && !self.keep_small && rseq_on;
        // SAFETY: this guard exists only while its creator holds `pcp.lock` (try_lock/lock/
        // lock_lists), and `&mut self` keeps this the only access through it.
        unsafe {
            pcp.inner.with_mut(|inner| {
                // Under `Count` no section can move the cache meanwhile (the fence is done or
                // not needed, and new sections find the lock held), so this length holds.
                // Under `Count`, and for the small caches left in place, no section can move
                // a cache meanwhile (the fence is done or not needed, and new sections find
                // the lock held), so these lengths hold.
                let mut counted = 0;
                if matches!(mode, Cache::Flush | Cache::Count | Cache::Outbox) && rseq_on {
                    pcp.fold_counts();
                    pcp.flush_small(inner, flushed);
                    counted = pcp.small_frames_but(flushed);
                }
                if matches!(mode, Cache::Count | Cache::Outbox) {
                    counted += pcp.cache_len();
                }
                if mode == Cache::Outbox && rseq_on {
                    pcp.flush_outbox(inner);
                }
                if mode == Cache::Flush {
                    pcp.flush_cache(inner);
                    if rseq_on {
                        pcp.flush_outbox(inner);
                    }
                }
                if flush_thp {
                    pcp.flush_thp(inner);
                }
                inner.count += counted;
                let r = f(inner);
                inner.count -= counted;
                // The outbox's frames to their owners, a batch at a time (a drain or a decay
                // has emptied it already).
                if inner.outbox.len() >= OUTBOX_CAP {
                    lists::deliver(zone, inner);
                }
                if flush_thp {
                    // Room for frees within the list's bound; the next THP holder fills it.
                    pcp.shrink_thp_limit(inner);
                }
                match mode {
                    Cache::Flush => pcp.fill_cache(zone, inner, allocating),
                    Cache::Count if rseq_on => {
                        if small != 0 {
                            pcp.fill_small_cache(inner, Order(small));
                        }
                        pcp.set_cache_limits_now(inner);
                    }
                    Cache::Outbox if rseq_on => {
                        pcp.set_cache_limits_now(inner);
                        pcp.outbox_limit.store(OUTBOX_CAP, Ordering::Relaxed);
                    }
                    Cache::Count | Cache::Outbox | Cache::Leave | Cache::Thp => {}
                }
                pcp.count_hint.store(inner.held(), Ordering::Relaxed);
                pcp.thp_hint.store(inner.thp.len() << PCP_THP_ORDER.0, Ordering::Relaxed);
                pcp.shape_hint.store(shape(inner.high, inner.batch), Ordering::Relaxed);
                // One read each: a holder that leaves the cache alone may see a section commit
                // after it, and that churn is settled at a later lock.
                let (cache, out) = if rseq_on { (pcp.frames_in_caches(), pcp.outbox_len()) } else { (0, 0) };
                let now = inner.count + inner.outbox.len() + cache + out;
                let delta = now as isize - inner.reported as isize + std::mem::take(&mut inner.transferred);
                if delta != 0 {
                    zone.mod_page_state(pcp.cpu(), ZoneStatItem::NrPcpPages, delta);
                }
                inner.reported = now;
                pcp.cache_settled.store(cache + out, Ordering::Relaxed);
                let idle = decay_is_noop(inner, cache) && out == 0;
                pcp.decay_idle.store(idle, Ordering::Relaxed);
                r
            })
        }
    }

    /// [`PcpGuard::with`] for a holder of [`PerCpuPages::try_lock_thp`] whose `f` moves
    /// blocks on and off the THP list alone: `count`, `high`, `batch` and the other caches
    /// are as they were, so of the unlock's bookkeeping only the hints that read the THP
    /// list are written (the other caches' churn, if any, is settled by a later holder, as
    /// under `lock_lists`). The THP cache's blocks join the list for `f` and as many as the
    /// list's rules keep go back after ([`PerCpuPages::fill_thp_cache`]).
    #[inline]
    pub fn with_thp<R>(&mut self, f: impl FnOnce(&mut PcpInner) -> R) -> R {
        let (pcp, zone) = (self.pcp, self.zone);
        let thp = self.cache == Cache::Thp;
        debug_assert!(matches!(self.cache, Cache::Leave | Cache::Thp));
        // SAFETY: as in `with`: the guard's lock is held and `&mut self` makes this the only
        // access through it.
        unsafe {
            pcp.inner.with_mut(|inner| {
                let (count, high, batch) = (inner.count, inner.high, inner.batch);
                if thp {
                    pcp.fold_thp_counts();
                    pcp.flush_thp(inner);
                }
                let r = f(inner);
                if thp {
                    pcp.fill_thp_cache(zone, inner);
                }
                debug_assert_eq!((count, high, batch), (inner.count, inner.high, inner.batch));
                pcp.count_hint.store(inner.held(), Ordering::Relaxed);
                pcp.thp_hint.store(inner.thp.len() << PCP_THP_ORDER.0, Ordering::Relaxed);
                // Blocks on the THP list are always work for a decay: only an empty list
                // needs the caches read.
                let idle = inner.thp.is_empty() && decay_is_noop(inner, pcp.cache_frames()) && pcp.outbox_len() == 0;
                pcp.decay_idle.store(idle, Ordering::Relaxed);
                r
            })
        }
    }

    /// Folds this CPU's `nr_zone_pcp_pages` diff into the zone's counters (the periodic fold),
    /// after accounting the cache's churn.
    pub fn fold_diff(&mut self) {
        self.with(|_| ());
        self.zone.fold_diff(self.pcp.cpu(), ZoneStatItem::NrPcpPages);
    }
}

impl Drop for PcpGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.pcp.lock.store(false, Ordering::Release);
    }
}

impl PerCpuPages {
    /// Moves the cache's blocks to the order-0 list (lock held).
    #[inline]
    fn flush_cache(&self, inner: &mut PcpInner) {
        let n = self.cache_len();
        if n == 0 {
            return;
        }
        for slot in &self.cache[..n] {
            inner.lists[0].push(slot.load(Ordering::Relaxed));
        }
        inner.count += n;
        self.set_cache_len(0);
    }

    /// Moves the rseq outbox's frames to the locked outbox (lock held, no section able to
    /// commit to it), from where they go to their owners ([`lists::deliver`]).
    #[inline]
    fn flush_outbox(&self, inner: &mut PcpInner) {
        let n = self.outbox_len();
        if n == 0 {
            return;
        }
        inner.outbox.extend(self.outbox[..n].iter().map(|slot| slot.load(Ordering::Relaxed)));
        let w = self.outbox_word.load(Ordering::Relaxed);
        self.outbox_word.store(w & !word::LEN, Ordering::Relaxed);
    }

    /// Moves up to `CACHE_FILL` order-0 blocks from the list into the cache, or for an
    /// allocation up to `CACHE_REFILL` with their state lines prefetched for writing (see
    /// [`PcpGuard::fill_for_allocations`]), and sets the bound that keeps `count + cache <=
    /// high + batch` (lock held). Without rseq the cache stays empty.
    #[inline(always)]
    fn fill_cache(&self, zone: &Zone, inner: &mut PcpInner, allocating: bool) {
        if !self.sections {
            return;
        }
        let fill = if allocating { CACHE_REFILL } else { CACHE_FILL };
        let take = fill.min(inner.lists[0].len());
        let start = inner.lists[0].len() - take;
        // The list's frames are the zone's; one prefetch per line of state bytes (a refill's
        // frames come in address order, so neighbours follow one another).
        let mut line = usize::MAX;
        for (slot, pfn) in self.cache.iter().zip(inner.lists[0].drain(start..)) {
            slot.store(pfn, Ordering::Relaxed);
            if allocating {
                let state = std::ptr::from_ref(zone.state(Pfn(pfn)));
                if state as usize / 64 != line {
                    line = state as usize / 64;
                    crate::sync::prefetch_write(state);
                }
            }
        }
        inner.count -= take;
        self.set_cache_len(take);
        self.set_cache_limit(inner);
        // The outbox is open whenever the cache's holders are about: it is empty now.
        self.outbox_limit.store(OUTBOX_CAP, Ordering::Relaxed);
    }

    /// Moves the blocks of the caches of orders 1 to 3 whose bits `orders` has to their lists
    /// (lock held, the caches this holder's), so that the holder's work sees them, as Linux's
    /// lists hold them.
    #[inline]
    fn flush_small(&self, inner: &mut PcpInner, orders: u8) {
        if orders == 0 || self.small.iter().all(|c| c.len() == 0) {
            return;
        }
        self.flush_small_now(inner, orders);
    }

    /// [`PerCpuPages::flush_small`] when a cache holds blocks.
    fn flush_small_now(&self, inner: &mut PcpInner, orders: u8) {
        for o in (1..=PCP_MAX_ORDER).filter(|o| orders & 1 << o != 0) {
            let order = Order(o);
            let c = self.small_cache(order);
            let n = c.len();
            if n == 0 {
                continue;
            }
            let list = &mut inner.lists[o as usize];
            for slot in &self.small_slots(order)[..n] {
                list.push(slot.load(Ordering::Relaxed));
            }
            inner.count += n << o;
            c.set_len(0);
        }
    }

    /// Moves the THP cache's blocks to the THP list (lock held, no section able to commit to
    /// that cache), where they count as the list's.
    #[inline]
    fn flush_thp(&self, inner: &mut PcpInner) {
        let n = self.thp_cache.len();
        if n == 0 {
            return;
        }
        for slot in &self.cache[THP_FIRST_SLOT..THP_FIRST_SLOT + n] {
            inner.thp.push(slot.load(Ordering::Relaxed));
        }
        self.thp_cache.set_len(0);
    }

    /// Moves the THP list's newest blocks into the (flushed, so empty) THP cache and opens
    /// it for frees up to the list's rules: [`PCP_THP_HIGH`] blocks in the list and the
    /// cache together, none kept while the zone is below its high watermark (as
    /// `free_thp`), so the next allocations and frees of the order take a section and no
    /// lock. The list's length drops with the move, as a pop's does, so `thp_min` (the
    /// decay's count of idle blocks) takes it in. Lock held, the cache this holder's.
    #[inline]
    fn fill_thp_cache(&self, zone: &Zone, inner: &mut PcpInner) {
        let take = inner.thp.len().min(THP_CACHE_CAP);
        let start = inner.thp.len() - take;
        for (slot, pfn) in self.cache[THP_FIRST_SLOT..].iter().zip(inner.thp.drain(start..)) {
            slot.store(pfn, Ordering::Relaxed);
        }
        inner.thp_min = inner.thp_min.min(inner.thp.len());
        self.thp_cache.set_len(take);
        let keep = if zone.nr_free() >= zone.watermark(crate::zone::Watermark::High) { PCP_THP_HIGH } else { 0 };
        let limit = keep.saturating_sub(inner.thp.len()).min(THP_CACHE_CAP);
        self.thp_cache.limit.store(limit, Ordering::Relaxed);
    }

    /// Lowers the THP cache's bound so that the list and the cache stay within
    /// [`PCP_THP_HIGH`] blocks together, after a holder that flushed the cache (lock held).
    #[inline]
    fn shrink_thp_limit(&self, inner: &PcpInner) {
        let room = PCP_THP_HIGH.saturating_sub(inner.thp.len()).min(THP_CACHE_CAP);
        let limit = self.thp_cache.limit.load(Ordering::Relaxed);
        if limit > room {
            self.thp_cache.limit.store(room, Ordering::Relaxed);
        }
    }

    /// Moves up to [`SMALL_CACHE_FILL`] blocks of `order`'s list (the newest) into its
    /// (flushed, so empty) cache (lock held, the cache this holder's, rseq on).
    #[inline]
    fn fill_small_cache(&self, inner: &mut PcpInner, order: Order) {
        let list = &mut inner.lists[order.0 as usize];
        let take = SMALL_CACHE_FILL.min(list.len());
        let start = list.len() - take;
        for (slot, pfn) in self.small_slots(order).iter().zip(list.drain(start..)) {
            slot.store(pfn, Ordering::Relaxed);
        }
        inner.count -= take << order.0;
        self.small_cache(order).set_len(take);
    }

    /// Sets every cache's bound, the most it may hold, so that `count` and the frames of
    /// every cache, each at its bound, stay within `high + batch` (lock held, the caches this
    /// holder's). The room left is shared out: a cache of orders 1 to 3 that holds blocks
    /// may grow by up to a quarter of it (an empty one stays shut, so that a workload of
    /// order 0 alone keeps the room it had), and the order-0 cache takes the rest. A cache
    /// already above its bound only shrinks: pushes find no room.
    #[inline]
    fn set_cache_limit(&self, inner: &PcpInner) {
        if self.sections {
            self.set_cache_limits_now(inner);
        }
    }

    /// [`PerCpuPages::set_cache_limit`] with restartable sequences.
    fn set_cache_limits_now(&self, inner: &PcpInner) {
        let bound = inner.high + inner.batch;
        let quarter = bound.saturating_sub(inner.count + self.cache_frames()) / 4;
        // What the lists and the caches of orders 1 to 3 may reach at their bounds.
        let mut reserved = inner.count;
        for (i, c) in self.small.iter().enumerate() {
            let len = c.len();
            let extra = if len == 0 { 0 } else { (SMALL_CACHE_CAP - len).min(quarter >> (i + 1)) };
            c.limit.store(len + extra, Ordering::Relaxed);
            reserved += (len + extra) << (i + 1);
        }
        // At least the order-0 cache's length plus a quarter of the room when the frames
        // were within the bound (the small caches took at most three quarters of it).
        self.cache_limit.store(bound.saturating_sub(reserved).min(CACHE_CAP), Ordering::Relaxed);
    }
}
