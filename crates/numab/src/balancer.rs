//! The balancer: what its thread, the regions and the fault handler share (`Shared`: the
//! reserves, the counters, the regions), the `Balancer` handle, and the thread that refills,
//! scans, collapses and frees.

use crate::dest::CHUNK_PAGES;
use crate::region::allowed;
use crate::reserve::{FreeStack, NodeReserve, Reserve};
use crate::state::Cursor;
use crate::table::PageEntry;
use crate::Shared;
use crate::{
    collapse, dest, fault, os, scan, table, uffd, Backend, Config, Counters, Error, MigrateMode, Region, RegionShared,
    Result, Stats, Tunables, MAX_REGION_BYTES, PAGE,
};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use zonal::zone::Watermark;
use zonal::{Gfp, MemPolicy, NodeId, Zonal};

impl Shared {
    /// `numa_balancing` bit 0: normal balancing.
    pub(crate) fn enabled(&self) -> bool {
        self.cfg.enabled.load(Ordering::Relaxed)
    }

    /// `numa_balancing` bit 1: memory tiering, on a topology with a lower tier.
    pub(crate) fn tiering(&self) -> bool {
        self.cfg.tiering.load(Ordering::Relaxed) && self.tiers.has_lower()
    }

    /// Whether the scanner runs: either bit.
    pub(crate) fn scanning(&self) -> bool {
        self.enabled() || self.tiering()
    }

    /// Node `nid`'s watermark `w`, its zones' summed (atomics only).
    pub(crate) fn mark(&self, nid: u16, w: Watermark) -> usize {
        self.z
            .node_zones(NodeId(nid))
            .map(|ids| ids.iter().map(|id| self.z.zones()[id.0 as usize].watermark(w)).sum())
            .unwrap_or(0)
    }

    /// Node `nid`'s free pages (as `has_room_for` reads them).
    pub(crate) fn free_pages(&self, nid: u16) -> usize {
        self.z.nr_free_pages_approx(NodeId(nid)).unwrap_or(0)
    }

    /// Whether a hint fault on a lower-tier page whose scan was `latency_ms` ago should
    /// promote it to `dst` (see `tier`): plenty of free memory there
    /// (`pgdat_free_space_enough`: above high by 1 GiB or a sixteenth of the node), or hot
    /// and within the rate limit. Async-signal-safe.
    pub(crate) fn should_promote(&self, dst: u16, latency_ms: u64, now_ms: u64) -> bool {
        let managed: usize = self
            .z
            .node_zones(NodeId(dst))
            .map(|ids| ids.iter().map(|id| self.z.zones()[id.0 as usize].managed).sum())
            .unwrap_or(0);
        if self.has_room_for(dst, ((1usize << 30) / PAGE).max(managed / 16)) {
            return true;
        }
        let c = &self.cfg;
        let limits = crate::tier::Limits {
            now_ms,
            hot_ms: c.hot_threshold_ms.load(Ordering::Relaxed),
            rate_pages: c.promote_rate_limit_mbps.load(Ordering::Relaxed).saturating_mul((1 << 20) / PAGE as u64),
            period_ms: c.scan_period_max_ms.load(Ordering::Relaxed),
        };
        self.tier_nodes[dst as usize].promote(latency_ms, 1, &limits)
    }

    pub(crate) fn mode(&self) -> MigrateMode {
        if self.cfg.mode.load(Ordering::Relaxed) == 1 {
            MigrateMode::Eager
        } else {
            MigrateMode::Delayed
        }
    }

    /// Wakes the balancer's thread (async-signal-safe).
    pub(crate) fn kick(&self) {
        self.kick.fetch_add(1, Ordering::Release);
        os::futex_wake(&self.kick);
    }

    /// Wakes the balancer's thread when a reserve fell below half.
    pub(crate) fn kick_if_low(&self, nid: u16) {
        let r = &self.reserves[nid as usize];
        if r.len() < r.capacity() / 2 {
            self.kick();
        }
    }

