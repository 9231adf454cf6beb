//! A zone: a range of frames of one node with its own free lists, watermarks and counters.
//!
//! Kernel counterpart: `struct zone` (mmzone.h), `__setup_per_zone_wmarks`,
//! `calculate_min_free_kbytes`, `__zone_watermark_ok`.
//!
//! Locking: `lock` (the zone lock) protects the free lists; `ZoneLocked` is the proof that
//! it is held. The free counts are zone counters ([`crate::vmstat`]): the changes a lock
//! holder makes are added to its CPU's diffs when it unlocks, and folded into the zone's
//! counters past `stat_threshold`. Watermark checks read the folded count, or a snapshot when
//! it lies below `percpu_drift_mark` and the drift could decide the answer. The frame state
//! bytes (`mem_map`) are atomics; see the `buddy` module for their protocol.
//!
//! Invariant (quiescent): `nr_free + pcp + allocated == managed`, where `allocated` sums the
//! blocks whose head is `ALLOCATED`; see `Zone::check_invariants`.

use crate::buddy::{self, Buddy, FreeArea};
use crate::mem_map;
use crate::mem_map::{MemMap, ZoneMap};
use crate::sync::{self, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Mutex, MutexGuard, Ordering};
use crate::types::{NodeId, Order, Pfn, ZoneId, PAGE_SHIFT};
use crate::vmstat::{self, PerCpuZoneDiffs, ZoneCounters, ZoneStatItem};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::sync::Arc;

/// Zone types. zonal gives every node one `Normal` zone; the type exists so reports carry
/// the kernel's names and so more zone types can be added without changing the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZoneType {
    /// `ZONE_NORMAL`.
    Normal,
}

impl ZoneType {
    /// The kernel's name, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            ZoneType::Normal => "Normal",
        }
    }
}

/// Watermark levels (`enum zone_watermarks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watermark {
    /// `WMARK_MIN`: below it only high-priority allocations succeed.
    Min = 0,
    /// `WMARK_LOW`: the fast path's mark.
    Low = 1,
    /// `WMARK_HIGH`.
    High = 2,
    /// `WMARK_PROMO` (Linux 6.1+): one more step above high, for memory tiering.
    Promo = 3,
}

/// Default `watermark_scale_factor` (vm.rst: 10, i.e. 0.1% of the zone).
pub const DEFAULT_WATERMARK_SCALE_FACTOR: u32 = 10;
/// Upper bound of `watermark_scale_factor` (vm.rst: 3000, i.e. 30%).
pub const MAX_WATERMARK_SCALE_FACTOR: u32 = 3000;

/// `Zone::above_low`'s level when an order-0 allocation passes the `low` watermark (and a
/// larger one may not): what the order-0 cache's section asks for (any non-zero level).
pub(crate) const ABOVE_LOW_ORDER0: u8 = 1;
/// `Zone::above_low`'s level when an allocation of every order up to 3
/// (`PAGE_ALLOC_COSTLY_ORDER`, the orders with rseq caches) passes `low`: what the sections
/// of the caches of orders 1 to 3 ask for.
pub(crate) const ABOVE_LOW_SMALL: u8 = 2;
/// How far above the `low` edge the free count must be for [`ABOVE_LOW_SMALL`]: an order-`o`
/// allocation asks for `free - (2^o - 1) > low`, and the largest such `o` is 3.
const ABOVE_LOW_SMALL_MARGIN: usize = (1 << crate::types::PCP_MAX_ORDER) - 1;
/// `Zone::above_low`'s level when an allocation of the pageblock order (the THP cache's
/// section) passes `low` too, and so does every smaller order.
pub(crate) const ABOVE_LOW_THP: u8 = 3;
/// How far above the `low` edge the free count must be for [`ABOVE_LOW_THP`].
const ABOVE_LOW_THP_MARGIN: usize = (1 << crate::types::PCP_THP_ORDER.0) - 1;

/// What a zone's `above_low` level tells [`Zone::walk_ok`] about one demand, taken once a
/// walk ([`WalkLevels::of`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WalkLevels {
    /// The level from which a zone passes: any level with no watermark; under `low` whole,
    /// the level whose margin covers the order's `2^order - 1` frames (none above the
    /// pageblock order's); no level (`u8::MAX`) at the other marks, where the count decides.
    pass: u8,
    /// Whether level 0 fails: under `low` whole, where the exact count at or below `low`
    /// passes no order.
    zero_fails: bool,
}

impl WalkLevels {
    /// The levels for an allocation of `order` under `level` (halved with `high`).
    #[inline]
    pub(crate) fn of(level: crate::zlc::Level, high: bool, order: Order) -> WalkLevels {
        let low_whole = level == crate::zlc::Level::Low && !high;
        let pass = match level {
            crate::zlc::Level::None => 0,
            _ if !low_whole => u8::MAX,
            _ => match order.pages() - 1 {
                0 => ABOVE_LOW_ORDER0,
                1..=ABOVE_LOW_SMALL_MARGIN => ABOVE_LOW_SMALL,
                m if m <= ABOVE_LOW_THP_MARGIN => ABOVE_LOW_THP,
                _ => u8::MAX,
            },
        };
        WalkLevels { pass, zero_fails: low_whole }
    }
}

/// `min_free_kbytes` as Linux computes it at boot: `sqrt(lowmem_kbytes * 16)`, clamped to
/// [128, 262144] (`calculate_min_free_kbytes`).
pub fn default_min_free_kbytes(lowmem_pages: usize) -> u64 {
    let lowmem_kb = (lowmem_pages as u64) << (PAGE_SHIFT - 10);
    isqrt(lowmem_kb * 16).clamp(128, 262_144)
}

fn isqrt(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let mut x = (n as f64).sqrt() as u64;
    while x * x > n {
        x -= 1;
    }
    while (x + 1) * (x + 1) <= n {
        x += 1;
    }
    x
}

