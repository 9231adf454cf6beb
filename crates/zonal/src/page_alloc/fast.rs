//! The order-0 fast paths: allocation and free through this CPU's rseq cache with no lock
//! and no atomic read-modify-write, under the local policy and above the `low` watermark
//! (Linux's `rmqueue_pcplist` / `free_unref_page` with preemption off). Anything else returns
//! to the general paths in `alloc` and `free`, with the same semantics.

use super::key::Key;
use super::*;

impl Zonal {
    /// The order-0 fast path. Under the local policy an allocation tries the first zone of
    /// the local node's zonelist first: one restartable sequence finds this CPU's lists of
    /// that zone from the CPU id alone (`local_pcp`), reads the zone's flag that says it is
    /// above its low watermark (the strictest test any gfp flag asks for, which the zone
    /// lock's holders keep; see `Zone::above_low`), and pops a frame from the cache, with no
    /// lock and no atomic read-modify-write. Anything else (no rseq, a thread policy, a zone
    /// at or below `low`, an empty cache, an interrupted section) returns `None`, and the
    /// general path runs with the same semantics.
    ///
    /// `also`: an event to count on the CPU the path ran on (a bulk call of one frame counts
    /// itself as a bulk call); `None` from the single path, which the inlining removes.
    #[inline(always)]
    pub(super) fn alloc_order0_fast(&self, also: Option<VmEvent>) -> Option<NonNull<u8>> {
        let key = self.key.load();
        let rseq = key.rseq()?;
        if mempolicy::thread_has_policy_bit(key.policy_bit()) {
            return None;
        }
        let t = self.local_table(rseq);
        // The section counts the frame in the cache's word (`pcp::word`): `pgalloc` with the
        // NUMA hit and local, uncounted below if the frame is not handed out.
        // SAFETY: `rseq` places this thread's rseq area (`rseq_off`); `local_pcp` holds one
        // address per CPU, each of this handle's lists (which outlive the call, as do their
        // zones' flags) or of the locked stand-in (see `Zonal::new`).
        let (pfn, cpu) = unsafe { pcp::rseq::pop_local(&t) }?;
        let pfn = Pfn(pfn);
        // SAFETY: a cache holds only frames of this handle's zones, which the map covers:
        // the sections push a frame after finding its state in the map, and lock holders
        // fill the caches from the zones' lists.
        if !mem_map::take_cached_block(unsafe { self.mem.map.state_unchecked(pfn) }, Order(0)) {
            // A racing free's second copy, dropped (see `take_cached`): its pop uncounted
            // with a wrapping -1 on the CPU's `local_first`, which every reader adds to the
            // words' counts. In line: a call here, with the handle live after it for the
            // general path, made the path save and restore a register on every pair.
            self.cpus.events[cpu].add_local_first(u64::MAX);
            return None;
        }
        let p = self.pfn_to_ptr(pfn);
        if key.numa() > NUMA_ON_PERCPU {
            // Out of line, handed the block and giving it back: nothing is live across the
            // call (as above).
            return Some(self.charge_numa_popped(cpu, p, also));
        }
        if let Some(e) = also {
            self.count_event(cpu, e, 1);
        }
        Some(p)
    }

    /// The NUMA statistics of a block `pop_local` took on `cpu`, beyond the per-CPU
    /// strategy's (the CPU's local zone, a hit and local), and the event `also`; returns `p`.
    #[cold]
    #[inline(never)]
    fn charge_numa_popped(&self, cpu: usize, p: NonNull<u8>, also: Option<VmEvent>) -> NonNull<u8> {
        // The section served `cpu` from its local zone's lists, so `local_zone[cpu]` is a zone.
        let z = &self.mem.zones[self.cpus.local_zone[cpu] as usize];
        self.numa_charge(cpu, z, z, 1, None);
        if let Some(e) = also {
            self.count_event(cpu, e, 1);
        }
        p
    }

