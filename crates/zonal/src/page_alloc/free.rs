//! Free (`free_pages`, `free_unref_page`, `free_one_page`, mm/page_alloc.c): the block is
//! checked and claimed (`crate::mem_map`), then returned to this CPU's lists or the buddy.
//!
//! Locking: a pcp try-lock, or the zone lock alone; a claim exactly one racer wins precedes
//! every move into the lists or the buddy, so they never hold a frame twice.

use super::*;

impl Zonal {
    /// Frees a block given its address and order (`free_pages`). Checks, in order: the order,
    /// that zonal owns the address, its alignment, and that a live block of exactly this order
    /// starts there. Any failure leaves everything as it was.
    ///
    /// Orders 0 to 3 and 9 try their restartable sequences here, every other call of which
    /// is a tail call, so the path saves no register; everything else runs on the locked
    /// path.
    #[inline(always)]
    pub fn free_pages(&self, addr: *mut u8, order: u32) -> Result<()> {
        let key = self.key.load();
        if let Some(rseq) = key.rseq() {
            if order == 0 {
                return self.free_order0_fast(key, rseq, addr as usize);
            }
            if order.wrapping_sub(1) < pcp::PCP_MAX_ORDER as u32 || order == PCP_THP_ORDER.0 as u32 {
                return self.free_small_fast(key, rseq, addr as usize, Order(order as u8));
            }
        }
        self.free_pages_general(addr, order)
    }

    /// Splits a block of `order` at `addr` into `2^order` order-0 frames, each then freed on
    /// its own (`split_page`); for a layer that takes a large block and hands out or frees
    /// its frames one by one (NUMA balancing's contiguous reserves). The same checks as
    /// [`Zonal::free_pages`]; a failure changes nothing.
    pub fn split_pages(&self, addr: *mut u8, order: u32) -> Result<()> {
        self.check_forked()?;
        let order = self.check_order(order)?;
        let (zone, pfn) = self.addr_to_zone(addr as usize, order)?;
        mem_map::split(zone, pfn, order)
    }

    /// Marks the allocated block of `order` at `addr` held: from now on no plain free
    /// ([`Zonal::free_pages`], [`Zonal::free_pages_bulk`], C's `zonal_free_pages`) frees it;
    /// each is refused with [`Error::Held`] and changes nothing, and only
    /// [`Zonal::free_held`] (unsafe: its caller is the holder) frees it. For a layer built on
    /// zonal whose own unsafe code relies on frames it keeps (reserves, free stacks linked
    /// through the frames, the frames behind its pages): safe code given the handle can no
    /// longer free them under it. Reports, [`Zonal::check_invariants`] and
    /// [`Zonal::split_pages`] treat a held block as allocated (a split keeps every frame
    /// held). The same checks as [`Zonal::free_pages`], whose errors a block that is not a
    /// live block of this order gets; a block already held gets [`Error::Held`].
    ///
    /// A hold is a CAS on the block's head, which the fast free's claim, under the default
    /// `free_check = sequential` a load and a store, does not exclude: a free of the block
    /// racing with its hold (a free by code that does not own the block, at the instant its
    /// owner holds it: the caller's data race, as a racing double free is) can still pass.
    /// Under `free_check = atomic` every claim is a CAS and exactly one of them wins.
    pub fn hold(&self, addr: *mut u8, order: u32) -> Result<()> {
        self.check_forked()?;
        let order = self.check_order(order)?;
        let (zone, pfn) = self.addr_to_zone(addr as usize, order)?;
        mem_map::hold(zone, pfn, order)
    }

    /// Takes back a hold ([`Zonal::hold`]): the block is a plain allocated block again,
    /// which any free may free. [`Error::NotHeld`] for a live block that is not held, the
    /// errors of [`Zonal::free_pages`] for anything else; nothing changes then.
    ///
    /// # Safety
    /// The caller is the layer that holds the block, and nothing else relies on its staying
    /// held (the hold protects that layer's own unsafe code from safe frees).
    pub unsafe fn unhold(&self, addr: *mut u8, order: u32) -> Result<()> {
        self.check_forked()?;
        let order = self.check_order(order)?;
        let (zone, pfn) = self.addr_to_zone(addr as usize, order)?;
        mem_map::unhold(zone, pfn, order)
    }