/// One zone.
pub struct Zone {
    /// Index in the allocator's zone table.
    pub id: ZoneId,
    /// Node the zone belongs to.
    pub node: NodeId,
    /// Zone type.
    pub kind: ZoneType,
    /// First frame (aligned to the largest block).
    pub start_pfn: Pfn,
    /// Frames spanned (`spanned_pages`).
    pub spanned: usize,
    /// Frames present (`present_pages`): zonal zones have no holes, so equal to `spanned`.
    pub present: usize,
    /// Frames managed by the allocator (`managed_pages`).
    pub managed: usize,
    /// Largest order.
    pub max_order: Order,
    /// Watermarks in frames: min, low, high, promo (`_watermark[]`).
    watermark: [AtomicUsize; 4],
    /// The zone counters as folded (`vm_stat`).
    vm_stat: ZoneCounters,
    /// The whole allocator's folded counters, which every zone's folds also feed.
    global: Arc<ZoneCounters>,
    /// Per CPU: the diffs not yet folded and the threshold (`per_cpu_zonestats`).
    pcpu: Box<[PerCpuZoneDiffs]>,
    /// Linux's `percpu_drift_mark`: `high + max_drift` when the drift could hide the way from
    /// `low` to `min`, else 0. zonal's checks go further (see [`Zone::watermark_ok_fast`]).
    percpu_drift_mark: AtomicUsize,
    /// How far the folded free count can be from the truth: `nr_cpus * stat_threshold`.
    max_drift: AtomicUsize,
    /// Whether the pressure threshold is in force (free frames fell below `low`).
    pressure: AtomicBool,
    /// How far the exact free count is above the `low` watermark (clamped to `managed`), in
    /// the levels the per-CPU caches' sections test ([`ABOVE_LOW_ORDER0`],
    /// [`ABOVE_LOW_SMALL`], [`ABOVE_LOW_THP`]): the watermark test of an allocation of order
    /// 0, of every order up to 3, or of the pageblock order too, which those sections read
    /// through each of this zone's lists (its copies there, `PerCpuPages::gate`) instead of
    /// loading the count and the mark after their pop. Only the free count and the
    /// watermarks decide it, so it is kept where they change: by every holder of the zone
    /// lock that changes the count ([`ZoneLocked`]'s accounting) and by `setup_watermarks`,
    /// under the lock; it is written only when it flips, and on a line of its own, so that a
    /// zone whose count hovers at `low` (or at `low + 511`, the pageblock order's edge) does
    /// not bounce the line of the fields every allocation reads. Each flip writes every
    /// CPU's gate.
    above_low: CachePadded<std::sync::atomic::AtomicU8>,
    /// The copies of `above_low` in this zone's per-CPU lists (`PerCpuPages::gate`), which
    /// the allocation sections read with the lists' lock byte in one load, where reading the
    /// zone's took two (its address, then the byte): written with it, under the lock, once
    /// the handle has given the zone its lists ([`Zone::install_lists`]).
    lists: std::sync::OnceLock<Arc<dyn CpuLists>>,
    /// The zone lock, the lists it guards, the exact free count and the transfer list, on
    /// lines of their own (Linux's `ZONE_PADDING`): every CPU's refills and drains write them,
    /// while the fields above are read by every allocation's watermark check.
    locked: CachePadded<LockedArea>,
    /// The frames' state bytes (zonal's `mem_map`): the handle's map, which holds this
    /// zone's frames from `start_pfn`.
    mem_map: Arc<MemMap>,
}

/// The zone's transfer list: order-0 frames one CPU's lists drained, waiting for another
/// CPU's refill, still tagged `PCP` and counted as per-CPU pages. zonal's addition, after
/// the transfer cache of Google's tcmalloc: where Linux sends every frame a CPU frees past
/// its `high` through the buddy (a merge under the zone lock) and every refill splits it
/// out again, a frame that crosses CPUs in a steady stream here moves as a pfn between
/// two lists. It holds at most the zone's low watermark in frames (what Linux lets the
/// CPUs of a zone keep on their lists together, `zone_highsize`), takes frames only while
/// the zone is at or above its high watermark, and gives them all back to the buddy in
/// `drain_all_pages` (so before any allocation fails).
///
/// Each CPU's inbox (`PerCpuPages::inbox`) is a list of this kind too: frames of that CPU's
/// runs that other CPUs freed, at most its owner's `high` within 256 and `pcp::INBOX_CAP`.
///
/// Locking: the pcp lock of the CPU that drains or refills, then this lock; the zone lock is
/// never taken while it is held, nor another list of this kind.
///
/// A frame is held as its offset from the zone's first frame, 4 bytes: a zone spans fewer
/// than 2^32 frames (its buddy links are `u32`, `buddy::MAX_ZONE_FRAMES`), and what a list
/// of this kind exists for is to carry frames from one CPU to another, whose reader then
/// fetches every line its writer wrote: at 8 bytes a frame, the inbox's lines were an
/// eighth of a line transfer each way per frame that `bench mixed` hands across CPUs.
#[derive(Debug)]
pub(crate) struct Transfer {
    frames: Mutex<Vec<u32>>,
    /// `frames.len()` as of its last unlock, so that a refill finds an empty list without
    /// the lock.
    len: AtomicUsize,
    /// Frames the list has taken in since it was made (an inbox's: `pcp_routed`), written
    /// under the lock.
    received: AtomicU64,
    /// The first frame of the zone whose frames the list holds, from which it counts them.
    base: usize,
}

impl Transfer {
    /// An empty list for the frames of the zone that starts at frame `base`.
    pub(crate) fn new(base: usize) -> Transfer {
        Transfer { frames: Mutex::new(Vec::new()), len: AtomicUsize::new(0), received: AtomicU64::new(0), base }
    }

    /// The frames, locked.
    #[inline]
    pub(crate) fn lock(&self) -> TransferLocked<'_> {
        TransferLocked { frames: sync::lock(&self.frames), list: self }
    }

    /// The frames the list held at its last unlock.
    #[inline]
    pub(crate) fn len_hint(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The frames the list has taken in since it was made.
    #[inline]
    pub(crate) fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

/// The transfer list, locked; publishes its length on unlock.
pub(crate) struct TransferLocked<'a> {
    frames: MutexGuard<'a, Vec<u32>>,
    list: &'a Transfer,
}

impl TransferLocked<'_> {
    /// The frames held.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.frames.len()
    }

    /// Appends `pfns`, frames of the list's zone.
    #[inline]
    pub(crate) fn extend(&mut self, pfns: impl IntoIterator<Item = usize>) {
        let (base, before) = (self.list.base, self.frames.len());
        self.frames.extend(pfns.into_iter().map(|pfn| {
            debug_assert!(pfn.wrapping_sub(base) < buddy::MAX_ZONE_FRAMES, "frame {pfn:#x} outside the zone");
            (pfn - base) as u32
        }));
        // The lock is held: a plain add cannot race with another writer.
        let (n, received) = ((self.frames.len() - before) as u64, &self.list.received);
        received.store(received.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Moves the newest `n` frames (at most [`TransferLocked::len`]) onto the end of `into`,
    /// oldest first.
    #[inline]
    pub(crate) fn take_newest(&mut self, n: usize, into: &mut Vec<usize>) {
        let (start, base) = (self.frames.len() - n, self.list.base);
        into.extend(self.frames[start..].iter().map(|&at| base + at as usize));
        self.frames.truncate(start);
    }

    /// Takes every frame, oldest first, and gives the list's room back.
    pub(crate) fn take_all(&mut self) -> Vec<usize> {
        let base = self.list.base;
        std::mem::take(&mut *self.frames).into_iter().map(|at| base + at as usize).collect()
    }

    /// The frames held, oldest first.
    pub(crate) fn frames(&self) -> impl Iterator<Item = usize> + '_ {
        self.frames.iter().map(|&at| self.list.base + at as usize)
    }
}

