//! Allocation (`__alloc_pages`, `get_page_from_freelist`, `rmqueue`,
//! `__alloc_pages_slowpath`'s watermark steps, mm/page_alloc.c): the policy resolved to a
//! zonelist, the walk with the zonelist cache (seed 003), per-CPU lists for small orders and
//! the buddy for large ones.
//!
//! Locking: a pcp try-lock, then the zone lock inside it for refills; never two zone locks.
//! A block leaves here tagged `ALLOCATED|order` with a Release store.

use super::*;

impl Zonal {
    /// Allocates a block of 2^order frames under this thread's memory policy (local node by
    /// default).
    ///
    /// Orders 0 to 3 try their restartable sequence here, in a path that calls nothing but
    /// the general path (out of line) and saves no register; everything else runs there.
    #[inline]
    pub fn alloc_pages(&self, gfp: Gfp, order: u32) -> Result<NonNull<u8>> {
        let fast = if order == 0 { self.alloc_order0_fast(None) } else { self.alloc_small_fast(order) };
        match fast {
            Some(p) => Ok(p),
            None => self.alloc_pages_general(gfp, order),
        }
    }

    /// [`Zonal::alloc_pages`] past the restartable sequences. Out of line: its prologue
    /// saves six registers, which the orders 1 to 3 paid on every pair while their fast
    /// path lived here (their pair: 9.3 ns then, 5.4 ns since).
    #[inline(never)]
    pub(super) fn alloc_pages_general(&self, gfp: Gfp, order: u32) -> Result<NonNull<u8>> {
        let order = self.check_order(order)?;
        // The pageblock order's cache: its section here, where its call costs nothing more.
        if order == PCP_THP_ORDER {
            if let Some(p) = self.alloc_thp_fast() {
                return Ok(p);
            }
        }
        // Past the restartable sequences (which give way in a forked child), before any lock.
        self.check_forked()?;
        // The CPU and the policy, read once for the locked fast path and the walk after it.
        let cpu = self.current_cpu();
        if mempolicy::thread_has_policy(self.id) {
            let local = self.topo.cpu_to_node(CpuId(cpu as u32));
            return mempolicy::with_thread_policy(self.id, local, |r| self.alloc_resolved(cpu, gfp, order, r));
        }
        // Order 0 too: without rseq (or when its cache ran dry) its block comes from the
        // lists under their lock, past the walk and the zonelist cache.
        if pcp::pcp_allowed(order) {
            if let Some(p) = self.alloc_pcp_fast(cpu, order) {
                return Ok(p);
            }
        }
        let local = self.topo.cpu_to_node(CpuId(cpu as u32));
        if order.0 == 0 && !gfp.intersects(Gfp::THISNODE | Gfp::HIGH | Gfp::NO_WATERMARKS) {
            if let Some(p) = self.alloc_past_full(cpu, gfp, local) {
                return Ok(p);
            }
        }
        self.alloc_resolved(cpu, gfp, order, Resolved::Node(local))
    }

