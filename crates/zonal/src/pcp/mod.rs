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

use crate::buddy::{self, PCP};
use crate::sync::{spin_wait, AtomicBool, AtomicU64, AtomicUsize, LockedCell, Ordering};
use crate::types::{Order, Pfn, PAGE_SIZE};
use crate::vmstat::ZoneStatItem;
use crate::zone::{Watermark, Zone};

/// Highest order kept on pcp lists (`PAGE_ALLOC_COSTLY_ORDER`).
pub const PCP_MAX_ORDER: u8 = 3;
/// Number of pcp lists (one per order `0..=PCP_MAX_ORDER`).
pub const NR_PCP_LISTS: usize = PCP_MAX_ORDER as usize + 1;
/// `PCP_BATCH_SCALE_MAX`: the most `free_factor` and the decay step scale a batch by.
pub const PCP_BATCH_SCALE_MAX: u32 = 5;
/// Smallest non-zero `percpu_pagelist_high_fraction` (`MIN_PERCPU_PAGELIST_HIGH_FRACTION`).
pub const MIN_PERCPU_PAGELIST_HIGH_FRACTION: u32 = 8;

/// `zone_batchsize`: a quarter of the zone's 1/1024 share capped at 1 MiB, clamped to
/// `2^n - 1` (so batches do not alias in caches), at least 1: 63 for zones of 1 GiB and more.
pub fn zone_batchsize(managed: usize) -> usize {
    let batch = ((managed >> 10).min((1 << 20) / PAGE_SIZE) / 4).max(1);
    let b = batch + batch / 2;
    let pow = 1usize << (usize::BITS - 1 - b.leading_zeros());
    (pow - 1).max(1)
}

/// `zone_highsize`: the zone's low watermark (or `managed / fraction` when the fraction is
/// set) split over the CPUs of the zone's node (all CPUs for a memory-only node), at least
/// four batches.
pub fn zone_highsize(
    low_wmark: usize,
    managed: usize,
    batch: usize,
    node_cpus: usize,
    nr_cpus: usize,
    fraction: u32,
) -> usize {
    let total = if fraction == 0 { low_wmark } else { managed / fraction as usize };
    let split = if node_cpus == 0 { nr_cpus.max(1) } else { node_cpus };
    (total / split).max(batch << 2)
}

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
    /// Frames (lists and cache) as last accounted to the zone's `nr_zone_pcp_pages`.
    reported: usize,
    lists: [Vec<usize>; NR_PCP_LISTS],
}

impl PcpInner {
    /// Blocks on the list of one order.
    pub fn list_len(&self, order: Order) -> usize {
        self.lists[order.0 as usize].len()
    }
}

/// Blocks the rseq front cache of one pcp holds at most: room for a bulk call of 128 frames
/// and its free, in one critical section per 64.
pub const CACHE_CAP: usize = 256;

/// Blocks a lock holder moves from the order-0 list into the cache on unlock. Small, because
/// every locked operation first flushes the cache: the frees fill it the rest of the way.
const CACHE_FILL: usize = 32;

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
    lock: AtomicBool,
    /// The CPU these lists belong to.
    cpu: u32,
    cache_len: AtomicUsize,
    cache_limit: AtomicUsize,
    cache_slots: *const AtomicUsize,
    cache: Box<[AtomicUsize]>,
    /// `count` as of the last unlock, readable without the lock (drains skip empty lists).
    count_hint: AtomicUsize,
    /// `cache_len` as of the last unlock: what the zone counters know of the cache. A
    /// snapshot adds the churn since (`cache_len - cache_settled`).
    cache_settled: AtomicUsize,
    /// Whether, as of the last unlock, a `decay_high` would change nothing (see
    /// [`decay_is_noop`]): with no cache churn since, the worker skips these lists
    /// (`decay_pcp_high` skips idle lists) instead of locking and fencing them.
    decay_idle: AtomicBool,
    /// `membarrier` calls made to fence this CPU's sections (the `pcp_fence` event), written
    /// under the lock, on a line the locker writes anyway.
    fences: AtomicU64,
    inner: LockedCell<PcpInner>,
}

const _: () = assert!(std::mem::size_of::<PerCpuPages>() % 128 == 0);
const _: () = assert!(std::mem::align_of::<PerCpuPages>() == 128);