impl Drop for TransferLocked<'_> {
    #[inline]
    fn drop(&mut self) {
        self.list.len.store(self.frames.len(), Ordering::Relaxed);
    }
}

/// The zone lock with what it guards, and the free count its holders keep exact.
struct LockedArea {
    lock: Mutex<FreeArea>,
    /// Frames in the buddy lists, updated by each holder as it unlocks.
    free_pages: AtomicUsize,
    /// The transfer list (see [`Transfer`]): the CPUs that drain into it and refill from it
    /// are the zone lock's takers, and nothing on the allocation's fast way reads it.
    transfer: Transfer,
    /// A bit per CPU (as [`Zone::diffs`] indexes them) whose free-page diffs of this zone
    /// may be non-zero: set by the holder that adds to them, cleared by the fold that takes
    /// them, both under the zone lock (so a load and a store). The fold then reads the diffs
    /// of the CPUs that took the lock since the last one, not of every CPU.
    diff_cpus: Box<[AtomicU64]>,
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Zone")
            .field("id", &self.id)
            .field("node", &self.node)
            .field("start_pfn", &self.start_pfn)
            .field("managed", &self.managed)
            .field("nr_free", &self.page_state_snapshot(ZoneStatItem::NrFreePages))
            .finish()
    }
}

/// A zone's per-CPU lists, as the zone sees them: what it keeps in step with its
/// `above_low` (each CPU's gate) when that flips. The lists' type is the per-CPU layer's
/// (`pcp::ZoneLists`), which installs them ([`Zone::install_lists`]) and reaches them
/// again through [`CpuLists::as_any`]; the zone names nothing of that layer.
pub(crate) trait CpuLists: Send + Sync + 'static {
    /// Sets every CPU's gate to `level`; the zone lock is held.
    fn set_gates(&self, level: u8);
    /// A CPU whose gate is not `level`, and its gate (quiescent).
    fn gate_mismatch(&self, level: u8) -> Option<(usize, u8)>;
    /// The lists as their own type, for the layer that made them.
    fn as_any(&self) -> &dyn std::any::Any;
}

impl Zone {
    /// A zone of `pages` frames from `start`, all free, with counters for one CPU and a map
    /// of its own.
    #[cfg(test)]
    pub(crate) fn new(id: ZoneId, node: NodeId, start: Pfn, pages: usize, max_order: Order) -> Zone {
        let map = ZoneMap::new(Arc::new(MemMap::new(start.0 + pages)), start, pages);
        Zone::with_counters(id, node, map, max_order, 1, Arc::default())
    }

    /// A zone of the frames of `map`, all free, with per-CPU diffs for `nr_cpus` CPUs folding
    /// into `global` as well as into its own counters.
    pub(crate) fn with_counters(
        id: ZoneId,
        node: NodeId,
        map: ZoneMap,
        max_order: Order,
        nr_cpus: usize,
        global: Arc<ZoneCounters>,
    ) -> Zone {
        let (map, start, pages) = map.into_parts();
        let z = Zone {
            id,
            node,
            kind: ZoneType::Normal,
            start_pfn: start,
            spanned: pages,
            present: pages,
            managed: pages,
            max_order,
            watermark: [AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)],
            vm_stat: ZoneCounters::default(),
            global,
            pcpu: (0..nr_cpus.max(1)).map(|_| PerCpuZoneDiffs::default()).collect(),
            percpu_drift_mark: AtomicUsize::new(0),
            max_drift: AtomicUsize::new(0),
            pressure: AtomicBool::new(false),
            above_low: CachePadded::new(std::sync::atomic::AtomicU8::new(0)),
            lists: std::sync::OnceLock::new(),
            locked: CachePadded::new(LockedArea {
                lock: Mutex::new(FreeArea::new(pages)),
                free_pages: AtomicUsize::new(0),
                transfer: Transfer::new(start.0),
                diff_cpus: (0..nr_cpus.max(1).div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            }),
            mem_map: map,
        };
        z.refresh_stat_thresholds();
        z.lock().buddy().free_range(start, pages);
        z
    }

