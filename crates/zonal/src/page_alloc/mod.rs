//! The allocator handle, [`Zonal`]: allocation walks a zonelist checking watermarks, free
//! returns a block to its zone's buddy lists after checking that it is a live block of that
//! order.
//!
//! Kernel counterpart: mm/page_alloc.c and mm/mm_init.c, one file per part as Linux and
//! mimalloc split theirs: `init` (building a handle), `alloc` (`__alloc_pages`, the walk,
//! the slow path, `rmqueue`), `fast` (the order-0 rseq paths), `free`, `bulk`, `drain` (and
//! the worker), `numa` (`zone_statistics`, `numa_stats_mode`), `stats` (counter reads and
//! the invariant walk), `tune` (the tunables). This file holds the handle's parts and the
//! lookups every path shares (`page_to_nid`, address to zone).
//!
//! Locking: one zone lock at a time, never nested. A free claims its block with a CAS on the
//! head frame's state before taking the zone lock, so two frees of one block cannot both
//! succeed and a bad free changes nothing.
//!
//! Invariant, per zone and quiescent: `nr_free + allocated == managed`
//! ([`Zonal::check_invariants`]).

mod acting;
mod alloc;
mod bulk;
mod drain;
mod fast;
mod free;
mod init;
mod key;
mod numa;
mod stats;
mod tune;

pub use acting::ActingCpu;
pub use bulk::BulkPage;
pub use stats::PcpInfo;
pub use tune::LOG_LINES;

use crate::arena::Arena;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::gfp::Gfp;
use crate::mem_map::{self, ALLOCATED};
use crate::mem_map::{claim, claim_order0, take_cached, unpush};
use crate::mempolicy::{self, MemPolicy, NodeMask, Resolved};
use crate::pcp::{self, PcpGuard, PerCpuPages, PCP_THP_ORDER};
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
use drain::Worker;
use free::debug_vm_check;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar};
use std::time::Duration;
use tune::{check_min_free_kbytes, stat_interval_ms, TunableLog};

static NEXT_HANDLE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A page allocator over its own memory. `Send + Sync`: share it by reference or `Arc`.
///
/// Blocks it hands out stay valid until they are freed or the handle is dropped (dropping
/// unmaps the memory, as tearing down any allocator does).
pub struct Zonal {
    id: u64,
    topo: Topology,
    /// The memory and its zones.
    mem: Memory,
    /// What each CPU has of its own.
    cpus: PerCpuSets,
    /// What every fast path reads first (the restartable sequences' offset, the NUMA
    /// statistics key, `free_check`), in one word.
    key: key::FastKey,
    /// NUMA event counting (seeds 000, 001, 002).
    numa: NumaCounting,
    /// The run-time tunables.
    tun: Tunables,
    /// Counters that layers on top of this handle add to its reports (NUMA balancing's).
    sources: Sources<CounterSource>,
    /// Tunables that layers on top of this handle add to its `sysctl` (NUMA balancing's).
    tunable_sources: Sources<std::sync::Arc<dyn crate::tunables::TunableSource>>,
    worker: Option<Worker>,
    /// Held for writing by each housekeeping pass (the worker's, `decay_pcp_high`,
    /// `refresh_vm_stats`), for reading by the exact readers ([`Zonal::settled`]).
    pass: Arc<std::sync::RwLock<()>>,
    /// What a layer above the handle ties to its lifetime: the live-introspection server
    /// while the handle is published (`live`), dropped before the rest of the handle. Typed
    /// `Any` so that the core names nothing of the layers above it.
    attached: std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

/// A function that reads a layer's counters as `(name, value)`, for the reports.
pub type CounterSource = Box<dyn Fn() -> Vec<(String, u64)> + Send + Sync>;

/// What layers on top of a handle added to it (counter sources, tunable sources), by id.
/// Plain std types: no allocator protocol runs through them, so loom need not model them.
pub(crate) struct Sources<T> {
    next: std::sync::atomic::AtomicU64,
    list: std::sync::Mutex<Vec<(u64, T)>>,
}

impl<T> Default for Sources<T> {
    fn default() -> Self {
        Sources { next: Default::default(), list: Default::default() }
    }
}

impl Zonal {
    /// This handle's id, unique in the process (from a process-wide counter): the
    /// `handle` of its live socket's name.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The slot of what is attached to the handle's lifetime (the live server).
    pub(crate) fn attached(&self) -> std::sync::MutexGuard<'_, Option<Box<dyn std::any::Any + Send>>> {
        self.attached.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<T> Sources<T> {
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<(u64, T)>> {
        self.list.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn add(&self, x: T) -> u64 {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.list().push((id, x));
        id
    }

    fn remove(&self, id: u64) -> bool {
        let mut l = self.list();
        let before = l.len();
        l.retain(|(i, _)| *i != id);
        l.len() != before
    }
}

impl Zonal {
    /// Adds counters to this handle's reports (vmstat, its JSON and the Prometheus
    /// exposition), after zonal's own: a layer built on this handle, such as NUMA
    /// balancing, reports what it does where zonal's counters are read. Returns the id that
    /// removes it. The function runs at every report, so it should only read counters.
    pub fn add_counter_source(&self, f: CounterSource) -> u64 {
        self.sources.add(f)
    }

    /// Removes a counter source; `false` if there was none with this id.
    pub fn remove_counter_source(&self, id: u64) -> bool {
        self.sources.remove(id)
    }

    /// Every added source's counters, in the order they were added.
    pub(crate) fn source_counters(&self) -> Vec<(String, u64)> {
        self.sources.list().iter().flat_map(|(_, f)| f()).collect()
    }

    /// Adds a layer's tunables to this handle's `sysctl` (get, set, all; and so to the live
    /// `sysctl` requests of `zonal --pid P sysctl`), after zonal's own, which keep their
    /// names. Returns the id that removes it.
    pub fn add_tunable_source(&self, s: std::sync::Arc<dyn crate::tunables::TunableSource>) -> u64 {
        self.tunable_sources.add(s)
    }

    /// Removes a tunable source; `false` if there was none with this id.
    pub fn remove_tunable_source(&self, id: u64) -> bool {
        self.tunable_sources.remove(id)
    }

    /// The added tunable sources, in the order they were added (copied out, so that a
    /// source runs without the list's lock).
    pub(crate) fn tunable_sources(&self) -> Vec<std::sync::Arc<dyn crate::tunables::TunableSource>> {
        self.tunable_sources.list().iter().map(|(_, s)| s.clone()).collect()
    }
}

/// The handle's memory: the arena, its zones and how allocations find them.
struct Memory {
    // Zones before the arena: fields drop in order, and the zones hold no pointers into the
    // arena, but keeping the memory last mirrors that nothing outlives it.
    zones: Arc<[Zone]>,
    /// The zones of each node, `[node]`.
    node_zones: Vec<Vec<ZoneId>>,
    /// Each node's zonelists, `[node]`.
    zonelists: Vec<Zonelists>,
    /// The zonelist cache of each node's fallback zonelist (seed 003), `[node]`.
    zlcs: Box<[ZonelistCache]>,
    /// A clock for the caches that tests set and move by hand; unset, the caches read
    /// milliseconds of the coarse monotonic clock since `zlc_epoch_ms`.
    zlc_clock: std::sync::OnceLock<Arc<AtomicU64>>,
    zlc_epoch_ms: u64,
    /// The zone counters of every zone folded together (`vm_zone_stat`).
    vm_zone_stat: Arc<ZoneCounters>,
    /// Zone of each largest-order block of the arena (`u16::MAX`: a gap).
    block_zone: Vec<u16>,
    /// The state byte of every frame of the arena, which its zones share (see
    /// [`mem_map::MemMap`]).
    map: mem_map::MapRef,
    max_order: Order,
    /// Frames of every zone (`lowmem_pages`, what `min_free_kbytes` is shared over).
    lowmem_pages: usize,
    arena: Arena,
}

/// What each CPU has of its own: its page lists (and rseq caches) per zone and its event
/// counters, each on lines of their own (seed 002).
struct PerCpuSets {
    nr_cpus: usize,
    /// Per-CPU page lists, `[cpu * nr_zones + zone]`.
    pcps: Arc<[PerCpuPages]>,
    /// Per-CPU event counters, `[cpu]`, apart from the lists (seed 002).
    events: Box<[PerCpuEvents]>,
    pcp_enabled: bool,
    /// The first zone of each CPU's node's zonelist, `[cpu]`: where an allocation under the
    /// local policy looks first, and what the order-0 fast path takes from; `NO_ZONE` for a
    /// CPU whose first zone is off its node, whose allocations must each be charged.
    local_zone: Box<[u16]>,
    /// Where the fast paths' sections find each CPU's lists of its local zone, `[cpu]` for
    /// every id below [`pcp::rseq::LOCAL_CPUS`]: the address of `pcps[cpu * nr_zones +
    /// local_zone[cpu]]`, or of [`pcp::rseq::LOCKED_STANDIN`] for a CPU the path does not
    /// serve (`NO_ZONE`, or no restartable sequences), or of [`pcp::rseq::ABSENT_STANDIN`]
    /// for an id from `nr_cpus` on.
    local_pcp: Box<[usize]>,
    /// The address of every CPU's lists of every zone, `[zone * nr_cpus + cpu]`: where the
    /// fast free's section finds a frame's lists when they are not the CPU's local ones
    /// (through `free_table`, which points into it, so it is only kept here).
    #[allow(dead_code)]
    zone_pcp: Box<[usize]>,
    /// The fast free's table (`local_pcp`, `zone_pcp`, the memory's `block_zone`), built once.
    free_table: pcp::rseq::FrameTable,
}

/// NUMA event counting: the counters of the three strategies, the static key and the mode.
struct NumaCounting {
    /// Per-CPU NUMA counters, `[cpu * nr_zones + zone]`, apart from the lists (seed 002).
    zone_stats: Box<[PerCpuZoneStat]>,
    /// Per-zone shared NUMA counters that seed 000's per-CPU diffs fold into.
    shared: Box<[ZoneNumaShared]>,
    /// The counting strategy: the index of a [`NumaStrategy`] in `NumaStrategy::ALL`.
    strategy: std::sync::atomic::AtomicU8,
    /// `numa_stat_threshold`.
    threshold: std::sync::atomic::AtomicU16,
    /// The mode; its mutex serialises writers, as `vm_numa_stats_mode_lock` does.
    mode: std::sync::Mutex<NumaStatsMode>,
    /// Per CPU, `local_first` when the per-CPU strategy last began counting (`[cpu]`), and
    /// what it counted before it last stopped: the NUMA hits and locals of the fast paths are
    /// `frozen + (local_first - base)` while it counts, `frozen` while not. Written under the
    /// mode lock.
    fast_base: Box<[AtomicU64]>,
    fast_frozen: Box<[AtomicU64]>,
}

/// The run-time tunables that live in the handle (`/proc/sys/vm/*`), and their log.
struct Tunables {
    /// `bulk_accounting`: `true` accounts a bulk call page by page (the seeds' "before").
    bulk_per_page: std::sync::atomic::AtomicBool,
    percpu_pagelist_high_fraction: AtomicU32,
    /// `stat_interval` in milliseconds, read by the worker at every wake-up.
    stat_interval_ms: Arc<std::sync::atomic::AtomicU64>,
    min_free_kbytes: AtomicU64,
    watermark_scale_factor: AtomicU64,
    /// `zonelist_cache`: whether walks use the caches.
    zlc_on: std::sync::atomic::AtomicBool,
    /// `zonelist_cache_interval_ms`: how long a zone stays marked full at most.
    zlc_interval_ms: AtomicU64,
    /// Messages about tunable changes (`pr_info` in the kernel): the last [`LOG_LINES`],
    /// oldest first, and how many older ones were dropped.
    log: std::sync::Mutex<TunableLog>,
}

/// `numa_key` when counting with per-CPU event counters.
const NUMA_ON_PERCPU: u8 = 1;
/// `numa_key` when counting with seed 000's diffs and threshold.
const NUMA_ON_THRESHOLD: u8 = 2;
/// `numa_key` when counting with atomic adds on shared counters.
const NUMA_ON_SHARED: u8 = 3;

/// Frames a bulk free gathers per zone before freeing them under one lock: the cache's size,
/// so one critical section can take a whole run.
const FREE_RUN: usize = 64;

/// Blocks the bulk allocator moves out of the rseq cache per critical section.
const BULK_CHUNK: usize = 64;

/// The most frames a bulk call allocates or frees one by one through the single fast paths
/// (a critical section each): up to here the bulk path's set-up costs more than its one
/// section saves. In `bench bulk`, per page, allocated then freed: 2 frames 9.8–10.0 ns
/// against 17.3–18.3 through the bulk paths, 3 frames 8.7 against 12.2–12.8, 4 frames
/// 8.4–8.7 against 10.1–10.7; 8 frames freed one by one were 0–14% slower than in one call.
const SMALL_BULK: usize = 4;

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
    /// glibc's rseq offset when an order-0 `rmqueue` may pop the rseq cache of the CPU the
    /// thread runs on: `None` without the sections, and for a thread acting as a CPU
    /// ([`Zonal::act_as_cpu`]), whose CPU is another.
    rseq: Option<isize>,
}

impl Zonal {
    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// Every zone, by id.
    pub fn zones(&self) -> &[Zone] {
        &self.mem.zones
    }