    /// Where this thread's local-zone sections find each CPU's lists.
    #[inline(always)]
    fn local_table(&self, rseq: isize) -> pcp::rseq::LocalTable {
        pcp::rseq::LocalTable { rseq, local: self.cpus.local_pcp.as_ptr() }
    }

    /// The locked fast path of the orders the per-CPU lists keep (0 to 3 and the pageblock
    /// order; order 0 when its cache is dry or without rseq): under the local policy, when
    /// the local node's first zone is above its `low` watermark with the block taken, the
    /// block comes from this CPU's list for the order under its try-lock, skipping the
    /// policy's resolution, the zonelist walk and the zonelist cache, which cannot change the
    /// answer then (the general path would try the same zone first, at the same watermark,
    /// and take the same list). Anything else (a thread policy, the zone low, the lists busy
    /// or the zone out of blocks) returns `None` and the general path runs with its
    /// semantics. Order 0 comes here too (before, it walked the zonelist): see
    /// docs/PERFORMANCE.md, "Orders 1–3 and 9", for what it saved. The caller has found the
    /// thread without a policy for this handle, and on `cpu`, which the general path goes on
    /// with when this returns `None`.
    #[inline(always)]
    pub(super) fn alloc_pcp_fast(&self, cpu: usize, order: Order) -> Option<NonNull<u8>> {
        if !self.cpus.pcp_enabled {
            return None;
        }
        let z = self.mem.zones.get(*self.cpus.local_zone.get(cpu)? as usize)?;
        // The watermark test is the lists' gate (on their line, which the try-lock takes
        // next): the zone's `above_low` level, which every zone-lock holder that changes the
        // exact free count sets from it, says whether order 0, every order up to 3, or the
        // pageblock order passes `low`, as the sections read it. Orders 1 and 2 within 7
        // frames of the edge, which the level does not tell apart, go to the general path.
        let level = match order.0 {
            0 => zone::ABOVE_LOW_ORDER0,
            1..=pcp::PCP_MAX_ORDER => zone::ABOVE_LOW_SMALL,
            _ => zone::ABOVE_LOW_THP,
        };
        if self.pcp(cpu, z.id).gate() < level {
            return None;
        }
        let (pfn, refilled) = self.pcp_take(cpu, z, order)?;
        let pfn = pfn?;
        if refilled {
            self.count_event(cpu, VmEvent::PcpRefill, 1);
        }
        // Release: pairs with the Acquire of the claim in a later free (as `rmqueue`).
        z.state(pfn).store(mem_map::state(mem_map::ALLOCATED, order), Ordering::Release);
        self.count_pages(cpu, z.id, false, order.pages() as u64);
        // The local node's first zone: a hit, and local (`zone_statistics` of the general path).
        if self.key.load().numa() != 0 {
            self.numa_charge(cpu, z, z, 1, None);
        }
        Some(self.pfn_to_ptr(pfn))
    }

    /// The fast path of orders 1 to 3 (`None` for any other): under the local policy, one
    /// restartable sequence finds this CPU's lists of its local zone (as order 0's
    /// `pop_local`), reads the zone's `above_low` level, which says whether every order up to
    /// 3 passes `low` (the test the general path would make), and pops a block from that
    /// order's cache, with no lock and no atomic read-modify-write. The block is tagged
    /// allocated and counted on the CPU the section ran on. `None` (the general path runs,
    /// with the same semantics) when there is no rseq, the thread has a policy, the zone is
    /// near `low`, the cache is empty or locked (the locked path then fills it), the section
    /// was interrupted, or the block was a racing free's second copy (dropped, see
    /// [`take_cached`]).
    #[inline(always)]
    pub(super) fn alloc_small_fast(&self, order: u32) -> Option<NonNull<u8>> {
        if order.wrapping_sub(1) >= pcp::PCP_MAX_ORDER as u32 {
            return None;
        }
        self.alloc_cached_block::<{ zone::ABOVE_LOW_SMALL }>(Order(order as u8))
    }