    /// Takes the zone lock.
    #[inline]
    pub(crate) fn lock(&self) -> ZoneLocked<'_> {
        ZoneLocked { zone: self, area: sync::lock(&self.locked.lock) }
    }

    /// The zone's transfer list.
    #[inline]
    pub(crate) fn transfer(&self) -> &Transfer {
        &self.locked.transfer
    }

    /// Whether the zone spans a frame.
    #[inline]
    pub fn contains(&self, pfn: Pfn) -> bool {
        pfn.0.wrapping_sub(self.start_pfn.0) < self.spanned
    }

    /// The state byte of a frame of this zone (see [`crate::buddy`]).
    #[inline]
    pub(crate) fn state(&self, pfn: Pfn) -> &AtomicU8 {
        debug_assert!(self.contains(pfn), "frame {} outside zone {}", pfn.0, self.id.0);
        self.mem_map.state(pfn)
    }

    /// The CPU whose lists last took frames of `pfn`'s run, or `mem_map::NO_OWNER`: a hint
    /// (see `mem_map::MemMap`).
    #[inline]
    pub(crate) fn run_owner(&self, pfn: Pfn) -> u16 {
        self.mem_map.run_owner(pfn)
    }

    /// Names `cpu` the owner of `pfn`'s run (a refill's, under its pcp lock; last writer
    /// wins), when the whole run lies in this zone: a run that a zone's edge cuts (a zone
    /// smaller than a run, or not aligned to one) stays nobody's, so that a run's owner
    /// always names lists whose zone holds every frame of it, which the fast free's section
    /// trusts (see `pcp::rseq::push_frame`).
    #[inline]
    pub(crate) fn set_run_owner(&self, pfn: Pfn, cpu: u16) {
        if self.holds_run(pfn) {
            self.mem_map.set_run_owner(pfn, cpu);
        }
    }

    /// Whether every frame of `pfn`'s run lies in this zone.
    #[inline]
    pub(crate) fn holds_run(&self, pfn: Pfn) -> bool {
        let first = pfn.0 >> mem_map::RUN_ORDER.0 << mem_map::RUN_ORDER.0;
        first >= self.start_pfn.0 && first + (1 << mem_map::RUN_ORDER.0) <= self.start_pfn.0 + self.spanned
    }

    /// This zone's per-CPU lists, once the handle has given the zone them
    /// ([`Zone::install_lists`]); `None` before (lists built apart from a handle, in tests).
    #[inline]
    pub(crate) fn cpu_lists(&self) -> Option<&dyn CpuLists> {
        self.lists.get().map(|l| &**l)
    }

    /// This zone's state bytes, in frame order from its first frame (invariant walks).
    fn states(&self) -> &[AtomicU8] {
        self.mem_map.range(self.start_pfn, self.spanned)
    }

    /// Free frames in the buddy lists as folded (`zone_page_state(NR_FREE_PAGES)`): behind
    /// the truth by at most `nr_cpus * stat_threshold`.
    #[inline]
    pub fn nr_free(&self) -> usize {
        self.vm_stat.get(ZoneStatItem::NrFreePages)
    }

    /// Free frames in the buddy lists as of the last release of the zone lock: exact, on the
    /// lock's lines.
    #[inline]
    pub fn nr_free_exact(&self) -> usize {
        self.locked.free_pages.load(Ordering::Relaxed)
    }

    /// A zone counter as folded (`zone_page_state`).
    #[inline]
    pub fn page_state(&self, item: ZoneStatItem) -> usize {
        self.vm_stat.get(item)
    }

    /// A zone counter with every CPU's unfolded diff added (`zone_page_state_snapshot`):
    /// exact once changes stop.
    pub fn page_state_snapshot(&self, item: ZoneStatItem) -> usize {
        self.pcpu.iter().map(|d| d.diff(item)).sum::<isize>().saturating_add(self.vm_stat.raw(item)).max(0) as usize
    }

    /// Adds `delta` to an item through CPU `cpu`'s diff (`__mod_zone_page_state`). The
    /// caller holds the lock that guards the item: the zone lock for the free counts, the
    /// lists' lock of CPU `cpu` for [`ZoneStatItem::NrPcpPages`].
    #[inline]
    pub(crate) fn mod_page_state(&self, cpu: usize, item: ZoneStatItem, delta: isize) {
        self.diffs(cpu).add(item, delta, |v| self.fold_in(item, v));
    }

    /// CPU `cpu`'s diffs (an id past the table wraps around, as it always has). The compare
    /// spares the division of a bare modulo in the common case: a housekeeping pass asks
    /// for every CPU's, and at 1024 CPUs on 8 nodes the divisions were half the pass.
    #[inline]
    fn diffs(&self, cpu: usize) -> &PerCpuZoneDiffs {
        &self.pcpu[self.diff_index(cpu)]
    }

    /// The index of CPU `cpu`'s diffs (see [`Zone::diffs`]).
    #[inline]
    fn diff_index(&self, cpu: usize) -> usize {
        let n = self.pcpu.len();
        if cpu < n {
            cpu
        } else {
            cpu % n
        }
    }

    fn fold_in(&self, item: ZoneStatItem, v: isize) {
        self.vm_stat.add(item, v);
        self.global.add(item, v);
    }

    /// Folds CPU `cpu`'s diff of an item into the counters (the periodic fold). The caller
    /// holds the lock that guards the item, as for [`Zone::mod_page_state`].
    pub(crate) fn fold_diff(&self, cpu: usize, item: ZoneStatItem) {
        self.fold_from(self.diffs(cpu), item);
    }

    /// Folds one CPU's diff `d` of an item into the counters (see [`Zone::fold_diff`]).
    #[inline]
    fn fold_from(&self, d: &PerCpuZoneDiffs, item: ZoneStatItem) {
        let v = d.take(item);
        if v != 0 {
            self.fold_in(item, v);
        }
    }

    /// CPU `cpu`'s unfolded diff of an item, read without the item's lock: a hint (for
    /// skipping folds that would find nothing), exact once changes stop.
    pub(crate) fn diff(&self, cpu: usize, item: ZoneStatItem) -> isize {
        self.diffs(cpu).diff(item)
    }

    /// Prefetches CPU `cpu`'s diffs, for a sweep that reads them next.
    #[inline]
    pub(crate) fn prefetch_diffs(&self, cpu: usize) {
        crate::sync::prefetch_read(self.diffs(cpu));
    }

    /// The threshold CPU `cpu` folds this zone's diffs at (`vm stats threshold`).
    pub fn stat_threshold(&self, cpu: usize) -> usize {
        self.diffs(cpu).threshold()
    }

    /// `percpu_drift_mark` (0: the drift never matters).
    pub fn percpu_drift_mark(&self) -> usize {
        self.percpu_drift_mark.load(Ordering::Relaxed)
    }

    /// Whether the pressure threshold is in force.
    pub fn under_pressure(&self) -> bool {
        self.pressure.load(Ordering::Relaxed)
    }

    /// `refresh_zone_stat_thresholds` for this zone: the normal threshold for every CPU and
    /// the drift mark from it. Call after the watermarks change.
    pub(crate) fn refresh_stat_thresholds(&self) {
        let cpus = self.pcpu.len();
        let t = vmstat::normal_threshold(cpus, self.managed);
        self.set_threshold(t, false);
        let (min, low, high) =
            (self.watermark(Watermark::Min), self.watermark(Watermark::Low), self.watermark(Watermark::High));
        self.percpu_drift_mark.store(vmstat::percpu_drift_mark(cpus, t, min, low, high), Ordering::Relaxed);
    }

    /// Switches between the pressure threshold (`set_pgdat_percpu_threshold` with
    /// `calculate_pressure_threshold`, as when kswapd wakes) and the normal one. Returns
    /// whether anything changed.
    pub(crate) fn set_pressure(&self, on: bool) -> bool {
        // A load first, without the lock: the slow path calls this on every zone it walks.
        if self.pressure.load(Ordering::Relaxed) == on {
            return false;
        }
        let cpus = self.pcpu.len();
        let t = if on {
            vmstat::pressure_threshold(cpus, self.watermark(Watermark::Low), self.watermark(Watermark::Min))
        } else {
            vmstat::normal_threshold(cpus, self.managed)
        };
        self.set_threshold(t, on)
    }

    /// Sets every CPU's threshold and the pressure flag together under the zone lock, with
    /// the free-count diffs folded first: no diff is then larger than the new threshold allows,
    /// so `max_drift` is true from the moment it is stored. (The pages-on-lists diffs keep
    /// their old size until their next update; nothing decides on them.) Returns whether the
    /// flag changed.
    fn set_threshold(&self, t: usize, pressure: bool) -> bool {
        let mut l = self.lock();
        let changed = self.pressure.swap(pressure, Ordering::Relaxed) != pressure;
        l.fold_diffs();
        for d in self.pcpu.iter() {
            d.set_threshold(t);
        }
        self.max_drift.store(self.pcpu.len() * t.min(vmstat::MAX_STAT_THRESHOLD), Ordering::Relaxed);
        drop(l);
        changed
    }

    /// A watermark in frames.
    #[inline]
    pub fn watermark(&self, w: Watermark) -> usize {
        self.watermark[w as usize].load(Ordering::Relaxed)
    }

    /// The watermark of a zonelist-cache level (0 for [`crate::zlc::Level::None`]).
    #[inline]
    pub(crate) fn watermark_of(&self, level: crate::zlc::Level) -> usize {
        match level {
            crate::zlc::Level::None => 0,
            crate::zlc::Level::Min => self.watermark(Watermark::Min),
            crate::zlc::Level::Low => self.watermark(Watermark::Low),
            crate::zlc::Level::High => self.watermark(Watermark::High),
        }
    }

    /// Sets the watermarks from this zone's share of `min_free_kbytes` and the scale factor
    /// (`__setup_per_zone_wmarks`): `min` is the share in proportion to managed frames,
    /// `tmp = max(min/4, managed * wsf / 10000)`, `low = min + tmp`, `high = min + 2*tmp`,
    /// `promo = min + 3*tmp`.
    pub(crate) fn setup_watermarks(&self, min_free_kbytes: u64, lowmem_pages: usize, wsf: u32) {
        let pages_min = (min_free_kbytes >> (PAGE_SHIFT - 10)) as u128;
        let min = (pages_min * self.managed as u128 / lowmem_pages.max(1) as u128) as usize;
        let tmp = (min / 4).max((self.managed as u128 * wsf as u128 / 10_000) as usize);
        {
            // Under the lock, so that `above_low` agrees with the marks for every holder.
            let _l = self.lock();
            self.watermark[Watermark::Min as usize].store(min, Ordering::Relaxed);
            self.watermark[Watermark::Low as usize].store(min + tmp, Ordering::Relaxed);
            self.watermark[Watermark::High as usize].store(min + 2 * tmp, Ordering::Relaxed);
            self.watermark[Watermark::Promo as usize].store(min + 3 * tmp, Ordering::Relaxed);
            self.set_above_low(self.nr_free_exact());
        }
        self.refresh_stat_thresholds();
    }

    /// How far the exact free count is above `low` (see the field), for the sections that
    /// read it through a zone's lists.
    #[cfg(test)]
    pub(crate) fn above_low(&self) -> &std::sync::atomic::AtomicU8 {
        &self.above_low
    }

    /// The level of `Zone::above_low` for `free` frames: [`ABOVE_LOW_THP`] when an
    /// allocation of the pageblock order passes `low` (free above the edge by `2^9 - 1`),
    /// [`ABOVE_LOW_SMALL`] when one of any order up to `PAGE_ALLOC_COSTLY_ORDER` does (by
    /// `2^3 - 1`, what [`Zone::watermark_ok_fast`] asks of order 3), [`ABOVE_LOW_ORDER0`]
    /// when only order 0 does, else 0.
    fn above_low_level(&self, free: usize) -> u8 {
        let edge = self.low_edge();
        if free > edge + ABOVE_LOW_THP_MARGIN {
            ABOVE_LOW_THP
        } else if free > edge + ABOVE_LOW_SMALL_MARGIN {
            ABOVE_LOW_SMALL
        } else if free > edge {
            ABOVE_LOW_ORDER0
        } else {
            0
        }
    }

    /// Sets `Zone::above_low` from the exact free count `free`, and its copies in the
    /// zone's lists; the zone lock is held.
    fn set_above_low(&self, free: usize) {
        let above = self.above_low_level(free);
        if self.above_low.load(std::sync::atomic::Ordering::Relaxed) != above {
            self.above_low.store(above, std::sync::atomic::Ordering::Relaxed);
            if let Some(l) = self.lists.get() {
                l.set_gates(above);
            }
        }
    }

    /// Gives the zone its per-CPU lists, whose gates it keeps equal to `Zone::above_low`
    /// from now on (see the field `lists`). Once: a second call changes nothing.
    pub(crate) fn install_lists(&self, lists: Arc<dyn CpuLists>) {
        let _l = self.lock();
        lists.set_gates(self.above_low.load(std::sync::atomic::Ordering::Relaxed));
        let _ = self.lists.set(lists);
    }

    /// Checks that every gate of this zone's lists equals `Zone::above_low` (quiescent).
    pub(crate) fn check_gates(&self) -> Result<(), String> {
        let Some(l) = self.lists.get() else { return Ok(()) };
        let above = self.above_low.load(std::sync::atomic::Ordering::Relaxed);
        match l.gate_mismatch(above) {
            Some((cpu, gate)) => Err(format!("zone {}: cpu {cpu}'s gate {gate} but above_low {above}", self.id.0)),
            None => Ok(()),
        }
    }

    /// The free count an order-0 allocation must exceed under `low`: the mark, clamped to
    /// `managed` as [`Zone::watermark_ok_fast`] clamps every mark.
    fn low_edge(&self) -> usize {
        self.watermark(Watermark::Low).min(self.managed)
    }

    /// `__zone_watermark_ok`: may an allocation of `order` take frames, leaving the zone above
    /// `mark`? `high` halves the mark (`ALLOC_HIGH`, `__GFP_HIGH`). For `order > 0` a block of
    /// at least that order must also be free; that part reads the lists under the lock.
    pub fn watermark_ok(&self, order: Order, mark: usize, high: bool) -> bool {
        if !self.watermark_ok_fast(order, mark, high) {
            return false;
        }
        order.0 == 0 || self.lock().area.has_block_at_least(order, self.max_order)
    }

    /// The walk's watermark test (`get_page_from_freelist`'s): [`Zone::watermark_ok_fast`] at
    /// `level`'s mark (halved with `high`; a pass at [`Level::None`](crate::zlc::Level)),
    /// decided by the zone's `above_low` level where it can be (`w`, [`WalkLevels::of`] the
    /// three): a level at least `w.pass` passes; under `low` whole, level 0 fails;
    /// otherwise (a level between, orders 1 to 3 within 7 frames of the edge or 4 to 9
    /// within 511, an order above 9, another mark) the count decides. The lock holders keep
    /// the level from the exact count, which the count test also reads near the edge, so
    /// both answer alike.
    ///
    /// Two costs go. The level sits on a line of its own, written only when it flips, where
    /// the folded count shares the counters' line, which every fold writes: a zone that two
    /// CPUs refill from and drain to folds its count on every batch (batch 15 against a
    /// threshold of 12 at 256 MiB), and each fold cost the other CPU's next test a miss. And
    /// a full zone is one load and two compares, where the count test loaded the mark, the
    /// count, `managed` and the drift. Seed 003's hog past 27 full zones (`bench zlc`, one
    /// thread, alternated): 59.8 to 41.0 ns a page with the zonelist cache off, 22.6 to 21.6
    /// with it on.
    #[inline]
    pub(crate) fn walk_ok(&self, order: Order, level: crate::zlc::Level, high: bool, w: WalkLevels) -> bool {
        let lv = self.above_low.load(std::sync::atomic::Ordering::Relaxed);
        lv >= w.pass || (lv != 0 || !w.zero_fails) && self.watermark_ok_fast(order, self.watermark_of(level), high)
    }

    /// The counting half of [`Zone::watermark_ok`], without the lock: whether taking a block
    /// of `order` leaves more than `mark` (halved with `high`) free frames. The allocation path
    /// uses this and lets `rmqueue` find out whether a block of the order exists, under the one
    /// lock acquisition it needs anyway.
    ///
    /// It reads the folded free count (a read-mostly line), and the exact count the zone
    /// lock's holders keep (one line, written by them) when the folded count lies within the
    /// largest drift of the answer's edge, where the drift could decide it. Linux instead
    /// reads every CPU's diff (`zone_page_state_snapshot`, a line per CPU), and only below
    /// `percpu_drift_mark` (`zone_watermark_ok_safe`), so its checks may be off by the drift
    /// elsewhere; zonal's are exact at every mark and cost at most one more line, whatever
    /// the number of CPUs: every change of the free count is made under the zone lock, so the
    /// holder can keep the exact total at no cost beyond the lines it writes anyway.
    #[inline]
    pub fn watermark_ok_fast(&self, order: Order, mark: usize, high: bool) -> bool {
        // No zone keeps more than `managed` free, so a larger mark fails as `managed` does;
        // the clamp keeps the sums below from overflowing on any mark.
        let min = if high { mark - mark / 2 } else { mark }.min(self.managed);
        // free - (pages - 1) > min
        let edge = min + order.pages() - 1;
        let mut free = self.nr_free();
        if free <= edge + self.max_drift.load(Ordering::Relaxed) {
            free = self.nr_free_exact();
        }
        free > edge
    }

    /// Folds every diff now (tests).
    #[cfg(all(test, not(loom)))]
    fn fold_diffs_for_test(&self) {
        self.lock().fold_diffs();
    }

    /// Free blocks per order, `0..=max_order` (what `/proc/buddyinfo` prints).
    pub fn free_blocks(&self) -> Vec<usize> {
        let l = self.lock();
        (0..=self.max_order.0).map(|o| l.area.nr_free(Order(o))).collect()
    }

    /// The free lists' invariants that hold at every instant under the zone lock, so under
    /// concurrent use too: each block on `free_area[o]` is tagged `BUDDY|o`, aligned, counted,
    /// and overlaps no other free block. O(free blocks); what `debug-vm` checks after every
    /// buddy operation.
    #[cfg_attr(not(feature = "debug-vm"), allow(dead_code))]
    pub(crate) fn debug_check_free_area(&self) -> Result<(), String> {
        let l = self.lock();
        let mut free = vec![false; self.spanned];
        for o in 0..=self.max_order.0 {
            let order = Order(o);
            let mut n = 0;
            for idx in l.area.iter(order) {
                let i = idx as usize;
                let s = self.states().get(i).map(|s| s.load(Ordering::Relaxed));
                if s != Some(mem_map::state(mem_map::BUDDY, order)) || i % order.pages() != 0 {
                    return Err(format!(
                        "zone {}: block {idx} on free_area[{o}] has state {s:?} or is misaligned",
                        self.id.0
                    ));
                }
                match free.get_mut(i..i + order.pages()) {
                    Some(r) if !r.contains(&true) => r.fill(true),
                    _ => return Err(format!("zone {}: free block {idx} of order {o} overlaps another", self.id.0)),
                }
                n += 1;
            }
            if n != l.area.nr_free(order) {
                return Err(format!(
                    "zone {}: free_area[{o}] counts {} but holds {n}",
                    self.id.0,
                    l.area.nr_free(order)
                ));
            }
        }
        Ok(())
    }

    /// Checks the zone's invariants given the frames its per-CPU lists hold (`on_pcp`, checked
    /// by the caller); returns the number of allocated frames. Call only while no allocation or
    /// free runs on this zone. O(frames).
    pub(crate) fn check_invariants(&self, on_pcp: usize) -> Result<usize, String> {
        let l = self.lock();
        let mut covered = vec![false; self.spanned];
        let mut free = 0usize;
        let mut mark = |start: usize, pages: usize, what: &str| -> Result<(), String> {
            for c in &mut covered[start..start + pages] {
                if *c {
                    return Err(format!("zone {}: {what} block at index {start} overlaps another", self.id.0));
                }
                *c = true;
            }
            Ok(())
        };
        for o in 0..=self.max_order.0 {
            let order = Order(o);
            let mut n = 0;
            for idx in l.area.iter(order) {
                let s = self.states()[idx as usize].load(Ordering::Relaxed);
                if s != mem_map::state(mem_map::BUDDY, order) {
                    return Err(format!("zone {}: block {idx} on free_area[{o}] has state {s:#x}", self.id.0));
                }
                if idx as usize % order.pages() != 0 {
                    return Err(format!("zone {}: block {idx} on free_area[{o}] is misaligned", self.id.0));
                }
                mark(idx as usize, order.pages(), "free")?;
                n += 1;
                free += order.pages();
            }
            if n != l.area.nr_free(order) {
                return Err(format!(
                    "zone {}: free_area[{o}] counts {} but holds {n}",
                    self.id.0,
                    l.area.nr_free(order)
                ));
            }
        }
        let counted = self.page_state_snapshot(ZoneStatItem::NrFreePages);
        if free != counted {
            return Err(format!("zone {}: nr_free_pages {counted} but the lists hold {free}", self.id.0));
        }
        if self.nr_free_exact() != free {
            return Err(format!(
                "zone {}: exact free count {} but the lists hold {free}",
                self.id.0,
                self.nr_free_exact()
            ));
        }
        let above = self.above_low.load(std::sync::atomic::Ordering::Relaxed);
        if above != self.above_low_level(free) {
            return Err(format!(
                "zone {}: above_low {above} with {free} free and low {}",
                self.id.0,
                self.watermark(Watermark::Low)
            ));
        }
        self.check_gates()?;
        for o in 0..=self.max_order.0 {
            let (n, counted) =
                (l.area.nr_free(Order(o)), self.page_state_snapshot(ZoneStatItem::NrFreeOrder(Order(o))));
            if n != counted {
                return Err(format!("zone {}: nr_free_order_{o} {counted} but free_area[{o}] holds {n}", self.id.0));
            }
        }
        let mut allocated = 0;
        let mut pcp = 0;
        for (i, s) in self.states().iter().enumerate() {
            let (tag, order) = mem_map::decode(s.load(Ordering::Relaxed));
            match tag {
                mem_map::ALLOCATED => {
                    mark(i, order.pages(), "allocated")?;
                    allocated += order.pages();
                }
                mem_map::PCP => {
                    mark(i, order.pages(), "per-cpu")?;
                    pcp += order.pages();
                }
                mem_map::BUDDY if !l.area.iter(order).any(|x| x as usize == i) => {
                    return Err(format!("zone {}: frame {i} is tagged free but on no list", self.id.0));
                }
                _ => {}
            }
        }
        if pcp != on_pcp {
            return Err(format!("zone {}: {pcp} frames tagged per-cpu but the lists hold {on_pcp}", self.id.0));
        }
        if free + pcp + allocated != self.managed {
            return Err(format!(
                "zone {}: free {free} + pcp {pcp} + allocated {allocated} != managed {}",
                self.id.0, self.managed
            ));
        }
        Ok(allocated)
    }
}

