//! The bulk allocator and bulk free (`__alloc_pages_bulk`, `free_pages_bulk`; seed 002): many
//! order-0 frames per call through one critical section or one pcp lock, with the accounting
//! done once per call.

use super::*;

/// A page as [`Zonal::free_pages_bulk`] takes it: a raw pointer, a `NonNull` (the list
/// form's), or a slot of the array form (`None`: an empty slot, skipped).
pub trait BulkPage: Copy {
    /// The page's address, or `None` for an empty slot.
    fn page_addr(self) -> Option<usize>;
}

impl BulkPage for *mut u8 {
    #[inline(always)]
    fn page_addr(self) -> Option<usize> {
        Some(self as usize)
    }
}

impl BulkPage for NonNull<u8> {
    #[inline(always)]
    fn page_addr(self) -> Option<usize> {
        Some(self.as_ptr() as usize)
    }
}

impl BulkPage for Option<NonNull<u8>> {
    #[inline(always)]
    fn page_addr(self) -> Option<usize> {
        self.map(|p| p.as_ptr() as usize)
    }
}

impl Zonal {
    /// Allocates order-0 frames into the empty (`None`) slots of `array`, leaving filled slots
    /// alone, and returns how many slots are filled afterwards (`alloc_pages_bulk`, array
    /// form). Under memory pressure it fills what it can: a partial fill is not an error.
    /// Accounting is done once per call with the batch count (seed 002).
    #[inline(always)]
    pub fn alloc_pages_bulk_array(&self, gfp: Gfp, array: &mut [Option<NonNull<u8>>]) -> usize {
        // One empty slot: straight to the single fast path, as `alloc_bulk` sends one frame,
        // without counting and finding the empty slots first; inlined into the caller, as
        // the single path is (a call with the whole bulk path behind it measured 1.22-1.72
        // times a single pair, inlined 1.14-1.20).
        if let [slot @ None] = array {
            if let Some(p) = self.alloc_order0_fast(Some(VmEvent::AllocBulk)) {
                *slot = Some(p);
                return 1;
            }
        }
        self.alloc_pages_bulk_array_many(gfp, array)
    }

    /// [`Zonal::alloc_pages_bulk_array`] past the one-slot fast path.
    fn alloc_pages_bulk_array_many(&self, gfp: Gfp, array: &mut [Option<NonNull<u8>>]) -> usize {
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
        list.reserve(nr.min(self.mem.lowmem_pages));
        self.alloc_bulk(gfp, nr, |p| list.push(p))
    }

    /// The bulk allocator (`__alloc_pages_bulk`): take up to `nr` frames from this CPU's
    /// order-0 list of the first usable zone, under one pcp lock, with the accounting done
    /// once. Falls back to the single-page path, as Linux does, when one frame is wanted, when
    /// the first usable zone is on another node than the preferred one, when the lists are
    /// busy, or when the zone had nothing for the lists.
    pub(super) fn alloc_bulk(&self, gfp: Gfp, nr: usize, mut put: impl FnMut(NonNull<u8>)) -> usize {
        if nr == 0 {
            return 0;
        }
        // One frame, or a few (`SMALL_BULK`): the single fast path for each, the call counted
        // with the first on the CPU it ran on, so a one-frame call costs what a single
        // allocation does (Linux sends N = 1 to the single path too, before any set-up of its
        // own) and a few frames cost no more than as many single allocations. A few only
        // under the per-CPU NUMA statistics, where a frame's counts are its section's and
        // cost nothing: under the other strategies each frame would charge its own, where
        // the bulk path charges once per call (seed 002).
        let mut done = 0;
        if nr == 1 || (nr <= SMALL_BULK && self.key.load().numa() <= NUMA_ON_PERCPU) {
            while let Some(p) = self.alloc_order0_fast((done == 0).then_some(VmEvent::AllocBulk)) {
                put(p);
                done += 1;
                if done == nr {
                    return nr;
                }
            }
        }
        // The rest: the call was counted if a frame came above.
        done + self.alloc_bulk_rest(gfp, nr - done, done > 0, put)
    }