    /// Frees a held block of `order` at `addr` ([`Zonal::hold`]), as [`Zonal::free_pages`]
    /// frees a live one: the claim (`ALLOCATED|HELD|order -> NONE`, a CAS that one of racing
    /// frees wins), then this CPU's lists or the buddy, on the locked path. A second free of
    /// it is [`Error::DoubleFree`]; a live block that is not held, [`Error::NotHeld`]; any
    /// other bad free, the error [`Zonal::free_pages`] gives. A failure changes nothing.
    ///
    /// # Safety
    /// The caller is the layer that held the block, and frees each hold once: a hold exists
    /// so that no other code frees the block while that layer's code relies on it.
    pub unsafe fn free_held(&self, addr: *mut u8, order: u32) -> Result<()> {
        self.check_forked()?;
        let order = self.check_order(order)?;
        let (zone, pfn) = self.addr_to_zone(addr as usize, order)?;
        mem_map::claim_held(zone, pfn, order)?;
        let cpu = self.current_cpu();
        self.free_claimed(cpu, zone, &[pfn], order);
        self.count_pages(cpu, zone.id, true, order.pages() as u64);
        Ok(())
    }

    /// [`Zonal::free_pages`] past the restartable sequences (and where they give way): the
    /// locked path, out of line, so that its prologue's saved registers stay off theirs.
    #[inline(never)]
    pub(super) fn free_pages_general(&self, addr: *mut u8, order: u32) -> Result<()> {
        self.free_pages_locked(addr, order)
    }

    /// The free every check and claim of which runs here, with the error, and whose block
    /// goes to the lists under their lock or to the buddy (also where the fast paths give
    /// way).
    #[inline(always)]
    pub(super) fn free_pages_locked(&self, addr: *mut u8, order: u32) -> Result<()> {
        self.free_locked_on(addr, order, || self.current_cpu())
    }

    /// [`Zonal::free_pages_locked`] on the lists of the CPU `cpu` names once the block is
    /// claimed: the CPU the thread runs on, or the one it acts as ([`Zonal::act_as_cpu`]).
    #[inline(always)]
    pub(super) fn free_locked_on(&self, addr: *mut u8, order: u32, cpu: impl FnOnce() -> usize) -> Result<()> {
        self.check_forked()?;
        let order = self.check_order(order)?;
        let (zone, pfn) = self.addr_to_zone(addr as usize, order)?;
        claim(zone, pfn, order)?;
        let cpu = cpu();
        self.free_claimed(cpu, zone, &[pfn], order);
        self.count_pages(cpu, zone.id, true, order.pages() as u64);
        Ok(())
    }

    /// Returns claimed blocks of one zone and order (head state `NONE`) to this CPU's lists
    /// under one lock, or to the buddy lists for a large order or when the lists are off or
    /// busy (`free_unref_page` / `free_one_page`). The order-0 cache is for the callers that
    /// can use a restartable sequence (`free_order0_fast`, `free_run`).
    #[inline]
    pub(super) fn free_claimed(&self, cpu: usize, zone: &Zone, pfns: &[Pfn], order: Order) {
        if pcp::pcp_allowed(order) && self.cpus.pcp_enabled {
            if let Some(drained) = self.pcp_give(cpu, zone, pfns, order) {
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
}

/// Returns a claimed block (head state `NONE`) to its zone's buddy lists; the buddy refuses
/// a block that is already free (see `Buddy::free_one`).
#[inline]
pub(super) fn free_one_page(z: &Zone, pfn: Pfn, order: Order) {
    let mut l = z.lock();
    l.buddy().free_one(pfn, order);
    drop(l);
    debug_vm_check(z);
}

/// With the `debug-vm` feature, checks the zone's free lists after a buddy operation
/// ([`Zone::debug_check_free_area`], O(free blocks)) and stops at the first broken invariant,
/// as `VM_BUG_ON` does: a corrupted free list must not hand out memory. Nothing without it.
#[inline(always)]
pub(super) fn debug_vm_check(z: &Zone) {
    #[cfg(feature = "debug-vm")]
    if let Err(e) = z.debug_check_free_area() {
        panic!("debug-vm: {e}");
    }
    let _ = z;
}