// SAFETY: `inner` is only reached through a `PcpGuard`, which exists only while `lock` is
// held by its creator, so accesses from different threads never overlap; the cache is made
// of atomics, and `cache_slots` points into `cache`, which lives as long as the struct.
unsafe impl Sync for PerCpuPages {}
// SAFETY: as above; nothing in the struct is tied to the thread that built it.
unsafe impl Send for PerCpuPages {}

impl PerCpuPages {
    /// Lists of `cpu` with the given batch and bounds; `high` starts at `high_min`.
    pub fn new(cpu: u32, batch: usize, high_min: usize, high_max: usize) -> PerCpuPages {
        let cap = |o: usize| ((high_max + (batch << PCP_BATCH_SCALE_MAX)) >> o) + 4;
        let cache: Box<[AtomicUsize]> = (0..CACHE_CAP).map(|_| AtomicUsize::new(0)).collect();
        PerCpuPages {
            lock: AtomicBool::new(false),
            cpu,
            cache_len: AtomicUsize::new(0),
            cache_limit: AtomicUsize::new(0),
            cache_slots: cache.as_ptr(),
            cache,
            count_hint: AtomicUsize::new(0),
            cache_settled: AtomicUsize::new(0),
            decay_idle: AtomicBool::new(false),
            fences: AtomicU64::new(0),
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
                lists: std::array::from_fn(|o| Vec::with_capacity(cap(o))),
            }),
        }
    }

    /// `pcp_spin_trylock`: the lists if no one holds them, with the cache flushed into them
    /// for the guard's work (fencing the lists' CPU first if need be). `zone` is the zone
    /// these lists belong to, whose counters the guard keeps up to date.
    #[inline]
    pub fn try_lock<'a>(&'a self, zone: &'a Zone) -> Option<PcpGuard<'a>> {
        if self.lock.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            let cache = self.fence_remote();
            Some(PcpGuard { pcp: self, zone, cache })
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
    /// that changes only `cache_len` and the slots, which this holder reads once (relaxed)
    /// to account the cache's churn, as [`PerCpuPages::unsettled`] does.
    pub fn lock_lists<'a>(&'a self, zone: &'a Zone) -> PcpGuard<'a> {
        while self.lock.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spin_wait();
        }
        PcpGuard { pcp: self, zone, cache: false }
    }

    /// Whether a `decay_high` would change these lists: not as of the last unlock, and the
    /// cache has not moved since (a lock-free hint, for the worker).
    pub fn needs_decay(&self) -> bool {
        !self.decay_idle.load(Ordering::Relaxed) || self.unsettled() != 0
    }

    /// `membarrier` calls made to fence this CPU's critical sections.
    pub fn fences(&self) -> u64 {
        self.fences.load(Ordering::Relaxed)
    }

    /// Checks the cache's blocks (each a frame of `zone` tagged `PCP|0`); returns how many
    /// there are. Call only while no allocation or free runs on these lists (it reads the
    /// cache without the fence a concurrent section would need).
    pub fn check_cache(&self, zone: &Zone) -> Result<usize, String> {
        let n = self.cache_len.load(Ordering::Relaxed).min(CACHE_CAP);
        for slot in &self.cache[..n] {
            let pfn = Pfn(slot.load(Ordering::Relaxed));
            if !zone.contains(pfn) {
                return Err(format!("zone {}: cpu {} cache holds {:#x}, not of the zone", zone.id.0, self.cpu, pfn.0));
            }
            let s = zone.state(pfn).load(Ordering::Relaxed);
            if s != buddy::state(PCP, Order(0)) {
                return Err(format!("zone {}: cpu {} cache block {:#x} has state {s:#x}", zone.id.0, self.cpu, pfn.0));
            }
        }
        Ok(n)
    }

    /// Frames in the cache that the zone counters do not know of yet (negative: frames
    /// that left it): the lock-free churn since the last unlock.
    pub fn unsettled(&self) -> isize {
        self.cache_len.load(Ordering::Relaxed) as isize - self.cache_settled.load(Ordering::Relaxed) as isize
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
    #[inline]
    fn fence_remote(&self) -> bool {
        if !rseq::enabled()
            || (self.cache_len.load(Ordering::Relaxed) == 0 && self.cache_limit.load(Ordering::Relaxed) == 0)
            || crate::sys::rseq_cpu_id() == Some(self.cpu)
        {
            return true;
        }
        self.fence()
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

    /// Blocks in the rseq cache.
    pub fn cache_len(&self) -> usize {
        self.cache_len.load(Ordering::Relaxed)
    }

    /// Whether the lists looked empty at the last unlock and the cache is empty now: a hint
    /// (a free may land at any moment), used to skip drains that would find nothing.
    pub fn looks_empty(&self) -> bool {
        self.count_hint.load(Ordering::Relaxed) == 0 && self.cache_len.load(Ordering::Relaxed) == 0
    }
}

/// Proof that a `PerCpuPages` lock is held; unlocks on drop.
pub struct PcpGuard<'a> {
    pcp: &'a PerCpuPages,
    zone: &'a Zone,
    /// Whether this holder flushes and fills the cache: taken by `lock`/`try_lock` with the
    /// fence done (or not needed); `lock_lists`, or a fence that failed, leave it alone.
    cache: bool,
}