    /// The fast path of the pageblock order, as orders 1 to 3's ([`Zonal::alloc_small_fast`])
    /// from the THP list's cache, with the gate asked for `ABOVE_LOW_THP` (the zone above
    /// `low` by a block). From the general path: beside the other orders' in `alloc_pages`
    /// it cost their pairs 7–13% in `bench single` (the harness's calls inlined less); its
    /// free runs in `free_pages` (which cost them nothing measurable). The pair: 26 ns under
    /// the lock, 9.2 with both sections in the general paths, 6.8 with the free's moved.
    #[inline(always)]
    pub(super) fn alloc_thp_fast(&self) -> Option<NonNull<u8>> {
        self.alloc_cached_block::<{ zone::ABOVE_LOW_THP }>(PCP_THP_ORDER)
    }

    /// A block of `order` (1 to 3, or the pageblock order) from its cache, the gate asked for
    /// `LEVEL` (see [`Zonal::alloc_small_fast`]).
    #[inline(always)]
    fn alloc_cached_block<const LEVEL: u8>(&self, order: Order) -> Option<NonNull<u8>> {
        let key = self.key.load();
        let rseq = key.rseq()?;
        if mempolicy::thread_has_policy_bit(key.policy_bit()) {
            return None;
        }
        // SAFETY: as in `alloc_order0_fast`: `rseq` places this thread's rseq area and
        // `local_pcp` holds one address per CPU, each of this handle's lists or of the
        // locked stand-in; `order` is 1 to 3 or the pageblock order.
        let (pfn, cpu) = unsafe { pcp::rseq::pop_small_local::<LEVEL>(&self.local_table(rseq), order) }?;
        let pfn = Pfn(pfn);
        // SAFETY: as in `alloc_order0_fast`, the cache's blocks are the zones'.
        if !mem_map::take_cached_block(unsafe { self.mem.map.state_unchecked(pfn) }, order) {
            // A racing free's second copy: its `pgalloc` (counted in the cache's word, as
            // its frames) taken back with a wrapping subtraction on the CPU's event counter,
            // which [`Zonal::event`] adds to the words' counts. In line, as order 0's.
            self.count_pages(cpu, self.zone_of(pfn).id, false, (order.pages() as u64).wrapping_neg());
            return None;
        }
        // The section counted `pgalloc` in the cache's word (`pcp::word`).
        let p = self.pfn_to_ptr(pfn);
        if key.numa() != 0 {
            // Every strategy charges these (the per-CPU one reads order 0's pops only).
            return Some(self.charge_numa_popped(cpu, p, None));
        }
        Some(p)
    }

    /// The free of orders 1 to 3 with restartable sequences: the block's number and
    /// alignment from its address alone (as order 0's, one bound for the arena), the claim
    /// straight to `PCP|order` as `free_check` says, and a push onto that order's cache of
    /// this CPU's lists of the block's zone in one section, which finds them as order 0's
    /// `push_frame` does (the local lists by their span, no zone read on the way). A check
    /// or claim that fails changes nothing and sends the free to the locked path, which
    /// reports the error; a push that fails (the cache at its bound or locked, the section
    /// interrupted) takes the claim back with a CAS and frees the block on the locked path,
    /// which fills the cache again.
    #[inline(always)]
    pub(super) fn free_small_fast(&self, key: Key, rseq: isize, addr: usize, order: Order) -> Result<()> {
        let pfn = addr.wrapping_sub(self.mem.arena.base()).rotate_right(PAGE_SHIFT);
        let Some(entry) = self.mem.map.states().get(pfn).filter(|_| pfn & (order.pages() - 1) == 0) else {
            return self.free_small_refused(addr, order);
        };
        let to = mem_map::state(mem_map::PCP, order);
        if mem_map::try_claim(entry, order, to, key.free_check_atomic()).is_err() {
            return self.free_small_refused(addr, order);
        }
        // SAFETY: as in `free_order0_fast`: `rseq` places this thread's area and
        // `free_table` holds this handle's tables; `order` is 1 to 3 or the pageblock order.
        if unsafe { pcp::rseq::push_small_frame(rseq, &self.cpus.free_table, pfn, order) } == usize::MAX {
            return self.free_unpushed_block(Pfn(pfn), order);
        }
        // The section counted `pgfree` in the cache's word (`pcp::word`).
        Ok(())
    }

