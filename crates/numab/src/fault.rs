//! The fault handler: first touch and NUMA hint faults on region pages, taken in the faulting
//! thread from `SIGSEGV` (first touch, and hints of the mprotect backend) or `SIGBUS`
//! (userfaultfd MINOR faults on zapped pages), and chained to the handler that was there
//! before for every other fault.
//!
//! Kernel counterpart: `do_numa_page` (mm/memory.c) with the seed's delayed mapping, and
//! `do_anonymous_page`/`do_shared_fault` for the first touch.
//!
//! Signal safety: the handler takes no lock and touches no heap. It finds its region in a
//! fixed table of atomic slots (a slot's users count keeps the region alive while a handler
//! is inside it), takes frames from the per-node reserves, pushes frames to free onto a
//! lock-free stack, reads zonal's tables through `&Zonal` methods that read atomics only, and
//! makes raw system calls (`mmap`, `mprotect`, `sched_yield`, `futex`, `gettid`).

use crate::os::{self, PAGE};
use crate::table::{should_migrate, Cpupid, PageEntry, BUSY, HINT, PRESENT, UNMAPPED};
use crate::{MigrateMode, RegionShared};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Regions registered at once, process-wide.
pub const MAX_REGIONS: usize = 256;

struct Slot {
    region: AtomicPtr<RegionShared>,
    /// Handlers inside this slot's region right now.
    users: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot { region: AtomicPtr::new(std::ptr::null_mut()), users: AtomicUsize::new(0) };
static SLOTS: [Slot; MAX_REGIONS] = [EMPTY; MAX_REGIONS];
/// Slots in use (the handler stops looking past the last one ever used).
static HIGH_WATER: AtomicUsize = AtomicUsize::new(0);

/// The `SIGSEGV` and `SIGBUS` actions before ours, to chain to.
static PREVIOUS_SEGV: OnceLock<libc::sigaction> = OnceLock::new();
static PREVIOUS_BUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Installs the handler for both signals once per process (keeping the previous ones to
/// chain to).
pub fn install() -> Result<(), i32> {
    for (sig, prev) in [(libc::SIGSEGV, &PREVIOUS_SEGV), (libc::SIGBUS, &PREVIOUS_BUS)] {
        let mut err = 0;
        prev.get_or_init(|| {
            // SAFETY: zeroed sigaction structs are valid (empty masks, no flags); sigaction
            // reads `act` and writes `old`, both valid for the call.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_fault as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut act.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &act, &mut old) != 0 {
                    err = os::errno();
                }
                old
            }
        });
        if err != 0 {
            return Err(err);
        }
    }
    Ok(())
}

/// Registers a region so that its faults come to it; `None` when every slot is taken.
pub fn register(r: *const RegionShared) -> Option<usize> {
    for (i, s) in SLOTS.iter().enumerate() {
        if s.region.compare_exchange(std::ptr::null_mut(), r as *mut _, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            HIGH_WATER.fetch_max(i + 1, Ordering::SeqCst);
            return Some(i);
        }
    }
    None
}

/// Unregisters a region and waits until no handler is inside it.
pub fn unregister(slot: usize) {
    let s = &SLOTS[slot];
    s.region.store(std::ptr::null_mut(), Ordering::SeqCst);
    // A handler either saw the slot empty, or raised `users` before our store and is seen
    // here (both sides SeqCst).
    while s.users.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
}

/// Runs `f` on the registered region that holds `addr`, if any, keeping it alive meanwhile.
fn with_region<R>(addr: usize, f: impl FnOnce(&RegionShared) -> R) -> Option<R> {
    let n = HIGH_WATER.load(Ordering::Acquire);
    for s in &SLOTS[..n] {
        s.users.fetch_add(1, Ordering::SeqCst);
        let r = s.region.load(Ordering::SeqCst);
        // SAFETY: as in `on_fault`: `users` held up keeps a registered region alive.
        if let Some(r) = unsafe { r.as_ref() }.filter(|r| r.contains(addr)) {
            let out = f(r);
            s.users.fetch_sub(1, Ordering::SeqCst);
            return Some(out);
        }
        s.users.fetch_sub(1, Ordering::SeqCst);
    }
    None
}