impl PcpGuard<'_> {
    /// Runs `f` on the protected fields; then accounts the frames the lists gained or lost
    /// (`f`'s and the cache's since the last lock) to the zone's `nr_zone_pcp_pages`, through
    /// this CPU's diff. A guard that works on the cache flushes it into the lists first and
    /// refills it after, so `f` sees every block the pcp holds; one that does not
    /// ([`PerCpuPages::lock_lists`]) shows `f` the lists alone.
    #[inline]
    pub fn with<R>(&mut self, f: impl FnOnce(&mut PcpInner) -> R) -> R {
        let (pcp, zone, touch_cache) = (self.pcp, self.zone, self.cache);
        // SAFETY: this guard exists only while its creator holds `pcp.lock` (try_lock/lock/
        // lock_lists), and `&mut self` keeps this the only access through it.
        unsafe {
            pcp.inner.with_mut(|inner| {
                if touch_cache {
                    pcp.flush_cache(inner);
                }
                let r = f(inner);
                if touch_cache {
                    pcp.fill_cache(inner);
                }
                pcp.count_hint.store(inner.count, Ordering::Relaxed);
                // One read: a holder that leaves the cache alone may see a section commit
                // after it, and that churn is settled at a later lock.
                let cache = pcp.cache_len.load(Ordering::Relaxed);
                let now = inner.count + cache;
                if now != inner.reported {
                    zone.mod_page_state(pcp.cpu(), ZoneStatItem::NrPcpPages, now as isize - inner.reported as isize);
                    inner.reported = now;
                }
                pcp.cache_settled.store(cache, Ordering::Relaxed);
                pcp.decay_idle.store(decay_is_noop(inner, cache), Ordering::Relaxed);
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
        let n = self.cache_len.load(Ordering::Relaxed);
        if n == 0 {
            return;
        }
        for slot in &self.cache[..n] {
            inner.lists[0].push(slot.load(Ordering::Relaxed));
        }
        inner.count += n;
        self.cache_len.store(0, Ordering::Relaxed);
    }

    /// Moves up to `CACHE_FILL` order-0 blocks from the list into the cache and
    /// sets the bound that keeps `count + cache <= high + batch` (lock held). Without rseq
    /// the cache stays empty.
    #[inline]
    fn fill_cache(&self, inner: &mut PcpInner) {
        if !rseq::enabled() {
            return;
        }
        let budget = (inner.high + inner.batch).min(inner.count + CACHE_CAP);
        let take = CACHE_FILL.min(inner.lists[0].len());
        let start = inner.lists[0].len() - take;
        for (slot, pfn) in self.cache.iter().zip(inner.lists[0].drain(start..)) {
            slot.store(pfn, Ordering::Relaxed);
        }
        inner.count -= take;
        self.cache_len.store(take, Ordering::Relaxed);
        self.cache_limit.store(budget.saturating_sub(inner.count).min(CACHE_CAP), Ordering::Relaxed);
    }
}
/// Takes a block of `order` from the lists, refilling them from the buddy lists first if the
/// list is empty (`__rmqueue_pcplist`). The block's head state is still `PCP|order`: the
/// caller tags it allocated before anyone else can see it. `None` if the zone has no block of
/// the order either.
#[inline]
pub fn rmqueue_pcplist(zone: &Zone, pcp: &mut PcpInner, order: Order) -> Option<Pfn> {
    let o = order.0 as usize;
    pcp.free_factor >>= 1;
    loop {
        if pcp.lists[o].is_empty() && rmqueue_bulk(zone, pcp, order) == 0 {
            return None;
        }
        let pfn = Pfn(pcp.lists[o].pop()?);
        pcp.count -= order.pages();
        pcp.count_min = pcp.count_min.min(pcp.count);
        // A second copy of a frame put on the lists by two racing frees (see `free_check`)
        // no longer carries the tag: drop it.
        if zone.state(pfn).load(Ordering::Relaxed) == buddy::state(PCP, order) {
            return Some(pfn);
        }
    }
}

/// Moves `nr_pcp_alloc` blocks of `order` from the buddy lists to the pcp list under one
/// acquisition of the zone lock (`rmqueue_bulk`); grows `high` by a batch on the way when
/// `high` is auto-tuned and the zone is above its high watermark (Linux 6.7). Returns the
/// number of blocks moved.
#[cold]
pub fn rmqueue_bulk(zone: &Zone, pcp: &mut PcpInner, order: Order) -> usize {
    if pcp.high_min != pcp.high_max && zone.nr_free() >= zone.watermark(Watermark::High) {
        pcp.high = (pcp.high + pcp.batch).min(pcp.high_max);
    }
    pcp.free_count = 0;
    // nr_pcp_alloc: order 0 takes `batch << alloc_factor` frames, at most what keeps the lists
    // a batch below high, doubling while allocations run without frees; larger orders take
    // max(batch >> order, 2) blocks. zonal also keeps the lists within high + batch once the
    // caller has taken its block, which only binds for tiny batches.
    let want = if order.0 == 0 {
        let scaled = pcp.batch << pcp.alloc_factor;
        let max_nr_alloc = (pcp.high.saturating_sub(pcp.count + pcp.batch)).max(pcp.batch);
        if scaled <= max_nr_alloc && pcp.alloc_factor < PCP_BATCH_SCALE_MAX {
            pcp.alloc_factor += 1;
        }
        scaled.min(max_nr_alloc).max(2)
    } else {
        (pcp.batch >> order.0).max(2)
    };
    let room = 1 + ((pcp.high + pcp.batch).saturating_sub(pcp.count) >> order.0);
    let want = want.min(room);
    let mut l = zone.lock();
    let mut b = l.buddy();
    let list = &mut pcp.lists[order.0 as usize];
    let mut n = 0;
    while n < want {
        let Some(pfn) = b.rmqueue_smallest(order) else { break };
        zone.state(pfn).store(buddy::state(PCP, order), Ordering::Relaxed);
        list.push(pfn.0);
        n += 1;
    }
    drop(l);
    pcp.count += n << order.0;
    n
}

/// Puts a claimed block (head state `NONE`) on the lists and drains to the buddy when the
/// lists reach `high` (`free_unref_page_commit`). Returns the frames drained.
#[inline]
pub fn free_to_pcp(zone: &Zone, pcp: &mut PcpInner, pfn: Pfn, order: Order) -> usize {
    zone.state(pfn).store(buddy::state(PCP, order), Ordering::Relaxed);
    pcp.lists[order.0 as usize].push(pfn.0);
    pcp.count += order.pages();
    pcp.free_count += order.pages();
    pcp.alloc_factor >>= 1;
    let high = nr_pcp_high(zone, pcp);
    if pcp.count >= high {
        // At least what brings the lists back within high + batch (a large block, or a high
        // that just shrank, can overshoot by more than one drain).
        let n = nr_pcp_free(pcp).max(pcp.count.saturating_sub(high + pcp.batch));
        return free_pcppages_bulk(zone, pcp, n);
    }
    0
}

/// `nr_pcp_high`: the current `high`, tuned first. Shrinks toward `high_min` while the zone is
/// below its high watermark (memory is short: keep less on pcp lists); grows by a batch under
/// sustained frees (`free_count` past `batch + high_min / 2` since the last refill).
#[inline]
fn nr_pcp_high(zone: &Zone, pcp: &mut PcpInner) -> usize {
    if pcp.high_min != pcp.high_max {
        if zone.nr_free() < zone.watermark(Watermark::High) {
            pcp.high = pcp.high.saturating_sub(pcp.batch << pcp.free_factor).max(pcp.high_min);
        } else if pcp.free_count >= pcp.batch + pcp.high_min / 2 {
            pcp.high = (pcp.high + pcp.batch).min(pcp.high_max);
        }
    }
    pcp.high
}

/// `nr_pcp_free`: how many frames to drain, `batch << free_factor` clamped to
/// `[batch, high - batch]`, raising `free_factor` while the scaled batch is below the cap.
#[inline]
fn nr_pcp_free(pcp: &mut PcpInner) -> usize {
    let (high, batch) = (pcp.high, pcp.batch);
    if high < batch {
        return 1;
    }
    let max_nr_free = high - batch;
    let scaled = batch << pcp.free_factor;
    if scaled < max_nr_free && pcp.free_factor < PCP_BATCH_SCALE_MAX {
        pcp.free_factor += 1;
    }
    scaled.clamp(batch, max_nr_free.max(batch))
}

/// Returns at least `nr` frames (or all there are) from the lists to the buddy lists under
/// one acquisition of the zone lock, oldest blocks first, lowest order first
/// (`free_pcppages_bulk`). Returns the frames freed.
pub fn free_pcppages_bulk(zone: &Zone, pcp: &mut PcpInner, nr: usize) -> usize {
    let mut freed = 0;
    let mut l = zone.lock();
    let mut b = l.buddy();
    for o in 0..NR_PCP_LISTS {
        if freed >= nr {
            break;
        }
        let pages = 1usize << o;
        let list = &mut pcp.lists[o];
        let take = (nr - freed).div_ceil(pages).min(list.len());
        for pfn in list.drain(..take) {
            // A claim exactly one copy wins: two racing frees under `free_check =
            // sequential` can leave copies of a frame on two CPUs' lists, and a pop on
            // another CPU takes no zone lock. A copy that loses (the first copy already
            // left with the tag) is dropped; `free_one` refuses a block already free.
            let claimed = zone.state(Pfn(pfn)).compare_exchange(
                buddy::state(PCP, Order(o as u8)),
                buddy::NONE,
                Ordering::Acquire,
                Ordering::Relaxed,
            );
            if claimed.is_ok() {
                b.free_one(Pfn(pfn), Order(o as u8));
            }
        }
        freed += take * pages;
    }
    drop(l);
    pcp.count -= freed;
    pcp.count_min = pcp.count_min.min(pcp.count);
    freed
}

/// Returns everything on the lists to the buddy (`drain_pages_zone`).
pub fn drain(zone: &Zone, pcp: &mut PcpInner) -> usize {
    let n = pcp.count;
    if n == 0 {
        return 0;
    }
    free_pcppages_bulk(zone, pcp, n)
}

/// `decay_pcp_high`: lowers an auto-tuned `high` of lists that have sat idle, to
/// `max(count - (batch << PCP_BATCH_SCALE_MAX), high - min(count_min, high / 5), high_min)`,
/// and drains what is above it. Returns the frames drained.
pub fn decay_high(zone: &Zone, pcp: &mut PcpInner) -> usize {
    let mut drained = 0;
    if pcp.high_min != pcp.high_max {
        pcp.high = decayed_high(pcp, pcp.count);
        if pcp.count > pcp.high {
            let n = pcp.count - pcp.high;
            drained = free_pcppages_bulk(zone, pcp, n);
        }
    }
    pcp.count_min = pcp.count;
    drained
}

/// The `high` a decay sets for lists holding `count` frames (auto-tuned `high` only).
fn decayed_high(pcp: &PcpInner, count: usize) -> usize {
    let by_count = count.saturating_sub(pcp.batch << PCP_BATCH_SCALE_MAX);
    let by_idle = pcp.high - pcp.count_min.min(pcp.high / 5);
    by_count.max(by_idle).max(pcp.high_min)
}

/// Whether [`decay_high`] on these lists, with `cache` blocks flushed into them first, would
/// change nothing: no new `high`, nothing to drain, `count_min` already the count. Computed
/// at every unlock so that the worker can skip idle lists without locking them.
pub fn decay_is_noop(pcp: &PcpInner, cache: usize) -> bool {
    let count = pcp.count + cache;
    pcp.count_min == count
        && (pcp.high_min == pcp.high_max || (decayed_high(pcp, count) == pcp.high && count <= pcp.high))
}

/// Sets `batch`, `high_min` and `high_max` (a change of tunables or of the zone's size);
/// `high` is clamped into the new bounds and the lists drained down to it.
pub fn set_high_and_batch(zone: &Zone, pcp: &mut PcpInner, batch: usize, high_min: usize, high_max: usize) {
    pcp.batch = batch;
    pcp.high_min = high_min;
    pcp.high_max = high_max;
    pcp.high = pcp.high.clamp(high_min, high_max);
    if pcp.count >= pcp.high {
        let n = pcp.count - pcp.high;
        free_pcppages_bulk(zone, pcp, n.max(1));
    }
}

/// Checks the pcp invariants of one CPU's lists for `zone`; returns the frames on them.
pub fn check(zone: &Zone, pcp: &PcpInner) -> Result<usize, String> {
    let mut pages = 0;
    for (o, list) in pcp.lists.iter().enumerate() {
        for &pfn in list {
            let s = zone.state(Pfn(pfn)).load(Ordering::Relaxed);
            if s != buddy::state(PCP, Order(o as u8)) {
                return Err(format!("zone {}: pcp block {pfn:#x} on list {o} has state {s:#x}", zone.id.0));
            }
        }
        pages += list.len() << o;
    }
    if pages != pcp.count {
        return Err(format!("zone {}: pcp count {} but the lists hold {pages} frames", zone.id.0, pcp.count));
    }
    if pcp.count > pcp.high + pcp.batch {
        return Err(format!(
            "zone {}: pcp count {} above high {} + batch {}",
            zone.id.0, pcp.count, pcp.high, pcp.batch
        ));
    }
    Ok(pages)
}

/// The blocks on the lists (for invariant walks).
pub fn blocks(pcp: &PcpInner) -> impl Iterator<Item = (Pfn, Order)> + '_ {
    pcp.lists.iter().enumerate().flat_map(|(o, l)| l.iter().map(move |&p| (Pfn(p), Order(o as u8))))
}

pub mod rseq;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::types::{NodeId, ZoneId};

    #[test]
    fn batch_and_high_follow_linux() {
        // 1 GiB and above: 63.
        assert_eq!(zone_batchsize(1 << 18), 63);
        assert_eq!(zone_batchsize(1 << 22), 63);
        // 64 MiB: min(16, 256) / 4 = 4, 4 + 2 = 6 -> 4 - 1 = 3.
        assert_eq!(zone_batchsize(1 << 14), 3);
        // Tiny zones still get a batch of 1.
        assert_eq!(zone_batchsize(16), 1);
        assert_eq!(zone_highsize(1000, 1 << 20, 63, 4, 8, 0), 252);
        assert_eq!(zone_highsize(1000, 1 << 20, 63, 4, 8, 8), (1 << 17) / 4);
        assert_eq!(zone_highsize(1000, 1 << 20, 63, 0, 8, 0), 252);
        assert_eq!(zone_highsize(10, 1 << 20, 63, 1, 8, 0), 252);
    }

    fn zone() -> Zone {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 256, Order(3));
        z.setup_watermarks(128, 256, 10);
        z
    }

    #[test]
    fn refill_alloc_free_drain() {
        let z = zone();
        let pcp = PerCpuPages::new(0, 2, 8, 8);
        let mut g = pcp.try_lock(&z).unwrap();
        assert!(pcp.try_lock(&z).is_none(), "the lock excludes a second taker");
        let p = g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap();
        // Refilled max(batch, 2) = 2 blocks, took one.
        g.with(|i| assert_eq!((i.count, i.list_len(Order(0))), (1, 1)));
        assert_eq!(z.page_state_snapshot(ZoneStatItem::NrFreePages), 254);
        g.with(|i| check(&z, i)).unwrap();
        let mut blocks = vec![p];
        for _ in 0..10 {
            blocks.push(g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap());
        }
        for &b in &blocks {
            g.with(|i| free_to_pcp(&z, i, b, Order(0)));
            g.with(|i| {
                assert!(i.count < i.high, "count {} high {}", i.count, i.high);
                check(&z, i).unwrap();
            });
        }
        let drained = g.with(|i| drain(&z, i));
        assert!(drained > 0);
        g.with(|i| assert_eq!(i.count, 0));
        assert_eq!(z.page_state_snapshot(ZoneStatItem::NrFreePages), 256);
        drop(g);
        assert_eq!(z.check_invariants(0), Ok(0));
        assert!(pcp.try_lock(&z).is_some(), "dropping the guard unlocks");
    }

    #[test]
    fn high_grows_under_sustained_frees_and_decays_when_idle() {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 4096, Order(3));
        z.setup_watermarks(128, 4096, 10);
        let pcp = PerCpuPages::new(0, 4, 16, 256);
        let mut g = pcp.lock(&z);
        let blocks: Vec<Pfn> = (0..200).map(|_| g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap()).collect();
        let grown_by_refills = g.with(|i| i.high);
        assert!(grown_by_refills > 16, "refills from a zone above high grow high");
        for b in blocks {
            g.with(|i| free_to_pcp(&z, i, b, Order(0)));
        }
        let high = g.with(|i| i.high);
        assert!(high <= 256);
        // Idle: each decay lowers high toward high_min and drains above it.
        for _ in 0..40 {
            g.with(|i| decay_high(&z, i));
        }
        g.with(|i| {
            assert_eq!(i.high, 16);
            assert!(i.count <= 16);
            check(&z, i).unwrap();
        });
    }

    #[test]
    fn refills_double_under_sustained_allocation_and_shrink_on_free() {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 4096, Order(3));
        z.setup_watermarks(128, 4096, 10);
        let pcp = PerCpuPages::new(0, 4, 512, 512);
        let mut g = pcp.lock(&z);
        let mut sizes = Vec::new();
        let mut taken = Vec::new();
        for _ in 0..4 {
            // Empty the order-0 list, then one more allocation refills it.
            while g.with(|i| i.list_len(Order(0))) > 0 {
                taken.push(g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap());
            }
            let before = z.page_state_snapshot(ZoneStatItem::NrFreePages);
            taken.push(g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap());
            sizes.push(before - z.page_state_snapshot(ZoneStatItem::NrFreePages));
        }
        assert_eq!(sizes, vec![4, 8, 16, 32], "batch << alloc_factor, doubling");
        g.with(|i| free_to_pcp(&z, i, taken.pop().unwrap(), Order(0)));
        assert_eq!(g.with(|i| i.alloc_factor), 2, "a free halves alloc_factor");
        for p in taken {
            g.with(|i| free_to_pcp(&z, i, p, Order(0)));
        }
        g.with(|i| drain(&z, i));
        drop(g);
        assert_eq!(z.check_invariants(0), Ok(0));
    }

    /// The worker's hint: after decays have settled, `decay_is_noop` holds and one more
    /// decay changes nothing; right after activity it does not hold.
    #[test]
    fn decay_hint_says_when_a_decay_changes_nothing() {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 4096, Order(3));
        z.setup_watermarks(128, 4096, 10);
        let pcp = PerCpuPages::new(0, 4, 16, 256);
        let mut g = pcp.lock(&z);
        let blocks: Vec<Pfn> = (0..200).map(|_| g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap()).collect();
        for b in blocks {
            g.with(|i| free_to_pcp(&z, i, b, Order(0)));
        }
        drop(g);
        assert!(pcp.needs_decay(), "activity leaves work for the decay");
        let mut rounds = 0;
        while pcp.needs_decay() {
            pcp.lock(&z).with(|i| decay_high(&z, i));
            rounds += 1;
            assert!(rounds < 100, "the decay never settles");
        }
        let state = |g: &mut PcpGuard<'_>| g.with(|i| (i.high, i.count, i.count_min));
        let mut g = pcp.lock(&z);
        let before = state(&mut g);
        assert!(before.1 > 0, "frames stay on the lists");
        assert_eq!(g.with(|i| decay_high(&z, i)), 0);
        assert_eq!(state(&mut g), before, "a decay the hint skips changes nothing");
        g.with(|i| check(&z, i)).unwrap();
    }

    #[test]
    fn fixed_high_does_not_tune() {
        let z = zone();
        let pcp = PerCpuPages::new(0, 2, 8, 8);
        let mut g = pcp.lock(&z);
        let b: Vec<Pfn> = (0..30).map(|_| g.with(|i| rmqueue_pcplist(&z, i, Order(1))).unwrap()).collect();
        for p in b {
            g.with(|i| free_to_pcp(&z, i, p, Order(1)));
        }
        g.with(|i| decay_high(&z, i));
        g.with(|i| assert_eq!(i.high, 8));
    }
}