    /// [`Zonal::alloc_bulk`] past the single fast path: `nr` frames, the call counted
    /// (`alloc_bulk`) unless `counted`, the fast path not tried again for one frame.
    fn alloc_bulk_rest(&self, gfp: Gfp, nr: usize, counted: bool, mut put: impl FnMut(NonNull<u8>)) -> usize {
        // In a forked child: nothing, before any lock (`Zonal::check_not_forked` says why).
        if self.inherited() {
            return 0;
        }
        let cpu = self.current_cpu();
        if !counted {
            self.count_event(cpu, VmEvent::AllocBulk, 1);
        }
        if nr == 1 {
            // The fast path just failed: the general path, without trying it again.
            return self.alloc_pages_general(gfp, 0).map(&mut put).is_ok() as usize;
        }
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
        if !self.cpus.pcp_enabled {
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
            let zone = ctx.zonelist.iter().map(|z| &self.mem.zones[z.0 as usize]).find(|z| {
                ctx.nodemask.is_none_or(|m| m.contains(z.node))
                    && (ctx.no_watermarks
                        || z.watermark_ok_fast(Order(0), z.watermark(Watermark::Low).saturating_add(nr), ctx.high))
            });
            let zone = zone.filter(|z| z.node == preferred)?;
            let mut g = self.pcp(cpu, zone.id).try_lock(zone)?;
            g.keep_small_caches();
            let mut n = 0;
            let mut refills = 0;
            g.with(|p| {
                while n < nr {
                    if p.list_len(Order(0)) == 0 {
                        refills += 1;
                    }
                    let Some(pfn) = pcp::rmqueue_pcplist(zone, p, Order(0)) else { break };
                    zone.state(pfn).store(mem_map::state(ALLOCATED, Order(0)), Ordering::Release);
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
                self.count_pages(cpu, zone.id, false, each);
                if self.key.load().numa() != 0 {
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
    pub(super) fn alloc_bulk_cached(&self, nr: usize, put: &mut impl FnMut(NonNull<u8>)) -> usize {
        let Some(rseq) = self.rseq_off() else { return 0 };
        let Some((cpu, z)) = self.local_fast_zone(rseq, nr) else { return 0 };
        let table = self.rseq_table(rseq);
        let states = self.mem.map.states();
        let mut buf = [const { MaybeUninit::uninit() }; BULK_CHUNK];
        let mut n = 0;
        let mut left = nr;
        while left > 0 {
            let want = left.min(BULK_CHUNK);
            // SAFETY: the table is this thread's rseq area and this handle's lists, which
            // outlive the call; `z` is one of this handle's zones.
            let popped = unsafe { pcp::rseq::pop_many(&table, z.id.0 as usize, &mut buf[..want]) };
            let k = popped.len();
            for pfn in popped.iter().map(|&p| Pfn(p)).filter(|&pfn| take_cached(states, pfn)) {
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

    /// Frees many order-0 frames; each is checked as by [`Zonal::free_pages`]. Every valid
    /// frame is freed, under one pcp lock (or one critical section) per zone run, and the
    /// accounting is done once. On error the others are still freed and the first bad entry
    /// is reported with its index.
    ///
    /// The pages may be given as the bulk calls hand them out ([`BulkPage`]): raw pointers,
    /// the list form's `NonNull`s, or the array form's slots, whose empty ones are skipped
    /// (neither freed nor an error), so an array filled by
    /// [`Zonal::alloc_pages_bulk_array`] goes back as it is.
    #[inline(always)]
    pub fn free_pages_bulk<P: BulkPage>(&self, pages: &[P]) -> std::result::Result<usize, (usize, Error)> {
        if let [p] = pages {
            // One frame: the single-page path is the shorter one.
            return match p.page_addr() {
                Some(a) => self.free_pages(a as *mut u8, 0).map(|_| 1).map_err(|e| (0, e)),
                None => Ok(0),
            };
        }
        if pages.len() <= SMALL_BULK && self.rseq_off().is_some() {
            return self.free_pages_bulk_few(pages);
        }
        self.free_pages_bulk_many(pages)
    }

    /// [`Zonal::free_pages_bulk`] of a few pages (`SMALL_BULK`) with restartable sequences:
    /// each through the single fast path, which counts it in its section, as the bulk path
    /// would have counted them all once; the same checks, the same errors.
    fn free_pages_bulk_few<P: BulkPage>(&self, pages: &[P]) -> std::result::Result<usize, (usize, Error)> {
        let mut freed = 0;
        let mut first_err = None;
        for (i, a) in pages.iter().enumerate().filter_map(|(i, p)| Some((i, p.page_addr()?))) {
            match self.free_pages(a as *mut u8, 0) {
                Ok(()) => freed += 1,
                Err(e) => {
                    first_err.get_or_insert((i, e));
                }
            }
        }
        first_err.map_or(Ok(freed), Err)
    }

    /// [`Zonal::free_pages_bulk`] of more than one page.
    fn free_pages_bulk_many<P: BulkPage>(&self, pages: &[P]) -> std::result::Result<usize, (usize, Error)> {
        // In a forked child every entry is refused: the first is reported. The refusal out
        // of line, so that the loop below keeps its registers (with the error built here,
        // inlined into the caller, 128-page bulk rounds measured 18% slower).
        if self.inherited() {
            return self.free_bulk_forked(pages);
        }
        let cpu = self.current_cpu();
        let rseq = self.rseq_off();
        // Frames bound for the rseq cache are claimed straight to its tag.
        let to = if rseq.is_some() { mem_map::state(mem_map::PCP, Order(0)) } else { mem_map::NONE };
        // A claim to `NONE` goes straight to the locked lists or the buddy, which must never
        // get a frame twice: a CAS, whatever `free_check` says (this is the locked path, where
        // the CAS is a small part of the cost). Only the claim to the cache's tag may be a
        // load and a store: every way out of the cache claims again (`unpush`, the drain).
        let atomic = self.free_check_atomic() || rseq.is_none();
        let states = self.mem.map.states();
        let mut first_err = None;
        let mut freed = 0usize;
        // Runs of frames of one zone, freed together.
        let mut run = ArrayVec::<usize, FREE_RUN>::new();
        let mut i = 0;
        while i < pages.len() {
            // A run starts at a frame checked in full.
            let Some(addr) = pages[i].page_addr() else {
                i += 1;
                continue;
            };
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
            let base = self.mem.arena.pfn_to_addr(z.start_pfn);
            let bytes = z.spanned << PAGE_SHIFT;
            while let Some(p) = pages.get(i).filter(|_| !run.is_full()).and_then(|p| p.page_addr()) {
                let off = p.wrapping_sub(base);
                if off >= bytes || off % PAGE_SIZE != 0 {
                    break;
                }
                let pfn = Pfn(z.start_pfn.0 + (off >> PAGE_SHIFT));
                // A failure changes nothing: the outer loop checks the frame again, in full.
                if mem_map::try_claim_order0(&states[pfn.0], to, atomic).is_err() {
                    break;
                }
                run.push(pfn.0);
                i += 1;
            }
            freed += run.len();
            self.count_pages(cpu, z.id, true, run.len() as u64);
            self.free_run(cpu, rseq, z, &run);
            run.clear();
        }
        match first_err {
            None => Ok(freed),
            Some(e) => Err(e),
        }
    }

    /// [`Zonal::free_pages_bulk`] in a forked child: nothing freed, the first entry reported.
    #[cold]
    #[inline(never)]
    fn free_bulk_forked<P: BulkPage>(&self, pages: &[P]) -> std::result::Result<usize, (usize, Error)> {
        Err((pages.iter().position(|p| p.page_addr().is_some()).unwrap_or(0), self.forked_error()))
    }

    /// Frees claimed order-0 frames of one zone: as many as fit onto this CPU's rseq cache in
    /// one critical section (with `rseq`, they were claimed to the cache's tag), the rest
    /// onto the lists under one lock, or to the buddy when the lists are off or busy. Frames
    /// of runs another CPU owns go to this CPU's outbox instead of its cache (one more
    /// section), on their way back to their owners, as the single free's do.
    pub(super) fn free_run(&self, cpu: usize, rseq: Option<isize>, z: &Zone, pfns: &[usize]) {
        let Some(rseq) = rseq else {
            let rest: ArrayVec<Pfn, FREE_RUN> = pfns.iter().map(|&p| Pfn(p)).collect();
            return self.free_claimed(cpu, z, &rest, Order(0));
        };
        let table = self.rseq_table(rseq);
        let zone = z.id.0 as usize;
        // The run's frames come from one CPU's refill, mostly: its owner looked up once per
        // run of `RUN_ORDER` frames. Only on the CPU's local zone, whose lists route frees
        // (`PcpInner::routes`): another zone's frames go onto this CPU's cache of that zone,
        // as the single free's section does.
        let local = self.cpus.local_zone.get(cpu) == Some(&z.id.0);
        let mine = cpu as u16;
        let mut last = (usize::MAX, mine);
        let mut owned = |pfn: usize| {
            if pfn >> mem_map::RUN_ORDER.0 != last.0 {
                last = (pfn >> mem_map::RUN_ORDER.0, z.run_owner(Pfn(pfn)));
            }
            last.1 == mine
        };
        let (rest, pushed): (ArrayVec<usize, FREE_RUN>, usize) = if !local || pfns.iter().all(|&p| owned(p)) {
            // SAFETY: `rseq` places this thread's rseq area, the table this handle's lists,
            // which outlive the call; `z` is one of this handle's zones.
            let k = unsafe { pcp::rseq::push_many(&table, zone, pfns) };
            (pfns[k..].iter().copied().collect(), k)
        } else {
            let (own, foreign): (ArrayVec<usize, FREE_RUN>, ArrayVec<usize, FREE_RUN>) =
                pfns.iter().copied().partition(|&p| owned(p));
            // SAFETY: as above.
            let (k, f) = unsafe {
                (pcp::rseq::push_many(&table, zone, &own), pcp::rseq::push_outbox_many(&table, zone, &foreign))
            };
            (own[k..].iter().chain(&foreign[f..]).copied().collect(), k + f)
        };
        if pushed == pfns.len() {
            return;
        }
        // The frames were claimed to the cache's tag: back to "claimed" for the locked path,
        // as in free_order0_fast, keeping those no racer took meanwhile.
        let rest: ArrayVec<Pfn, FREE_RUN> = rest.iter().map(|&p| Pfn(p)).filter(|&pfn| unpush(z, pfn)).collect();
        self.free_claimed(cpu, z, &rest, Order(0));
    }
}