/// The node of the CPU thread `tid` of this process last ran on (field 39 of its
/// `/proc/self/task/<tid>/stat`), for faults a handler thread serves for another thread.
fn node_of_thread(bal: &crate::Shared, tid: u32) -> u16 {
    let cpu = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(36)?.parse::<u32>().ok()));
    match cpu {
        Some(c) => bal.z.topology().cpu_to_node(zonal::CpuId(c)).0,
        None => bal.z.local_node().0,
    }
}

/// Serves one fault read by the handler thread (the userfaultfd handler-thread backend): a
/// hint fault like the signal handler's, for the thread that took it (in user mode or in a
/// system call), then wakes it to retry.
pub(crate) fn serve_thread_fault(bal: &crate::Shared, f: crate::uffd::Fault) {
    let page = f.address & !(PAGE - 1);
    with_region(page, |r| {
        let idx = (page - r.start) / PAGE;
        let e = &r.entries[idx];
        loop {
            match e.state.load(Ordering::Acquire) {
                HINT if e.claim(HINT) => break r.hint_fault(idx, node_of_thread(bal, f.tid), f.tid),
                BUSY => os::yield_cpu(),
                HINT => {}
                _ => break,
            }
        }
    });
    if let Some(u) = &bal.uffd {
        u.wake(page, PAGE);
    }
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: errno is this thread's; the handler restores it so the interrupted code sees
    // no change.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    let n = HIGH_WATER.load(Ordering::Acquire);
    for s in &SLOTS[..n] {
        s.users.fetch_add(1, Ordering::SeqCst);
        let r = s.region.load(Ordering::SeqCst);
        // SAFETY: a registered region lives until `unregister` has seen `users` at zero,
        // and this handler holds `users` up.
        if let Some(r) = unsafe { r.as_ref() } {
            if r.contains(addr) {
                r.fault(addr);
                s.users.fetch_sub(1, Ordering::SeqCst);
                // SAFETY: as above.
                unsafe { *libc::__errno_location() = saved };
                return;
            }
        }
        s.users.fetch_sub(1, Ordering::SeqCst);
    }
    chain(sig, info, ctx);
}

/// Hands a fault that is not a region's to the previous handler; with none, restores the
/// default action, so returning re-runs the access and the process dies as it would have.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let prev = if sig == libc::SIGBUS { &PREVIOUS_BUS } else { &PREVIOUS_SEGV };
    let Some(old) = prev.get() else { return };
    let h = old.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // SAFETY: a zeroed sigaction with SIG_DFL is valid; sigaction is async-signal-safe.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
        return;
    }
    if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this type.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: without SA_SIGINFO the previous handler takes the signal number only.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

impl RegionShared {
    /// A fault on a page of this region, in the faulting thread.
    pub(crate) fn fault(&self, addr: usize) {
        let idx = (addr - self.start) / PAGE;
        let e = &self.entries[idx];
        loop {
            match e.state.load(Ordering::Acquire) {
                UNMAPPED if e.claim(UNMAPPED) => return self.first_touch(idx),
                HINT if e.claim(HINT) => return self.hint_fault(idx, self.bal.z.local_node().0, os::gettid()),
                // Mapped by another thread since this access faulted: run it again.
                PRESENT => return,
                // Another thread is changing the page: wait for it, then look again. Only
                // the thread that maps the page counts the fault.
                BUSY => os::yield_cpu(),
                _ => {}
            }
        }
    }

    /// Maps a frame of the node the policy picks onto a page touched for the first time.
    fn first_touch(&self, idx: usize) {
        let e = &self.entries[idx];
        let addr = self.start + idx * PAGE;
        let node = self.place(idx);
        let Some(frame) = self.bal.frame_for(node, &self.fallback[node as usize]) else {
            os::write_stderr(b"zonal-numab: no frame for a first touch on any allowed node (out of memory)\n");
            e.release(UNMAPPED);
            // SAFETY: raising a signal is async-signal-safe; SIGBUS is what the kernel sends
            // for a shared-memory fault it cannot back.
            unsafe {
                libc::signal(libc::SIGBUS, libc::SIG_DFL);
                libc::raise(libc::SIGBUS);
            }
            return;
        };
        // SAFETY: the page is this region's, claimed (BUSY): nothing else maps it now.
        if let Err(errno) = unsafe { self.map(addr, frame) } {
            self.bal.stats.map_fail.fetch_add(1, Ordering::Relaxed);
            self.bal.give_back(frame);
            os::write_stderr(b"zonal-numab: mmap of a first-touch page failed (vm.max_map_count?)\n");
            let _ = errno;
            e.release(UNMAPPED);
            // SAFETY: as above.
            unsafe {
                libc::signal(libc::SIGBUS, libc::SIG_DFL);
                libc::raise(libc::SIGBUS);
            }
            return;
        }
        e.frame.store(frame, Ordering::Relaxed);
        self.bal.stats.first_touch.fetch_add(1, Ordering::Relaxed);
        e.release(PRESENT);
    }