/// Proof that a zone's lock is held (the kernel's "caller must hold zone->lock"). On drop it
/// accounts the changes made to the free lists, then unlocks.
pub(crate) struct ZoneLocked<'a> {
    zone: &'a Zone,
    area: MutexGuard<'a, FreeArea>,
}

impl Drop for ZoneLocked<'_> {
    #[inline]
    fn drop(&mut self) {
        self.account();
    }
}

impl ZoneLocked<'_> {
    /// The buddy operations on this zone.
    #[inline]
    pub(crate) fn buddy(&mut self) -> Buddy<'_> {
        Buddy {
            area: &mut self.area,
            mem_map: &self.zone.mem_map,
            start: self.zone.start_pfn,
            span: self.zone.spanned,
            max_order: self.zone.max_order,
        }
    }

    /// Folds every CPU's diffs of the items the zone lock guards (the periodic fold and
    /// `vm.stat_refresh`): those of the CPUs marked in `diff_cpus`, the only ones that can
    /// be non-zero.
    pub(crate) fn fold_diffs(&mut self) {
        self.account();
        let zone = self.zone;
        for (w, word) in zone.locked.diff_cpus.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            if bits == 0 {
                continue;
            }
            word.store(0, Ordering::Relaxed);
            while bits != 0 {
                let d = &zone.pcpu[w * 64 + bits.trailing_zeros() as usize];
                bits &= bits - 1;
                for item in std::iter::once(ZoneStatItem::NrFreePages)
                    .chain((0..=zone.max_order.0).map(|o| ZoneStatItem::NrFreeOrder(Order(o))))
                {
                    zone.fold_from(d, item);
                }
            }
        }
    }

    /// Adds the changes made to the free lists under this lock to this CPU's diffs.
    #[inline]
    fn account(&mut self) {
        if !self.area.changed() {
            return;
        }
        let cpu = crate::sys::current_cpu() as usize;
        // The lock is held: a load and a store cannot race with another writer.
        let i = self.zone.diff_index(cpu);
        let word = &self.zone.locked.diff_cpus[i / 64];
        let marked = word.load(Ordering::Relaxed);
        if marked & 1 << (i % 64) == 0 {
            word.store(marked | 1 << (i % 64), Ordering::Relaxed);
        }
        let mut pages = 0isize;
        for (o, &d) in self.area.take_changes().iter().enumerate().filter(|(_, &d)| d != 0) {
            self.zone.mod_page_state(cpu, ZoneStatItem::NrFreeOrder(Order(o as u8)), d as isize);
            pages += (d as isize) << o;
        }
        if pages != 0 {
            self.zone.mod_page_state(cpu, ZoneStatItem::NrFreePages, pages);
            // The lock is held: a load and a store cannot race with another writer.
            let exact = &self.zone.locked.free_pages;
            let free = exact.load(Ordering::Relaxed).wrapping_add_signed(pages);
            exact.store(free, Ordering::Relaxed);
            self.zone.set_above_low(free);
        }
    }
}

