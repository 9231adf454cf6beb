//! The allocator handle: allocation walks a zonelist checking watermarks, free returns a block
//! to its zone's buddy lists after checking that it is a live block of that order.
//!
//! Kernel counterpart: `__alloc_pages`, `get_page_from_freelist`, `rmqueue`,
//! `__alloc_pages_slowpath` (the watermark steps only: zonal has no reclaim), `free_pages`,
//! `page_to_nid` (mm/page_alloc.c).
//!
//! Locking: one zone lock at a time, never nested. A free claims its block with a CAS on the
//! head frame's state before taking the zone lock, so two frees of one block cannot both
//! succeed and a bad free changes nothing.
//!
//! Invariant, per zone and quiescent: `nr_free + allocated == managed`
//! ([`Zonal::check_invariants`]).

use crate::arena::Arena;
use crate::buddy::{self, ALLOCATED};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::gfp::Gfp;
use crate::mempolicy::{self, MemPolicy, NodeMask, Resolved};
use crate::pcp::{self, PerCpuPages, PCP_MAX_ORDER};
use crate::sync::AtomicU32;
use crate::sync::{AtomicU64, Ordering};
use crate::sys;
use crate::topology::Topology;
use crate::types::{CpuId, NodeId, Order, Pfn, ZoneId, PAGE_SHIFT, PAGE_SIZE};
use crate::vmstat::{
    self, NumaStat, NumaStatsMode, NumaStrategy, PerCpuEvents, PerCpuZoneStat, VmEvent, ZoneCounters, ZoneNumaShared,
    ZoneStatItem,
};
use crate::zlc::{Demand, Level, ZonelistCache};
use crate::zone::{self, Watermark, Zone};
use crate::zonelist::{self, Zonelists};
use arrayvec::ArrayVec;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar};
use std::time::Duration;

static NEXT_HANDLE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A page allocator over its own memory. `Send + Sync`: share it by reference or `Arc`.
///
/// Blocks it hands out stay valid until they are freed or the handle is dropped (dropping
/// unmaps the memory, as tearing down any allocator does).
pub struct Zonal {
    id: u64,
    topo: Topology,
    // Zones before the arena: fields drop in order, and the zones hold no pointers into the
    // arena, but keeping the memory last mirrors that nothing outlives it.
    zones: Arc<[Zone]>,
    /// Per-CPU page lists, `[cpu * nr_zones + zone]`.
    pcps: Arc<[PerCpuPages]>,
    /// Per-CPU event counters, `[cpu]`, apart from the lists (seed 002).
    events: Box<[PerCpuEvents]>,
    /// The zone counters of every zone folded together (`vm_zone_stat`).
    vm_zone_stat: Arc<ZoneCounters>,
    nr_cpus: usize,
    pcp_enabled: bool,
    /// glibc's `__rseq_offset` when the order-0 restartable sequences run (lists on, rseq
    /// and membarrier available); `None` sends every call down the locked path.
    rseq_off: Option<isize>,
    /// The first zone of each CPU's node's zonelist, `[cpu]`: where an allocation under the
    /// local policy looks first, and what the order-0 fast path takes from; `NO_ZONE` for a
    /// CPU whose first zone is off its node, whose allocations must each be charged.
    local_zone: Box<[u16]>,
    /// Per CPU, `local_first` when the per-CPU strategy last began counting (`[cpu]`), and
    /// what it counted before it last stopped: the NUMA hits and locals of the fast paths are
    /// `frozen + (local_first - base)` while it counts, `frozen` while not. Written under the
    /// mode lock.
    numa_fast_base: Box<[AtomicU64]>,
    numa_fast_frozen: Box<[AtomicU64]>,
    /// `bulk_accounting`: `true` accounts a bulk call page by page (the seeds' "before").
    bulk_per_page: std::sync::atomic::AtomicBool,
    /// `free_check`: whether an order-0 free on the rseq path claims its frame with a CAS
    /// (`true`) or a load and a store (`false`, the default).
    free_check_atomic: std::sync::atomic::AtomicBool,
    percpu_pagelist_high_fraction: AtomicU32,
    worker: Option<Worker>,
    /// Per-CPU NUMA counters, `[cpu * nr_zones + zone]`, apart from the lists (seed 002).
    zone_stats: Box<[PerCpuZoneStat]>,
    /// Per-zone shared NUMA counters that seed 000's per-CPU diffs fold into.
    numa_shared: Box<[ZoneNumaShared]>,
    /// The counting strategy: the index of a [`NumaStrategy`] in `NumaStrategy::ALL`.
    numa_strategy: std::sync::atomic::AtomicU8,
    /// `numa_stat_threshold`.
    numa_threshold: std::sync::atomic::AtomicU16,
    /// The user-space static key of `numa_stats_mode`: whether allocations count NUMA events.
    /// 0: off; [`NUMA_ON_PERCPU`] or [`NUMA_ON_THRESHOLD`]: on, counting that way (so the
    /// fast path learns both with one load).
    numa_key: std::sync::atomic::AtomicU8,
    /// The mode; its mutex serialises writers, as `vm_numa_stats_mode_lock` does.
    numa_mode: std::sync::Mutex<NumaStatsMode>,
    /// Messages about tunable changes (`pr_info` in the kernel): the last [`LOG_LINES`],
    /// oldest first, and how many older ones were dropped.
    log: std::sync::Mutex<TunableLog>,
    /// `stat_interval` in milliseconds, read by the worker at every wake-up.
    stat_interval_ms: Arc<std::sync::atomic::AtomicU64>,
    node_zones: Vec<Vec<ZoneId>>,
    zonelists: Vec<Zonelists>,
    /// The zonelist cache of each node's fallback zonelist (seed 003), `[node]`.
    zlcs: Box<[ZonelistCache]>,
    /// `zonelist_cache`: whether walks use the caches.
    zlc_on: std::sync::atomic::AtomicBool,
    /// `zonelist_cache_interval_ms`: how long a zone stays marked full at most.
    zlc_interval_ms: AtomicU64,
    /// A clock for the caches that tests set and move by hand; unset, the caches read
    /// milliseconds of the coarse monotonic clock since `epoch_ms`.
    zlc_clock: std::sync::OnceLock<Arc<AtomicU64>>,
    epoch_ms: u64,
    /// Zone of each largest-order block of the arena (`u16::MAX`: a gap).
    block_zone: Vec<u16>,
    max_order: Order,
    min_free_kbytes: AtomicU64,
    watermark_scale_factor: AtomicU64,
    lowmem_pages: usize,
    arena: Arena,
}

/// Lines the tunable log keeps: a program that flips tunables in a loop must not grow the
/// handle without bound, and the last changes are the ones worth reading.
pub const LOG_LINES: usize = 256;

/// The tunable log: a ring of the last [`LOG_LINES`] lines and a count of those dropped.
#[derive(Debug)]
struct TunableLog {
    lines: std::collections::VecDeque<String>,
    dropped: u64,
}

impl TunableLog {
    fn new(first: &str) -> TunableLog {
        let mut lines = std::collections::VecDeque::with_capacity(LOG_LINES);
        lines.push_back(first.to_string());
        TunableLog { lines, dropped: 0 }
    }

    fn push(&mut self, line: String) {
        if self.lines.len() >= LOG_LINES {
            self.lines.pop_front();
            self.dropped += 1;
        }
        self.lines.push_back(line);
    }
}

/// `numa_key` when counting with per-CPU event counters.
const NUMA_ON_PERCPU: u8 = 1;
/// `numa_key` when counting with seed 000's diffs and threshold.
const NUMA_ON_THRESHOLD: u8 = 2;
/// `numa_key` when counting with atomic adds on shared counters.
const NUMA_ON_SHARED: u8 = 3;

/// `min_free_kbytes` within the table's bounds and no more than the memory there is.
fn check_min_free_kbytes(kb: u64, lowmem_pages: usize) -> Result<u64> {
    crate::tunables::check("min_free_kbytes", kb)?;
    let total_kb = (lowmem_pages as u64) << (PAGE_SHIFT - 10);
    if kb > total_kb {
        return Err(Error::InvalidConfig(format!("min_free_kbytes {kb}: more than the {total_kb} KiB zonal manages")));
    }
    Ok(kb)
}

/// Frames a bulk free gathers per zone before freeing them under one lock: the cache's size,
/// so one critical section can take a whole run.
const FREE_RUN: usize = 64;

/// Blocks the bulk allocator moves out of the rseq cache per critical section.
const BULK_CHUNK: usize = 64;

/// No zone in this block (a gap between nodes).
const NO_ZONE: u16 = u16::MAX;

/// What one allocation looks for (Linux's `struct alloc_context` plus the alloc flags).
struct AllocContext<'a> {
    cpu: usize,
    zonelist: &'a [ZoneId],
    /// The zonelist's cache, for fallback zonelists of a machine with more than one node.
    zlc: Option<&'a ZonelistCache>,
    nodemask: Option<&'a NodeMask>,
    high: bool,
    no_watermarks: bool,
}