    /// A hint fault (`do_numa_page`) on page `idx` (claimed) by thread `tid` on a CPU of node
    /// `here`: counts it, decides, and maps the page back or moves it.
    fn hint_fault(&self, idx: usize, here: u16, tid: u32) {
        let e = &self.entries[idx];
        let addr = self.start + idx * PAGE;
        let st = &self.bal.stats;
        let frame = e.frame.load(Ordering::Relaxed);
        let z = &self.bal.z;
        let src = z.page_to_nid(frame as *const u8).map(|n| n.0).unwrap_or(here);
        st.hint_faults.fetch_add(1, Ordering::Relaxed);
        self.group.record(here, src);
        if src == here {
            st.hint_faults_local.fetch_add(1, Ordering::Relaxed);
        }
        self.bal.window_fault(src == here);
        let dst = self.target(idx, here);
        let early = self.scan_seq.load(Ordering::Relaxed) <= 4;
        // The decision records this fault as the page's last even when the page stays (as
        // `mpol_misplaced` calls `should_numa_migrate_memory` for local faults too), so the
        // two-stage filter sees where the page was used.
        let wanted = self.bal.enabled()
            && dst.is_some_and(|d| {
                should_migrate(e, Cpupid::new(here, tid), src, d, early, Some(&self.group)) && d != src
            });
        let Some(dst) = dst.filter(|_| wanted) else {
            return self.map_back(idx);
        };
        if !self.bal.has_room(dst) {
            st.fail_room.fetch_add(1, Ordering::Relaxed);
            return self.fail_and_map_back(idx);
        }
        if self.bal.over_budget.load(Ordering::Relaxed) {
            st.fail_vma.fetch_add(1, Ordering::Relaxed);
            return self.fail_and_map_back(idx);
        }
        let t0 = os::now_ns();
        if self.try_chunk(idx, src, dst, Cpupid::new(here, tid), t0) {
            return;
        }
        let eager = self.bal.mode() == MigrateMode::Eager;
        if eager {
            // The page is made accessible first, as before the seed: other threads use it
            // until it is taken away again for the copy, which is a second TLB flush.
            // SAFETY: a mapped page of this region, claimed.
            if unsafe { self.reveal_in_use(addr, PAGE) }.is_err() {
                return self.fail_and_map_back(idx);
            }
        }
        let Some(new) = self.bal.reserves[dst as usize].take(z.current_cpu()) else {
            st.fail_reserve.fetch_add(1, Ordering::Relaxed);
            self.bal.kick();
            return if eager { self.fail_done(idx) } else { self.fail_and_map_back(idx) };
        };
        // SAFETY: as above.
        if eager && unsafe { self.hide(addr, PAGE) }.is_err() {
            self.bal.give_back(new);
            return self.fail_done(idx);
        }
        // SAFETY: both frames are allocated and mapped read-write in the arena; the region's
        // page is inaccessible, so no thread writes the old frame during the copy.
        unsafe { std::ptr::copy_nonoverlapping(frame as *const u8, new as *mut u8, PAGE) };
        // SAFETY: the page is this region's and claimed.
        if unsafe { self.map(addr, new) }.is_err() {
            st.map_fail.fetch_add(1, Ordering::Relaxed);
            self.bal.give_back(new);
            return self.fail_and_map_back(idx);
        }
        e.frame.store(new, Ordering::Relaxed);
        // SAFETY: the old frame is mapped nowhere now but the arena, and ours alone.
        unsafe { self.bal.to_free.push(frame) };
        st.pages_migrated.fetch_add(1, Ordering::Relaxed);
        st.migrate_success.fetch_add(1, Ordering::Relaxed);
        st.migrate_ns.fetch_add(os::now_ns().saturating_sub(t0), Ordering::Relaxed);
        self.bal.kick_if_low(dst);
        e.release(PRESENT);
    }