impl crate::mem_map::Frames for Zone {
    #[inline(always)]
    fn state(&self, pfn: Pfn) -> &AtomicU8 {
        Zone::state(self, pfn)
    }

    #[inline(always)]
    fn contains(&self, pfn: Pfn) -> bool {
        Zone::contains(self, pfn)
    }

    #[inline(always)]
    fn max_order(&self) -> Order {
        self.max_order
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn min_free_kbytes_matches_linux_samples() {
        // 16 GB of lowmem gives 16384 kB (vm.rst's table: 16G -> 16384k).
        assert_eq!(default_min_free_kbytes((16usize << 30) >> PAGE_SHIFT), 16_384);
        // Clamped at both ends.
        assert_eq!(default_min_free_kbytes(16), 128);
        assert_eq!(default_min_free_kbytes((1usize << 40) >> PAGE_SHIFT), 131_072);
        assert_eq!(default_min_free_kbytes((1usize << 44) >> PAGE_SHIFT), 262_144);
    }

    #[test]
    fn watermarks_follow_the_formula() {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 1 << 16, Order(10));
        z.setup_watermarks(1024, 1 << 17, 10);
        // This zone has half the lowmem: min = 256 pages / 2 = 128.
        assert_eq!(z.watermark(Watermark::Min), 128);
        // tmp = max(128/4, 65536*10/10000 = 65) = 65.
        assert_eq!(z.watermark(Watermark::Low), 193);
        assert_eq!(z.watermark(Watermark::High), 258);
        z.setup_watermarks(1024, 1 << 17, 1000);
        assert_eq!(z.watermark(Watermark::Low), 128 + 6553);
    }