    /// Seed 003's memory hog in its steady state, in one step: an order-0 allocation under
    /// the local policy and `low` whole whose local zone is full, when the zonelist cache
    /// names the zone to go to and that zone's cache on this CPU has a frame. It does what
    /// the walk would: tests the first zone of the local node's zonelist, sets the cache up
    /// and marks that zone ([`Zonal::zlc_setup`], [`Zonal::zlc_mark_full`]), takes the skip
    /// mask, passes the run of entries it has full, tests the entry after them, pops a frame
    /// from its cache and counts `zlc_zones_skipped`, `pgalloc` and the NUMA statistics, as
    /// the walk and [`Zonal::alloc_resolved`] count them. `None` at the first step that
    /// differs from that (no rseq, the cache off or one zone, the first zone with room, no
    /// entry past the run among the first 64, that entry failing its test, its cache empty
    /// or busy): the walk then runs from the start, and what this did (a mark, a zap, a
    /// set-up's clock read) is what the walk does first anyway, done once.
    ///
    /// What it spares is the walk's generality (the policy resolved, its context, a loop
    /// ready for nodemasks, other marks and a second pass): seed 003's hog past 27 full
    /// zones allocated in 19.5–19.8 ns a page through the walk and in 13.0–15.0 this way
    /// (`examples/zlc_hog`, one thread, touching, alternated three times). Out of line, so
    /// the general path of every other allocation keeps its frame.
    #[inline(never)]
    fn alloc_past_full(&self, cpu: usize, gfp: Gfp, local: NodeId) -> Option<NonNull<u8>> {
        let rseq = self.rseq_off()?;
        if self.mem.zones.len() < 2 || !self.tun.zlc_on.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let zonelist = &self.mem.zonelists[local.0 as usize].fallback;
        let c = &self.mem.zlcs[local.0 as usize];
        let demand = Demand { level: Level::Low, halved: false, order: Order(0) };
        let levels = zone::WalkLevels::of(Level::Low, false, Order(0));
        let first = &self.mem.zones[zonelist.first()?.0 as usize];
        if first.walk_ok(Order(0), Level::Low, false, levels) {
            return None;
        }
        self.zlc_setup(cpu, c);
        self.zlc_mark_full(cpu, c, 0, demand, false);
        // The run of entries from 1 that the mask has full, and the entry after it.
        let next = 1 + (!(c.skip_mask(demand) >> 1)).trailing_zeros() as usize;
        let zid = *zonelist.get(next).filter(|_| next < 64)?;
        let z = &self.mem.zones[zid.0 as usize];
        if !z.walk_ok(Order(0), Level::Low, false, levels) {
            return None;
        }
        let pfn = self.pop_cached(rseq, z)?;
        if next > 1 {
            self.count_event(cpu, VmEvent::ZlcSkipped, next as u64 - 1);
        }
        self.count_pages(cpu, z.id, false, 1);
        if self.key.load().numa() != 0 {
            let (_, ctx) = self.context(cpu, gfp, &Resolved::Node(local));
            self.zone_statistics(cpu, &ctx, z, 1, None);
        }
        Some(self.pfn_to_ptr(pfn))
    }

    /// Allocates a block preferring node `nid` (`alloc_pages_node`); with [`Gfp::THISNODE`]
    /// only from that node.
    #[inline]
    pub fn alloc_pages_node(&self, nid: NodeId, gfp: Gfp, order: u32) -> Result<NonNull<u8>> {
        self.check_forked()?;
        let order = self.check_order(order)?;
        self.check_node(nid)?;
        self.alloc_resolved(self.current_cpu(), gfp, order, Resolved::Node(nid))
    }

    /// Allocates a block under `policy` for this call only. A per-call interleave advances
    /// this thread's interleave cursor for this handle, like the thread policy's.
    pub fn alloc_pages_policy(&self, gfp: Gfp, order: u32, policy: &MemPolicy) -> Result<NonNull<u8>> {
        self.check_forked()?;
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

    /// The preferred node and the walk's context for a resolved policy.
    ///
    /// Always inline: out of line (as `#[inline]` left it) it returned the context through
    /// memory, and the caller's first load of it (16-byte moves of what the callee had just
    /// stored as words) took most of `alloc_resolved`'s samples. Inlined, the seed-003 hog's
    /// allocation past 27 full zones went from 30.8 to 22.8 ns with the cache on and from
    /// 69.7 to 61.3 with it off (`examples/zlc_hog`, one thread, alternated).
    #[inline(always)]
    pub(super) fn context<'a>(&'a self, cpu: usize, gfp: Gfp, r: &Resolved<'a>) -> (NodeId, AllocContext<'a>) {
        let (preferred, nodemask) = match *r {
            Resolved::Node(n) | Resolved::Interleave(n) => (n, None),
            // Bind prefers the local node when the mask has it, else the nearest node that the
            // mask has, so `THISNODE` under a bind policy stays inside the policy.
            Resolved::Masked(n, m) if !m.contains(n) => {
                let near = self.mem.zonelists[n.0 as usize]
                    .fallback
                    .iter()
                    .map(|z| self.mem.zones[z.0 as usize].node)
                    .find(|nid| m.contains(*nid));
                (near.unwrap_or(n), Some(m))
            }
            Resolved::Masked(n, m) => (n, Some(m)),
        };
        let lists = &self.mem.zonelists[preferred.0 as usize];
        let thisnode = gfp.contains(Gfp::THISNODE);
        let ctx = AllocContext {
            cpu,
            zonelist: if thisnode { &lists.nofallback } else { &lists.fallback },
            // `zlc_setup` only with more than one node; no cache for the one-node list.
            zlc: (!thisnode && self.mem.zones.len() > 1).then(|| &self.mem.zlcs[preferred.0 as usize]),
            nodemask,
            high: gfp.contains(Gfp::HIGH),
            no_watermarks: gfp.contains(Gfp::NO_WATERMARKS),
            rseq: self.rseq_off(),
        };
        (preferred, ctx)
    }