/// loom models of the pcp protocol: a try-lock that gives way to the buddy path, racing an
/// allocation, a free and a remote drain on one CPU's lists. Run with
/// `RUSTFLAGS="--cfg loom" cargo test -p zonal --release --lib loom_`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::buddy::ALLOCATED;
    use crate::types::{NodeId, ZoneId};
    use loom::sync::Arc;

    fn setup() -> (Arc<Zone>, Arc<PerCpuPages>) {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 8, Order(2));
        (Arc::new(z), Arc::new(PerCpuPages::new(0, 1, 4, 4)))
    }

    /// The allocation path: pcp if the try-lock succeeds, else the buddy lists.
    fn alloc(z: &Zone, pcp: &PerCpuPages) -> Option<Pfn> {
        let pfn = match pcp.try_lock(&z) {
            Some(mut g) => g.with(|p| rmqueue_pcplist(z, p, Order(0)))?,
            None => {
                let mut l = z.lock();
                let p = l.buddy().rmqueue_smallest(Order(0))?;
                p
            }
        };
        z.state(pfn).store(buddy::state(ALLOCATED, Order(0)), Ordering::Release);
        Some(pfn)
    }

    /// The free path: claim by CAS, then pcp if the try-lock succeeds, else the buddy lists.
    fn free(z: &Zone, pcp: &PerCpuPages, pfn: Pfn) -> bool {
        let claimed = z
            .state(pfn)
            .compare_exchange(buddy::state(ALLOCATED, Order(0)), buddy::NONE, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        if !claimed {
            return false;
        }
        match pcp.try_lock(&z) {
            Some(mut g) => {
                g.with(|p| free_to_pcp(z, p, pfn, Order(0)));
            }
            None => {
                let mut l = z.lock();
                l.buddy().free_one(pfn, Order(0));
            }
        }
        true
    }

    fn check_all(z: &Zone, pcp: &PerCpuPages, live: usize) {
        let on_pcp = pcp.lock(&z).with(|p| check(z, p)).unwrap();
        assert_eq!(z.check_invariants(on_pcp), Ok(live));
    }

    #[test]
    fn loom_alloc_free_drain_race() {
        loom::model(|| {
            let (z, pcp) = setup();
            let first = alloc(&z, &pcp).unwrap();
            let t1 = {
                let (z, pcp) = (z.clone(), pcp.clone());
                loom::thread::spawn(move || alloc(&z, &pcp))
            };
            let t2 = {
                let (z, pcp) = (z.clone(), pcp.clone());
                loom::thread::spawn(move || assert!(free(&z, &pcp, first)))
            };
            pcp.lock(&z).with(|p| drain(&z, p));
            let second = t1.join().unwrap().expect("8 frames: the allocation cannot fail");
            t2.join().unwrap();
            assert_ne!(second, Pfn(usize::MAX));
            check_all(&z, &pcp, 1);
        });
    }

    #[test]
    fn loom_double_free_exactly_one_wins() {
        loom::model(|| {
            let (z, pcp) = setup();
            let p = alloc(&z, &pcp).unwrap();
            let t = {
                let (z, pcp) = (z.clone(), pcp.clone());
                loom::thread::spawn(move || free(&z, &pcp, p))
            };
            let here = free(&z, &pcp, p);
            let there = t.join().unwrap();
            assert!(here ^ there, "exactly one of two racing frees succeeds");
            check_all(&z, &pcp, 0);
        });
    }
}