impl Zonal {
    /// Builds an allocator: maps each node's memory and puts it all on the free lists.
    pub fn new(config: Config) -> Result<Zonal> {
        config.validate()?;
        let max_order = Order(config.max_order);
        let topo = config.topology;
        let arena = Arena::new(&topo, max_order, config.arena)?;
        let mut zones = Vec::new();
        let mut node_zones = Vec::new();
        let mut block_zone = vec![NO_ZONE; arena.span_pages() >> max_order.0];
        let nr_cpus = topo.nr_cpus();
        let vm_zone_stat: Arc<ZoneCounters> = Arc::default();
        for (nid, mem) in arena.nodes().iter().enumerate() {
            let id = ZoneId(zones.len() as u16);
            let node = NodeId(nid as u16);
            let z = Zone::with_counters(
                id,
                node,
                mem.start_pfn,
                mem.nr_pages,
                max_order,
                nr_cpus,
                Arc::clone(&vm_zone_stat),
            );
            let first = mem.start_pfn.0 >> max_order.0;
            let last = (mem.start_pfn.0 + mem.nr_pages - 1) >> max_order.0;
            block_zone[first..=last].fill(id.0);
            zones.push(z);
            node_zones.push(vec![id]);
        }
        let zonelists = zonelist::build_zonelists(&topo, &node_zones);
        let zlcs = zonelists
            .iter()
            .map(|l| ZonelistCache::new(l.fallback.iter().map(|z| zones[z.0 as usize].node.0)))
            .collect();
        let lowmem_pages = zones.iter().map(|z| z.managed).sum();
        let min_free = match config.min_free_kbytes {
            Some(kb) => check_min_free_kbytes(kb, lowmem_pages)?,
            None => zone::default_min_free_kbytes(lowmem_pages),
        };
        let zones: Arc<[Zone]> = zones.into();
        for z in zones.iter() {
            z.setup_watermarks(min_free, lowmem_pages, config.watermark_scale_factor);
        }
        let fraction = config.percpu_pagelist_high_fraction;
        let pcps: Arc<[PerCpuPages]> = (0..nr_cpus)
            .flat_map(|cpu| zones.iter().map(move |z| (cpu, z)))
            .map(|(cpu, z)| {
                let (batch, high_min, high_max) = pcp_sizes(&topo, z, fraction);
                if config.pcp {
                    PerCpuPages::new(cpu as u32, batch, high_min, high_max)
                } else {
                    PerCpuPages::new(cpu as u32, 1, 0, 0)
                }
            })
            .collect();
        // Decide now (and register with membarrier, which can take milliseconds) whether the
        // rseq fast path runs, rather than inside the first allocation.
        let rseq_off = if config.pcp && pcp::rseq::enabled() { sys::rseq_offset() } else { None };
        let local_zone = (0..nr_cpus)
            .map(|c| {
                let nid = topo.cpu_to_node(CpuId(c as u32));
                zonelists[nid.0 as usize].fallback.first().map_or(NO_ZONE, |z| z.0)
            })
            .collect::<Box<[u16]>>();
        let nz = zones.len();
        let local_is_hit: Box<[bool]> = local_zone
            .iter()
            .enumerate()
            .map(|(c, &z)| node_zones[topo.cpu_to_node(CpuId(c as u32)).0 as usize].iter().any(|id| id.0 == z))
            .collect();
        // The fast paths count their allocations as local hits: a CPU whose first zone is on
        // another node (a memoryless node's) takes the general path, which charges each one.
        let local_zone: Box<[u16]> =
            local_zone.iter().zip(local_is_hit.iter()).map(|(&z, &hit)| if hit { z } else { NO_ZONE }).collect();
        let nr_zone_stats = nr_cpus * zones.len();
        let stat_interval_ms = Arc::new(std::sync::atomic::AtomicU64::new(stat_interval_ms(config.stat_interval)));
        let worker = Worker::start(Arc::clone(&zones), Arc::clone(&pcps), Arc::clone(&stat_interval_ms));
        let z = Zonal {
            id: NEXT_HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            topo,
            zones,
            pcps,
            events: (0..nr_cpus).map(|_| PerCpuEvents::default()).collect(),
            vm_zone_stat,
            nr_cpus,
            pcp_enabled: config.pcp,
            rseq_off,
            local_zone,
            numa_fast_base: (0..nr_cpus).map(|_| AtomicU64::new(0)).collect(),
            numa_fast_frozen: (0..nr_cpus).map(|_| AtomicU64::new(0)).collect(),
            bulk_per_page: std::sync::atomic::AtomicBool::new(false),
            free_check_atomic: std::sync::atomic::AtomicBool::new(false),
            percpu_pagelist_high_fraction: AtomicU32::new(fraction),
            worker: Some(worker),
            zone_stats: (0..nr_zone_stats).map(|_| PerCpuZoneStat::default()).collect(),
            numa_shared: (0..nz).map(|_| ZoneNumaShared::default()).collect(),
            numa_strategy: std::sync::atomic::AtomicU8::new(0),
            numa_threshold: std::sync::atomic::AtomicU16::new(vmstat::NUMA_STATS_THRESHOLD),
            numa_key: std::sync::atomic::AtomicU8::new(0),
            numa_mode: std::sync::Mutex::new(NumaStatsMode::Auto),
            log: std::sync::Mutex::new(TunableLog::new(
                "vmstat: NUMA stat updates are skipped unless they have been used",
            )),
            stat_interval_ms,
            node_zones,
            zonelists,
            zlcs,
            zlc_on: std::sync::atomic::AtomicBool::new(true),
            zlc_interval_ms: AtomicU64::new(1000),
            zlc_clock: std::sync::OnceLock::new(),
            epoch_ms: sys::coarse_now_ms(),
            block_zone,
            max_order,
            min_free_kbytes: AtomicU64::new(min_free),
            watermark_scale_factor: AtomicU64::new(config.watermark_scale_factor as u64),
            lowmem_pages,
            arena,
        };
        mempolicy::register_handle(z.id);
        z.sysctl_from_env()?;
        Ok(z)
    }