    /// The folded count lags the truth by what the CPUs' diffs hold; the check near a mark
    /// reads the exact count the lock's holders keep, not the diffs, and is exact.
    #[test]
    fn watermark_check_near_the_mark_is_exact_without_the_diffs() {
        let map = ZoneMap::new(Arc::new(MemMap::new(1024)), Pfn(0), 1024);
        let z = Zone::with_counters(ZoneId(0), NodeId(0), map, Order(3), 64, Arc::default());
        z.fold_diffs_for_test();
        let mut taken = Vec::new();
        for _ in 0..10 {
            taken.push(z.lock().buddy().rmqueue_smallest(Order(0)).unwrap());
        }
        // Ten frames left in this CPU's diff (the threshold for 64 CPUs is larger).
        assert!(z.stat_threshold(0) > 10);
        assert_eq!(z.nr_free(), 1024, "folded: the diff has not been folded");
        assert_eq!(z.nr_free_exact(), 1014);
        assert_eq!(z.page_state_snapshot(ZoneStatItem::NrFreePages), 1014);
        // free - 0 > mark holds for mark 1013, not for 1014: exact, where the folded count
        // would have said yes to both.
        assert!(z.watermark_ok_fast(Order(0), 1013, false));
        assert!(!z.watermark_ok_fast(Order(0), 1014, false));
        for p in taken {
            z.lock().buddy().free_one(p, Order(0));
        }
        assert_eq!(z.nr_free_exact(), 1024);
        assert_eq!(z.check_invariants(0), Ok(0));
    }

