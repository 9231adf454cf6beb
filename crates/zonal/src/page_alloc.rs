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
use crate::sync::{AtomicU64, Ordering};
use crate::sys;
use crate::topology::Topology;
use crate::types::{CpuId, NodeId, Order, Pfn, ZoneId, PAGE_SHIFT, PAGE_SIZE};
use crate::zone::{self, Watermark, Zone};
use crate::zonelist::{self, Zonelists};
use std::ptr::NonNull;

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
    zones: Vec<Zone>,
    node_zones: Vec<Vec<ZoneId>>,
    zonelists: Vec<Zonelists>,
    /// Zone of each largest-order block of the arena (`u16::MAX`: a gap).
    block_zone: Vec<u16>,
    max_order: Order,
    min_free_kbytes: AtomicU64,
    watermark_scale_factor: AtomicU64,
    lowmem_pages: usize,
    arena: Arena,
}

/// No zone in this block (a gap between nodes).
const NO_ZONE: u16 = u16::MAX;

/// What one allocation looks for (Linux's `struct alloc_context` plus the alloc flags).
struct AllocContext<'a> {
    zonelist: &'a [ZoneId],
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
        for (nid, mem) in arena.nodes().iter().enumerate() {
            let id = ZoneId(zones.len() as u16);
            let z = Zone::new(id, NodeId(nid as u16), mem.start_pfn, mem.nr_pages, max_order);
            let first = mem.start_pfn.0 >> max_order.0;
            let last = (mem.start_pfn.0 + mem.nr_pages - 1) >> max_order.0;
            block_zone[first..=last].fill(id.0);
            zones.push(z);
            node_zones.push(vec![id]);
        }
        let zonelists = zonelist::build_zonelists(&topo, &node_zones);
        let lowmem_pages = zones.iter().map(|z| z.managed).sum();
        let min_free = config.min_free_kbytes.unwrap_or_else(|| zone::default_min_free_kbytes(lowmem_pages));
        let z = Zonal {
            id: NEXT_HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            topo,
            zones,
            node_zones,
            zonelists,
            block_zone,
            max_order,
            min_free_kbytes: AtomicU64::new(min_free),
            watermark_scale_factor: AtomicU64::new(config.watermark_scale_factor as u64),
            lowmem_pages,
            arena,
        };
        z.setup_per_zone_wmarks();
        Ok(z)
    }

    /// Recomputes every zone's watermarks from `min_free_kbytes` and `watermark_scale_factor`.
    fn setup_per_zone_wmarks(&self) {
        let mfk = self.min_free_kbytes.load(Ordering::Relaxed);
        let wsf = self.watermark_scale_factor.load(Ordering::Relaxed) as u32;
        for z in &self.zones {
            z.setup_watermarks(mfk, self.lowmem_pages, wsf);
        }
    }

    /// Sets `min_free_kbytes` and recomputes the watermarks. Rejects 0 and values that would
    /// reserve more than the memory there is, keeping the old value.
    pub fn set_min_free_kbytes(&self, kb: u64) -> Result<()> {
        let total_kb = (self.lowmem_pages as u64) << (PAGE_SHIFT - 10);
        if kb == 0 || kb > total_kb {
            return Err(Error::InvalidConfig(format!("min_free_kbytes {kb}: must be 1..={total_kb}")));
        }
        self.min_free_kbytes.store(kb, Ordering::Relaxed);
        self.setup_per_zone_wmarks();
        Ok(())
    }

    /// Sets `watermark_scale_factor` (1..=3000) and recomputes the watermarks.
    pub fn set_watermark_scale_factor(&self, wsf: u32) -> Result<()> {
        if !(1..=zone::MAX_WATERMARK_SCALE_FACTOR).contains(&wsf) {
            return Err(Error::InvalidConfig(format!(
                "watermark_scale_factor {wsf}: must be 1..={}",
                zone::MAX_WATERMARK_SCALE_FACTOR
            )));
        }
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

    /// The node of the CPU this thread runs on (`numa_node_id`).
    #[inline]
    pub fn local_node(&self) -> NodeId {
        self.topo.cpu_to_node(CpuId(sys::current_cpu()))
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

    /// Allocates a block of 2^order frames under this thread's memory policy (local node by
    /// default).
    #[inline]
    pub fn alloc_pages(&self, gfp: Gfp, order: u32) -> Result<NonNull<u8>> {
        let order = self.check_order(order)?;
        let local = self.local_node();
        mempolicy::with_thread_policy(self.id, local, |r| self.alloc_resolved(gfp, order, r))
    }

    /// Allocates a block preferring node `nid` (`alloc_pages_node`); with [`Gfp::THISNODE`]
    /// only from that node.
    #[inline]
    pub fn alloc_pages_node(&self, nid: NodeId, gfp: Gfp, order: u32) -> Result<NonNull<u8>> {
        let order = self.check_order(order)?;
        self.check_node(nid)?;
        self.alloc_resolved(gfp, order, Resolved::Node(nid))
    }

    /// Allocates a block under `policy` for this call only. A per-call interleave advances
    /// this thread's interleave cursor for this handle, like the thread policy's.
    pub fn alloc_pages_policy(&self, gfp: Gfp, order: u32, policy: &MemPolicy) -> Result<NonNull<u8>> {
        let order = self.check_order(order)?;
        policy.validate(self.topo.nr_nodes())?;
        let local = self.local_node();
        match policy {
            MemPolicy::Interleave(mask) => {
                let nid = mempolicy::interleave_call(self.id, mask);
                self.alloc_resolved(gfp, order, Resolved::Interleave(nid))
            }
            p => self.alloc_resolved(gfp, order, mempolicy::resolve(p, local)),
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
    fn alloc_resolved(&self, gfp: Gfp, order: Order, r: Resolved<'_>) -> Result<NonNull<u8>> {
        let (preferred, nodemask) = match r {
            Resolved::Node(n) | Resolved::Interleave(n) => (n, None),
            Resolved::Masked(n, m) => (n, Some(m)),
        };
        let lists = &self.zonelists[preferred.0 as usize];
        let ctx = AllocContext {
            zonelist: if gfp.contains(Gfp::THISNODE) { &lists.nofallback } else { &lists.fallback },
            nodemask,
            high: gfp.contains(Gfp::HIGH),
            no_watermarks: gfp.contains(Gfp::NO_WATERMARKS),
        };
        let pfn = match self.get_page_from_freelist(&ctx, order, Watermark::Low) {
            Some(p) => p,
            None => self.alloc_pages_slowpath(&ctx, order)?,
        };
        let addr = self.arena.pfn_to_addr(pfn);
        // The arena never maps address 0, so a frame's address is never null.
        Ok(NonNull::new(addr as *mut u8).expect("arena addresses are non-null"))
    }

    /// The second pass: down to `min` (half of it with [`Gfp::HIGH`]), then, with
    /// [`Gfp::NO_WATERMARKS`], past every watermark. zonal has no reclaim to wait for, so what
    /// remains after these is out of memory.
    #[cold]
    #[inline(never)]
    fn alloc_pages_slowpath(&self, ctx: &AllocContext<'_>, order: Order) -> Result<Pfn> {
        if let Some(p) = self.get_page_from_freelist(ctx, order, Watermark::Min) {
            return Ok(p);
        }
        if ctx.no_watermarks {
            if let Some(p) = self.walk(ctx, order, |_| true) {
                return Ok(p);
            }
        }
        Err(Error::OutOfMemory { order })
    }

    /// Walks the zonelist for a zone above `mark` with a block of `order`
    /// (`get_page_from_freelist`).
    #[inline]
    fn get_page_from_freelist(&self, ctx: &AllocContext<'_>, order: Order, mark: Watermark) -> Option<Pfn> {
        self.walk(ctx, order, |z| z.watermark_ok_fast(order, z.watermark(mark), ctx.high))
    }

    #[inline]
    fn walk(&self, ctx: &AllocContext<'_>, order: Order, ok: impl Fn(&Zone) -> bool) -> Option<Pfn> {
        for &zid in ctx.zonelist {
            let z = &self.zones[zid.0 as usize];
            if let Some(mask) = ctx.nodemask {
                if !mask.contains(z.node) {
                    continue;
                }
            }
            if !ok(z) {
                continue;
            }
            if let Some(p) = rmqueue(z, order) {
                return Some(p);
            }
        }
        None
    }

    /// Frees a block given its address and order (`free_pages`). Checks, in order: the order,
    /// that zonal owns the address, its alignment, and that a live block of exactly this order
    /// starts there. Any failure leaves everything as it was.
    pub fn free_pages(&self, addr: *mut u8, order: u32) -> Result<()> {
        let order = self.check_order(order)?;
        let (zone, pfn) = self.addr_to_zone(addr as usize, order)?;
        if let Err(s) = zone.state(pfn).compare_exchange(
            buddy::state(ALLOCATED, order),
            buddy::NONE,
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            return Err(classify_bad_free(zone, pfn, order, s));
        }
        free_one_page(zone, pfn, order);
        Ok(())
    }

    /// The zone and frame of an address that must start a block of `order`.
    #[inline]
    fn addr_to_zone(&self, addr: usize, order: Order) -> Result<(&Zone, Pfn)> {
        let pfn = self.arena.addr_to_pfn(addr).ok_or(Error::NotOwned { addr })?;
        let zid = self.block_zone[pfn.0 >> self.max_order.0];
        if zid == NO_ZONE || !self.zones[zid as usize].contains(pfn) {
            return Err(Error::NotOwned { addr });
        }
        if addr % PAGE_SIZE != 0 || !pfn.is_aligned(order) {
            return Err(Error::Misaligned { addr, order });
        }
        Ok((&self.zones[zid as usize], pfn))
    }

    /// The node a frame of zonal belongs to (`page_to_nid`).
    pub fn page_to_nid(&self, addr: *const u8) -> Result<NodeId> {
        let addr = addr as usize;
        let pfn = self.arena.addr_to_pfn(addr).ok_or(Error::NotOwned { addr })?;
        let zid = self.block_zone[pfn.0 >> self.max_order.0];
        if zid == NO_ZONE || !self.zones[zid as usize].contains(pfn) {
            return Err(Error::NotOwned { addr });
        }
        Ok(self.zones[zid as usize].node)
    }

    /// The frame number of an address zonal owns.
    pub fn addr_to_pfn(&self, addr: *const u8) -> Result<Pfn> {
        self.page_to_nid(addr)?;
        Ok(self.arena.addr_to_pfn(addr as usize).expect("owned addresses are in the arena"))
    }

    /// Free frames of a node, over its zones.
    pub fn nr_free_pages(&self, nid: NodeId) -> Result<usize> {
        Ok(self.node_zones(nid)?.iter().map(|z| self.zones[z.0 as usize].nr_free()).sum())
    }

    /// Free blocks of one order on a node, over its zones.
    pub fn nr_free_blocks(&self, nid: NodeId, order: u32) -> Result<usize> {
        let order = self.check_order(order)?;
        Ok(self.node_zones(nid)?.iter().map(|z| self.zones[z.0 as usize].free_blocks()[order.0 as usize]).sum())
    }

    /// Checks every zone's invariants (see [`Zone::check_invariants`]); returns the allocated
    /// frames. Call while no other thread allocates or frees.
    pub fn check_invariants(&self) -> std::result::Result<usize, String> {
        self.zones.iter().map(Zone::check_invariants).sum()
    }
}

impl Drop for Zonal {
    fn drop(&mut self) {
        mempolicy::forget_handle(self.id);
    }
}

/// Takes a block of `order` from a zone's buddy lists and tags it allocated (`rmqueue`).
#[inline]
fn rmqueue(z: &Zone, order: Order) -> Option<Pfn> {
    let pfn = {
        let mut l = z.lock();
        let pfn = l.buddy().rmqueue_smallest(order)?;
        l.sub_free(order.pages());
        pfn
    };
    // Release: pairs with the Acquire of the CAS in free_pages, so the free sees the lists'
    // state as of this allocation.
    z.state(pfn).store(buddy::state(ALLOCATED, order), Ordering::Release);
    Some(pfn)
}

/// Returns a claimed block (head state `NONE`) to its zone's buddy lists.
#[inline]
fn free_one_page(z: &Zone, pfn: Pfn, order: Order) {
    let mut l = z.lock();
    l.buddy().free_one(pfn, order);
    l.add_free(order.pages());
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