    /// Moves the whole aligned chunk of `CHUNK_PAGES` pages around page `idx` (claimed) to
    /// `dst` in one step when every other page of it is hinted with its frame on `src`: the
    /// others are claimed one by one (a page another thread claimed first ends the attempt,
    /// and everything claimed is put back), the chunk is copied into consecutive frames and
    /// mapped with one `mmap`, so its 512 mappings become one. `false`: nothing changed, and
    /// the single page moves as usual.
    fn try_chunk(&self, idx: usize, src: u16, dst: u16, this: Cpupid, t0: u64) -> bool {
        let n = crate::CHUNK_PAGES;
        let c = idx / n * n;
        let z = &self.bal.z;
        if self.bal.chunks[dst as usize].capacity() == 0 || c + n > self.entries.len() {
            return false;
        }
        let on_src = |j: usize| {
            let f = self.entries[j].frame.load(Ordering::Relaxed);
            f != 0 && z.page_to_nid(f as *const u8).is_ok_and(|nid| nid.0 == src)
        };
        // A look first, without claiming: most chunks have a page in use.
        if (c..c + n).any(|j| j != idx && self.entries[j].state.load(Ordering::Relaxed) != HINT)
            || !self.bal.has_room_for(dst, n)
        {
            return false;
        }
        let Some(block) = self.bal.chunks[dst as usize].take() else { return false };
        let mut claimed = c;
        while claimed < c + n && (claimed == idx || self.entries[claimed].claim(HINT)) {
            claimed += 1;
        }
        let all = claimed == c + n && (c..c + n).all(on_src);
        let release = |to: usize| {
            for j in (c..to).filter(|&j| j != idx) {
                self.entries[j].release(HINT);
            }
        };
        if !all {
            release(claimed);
            self.bal.give_back_chunk(dst, block);
            return false;
        }
        let addr = self.start + c * PAGE;
        let eager = self.bal.mode() == MigrateMode::Eager;
        // SAFETY: the chunk's pages are this region's, mapped and claimed by this thread.
        if eager && (!self.reveal_pages(addr, n) || unsafe { self.hide(addr, n * PAGE) }.is_err()) {
            // Revealed or not, the pages are hidden or mapped as before: map each back.
            for j in (c..c + n).filter(|&j| j != idx) {
                self.map_back(j);
            }
            self.bal.give_back_chunk(dst, block);
            return false;
        }
        for (k, j) in (c..c + n).enumerate() {
            let old = self.entries[j].frame.load(Ordering::Relaxed);
            // SAFETY: both frames are allocated and mapped read-write in the arena; the
            // chunk's pages are inaccessible and claimed, so nobody writes the old frames.
            unsafe { std::ptr::copy_nonoverlapping(old as *const u8, (block + k * PAGE) as *mut u8, PAGE) };
        }
        let mapped = z.frame_offset(block as *const u8).ok().and_then(|off| {
            // SAFETY: the chunk is this region's and claimed; the block's frames are ours.
            unsafe { os::map_frame(addr, n * PAGE, z.frame_file(), off, false) }.ok()
        });
        if mapped.is_none() {
            // The old mappings may be gone with a failed MAP_FIXED: map each old frame back.
            self.bal.stats.map_fail.fetch_add(1, Ordering::Relaxed);
            self.bal.stats.migrate_fail.fetch_add(1, Ordering::Relaxed);
            self.remap_old(c, n);
            self.bal.give_back_chunk(dst, block);
            // Page `idx` is mapped back; the caller's single-page path must not run again.
            return true;
        }
        self.mapped_anew(addr, n * PAGE);
        let st = &self.bal.stats;
        for (k, j) in (c..c + n).enumerate() {
            let e = &self.entries[j];
            let old = e.frame.swap(block + k * PAGE, Ordering::Relaxed);
            // SAFETY: the old frame is mapped nowhere now but the arena, and ours alone.
            unsafe { self.bal.to_free.push(old) };
            e.last.store(this.0, Ordering::Relaxed);
        }
        st.pages_migrated.fetch_add(n as u64, Ordering::Relaxed);
        st.migrate_success.fetch_add(n as u64, Ordering::Relaxed);
        st.chunks_migrated.fetch_add(1, Ordering::Relaxed);
        st.migrate_ns.fetch_add(os::now_ns().saturating_sub(t0), Ordering::Relaxed);
        self.bal.kick();
        for j in c..c + n {
            self.entries[j].release(PRESENT);
        }
        true
    }