    pub(crate) fn window_fault(&self, local: bool) {
        if local {
            self.win_local.fetch_add(1, Ordering::Relaxed);
        } else {
            self.win_remote.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn window_fail(&self) {
        self.win_fail.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether node `nid` has room for one more page above its high watermark
    /// (`migrate_balanced_pgdat`).
    pub(crate) fn has_room(&self, nid: u16) -> bool {
        self.has_room_for(nid, 1)
    }

    /// Whether node `nid` has room for `pages` more above its high watermark, by
    /// [`Zonal::nr_free_pages_approx`] (as Linux's `migrate_balanced_pgdat` reads
    /// `zone_page_state`): atomics only, no lock, so the signal handler may ask.
    pub(crate) fn has_room_for(&self, nid: u16, pages: usize) -> bool {
        self.z.nr_free_pages_approx(NodeId(nid)).is_ok_and(|free| free > self.high[nid as usize] + pages)
    }

    /// Returns a chunk a handler took but could not use (to its queue, or frame by frame to
    /// the free stack).
    pub(crate) fn give_back_chunk(&self, nid: u16, block: usize) {
        if self.chunks[nid as usize].put(block).is_err() {
            for i in 0..CHUNK_PAGES {
                // SAFETY: the chunk's frames are allocated, split and mapped nowhere else.
                unsafe { self.to_free.push(block + i * PAGE) };
            }
            self.kick();
        }
    }

    /// A frame for node `nid`, or the nearest node that has one in reserve, waiting for the
    /// balancer's thread to refill when every reserve is empty (however long that takes).
    /// `None` only when a refill pass that started after the first look found none of these
    /// nodes with a free frame: out of memory. Async-signal-safe (a futex wait).
    pub(crate) fn frame_for(&self, nid: u16, fallback: &[u16]) -> Option<usize> {
        let asked = self.refills.load(Ordering::Acquire);
        loop {
            // The node's own reserve; the others only once the node itself has run out (an
            // empty reserve is only a refill behind), as a first touch falls back by distance
            // when the node is full.
            let mut all_out = true;
            for &n in std::iter::once(&nid).chain(fallback) {
                if let Some(f) = self.reserves[n as usize].take(self.z.current_cpu()) {
                    self.kick_if_low(n);
                    return Some(f);
                }
                if !self.node_out[n as usize].load(Ordering::Acquire) {
                    all_out = false;
                    break;
                }
            }
            let seen = self.refills.load(Ordering::Acquire);
            // Two ends past the first look: a whole pass ran after it.
            if all_out && seen.wrapping_sub(asked) >= 2 {
                return None;
            }
            self.wait_refill(seen);
        }
    }

    /// Wakes the balancer's thread and sleeps until its next refill pass ends (at most
    /// 10 ms, then the caller looks again). Async-signal-safe.
    fn wait_refill(&self, seen: u32) {
        self.kick();
        os::futex_wait(&self.refills, seen, Duration::from_millis(10));
    }

    /// A block of `CHUNK_PAGES` consecutive frames of node `nid` (split, zeroed) for
    /// first-touch windows, waiting for a refill when the node's reserve is behind; `None`
    /// when the node's last refill found no free block of that order. Async-signal-safe.
    pub(crate) fn block_for(&self, nid: u16) -> Option<usize> {
        let r = self.blocks.get(nid as usize)?;
        loop {
            if let Some(b) = r.take() {
                self.kick();
                return Some(b);
            }
            if r.capacity() == 0 || self.blocks_out[nid as usize].load(Ordering::Acquire) {
                return None;
            }
            self.wait_refill(self.refills.load(Ordering::Acquire));
        }
    }

    /// Returns a frame a handler took but could not use.
    pub(crate) fn give_back(&self, frame: usize) {
        // SAFETY: the frame was taken from a reserve and is mapped nowhere but the arena.
        unsafe { self.to_free.push(frame) };
        self.kick();
    }

    fn stats(&self) -> Stats {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            numa_pte_updates: l(&s.pte_updates),
            numa_huge_pte_updates: 0,
            numa_hint_faults: l(&s.hint_faults),
            numa_hint_faults_local: l(&s.hint_faults_local),
            numa_pages_migrated: l(&s.pages_migrated),
            pgmigrate_success: l(&s.migrate_success),
            pgmigrate_fail: l(&s.migrate_fail),
            pgmigrate_fail_reserve: l(&s.fail_reserve),
            pgmigrate_fail_room: l(&s.fail_room),
            pgmigrate_fail_pinned: l(&s.fail_pinned),
            map_fail: l(&s.map_fail),
            scan_fail: l(&s.scan_fail),
            register_fail: l(&s.register_fail),
            registered: l(&s.registered),
            migrate_ns: l(&s.migrate_ns),
            pgmigrate_fail_vma: l(&s.fail_vma),
            scan_capped: l(&s.scan_capped),
            chunks_migrated: l(&s.chunks_migrated),
            collapsed: l(&s.collapsed),
            collapsed_pages: l(&s.collapsed_pages),
            collapse_fail: l(&s.collapse_fail),
            vma_runs: self.live_regions().iter().map(|r| r.vma_runs() as u64).sum(),
            vmas: self.vmas.load(Ordering::Relaxed) as u64,
            vmas_peak: self.vmas_peak.load(Ordering::Relaxed) as u64,
            first_touch: l(&s.first_touch),
            migrated_along: l(&s.migrated_along),
            window_blocks: l(&s.window_blocks),
            scan_calls: l(&s.scan_calls),
            scan_skips: l(&s.scan_skips),
            coalesced: l(&s.coalesced),
            scans: l(&s.scans),
            scan_period_ms: self.period_ms.load(Ordering::Relaxed),
            pgpromote_success: self.tier_nodes.iter().map(|n| l(&n.pgpromote_success)).sum(),
            pgpromote_candidate: self.tier_nodes.iter().map(|n| l(&n.pgpromote_candidate)).sum(),
            pgdemote_kswapd: self.tier_nodes.iter().map(|n| l(&n.pgdemote_kswapd)).sum(),
            pgdemote_direct: self.tier_nodes.iter().map(|n| l(&n.pgdemote_direct)).sum(),
            nodes: self
                .tier_nodes
                .iter()
                .map(|n| crate::NodeTierStats {
                    pgpromote_success: l(&n.pgpromote_success),
                    pgpromote_candidate: l(&n.pgpromote_candidate),
                    pgdemote_kswapd: l(&n.pgdemote_kswapd),
                    pgdemote_direct: l(&n.pgdemote_direct),
                    numa_pages_migrated: l(&n.pages_migrated),
                    hot_threshold_ms: n.threshold(self.cfg.hot_threshold_ms.load(Ordering::Relaxed)),
                })
                .collect(),
        }
    }

    /// Frees the frames handlers left, and tops the reserves up (zeroed frames, as a first
    /// touch of anonymous memory reads zeros). Returns whether any reserve is still empty.
    fn housekeep(&self) -> bool {
        let short = self.refill();
        // The pass's end, for the handlers waiting on it (`frame_for`, `block_for`).
        self.refills.fetch_add(1, Ordering::Release);
        os::futex_wake(&self.refills);
        short
    }

    /// A block of `2^order` frames of node `nid`, held ([`Zonal::hold`]: no safe code given
    /// the handle can free a frame the balancer's unsafe code relies on) and split, each
    /// frame then freed alone with [`Shared::free_frame`]; `None` when the node has no free
    /// block of the order.
    pub(crate) fn alloc_held(&self, nid: u16, order: u32) -> Option<*mut u8> {
        let b = self.z.alloc_pages_node(NodeId(nid), Gfp::THISNODE, order).ok()?.as_ptr();
        if self.z.hold(b, order).is_err() {
            let _ = self.z.free_pages(b, order);
            return None;
        }
        if order > 0 && self.z.split_pages(b, order).is_err() {
            // SAFETY: the block was held just above, by this balancer, and is freed once.
            let _ = unsafe { self.z.free_held(b, order) };
            return None;
        }
        Some(b)
    }

    /// Frees a frame this balancer holds (from [`Shared::alloc_held`]).
    pub(crate) fn free_frame(&self, f: usize) {
        // SAFETY: every frame the balancer frees it holds, and it frees each once (a frame is
        // in exactly one of: a reserve, the free stack, a region page, a carve block).
        let _ = unsafe { self.z.free_held(f as *mut u8, 0) };
    }

    /// A split block of `CHUNK_PAGES` frames of node `nid`, held, zeroed when `zero`, or
    /// `None` when the node has no free block of that order.
    fn alloc_block(&self, nid: usize, zero: bool) -> Option<usize> {
        let b = self.alloc_held(nid as u16, 9)?;
        if zero {
            // SAFETY: a block zonal just handed out, 512 frames, ours.
            unsafe { std::ptr::write_bytes(b, 0, CHUNK_PAGES * PAGE) };
        }
        Some(b as usize)
    }

    /// Frees a split block's frames `from..CHUNK_PAGES`.
    pub(crate) fn free_block_from(&self, block: usize, from: usize) {
        for i in from..CHUNK_PAGES {
            self.free_frame(block + i * PAGE);
        }
    }

    /// [`Shared::housekeep`]'s work: frees, then fills every reserve.
    fn refill(&self) -> bool {
        self.check_mappings(false);
        for f in self.to_free.take_all() {
            self.free_frame(f);
        }
        for (nid, c) in self.chunks.iter().enumerate() {
            // Two blocks for chunk migrations; for windows' destination blocks, one more for
            // each window that found the reserve empty since the last pass (a migration wave
            // starts in many windows at once), up to the capacity, and one fewer each pass
            // nobody missed one: no block is held for windows before a migration asks. Only
            // from a node with room for them above its high watermark: a block held in
            // reserve is memory the node's own allocations cannot have.
            let base = if self.chunk_migration { CHUNK_RESERVE.min(c.capacity()) } else { 0 };
            let misses = self.chunk_misses[nid].swap(0, Ordering::AcqRel);
            let want = match (misses, self.chunk_want[nid].load(Ordering::Relaxed)) {
                (0, w) => w.saturating_sub(1).max(base),
                (m, w) => (w.max(base) + m).min(c.capacity()),
            };
            self.chunk_want[nid].store(want, Ordering::Relaxed);
            while c.len() < want && self.has_room_for(nid as u16, CHUNK_PAGES * want) {
                let Some(b) = self.alloc_block(nid, false) else { break };
                if c.put(b).is_err() {
                    self.free_block_from(b, 0);
                }
            }
            if c.len() > want {
                if let Some(b) = c.take() {
                    self.free_block_from(b, 0);
                }
            }
        }
        // The blocks' own wake-up: a migration waiting for one need not wait for the frame
        // reserves' refill below (zeroing up to `reserve_pages` frames per CPU).
        self.chunk_refills.fetch_add(1, Ordering::Release);
        os::futex_wake(&self.chunk_refills);
        // Blocks for first-touch windows, while a region touches in windows.
        let windows = self.ft_regions.load(Ordering::Acquire) > 0;
        for (nid, r) in self.blocks.iter().enumerate() {
            while windows && r.len() < r.capacity() {
                let Some(b) = self.alloc_block(nid, true) else {
                    self.blocks_out[nid].store(true, Ordering::Release);
                    break;
                };
                self.blocks_out[nid].store(false, Ordering::Release);
                if r.put(b).is_err() {
                    self.free_block_from(b, 0);
                }
            }
        }
        let mut short = false;
        for (nid, r) in self.reserves.iter().flat_map(|nr| nr.slots()).enumerate() {
            let nid = nid / self.reserves[0].slots().len();
            while r.len() < r.capacity() {
                // Runs of consecutive frames (a block split into frames, queued in order), so
                // pages first touched in order get consecutive frames and their mappings
                // merge into one VMA: the largest block that fits the room left, down to a
                // single frame when the node has no larger block.
                let room = r.capacity() - r.len();
                let mut order = (usize::BITS - 1 - room.leading_zeros()).min(9);
                let block = loop {
                    match self.alloc_held(nid as u16, order) {
                        Some(p) => break Some(p),
                        None if order > 0 => order -= 1,
                        None => break None,
                    }
                };
                let Some(block) = block else {
                    short |= self.reserves[nid].len() == 0;
                    self.node_out[nid].store(true, Ordering::Relaxed);
                    break;
                };
                self.node_out[nid].store(false, Ordering::Relaxed);
                // SAFETY: a block zonal just handed out, 2^order frames, ours.
                unsafe { std::ptr::write_bytes(block, 0, PAGE << order) };
                for i in 0..1usize << order {
                    let f = block as usize + i * PAGE;
                    if r.put(f).is_err() {
                        self.free_frame(f);
                    }
                }
            }
        }
        short
    }

    /// Counts the process's mappings (unless `now`, every second while below half the
    /// budget, every 50 ms above: a read of `/proc/self/maps` costs ~0.1 µs a line) and sets
    /// `over_budget`: a region must never push the process past `vm.max_map_count`, and both
    /// a scan (`mprotect` splits) and a migration (a mapping of another frame) can add some.
    fn check_mappings(&self, now: bool) {
        let mut last = self.last_vma_check.lock().unwrap_or_else(|p| p.into_inner());
        let near = self.vmas.load(Ordering::Relaxed) * 2 >= self.vma_budget.load(Ordering::Relaxed);
        let every = Duration::from_millis(if near { 50 } else { 1000 });
        if !now && last.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        *last = Some(Instant::now());
        if let Some(n) = os::nr_mappings() {
            self.vmas.store(n, Ordering::Relaxed);
            self.vmas_peak.fetch_max(n, Ordering::Relaxed);
            self.over_budget.store(n >= self.vma_budget.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// One collapse pass copying at most `pages`, from where the last one stopped; returns
    /// the pages copied.
    fn collapse(&self, pages: usize) -> usize {
        if pages == 0 {
            return 0;
        }
        let regions = self.live_regions();
        let mut cur = self.collapse_cursor.lock().unwrap_or_else(|p| p.into_inner());
        collapse::pass(self, &regions, &mut cur, pages)
    }

    /// Retires the destination blocks windows stopped using (see `dest`), region by region
    /// under the scan lock, which keeps a region from being torn down meanwhile.
    fn retire_idle_dests(&self) {
        for r in self.live_regions() {
            let dead = r.scan_lock.lock().unwrap_or_else(|p| p.into_inner());
            if !*dead {
                r.retire_idle_dests();
            }
        }
    }

    /// The live regions, dropping the dead ones from the list.
    pub(crate) fn live_regions(&self) -> Vec<Arc<RegionShared>> {
        let mut l = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        l.retain(|w| w.upgrade().is_some_and(|r| !r.is_dead()));
        l.iter().filter_map(Weak::upgrade).collect()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // In a child of fork(): nothing here is the child's to free (see `fault::in_child`).
        if fault::forked() {
            return;
        }
        if let Some(&id) = self.source.get() {
            self.z.remove_counter_source(id);
        }
        if let Some(&id) = self.tunable_source.get() {
            self.z.remove_tunable_source(id);
        }
        for f in self.to_free.take_all() {
            self.free_frame(f);
        }
        for r in &self.reserves {
            while let Some(f) = r.take(0) {
                self.free_frame(f);
            }
        }
        for c in self.chunks.iter().chain(&self.blocks) {
            while let Some(b) = c.take() {
                self.free_block_from(b, 0);
            }
        }
    }
}

/// Order-9 blocks a node's reserve (`Shared::chunks`) keeps ready, and the most it holds
/// when windows' first migrations ask for more at once.
const CHUNK_RESERVE: usize = 2;
const CHUNK_RESERVE_MAX: usize = 8;

/// NUMA balancing over one zonal handle: the regions, the reserves, the scanner.
pub struct Balancer {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The handler thread of the userfaultfd handler-thread backend.
    server: Option<std::thread::JoinHandle<()>>,
}

impl Balancer {
    /// A balancer over `z` with `cfg`: installs the fault handler (once per process) and
    /// starts the balancer's thread, which fills the reserves and scans.
    pub fn new(z: Arc<Zonal>, cfg: Config) -> Result<Balancer> {
        Balancer::with_env(z, cfg, |var| std::env::var(var).ok())
    }

    /// [`Balancer::new`] with `env` for the environment's `ZONAL_<NAME>` tunables.
    pub(crate) fn with_env(z: Arc<Zonal>, cfg: Config, env: impl Fn(&str) -> Option<String>) -> Result<Balancer> {
        fault::install().map_err(|errno| Error::Os { call: "sigaction", errno })?;
        let uffd = match cfg.backend {
            Backend::Mprotect => None,
            Backend::Userfaultfd => Some(uffd::Uffd::open().map_err(|(call, errno)| Error::Os { call, errno })?),
            Backend::UserfaultfdThread => {
                Some(uffd::Uffd::open_for_thread().map_err(|(call, errno)| Error::Os { call, errno })?)
            }
            Backend::Auto => uffd::Uffd::open().ok(),
        };
        let nodes = z.topology().nr_nodes();
        let high = (0..nodes)
            .map(|n| {
                z.node_zones(NodeId(n as u16))
                    .map(|ids| ids.iter().map(|id| z.zones()[id.0 as usize].watermark(Watermark::High)).sum())
                    .unwrap_or(0)
            })
            .collect();
        let shared = Arc::new(Shared {
            cfg: Tunables {
                enabled: AtomicBool::new(cfg.enabled),
                tiering: AtomicBool::new(cfg.tiering),
                hot_threshold_ms: AtomicU64::new(cfg.hot_threshold_ms),
                promote_rate_limit_mbps: AtomicU64::new(cfg.promote_rate_limit_mbps),
                demotion_enabled: AtomicBool::new(cfg.demotion_enabled),
                mode: AtomicU8::new((cfg.mode == MigrateMode::Eager) as u8),
                scan_delay_ms: AtomicU64::new(cfg.scan_delay_ms),
                scan_period_min_ms: AtomicU64::new(cfg.scan_period_min_ms.max(1)),
                scan_period_max_ms: AtomicU64::new(cfg.scan_period_max_ms.max(1)),
                scan_size_mb: AtomicU64::new(cfg.scan_size_mb.max(1)),
                collapse_mb: AtomicU64::new(cfg.collapse_mb),
            },
            stats: Counters::default(),
            reserves: (0..nodes).map(|_| NodeReserve::new(cfg.reserve_pages.max(1), z.topology().nr_cpus())).collect(),
            chunks: (0..nodes)
                .map(|_| match (cfg.chunk_migration, cfg.window_migration) {
                    (_, true) => Reserve::new(CHUNK_RESERVE_MAX),
                    (true, false) => Reserve::new(CHUNK_RESERVE),
                    (false, false) => Reserve::new(0),
                })
                .collect(),
            chunk_misses: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
            chunk_want: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
            chunk_refills: AtomicU32::new(0),
            chunk_migration: cfg.chunk_migration,
            aligned_migration: cfg.window_migration,
            kswapd: cfg.kswapd,
            blocks: (0..nodes).map(|_| Reserve::new(2)).collect(),
            blocks_out: (0..nodes).map(|_| AtomicBool::new(false)).collect(),
            ft_regions: AtomicUsize::new(0),
            refills: AtomicU32::new(0),
            node_out: (0..nodes).map(|_| AtomicBool::new(false)).collect(),
            to_free: FreeStack::default(),
            regions: Mutex::new(Vec::new()),
            kick: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            win_local: AtomicU64::new(0),
            win_remote: AtomicU64::new(0),
            win_fail: AtomicU64::new(0),
            period_ms: AtomicU64::new(cfg.scan_period_min_ms.max(1)),
            high,
            uffd,
            source: std::sync::OnceLock::new(),
            tunable_source: std::sync::OnceLock::new(),
            vma_budget: AtomicUsize::new(cfg.vma_budget.unwrap_or(os::max_map_count() / 4 * 3)),
            vmas: AtomicUsize::new(0),
            vmas_peak: AtomicUsize::new(0),
            over_budget: AtomicBool::new(false),
            last_vma_check: Mutex::new(None),
            scan_cursor: Mutex::new(Cursor::default()),
            collapse_cursor: Mutex::new(Cursor::default()),
            tiers: crate::tier::Tiers::of(z.topology()),
            tier_nodes: (0..nodes).map(|_| crate::tier::TierNode::default()).collect(),
            clock: crate::tier::Clock(cfg.tier_clock.clone()),
            demoting: Mutex::new(()),
            z,
        });
        let now = shared.clock.now_ms();
        shared.tier_nodes.iter().for_each(|n| n.start(now));
        shared.sysctl_from(env)?;
        // The layer's counters in the handle's vmstat, JSON and Prometheus reports. A weak
        // reference: the handle must not keep the balancer alive (it holds the handle).
        let weak = Arc::downgrade(&shared);
        let id = shared
            .z
            .add_counter_source(Box::new(move || weak.upgrade().map(|s| s.stats().all_items()).unwrap_or_default()));
        let _ = shared.source.set(id);
        // Its tunables in the handle's sysctl, so that `zonal --pid P sysctl` reaches them.
        let id = shared.z.add_tunable_source(Arc::new(TunableSource(Arc::downgrade(&shared))));
        let _ = shared.tunable_source.set(id);
        shared.housekeep();
        let weak = Arc::downgrade(&shared);
        let thread = std::thread::Builder::new()
            .name("zonal-numab".into())
            .spawn(move || worker(weak))
            .map_err(|e| Error::Os { call: "pthread_create", errno: e.raw_os_error().unwrap_or(0) })?;
        let server = match shared.uffd.as_ref().is_some_and(|u| u.is_thread()) {
            true => {
                let weak = Arc::downgrade(&shared);
                Some(
                    std::thread::Builder::new()
                        .name("zonal-numab-faults".into())
                        .spawn(move || fault_server(weak))
                        .map_err(|e| Error::Os { call: "pthread_create", errno: e.raw_os_error().unwrap_or(0) })?,
                )
            }
            false => None,
        };
        Ok(Balancer { shared, thread: Some(thread), server })
    }

    /// A region of `bytes` (rounded up to pages) under `policy`: no frame until a page is
    /// touched.
    pub fn region(&self, bytes: usize, policy: MemPolicy) -> Result<Region> {
        if fault::forked() {
            return Err(Error::Forked);
        }
        if bytes == 0 || bytes > MAX_REGION_BYTES {
            return Err(Error::InvalidSize { bytes });
        }
        let z = &self.shared.z;
        policy.validate(z.topology().nr_nodes())?;
        if let MemPolicy::Bind(m) | MemPolicy::Interleave(m) = &policy {
            if m.is_empty() {
                return Err(Error::Zonal(zonal::Error::InvalidNode {
                    node: NodeId(u16::MAX),
                    nr_nodes: z.topology().nr_nodes(),
                }));
            }
        }
        let pages = bytes.div_ceil(PAGE);
        let start = os::reserve(pages * PAGE, 2 << 20).map_err(|errno| Error::Os { call: "mmap", errno })?;
        let nodes = z.topology().nr_nodes();
        let fallback = (0..nodes)
            .map(|n| {
                let order: Vec<u16> = z
                    .zonelists(NodeId(n as u16))
                    .map(|l| l.fallback.iter().map(|id| z.zones()[id.0 as usize].node.0).collect())
                    .unwrap_or_default();
                let mut seen = Vec::new();
                for x in order {
                    if x as usize != n && !seen.contains(&x) && allowed(&policy, x) {
                        seen.push(x);
                    }
                }
                seen
            })
            .collect();
        // First touches in windows of 2^ft_order pages, so that the region adds at most a
        // quarter of the mapping budget however it is touched (a region of up to a quarter
        // of the budget in pages touches page by page, as before).
        let share = (self.shared.vma_budget.load(Ordering::Relaxed) / 4).max(1);
        let mut ft_order = 0;
        while ft_order < collapse::MAX_ORDER && pages >> ft_order > share {
            ft_order += 1;
        }
        if ft_order > 0 {
            self.shared.ft_regions.fetch_add(1, Ordering::AcqRel);
            self.shared.kick();
        }
        let r = Arc::new(RegionShared {
            start,
            ft_order,
            carve: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
            dead: AtomicBool::new(false),
            entries: (0..pages).map(|_| PageEntry::default()).collect(),
            dest: dest::table(pages),
            policy,
            fallback,
            scan_seq: AtomicUsize::new(0),
            group: table::Group::new(z.topology().nr_nodes()),
            born: Instant::now(),
            slot: AtomicUsize::new(usize::MAX),
            scan_lock: Mutex::new(false),
            bal: self.shared.clone(),
        });
        let Some(slot) = fault::register(Arc::as_ptr(&r)) else {
            // SAFETY: the reservation was just made and is not registered: nothing uses it.
            unsafe { os::unmap(start, pages * PAGE) };
            // Nothing to undo in `r`: no frame yet, and no slot to leave.
            return Err(Error::TooManyRegions);
        };
        r.slot.store(slot, Ordering::Relaxed);
        self.shared.regions.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(&r));
        self.shared.kick();
        Ok(Region { shared: r })
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Turns balancing on or off (`numa_balancing`): off, the scanner stops and hint faults
    /// already pending map pages back without moving them.
    pub fn set_enabled(&self, on: bool) {
        self.shared.cfg.enabled.store(on, Ordering::Relaxed);
        self.shared.kick();
    }

    /// Whether balancing is on.
    pub fn enabled(&self) -> bool {
        self.shared.enabled()
    }

    /// Sets `kernel.numa_balancing`'s bits: 1 normal balancing, 2 memory tiering, 3 both,
    /// 0 neither (see [`Config::tiering`]). Anything above 3 is refused, nothing changed.
    pub fn set_numa_balancing(&self, bits: u8) -> Result<()> {
        self.shared.set_numa_balancing(bits)
    }

    /// `kernel.numa_balancing`'s bits.
    pub fn numa_balancing(&self) -> u8 {
        self.shared.numa_balancing()
    }

    /// Sets `numa_balancing_hot_threshold_ms` (the nodes' adjusted thresholds start again
    /// from it).
    pub fn set_hot_threshold_ms(&self, ms: u64) {
        self.shared.set_hot_threshold_ms(ms)
    }

    /// Sets `numa_balancing_promote_rate_limit_MBps`.
    pub fn set_promote_rate_limit_mbps(&self, mbps: u64) {
        self.shared.cfg.promote_rate_limit_mbps.store(mbps, Ordering::Relaxed);
    }

    /// Sets `demotion_enabled`.
    pub fn set_demotion_enabled(&self, on: bool) {
        self.shared.set_demotion_enabled(on)
    }

    /// The nodes' memory tiers.
    pub fn tiers(&self) -> &crate::Tiers {
        &self.shared.tiers
    }

    /// A balancer tunable's value by name ([`crate::tunable::TUNABLES`]). The handle's
    /// `Zonal::sysctl_get` reaches the same tunables (and so does `zonal --pid P sysctl`).
    pub fn sysctl_get(&self, name: &str) -> Result<String> {
        self.shared.sysctl_get(name)
    }

    /// Sets a balancer tunable by name; an invalid value is refused and the old one kept.
    pub fn sysctl_set(&self, name: &str, value: &str) -> Result<()> {
        self.shared.sysctl_set(name, value)
    }

    /// Every balancer tunable with its value.
    pub fn sysctl_all(&self) -> Vec<(&'static str, String)> {
        self.shared.sysctl_all()
    }

    /// Demotes now, from the calling thread, up to `max_pages` of the coldest region pages
    /// of every top-tier node below its promo watermark (as the balancer's thread does
    /// with `demotion_enabled`; counted in `pgdemote_direct`); returns the pages demoted.
    pub fn demote_now(&self, max_pages: usize) -> usize {
        if fault::forked() {
            return 0;
        }
        let _signals = os::SignalsBlocked::new();
        self.shared.demote_pass(Some(max_pages))
    }

    /// Sets the mapping order (`numa_balancing_migrate`).
    pub fn set_mode(&self, mode: MigrateMode) {
        self.shared.cfg.mode.store((mode == MigrateMode::Eager) as u8, Ordering::Relaxed);
    }

    /// The mapping order.
    pub fn mode(&self) -> MigrateMode {
        self.shared.mode()
    }

    /// The backend in use (`Auto` resolved).
    pub fn backend(&self) -> Backend {
        match &self.shared.uffd {
            Some(u) if u.is_thread() => Backend::UserfaultfdThread,
            Some(_) => Backend::Userfaultfd,
            None => Backend::Mprotect,
        }
    }

    /// Sets the scan period bounds and size; `scan_period_min_ms <= scan_period_max_ms`, all
    /// at least 1.
    pub fn set_scan(&self, delay_ms: u64, period_min_ms: u64, period_max_ms: u64, size_mb: u64) -> Result<()> {
        if period_min_ms == 0 || period_max_ms < period_min_ms || size_mb == 0 {
            return Err(Error::InvalidSize { bytes: size_mb as usize });
        }
        let c = &self.shared.cfg;
        c.scan_delay_ms.store(delay_ms, Ordering::Relaxed);
        c.scan_period_min_ms.store(period_min_ms, Ordering::Relaxed);
        c.scan_period_max_ms.store(period_max_ms, Ordering::Relaxed);
        c.scan_size_mb.store(size_mb, Ordering::Relaxed);
        let p = self.shared.period_ms.load(Ordering::Relaxed).clamp(period_min_ms, period_max_ms);
        self.shared.period_ms.store(p, Ordering::Relaxed);
        self.shared.kick();
        Ok(())
    }

    /// Runs one scan pass now, from the calling thread, over every region past its scan
    /// delay; returns the pages marked. For tests and benchmarks that drive the scanner.
    pub fn scan_now(&self) -> usize {
        if fault::forked() {
            return 0;
        }
        let _signals = os::SignalsBlocked::new();
        self.shared.check_mappings(true);
        if self.shared.over_budget.load(Ordering::Relaxed) {
            return 0;
        }
        let regions = self.shared.live_regions();
        self.shared.stats.scans.fetch_add(1, Ordering::Relaxed);
        // Resumes where the last call stopped, as the balancer's own passes do.
        let mut cur = self.shared.scan_cursor.lock().unwrap_or_else(|p| p.into_inner());
        scan::scan_pass(&self.shared, &regions, &mut cur)
    }

    /// Runs one collapse pass now, from the calling thread, copying at most `max_pages`
    /// (see [`Config::collapse_mb`]); returns the pages copied. For tests and benchmarks.
    pub fn collapse_now(&self, max_pages: usize) -> usize {
        if fault::forked() {
            return 0;
        }
        let _signals = os::SignalsBlocked::new();
        let n = self.shared.collapse(max_pages);
        self.shared.check_mappings(true);
        n
    }

    /// Frees what handlers left, refills the reserves and counts the process's mappings
    /// now, from the calling thread.
    pub fn housekeep(&self) {
        if fault::forked() {
            return;
        }
        self.shared.check_mappings(true);
        self.shared.housekeep();
    }

    /// Sets the mapping budget (see [`Config::vma_budget`]) and checks it now.
    pub fn set_vma_budget(&self, mappings: usize) {
        self.shared.vma_budget.store(mappings, Ordering::Relaxed);
        self.shared.check_mappings(true);
    }

    /// The zonal handle.
    pub fn zonal(&self) -> &Arc<Zonal> {
        &self.shared.z
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        // In a child of fork() the threads do not exist (joining or detaching their stale
        // handles would touch threads of the parent), and nothing is the child's to free.
        if fault::forked() {
            std::mem::forget(self.thread.take());
            std::mem::forget(self.server.take());
            return;
        }
        // The thread runs while a region lives (it holds only a weak reference and stops when
        // the last one goes); a balancer dropped before its regions leaves it to them.
        // Without regions it stops the thread and waits for it, so that the reserves are back
        // with zonal when this returns.
        if self.shared.live_regions().is_empty() {
            self.shared.stop.store(true, Ordering::Release);
            self.shared.kick();
            for t in [self.thread.take(), self.server.take()].into_iter().flatten() {
                let _ = t.join();
            }
        }
    }
}

/// How often the balancer's thread runs a collapse pass.
const COLLAPSE_EVERY: Duration = Duration::from_millis(100);

/// The balancer's thread: frees and refills, scans every period, and collapses fragmented
/// windows.
fn worker(weak: Weak<Shared>) {
    // The program's asynchronous signals go to its own threads: this one holds pages BUSY.
    let _signals = os::SignalsBlocked::new();
    let mut cur = Cursor::default();
    let mut next_scan: Option<Instant> = None;
    let mut next_collapse = Instant::now();
    loop {
        let Some(s) = weak.upgrade() else { return };
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let kick = s.kick.load(Ordering::Acquire);
        let short = s.housekeep();
        let now = Instant::now();
        let regions = s.live_regions();
        let delay = Duration::from_millis(s.cfg.scan_delay_ms.load(Ordering::Relaxed));
        let due: Vec<Arc<RegionShared>> = regions.into_iter().filter(|r| now.duration_since(r.born) >= delay).collect();
        let over = s.over_budget.load(Ordering::Relaxed);
        if s.scanning() && !over && !due.is_empty() && next_scan.is_none_or(|t| now >= t) {
            s.stats.scans.fetch_add(1, Ordering::Relaxed);
            scan::scan_pass(&s, &due, &mut cur);
            let cost = now.elapsed();
            let (min, max) =
                (s.cfg.scan_period_min_ms.load(Ordering::Relaxed), s.cfg.scan_period_max_ms.load(Ordering::Relaxed));
            let p = scan::next_period(
                s.period_ms.load(Ordering::Relaxed),
                s.win_local.swap(0, Ordering::Relaxed),
                s.win_remote.swap(0, Ordering::Relaxed),
                s.win_fail.swap(0, Ordering::Relaxed),
                min,
                max,
            );
            // The overhead cap: a pass may take at most `SCAN_OVERHEAD_PCT` of the time
            // between passes (Linux keeps `task_numa_work` near 3% of the task's run time).
            let capped = scan::capped_period(p, cost, max);
            if capped > p {
                s.stats.scan_capped.fetch_add(1, Ordering::Relaxed);
            }
            s.period_ms.store(capped, Ordering::Relaxed);
            next_scan = Some(now + Duration::from_millis(capped));
        }
        // kswapd's demotion: top-tier nodes below their promo watermark make room.
        if s.kswapd && s.tiering() && s.cfg.demotion_enabled.load(Ordering::Relaxed) && !over {
            s.demote_pass(None);
        }
        // Collapses at most a tenth of `collapse_mb` each tenth of a second.
        if now >= next_collapse {
            let pages = (s.cfg.collapse_mb.load(Ordering::Relaxed) as usize).saturating_mul(256) / 10;
            s.collapse(pages);
            s.retire_idle_dests();
            next_collapse = now + COLLAPSE_EVERY;
        }
        let wait = if short {
            Duration::from_millis(1)
        } else {
            next_scan.map_or(Duration::from_millis(100), |t| t.saturating_duration_since(Instant::now()))
        };
        let wait = wait.clamp(Duration::from_micros(100), Duration::from_millis(100));
        // Let go of the shared state while waiting, so that dropping the last region or the
        // balancer ends this thread.
        let word: *const AtomicU32 = &s.kick;
        let keep = Arc::downgrade(&s);
        drop(s);
        if let Some(s) = keep.upgrade() {
            // SAFETY: `word` points into `s`, alive for this call.
            os::futex_wait(unsafe { &*word }, kick, wait);
            drop(s);
        }
    }
}

/// The handler thread of the userfaultfd handler-thread backend: serves faults until the
/// balancer and its regions are gone.
fn fault_server(weak: Weak<Shared>) {
    let _signals = os::SignalsBlocked::new();
    loop {
        let Some(s) = weak.upgrade() else { return };
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let Some(u) = &s.uffd else { return };
        if let Some(f) = u.next_fault(50) {
            fault::serve_thread_fault(&s, f);
        }
    }
}

// The balancer's run-time tunables (`crate::tunable` holds their table and checks).
impl Shared {
    /// See `Balancer::set_numa_balancing`.
    pub(crate) fn set_numa_balancing(&self, bits: u8) -> Result<()> {
        if bits > 3 {
            return Err(Error::InvalidConfig(format!(
                "numa_balancing: `{bits}` is not 0 (off), 1 (normal), 2 (memory tiering) or 3 (both)"
            )));
        }
        self.cfg.enabled.store(bits & 1 != 0, Ordering::Relaxed);
        self.cfg.tiering.store(bits & 2 != 0, Ordering::Relaxed);
        self.kick();
        Ok(())
    }

    pub(crate) fn numa_balancing(&self) -> u8 {
        self.cfg.enabled.load(Ordering::Relaxed) as u8 | (self.cfg.tiering.load(Ordering::Relaxed) as u8) << 1
    }

    pub(crate) fn set_hot_threshold_ms(&self, ms: u64) {
        self.cfg.hot_threshold_ms.store(ms, Ordering::Relaxed);
        self.tier_nodes.iter().for_each(|n| n.threshold_ms.store(0, Ordering::Relaxed));
    }

    pub(crate) fn set_demotion_enabled(&self, on: bool) {
        self.cfg.demotion_enabled.store(on, Ordering::Relaxed);
        self.kick();
    }

    /// A tunable's value by name.
    pub(crate) fn sysctl_get(&self, name: &str) -> Result<String> {
        let c = &self.cfg;
        Ok(match crate::tunable::tunable(name)?.name {
            "numa_balancing" => self.numa_balancing().to_string(),
            "numa_balancing_hot_threshold_ms" => c.hot_threshold_ms.load(Ordering::Relaxed).to_string(),
            "numa_balancing_promote_rate_limit_MBps" => c.promote_rate_limit_mbps.load(Ordering::Relaxed).to_string(),
            _ => (c.demotion_enabled.load(Ordering::Relaxed) as u8).to_string(),
        })
    }

    /// Sets a tunable by name; an invalid value is refused and the old one kept.
    pub(crate) fn sysctl_set(&self, name: &str, value: &str) -> Result<()> {
        let n = crate::tunable::parse(name, value)?;
        match name {
            "numa_balancing" => self.set_numa_balancing(n as u8)?,
            "numa_balancing_hot_threshold_ms" => self.set_hot_threshold_ms(n),
            "numa_balancing_promote_rate_limit_MBps" => self.cfg.promote_rate_limit_mbps.store(n, Ordering::Relaxed),
            _ => self.set_demotion_enabled(n != 0),
        }
        Ok(())
    }

    /// Applies the tunables `lookup` gives (`ZONAL_<NAME>` from the environment, when a
    /// balancer starts: they override its `Config`, as zonal's variables override its own);
    /// an invalid value is an error naming its variable.
    pub(crate) fn sysctl_from(&self, lookup: impl Fn(&str) -> Option<String>) -> Result<()> {
        for (name, var, value) in crate::tunable::from_env(lookup) {
            self.sysctl_set(name, &value).map_err(|e| Error::InvalidConfig(format!("{var}: {e}")))?;
        }
        Ok(())
    }

    /// Every tunable with its value.
    pub(crate) fn sysctl_all(&self) -> Vec<(&'static str, String)> {
        crate::tunable::TUNABLES.iter().map(|t| (t.name, self.sysctl_get(t.name).unwrap_or_default())).collect()
    }
}

/// The balancer's tunables in its handle's `sysctl` (`Zonal::add_tunable_source`), so that
/// `zonal --pid P sysctl numa_balancing=2` reaches a running balancer. A weak reference: the
/// handle must not keep the balancer alive (the balancer holds the handle).
pub(crate) struct TunableSource(pub(crate) Weak<Shared>);

impl zonal::sysctl::TunableSource for TunableSource {
    fn all(&self) -> Vec<(&'static str, String)> {
        self.0.upgrade().map(|s| s.sysctl_all()).unwrap_or_default()
    }

    fn get(&self, name: &str) -> Option<String> {
        crate::tunable::tunable(name).ok()?;
        self.0.upgrade()?.sysctl_get(name).ok()
    }

    fn set(&self, name: &str, value: &str) -> Option<std::result::Result<(), String>> {
        crate::tunable::tunable(name).ok()?;
        Some(self.0.upgrade()?.sysctl_set(name, value).map_err(|e| e.to_string()))
    }
}