    /// `stat_interval`: how often the background worker runs.
    pub fn stat_interval(&self) -> Duration {
        Duration::from_millis(self.stat_interval_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Sets `stat_interval`, clamped to the tunable's bounds (1 ms to an hour: a longer
    /// `Duration` is an hour, not its milliseconds cut to 64 bits); the worker takes it from
    /// its next wake-up.
    pub fn set_stat_interval(&self, d: Duration) {
        self.stat_interval_ms.store(stat_interval_ms(d), std::sync::atomic::Ordering::Relaxed);
    }

    /// Recomputes every zone's watermarks from `min_free_kbytes` and `watermark_scale_factor`.
    fn setup_per_zone_wmarks(&self) {
        let mfk = self.min_free_kbytes.load(Ordering::Relaxed);
        let wsf = self.watermark_scale_factor.load(Ordering::Relaxed) as u32;
        for z in self.zones.iter() {
            z.setup_watermarks(mfk, self.lowmem_pages, wsf);
        }
        // high follows the low watermark when the fraction is 0.
        self.update_pcp_sizes();
    }

    /// Recomputes every pcp's batch and high bounds from the zones and the fraction
    /// (`zone_pcp_update`).
    fn update_pcp_sizes(&self) {
        if !self.pcp_enabled {
            return;
        }
        let fraction = self.percpu_pagelist_high_fraction.load(Ordering::Relaxed);
        for (i, p) in self.pcps.iter().enumerate() {
            let z = &self.zones[i % self.zones.len()];
            let (batch, high_min, high_max) = pcp_sizes(&self.topo, z, fraction);
            p.lock(z).with(|inner| pcp::set_high_and_batch(z, inner, batch, high_min, high_max));
        }
    }

    /// Sets `percpu_pagelist_high_fraction`: 0 lets `high` tune itself between the low
    /// watermark's share and an eighth of the zone, split over the node's CPUs (Linux 6.7);
    /// N >= 8 fixes `high` at `managed / N` split likewise. Other values are rejected and the
    /// old value kept.
    pub fn set_percpu_pagelist_high_fraction(&self, fraction: u32) -> Result<()> {
        crate::tunables::check("percpu_pagelist_high_fraction", fraction as u64)?;
        self.percpu_pagelist_high_fraction.store(fraction, Ordering::Relaxed);
        self.update_pcp_sizes();
        Ok(())
    }

    /// Current `percpu_pagelist_high_fraction`.
    pub fn percpu_pagelist_high_fraction(&self) -> u32 {
        self.percpu_pagelist_high_fraction.load(Ordering::Relaxed)
    }

    /// Sets `min_free_kbytes` and recomputes the watermarks. Rejects 0 and values that would
    /// reserve more than the memory there is, keeping the old value.
    pub fn set_min_free_kbytes(&self, kb: u64) -> Result<()> {
        check_min_free_kbytes(kb, self.lowmem_pages)?;
        self.min_free_kbytes.store(kb, Ordering::Relaxed);
        self.setup_per_zone_wmarks();
        Ok(())
    }

    /// Sets `watermark_scale_factor` (1..=3000) and recomputes the watermarks.
    pub fn set_watermark_scale_factor(&self, wsf: u32) -> Result<()> {
        crate::tunables::check("watermark_scale_factor", wsf as u64)?;
        self.watermark_scale_factor.store(wsf as u64, Ordering::Relaxed);
        self.setup_per_zone_wmarks();
        Ok(())
    }

    /// Current `min_free_kbytes`.
    pub fn min_free_kbytes(&self) -> u64 {
        self.min_free_kbytes.load(Ordering::Relaxed)
    }

    /// Current `watermark_scale_factor`.
    pub fn watermark_scale_factor(&self) -> u32 {
        self.watermark_scale_factor.load(Ordering::Relaxed) as u32
    }

    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// Every zone, by id.
    pub fn zones(&self) -> &[Zone] {
        &self.zones
    }

    /// The zones of a node.
    pub fn node_zones(&self, nid: NodeId) -> Result<&[ZoneId]> {
        self.check_node(nid)?;
        Ok(&self.node_zones[nid.0 as usize])
    }

    /// A node's zonelists.
    pub fn zonelists(&self, nid: NodeId) -> Result<&Zonelists> {
        self.check_node(nid)?;
        Ok(&self.zonelists[nid.0 as usize])
    }

    /// Largest order.
    pub fn max_order(&self) -> Order {
        self.max_order
    }

    /// The CPU this thread runs on now, as an index into the per-CPU tables. Only a hint:
    /// the thread may move at any instant, and nothing depends on it staying.
    #[inline]
    pub fn current_cpu(&self) -> usize {
        let c = sys::current_cpu() as usize;
        if c < self.nr_cpus {
            c
        } else {
            c % self.nr_cpus
        }
    }

    /// The node of the CPU this thread runs on (`numa_node_id`).
    #[inline]
    pub fn local_node(&self) -> NodeId {
        self.topo.cpu_to_node(CpuId(self.current_cpu() as u32))
    }

    #[inline]
    fn check_order(&self, order: u32) -> Result<Order> {
        if order > self.max_order.0 as u32 {
            return Err(Error::InvalidOrder { order, max_order: self.max_order });
        }
        Ok(Order(order as u8))
    }

    #[inline]
    fn check_node(&self, nid: NodeId) -> Result<()> {
        if nid.0 as usize >= self.topo.nr_nodes() {
            return Err(Error::InvalidNode { node: nid, nr_nodes: self.topo.nr_nodes() });
        }
        Ok(())
    }

    /// This thread's rseq area, when the restartable sequences run.
    #[inline]
    fn rseq_area(&self) -> Option<*mut u8> {
        self.rseq_off.map(|off| (sys::thread_pointer() as isize + off) as *mut u8)
    }

    /// The CPU the kernel last wrote into this thread's rseq area, as an index of this
    /// handle's per-CPU arrays (see [`Zonal::current_cpu`]).
    #[inline]
    fn rseq_cpu(&self, area: *mut u8) -> usize {
        // SAFETY: `area` is this thread's registered `struct rseq` (from `rseq_area`), whose
        // `cpu_id` (a u32 at byte 4) the kernel keeps current; a volatile read sees it.
        let id = unsafe { std::ptr::read_volatile(area.add(4) as *const i32) };
        match usize::try_from(id) {
            Ok(c) if c < self.nr_cpus => c,
            _ => self.current_cpu(),
        }
    }

    /// Where the rseq critical sections of this thread find the per-CPU lists.
    #[inline]
    fn rseq_table(&self, area: *mut u8) -> pcp::rseq::Table {
        pcp::rseq::Table { area, base: self.pcps.as_ptr(), nr_cpus: self.nr_cpus, nr_zones: self.zones.len() }
    }

    #[inline]
    fn pcp(&self, cpu: usize, zone: ZoneId) -> &PerCpuPages {
        &self.pcps[cpu * self.zones.len() + zone.0 as usize]
    }

    #[inline]
    fn count_event(&self, cpu: usize, ev: VmEvent, n: u64) {
        self.events[cpu].add(ev, n);
    }

    /// An event counter summed over CPUs.
    pub fn event(&self, ev: VmEvent) -> u64 {
        let n = vmstat::sum_events(&self.events, ev);
        match ev {
            // Counted by the lists fenced, under their lock: the worker that fences too has
            // no event counters of its own.
            VmEvent::PcpFence => self.pcps.iter().map(PerCpuPages::fences).fold(n, u64::wrapping_add),
            _ => n,
        }
    }

    /// Frames the order-0 fast paths (the rseq cache, single and bulk) have handed out, summed
    /// over CPUs: the part of `pgalloc_normal` that took no lock. Read from the per-CPU
    /// `local_first` count those paths keep anyway, so it costs them nothing; 0 where the
    /// fast paths do not run (no rseq, `ZONAL_NO_RSEQ`, lists off).
    pub fn fast_path_allocs(&self) -> u64 {
        self.events.iter().map(PerCpuEvents::local_first).fold(0, u64::wrapping_add)
    }

    /// Allocates a block of 2^order frames under this thread's memory policy (local node by
    /// default).
    #[inline]
    pub fn alloc_pages(&self, gfp: Gfp, order: u32) -> Result<NonNull<u8>> {
        if order == 0 {
            if let Some(p) = self.alloc_order0_fast() {
                return Ok(p);
            }
        }
        self.alloc_pages_general(gfp, order)
    }

    /// The order-0 fast path. Under the local policy an allocation tries the first zone of
    /// the local node's zonelist first; when that zone is above its low watermark (the
    /// strictest test any gfp flag asks for) the frame comes from this CPU's cache in a
    /// restartable sequence, with no lock and no atomic read-modify-write. Anything else (no
    /// rseq, a thread policy, a zone near its watermarks, an empty cache, an interrupted
    /// section) returns `None`, and the general path runs with the same semantics.
    #[inline(always)]
    fn alloc_order0_fast(&self) -> Option<NonNull<u8>> {
        let area = self.rseq_area()?;
        let (cpu, z) = self.local_fast_zone(area, 0)?;
        let pfn = self.pop_cached(area, z)?;
        self.account_local_alloc(cpu, z, 1);
        Some(self.pfn_to_ptr(pfn))
    }

    /// The zone the order-0 fast paths (single and bulk) take from, with this thread's CPU:
    /// under the local policy, the first zone of the local node's zonelist, when it is above
    /// `low` with `extra` frames to spare. `None` sends the caller to the general path.
    #[inline(always)]
    fn local_fast_zone(&self, area: *mut u8, extra: usize) -> Option<(usize, &Zone)> {
        if mempolicy::thread_has_policy(self.id) {
            return None;
        }
        let cpu = self.rseq_cpu(area);
        let z = self.zones.get(*self.local_zone.get(cpu)? as usize)?;
        z.watermark_ok_fast(Order(0), z.watermark(Watermark::Low).saturating_add(extra), false).then_some((cpu, z))
    }

    /// Accounts `n` frames the fast paths took from `local_fast_zone` (the preferred zone,
    /// so a hit, and local when on the CPU's node). One per-CPU count serves as the
    /// `pgalloc_normal` event and, under the per-CPU strategy, as the NUMA hit and local: with
    /// that strategy, counting costs the fast path nothing but the key's load and branch.
    #[inline(always)]
    fn account_local_alloc(&self, cpu: usize, z: &Zone, n: u64) {
        // `local_zone[cpu]` is on the CPU's node (see `Zonal::new`): a hit and local.
        self.events[cpu].add_local_first(n);
        if self.numa_key.load(std::sync::atomic::Ordering::Relaxed) > NUMA_ON_PERCPU {
            self.numa_charge(cpu, z, z, n, None);
        }
    }

    /// Pops an order-0 frame from this CPU's cache for `z` and tags it allocated; `None` when
    /// the cache has nothing (see [`take_cached`]).
    #[inline(always)]
    fn pop_cached(&self, area: *mut u8, z: &Zone) -> Option<Pfn> {
        let pfn = Pfn(pcp::rseq::pop(&self.rseq_table(area), z.id.0 as usize)?);
        take_cached(z, pfn).then_some(pfn)
    }

    #[inline]
    fn alloc_pages_general(&self, gfp: Gfp, order: u32) -> Result<NonNull<u8>> {
        let order = self.check_order(order)?;
        let cpu = self.current_cpu();
        let local = self.topo.cpu_to_node(CpuId(cpu as u32));
        mempolicy::with_thread_policy(self.id, local, |r| self.alloc_resolved(cpu, gfp, order, r))
    }

    /// Allocates a block preferring node `nid` (`alloc_pages_node`); with [`Gfp::THISNODE`]
    /// only from that node.
    #[inline]
    pub fn alloc_pages_node(&self, nid: NodeId, gfp: Gfp, order: u32) -> Result<NonNull<u8>> {
        let order = self.check_order(order)?;
        self.check_node(nid)?;
        self.alloc_resolved(self.current_cpu(), gfp, order, Resolved::Node(nid))
    }

    /// Allocates a block under `policy` for this call only. A per-call interleave advances
    /// this thread's interleave cursor for this handle, like the thread policy's.
    pub fn alloc_pages_policy(&self, gfp: Gfp, order: u32, policy: &MemPolicy) -> Result<NonNull<u8>> {
        let order = self.check_order(order)?;
        policy.validate(self.topo.nr_nodes())?;
        let cpu = self.current_cpu();
        let local = self.topo.cpu_to_node(CpuId(cpu as u32));
        match policy {
            MemPolicy::Interleave(mask) => {
                let nid = mempolicy::interleave_call(self.id, mask);
                self.alloc_resolved(cpu, gfp, order, Resolved::Interleave(nid))
            }
            p => self.alloc_resolved(cpu, gfp, order, mempolicy::resolve(p, local)),
        }
    }

    /// Sets this thread's memory policy for this handle (`set_mempolicy`); `Local` clears it.
    pub fn set_thread_policy(&self, policy: MemPolicy) -> Result<()> {
        policy.validate(self.topo.nr_nodes())?;
        mempolicy::set_thread_policy(self.id, policy);
        Ok(())
    }

    /// This thread's memory policy for this handle (`get_mempolicy`).
    pub fn thread_policy(&self) -> MemPolicy {
        mempolicy::thread_policy(self.id)
    }

    #[inline]
    fn context<'a>(&'a self, cpu: usize, gfp: Gfp, r: &Resolved<'a>) -> (NodeId, AllocContext<'a>) {
        let (preferred, nodemask) = match *r {
            Resolved::Node(n) | Resolved::Interleave(n) => (n, None),
            // Bind prefers the local node when the mask has it, else the nearest node that the
            // mask has, so `THISNODE` under a bind policy stays inside the policy.
            Resolved::Masked(n, m) if !m.contains(n) => {
                let near = self.zonelists[n.0 as usize]
                    .fallback
                    .iter()
                    .map(|z| self.zones[z.0 as usize].node)
                    .find(|nid| m.contains(*nid));
                (near.unwrap_or(n), Some(m))
            }
            Resolved::Masked(n, m) => (n, Some(m)),
        };
        let lists = &self.zonelists[preferred.0 as usize];
        let thisnode = gfp.contains(Gfp::THISNODE);
        let ctx = AllocContext {
            cpu,
            zonelist: if thisnode { &lists.nofallback } else { &lists.fallback },
            // `zlc_setup` only with more than one node; no cache for the one-node list.
            zlc: (!thisnode && self.zones.len() > 1).then(|| &self.zlcs[preferred.0 as usize]),
            nodemask,
            high: gfp.contains(Gfp::HIGH),
            no_watermarks: gfp.contains(Gfp::NO_WATERMARKS),
        };
        (preferred, ctx)
    }

    #[inline]
    fn alloc_resolved(&self, cpu: usize, gfp: Gfp, order: Order, r: Resolved<'_>) -> Result<NonNull<u8>> {
        let (_, ctx) = self.context(cpu, gfp, &r);
        let pfn = match self.get_page_from_freelist(&ctx, order, Watermark::Low) {
            Some(p) => p,
            None => self.alloc_pages_slowpath(&ctx, order)?,
        };
        self.count_event(cpu, VmEvent::PgallocNormal, order.pages() as u64);
        // One predictable branch on a read-mostly flag when NUMA statistics are off.
        if self.numa_key.load(std::sync::atomic::Ordering::Relaxed) != 0 {
            let target = match r {
                Resolved::Interleave(n) => Some(n),
                _ => None,
            };
            self.zone_statistics(cpu, &ctx, self.zone_of(pfn), 1, target);
        }
        Ok(self.pfn_to_ptr(pfn))
    }

    /// The zone of a frame zonal handed out.
    #[inline]
    fn zone_of(&self, pfn: Pfn) -> &Zone {
        &self.zones[self.block_zone[pfn.0 >> self.max_order.0] as usize]
    }

    /// `zone_statistics`: charges `nr` frames allocated from `z` to the NUMA counters. Hit on
    /// `z` when its node is the preferred zone's, else miss on `z` and foreign on the
    /// preferred zone; local or other on `z` by the allocating CPU's node; an interleave hit
    /// when the interleave policy got the node it asked for.
    #[inline(never)]
    fn zone_statistics(&self, cpu: usize, ctx: &AllocContext<'_>, z: &Zone, nr: u64, interleave: Option<NodeId>) {
        // Linux's preferred_zoneref: the first zone of the zonelist the nodemask allows.
        let preferred = match ctx.nodemask {
            None => ctx.zonelist.first().map_or(z, |id| &self.zones[id.0 as usize]),
            Some(m) => {
                ctx.zonelist.iter().map(|id| &self.zones[id.0 as usize]).find(|pz| m.contains(pz.node)).unwrap_or(z)
            }
        };
        self.numa_charge(cpu, z, preferred, nr, interleave);
    }

    /// Charges `nr` frames allocated from `z` for an allocation that preferred `preferred`.
    #[inline(never)]
    fn numa_charge(&self, cpu: usize, z: &Zone, preferred: &Zone, nr: u64, interleave: Option<NodeId>) {
        let nz = self.zones.len();
        let strategy = self.numa_strategy();
        let threshold = self.numa_threshold.load(std::sync::atomic::Ordering::Relaxed);
        let count = |zone: &Zone, s: NumaStat, n: u64| {
            let pcpu = &self.zone_stats[cpu * nz + zone.id.0 as usize];
            let shared = &self.numa_shared[zone.id.0 as usize];
            match strategy {
                NumaStrategy::PerCpu => pcpu.add(s, n),
                NumaStrategy::Threshold => pcpu.add_diff(s, n, threshold, shared),
                NumaStrategy::Shared => shared.add(s, n),
            }
        };
        if z.node == preferred.node {
            count(z, NumaStat::NumaHit, nr);
        } else {
            count(z, NumaStat::NumaMiss, nr);
            count(preferred, NumaStat::NumaForeign, nr);
        }
        let local = self.topo.cpu_to_node(CpuId(cpu as u32));
        count(z, if z.node == local { NumaStat::NumaLocal } else { NumaStat::NumaOther }, nr);
        if interleave == Some(z.node) {
            count(z, NumaStat::NumaInterleaveHit, nr);
        }
    }

    /// A reader of the NUMA counters: in `auto` mode the first read turns counting on for good
    /// (seed 001).
    fn numa_read_hook(&self) {
        // Already counting: nothing to turn on (reports read every counter of every zone,
        // so this runs often; the mode lock is for the one read that flips the key).
        if self.numa_key.load(std::sync::atomic::Ordering::Relaxed) != 0 {
            return;
        }
        let mode = self.numa_mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *mode == NumaStatsMode::Auto && self.numa_key.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            self.set_numa_key(&mode, self.numa_on());
            self.log_line("numa stats: counters read in auto mode, updates enabled".into());
        }
    }

