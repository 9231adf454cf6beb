//! Regions of balanced memory: first touch and placement, pins, and teardown.

use crate::table::{BUSY, HINT, PRESENT, UNMAPPED};
use crate::{fault, os, Error, RegionShared, Result, CHUNK_PAGES, PAGE};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use zonal::{MemPolicy, NodeId};

/// The largest region: 1 TiB.
pub const MAX_REGION_BYTES: usize = 1 << 40;

/// A region of balanced memory (see the crate's docs). Dropping it frees every frame.
pub struct Region {
    pub(crate) shared: Arc<RegionShared>,
}

pub(crate) fn allowed(policy: &MemPolicy, nid: u16) -> bool {
    match policy {
        MemPolicy::Bind(m) => m.contains(NodeId(nid)),
        _ => true,
    }
}

impl RegionShared {
    /// Runs of pages mapped as one (consecutive frames with the same access), what the
    /// region adds to the process's mappings (`vm.max_map_count`) at most. The access that
    /// splits a mapping is the protection under mprotect (a hidden page is `PROT_NONE`), and
    /// the registration under userfaultfd (a hidden page is only zapped, in a mapping that
    /// the kernel merges with its neighbours' when both are registered or both are not).
    pub(crate) fn vma_runs(&self) -> usize {
        let mut runs = 0;
        let mut prev: Option<(usize, u8)> = None;
        let uffd = self.bal.uffd.is_some();
        for e in self.entries.iter() {
            let f = e.frame.load(Ordering::Relaxed);
            let s = e.state.load(Ordering::Relaxed);
            let class = match uffd {
                true => 1 + e.unregistered.load(Ordering::Relaxed) as u8,
                false if s == PRESENT => 1,
                false => 2,
            };
            let cur = (f != 0).then_some((f, class));
            match (prev, cur) {
                (Some((pf, pc)), Some((f, c))) if f == pf + PAGE && c == pc => {}
                (_, Some(_)) => runs += 1,
                _ => {}
            }
            prev = cur;
        }
        runs
    }
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// `n` consecutive frames (a power of two up to `CHUNK_PAGES`) of node `nid`, zeroed,
    /// for a first-touch window: carved from the region's current block of that node, or a
    /// new one from the node's reserve of blocks (whose frames the old block had left go to
    /// be freed). Lock-free (a CAS on the carve word) and async-signal-safe; `None` when
    /// the node has no block.
    pub(crate) fn carve(&self, nid: u16, n: usize) -> Option<usize> {
        const BLOCK: usize = CHUNK_PAGES * PAGE;
        let w = &self.carve[nid as usize];
        loop {
            let cur = w.load(Ordering::Acquire);
            let (blk, used) = (cur & !(BLOCK - 1), cur & (BLOCK - 1));
            if blk != 0 && used + n <= CHUNK_PAGES {
                if w.compare_exchange(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    return Some(blk + used * PAGE);
                }
                continue;
            }
            let new = self.bal.block_for(nid)?;
            if new % BLOCK != 0 {
                // Not aligned (an arena aligned below 2 MiB): the word cannot hold it.
                (0..CHUNK_PAGES).for_each(|i| self.bal.give_back(new + i * PAGE));
                return None;
            }
            if w.compare_exchange(cur, new | n, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                if self.bal.blocks[nid as usize].put(new).is_err() {
                    (0..CHUNK_PAGES).for_each(|i| self.bal.give_back(new + i * PAGE));
                }
                continue;
            }
            // The old block's frames nobody took: the CAS made them this thread's.
            for i in used..CHUNK_PAGES {
                if blk != 0 {
                    self.bal.give_back(blk + i * PAGE);
                }
            }
            return Some(new);
        }
    }

    #[inline]
    pub(crate) fn contains(&self, addr: usize) -> bool {
        addr.wrapping_sub(self.start) < self.entries.len() * PAGE
    }

    /// The node a first touch of page `idx` takes its frame from, by the policy and the
    /// touching CPU (first-touch placement).
    pub(crate) fn place(&self, idx: usize) -> u16 {
        let here = self.bal.z.local_node().0;
        match &self.policy {
            MemPolicy::Local => here,
            MemPolicy::Preferred(n) => n.0,
            MemPolicy::Bind(m) => {
                if m.contains(NodeId(here)) {
                    here
                } else {
                    self.fallback[here as usize].first().copied().unwrap_or(here)
                }
            }
            MemPolicy::Interleave(m) => interleave(m, idx),
        }
    }

    /// Where a hint fault from a CPU of node `here` would move page `idx`
    /// (`mpol_misplaced`): the faulting CPU's node under the local policy and a bind that
    /// allows it; the preferred node; the page's interleave node.
    pub(crate) fn target(&self, idx: usize, here: u16) -> Option<u16> {
        match &self.policy {
            MemPolicy::Local => Some(here),
            MemPolicy::Preferred(n) => Some(n.0),
            MemPolicy::Bind(m) => m.contains(NodeId(here)).then_some(here),
            MemPolicy::Interleave(m) => Some(interleave(m, idx)),
        }
    }
}