    /// Reveals `n` pages from `addr`: one call under mprotect, one per page under
    /// userfaultfd (`UFFDIO_CONTINUE` works within one mapping, and the pages may be several).
    fn reveal_pages(&self, addr: usize, n: usize) -> bool {
        // SAFETY: the callers pass mapped pages of this region they have claimed.
        match &self.bal.uffd {
            Some(_) => (0..n).all(|k| unsafe { self.reveal(addr + k * PAGE, PAGE) }.is_ok()),
            None => unsafe { self.reveal_in_use(addr, n * PAGE) }.is_ok(),
        }
    }

    /// Maps the page back read-write (no migration).
    fn map_back(&self, idx: usize) {
        let addr = self.start + idx * PAGE;
        // SAFETY: a mapped page of this region, claimed.
        if unsafe { self.reveal(addr, PAGE) }.is_err() {
            // Out of VMAs: map the frame again over the whole page instead, which needs no
            // split of a neighbouring mapping's protection.
            let frame = self.entries[idx].frame.load(Ordering::Relaxed);
            // SAFETY: as above.
            if unsafe { self.map(addr, frame) }.is_err() {
                self.bal.stats.map_fail.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.entries[idx].release(PRESENT);
    }

    fn fail_and_map_back(&self, idx: usize) {
        self.bal.stats.migrate_fail.fetch_add(1, Ordering::Relaxed);
        self.bal.window_fail();
        self.map_back(idx);
    }

    /// A failed eager migration whose page is already accessible.
    fn fail_done(&self, idx: usize) {
        self.bal.stats.migrate_fail.fetch_add(1, Ordering::Relaxed);
        self.bal.window_fail();
        let addr = self.start + idx * PAGE;
        // SAFETY: as in `map_back`; the page may have been hidden again for the copy.
        let _ = unsafe { self.reveal(addr, PAGE) };
        self.entries[idx].release(PRESENT);
    }

    /// Maps `frame` read-write at `addr`. The new mapping is not registered with the
    /// userfaultfd (a mapping does not inherit the one it replaces): whoever hides the page
    /// next registers it first ([`RegionShared::hide_new`]), one call per run of pages
    /// instead of one per migration (an `UFFDIO_REGISTER` takes the mmap lock for writing,
    /// ~35 µs a call with two threads faulting here).
    ///
    /// # Safety
    /// `addr` is a page of this region that the caller has claimed.
    pub(crate) unsafe fn map(&self, addr: usize, frame: usize) -> Result<(), i32> {
        let off = self.bal.z.frame_offset(frame as *const u8).map_err(|_| libc::EINVAL)?;
        // SAFETY: per the caller's contract; the frame is allocated and ours.
        unsafe { os::map_frame(addr, PAGE, self.bal.z.frame_file(), off, false) }?;
        self.mapped_anew(addr, PAGE);
        Ok(())
    }

    /// The entries of the pages `addr..addr + len` of this region.
    fn entries_of(&self, addr: usize, len: usize) -> &[PageEntry] {
        let s = (addr - self.start) / PAGE;
        &self.entries[s..s + len / PAGE]
    }

    /// Notes that `addr..addr + len` (claimed pages) was just mapped with a new mapping,
    /// which the userfaultfd has not registered.
    pub(crate) fn mapped_anew(&self, addr: usize, len: usize) {
        for e in self.entries_of(addr, len) {
            e.unregistered.store(true, Ordering::Relaxed);
        }
    }

    /// Maps each claimed page `c..c + n` back onto its own frame, read-write, and releases it
    /// `PRESENT`, after a failed hide or mapping left the pages' protections unknown. A page
    /// whose mapping fails too is released `HINT`: its next access faults and maps it again,
    /// where `PRESENT` would send the faulting thread back to an access that faults for ever.
    pub(crate) fn remap_old(&self, c: usize, n: usize) {
        for j in c..c + n {
            let f = self.entries[j].frame.load(Ordering::Relaxed);
            // SAFETY: a page of this region, claimed by the caller.
            let to = match unsafe { self.map(self.start + j * PAGE, f) } {
                Ok(()) => PRESENT,
                Err(_) => {
                    self.bal.stats.map_fail.fetch_add(1, Ordering::Relaxed);
                    HINT
                }
            };
            self.entries[j].release(to);
        }
    }

    /// [`RegionShared::hide`] for pages that may have been mapped since they were last
    /// hidden: under userfaultfd their mappings are registered first, since a zap of an
    /// unregistered page is refilled from the file on the next access without a fault, so
    /// the page would not be inaccessible at all (and a copy of it could lose writes). A
    /// failed registration hides nothing.
    ///
    /// # Safety
    /// As for [`RegionShared::hide`].
    pub(crate) unsafe fn hide_new(&self, addr: usize, len: usize) -> Result<(), i32> {
        if let Some(u) = &self.bal.uffd {
            // Only when a page of the range was mapped anew since it was registered: an
            // `UFFDIO_REGISTER` takes the mmap lock for writing, so a scan pass registering
            // every run it hides would stall every faulting thread of the process for each.
            let pages = self.entries_of(addr, len);
            if pages.iter().any(|e| e.unregistered.load(Ordering::Relaxed)) {
                if let Err(e) = u.register_minor(addr, len) {
                    self.bal.stats.register_fail.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
                self.bal.stats.registered.fetch_add(1, Ordering::Relaxed);
                pages.iter().for_each(|e| e.unregistered.store(false, Ordering::Relaxed));
            }
        }
        // SAFETY: per the caller's contract.
        unsafe { self.hide(addr, len) }
    }

    /// Takes pages away so the next access faults: `PROT_NONE`, or a zap under userfaultfd
    /// (of pages whose mapping is registered: ones this layer hid before and has only
    /// revealed since, in place; others go through [`RegionShared::hide_new`]).
    ///
    /// # Safety
    /// The pages are mapped pages of this region that the caller has claimed.
    pub(crate) unsafe fn hide(&self, addr: usize, len: usize) -> Result<(), i32> {
        // SAFETY: per the caller's contract; the region's pages map the arena's memfd shared,
        // so a zap drops page-table entries and keeps the data.
        unsafe {
            match &self.bal.uffd {
                Some(_) => os::zap(addr, len),
                // Zapped first, then protected: a migration then maps its new frame over an
                // empty entry, which needs no TLB flush, where replacing a PROT_NONE entry
                // (present to the kernel) flushes every CPU the process ran on (NUMAB.md). A
                // page touched between the two calls is protected present, as before.
                None => os::zap(addr, len).and_then(|()| os::protect(addr, len, true)),
            }
        }
    }

    /// [`RegionShared::reveal`] as eager mapping reveals: the page-table entries present, as
    /// Linux's `do_numa_page` leaves them for the faulting access (`UFFDIO_CONTINUE` installs
    /// them; under mprotect, whose hidden pages are zapped, they are populated).
    ///
    /// # Safety
    /// As for [`RegionShared::hide`].
    unsafe fn reveal_in_use(&self, addr: usize, len: usize) -> Result<(), i32> {
        // SAFETY: per the caller's contract.
        unsafe { self.reveal(addr, len) }?;
        match &self.bal.uffd {
            Some(_) => Ok(()),
            // SAFETY: per the caller's contract; just made read-write.
            None => unsafe { os::populate(addr, len) },
        }
    }

    /// Gives hidden pages back as they were: read-write again, or the file's page mapped
    /// again under userfaultfd (`UFFDIO_CONTINUE`).
    ///
    /// # Safety
    /// As for [`RegionShared::hide`].
    pub(crate) unsafe fn reveal(&self, addr: usize, len: usize) -> Result<(), i32> {
        match &self.bal.uffd {
            Some(u) => u.continue_(addr, len),
            // SAFETY: per the caller's contract.
            None => unsafe { os::protect(addr, len, false) },
        }
    }
}