    fn log_line(&self, line: String) {
        self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(line);
    }

    /// Messages about tunable changes, oldest first (the kernel's `pr_info`s): the last
    /// [`LOG_LINES`] of them; [`Zonal::log_dropped`] counts the older ones.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).lines.iter().cloned().collect()
    }

    /// How many messages left the log to keep it at [`LOG_LINES`] (as the kernel's ring
    /// buffer overwrites its oldest records).
    pub fn log_dropped(&self) -> u64 {
        self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).dropped
    }

    /// A NUMA counter of one zone, summed over CPUs (`zone_numa_event_state`). A read: in
    /// `auto` mode it turns counting on.
    pub fn numa_stat(&self, zone: ZoneId, s: NumaStat) -> u64 {
        self.numa_read_hook();
        // A zone the allocator does not have counted nothing ([`Zonal::node_numa_stats`]
        // and the reports only ask for real zones).
        if zone.0 as usize >= self.zones.len() {
            return 0;
        }
        let nz = self.zones.len();
        let shared = self.numa_shared.get(zone.0 as usize).map_or(0, |sh| sh.get(s));
        let counted =
            (0..self.nr_cpus).map(|c| self.zone_stats[c * nz + zone.0 as usize].get(s)).fold(shared, u64::wrapping_add);
        if !matches!(s, NumaStat::NumaHit | NumaStat::NumaLocal) {
            return counted;
        }
        // The fast paths' local hits, counted as `pgalloc` on the CPUs whose local zone this
        // is (`local_zone` is set only where that zone is on the CPU's node).
        let fast_on = self.numa_key.load(std::sync::atomic::Ordering::Relaxed) == NUMA_ON_PERCPU;
        (0..self.nr_cpus)
            .filter(|&c| self.local_zone[c] == zone.0)
            .map(|c| {
                let frozen = self.numa_fast_frozen[c].load(std::sync::atomic::Ordering::Relaxed);
                if fast_on {
                    let base = self.numa_fast_base[c].load(std::sync::atomic::Ordering::Relaxed);
                    let since = counted_since(self.events[c].local_first(), base);
                    frozen.wrapping_add(since)
                } else {
                    frozen
                }
            })
            .fold(counted, u64::wrapping_add)
    }

    /// Turns counting on or off or changes how it counts (`static_branch_enable/disable`),
    /// with the mode lock held. The per-CPU strategy's fast-path hits are counts of
    /// `local_first` since the strategy began counting: start a new base when it begins,
    /// and keep what it counted when it stops.
    fn set_numa_key(&self, _mode: &std::sync::MutexGuard<'_, NumaStatsMode>, key: u8) {
        use std::sync::atomic::Ordering::Relaxed;
        let old = self.numa_key.load(Relaxed);
        if old == key {
            return;
        }
        for c in 0..self.nr_cpus {
            let now = self.events[c].local_first();
            if old == NUMA_ON_PERCPU {
                let since = counted_since(now, self.numa_fast_base[c].load(Relaxed));
                self.numa_fast_frozen[c].fetch_add(since, Relaxed);
            }
            if key == NUMA_ON_PERCPU {
                self.numa_fast_base[c].store(now, Relaxed);
            }
        }
        self.numa_key.store(key, Relaxed);
    }

    /// How NUMA events are counted now.
    #[inline]
    pub fn numa_strategy(&self) -> NumaStrategy {
        let i = self.numa_strategy.load(std::sync::atomic::Ordering::Relaxed) as usize;
        NumaStrategy::ALL[i.min(NumaStrategy::ALL.len() - 1)]
    }

    /// Switches how NUMA events are counted; counts so far stay (readers add both forms).
    pub fn set_numa_strategy(&self, s: NumaStrategy) {
        let mode = self.numa_mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let i = NumaStrategy::ALL.iter().position(|&x| x == s).unwrap_or(0) as u8;
        if self.numa_strategy.swap(i, std::sync::atomic::Ordering::Relaxed) == i {
            return;
        }
        if self.numa_key.load(std::sync::atomic::Ordering::Relaxed) != 0 {
            self.set_numa_key(&mode, self.numa_on());
        }
        drop(mode);
        self.log_line(format!("numa stats counted by {}", s.name()));
    }

    /// `numa_stat_threshold` (seed 000's strategy).
    pub fn numa_stat_threshold(&self) -> u16 {
        self.numa_threshold.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets `numa_stat_threshold`, 1..=65533 (the diff is a u16 and must hold threshold + 1).
    pub fn set_numa_stat_threshold(&self, t: u64) -> Result<()> {
        if !(1..=vmstat::NUMA_STATS_THRESHOLD as u64).contains(&t) {
            return Err(Error::InvalidConfig(format!(
                "numa_stat_threshold {t}: valid: 1..={}",
                vmstat::NUMA_STATS_THRESHOLD
            )));
        }
        self.numa_threshold.store(t as u16, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Every NUMA counter of a node, in [`NumaStat::ALL`] order (`nodeN/numastat`).
    pub fn node_numa_stats(&self, nid: NodeId) -> Result<[u64; vmstat::NR_NUMA_STATS]> {
        let zones = self.node_zones(nid)?;
        let mut out = [0u64; vmstat::NR_NUMA_STATS];
        for (i, s) in NumaStat::ALL.iter().enumerate() {
            out[i] = zones.iter().map(|z| self.numa_stat(*z, *s)).sum();
        }
        Ok(out)
    }

    /// The current `numa_stats_mode`.
    pub fn numa_stats_mode(&self) -> NumaStatsMode {
        *self.numa_mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether allocations count NUMA events now (the static key).
    pub fn numa_stats_counting(&self) -> bool {
        self.numa_key.load(std::sync::atomic::Ordering::Relaxed) != 0
    }

    /// The value of `numa_key` that turns counting on with the current strategy.
    fn numa_on(&self) -> u8 {
        match self.numa_strategy() {
            NumaStrategy::PerCpu => NUMA_ON_PERCPU,
            NumaStrategy::Threshold => NUMA_ON_THRESHOLD,
            NumaStrategy::Shared => NUMA_ON_SHARED,
        }
    }

    /// Sets `numa_stats_mode` as seed 001 does: `strict` turns counting on, `coarse` turns it
    /// off and zeroes the counters ("users can't tell the difference between the dead state
    /// and when allocator activity is quiet"), `auto` keeps the current state until the next
    /// read. An invalid value is rejected, naming the valid ones, and the old mode stays.
    /// Each change is logged ([`Zonal::log`]).
    pub fn set_numa_stats_mode(&self, value: &str) -> Result<()> {
        let new = NumaStatsMode::parse(value).map_err(|e| {
            self.log_line(format!("Ignoring {e}"));
            Error::InvalidConfig(e)
        })?;
        let mut mode = self.numa_mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = *mode;
        if old == new {
            return Ok(());
        }
        match new {
            NumaStatsMode::Strict => self.set_numa_key(&mode, self.numa_on()),
            NumaStatsMode::Coarse => {
                // The zeroing is plain stores from this CPU: an update already past the key
                // on another CPU can write its old value back, so a counter may read a few
                // events above zero after the switch. Nothing is counted after that.
                self.set_numa_key(&mode, 0);
                for s in self.zone_stats.iter() {
                    s.zero();
                }
                for f in self.numa_fast_frozen.iter() {
                    f.store(0, std::sync::atomic::Ordering::Relaxed);
                }
                for s in self.numa_shared.iter() {
                    s.zero();
                }
            }
            NumaStatsMode::Auto => {}
        }
        *mode = new;
        drop(mode);
        self.log_line(format!("numa stats changes from {} mode to {} mode", old.name(), new.name()));
        Ok(())
    }

    #[inline]
    fn pfn_to_ptr(&self, pfn: Pfn) -> NonNull<u8> {
        let addr = self.arena.pfn_to_addr(pfn);
        // The arena never maps address 0, so a frame's address is never null.
        NonNull::new(addr as *mut u8).expect("arena addresses are non-null")
    }

    /// The second pass: down to `min` (half of it with [`Gfp::HIGH`]); if that fails, drain
    /// every CPU's lists (frames stranded there are free memory) and try again; then, with
    /// [`Gfp::NO_WATERMARKS`], past every watermark. zonal has no reclaim to wait for, so what
    /// remains after these is out of memory.
    #[cold]
    #[inline(never)]
    fn alloc_pages_slowpath(&self, ctx: &AllocContext<'_>, order: Order) -> Result<Pfn> {
        // Where Linux wakes kswapd for the nodes that are not balanced, which tightens the
        // thresholds of their zones so the drift cannot hide the way down to `min`: here the
        // zones below `low`. The worker loosens them again above `high`.
        for id in ctx.zonelist {
            let z = &self.zones[id.0 as usize];
            if z.page_state_snapshot(ZoneStatItem::NrFreePages) < z.watermark(Watermark::Low) {
                z.set_pressure(true);
            }
        }
        if let Some(p) = self.get_page_from_freelist(ctx, order, Watermark::Min) {
            return Ok(p);
        }
        if self.drain_all_pages() > 0 {
            if let Some(p) = self.get_page_from_freelist(ctx, order, Watermark::Min) {
                return Ok(p);
            }
        }
        if ctx.no_watermarks {
            if let Some(p) = self.walk(ctx, order, Level::None) {
                return Ok(p);
            }
        }
        self.count_event(ctx.cpu, VmEvent::AllocFail, 1);
        Err(Error::OutOfMemory { order })
    }

    /// Walks the zonelist for a zone above `mark` with a block of `order`
    /// (`get_page_from_freelist`).
    #[inline]
    fn get_page_from_freelist(&self, ctx: &AllocContext<'_>, order: Order, mark: Watermark) -> Option<Pfn> {
        let level = match mark {
            Watermark::Min => Level::Min,
            Watermark::Low => Level::Low,
            Watermark::High | Watermark::Promo => Level::High,
        };
        self.walk(ctx, order, level)
    }

    /// Walks the zonelist for a zone that keeps above the `level` watermark with a block of
    /// `order` taken, and takes it. With the zonelist cache on, the cache is set up after the
    /// first zone failed (`did_zlc_setup`), zones it has full for this demand are skipped,
    /// failing zones are marked, and if the walk found nothing while it skipped, it walks again
    /// without skipping, so a stale cache never makes an allocation fail.
    #[inline]
    fn walk(&self, ctx: &AllocContext<'_>, order: Order, level: Level) -> Option<Pfn> {
        let demand = Demand { level, halved: ctx.high && level != Level::None, order };
        let zlc = ctx.zlc.filter(|_| self.zlc_on.load(std::sync::atomic::Ordering::Relaxed));
        let mut active = false;
        let mut skipped = 0u64;
        // The entries below 64 to skip, taken once the cache is set up.
        let mut skip = 0u64;
        for pass in 0..2 {
            for (i, &zid) in ctx.zonelist.iter().enumerate() {
                if let (true, Some(c)) = (active && pass == 0, zlc) {
                    let full = if i < 64 { skip & (1 << i) != 0 } else { !c.worth_trying(i, demand) };
                    if full {
                        skipped += 1;
                        continue;
                    }
                }
                let z = &self.zones[zid.0 as usize];
                if ctx.nodemask.is_some_and(|m| !m.contains(z.node)) {
                    continue;
                }
                let fits = level == Level::None || z.watermark_ok_fast(order, z.watermark_of(level), ctx.high);
                if fits {
                    if let Some(p) = self.rmqueue(ctx.cpu, z, order) {
                        if skipped > 0 {
                            self.count_event(ctx.cpu, VmEvent::ZlcSkipped, skipped);
                        }
                        return Some(p);
                    }
                }
                let Some(c) = zlc else { continue };
                let first = !active;
                if first {
                    // `zlc_setup`, after the first zone failed.
                    active = true;
                    if self.zlc_clock_due() {
                        let interval = self.zlc_interval_ms.load(std::sync::atomic::Ordering::Relaxed);
                        if c.setup(self.zlc_now_ms(), interval) {
                            self.count_event(ctx.cpu, VmEvent::ZlcZaps, 1);
                        }
                    }
                }
                // Full for this demand: by its count, or (it passed) for want of a block.
                if c.mark_full(i, demand, fits) {
                    self.count_event(ctx.cpu, VmEvent::ZlcFullMarks, 1);
                }
                if first && pass == 0 {
                    skip = c.skip_mask(demand);
                }
            }
            if skipped == 0 {
                break;
            }
            self.count_event(ctx.cpu, VmEvent::ZlcSkipped, skipped);
            skipped = 0;
        }
        None
    }

    /// Whether this set-up reads the clock to see if a zap is due: every time on an injected
    /// clock; else every 16th set-up of a thread (a clock read is a fifth of a walk past many
    /// full zones, and a zap a few walks late changes nothing a hint promises).
    #[inline]
    fn zlc_clock_due(&self) -> bool {
        thread_local! {
            static SETUPS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        self.zlc_clock.get().is_some()
            || SETUPS.with(|n| {
                let v = n.get();
                n.set(v.wrapping_add(1));
                v % 16 == 0
            })
    }

    /// The zonelist caches' clock, in milliseconds.
    fn zlc_now_ms(&self) -> u64 {
        match self.zlc_clock.get() {
            Some(c) => c.load(std::sync::atomic::Ordering::Relaxed),
            None => sys::coarse_now_ms().saturating_sub(self.epoch_ms),
        }
    }

    /// `zonelist_cache`: whether zonelist walks use the caches.
    pub fn zonelist_cache(&self) -> bool {
        self.zlc_on.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns the zonelist caches on or off.
    pub fn set_zonelist_cache(&self, on: bool) {
        if self.zlc_on.swap(on, std::sync::atomic::Ordering::Relaxed) != on {
            self.log_line(format!("zonelist_cache: {}", on as u8));
        }
    }

    /// `zonelist_cache_interval_ms`.
    pub fn zonelist_cache_interval_ms(&self) -> u64 {
        self.zlc_interval_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets `zonelist_cache_interval_ms` (1 ..= 3600000).
    pub fn set_zonelist_cache_interval_ms(&self, ms: u64) -> Result<()> {
        crate::tunables::check("zonelist_cache_interval_ms", ms)?;
        self.zlc_interval_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Drives the zonelist caches' clock by hand (milliseconds in `clock`), for tests of the
    /// zap; once per handle, before any allocation that may set a cache up.
    pub fn set_zonelist_cache_clock(&self, clock: Arc<AtomicU64>) -> Result<()> {
        self.zlc_clock.set(clock).map_err(|_| Error::InvalidConfig("the zonelist cache clock is already set".into()))
    }

    /// Which entries of node `nid`'s fallback zonelist its cache has marked full now, as the
    /// nodes of those entries, in zonelist order.
    pub fn zonelist_cache_full_nodes(&self, nid: NodeId) -> Result<Vec<NodeId>> {
        self.check_node(nid)?;
        let c = &self.zlcs[nid.0 as usize];
        Ok((0..c.len()).filter(|&i| c.is_marked(i)).map(|i| NodeId(c.node(i))).collect())
    }

    /// Takes a block from a zone (`rmqueue`): from this CPU's lists for small orders, from the
    /// buddy lists for large ones or when the lists are busy (`pcp_spin_trylock` failed).
    #[inline]
    fn rmqueue(&self, cpu: usize, z: &Zone, order: Order) -> Option<Pfn> {
        if let (0, Some(area)) = (order.0, self.rseq_area()) {
            if let Some(pfn) = self.pop_cached(area, z) {
                return Some(pfn);
            }
        }
        let pfn = if order.0 <= PCP_MAX_ORDER && self.pcp_enabled {
            match self.pcp(cpu, z.id).try_lock(z) {
                Some(mut g) => {
                    let refills = g.with(|p| {
                        let before = p.list_len(order);
                        let pfn = pcp::rmqueue_pcplist(z, p, order);
                        (pfn, before == 0)
                    });
                    drop(g);
                    if refills.1 {
                        self.count_event(cpu, VmEvent::PcpRefill, 1);
                    }
                    refills.0?
                }
                None => {
                    self.count_event(cpu, VmEvent::PcpTrylockFail, 1);
                    rmqueue_buddy(z, order)?
                }
            }
        } else {
            rmqueue_buddy(z, order)?
        };
        // Release: pairs with the Acquire of the CAS in free_pages, so the free sees the
        // lists' state as of this allocation.
        z.state(pfn).store(buddy::state(ALLOCATED, order), Ordering::Release);
        Some(pfn)
    }

    /// Frees a block given its address and order (`free_pages`). Checks, in order: the order,
    /// that zonal owns the address, its alignment, and that a live block of exactly this order
    /// starts there. Any failure leaves everything as it was.
    #[inline]
    pub fn free_pages(&self, addr: *mut u8, order: u32) -> Result<()> {
        if let (0, Some(area)) = (order, self.rseq_area()) {
            return self.free_order0_fast(area, addr as usize);
        }
        self.free_pages_general(addr, order)
    }

    /// The order-0 fast path of free: the same checks, a claim that tags the frame for the
    /// per-CPU cache in the same CAS, and a push in a restartable sequence; the locked path
    /// when the cache is full, locked, or the section was interrupted.
    #[inline(always)]
    fn free_order0_fast(&self, area: *mut u8, addr: usize) -> Result<()> {
        let (zone, pfn) = self.addr_to_zone(addr, Order(0))?;
        claim_order0(zone, pfn, buddy::state(buddy::PCP, Order(0)), self.free_check_atomic())?;
        let cpu = self.rseq_cpu(area);
        if !pcp::rseq::push(&self.rseq_table(area), zone.id.0 as usize, pfn.0) && unpush(zone, pfn) {
            self.free_claimed(cpu, zone, &[pfn], Order(0));
        }
        self.count_event(cpu, VmEvent::Pgfree, 1);
        Ok(())
    }

    /// `free_check`: `true` when order-0 frees on the fast path claim with a CAS.
    pub fn free_check_atomic(&self) -> bool {
        self.free_check_atomic.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets `free_check` (see [`crate::tunables::TUNABLES`]).
    pub fn set_free_check_atomic(&self, atomic: bool) {
        if self.free_check_atomic.swap(atomic, std::sync::atomic::Ordering::Relaxed) == atomic {
            return;
        }
        self.log_line(format!("free_check: {}", if atomic { "atomic" } else { "sequential" }));
    }

    #[inline]
    fn free_pages_general(&self, addr: *mut u8, order: u32) -> Result<()> {
        let order = self.check_order(order)?;
        let (zone, pfn) = self.addr_to_zone(addr as usize, order)?;
        claim(zone, pfn, order)?;
        let cpu = self.current_cpu();
        self.free_claimed(cpu, zone, &[pfn], order);
        self.count_event(cpu, VmEvent::Pgfree, order.pages() as u64);
        Ok(())
    }

    /// Returns claimed blocks of one zone and order (head state `NONE`) to this CPU's lists
    /// under one lock, or to the buddy lists for a large order or when the lists are off or
    /// busy (`free_unref_page` / `free_one_page`). The order-0 cache is for the callers that
    /// can use a restartable sequence (`free_order0_fast`, `free_run`).
    #[inline]
    fn free_claimed(&self, cpu: usize, zone: &Zone, pfns: &[Pfn], order: Order) {
        if order.0 <= PCP_MAX_ORDER && self.pcp_enabled {
            if let Some(mut g) = self.pcp(cpu, zone.id).try_lock(zone) {
                let drained: usize = g.with(|p| pfns.iter().map(|&pfn| pcp::free_to_pcp(zone, p, pfn, order)).sum());
                drop(g);
                if drained > 0 {
                    self.count_event(cpu, VmEvent::PcpDrain, 1);
                }
                return;
            }
            self.count_event(cpu, VmEvent::PcpTrylockFail, 1);
        }
        for &pfn in pfns {
            free_one_page(zone, pfn, order);
        }
    }

    /// Allocates order-0 frames into the empty (`None`) slots of `array`, leaving filled slots
    /// alone, and returns how many slots are filled afterwards (`alloc_pages_bulk`, array
    /// form). Under memory pressure it fills what it can: a partial fill is not an error.
    /// Accounting is done once per call with the batch count (seed 002).
    pub fn alloc_pages_bulk_array(&self, gfp: Gfp, array: &mut [Option<NonNull<u8>>]) -> usize {
        let mut filled = array.iter().filter(|s| s.is_some()).count();
        let want = array.len() - filled;
        if want == 0 {
            return filled;
        }
        let mut slots = array.iter_mut().filter(|s| s.is_none());
        let got = self.alloc_bulk(gfp, want, |p| {
            if let Some(s) = slots.next() {
                *s = Some(p);
            }
        });
        filled += got;
        filled
    }

    /// Allocates `nr` order-0 frames and appends them to `list`; returns how many it appended
    /// (`alloc_pages_bulk`, list form). Partial under memory pressure, never an error.
    pub fn alloc_pages_bulk_list(&self, gfp: Gfp, nr: usize, list: &mut Vec<NonNull<u8>>) -> usize {
        // No more room than there are frames: `nr` is the caller's, and may be anything.
        list.reserve(nr.min(self.lowmem_pages));
        self.alloc_bulk(gfp, nr, |p| list.push(p))
    }

    /// The bulk allocator (`__alloc_pages_bulk`): take up to `nr` frames from this CPU's
    /// order-0 list of the first usable zone, under one pcp lock, with the accounting done
    /// once. Falls back to the single-page path, as Linux does, when one frame is wanted, when
    /// the first usable zone is on another node than the preferred one, when the lists are
    /// busy, or when the zone had nothing for the lists.
    fn alloc_bulk(&self, gfp: Gfp, nr: usize, mut put: impl FnMut(NonNull<u8>)) -> usize {
        if nr == 0 {
            return 0;
        }
        let cpu = self.current_cpu();
        self.count_event(cpu, VmEvent::AllocBulk, 1);
        let local = self.topo.cpu_to_node(CpuId(cpu as u32));
        // The bulk path interleaves per call, not per frame (Linux's bulk allocator takes the
        // interleave node once per call too, for its preferred node).
        let single = |put: &mut dyn FnMut(NonNull<u8>)| match self.alloc_pages(gfp, 0) {
            Ok(p) => {
                put(p);
                1
            }
            Err(_) => 0,
        };
        if nr == 1 || !self.pcp_enabled {
            return (0..nr).map(|_| single(&mut put)).take_while(|&n| n == 1).count();
        }
        let fast = self.alloc_bulk_cached(nr, &mut put);
        if fast == nr {
            return nr;
        }
        let nr = nr - fast;
        let got = mempolicy::with_thread_policy(self.id, local, |r| {
            let (preferred, ctx) = self.context(cpu, gfp, &r);
            // The first zone that may serve the whole batch above `low`.
            let zone = ctx.zonelist.iter().map(|z| &self.zones[z.0 as usize]).find(|z| {
                ctx.nodemask.is_none_or(|m| m.contains(z.node))
                    && (ctx.no_watermarks
                        || z.watermark_ok_fast(Order(0), z.watermark(Watermark::Low).saturating_add(nr), ctx.high))
            });
            let zone = zone.filter(|z| z.node == preferred)?;
            let mut g = self.pcp(cpu, zone.id).try_lock(zone)?;
            let mut n = 0;
            let mut refills = 0;
            g.with(|p| {
                while n < nr {
                    if p.list_len(Order(0)) == 0 {
                        refills += 1;
                    }
                    let Some(pfn) = pcp::rmqueue_pcplist(zone, p, Order(0)) else { break };
                    zone.state(pfn).store(buddy::state(ALLOCATED, Order(0)), Ordering::Release);
                    put(self.pfn_to_ptr(pfn));
                    n += 1;
                }
            });
            drop(g);
            if refills > 0 {
                self.count_event(cpu, VmEvent::PcpRefill, refills);
            }
            let target = match r {
                Resolved::Interleave(node) => Some(node),
                _ => None,
            };
            // Once with the batch count (seed 002), or page by page as before it.
            let (calls, each) = if self.bulk_accounting_per_page() { (n, 1) } else { (1, n as u64) };
            for _ in 0..calls.min(n) {
                self.count_event(cpu, VmEvent::PgallocNormal, each);
                if self.numa_key.load(std::sync::atomic::Ordering::Relaxed) != 0 {
                    self.zone_statistics(cpu, &ctx, zone, each, target);
                }
            }
            (n > 0).then_some(n)
        });
        fast + match got {
            Some(n) if n == nr => n,
            // Partial fill from the lists: top up through the single-page path, which may
            // fall back to other zones, until it too fails.
            Some(n) => n + (n..nr).map(|_| single(&mut put)).take_while(|&k| k == 1).count(),
            None => (0..nr).map(|_| single(&mut put)).take_while(|&k| k == 1).count(),
        }
    }

    /// The bulk allocator's first step with restartable sequences: as many frames as this
    /// CPU's cache for the local zone holds (up to `nr`, at most 64), in one critical section,
    /// under the same conditions as the single fast path (local policy, zone above `low` with
    /// room for the batch). Accounting once for them. Returns how many it put.
    fn alloc_bulk_cached(&self, nr: usize, put: &mut impl FnMut(NonNull<u8>)) -> usize {
        let Some(area) = self.rseq_area() else { return 0 };
        let Some((cpu, z)) = self.local_fast_zone(area, nr) else { return 0 };
        let table = self.rseq_table(area);
        let mut buf = [const { MaybeUninit::uninit() }; BULK_CHUNK];
        let mut n = 0;
        let mut left = nr;
        while left > 0 {
            let want = left.min(BULK_CHUNK);
            let popped = pcp::rseq::pop_many(&table, z.id.0 as usize, &mut buf[..want]);
            let k = popped.len();
            for pfn in popped.iter().map(|&p| Pfn(p)).filter(|&pfn| take_cached(z, pfn)) {
                put(self.pfn_to_ptr(pfn));
                n += 1;
            }
            left -= k;
            if k < want {
                break;
            }
        }
        if n > 0 {
            if self.bulk_accounting_per_page() {
                (0..n).for_each(|_| self.account_local_alloc(cpu, z, 1));
            } else {
                self.account_local_alloc(cpu, z, n as u64);
            }
        }
        n
    }

    /// `bulk_accounting`: whether bulk calls account page by page (`true`) or once per call
    /// with the batch count (`false`, the default; seed 002).
    pub fn bulk_accounting_per_page(&self) -> bool {
        self.bulk_per_page.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets `bulk_accounting` (see [`crate::tunables::TUNABLES`]).
    pub fn set_bulk_accounting_per_page(&self, per_page: bool) {
        if self.bulk_per_page.swap(per_page, std::sync::atomic::Ordering::Relaxed) != per_page {
            self.log_line(format!("bulk_accounting: {}", if per_page { "per_page" } else { "batch" }));
        }
    }

    /// Frees many order-0 frames; each is checked as by [`Zonal::free_pages`]. Every valid
    /// frame is freed, under one pcp lock (or one critical section) per zone run, and the
    /// accounting is done once. On error the others are still freed and the first bad entry
    /// is reported with its index.
    pub fn free_pages_bulk(&self, pages: &[*mut u8]) -> std::result::Result<usize, (usize, Error)> {
        if let [p] = pages {
            // One frame: the single-page path is the shorter one.
            return self.free_pages(*p, 0).map(|_| 1).map_err(|e| (0, e));
        }
        let cpu = self.current_cpu();
        let area = self.rseq_area();
        // Frames bound for the rseq cache are claimed straight to its tag.
        let to = if area.is_some() { buddy::state(buddy::PCP, Order(0)) } else { buddy::NONE };
        // A claim to `NONE` goes straight to the locked lists or the buddy, which must never
        // get a frame twice: a CAS, whatever `free_check` says (this is the locked path, where
        // the CAS is a small part of the cost). Only the claim to the cache's tag may be a
        // load and a store: every way out of the cache claims again (`unpush`, the drain).
        let atomic = self.free_check_atomic() || area.is_none();
        let mut first_err = None;
        let mut freed = 0usize;
        // Runs of frames of one zone, freed together.
        let mut run = ArrayVec::<usize, FREE_RUN>::new();
        let mut i = 0;
        while i < pages.len() {
            // A run starts at a frame checked in full.
            let addr = pages[i] as usize;
            i += 1;
            let checked = self.addr_to_zone(addr, Order(0));
            let (z, pfn) = match checked.and_then(|(z, pfn)| claim_order0(z, pfn, to, atomic).map(|_| (z, pfn))) {
                Ok(v) => v,
                Err(e) => {
                    first_err.get_or_insert((i - 1, e));
                    continue;
                }
            };
            run.push(pfn.0);
            // The frames after it that lie in the same zone need only its range check. Any
            // other entry ends the run and starts the next step (a failed claim changed
            // nothing, so checking it again there is harmless).
            let base = self.arena.pfn_to_addr(z.start_pfn);
            let bytes = z.spanned << PAGE_SHIFT;
            while let Some(&p) = pages.get(i).filter(|_| !run.is_full()) {
                let off = (p as usize).wrapping_sub(base);
                if off >= bytes || off % PAGE_SIZE != 0 {
                    break;
                }
                let pfn = Pfn(z.start_pfn.0 + (off >> PAGE_SHIFT));
                if claim_order0(z, pfn, to, atomic).is_err() {
                    break;
                }
                run.push(pfn.0);
                i += 1;
            }
            freed += run.len();
            self.free_run(cpu, area, z, &run);
            run.clear();
        }
        self.count_event(cpu, VmEvent::Pgfree, freed as u64);
        match first_err {
            None => Ok(freed),
            Some(e) => Err(e),
        }
    }

    /// Frees claimed order-0 frames of one zone: as many as fit onto this CPU's rseq cache in
    /// one critical section (with `area`, they were claimed to the cache's tag), the rest
    /// onto the lists under one lock, or to the buddy when the lists are off or busy.
    fn free_run(&self, cpu: usize, area: Option<*mut u8>, z: &Zone, pfns: &[usize]) {
        let k = area.map_or(0, |area| pcp::rseq::push_many(&self.rseq_table(area), z.id.0 as usize, pfns));
        if k == pfns.len() {
            return;
        }
        // With `area`, the frames were claimed to the cache's tag: back to "claimed" for the
        // locked path, as in free_order0_fast, keeping those no racer took meanwhile.
        let rest: ArrayVec<Pfn, FREE_RUN> =
            pfns[k..].iter().map(|&p| Pfn(p)).filter(|&pfn| area.is_none() || unpush(z, pfn)).collect();
        self.free_claimed(cpu, z, &rest, Order(0));
    }

    /// Returns one CPU's lists, for every zone, to the buddy lists (`drain_local_pages` of that
    /// CPU). Returns the frames moved.
    pub fn drain_cpu_pages(&self, cpu: usize) -> usize {
        if cpu >= self.nr_cpus || !self.pcp_enabled {
            return 0;
        }
        let mut n = 0;
        for z in self.zones.iter() {
            let pcp = self.pcp(cpu, z.id);
            if !pcp.looks_empty() {
                n += pcp.lock(z).with(|p| pcp::drain(z, p));
            }
        }
        if n > 0 {
            self.count_event(self.current_cpu(), VmEvent::PcpDrain, 1);
        }
        n
    }

    /// Returns every CPU's lists to the buddy lists (`drain_all_pages`). Returns the frames
    /// moved.
    pub fn drain_all_pages(&self) -> usize {
        (0..self.nr_cpus).map(|c| self.drain_cpu_pages(c)).sum()
    }

    /// Runs one `decay_pcp_high` pass over every CPU's lists (the background worker does this
    /// every `stat_interval`). Returns the frames drained.
    pub fn decay_pcp_high(&self) -> usize {
        decay_all(&self.zones, &self.pcps)
    }

    /// One CPU's pcp figures for a zone: (count, high, batch, high_min, high_max).
    pub fn pcp_info(&self, cpu: usize, zone: ZoneId) -> Option<PcpInfo> {
        if cpu >= self.nr_cpus || zone.0 as usize >= self.zones.len() {
            return None;
        }
        // Lists only, no fence: the count is the lists' plus the cache's length as read.
        let pcp = self.pcp(cpu, zone);
        Some(pcp.lock_lists(&self.zones[zone.0 as usize]).with(|p| PcpInfo {
            count: p.count + pcp.cache_len(),
            high: p.high,
            batch: p.batch,
            high_min: p.high_min,
            high_max: p.high_max,
        }))
    }

    /// Number of CPUs the per-CPU tables cover.
    pub fn nr_cpus(&self) -> usize {
        self.nr_cpus
    }

    /// The zone and frame of an address that must start a block of `order`.
    #[inline]
    fn addr_to_zone(&self, addr: usize, order: Order) -> Result<(&Zone, Pfn)> {
        let (zone, pfn) = self.owning_zone(addr)?;
        if addr % PAGE_SIZE != 0 || !pfn.is_aligned(order) {
            return Err(Error::Misaligned { addr, order });
        }
        Ok((zone, pfn))
    }

    /// The zone that owns an address (any byte of a frame), and that frame.
    #[inline]
    fn owning_zone(&self, addr: usize) -> Result<(&Zone, Pfn)> {
        let pfn = self.arena.addr_to_pfn(addr).ok_or(Error::NotOwned { addr })?;
        let zid = self.block_zone[pfn.0 >> self.max_order.0];
        if zid == NO_ZONE || !self.zones[zid as usize].contains(pfn) {
            return Err(Error::NotOwned { addr });
        }
        Ok((&self.zones[zid as usize], pfn))
    }

    /// The node a frame of zonal belongs to (`page_to_nid`).
    pub fn page_to_nid(&self, addr: *const u8) -> Result<NodeId> {
        Ok(self.owning_zone(addr as usize)?.0.node)
    }

    /// The frame number of an address zonal owns.
    pub fn addr_to_pfn(&self, addr: *const u8) -> Result<Pfn> {
        Ok(self.owning_zone(addr as usize)?.1)
    }

    /// Free frames of a node in its buddy lists (`NR_FREE_PAGES`: frames on per-CPU lists are
    /// not counted, as in Linux; [`Zonal::nr_pcp_pages`] counts those).
    pub fn nr_free_pages(&self, nid: NodeId) -> Result<usize> {
        Ok(self
            .node_zones(nid)?
            .iter()
            .map(|z| self.zones[z.0 as usize].page_state_snapshot(ZoneStatItem::NrFreePages))
            .sum())
    }

    /// A zone counter as folded (`zone_page_state`): what the fast paths read, behind the
    /// truth by at most `nr_cpus * stat_threshold` (and, for the pages on per-CPU lists, the
    /// caches' churn since their last lock).
    pub fn zone_page_state(&self, zone: ZoneId, item: ZoneStatItem) -> Result<usize> {
        Ok(self.zone_item(zone, item)?.page_state(item))
    }

    /// A zone, checked to have the item (a free-block count of an order it has).
    fn zone_item(&self, zone: ZoneId, item: ZoneStatItem) -> Result<&Zone> {
        let z = self.zone(zone)?;
        match item {
            ZoneStatItem::NrFreeOrder(o) if o.0 > z.max_order.0 => {
                Err(Error::InvalidOrder { order: o.0 as u32, max_order: z.max_order })
            }
            _ => Ok(z),
        }
    }

    /// A zone counter with every CPU's unfolded part added (`zone_page_state_snapshot`):
    /// exact once allocation stops.
    pub fn zone_page_state_snapshot(&self, zone: ZoneId, item: ZoneStatItem) -> Result<usize> {
        let z = self.zone_item(zone, item)?;
        let v = z.page_state_snapshot(item);
        if item != ZoneStatItem::NrPcpPages {
            return Ok(v);
        }
        let churn: isize = (0..self.nr_cpus).map(|c| self.pcp(c, zone).unsettled()).sum();
        Ok((v as isize + churn).max(0) as usize)
    }

    /// Frames handed out from a zone (`managed - free - on per-CPU lists`, from snapshots).
    pub fn zone_allocated_pages(&self, zone: ZoneId) -> Result<usize> {
        let free = self.zone_page_state_snapshot(zone, ZoneStatItem::NrFreePages)?;
        let pcp = self.zone_page_state_snapshot(zone, ZoneStatItem::NrPcpPages)?;
        Ok(self.zone(zone)?.managed.saturating_sub(free + pcp))
    }

    /// A zone counter over every zone as folded (`global_zone_page_state`).
    pub fn global_page_state(&self, item: ZoneStatItem) -> usize {
        self.vm_zone_stat.get(item)
    }

    /// A zone counter over every zone, exact once allocation stops.
    pub fn global_page_state_snapshot(&self, item: ZoneStatItem) -> usize {
        self.zones.iter().map(|z| self.zone_page_state_snapshot(z.id, item).unwrap_or(0)).sum()
    }

    /// `vm.stat_refresh`: folds every CPU's zone-counter diffs now (the worker does it every
    /// `stat_interval`), so the folded counters equal the snapshots once allocation stops.
    pub fn refresh_vm_stats(&self) {
        fold_all(&self.zones, &self.pcps);
    }

    /// `stat_threshold` of a zone as CPU `cpu` applies it (`vm stats threshold`), and whether
    /// it is the pressure threshold.
    pub fn zone_stat_threshold(&self, zone: ZoneId, cpu: usize) -> Result<(usize, bool)> {
        let z = self.zone(zone)?;
        Ok((z.stat_threshold(cpu), z.under_pressure()))
    }

    /// `percpu_drift_mark` of a zone (0: the drift never decides a watermark check).
    pub fn zone_percpu_drift_mark(&self, zone: ZoneId) -> Result<usize> {
        Ok(self.zone(zone)?.percpu_drift_mark())
    }

    fn zone(&self, zone: ZoneId) -> Result<&Zone> {
        self.zones.get(zone.0 as usize).ok_or(Error::InvalidZone { zone, nr_zones: self.zones.len() })
    }

    /// Frames on every CPU's lists for a node's zones.
    pub fn nr_pcp_pages(&self, nid: NodeId) -> Result<usize> {
        let zones = self.node_zones(nid)?;
        Ok((0..self.nr_cpus)
            .flat_map(|c| zones.iter().map(move |z| (c, *z)))
            .map(|(c, z)| {
                let pcp = self.pcp(c, z);
                pcp.lock_lists(&self.zones[z.0 as usize]).with(|p| p.count + pcp.cache_len())
            })
            .sum())
    }

    /// Free blocks of one order on a node, over its zones.
    pub fn nr_free_blocks(&self, nid: NodeId, order: u32) -> Result<usize> {
        let order = self.check_order(order)?;
        Ok(self.node_zones(nid)?.iter().map(|z| self.zones[z.0 as usize].free_blocks()[order.0 as usize]).sum())
    }

    /// Checks every zone's and every per-CPU list's invariants: `free + pcp + allocated ==
    /// managed` per zone, pcp counts match their lists and stay within `high + batch`, and no
    /// frame is in two places. Returns the allocated frames. Call while no other thread
    /// allocates or frees.
    pub fn check_invariants(&self) -> std::result::Result<usize, String> {
        let mut allocated = 0;
        for z in self.zones.iter() {
            let mut on_pcp = 0;
            for c in 0..self.nr_cpus {
                // Lists only, no fence: the caller keeps every section out, so the cache can
                // be read as it stands.
                let pcp = self.pcp(c, z.id);
                on_pcp += pcp.lock_lists(z).with(|p| -> std::result::Result<usize, String> {
                    let cached = pcp.check_cache(z)?;
                    if p.count + cached > p.high + p.batch {
                        return Err(format!(
                            "zone {}: cpu {c} holds {} + {cached} cached above high {} + batch {}",
                            z.id.0, p.count, p.high, p.batch
                        ));
                    }
                    Ok(pcp::check(z, p)? + cached)
                })?;
            }
            let counted = self.zone_page_state_snapshot(z.id, ZoneStatItem::NrPcpPages).unwrap_or(usize::MAX);
            if counted != on_pcp {
                return Err(format!("zone {}: nr_zone_pcp_pages {counted} but the lists hold {on_pcp}", z.id.0));
            }
            allocated += z.check_invariants(on_pcp)?;
        }
        Ok(allocated)
    }
}

/// One CPU's pcp figures for one zone (the `pagesets` of `/proc/zoneinfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PcpInfo {
    /// Frames on the lists.
    pub count: usize,
    /// Drain threshold.
    pub high: usize,
    /// Refill and drain unit.
    pub batch: usize,
    /// Lower bound of `high`.
    pub high_min: usize,
    /// Upper bound of `high`.
    pub high_max: usize,
}

/// (batch, high_min, high_max) of a zone's pcps (`zone_set_pageset_high_and_batch`).
fn pcp_sizes(topo: &Topology, z: &Zone, fraction: u32) -> (usize, usize, usize) {
    let batch = pcp::zone_batchsize(z.managed);
    let node_cpus = topo.nodes()[z.node.0 as usize].cpus.len();
    let low = z.watermark(Watermark::Low);
    let size = |f| pcp::zone_highsize(low, z.managed, batch, node_cpus, topo.nr_cpus(), f);
    if fraction != 0 {
        let h = size(fraction);
        (batch, h, h)
    } else {
        let (min, max) = (size(0), size(pcp::MIN_PERCPU_PAGELIST_HIGH_FRACTION));
        (batch, min, max.max(min))
    }
}

/// `decay_pcp_high` over every CPU's lists, skipping those a decay would not change (a
/// lock-free hint from their last unlock): on an idle handle the worker then takes no pcp
/// lock and fences no CPU, however many CPUs there are.
fn decay_all(zones: &[Zone], pcps: &[PerCpuPages]) -> usize {
    pcps.iter()
        .enumerate()
        .filter(|(_, p)| p.needs_decay())
        .map(|(i, p)| {
            let z = &zones[i % zones.len()];
            p.lock(z).with(|inner| pcp::decay_high(z, inner))
        })
        .sum()
}

/// `refresh_cpu_vm_stats` for every CPU, and `vm.stat_refresh`: folds every zone-counter diff
/// into the zone and global counters, each under the lock that guards it, and gives a zone
/// under pressure its normal threshold back once its free frames are at or above `high`
/// (where kswapd would go back to sleep).
///
/// As Linux's `refresh_cpu_vm_stats`, a CPU's lists with nothing to fold (a zero diff and no
/// cache churn, read without the lock) are skipped; the others are locked lists-only, which
/// never fences: folding touches no cache.
fn fold_all(zones: &[Zone], pcps: &[PerCpuPages]) {
    for z in zones {
        z.lock().fold_diffs();
        if z.under_pressure() && z.page_state_snapshot(ZoneStatItem::NrFreePages) >= z.watermark(Watermark::High) {
            z.set_pressure(false);
        }
    }
    for (i, p) in pcps.iter().enumerate() {
        let z = &zones[i % zones.len()];
        if p.unsettled() != 0 || z.diff(p.cpu(), ZoneStatItem::NrPcpPages) != 0 {
            p.lock_lists(z).fold_diff();
        }
    }
}

/// The background worker (`vmstat_update`): every interval, decays idle pcps' `high` and
/// folds the zone counters. Stopped and joined when the handle drops.
struct Worker {
    stop: Arc<(std::sync::Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    fn start(zones: Arc<[Zone]>, pcps: Arc<[PerCpuPages]>, interval_ms: Arc<std::sync::atomic::AtomicU64>) -> Worker {
        let stop = Arc::new((std::sync::Mutex::new(false), Condvar::new()));
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("zonal-vmstat".into())
            .spawn(move || {
                let (m, cv) = &*s;
                let mut stopped = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                while !*stopped {
                    let interval = Duration::from_millis(interval_ms.load(std::sync::atomic::Ordering::Relaxed));
                    let (g, timeout) =
                        cv.wait_timeout(stopped, interval).unwrap_or_else(std::sync::PoisonError::into_inner);
                    stopped = g;
                    if !*stopped && timeout.timed_out() {
                        decay_all(&zones, &pcps);
                        fold_all(&zones, &pcps);
                    }
                }
            })
            .ok();
        Worker { stop, thread }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let (m, cv) = &*self.stop;
        *m.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Zonal {
    fn drop(&mut self) {
        self.worker.take();
        mempolicy::forget_handle(self.id);
    }
}

/// Events counted since a base: `now - base`, or 0 when a lost per-CPU update (two threads
/// interleaving on one CPU's counter) left the counter below the base taken meanwhile.
fn counted_since(now: u64, base: u64) -> u64 {
    let d = now.wrapping_sub(base);
    if d > u64::MAX / 2 {
        0
    } else {
        d
    }
}

/// The bounds of the `stat_interval` tunable in ms (`sysctl::TUNABLES`; a unit test keeps them
/// equal).
const STAT_INTERVAL_MS: (u64, u64) = (1, 3_600_000);

/// `d` in whole milliseconds, clamped to the `stat_interval` bounds, without truncating casts.
fn stat_interval_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).clamp(STAT_INTERVAL_MS.0, STAT_INTERVAL_MS.1)
}

/// Claims a live block for freeing: `ALLOCATED|order -> NONE` on its head, so exactly one of
/// any number of racing frees wins and every other bad free is refused with its reason.
#[inline]
fn claim(zone: &Zone, pfn: Pfn, order: Order) -> Result<()> {
    match zone.state(pfn).compare_exchange(
        buddy::state(ALLOCATED, order),
        buddy::NONE,
        Ordering::Acquire,
        Ordering::Relaxed,
    ) {
        Ok(_) => Ok(()),
        Err(s) => Err(classify_bad_free(zone, pfn, order, s)),
    }
}

/// Claims an order-0 frame for a free as `free_check` says, leaving its head state `to`
/// (`NONE` for the locked paths, `PCP` for a push onto the cache). `atomic`: one CAS, so
/// of two racing frees exactly one wins. `sequential`: a load and a store, so a free that
/// happens after another free of this frame sees its tag and fails, while two frees racing
/// on different CPUs (a data race in the caller) may both pass; the pops and drains drop
/// the second copy (see [`take_cached`] and `pcp::free_pcppages_bulk`).
#[inline(always)]
fn claim_order0(z: &Zone, pfn: Pfn, to: u8, atomic: bool) -> Result<()> {
    let live = buddy::state(ALLOCATED, Order(0));
    let state = z.state(pfn);
    // Acquire: pairs with the Release of the allocation that handed the frame out.
    let seen = if atomic {
        match state.compare_exchange(live, to, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return Ok(()),
            Err(s) => s,
        }
    } else {
        let s = state.load(Ordering::Acquire);
        if s == live {
            state.store(to, Ordering::Relaxed);
            return Ok(());
        }
        s
    };
    Err(classify_bad_free(z, pfn, Order(0), seen))
}

/// Takes back the claim of an order-0 frame claimed to the cache's tag (`PCP`) whose push
/// failed, for the locked path: `PCP -> NONE` with a CAS, so that when a caller's racing
/// frees under `free_check = sequential` both claimed it (and the other copy may already
/// be in a cache, popped, or drained), at most one copy goes on. `false`: a racer's copy
/// moved it on; this free leaves it alone. Off the fast path (the cache was full or locked,
/// or the section was interrupted). `NONE` and not `PCP` for the locked path because the
/// buddy must not find a stale per-CPU tag on a frame that merging leaves inside a block.
#[inline]
fn unpush(z: &Zone, pfn: Pfn) -> bool {
    let pcp = buddy::state(buddy::PCP, Order(0));
    z.state(pfn).compare_exchange(pcp, buddy::NONE, Ordering::Relaxed, Ordering::Relaxed).is_ok()
}

/// Tags a frame just popped from a per-CPU cache allocated. `false` for a frame whose tag
/// is not `PCP`: the second copy left by two racing frees under `free_check = sequential`,
/// dropped here (the first copy is live or back in the lists).
#[inline(always)]
fn take_cached(z: &Zone, pfn: Pfn) -> bool {
    let state = z.state(pfn);
    if state.load(Ordering::Relaxed) != buddy::state(buddy::PCP, Order(0)) {
        return false;
    }
    // Release: pairs with the Acquire of the claim in free_pages.
    state.store(buddy::state(ALLOCATED, Order(0)), Ordering::Release);
    true
}

/// Takes a block of `order` from a zone's buddy lists (`rmqueue_buddy`); the caller tags it.
#[inline]
fn rmqueue_buddy(z: &Zone, order: Order) -> Option<Pfn> {
    let mut l = z.lock();
    let pfn = l.buddy().rmqueue_smallest(order)?;
    drop(l);
    debug_vm_check(z);
    Some(pfn)
}

/// Returns a claimed block (head state `NONE`) to its zone's buddy lists; the buddy refuses
/// a block that is already free (see `Buddy::free_one`).
#[inline]
fn free_one_page(z: &Zone, pfn: Pfn, order: Order) {
    let mut l = z.lock();
    l.buddy().free_one(pfn, order);
    drop(l);
    debug_vm_check(z);
}

/// With the `debug-vm` feature, checks the zone's free lists after a buddy operation
/// ([`Zone::debug_check_free_area`], O(free blocks)) and stops at the first broken invariant,
/// as `VM_BUG_ON` does: a corrupted free list must not hand out memory. Nothing without it.
#[inline(always)]
fn debug_vm_check(z: &Zone) {
    #[cfg(feature = "debug-vm")]
    if let Err(e) = z.debug_check_free_area() {
        panic!("debug-vm: {e}");
    }
    let _ = z;
}

/// Says why a free of `order` at `pfn` was refused, given the head's state `s`. Reads other
/// frames' states without a lock: this only chooses the error, it changes nothing.
#[cold]
fn classify_bad_free(z: &Zone, pfn: Pfn, order: Order, s: u8) -> Error {
    let (tag, o) = buddy::decode(s);
    match tag {
        ALLOCATED => return Error::OrderMismatch { pfn, allocated: o, freed: order },
        buddy::BUDDY | buddy::PCP => return Error::DoubleFree { pfn },
        _ => {}
    }
    // A frame that heads nothing: find the block that covers it, if one is allocated.
    for up in 1..=z.max_order.0 {
        let head = pfn.align_down(Order(up));
        if !z.contains(head) {
            break;
        }
        let (tag, o) = buddy::decode(z.state(head).load(Ordering::Relaxed));
        if tag != buddy::NONE && head.0 + o.pages() > pfn.0 {
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
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Zonal>();
};

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A huge `stat_interval` is the bound, not its milliseconds cut to 64 bits (which made
    /// `Duration::MAX` 1 ms... or any value), and the clamp agrees with the sysctl table.
    #[test]
    fn stat_interval_is_clamped_not_truncated() {
        let t = Topology::parse("nodes=1,size=4M").unwrap();
        let z = Zonal::new(Config::new(t)).unwrap();
        let hour = Duration::from_secs(3600);
        // 2^64 ms + 5 ms: `as u64` kept the 5.
        let wraps = Duration::from_millis(u64::MAX) + Duration::from_millis(6);
        for (d, want) in [(Duration::MAX, hour), (wraps, hour), (Duration::ZERO, Duration::from_millis(1))] {
            z.set_stat_interval(d);
            assert_eq!(z.stat_interval(), want, "{d:?}");
        }
        assert!(crate::tunables::check("stat_interval", STAT_INTERVAL_MS.1).is_ok());
        assert!(crate::tunables::check("stat_interval", STAT_INTERVAL_MS.1 + 1).is_err());
        assert!(crate::tunables::check("stat_interval", STAT_INTERVAL_MS.0 - 1).is_err());
        // Through the config, a huge interval is an error naming the bound (Config::validate).
        let e = Config::parse("topology=nodes=1,size=4M;stat_interval_ms=18446744073709551615").unwrap_err();
        assert!(e.to_string().contains("stat_interval"), "{e}");
    }

    /// Under `free_check = sequential`, a free preempted between the load and the store of
    /// its claim can tag a frame `PCP` after the frame went back to the buddy (through the
    /// racing free that won), then push its copy. Built here by hand, on the head of a free
    /// block and on a frame inside one: the drain must refuse the copy, not list it again.
    #[test]
    fn a_late_claim_never_puts_a_free_frame_on_the_buddy_twice() {
        let t = Topology::parse("nodes=1,size=16M").unwrap();
        let z = Zonal::new(Config::new(t)).unwrap();
        let zone = &z.zones[0];
        z.drain_all_pages();
        for pfn in [zone.start_pfn, Pfn(zone.start_pfn.0 + 5)] {
            z.pcp(0, zone.id).lock(zone).with(|p| pcp::free_to_pcp(zone, p, pfn, Order(0)));
            z.drain_all_pages();
            assert_eq!(z.check_invariants(), Ok(0), "{pfn}");
            assert_eq!(z.nr_free_pages(NodeId(0)).unwrap(), zone.managed, "{pfn}");
        }
    }

    /// Under `free_check = sequential`, two frees of one frame racing on two CPUs can both
    /// pass the check and leave the frame on a cache twice. Built here by hand, without a
    /// race: the first copy is handed out, the second is dropped rather than handed out
    /// again, and nothing else is lost.
    #[test]
    fn a_second_copy_left_by_racing_frees_is_dropped() {
        let t = Topology::parse("nodes=1,size=16M").unwrap();
        let z = Zonal::new(Config::new(t)).unwrap();
        // Skip only where rseq is legitimately absent, and say so; anywhere else a handle
        // without its rseq area is a failure, not a pass.
        let absent = if std::env::var_os("ZONAL_NO_RSEQ").is_some() {
            Some("ZONAL_NO_RSEQ is set")
        } else if !cfg!(target_arch = "x86_64") {
            Some("the rseq sections are x86-64 only")
        } else if sys::rseq_offset().is_none() {
            Some("glibc registered no rseq area")
        } else if !sys::membarrier_rseq_registered() {
            Some("no membarrier PRIVATE_EXPEDITED_RSEQ")
        } else {
            None
        };
        if let Some(why) = absent {
            assert!(z.rseq_area().is_none(), "{why}, yet the handle runs the rseq path");
            eprintln!("SKIPPED: {why}: the order-0 cache is off, nothing to test");
            return;
        }
        assert!(z.rseq_area().is_some(), "rseq and membarrier are available, but the handle does not use them");
        std::thread::scope(|s| {
            s.spawn(|| {
                let area = z.rseq_area().unwrap();
                // One CPU for the whole test, so every section sees the same cache.
                sys::set_affinity(sys::current_cpu()).unwrap();
                let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
                let (zone, pfn) = z.addr_to_zone(p.as_ptr() as usize, Order(0)).unwrap();
                zone.state(pfn).store(buddy::state(buddy::PCP, Order(0)), Ordering::Relaxed);
                for _ in 0..2 {
                    // A push fails only when preempted mid-section or at the cache's bound,
                    // which a single earlier allocation leaves far away.
                    assert!((0..1000).any(|_| pcp::rseq::push(&z.rseq_table(area), zone.id.0 as usize, pfn.0)));
                }
                let first = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
                assert_eq!(first, p, "the top of the cache is the frame");
                let second = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
                assert_ne!(second, p, "the second copy is not handed out again");
                z.free_pages(first.as_ptr(), 0).unwrap();
                z.free_pages(second.as_ptr(), 0).unwrap();
                assert!(matches!(z.free_pages(first.as_ptr(), 0), Err(Error::DoubleFree { .. })));
            });
        });
        z.drain_all_pages();
        assert_eq!(z.check_invariants(), Ok(0));
        assert_eq!(z.nr_free_pages(NodeId(0)).unwrap(), z.zones[0].managed);
    }
}