/// The node of an interleaved page: the (page index mod nodes)-th node of the mask, as
/// Linux interleaves a mapping by page offset.
fn interleave(m: &zonal::NodeMask, idx: usize) -> u16 {
    let n = m.iter().count().max(1);
    m.iter().nth(idx % n).map_or(0, |x| x.0)
}

impl RegionShared {
    /// Ends the region now, whoever still holds a reference: no handler inside it any more
    /// (unregistered), no scan of it (the scan lock, and the mark `dead` the scanner checks),
    /// the range unmapped and every frame back with zonal. Idempotent.
    fn teardown(&self) {
        // In a child of fork() nothing here is the child's (see `fault::in_child`).
        if fault::forked() {
            return;
        }
        {
            // Marked dead under the lock, then let go: the scanner and the collapse check
            // the mark under it, and the work below (an unmap and a free per frame, seconds
            // for a region of gigabytes) must not hold up the balancer's thread, whose
            // refills the other regions' first touches wait for.
            let mut dead = self.scan_lock.lock().unwrap_or_else(|p| p.into_inner());
            if *dead {
                return;
            }
            *dead = true;
            self.dead.store(true, Ordering::Release);
        }
        let slot = self.slot.load(Ordering::Relaxed);
        if slot != usize::MAX {
            fault::unregister(slot);
        }
        // SAFETY: no handler is inside the region (unregistered), the scanner and the collapse
        // cannot touch it (marked dead under the lock they check it under), and its owner
        // gave up its pointer.
        unsafe { os::unmap(self.start, self.entries.len() * PAGE) };
        for e in self.entries.iter() {
            let f = e.frame.swap(0, Ordering::Relaxed);
            if f != 0 {
                self.bal.free_frame(f);
            }
        }
        self.free_dests();
        for w in self.carve.iter() {
            let cur = w.swap(0, Ordering::AcqRel);
            let (blk, used) = (cur & !(CHUNK_PAGES * PAGE - 1), cur & (CHUNK_PAGES * PAGE - 1));
            if blk != 0 {
                self.bal.free_block_from(blk, used);
            }
        }
        if self.ft_order > 0 {
            self.bal.ft_regions.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for RegionShared {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.shared.teardown();
    }
}

impl Region {
    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.shared.start as *mut u8
    }

    /// Bytes in the region (whole pages).
    pub fn len(&self) -> usize {
        self.shared.entries.len() * PAGE
    }

    /// Whether the region is empty (never: a region has at least a page).
    pub fn is_empty(&self) -> bool {
        self.shared.entries.is_empty()
    }

    /// The policy.
    pub fn policy(&self) -> &MemPolicy {
        &self.shared.policy
    }

    #[inline]
    fn page_of(&self, addr: *const u8) -> Result<usize> {
        let a = addr as usize;
        if !self.shared.contains(a) {
            return Err(Error::OutOfRange { addr: a });
        }
        Ok((a - self.shared.start) / PAGE)
    }

    /// The node of the frame behind `addr`, `None` while the page has none. Inline: a
    /// program may ask it per access (the benches' penalty emulation does).
    #[inline]
    pub fn page_to_nid(&self, addr: *const u8) -> Result<Option<NodeId>> {
        let e = &self.shared.entries[self.page_of(addr)?];
        let f = e.frame.load(Ordering::Acquire);
        if f == 0 {
            return Ok(None);
        }
        Ok(Some(self.shared.bal.z.page_to_nid(f as *const u8)?))
    }

    /// Pages with a frame, per node.
    pub fn node_pages(&self) -> Vec<usize> {
        let mut v = vec![0; self.shared.bal.z.topology().nr_nodes()];
        for e in self.shared.entries.iter() {
            let f = e.frame.load(Ordering::Acquire);
            if let (true, Ok(n)) = (f != 0, self.shared.bal.z.page_to_nid(f as *const u8)) {
                v[n.0 as usize] += 1;
            }
        }
        v
    }

    /// The pages `offset..offset + len` covers, checked to lie in the region and not empty.
    fn pages_of(&self, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
        if len == 0 {
            return Err(Error::InvalidSize { bytes: 0 });
        }
        let end = offset.checked_add(len).filter(|&e| e <= self.len()).ok_or(Error::OutOfRange { addr: offset })?;
        Ok(offset / PAGE..end.div_ceil(PAGE))
    }

    /// Gives every page of `offset..offset + len` a frame now and makes it accessible, from
    /// the calling thread. The scanner may hide the pages again at its next pass: for memory
    /// the kernel reads or writes (system call buffers), use [`Region::pin`].
    pub fn prefault(&self, offset: usize, len: usize) -> Result<()> {
        if fault::forked() {
            return Err(Error::Forked);
        }
        let pages = self.pages_of(offset, len)?;
        let _signals = os::SignalsBlocked::new();
        pages.into_iter().try_for_each(|idx| self.shared.make_present(idx))
    }

    /// Pins the pages of `offset..offset + len` until the guard is dropped: each is given a
    /// frame now if it has none, made accessible, and left so (the scanner never hides it,
    /// no migration or collapse moves it) while any pin on it lasts. Pins nest.
    ///
    /// Required for memory the kernel keeps using past a system call, which it reaches
    /// through the frame and not the mapping: io_uring registered (fixed) buffers, O_DIRECT
    /// and AIO buffers, `vmsplice`d pages, RDMA memory registrations. Moving such a page
    /// would leave the kernel writing into the old frame. Plain `read(2)`/`write(2)` buffers
    /// need a pin (or a stopped scanner) under the `mprotect` and `userfaultfd` backends,
    /// where a system call touching a hidden page fails with `EFAULT`; the
    /// `userfaultfd-thread` backend serves such accesses itself.
    pub fn pin(&self, offset: usize, len: usize) -> Result<Pin<'_>> {
        self.pin_pages(offset, len)?;
        Ok(Pin { region: self, offset, len })
    }