    /// The zones of a node.
    pub fn node_zones(&self, nid: NodeId) -> Result<&[ZoneId]> {
        self.check_node(nid)?;
        Ok(&self.mem.node_zones[nid.0 as usize])
    }

    /// A node's zonelists.
    pub fn zonelists(&self, nid: NodeId) -> Result<&Zonelists> {
        self.check_node(nid)?;
        Ok(&self.mem.zonelists[nid.0 as usize])
    }

    /// Largest order.
    pub fn max_order(&self) -> Order {
        self.mem.max_order
    }

    /// The CPU this thread runs on now, as an index into the per-CPU tables. Only a hint:
    /// the thread may move at any instant, and nothing depends on it staying.
    #[inline]
    pub fn current_cpu(&self) -> usize {
        let c = sys::current_cpu() as usize;
        if c < self.cpus.nr_cpus {
            c
        } else {
            c % self.cpus.nr_cpus
        }
    }

    /// The node of the CPU this thread runs on (`numa_node_id`).
    #[inline]
    pub fn local_node(&self) -> NodeId {
        self.topo.cpu_to_node(CpuId(self.current_cpu() as u32))
    }

    #[inline]
    fn check_order(&self, order: u32) -> Result<Order> {
        if order > self.mem.max_order.0 as u32 {
            return Err(Error::InvalidOrder { order, max_order: self.mem.max_order });
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

    /// glibc's `__rseq_offset` when the restartable sequences run: this thread's rseq area
    /// lies at the thread pointer plus it. The sections take the offset and address the area
    /// through the thread pointer's segment, so no path loads the pointer first.
    #[inline]
    fn rseq_off(&self) -> Option<isize> {
        self.key.load().rseq()
    }

    /// The CPU the kernel last wrote into this thread's rseq area (at `rseq`, from
    /// `rseq_off`), as an index of this handle's per-CPU arrays (see [`Zonal::current_cpu`]).
    #[inline]
    fn rseq_cpu(&self, rseq: isize) -> usize {
        let area = (sys::thread_pointer() as isize + rseq) as *mut u8;
        // SAFETY: glibc registered this thread's `struct rseq` at the thread pointer plus
        // `__rseq_offset`, which `rseq` is (`rseq_off`).
        let id = unsafe { sys::rseq_area_cpu_id(area) };
        match id.map(|c| c as usize) {
            Some(c) if c < self.cpus.nr_cpus => c,
            _ => self.current_cpu(),
        }
    }

    /// Where the rseq critical sections of this thread find the per-CPU lists.
    #[inline]
    fn rseq_table(&self, rseq: isize) -> pcp::rseq::Table {
        pcp::rseq::Table {
            rseq,
            base: self.cpus.pcps.as_ptr(),
            nr_cpus: self.cpus.nr_cpus,
            nr_zones: self.mem.zones.len(),
        }
    }

    #[inline(always)]
    fn pcp(&self, cpu: usize, zone: ZoneId) -> &PerCpuPages {
        &self.cpus.pcps[cpu * self.mem.zones.len() + zone.0 as usize]
    }

    /// `pcp_spin_trylock` on this CPU's lists of `z` for a block of a small order (0 to 3),
    /// in the mode the order needs: order 0 flushes the rseq cache into its list; orders 1
    /// to 3 leave the cache in place and count it. (The THP list's holders take
    /// `try_lock_thp` in [`Zonal::pcp_take`] and [`Zonal::pcp_give`]: they leave the other
    /// caches alone and move the THP cache's blocks.)
    #[inline]
    fn pcp_try_lock<'a>(&'a self, cpu: usize, z: &'a Zone, order: Order) -> Option<PcpGuard<'a>> {
        let pcp = self.pcp(cpu, z.id);
        if order.0 == 0 {
            pcp.try_lock(z).map(|mut g| {
                g.keep_small_caches();
                g
            })
        } else {
            pcp.try_lock_small_orders(z)
        }
    }

    /// Takes a block of `order` (a pcp order) from this CPU's lists of `z`, refilling them
    /// if need be: `None` when the lists are busy, else the block (`None` when the zone had
    /// none either) and whether a refill ran. The block's state is still `PCP|order`.
    #[inline]
    fn pcp_take(&self, cpu: usize, z: &Zone, order: Order) -> Option<(Option<Pfn>, bool)> {
        if order == PCP_THP_ORDER {
            let mut g = self.pcp(cpu, z.id).try_lock_thp(z)?;
            return Some(g.with_thp(|p| {
                let empty = p.list_len(order) == 0;
                (pcp::rmqueue_pcplist(z, p, order), empty)
            }));
        }
        let mut g = self.pcp_try_lock(cpu, z, order)?;
        if order.0 == 0 {
            g.fill_for_allocations();
        } else {
            g.fill_small(order);
        }
        Some(g.with(|p| {
            let empty = p.list_len(order) == 0;
            (pcp::rmqueue_pcplist(z, p, order), empty)
        }))
    }

    /// Puts claimed blocks of `order` (a pcp order; head state `NONE`) on this CPU's lists of
    /// `zone`, draining past their bound: `None` when the lists are busy, else the frames
    /// drained.
    #[inline]
    fn pcp_give(&self, cpu: usize, zone: &Zone, pfns: &[Pfn], order: Order) -> Option<usize> {
        if order == PCP_THP_ORDER {
            let mut g = self.pcp(cpu, zone.id).try_lock_thp(zone)?;
            return Some(g.with_thp(|p| pfns.iter().map(|&pfn| pcp::free_to_pcp(zone, p, pfn, order)).sum()));
        }
        let pcp = self.pcp(cpu, zone.id);
        // Frames of other CPUs' runs go to the outbox, which needs no flush of the caches.
        let foreign = |p: &Pfn| !matches!(zone.run_owner(*p), o if o == cpu as u16 || o == mem_map::NO_OWNER);
        let mut g = if order.0 == 0 && pcp.routes() && pfns.iter().all(foreign) {
            pcp.try_lock_outbox(zone)?
        } else {
            self.pcp_try_lock(cpu, zone, order)?
        };
        if order.0 > 0 {
            g.fill_small(order);
        }
        Some(g.with(|p| pfns.iter().map(|&pfn| pcp::free_to_pcp(zone, p, pfn, order)).sum()))
    }

    #[inline]
    fn count_event(&self, cpu: usize, ev: VmEvent, n: u64) {
        self.cpus.events[cpu].add(ev, n);
    }

    /// Counts `n` frames of `zone` allocated (`free` false) or freed by `cpu` outside the
    /// caches' words: `pgalloc_normal` or `pgfree`, by zone (see [`Zonal::zone_page_events`]).
    #[inline]
    fn count_pages(&self, cpu: usize, zone: ZoneId, free: bool, n: u64) {
        self.pcp(cpu, zone).count_slow(free, n);
    }

    /// The frames allocated from `zone` and freed to it since the handle was built
    /// (`pgalloc_normal` and `pgfree` of that zone, wrapping), summed over CPUs: the fast
    /// paths' counts in the caches' words and the local allocations they count per CPU
    /// (`local_first`, all from the CPU's local zone), and the slow paths' counts. Over
    /// every zone they sum to [`Zonal::event`]'s. Per node, they are `zonal top`'s pages
    /// allocated and freed per second.
    pub fn zone_page_events(&self, zone: ZoneId) -> (u64, u64) {
        let (nz, z) = (self.mem.zones.len(), zone.0 as usize);
        let mut sum = (0u64, 0u64);
        for cpu in 0..self.cpus.events.len() {
            let p = &self.cpus.pcps[cpu * nz + z];
            for (a, f) in [p.fast_counts(), p.small_counts(), p.slow_counts()] {
                sum = (sum.0.wrapping_add(a), sum.1.wrapping_add(f));
            }
            if self.cpus.local_zone.get(cpu).is_some_and(|&l| l as usize == z) {
                sum.0 = sum.0.wrapping_add(self.cpus.events[cpu].local_first());
            }
        }
        sum
    }

    /// An event counter summed over CPUs.
    pub fn event(&self, ev: VmEvent) -> u64 {
        let n = vmstat::sum_events(&self.cpus.events, ev);
        let pcps = self.cpus.pcps.iter();
        match ev {
            // Counted by the lists fenced, under their lock: the worker that fences too has
            // no event counters of its own.
            VmEvent::PcpFence => pcps.map(PerCpuPages::fences).fold(n, u64::wrapping_add),
            // Counted by the inboxes that take the frames, under their locks.
            VmEvent::PcpRouted => pcps.map(PerCpuPages::routed).fold(n, u64::wrapping_add),
            // The single order-0 paths count in their caches' words (`pcp::word`).
            // The caches of orders 1 to 3 count theirs in their words too.
            // The slow paths count theirs by zone, in the lists of their zone.
            VmEvent::PgallocNormal => pcps
                .map(|p| p.fast_counts().0.wrapping_add(p.small_counts().0).wrapping_add(p.slow_counts().0))
                .fold(n, u64::wrapping_add),
            VmEvent::Pgfree => pcps
                .map(|p| p.fast_counts().1.wrapping_add(p.small_counts().1).wrapping_add(p.slow_counts().1))
                .fold(n, u64::wrapping_add),
            _ => n,
        }
    }

    /// Frames the fast paths took from `cpu`'s local zone (a hit, and local): its
    /// `local_first` count, and the single allocation's pops, which that path counts in its
    /// cache's word (only the local zone's cache has any).
    pub(super) fn local_first(&self, cpu: usize) -> u64 {
        let nz = self.mem.zones.len();
        self.cpus.pcps[cpu * nz..(cpu + 1) * nz]
            .iter()
            .map(|p| p.fast_counts().0)
            .fold(self.cpus.events[cpu].local_first(), u64::wrapping_add)
    }

    /// Frames the order-0 fast paths (the rseq cache, single and bulk) have handed out, summed
    /// over CPUs: the part of `pgalloc_normal` that took no lock. Read from the per-CPU
    /// `local_first` count those paths keep anyway, so it costs them nothing; 0 where the
    /// fast paths do not run (no rseq, `ZONAL_NO_RSEQ`, lists off).
    pub fn fast_path_allocs(&self) -> u64 {
        (0..self.cpus.nr_cpus).map(|c| self.local_first(c)).fold(0, u64::wrapping_add)
    }

    /// The zone of a frame zonal handed out.
    #[inline]
    fn zone_of(&self, pfn: Pfn) -> &Zone {
        &self.mem.zones[self.mem.block_zone[pfn.0 >> self.mem.max_order.0] as usize]
    }

    #[inline]
    fn pfn_to_ptr(&self, pfn: Pfn) -> NonNull<u8> {
        let addr = self.mem.arena.pfn_to_addr(pfn);
        // The arena never maps address 0, so a frame's address is never null.
        NonNull::new(addr as *mut u8).expect("arena addresses are non-null")
    }

    /// Number of CPUs the per-CPU tables cover.
    pub fn nr_cpus(&self) -> usize {
        self.cpus.nr_cpus
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
        let pfn = self.mem.arena.addr_to_pfn(addr).ok_or(Error::NotOwned { addr })?;
        let zid = self.mem.block_zone[pfn.0 >> self.mem.max_order.0];
        match self.mem.zones.get(zid as usize) {
            Some(zone) if zone.contains(pfn) => Ok((zone, pfn)),
            _ => Err(Error::NotOwned { addr }),
        }
    }

    /// The node a frame of zonal belongs to (`page_to_nid`). Inline, as Linux's: callers
    /// in other crates test it per access (NUMA balancing's penalty emulation does).
    #[inline]
    pub fn page_to_nid(&self, addr: *const u8) -> Result<NodeId> {
        Ok(self.owning_zone(addr as usize)?.0.node)
    }

    /// The frame number of an address zonal owns.
    #[inline]
    pub fn addr_to_pfn(&self, addr: *const u8) -> Result<Pfn> {
        Ok(self.owning_zone(addr as usize)?.1)
    }

    /// The file behind every frame (one memfd for the whole arena), for layers that map
    /// frames elsewhere (NUMA balancing's regions): the frame at `addr` is at
    /// [`Zonal::frame_offset`] in it. Mapping a frame `MAP_SHARED` at another address shows
    /// the same memory; the frame must be allocated and stay so while it is mapped.
    pub fn frame_file(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(self.mem.arena.fd())
    }

    /// The offset in [`Zonal::frame_file`] of the frame at `addr` (any address inside a frame
    /// zonal owns gives that frame's offset).
    pub fn frame_offset(&self, addr: *const u8) -> Result<u64> {
        let (_, pfn) = self.owning_zone(addr as usize)?;
        Ok(self.mem.arena.offset_of(pfn) as u64)
    }

    fn zone(&self, zone: ZoneId) -> Result<&Zone> {
        self.mem.zones.get(zone.0 as usize).ok_or(Error::InvalidZone { zone, nr_zones: self.mem.zones.len() })
    }

    /// `Ok` in the process that built this handle; [`Error::Forked`] in a child made from
    /// it by `fork()`, where the handle has no frames: the arena is not inherited
    /// (`MADV_DONTFORK`, and inaccessible memory mapped over its range in the child), and
    /// every call that would allocate, free, hold, split or move frames (`alloc_pages*`,
    /// `free_pages*`, `split_pages`, `hold`, `free_held`, `unhold`) refuses with this
    /// error before it takes any lock; the calls that return a count (the bulk
    /// allocations, the drains) do nothing and return 0. Reports keep reading the child's
    /// copy of the counters. A child that needs pages builds a handle of its own.
    pub fn check_not_forked(&self) -> Result<()> {
        self.check_forked()
    }

    /// [`Zonal::check_not_forked`] for the general and locked paths: before any lock (a lock
    /// a parent's thread held at the fork stays held in the child). The restartable
    /// sequences need no test: in the child every entry of their table is a locked
    /// stand-in (see `crate::fork`).
    #[inline(always)]
    fn check_forked(&self) -> Result<()> {
        if self.inherited() {
            return Err(self.forked_error());
        }
        Ok(())
    }

    /// Whether this process is a forked child of the one that built the handle, for the
    /// calls that answer with a count (0) rather than an error.
    #[inline(always)]
    fn inherited(&self) -> bool {
        self.mem.arena.fork().forked()
    }

    #[cold]
    #[inline(never)]
    fn forked_error(&self) -> Error {
        Error::Forked { creator: self.mem.arena.fork().creator() }
    }

    /// Names this handle's local table (the restartable sequences' `local_pcp`) to the fork
    /// registry, whose child handler points every entry at [`pcp::rseq::ABSENT_STANDIN`]:
    /// lists that read as locked and whose span holds every frame, so that every allocation
    /// and free section gives way in the child. Called once, at the end of the build.
    pub(super) fn registered_for_fork(mut self) -> Zonal {
        let standin = std::ptr::from_ref(&pcp::rseq::ABSENT_STANDIN) as usize;
        // From the exclusive borrow: the handler writes through this pointer. The table's
        // heap buffer stays in place when the handle moves, until `drop` clears it here.
        let table = &mut self.cpus.local_pcp;
        let (ptr, len) = (table.as_mut_ptr(), table.len());
        self.mem.arena.fork().set_table(ptr, len, standin);
        self
    }
}

impl Drop for Zonal {
    fn drop(&mut self) {
        // Before the table is freed (the fields drop after this).
        self.mem.arena.fork().clear_table();
        if self.mem.arena.fork().forked() {
            // A child's copy: the worker's and the live server's threads were the parent's
            // (joining them would wait forever), and a lock a parent's thread held at the
            // fork stays held; so leave them, and the process-wide policy list, alone.
            if let Ok(mut attached) = self.attached.try_lock() {
                std::mem::forget(attached.take());
            }
            std::mem::forget(self.worker.take());
            return;
        }
        // The server first: its socket must not outlive the handle it answers for.
        self.attached().take();
        self.worker.take();
        mempolicy::forget_handle(self.id);
    }
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Zonal>();
};

#[cfg(all(test, not(loom)))]
mod owner_tests;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::tune::STAT_INTERVAL_MS;
    use super::*;

    /// Every report a published handle serves reads without the locks the allocation paths
    /// take: with every per-CPU list and every zone lock held elsewhere, they all finish.
    #[test]
    fn reports_take_no_allocation_lock() {
        let t = Topology::parse("nodes=2,size=8M").unwrap();
        let z = Arc::new(Zonal::new(Config::new(t)).unwrap());
        let p = z.alloc_pages(Gfp::empty(), 0).unwrap();
        z.free_pages(p.as_ptr(), 0).unwrap();
        let zones: Vec<_> = z.zones().iter().map(|zn| zn.lock()).collect();
        let pcps: Vec<_> = (0..z.nr_cpus())
            .flat_map(|c| z.zones().iter().map(move |zn| (c, zn)))
            .map(|(c, zn)| z.pcp(c, zn.id).lock_lists(zn))
            .collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let z2 = Arc::clone(&z);
        std::thread::spawn(move || {
            let n = z2.zoneinfo().len()
                + z2.buddyinfo().len()
                + z2.buddyinfo_json().len()
                + z2.vmstat().len()
                + z2.prometheus().len()
                + z2.numastat().len()
                + z2.zone_stats_json().len()
                + z2.topology_text().len()
                + z2.nr_pcp_pages(NodeId(0)).unwrap();
            let _ = tx.send(n);
        });
        let r = rx.recv_timeout(Duration::from_secs(30));
        drop(pcps);
        drop(zones);
        assert!(r.is_ok(), "a report waited for a lock the allocation paths take");
    }

    /// Pages allocated and freed are counted by zone on every path (`zone_page_events`):
    /// over the zones they sum to the handle's `pgalloc_normal` and `pgfree`, and what a
    /// path took from or gave to node 1 is counted on node 1's zone, page for page, whatever
    /// the CPU (the rseq fast paths, orders 1 to 3 and 9, the locked path, a virtual CPU's,
    /// the bulk calls).
    #[test]
    fn pages_are_counted_by_zone_on_every_path() {
        let t = Topology::parse("nodes=2,size=8M,vcpus=8,cpus=0-3:4-7").unwrap();
        let z = Zonal::new(Config::new(t)).unwrap();
        let zones = |n: u16| z.node_zones(NodeId(n)).unwrap().to_vec();
        let pages =
            |n: u16| zones(n).iter().map(|&id| z.zone_page_events(id)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        let check_sum = || {
            let all = (0..2).map(pages).fold((0, 0), |a: (u64, u64), b| (a.0 + b.0, a.1 + b.1));
            assert_eq!(all, (z.event(VmEvent::PgallocNormal), z.event(VmEvent::Pgfree)), "zones against the handle");
        };
        for node in [0u16, 1] {
            let (before, other) = (pages(node), pages(1 - node));
            let mut held = Vec::new();
            for order in [0u32, 0, 1, 2, 3, 9, 0, 1] {
                held.push((z.alloc_pages_node(NodeId(node), Gfp::THISNODE, order).unwrap(), order));
            }
            let acting = z.act_as_cpu(7).unwrap();
            for order in [0u32, 3] {
                held.push((acting.alloc_pages_node(NodeId(node), Gfp::THISNODE, order).unwrap(), order));
            }
            let want: u64 = held.iter().map(|&(_, o)| 1u64 << o).sum();
            assert_eq!(pages(node).0 - before.0, want, "node {node}: pages allocated");
            check_sum();
            for (i, &(p, o)) in held.iter().enumerate() {
                match i % 3 {
                    0 => acting.free_pages(p.as_ptr(), o).unwrap(),
                    1 => {
                        z.hold(p.as_ptr(), o).unwrap();
                        // SAFETY: this test holds the block, once, and frees it once.
                        unsafe { z.free_held(p.as_ptr(), o) }.unwrap()
                    }
                    _ => z.free_pages(p.as_ptr(), o).unwrap(),
                }
            }
            assert_eq!(pages(node).1 - before.1, want, "node {node}: pages freed");
            assert_eq!(pages(1 - node), other, "node {node}'s traffic counted on node {}", 1 - node);
            check_sum();
        }
        // The bulk calls: by the zone each page came from, as many as they moved.
        let before = [pages(0), pages(1)];
        let mut list = Vec::new();
        let got = z.alloc_pages_bulk_list(Gfp::KERNEL, 300, &mut list);
        let on = |n: u16| list.iter().filter(|p| z.page_to_nid(p.as_ptr()) == Ok(NodeId(n))).count() as u64;
        assert_eq!(got, 300);
        assert_eq!([pages(0).0 - before[0].0, pages(1).0 - before[1].0], [on(0), on(1)]);
        check_sum();
        assert_eq!(z.free_pages_bulk(&list), Ok(300));
        assert_eq!([pages(0).1 - before[0].1, pages(1).1 - before[1].1], [on(0), on(1)]);
        check_sum();
        z.check_invariants().unwrap();
    }

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
        let zone = &z.mem.zones[0];
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
        if !runs_rseq(&z) {
            return;
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                let rseq = z.rseq_off().unwrap();
                // One CPU for the whole test, so every section sees the same cache.
                sys::set_affinity(sys::current_cpu()).unwrap();
                let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
                let (zone, pfn) = z.addr_to_zone(p.as_ptr() as usize, Order(0)).unwrap();
                zone.state(pfn).store(mem_map::state(mem_map::PCP, Order(0)), Ordering::Relaxed);
                for _ in 0..2 {
                    // A push fails only when preempted mid-section or at the cache's bound,
                    // which a single earlier allocation leaves far away.
                    // SAFETY: this thread's rseq area, the handle's lists and one of its zones.
                    let push = || unsafe { pcp::rseq::push_many(&z.rseq_table(rseq), zone.id.0 as usize, &[pfn.0]) };
                    assert!((0..1000).any(|_| push() == 1));
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
        assert_eq!(z.nr_free_pages(NodeId(0)).unwrap(), z.mem.zones[0].managed);
    }

    /// Runs `f` on a thread pinned to the CPU it starts on, so that every section and lock
    /// of `f` finds one CPU's lists.
    fn on_one_cpu(f: impl FnOnce() + Send) {
        std::thread::scope(|s| {
            s.spawn(|| {
                sys::set_affinity(sys::current_cpu()).unwrap();
                f();
            });
        });
    }

    /// Builds a handle on the topology `spec` and runs `f` on a thread pinned to the CPU it
    /// starts on, with that CPU's lists of its local zone; returns the handle, or `None`
    /// (having run nothing) where the rseq paths legitimately do not run (`runs_rseq`).
    fn on_local_lists(spec: &str, f: impl FnOnce(&Zonal, &PerCpuPages) + Send) -> Option<Zonal> {
        let z = Zonal::new(Config::new(Topology::parse(spec).unwrap())).unwrap();
        if !runs_rseq(&z) {
            return None;
        }
        on_one_cpu(|| {
            let cpu = z.current_cpu();
            f(&z, &z.cpus.pcps[cpu * z.mem.zones.len() + z.cpus.local_zone[cpu] as usize]);
        });
        Some(z)
    }

    /// Whether `z` runs the rseq fast paths. Skips (with a word on stderr) only where rseq is
    /// legitimately absent; anywhere else a handle without its rseq area is a failure.
    fn runs_rseq(z: &Zonal) -> bool {
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
            assert!(z.rseq_off().is_none(), "{why}, yet the handle runs the rseq path");
            eprintln!("SKIPPED: {why}: the order-0 cache is off, nothing to test");
            return false;
        }
        assert!(z.rseq_off().is_some(), "rseq and membarrier are available, but the handle does not use them");
        true
    }

    /// A stream of allocations with no frees takes the lock once per refill of the cache,
    /// not once per `CACHE_FILL` frames: an allocation's holder moves up to `CACHE_REFILL`
    /// frames into the cache (`PcpGuard::fill_for_allocations`), while a free's moves
    /// `CACHE_FILL`, and every frame stays accounted for.
    #[test]
    fn an_allocation_stream_refills_the_cache_by_half() {
        let Some(z) = on_local_lists("nodes=1,size=256M", |z, pcp| {
            let n = 4096;
            let fast = z.fast_path_allocs();
            let held: Vec<_> = (0..n).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
            let locked = n - (z.fast_path_allocs() - fast) as usize;
            // With `CACHE_FILL` per lock it would be one in 33 (124 here).
            assert!(locked * 64 <= n, "{locked} of {n} allocations took the lock");
            assert!(pcp.cache_len() <= pcp::CACHE_CAP / 2);
            // The frees fill the cache to its bound and drain past `high`.
            for p in &held {
                z.free_pages(p.as_ptr(), 0).unwrap();
            }
            assert!(z.event(VmEvent::PcpDrain) > 0);
            assert_eq!(z.check_invariants(), Ok(0));
        }) else {
            return;
        };
        z.drain_all_pages();
        assert_eq!(z.nr_free_pages(NodeId(0)).unwrap(), z.mem.zones[0].managed);
    }

    /// A drain of a quiescent handle leaves nothing behind, even while a housekeeping pass
    /// holds lists whose frames are in their cache alone. The pass moves them into the
    /// lists and writes the lists' count only as it unlocks, so their hint reads empty
    /// meanwhile (checked here); a drain that trusted it would skip them and leave the
    /// frames on the lists (the stress tests' checkpoints saw that under load). The drain
    /// waits the pass out instead: the pass below gives it 200 ms to finish first, which a
    /// skipping drain takes a few microseconds of.
    #[test]
    fn a_drain_waits_out_a_pass_that_holds_the_cache() {
        on_local_lists("nodes=1,size=16M", |z, pcp| {
            let zone = &z.mem.zones[z.cpus.local_zone[pcp.cpu()] as usize];
            let node = zone.node;
            // Frames in the cache alone: a drain, then frees, which the sections take.
            let held: Vec<_> = (0..8).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
            z.drain_all_pages();
            for p in &held {
                z.free_pages(p.as_ptr(), 0).unwrap();
            }
            assert_eq!((pcp.cache_frames(), z.nr_pcp_pages(node)), (8, Ok(8)));
            let (inside_tx, inside_rx) = std::sync::mpsc::channel();
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            std::thread::scope(|s| {
                s.spawn(move || {
                    let _pass = z.pass();
                    pcp.lock(zone).with(|_| {
                        assert!(pcp.looks_empty(), "the hint reads empty while the pass holds the frames");
                        inside_tx.send(()).unwrap();
                        let _ = done_rx.recv_timeout(Duration::from_millis(200));
                    });
                });
                inside_rx.recv().unwrap();
                let drained = z.drain_all_pages();
                let _ = done_tx.send(());
                assert_eq!(drained, 8, "the drain skipped the lists the pass held");
            });
            assert_eq!(z.nr_pcp_pages(node), Ok(0));
            assert_eq!(z.check_invariants(), Ok(0));
        });
    }

    /// Frames freed past `high` wait on the zone's transfer list, counted as per-CPU pages;
    /// the refills of the allocations after them take them back from it; `drain_all_pages`
    /// returns what is left to the buddy. Every frame is accounted for throughout.
    #[test]
    fn frees_past_high_wait_on_the_transfer_list() {
        let z = Zonal::new(Config::new(Topology::parse("nodes=1,size=16M").unwrap())).unwrap();
        on_one_cpu(|| {
            // One CPU's lists throughout.
            let node = NodeId(0);
            let transfer = || z.zone_stats()[0].transfer;
            let managed = z.zones()[0].managed;
            let accounted = || z.nr_free_pages(node).unwrap() + z.nr_pcp_pages(node).unwrap();
            let held: Vec<_> = (0..1000).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
            for p in &held {
                z.free_pages(p.as_ptr(), 0).unwrap();
            }
            let moved = transfer();
            assert!(moved > 0 && z.event(VmEvent::PcpDrain) > 0, "frees past high went to the transfer list");
            assert!(moved <= z.zones()[0].watermark(Watermark::Low));
            let zoneinfo = crate::report::parse_zoneinfo(&z.zoneinfo());
            assert!(zoneinfo[0].fields.contains(&("transfer".to_string(), moved as u64)), "zoneinfo prints it");
            assert_eq!(accounted(), managed);
            assert_eq!(z.check_invariants(), Ok(0));

            let held: Vec<_> = (0..1000).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
            assert!(transfer() < moved, "the refills took frames back from it");
            assert_eq!(accounted(), managed - 1000);
            for p in &held {
                z.free_pages(p.as_ptr(), 0).unwrap();
            }
            assert!(transfer() > 0);
            assert!(z.drain_all_pages() > 0);
            assert_eq!((transfer(), z.nr_free_pages(node).unwrap()), (0, managed));
            assert_eq!(z.check_invariants(), Ok(0));
        });
    }

    /// The single order-0 paths count in their cache's word: when a count reaches its
    /// guard bit, its section gives way, the locked path that runs instead folds both counts
    /// out of the word, and the sections count on from zero; `pgalloc` and `pgfree` miss no
    /// frame and count none twice throughout.
    #[test]
    fn fast_counts_fold_at_their_guard() {
        on_local_lists("nodes=1,size=16M", |z, pcp| {
            let pair = || {
                let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
                z.free_pages(p.as_ptr(), 0).unwrap();
            };
            pair();
            let counts = || (z.event(VmEvent::PgallocNormal), z.event(VmEvent::Pgfree), z.fast_path_allocs());
            // Three pairs below each guard (bit 23 of a 24-bit count).
            // (Setting the counts adds what they gain to the totals.)
            let near = (1 << 23) - 3;
            let (pops, pushes) = pcp.word_counts();
            let before = counts();
            pcp.set_word_counts(near, near);
            let fast_before = pcp.fast_counts();
            for _ in 0..10 {
                pair();
            }
            let after = counts();
            assert_eq!(after.0, before.0 + (near - pops) + 10, "pgalloc");
            assert_eq!(after.1, before.1 + (near - pushes) + 10, "pgfree");
            // The allocation that found its count at the guard took the locked path (unless
            // the worker's fold came first).
            let slow = (before.2 + (near - pops) + 10).checked_sub(after.2);
            assert!(matches!(slow, Some(0 | 1)), "fast-path allocations: {} slow", slow.map_or(-1, |s| s as i64));
            let (pops, pushes) = pcp.word_counts();
            assert!(pops < 10 && pushes < 10, "the counts were folded out of the word: {pops}, {pushes}");
            let fast = pcp.fast_counts();
            assert!(fast.0 > fast_before.0 && fast.1 > fast_before.1, "the sections count on after the fold");
            assert_eq!(z.check_invariants(), Ok(0));
        });
    }

    /// The order-0 fast paths find this CPU's lists of its local zone from the CPU alone: a
    /// local frame goes onto them and comes back from them; a frame of the other node freed
    /// here goes onto this CPU's lists of that zone; and while the local zone is at `low`
    /// the section pops nothing (its `above_low` flag is clear), nothing is counted, and the
    /// allocation moves on to the other node as the general path decides.
    #[test]
    fn fast_paths_use_the_local_lists_and_leave_the_cache_below_low() {
        let t = Topology::parse("nodes=2,size=4M,cpus=0:1").unwrap();
        let z = Zonal::new(Config::new(t)).unwrap();
        if !runs_rseq(&z) {
            return;
        }
        // One CPU for the whole test, so every section sees the same lists.
        on_one_cpu(|| {
            let local = z.local_node();
            let other = NodeId(1 - local.0);
            let pcp = |n: NodeId| z.nr_pcp_pages(n).unwrap();
            let frees = || z.event(VmEvent::Pgfree);

            // A local frame: onto the local lists, and the next allocation's.
            let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
            assert_eq!(z.page_to_nid(p.as_ptr()), Ok(local));
            let (before, freed) = (pcp(local), frees());
            z.free_pages(p.as_ptr(), 0).unwrap();
            assert_eq!((pcp(local), frees()), (before + 1, freed + 1));
            assert_eq!(z.alloc_pages(Gfp::KERNEL, 0).unwrap(), p, "the top of the local cache");

            // A frame of the other node: onto this CPU's lists of its zone.
            let q = z.alloc_pages_node(other, Gfp::THISNODE, 0).unwrap();
            let (before, before_local) = (pcp(other), pcp(local));
            z.free_pages(q.as_ptr(), 0).unwrap();
            assert_eq!((pcp(other), pcp(local)), (before + 1, before_local));
            assert_eq!(z.alloc_pages_node(other, Gfp::THISNODE, 0).unwrap(), q);

            // The local zone down to `low` in the buddy, one frame back on the cache.
            let low = z.mem.zones[z.cpus.local_zone[z.current_cpu()] as usize].watermark(Watermark::Low);
            let mut held = vec![p, q];
            while z.nr_free_pages(local).unwrap() > low {
                held.push(z.alloc_pages_node(local, Gfp::THISNODE, 0).unwrap());
            }
            let r = held.pop().unwrap();
            z.free_pages(r.as_ptr(), 0).unwrap();
            let (cached, freed, fast) = (pcp(local), frees(), z.fast_path_allocs());
            let got = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
            assert_eq!(z.page_to_nid(got.as_ptr()), Ok(other), "the local zone is at low: the first pass moves on");
            assert_eq!(pcp(local), cached, "the cached frame stayed on the cache");
            assert_eq!((frees(), z.fast_path_allocs()), (freed, fast), "and nothing was counted");
            held.push(got);
            for p in held {
                z.free_pages(p.as_ptr(), 0).unwrap();
            }
        });
        z.drain_all_pages();
        assert_eq!(z.check_invariants(), Ok(0));
        for n in [NodeId(0), NodeId(1)] {
            assert_eq!(z.nr_free_pages(n).unwrap(), z.mem.zones[n.0 as usize].managed);
        }
    }

    /// The caches of orders 1 to 3: after one block of an order went through the locked
    /// path (which fills its cache), pairs of that order run through the cache's sections
    /// alone (each counted in the cache's word, so the words' counts grow by exactly the
    /// pairs' frames), the cache's length is where it was, the events count pages, and every
    /// frame is accounted for, with blocks in the caches and after a drain.
    #[test]
    fn small_orders_run_through_their_caches() {
        let Some(z) = on_local_lists("nodes=1,size=64M", |z, pcp| {
            for order in 1..=pcp::PCP_MAX_ORDER {
                let p = z.alloc_pages(Gfp::KERNEL, order as u32).unwrap();
                z.free_pages(p.as_ptr(), order as u32).unwrap();
                let len = pcp.small_cache_len(Order(order));
                assert!(len > 0, "the locked path filled the order-{order} cache");
                let (counted, events) =
                    (pcp.small_counts(), (z.event(VmEvent::PgallocNormal), z.event(VmEvent::Pgfree)));
                let pairs = 1000u64;
                for _ in 0..pairs {
                    let p = z.alloc_pages(Gfp::KERNEL, order as u32).unwrap();
                    assert_eq!(
                        z.addr_to_pfn(p.as_ptr()).unwrap().0 % (1 << order),
                        0,
                        "a block of order {order} is aligned"
                    );
                    z.free_pages(p.as_ptr(), order as u32).unwrap();
                }
                let frames = pairs << order;
                let now = pcp.small_counts();
                assert_eq!(
                    (now.0 - counted.0, now.1 - counted.1),
                    (frames, frames),
                    "order {order}: every pair took the sections"
                );
                assert_eq!(z.event(VmEvent::PgallocNormal) - events.0, frames);
                assert_eq!(z.event(VmEvent::Pgfree) - events.1, frames);
                assert_eq!(pcp.small_cache_len(Order(order)), len);
                assert_eq!(z.check_invariants(), Ok(0));
            }
            // Many blocks out and back: the caches stay within their bounds, and `count` with
            // every cache's frames within `high + batch` (`check_invariants` checks both).
            let held: Vec<_> = (0..300).map(|i| (z.alloc_pages(Gfp::KERNEL, 1 + i % 3).unwrap(), 1 + i % 3)).collect();
            assert_eq!(z.check_invariants(), Ok(held.iter().map(|&(_, o)| 1usize << o).sum()));
            for &(p, o) in held.iter().rev() {
                z.free_pages(p.as_ptr(), o).unwrap();
            }
            assert_eq!(z.check_invariants(), Ok(0));
            assert!((1..=3).any(|o| pcp.small_cache_len(Order(o)) > 0));
        }) else {
            return;
        };
        drains_whole(&z);
    }

    /// Drains every CPU's lists of a one-node handle and checks that every frame is back in
    /// the buddy.
    fn drains_whole(z: &Zonal) {
        z.drain_all_pages();
        assert_eq!(z.check_invariants(), Ok(0));
        assert_eq!(z.nr_free_pages(NodeId(0)).unwrap(), z.mem.zones[0].managed);
    }

    /// The THP cache: after one block went through the locked path (which fills the cache
    /// with what the THP list keeps), pairs of the pageblock order run through its sections
    /// alone (counted in its word: `pgalloc` and `pgfree` grow by exactly the pairs'
    /// frames), and the list and the cache keep within the list's bound together. Below the
    /// zone's high watermark nothing stays on either, and a drain empties both.
    #[test]
    fn the_pageblock_order_runs_through_its_cache() {
        let thp = PCP_THP_ORDER.0 as u32;
        let Some(z) = on_local_lists("nodes=1,size=64M", |z, pcp| {
            let p = z.alloc_pages(Gfp::KERNEL, thp).unwrap();
            z.free_pages(p.as_ptr(), thp).unwrap();
            let len = pcp.thp_cache_len();
            assert!(len > 0, "the locked path filled the THP cache");
            let (counted, events) = (pcp.small_counts(), (z.event(VmEvent::PgallocNormal), z.event(VmEvent::Pgfree)));
            let pairs = 200u64;
            for _ in 0..pairs {
                let p = z.alloc_pages(Gfp::KERNEL, thp).unwrap();
                assert_eq!(z.addr_to_pfn(p.as_ptr()).unwrap().0 % (1 << thp), 0, "a pageblock is aligned");
                z.free_pages(p.as_ptr(), thp).unwrap();
            }
            let frames = pairs << thp;
            let now = pcp.small_counts();
            assert_eq!((now.0 - counted.0, now.1 - counted.1), (frames, frames), "every pair took the sections");
            assert_eq!(z.event(VmEvent::PgallocNormal) - events.0, frames);
            assert_eq!(z.event(VmEvent::Pgfree) - events.1, frames);
            assert_eq!(pcp.thp_cache_len(), len);
            assert_eq!(z.check_invariants(), Ok(0), "the cache's frames are counted as on the lists");
            // The block freed last sits on top of the cache: `check_invariants` reads its tag.
            let p = z.alloc_pages(Gfp::KERNEL, thp).unwrap();
            z.free_pages(p.as_ptr(), thp).unwrap();
            let state = z.mem.zones[0].state(z.addr_to_pfn(p.as_ptr()).unwrap());
            let tag = state.swap(mem_map::state(ALLOCATED, PCP_THP_ORDER), Ordering::Relaxed);
            let err = z.check_invariants().expect_err("a cached block tagged allocated");
            assert!(err.contains("order-9 cache block"), "{err}");
            state.store(tag, Ordering::Relaxed);
            assert_eq!(z.check_invariants(), Ok(0));
            // More blocks out than list and cache hold: back, they keep to the bound (checked
            // by `check_invariants`) and the rest returns to the buddy.
            let held: Vec<_> = (0..5).map(|_| z.alloc_pages(Gfp::KERNEL, thp).unwrap()).collect();
            assert_eq!(z.check_invariants(), Ok(5 << thp));
            for p in held {
                z.free_pages(p.as_ptr(), thp).unwrap();
            }
            assert_eq!(z.check_invariants(), Ok(0));
            assert!(pcp.thp_pages() > 0 && pcp.thp_pages() <= pcp::PCP_THP_HIGH << thp);
            // Below the high watermark (raised past what is left free) and above `low` by a
            // block: blocks still come, but none stays on the list or its cache when freed.
            // Four blocks below, so that the last refill's holder saw the zone below `high`
            // through the folded count's drift.
            z.set_watermark_scale_factor(3000).unwrap();
            let zone = &z.mem.zones[0];
            let mut held = Vec::new();
            while zone.nr_free_exact() + (4 << thp) >= zone.watermark(Watermark::High) {
                held.push(z.alloc_pages(Gfp::KERNEL, thp).unwrap());
            }
            assert!(zone.nr_free_exact() > zone.watermark(Watermark::Low) + (1 << thp), "still above low");
            for _ in 0..3 {
                let p = z.alloc_pages(Gfp::KERNEL, thp).unwrap();
                z.free_pages(p.as_ptr(), thp).unwrap();
                assert_eq!(pcp.thp_pages(), 0, "no block kept below the high watermark");
            }
            for p in held {
                z.free_pages(p.as_ptr(), thp).unwrap();
            }
            assert_eq!(z.check_invariants(), Ok(0));
            z.set_watermark_scale_factor(10).unwrap();
            let p = z.alloc_pages(Gfp::KERNEL, thp).unwrap();
            z.free_pages(p.as_ptr(), thp).unwrap();
            assert!(pcp.thp_cache_len() > 0, "above high again, the locked path fills the cache");
        }) else {
            return;
        };
        drains_whole(&z);
    }

    /// A holder of a CPU's THP list running on another CPU fences that CPU before it touches
    /// an open THP cache (sections there may be committing to it), and needs no fence for a
    /// shut one (empty, bound 0: no section can commit); its work then opens the cache.
    #[test]
    fn a_remote_thp_holder_fences_an_open_cache_only() {
        if sys::nr_cpus_online() < 2 {
            eprintln!("SKIPPED: one CPU, no remote holder to make");
            return;
        }
        on_local_lists("nodes=1,size=64M", |z, pcp| {
            let zone = &z.mem.zones[z.cpus.local_zone[z.current_cpu()] as usize];
            let other = (pcp.cpu() + 1) % 2;
            std::thread::scope(|s| {
                s.spawn(|| {
                    sys::set_affinity(other as u32).unwrap();
                    let before = pcp.fences();
                    let mut g = pcp.try_lock_thp(zone).expect("no other holder");
                    assert_eq!(pcp.fences(), before, "a shut THP cache needs no fence");
                    g.with_thp(|_| ());
                    drop(g);
                    let mut g = pcp.try_lock_thp(zone).expect("no other holder");
                    assert!(pcp.fences() > before, "the holder opened the cache: the next one fences");
                    g.with_thp(|_| ());
                });
            });
            // The lists' own CPU needs no fence, open cache or not.
            let p = z.alloc_pages(Gfp::KERNEL, PCP_THP_ORDER.0 as u32).unwrap();
            z.free_pages(p.as_ptr(), PCP_THP_ORDER.0 as u32).unwrap();
            let before = pcp.fences();
            let mut g = pcp.try_lock_thp(zone).expect("no other holder");
            g.with_thp(|_| ());
            drop(g);
            assert_eq!(pcp.fences(), before);
            assert!(pcp.thp_cache_len() > 0);
            assert_eq!(z.check_invariants(), Ok(0));
        });
    }

    /// The section of the caches of orders 1 to 3 asks the lists' gate (the zone's level)
    /// for `ABOVE_LOW_SMALL`, the THP cache's for `ABOVE_LOW_THP`: at the level below each
    /// gives way; at the order-0 level alone the small orders' gives way, so the general path
    /// decides (and here, with the zone in fact far above `low`, allocates through the lock),
    /// and the block comes from the cache again once the level is back; the order-0 section
    /// pops at that level, not at 0.
    #[test]
    fn the_small_orders_section_asks_for_every_order_above_low() {
        on_local_lists("nodes=1,size=64M", |z, pcp| {
            let p = z.alloc_pages(Gfp::KERNEL, 2).unwrap();
            z.free_pages(p.as_ptr(), 2).unwrap();
            // A frame on the order-0 cache too (the fast free pushes it there).
            let q = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
            z.free_pages(q.as_ptr(), 0).unwrap();
            // And a block on the THP cache.
            let t = z.alloc_pages(Gfp::KERNEL, 9).unwrap();
            z.free_pages(t.as_ptr(), 9).unwrap();
            assert_eq!(z.mem.zones[0].above_low().load(Ordering::Relaxed), zone::ABOVE_LOW_THP);
            assert_eq!(pcp.gate(), zone::ABOVE_LOW_THP, "the zone copied its level into the gate");
            assert!(pcp.small_cache_len(Order(2)) > 0 && pcp.thp_cache_len() > 0);
            // No zone-lock holder flips the level meanwhile: the gate stays as set.
            pcp.set_gate(zone::ABOVE_LOW_SMALL);
            assert!(z.alloc_thp_fast().is_none(), "the THP section gives way below ABOVE_LOW_THP");
            let p = z.alloc_small_fast(2).expect("orders up to 3 pass at their level");
            z.free_pages(p.as_ptr(), 2).unwrap();
            pcp.set_gate(zone::ABOVE_LOW_ORDER0);
            assert!(z.alloc_small_fast(2).is_none(), "the section gives way below ABOVE_LOW_SMALL");
            let q = z.alloc_order0_fast(None).expect("order 0 passes at its level");
            z.free_pages(q.as_ptr(), 0).unwrap();
            let counted = pcp.small_counts().0;
            let p = z.alloc_pages(Gfp::KERNEL, 2).unwrap();
            assert_eq!(pcp.small_counts().0, counted, "the general path allocated");
            pcp.set_gate(0);
            assert!(z.alloc_order0_fast(None).is_none(), "order 0 gives way at level 0");
            let err = z.check_invariants().expect_err("a gate apart from its zone's level");
            assert!(format!("{err:?}").contains("gate 0 but above_low 3"), "{err:?}");
            pcp.set_gate(zone::ABOVE_LOW_THP);
            z.free_pages(p.as_ptr(), 2).unwrap();
            let p = z.alloc_small_fast(2).expect("the section pops again");
            z.free_pages(p.as_ptr(), 2).unwrap();
            let t = z.alloc_thp_fast().expect("the THP section pops again");
            z.free_pages(t.as_ptr(), 9).unwrap();
            assert_eq!(z.check_invariants(), Ok(0));
        });
    }

    /// A stream that mixes orders keeps each small order's cache: the lock one order's
    /// cache takes when it runs dry (or an order-0 refill) leaves the other orders' caches in
    /// place, so each order still takes most of its blocks through its section.
    #[test]
    fn mixed_orders_keep_each_others_caches() {
        on_local_lists("nodes=1,size=256M", |z, pcp| {
            let mut held = Vec::new();
            let (mut fast, mut all) = ([0u64; 4], [0u64; 4]);
            for i in 0..600 {
                for order in [1u32, 3, 0] {
                    if order == 3 && i % 3 != 0 {
                        continue;
                    }
                    let before = pcp.small_counts().0;
                    held.push((z.alloc_pages(Gfp::KERNEL, order).unwrap(), order));
                    all[order as usize] += 1;
                    if pcp.small_counts().0 != before {
                        fast[order as usize] += 1;
                    }
                }
            }
            eprintln!("through the sections: order 1 {} of {}, order 3 {} of {}", fast[1], all[1], fast[3], all[3]);
            // Order 1 refills 2-7 blocks a lock here; emptied by every other order's lock it
            // would take about half of its blocks through the lock.
            assert!(fast[1] * 4 >= all[1] * 3, "order 1: {} of {}", fast[1], all[1]);
            assert!(fast[3] > 0);
            for (p, o) in held {
                z.free_pages(p.as_ptr(), o).unwrap();
            }
            assert_eq!(z.check_invariants(), Ok(0));
        });
    }

    /// A block the small section pops whose tag is no longer `PCP` (the second copy two
    /// racing frees left, built here by hand: the top block's tag set to allocated, as if
    /// its other copy had been popped) is dropped, and its count taken back: `pgalloc`
    /// grows by the one block handed out, by the general path.
    #[test]
    fn a_dropped_small_copy_is_not_counted() {
        on_local_lists("nodes=1,size=64M", |z, pcp| {
            let order = Order(1);
            let p = z.alloc_pages(Gfp::KERNEL, 1).unwrap();
            z.free_pages(p.as_ptr(), 1).unwrap();
            let top = pcp.small_cache_top(order).expect("the locked path filled the cache");
            let zone = &z.mem.zones[0];
            zone.state(top).store(mem_map::state(ALLOCATED, order), Ordering::Relaxed);
            let before = z.event(VmEvent::PgallocNormal);
            assert!(z.alloc_small_fast(order.0 as u32).is_none(), "the copy is dropped");
            assert_ne!(pcp.small_cache_top(order), Some(top), "and gone from the cache");
            assert_eq!(z.event(VmEvent::PgallocNormal), before, "nothing counted for it");
            let q = z.alloc_pages(Gfp::KERNEL, 1).unwrap();
            assert_eq!(z.event(VmEvent::PgallocNormal), before + 2);
            // The block the test tagged is the caller's now (its "other copy"): free both.
            z.free_pages(q.as_ptr(), 1).unwrap();
            z.free_pages(z.pfn_to_ptr(top).as_ptr(), 1).unwrap();
            assert_eq!(z.check_invariants(), Ok(0));
        });
    }

    /// A bad free of orders 1 to 3 on the fast path changes nothing and says why, as the
    /// locked path does (the same error): a double free, a free of the wrong order, an
    /// unaligned or interior address; the block is then freed as it should be.
    #[test]
    fn bad_small_order_frees_are_refused() {
        let z = Zonal::new(Config::new(Topology::parse("nodes=1,size=64M").unwrap())).unwrap();
        let refused = |addr: *mut u8, order: u32| {
            let fast = z.free_pages(addr, order).expect_err("a bad free");
            let locked = z.free_pages_locked(addr, order).expect_err("a bad free");
            assert_eq!(format!("{fast:?}"), format!("{locked:?}"));
            fast
        };
        on_one_cpu(|| {
            // A block of order 1 whose frame is not 4-aligned: freed as order 2 it is
            // misaligned; one that is: the wrong order.
            let held: Vec<_> = (0..4).map(|_| z.alloc_pages(Gfp::KERNEL, 1).unwrap().as_ptr()).collect();
            for &p in &held {
                let e = refused(p, 2);
                if z.addr_to_pfn(p).unwrap().0 % 4 == 0 {
                    assert!(matches!(e, Error::OrderMismatch { .. }), "{e:?}");
                } else {
                    assert!(matches!(e, Error::Misaligned { .. }), "{e:?}");
                }
                assert!(matches!(refused(p, 0), Error::OrderMismatch { .. }));
                // SAFETY: one frame and one byte into a two-frame block zonal handed out.
                let (second, byte) = unsafe { (p.add(PAGE_SIZE), p.add(8)) };
                assert!(matches!(refused(second, 1), Error::Misaligned { .. }));
                assert!(matches!(refused(second, 0), Error::InteriorFrame { .. }));
                assert!(matches!(refused(byte, 1), Error::Misaligned { .. }));
            }
            assert_eq!(z.check_invariants(), Ok(8));
            for &p in &held {
                z.free_pages(p, 1).unwrap();
                assert!(matches!(refused(p, 1), Error::DoubleFree { .. }));
            }
            assert_eq!(z.check_invariants(), Ok(0));
        });
    }

    /// With a largest order below 3, the orders 1 to 3 and 9 the restartable sequences serve
    /// are refused above it, allocated and freed alike, as the general path refuses them: the
    /// fast paths run before the order's check, and give way for want of such blocks.
    #[test]
    fn small_orders_above_max_order_are_refused() {
        let z = Zonal::new(Config::new(Topology::parse("nodes=1,size=16M").unwrap()).max_order(1)).unwrap();
        on_one_cpu(|| {
            let p = z.alloc_pages(Gfp::KERNEL, 1).unwrap();
            for order in [2, 3, 9] {
                let e = z.alloc_pages(Gfp::KERNEL, order).expect_err("above max_order");
                assert!(matches!(e, Error::InvalidOrder { order: o, .. } if o == order), "{e:?}");
                let e = z.free_pages(p.as_ptr(), order).expect_err("above max_order");
                assert!(matches!(e, Error::InvalidOrder { order: o, .. } if o == order), "{e:?}");
            }
            z.free_pages(p.as_ptr(), 1).unwrap();
            assert_eq!(z.check_invariants(), Ok(0));
        });
    }
}