    /// `walk_ok` (the walk's test) answers as `watermark_ok_fast` at every mark, halved or
    /// not (and passes with none), for every order, at every count from all free to none:
    /// across each `above_low` level's edge, and for orders whose margin no level covers.
    #[test]
    fn walk_ok_answers_as_the_count_does() {
        use crate::zlc::Level;
        let map = ZoneMap::new(Arc::new(MemMap::new(2048)), Pfn(0), 2048);
        let z = Zone::with_counters(ZoneId(0), NodeId(0), map, Order(10), 64, Arc::default());
        // min = 512 frames, tmp = 128: low = 640, high = 768.
        z.setup_watermarks(2048, 2048, 10);
        assert_eq!(z.watermark(Watermark::Low), 640);
        let check = |z: &Zone| {
            let free = z.nr_free_exact();
            for level in [Level::None, Level::Min, Level::Low, Level::High] {
                for high in [false, true] {
                    for o in 0..=10 {
                        let (order, w) = (Order(o), WalkLevels::of(level, high, Order(o)));
                        // No watermark: any zone is tried (its lists say whether a block is free).
                        let count = level == Level::None || z.watermark_ok_fast(order, z.watermark_of(level), high);
                        assert_eq!(
                            z.walk_ok(order, level, high, w),
                            count,
                            "{level:?}, halved {high}, order {o}, {free} free"
                        );
                    }
                }
            }
        };
        let mut taken = Vec::new();
        while let Some(p) = z.lock().buddy().rmqueue_smallest(Order(0)) {
            check(&z);
            taken.push(p);
        }
        check(&z);
        assert_eq!(z.nr_free_exact(), 0);
        // A mark clamped to `managed`: nothing passes `low`, even with every frame free.
        for p in taken {
            z.lock().buddy().free_one(p, Order(0));
        }
        z.setup_watermarks(1 << 30, 2048, 10);
        check(&z);
        assert!(!z.walk_ok(Order(0), Level::Low, false, WalkLevels::of(Level::Low, false, Order(0))));
        assert_eq!(z.check_invariants(0), Ok(0));
    }

    /// `above_low` (what the order-0 fast path reads for its watermark test) follows the
    /// exact free count across `low` both ways, and the marks when they move.
    #[test]
    fn above_low_follows_the_count_and_the_marks() {
        let map = ZoneMap::new(Arc::new(MemMap::new(1024)), Pfn(0), 1024);
        let z = Zone::with_counters(ZoneId(0), NodeId(0), map, Order(3), 64, Arc::default());
        let flag = || z.above_low().load(std::sync::atomic::Ordering::Relaxed) != 0;
        assert!(flag(), "no marks yet: 1024 free is above a low of 0");
        // min = 512 * 1024 / 2048 = 256 frames, tmp = 64: low = 320.
        z.setup_watermarks(2048, 2048, 10);
        assert_eq!(z.watermark(Watermark::Low), 320);
        assert!(flag());
        let mut taken = Vec::new();
        let level = || z.above_low().load(std::sync::atomic::Ordering::Relaxed);
        while z.nr_free_exact() > 321 {
            taken.push(z.lock().buddy().rmqueue_smallest(Order(0)).unwrap());
            let free = z.nr_free_exact();
            assert!(flag(), "{free} free");
            // Orders up to 3 pass `low` while `free - 7 > low`: from 328 free frames up; the
            // pageblock order while `free - 511 > low`: from 832 up.
            let want = match free {
                832.. => ABOVE_LOW_THP,
                328.. => ABOVE_LOW_SMALL,
                _ => ABOVE_LOW_ORDER0,
            };
            assert_eq!(level(), want, "{free} free");
            assert_eq!(level() >= ABOVE_LOW_SMALL, z.watermark_ok_fast(Order(3), 320, false), "{free} free");
            assert_eq!(level() == ABOVE_LOW_THP, z.watermark_ok_fast(Order(9), 320, false), "{free} free");
        }
        taken.push(z.lock().buddy().rmqueue_smallest(Order(0)).unwrap());
        assert_eq!(z.nr_free_exact(), 320);
        assert!(!flag(), "at low");
        // A lower mark lifts it without a change of the count, a higher one drops it again.
        z.setup_watermarks(1024, 2048, 10);
        assert!(flag());
        z.setup_watermarks(4096, 2048, 10);
        assert!(!flag());
        z.setup_watermarks(2048, 2048, 10);
        z.lock().buddy().free_one(taken.pop().unwrap(), Order(0));
        assert!(flag(), "321 free");
        // A mark above what the zone manages is clamped to it, as `watermark_ok_fast` does.
        for p in taken {
            z.lock().buddy().free_one(p, Order(0));
        }
        z.setup_watermarks(1 << 30, 2048, 10);
        assert!(z.watermark(Watermark::Low) > z.managed);
        assert!(!flag(), "all 1024 free is not above a mark clamped to 1024");
        assert_eq!(z.check_invariants(0), Ok(0));
    }

    #[test]
    fn watermark_check() {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 64, Order(3));
        assert!(z.watermark_ok(Order(0), 63, false));
        assert!(!z.watermark_ok(Order(0), 64, false));
        // High priority halves the mark.
        assert!(z.watermark_ok(Order(0), 120, true));
        assert!(z.watermark_ok(Order(3), 56, false));
        assert!(!z.watermark_ok(Order(3), 57, false));
        assert_eq!(z.check_invariants(0), Ok(0));
        assert_eq!(z.free_blocks(), vec![0, 0, 0, 8]);
    }
}