    /// The zone the bulk order-0 fast path takes from, with this thread's CPU: under the
    /// local policy, the first zone of the local node's zonelist, when it is above `low`
    /// with `extra` frames to spare (the batch, checked before its section). `None` sends the
    /// caller to the general path. (The single path's section finds the zone's lists from the
    /// CPU, with `pop_local`, and reads the zone's `above_low` flag before it pops.)
    #[inline(always)]
    pub(super) fn local_fast_zone(&self, rseq: isize, extra: usize) -> Option<(usize, &Zone)> {
        if mempolicy::thread_has_policy(self.id) {
            return None;
        }
        let cpu = self.rseq_cpu(rseq);
        let z = self.mem.zones.get(*self.cpus.local_zone.get(cpu)? as usize)?;
        z.watermark_ok_fast(Order(0), z.watermark(Watermark::Low).saturating_add(extra), false).then_some((cpu, z))
    }

    /// Accounts `n` frames the fast paths took from the CPU's local zone (the preferred zone,
    /// so a hit, and local when on the CPU's node). One per-CPU count serves as the
    /// `pgalloc_normal` event and, under the per-CPU strategy, as the NUMA hit and local: with
    /// that strategy, counting costs the fast path nothing but the key's load and branch.
    #[inline(always)]
    pub(super) fn account_local_alloc(&self, cpu: usize, z: &Zone, n: u64) {
        // `local_zone[cpu]` is on the CPU's node (see `Zonal::new`): a hit and local.
        self.cpus.events[cpu].add_local_first(n);
        self.charge_numa_local(cpu, z, n);
    }

    /// The NUMA statistics of `n` local-zone frames beyond the per-CPU strategy's (which
    /// reads them from the local-first counts): the other strategies' own counters.
    #[inline(always)]
    fn charge_numa_local(&self, cpu: usize, z: &Zone, n: u64) {
        if self.key.load().numa() > NUMA_ON_PERCPU {
            self.numa_charge(cpu, z, z, n, None);
        }
    }

    /// Pops an order-0 frame from this CPU's cache for `z` and tags it allocated; `None` when
    /// the cache has nothing (see [`take_cached`]).
    #[inline(always)]
    pub(super) fn pop_cached(&self, rseq: isize, z: &Zone) -> Option<Pfn> {
        // SAFETY: the table is this thread's rseq area (the caller's `rseq`) and this handle's
        // lists, which outlive the call; `z` is one of this handle's zones.
        let pfn = Pfn(unsafe { pcp::rseq::pop(&self.rseq_table(rseq), z.id.0 as usize) }?);
        take_cached(self.mem.map.states(), pfn).then_some(pfn)
    }