    #[inline]
    pub(super) fn alloc_resolved(&self, cpu: usize, gfp: Gfp, order: Order, r: Resolved<'_>) -> Result<NonNull<u8>> {
        let (_, ctx) = self.context(cpu, gfp, &r);
        self.alloc_in(&ctx, order, r)
    }

    /// The walk, the slow path and the accounting of an allocation in `ctx`.
    #[inline]
    pub(super) fn alloc_in(&self, ctx: &AllocContext<'_>, order: Order, r: Resolved<'_>) -> Result<NonNull<u8>> {
        let cpu = ctx.cpu;
        let pfn = match self.get_page_from_freelist(ctx, order, Watermark::Low) {
            Some(p) => p,
            None => self.alloc_pages_slowpath(ctx, order)?,
        };
        self.count_pages(cpu, self.zone_of(pfn).id, false, order.pages() as u64);
        // One predictable branch on a read-mostly flag when NUMA statistics are off.
        if self.key.load().numa() != 0 {
            let target = match r {
                Resolved::Interleave(n) => Some(n),
                _ => None,
            };
            self.zone_statistics(cpu, ctx, self.zone_of(pfn), 1, target);
        }
        Ok(self.pfn_to_ptr(pfn))
    }

    /// The second pass: down to `min` (half of it with [`Gfp::HIGH`]); if that fails, drain
    /// every CPU's lists (frames stranded there are free memory) and try again; then, with
    /// [`Gfp::NO_WATERMARKS`], past every watermark. zonal has no reclaim to wait for, so what
    /// remains after these is out of memory.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_pages_slowpath(&self, ctx: &AllocContext<'_>, order: Order) -> Result<Pfn> {
        // Where Linux wakes kswapd for the nodes that are not balanced, which tightens the
        // thresholds of their zones so the drift cannot hide the way down to `min`: here the
        // zones below `low`. The worker loosens them again above `high`. Each zone's free
        // count is the exact one its lock's holders keep (one load), where Linux sums every
        // CPU's diff (`zone_page_state_snapshot`): that made this step O(CPUs × zones), 8.6 µs
        // an allocation at 1024 CPUs on 8 nodes (`bench scale`).
        for id in ctx.zonelist {
            let z = &self.mem.zones[id.0 as usize];
            if z.nr_free_exact() < z.watermark(Watermark::Low) {
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
    pub(super) fn get_page_from_freelist(&self, ctx: &AllocContext<'_>, order: Order, mark: Watermark) -> Option<Pfn> {
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
    pub(super) fn walk(&self, ctx: &AllocContext<'_>, order: Order, level: Level) -> Option<Pfn> {
        let demand = Demand { level, halved: ctx.high && level != Level::None, order };
        let zlc = ctx.zlc.filter(|_| self.tun.zlc_on.load(std::sync::atomic::Ordering::Relaxed));
        let mut active = false;
        let mut skipped = 0u64;
        // The entries below 64 to skip, taken once the cache is set up.
        let mut skip = 0u64;
        let n = ctx.zonelist.len();
        // What the zones' `above_low` levels say of this demand (`Zone::walk_ok`).
        let levels = zone::WalkLevels::of(level, ctx.high, order);
        for pass in 0..2 {
            let mut next = 0;
            while next < n {
                let i = next;
                next += 1;
                if let (true, Some(c)) = (active && pass == 0, zlc) {
                    // The run of entries the mask has full from `i` on, passed in one step: a
                    // walk past many full zones costs a bit scan, not a test per zone.
                    let run = if i < 64 { ((!(skip >> i)).trailing_zeros() as usize).min(n - i) } else { 0 };
                    if run > 0 {
                        skipped += run as u64;
                        next = i + run;
                        continue;
                    }
                    if i >= 64 && !c.worth_trying(i, demand) {
                        skipped += 1;
                        continue;
                    }
                }
                let zid = ctx.zonelist[i];
                let z = &self.mem.zones[zid.0 as usize];
                if ctx.nodemask.is_some_and(|m| !m.contains(z.node)) {
                    continue;
                }
                let fits = z.walk_ok(order, level, ctx.high, levels);
                if fits {
                    if let Some(p) = self.rmqueue(ctx, z, order) {
                        if skipped > 0 {
                            self.count_event(ctx.cpu, VmEvent::ZlcSkipped, skipped);
                        }
                        return Some(p);
                    }
                }
                let Some(c) = zlc else { continue };
                let first = !active;
                if first {
                    active = true;
                    self.zlc_setup(ctx.cpu, c);
                }
                self.zlc_mark_full(ctx.cpu, c, i, demand, fits);
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

    /// `zlc_setup`, after a walk's first zone failed: the zap, when the clock says one is due.
    #[inline]
    fn zlc_setup(&self, cpu: usize, c: &ZonelistCache) {
        if self.zlc_clock_due() {
            let interval = self.tun.zlc_interval_ms.load(std::sync::atomic::Ordering::Relaxed);
            if c.setup(self.zlc_now_ms(), interval) {
                self.count_event(cpu, VmEvent::ZlcZaps, 1);
            }
        }
    }

    /// `zlc_mark_zone_full` of entry `i`, found full for `demand`: by its count, or (`fits`:
    /// it passed) for want of a block.
    #[inline]
    fn zlc_mark_full(&self, cpu: usize, c: &ZonelistCache, i: usize, demand: Demand, fits: bool) {
        if c.mark_full(i, demand, fits) {
            self.count_event(cpu, VmEvent::ZlcFullMarks, 1);
        }
    }

    /// Whether this set-up reads the clock to see if a zap is due: every time on an injected
    /// clock; else every 16th set-up of a thread (a clock read is a fifth of a walk past many
    /// full zones, and a zap a few walks late changes nothing a hint promises).
    #[inline]
    pub(super) fn zlc_clock_due(&self) -> bool {
        thread_local! {
            static SETUPS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        self.mem.zlc_clock.get().is_some()
            || SETUPS.with(|n| {
                let v = n.get();
                n.set(v.wrapping_add(1));
                v % 16 == 0
            })
    }

    /// The zonelist caches' clock, in milliseconds.
    pub(super) fn zlc_now_ms(&self) -> u64 {
        match self.mem.zlc_clock.get() {
            Some(c) => c.load(std::sync::atomic::Ordering::Relaxed),
            None => sys::coarse_now_ms().saturating_sub(self.mem.zlc_epoch_ms),
        }
    }

    /// Which entries of node `nid`'s fallback zonelist its cache has marked full now, as the
    /// nodes of those entries, in zonelist order.
    pub fn zonelist_cache_full_nodes(&self, nid: NodeId) -> Result<Vec<NodeId>> {
        self.check_node(nid)?;
        let c = &self.mem.zlcs[nid.0 as usize];
        Ok((0..c.len()).filter(|&i| c.is_marked(i)).map(|i| NodeId(c.node(i))).collect())
    }

    /// Takes a block from a zone (`rmqueue`): from this CPU's lists for small orders (for
    /// order 0 the rseq cache first, unless the thread acts as a CPU: `ctx.rseq`), from the
    /// buddy lists for large ones or when the lists are busy (`pcp_spin_trylock` failed).
    #[inline]
    pub(super) fn rmqueue(&self, ctx: &AllocContext<'_>, z: &Zone, order: Order) -> Option<Pfn> {
        let cpu = ctx.cpu;
        if let (0, Some(rseq)) = (order.0, ctx.rseq) {
            if let Some(pfn) = self.pop_cached(rseq, z) {
                return Some(pfn);
            }
        }
        let pfn = if pcp::pcp_allowed(order) && self.cpus.pcp_enabled {
            match self.pcp_take(cpu, z, order) {
                Some((pfn, refilled)) => {
                    if refilled {
                        self.count_event(cpu, VmEvent::PcpRefill, 1);
                    }
                    pfn?
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
        z.state(pfn).store(mem_map::state(ALLOCATED, order), Ordering::Release);
        Some(pfn)
    }
}

/// Takes a block of `order` from a zone's buddy lists (`rmqueue_buddy`); the caller tags it.
#[inline]
pub(super) fn rmqueue_buddy(z: &Zone, order: Order) -> Option<Pfn> {
    let mut l = z.lock();
    let pfn = l.buddy().rmqueue_smallest(order)?;
    drop(l);
    debug_vm_check(z);
    Some(pfn)
}