    /// [`Region::pin`] without a guard (the C ABI's `zonal_region_pin`): each call is undone
    /// by one [`Region::unpin`] of the same range. On an error nothing stays pinned.
    pub fn pin_pages(&self, offset: usize, len: usize) -> Result<()> {
        if fault::forked() {
            return Err(Error::Forked);
        }
        let pages = self.pages_of(offset, len)?;
        let _signals = os::SignalsBlocked::new();
        let r = &self.shared;
        for idx in pages.clone() {
            let e = &r.entries[idx];
            // The count first, then the state (see `table`): a claimer after this sees it.
            let raised = e.pins.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_add(1)).is_ok();
            let res = match raised {
                true => r.make_present(idx),
                false => Err(Error::InvalidConfig(format!("page {idx} of the region holds 2^32-1 pins already"))),
            };
            if let Err(err) = res {
                if raised {
                    e.pins.fetch_sub(1, Ordering::SeqCst);
                }
                for j in pages.start..idx {
                    r.entries[j].pins.fetch_sub(1, Ordering::SeqCst);
                }
                return Err(err);
            }
        }
        Ok(())
    }

    /// Drops one pin from each page of `offset..offset + len`. A page that holds none is an
    /// error ([`Error::NotPinned`]), and then nothing changes.
    pub fn unpin(&self, offset: usize, len: usize) -> Result<()> {
        if fault::forked() {
            return Err(Error::Forked);
        }
        let pages = self.pages_of(offset, len)?;
        let r = &self.shared;
        for idx in pages.clone() {
            let dropped = r.entries[idx].pins.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if dropped.is_err() {
                for j in pages.start..idx {
                    r.entries[j].pins.fetch_add(1, Ordering::SeqCst);
                }
                return Err(Error::NotPinned { addr: r.start + idx * PAGE });
            }
        }
        Ok(())
    }

    /// Runs of pages mapped as one (consecutive frames with the same access), what the
    /// region adds to the process's mappings (`vm.max_map_count`) at most.
    pub fn vma_runs(&self) -> usize {
        self.shared.vma_runs()
    }

    /// Pages first touched together as one window (`2^order`; 1 when the region touches
    /// page by page): chosen from the region's size and the mapping budget.
    pub fn first_touch_pages(&self) -> usize {
        1 << self.shared.ft_order
    }
}

/// Pins on pages of a region ([`Region::pin`]), dropped with the guard.
#[must_use = "the pages are unpinned when the guard is dropped"]
pub struct Pin<'a> {
    region: &'a Region,
    offset: usize,
    len: usize,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        // The guard's own pins: the unpin cannot find a page without one.
        let _ = self.region.unpin(self.offset, self.len);
    }
}

impl RegionShared {
    /// Makes page `idx` `PRESENT`, from a thread (not a signal handler): a first touch when
    /// it has no frame, its mapping back when it is hidden, a wait while another thread
    /// changes it.
    fn make_present(&self, idx: usize) -> Result<()> {
        let e = &self.entries[idx];
        loop {
            match e.state.load(Ordering::SeqCst) {
                PRESENT => return Ok(()),
                UNMAPPED if e.claim(UNMAPPED) => self.first_touch(idx)?,
                HINT if e.claim(HINT) => {
                    // SAFETY: a mapped page of this region, claimed.
                    let res = unsafe { self.reveal(self.start + idx * PAGE, PAGE) };
                    e.release(if res.is_ok() { PRESENT } else { HINT });
                    res.map_err(|errno| Error::Os { call: "mprotect", errno })?;
                }
                BUSY => std::thread::yield_now(),
                _ => {}
            }
        }
    }
}