    /// The order-0 fast path of free: the frame's number (one bound for the arena and its
    /// state map), its alignment, a claim that tags it for the per-CPU cache (as
    /// `free_check` says: a load and a store, or a CAS), and a push in one restartable
    /// sequence (`push_frame`) onto this CPU's lists of the frame's zone, which counts the
    /// free (`pgfree`) in its commit (`pcp::word`). The claim finds the frame's state from
    /// its number alone (one map for all zones), and the section takes the CPU's local lists
    /// from the CPU alone and checks that the frame lies in their zone's span, with a
    /// branch: on the pair's path nothing waits for the zone's structure, where the lists'
    /// address once waited for three dependent loads (pointer, `block_zone`, the zone; 12.0
    /// → 10.7 ns a pair) and the claim for two (10.7 → 8.8), and nothing reads the frame's
    /// zone (its block's entry of `block_zone`, looked up and bounds-checked on every free
    /// until the span check took its place: 6.8 → 5.8 ns a pair in a probe of the loop).
    /// A frame of another zone takes that zone's lists, found through `block_zone`, in the
    /// same section (two sections, one failing first, made `bench cross` 19% slower). When
    /// a check or the claim fails, nothing has changed and the general path decides (and
    /// reports the error); when the push fails (the cache full or locked, the section
    /// interrupted), the frame is taken back with a CAS (`unpush`, which one racer wins) and
    /// freed on the locked path. Every call here is a tail call, so the path saves no
    /// registers.
    #[inline(always)]
    pub(super) fn free_order0_fast(&self, key: Key, rseq: isize, addr: usize) -> Result<()> {
        // The offset rotated right by the page shift is the frame's number when the address is
        // page-aligned; otherwise its low bits land at the top, past every frame number (a
        // map has fewer than 2^52 entries), so one bound checks both. The map covers the
        // arena's span, so its bound is the arena's.
        let pfn = addr.wrapping_sub(self.mem.arena.base()).rotate_right(PAGE_SHIFT);
        let Some(entry) = self.mem.map.states().get(pfn) else {
            return self.free_pages_general(addr as *mut u8, 0);
        };
        // The CPU whose lists took the frame's run (a hint, read before the claim: nothing
        // waits for it), which the section compares with its own: a frame of another CPU's
        // run goes to the outbox, on its way back to that CPU, so that the state lines each
        // CPU's pairs write stay its own (see `pcp::lists::deliver`).
        // SAFETY: `pfn` is below the map's length (`get` just checked it).
        let owner = unsafe { self.mem.map.run_owner(pfn) };
        if mem_map::try_claim_order0(entry, mem_map::state(mem_map::PCP, Order(0)), key.free_check_atomic()).is_err() {
            return self.free_pages_general(addr as *mut u8, 0);
        }
        // SAFETY: `rseq` places this thread's area (`rseq_off`); `free_table` holds this
        // handle's tables (see `Zonal::new`), which outlive the call: `local_pcp` with
        // `nr_cpus` addresses of its lists or the stand-in, `zone_pcp` with `nr_zones *
        // nr_cpus` of its lists, and `block_zone`, which gives each frame of a zone's span
        // (the lists' spans, which do not overlap) that zone.
        // The section counts the frame (`pgfree`) in the cache's word (`pcp::word`).
        if unsafe { pcp::rseq::push_frame(rseq, &self.cpus.free_table, pfn, owner) } == usize::MAX {
            return self.free_unpushed(Pfn(pfn));
        }
        Ok(())
    }

    /// A free of orders 1 to 3 that the fast path's check or claim refused: the locked path
    /// decides (and reports the error). Out of line, so that the locked path's one copy
    /// inline is the general free's, which orders above 3 take.
    #[cold]
    #[inline(never)]
    fn free_small_refused(&self, addr: usize, order: Order) -> Result<()> {
        self.free_pages_locked(addr as *mut u8, order.0 as u32)
    }

    /// The end of a fast free whose push failed: the claim taken back (`unpush`; a racer's
    /// copy may have moved the frame on, and then this free leaves it alone) and the frame
    /// freed on the locked path, counted on this CPU.
    #[cold]
    #[inline(never)]
    fn free_unpushed(&self, pfn: Pfn) -> Result<()> {
        self.free_unpushed_block(pfn, Order(0))
    }

    /// [`Zonal::free_unpushed`] for a block of any order the lists keep.
    #[cold]
    #[inline(never)]
    fn free_unpushed_block(&self, pfn: Pfn, order: Order) -> Result<()> {
        // The block was claimed from `ALLOCATED`, which only a zone's blocks are.
        let zone = self.zone_of(pfn);
        if let Err(e) = self.check_forked() {
            // In a forked child every push gives way (its table's stand-ins): the claim
            // undone, so the refused free changes nothing.
            mem_map::unclaim_cached(zone, pfn, order);
            return Err(e);
        }
        let cpu = self.current_cpu();
        if mem_map::unpush_block(zone, pfn, order) {
            self.free_claimed(cpu, zone, &[pfn], order);
        }
        self.count_pages(cpu, zone.id, true, order.pages() as u64);
        Ok(())
    }
}
