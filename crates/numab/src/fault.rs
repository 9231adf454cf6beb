//! The fault handler: first touch and NUMA hint faults on region pages, taken in the faulting
//! thread from `SIGSEGV` (first touch, and hints of the mprotect backend) or `SIGBUS`
//! (userfaultfd MINOR faults on zapped pages), and chained to the handler that was there
//! before for every other fault and every signal that is not a fault.
//!
//! Kernel counterpart: `do_numa_page` (mm/memory.c) with the seed's delayed mapping, and
//! `do_anonymous_page`/`do_shared_fault` for the first touch.
//!
//! Signal safety: the handler takes no lock (zonal's included) and touches no heap. It finds
//! its region in a fixed table of atomic slots (a slot's users count keeps the region alive
//! while a handler is inside it), takes frames from the per-node reserves, pushes frames to
//! free onto a lock-free stack, reads zonal's tables through `&Zonal` methods that read
//! atomics only, and makes raw system calls (`mmap`, `mprotect`, `madvise`, `ioctl`,
//! `sched_yield`, `futex`, `gettid`, `write`). It runs with every signal blocked, so a
//! user's asynchronous handler never runs on a thread that holds a page `BUSY`.
//!
//! What is a fault: only `SIGSEGV` with `SEGV_MAPERR`/`SEGV_ACCERR` and `SIGBUS` with
//! `BUS_ADRERR` carry the faulting address. Anything else (`kill`, `tgkill`, `sigqueue`, a
//! memory error's `BUS_MCEERR_*`) goes to the previous handler untouched, or takes the
//! default action. A fault the balancer cannot resolve (no frame on any node, a mapping the
//! kernel refuses, a forked child touching a region) is written to stderr and becomes the
//! fault it is: the previous handler's, or the default action. None is retried forever.

use crate::os::{self, PAGE};
use crate::table::{should_migrate, Cpupid, PageEntry, BUSY, HINT, MAX_REGIONS, PRESENT, UNMAPPED};
use crate::{MigrateMode, RegionShared};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::OnceLock;

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

/// Set in a child of `fork()` (the `pthread_atfork` child hook): the regions it inherited are
/// not its own (see [`in_child`]).
static FORKED: AtomicBool = AtomicBool::new(false);
static ATFORK: OnceLock<i32> = OnceLock::new();

/// `si_code`s of a fault (include/uapi/asm-generic/siginfo.h), which the libc crate lacks.
const SEGV_MAPERR: i32 = 1;
const SEGV_ACCERR: i32 = 2;

/// Faults on one page the same thread takes in a row, each finding it mapped, before the
/// fault is taken for what it is (see [`RegionShared::repair`]).
const REPAIR_LIMIT: u32 = 64;

thread_local! {
    /// The page of this thread's last fault that found its page mapped, and how many in a
    /// row. `const` and without a destructor: a plain TLS slot, safe in a signal handler.
    static REPAIRS: Cell<(usize, u32)> = const { Cell::new((0, 0)) };
}

/// Why a fault on a region page was not resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unresolved {
    /// No node the policy allows has a frame.
    NoFrame,
    /// The kernel refused a mapping (out of mappings: `vm.max_map_count`).
    Map,
    /// The page is mapped, and mapping it again does not end its faults (a protection or
    /// mapping the program changed itself).
    Repair,
    /// A child of `fork()` touched a region it inherited.
    Forked,
}

impl Unresolved {
    fn message(self) -> &'static [u8] {
        match self {
            Unresolved::NoFrame => b"zonal-numab: no frame for a first touch on any node the policy allows (out of memory)\n",
            Unresolved::Map => b"zonal-numab: the kernel refused to map a region page (vm.max_map_count reached?)\n",
            Unresolved::Repair => {
                b"zonal-numab: a region page keeps faulting while mapped (its protection or mapping was changed outside the balancer)\n"
            }
            Unresolved::Forked => {
                b"zonal-numab: a forked child touched a region of its parent (regions are not inherited across fork)\n"
            }
        }
    }
}

/// What became of a fault on a region page.
pub(crate) type Outcome = Result<(), Unresolved>;

/// How pages are taken away under mprotect (under userfaultfd a hide is always a zap, which
/// empties the entries: a hint fault there is a fault on an empty entry).
///
/// A zap costs a TLB shootdown per mapping it empties an entry in, an `mprotect` one for the
/// whole call (the kernel gathers it), and an `mprotect` over neighbouring mappings of
/// consecutive frames merges them (measured on 6.18: 4,096 one-page mappings, one
/// `MADV_DONTNEED` over them 4,096 shootdowns, one `mprotect(PROT_NONE)` 1). The zap is what
/// lets a migration map its new frame over an empty entry, with no shootdown, where mapping
/// over a `PROT_NONE` entry (present to the kernel) flushes every CPU the process ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hide {
    /// Zapped, then protected (at no cost: the entries are empty): a shootdown per mapping,
    /// for a range of one or two.
    ZapFirst,
    /// Protected, one shootdown after which the range's mappings of consecutive frames are
    /// one, then zapped, one more: for a range a hint fault's `mprotect`s split.
    ProtectFirst,
    /// Protected only, one shootdown whatever the range's mappings, the entries kept: for
    /// pages none of which looks set to move (each is where its last hint fault came from).
    /// One that moves after all pays a shootdown for its new mapping.
    ProtectOnly,
}

/// Whether this process is a child of `fork()` that inherited the balancer's state.
pub(crate) fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// Installs the handler for both signals once per process (keeping the previous ones to
/// chain to), and the fork hook.
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
                // Every signal blocked while the handler runs: a user's handler interrupting
                // it could touch the page it holds BUSY and wait for itself for ever.
                libc::sigfillset(&mut act.sa_mask);
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
    // SAFETY: `in_child` is an `extern "C" fn()` that lives for the whole process.
    match *ATFORK.get_or_init(|| unsafe { libc::pthread_atfork(None, None, Some(in_child)) }) {
        0 => Ok(()),
        e => Err(e),
    }
}

/// The `pthread_atfork` child hook, run in the child before `fork()` returns there: every
/// region's range becomes an inaccessible reservation of the child's own (one `mmap` each),
/// so the child shares none of its parent's frames (its mappings were `MAP_SHARED`), no
/// later mapping of the child lands at the region's addresses, and a touch is a fault the
/// handler reports. The regions and the balancer the child inherited refuse every call
/// ([`crate::Error::Forked`]) and do nothing when dropped: their locks may have been held
/// by parent threads that do not exist here.
extern "C" fn in_child() {
    FORKED.store(true, Ordering::SeqCst);
    let n = HIGH_WATER.load(Ordering::Acquire);
    for s in &SLOTS[..n] {
        // SAFETY: a registered region's memory lives until its slot is cleared (`unregister`
        // precedes its free), and the child's copy of it was taken whole by fork.
        if let Some(r) = unsafe { s.region.load(Ordering::SeqCst).as_ref() } {
            // SAFETY: the range is the region's reservation, which only the region's own
            // mappings occupy; the child has one thread (this one), which holds no reference
            // into it.
            unsafe { os::replace_with_reservation(r.start, r.entries.len() * PAGE) };
        }
    }
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
        // SAFETY: a registered region lives until `unregister` has seen `users` at zero, and
        // this thread holds `users` up.
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
                // Mapped by the registered range's rules but zapped behind the table's back
                // (the program's own `MADV_DONTNEED`): map it again.
                PRESENT if e.claim(PRESENT) => break r.repair(idx),
                BUSY => os::yield_cpu(),
                UNMAPPED | HINT | PRESENT => {}
                _ => break Ok(()),
            }
        }
    });
    if let Some(u) = &bal.uffd {
        u.wake(page, PAGE);
    }
}

/// Whether signal `sig` with `code` is a fault, whose `si_addr` is the address touched.
fn is_fault(sig: libc::c_int, code: i32) -> bool {
    match sig {
        libc::SIGSEGV => code == SEGV_MAPERR || code == SEGV_ACCERR,
        libc::SIGBUS => code == libc::BUS_ADRERR,
        _ => false,
    }
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: errno is this thread's; the handler restores it so the interrupted code sees
    // no change.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers; `si_addr` is read
    // only for a fault, where the kernel set it.
    let fault = is_fault(sig, unsafe { (*info).si_code });
    let outcome = if fault {
        // SAFETY: as above.
        let addr = unsafe { (*info).si_addr() } as usize;
        with_region(addr, |r| if forked() { Err(Unresolved::Forked) } else { r.fault(addr) })
    } else {
        None
    };
    match outcome {
        Some(Ok(())) => {}
        Some(Err(why)) => {
            os::write_stderr(why.message());
            chain(sig, info, ctx, true);
        }
        None => chain(sig, info, ctx, fault),
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// Hands a signal that is not a region's (or a region fault the balancer could not resolve)
/// to the previous handler. With none, the default action: a fault returns and runs the
/// access again with the default disposition, so the process dies of it where it happened;
/// a signal that is not a fault (ignored before us, it stays ignored) is raised again with
/// the default disposition, pending until this handler returns.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void, fault: bool) {
    let prev = if sig == libc::SIGBUS { &PREVIOUS_BUS } else { &PREVIOUS_SEGV };
    let h = prev.get().map_or(libc::SIG_DFL, |o| o.sa_sigaction);
    if h == libc::SIG_IGN && !fault {
        return;
    }
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // SAFETY: a zeroed sigaction with SIG_DFL is valid; sigaction and raise are
        // async-signal-safe.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
            if !fault {
                libc::raise(sig);
            }
        }
        return;
    }
    let Some(old) = prev.get() else { return };
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
    pub(crate) fn fault(&self, addr: usize) -> Outcome {
        let idx = (addr - self.start) / PAGE;
        let e = &self.entries[idx];
        let mut repeats = None;
        loop {
            match e.state.load(Ordering::Acquire) {
                UNMAPPED if e.claim(UNMAPPED) => {
                    REPAIRS.set((0, 0));
                    return self.first_touch(idx);
                }
                HINT if e.claim(HINT) => {
                    REPAIRS.set((0, 0));
                    return self.hint_fault(idx, self.bal.z.local_node().0, os::gettid());
                }
                // Mapped by another thread since this access faulted (running it again
                // succeeds, at no cost the first time), or its mapping taken away behind the
                // table's back: from the second fault in a row of this thread on this page,
                // mapped again (`repair`); past `REPAIR_LIMIT`, the fault is not one the
                // balancer can resolve (the program changed the page's protection, say).
                PRESENT => {
                    let n = *repeats.get_or_insert_with(|| {
                        let (last, n) = REPAIRS.get();
                        let n = if last == addr { n + 1 } else { 1 };
                        REPAIRS.set((addr, n));
                        n
                    });
                    if n == 1 {
                        return Ok(());
                    }
                    if n > REPAIR_LIMIT {
                        REPAIRS.set((0, 0));
                        return Err(Unresolved::Repair);
                    }
                    if e.claim(PRESENT) {
                        return self.repair(idx);
                    }
                }
                // Another thread is changing the page: wait for it, then look again. Only
                // the thread that maps the page counts the fault.
                BUSY => os::yield_cpu(),
                _ => {}
            }
        }
    }

    /// Maps page `idx` (claimed from `PRESENT`) again, revealed or mapped anew onto its
    /// frame, and releases it `PRESENT`: for a fault on a page the table has mapped whose
    /// mapping was taken away behind its back (the program's own `MADV_DONTNEED` under
    /// userfaultfd, a protection a failed call left). A page mapped read-write already is
    /// left as it is.
    pub(crate) fn repair(&self, idx: usize) -> Outcome {
        let e = &self.entries[idx];
        let addr = self.start + idx * PAGE;
        let frame = e.frame.load(Ordering::Relaxed);
        // SAFETY: a mapped page of this region, claimed; revealing a page that is mapped
        // read-write already changes nothing.
        let ok = unsafe { self.reveal(addr, PAGE) }.is_ok() || unsafe { self.map(addr, frame) }.is_ok();
        e.release(PRESENT);
        if ok {
            Ok(())
        } else {
            self.bal.stats.map_fail.fetch_add(1, Ordering::Relaxed);
            Err(Unresolved::Map)
        }
    }

    /// Maps a frame of the node the policy picks onto page `idx` (claimed from `UNMAPPED`),
    /// touched for the first time: with its whole window when the region touches in
    /// windows ([`RegionShared::first_touch_window`]), else alone. The frame comes from a
    /// reserve of the node, or of the nearest allowed node with one when the node has none;
    /// the fault fails only when no allowed node has a frame.
    pub(crate) fn first_touch(&self, idx: usize) -> Outcome {
        if self.first_touch_window(idx) {
            return Ok(());
        }
        let e = &self.entries[idx];
        let addr = self.start + idx * PAGE;
        let node = self.place(idx);
        let Some(frame) = self.bal.frame_for(node, &self.fallback[node as usize]) else {
            e.release(UNMAPPED);
            return Err(Unresolved::NoFrame);
        };
        // SAFETY: the page is this region's, claimed (BUSY): nothing else maps it now.
        if unsafe { self.map(addr, frame) }.is_err() {
            self.bal.stats.map_fail.fetch_add(1, Ordering::Relaxed);
            self.bal.give_back(frame);
            e.release(UNMAPPED);
            return Err(Unresolved::Map);
        }
        e.frame.store(frame, Ordering::Relaxed);
        self.bal.stats.first_touch.fetch_add(1, Ordering::Relaxed);
        e.release(PRESENT);
        Ok(())
    }

    /// The first touch of page `idx` (claimed) as the first touch of its aligned window of
    /// `2^ft_order` pages: every other page of the window claimed from `UNMAPPED`, the
    /// window given consecutive frames of one node and mapped with one `mmap`, so that a
    /// region touched in any order adds at most one mapping a window (its `ft_order` is
    /// chosen for the mapping budget, see `Balancer::region`), as a transparent huge page
    /// does for anonymous memory. `false`, with page `idx` still claimed and every other
    /// page as it was: the window is not whole (the region's end, a page touched already),
    /// or no node has a block, and the page is touched alone.
    fn first_touch_window(&self, idx: usize) -> bool {
        let k = self.ft_order;
        if k == 0 {
            return false;
        }
        let n = 1usize << k;
        let c = idx / n * n;
        if c + n > self.entries.len() {
            return false;
        }
        let mut claimed = c;
        while claimed < c + n && (claimed == idx || self.entries[claimed].claim(UNMAPPED)) {
            claimed += 1;
        }
        let release_others = |to: usize| {
            for j in (c..to).filter(|&j| j != idx) {
                self.entries[j].release(UNMAPPED);
            }
        };
        if claimed < c + n {
            release_others(claimed);
            return false;
        }
        let node = self.place(c);
        let nodes = std::iter::once(node).chain(self.fallback[node as usize].iter().copied());
        let Some(block) = nodes.into_iter().find_map(|nid| self.carve(nid, n)) else {
            release_others(c + n);
            return false;
        };
        let addr = self.start + c * PAGE;
        let z = &self.bal.z;
        let mapped = z.frame_offset(block as *const u8).ok().and_then(|off| {
            // SAFETY: the window's pages are this region's and claimed; the frames are ours.
            unsafe { os::map_frame(addr, n * PAGE, z.frame_file(), off, false) }.ok()
        });
        if mapped.is_none() {
            self.bal.stats.map_fail.fetch_add(1, Ordering::Relaxed);
            for k in 0..n {
                self.bal.give_back(block + k * PAGE);
            }
            release_others(c + n);
            return false;
        }
        self.mapped_anew(addr, n * PAGE);
        for (k, e) in self.entries[c..c + n].iter().enumerate() {
            e.frame.store(block + k * PAGE, Ordering::Relaxed);
        }
        self.bal.stats.first_touch.fetch_add(n as u64, Ordering::Relaxed);
        for e in &self.entries[c..c + n] {
            e.release(PRESENT);
        }
        true
    }

    /// A hint fault (`do_numa_page`) on page `idx` (claimed) by thread `tid` on a CPU of node
    /// `here`: counts it, decides, and maps the page back or moves it.
    fn hint_fault(&self, idx: usize, here: u16, tid: u32) -> Outcome {
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
        // Memory tiering: a lower-tier page goes by its hint-fault latency, not by the
        // two-stage filter (Linux's `should_numa_migrate_memory` returns from its tiering
        // branch for such pages).
        if self.bal.tiering() && !self.bal.tiers.is_top(src) {
            return self.promotion_fault(idx, here, src, tid);
        }
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
            // A local fault on a page off its slot in its window's destination block here
            // (first touched onto a frame of its own, say): into its slot, as a delayed
            // migration moves a page (no flush: the page is hidden, its entry empty), so
            // that the window becomes one mapping without a collapse.
            if src == here
                && !e.pinned()
                && !e.kept.load(Ordering::Relaxed)
                && !self.bal.over_budget.load(Ordering::Relaxed)
            {
                if let Some(new) = self.free_slot(idx, here) {
                    return self.move_pages(idx, here, new, true, false, os::now_ns());
                }
            }
            return self.map_back(idx);
        };
        // Pinned while it was hinted (the pinner waits for it): the kernel may hold the
        // frame, so it stays (Linux refuses to migrate a page with extra references).
        if e.pinned() {
            st.fail_pinned.fetch_add(1, Ordering::Relaxed);
            return self.fail_and_map_back(idx);
        }
        if !self.bal.has_room(dst) {
            st.fail_room.fetch_add(1, Ordering::Relaxed);
            return self.fail_and_map_back(idx);
        }
        if self.bal.over_budget.load(Ordering::Relaxed) {
            st.fail_vma.fetch_add(1, Ordering::Relaxed);
            return self.fail_and_map_back(idx);
        }
        let t0 = os::now_ns();
        if let Some(outcome) = self.try_chunk(idx, src, dst, Cpupid::new(here, tid), t0) {
            return outcome;
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
        // The page's slot in its window's destination block (`dest`), so that the window's
        // pages migrated one by one map consecutive frames, one mapping; else any frame of
        // the node's reserve.
        let slot = self.slot_frame(idx, dst);
        let Some(new) = slot.or_else(|| self.bal.reserves[dst as usize].take(z.current_cpu())) else {
            st.fail_reserve.fetch_add(1, Ordering::Relaxed);
            self.bal.kick();
            return if eager { self.fail_done(idx) } else { self.fail_and_map_back(idx) };
        };
        if slot.is_none() {
            self.bal.kick_if_low(dst);
        }
        self.move_pages(idx, dst, new, slot.is_some(), eager, t0)
    }

    /// A hint fault on page `idx` (claimed) of a lower tier, from a CPU of node `here`:
    /// promoted to `here` (or the node the policy names, if top tier) when hot and within
    /// the rate limit (see `tier`), with room there above the high watermark; else mapped
    /// back where it is. A promotion moves the page alone, onto a frame of the node's
    /// reserve: its neighbours are no candidates (a window's destination block would bring
    /// the cold ones along and hold fast memory for pages that never come).
    fn promotion_fault(&self, idx: usize, here: u16, src: u16, tid: u32) -> Outcome {
        let e = &self.entries[idx];
        let st = &self.bal.stats;
        let Some(dst) = self.target(idx, here).filter(|&d| d != src && self.bal.tiers.is_top(d)) else {
            return self.map_back(idx);
        };
        let now = self.bal.clock.now_ms();
        let latency = (now as u32).wrapping_sub(e.hidden_ms.load(Ordering::Relaxed)) as u64;
        if !self.bal.should_promote(dst, latency, now) {
            return self.map_back(idx);
        }
        e.last.store(Cpupid::new(here, tid).0, Ordering::Relaxed);
        if e.pinned() {
            st.fail_pinned.fetch_add(1, Ordering::Relaxed);
            return self.fail_and_map_back(idx);
        }
        if !self.bal.has_room(dst) {
            // kswapd's wake-up: the balancer's thread demotes to make room.
            st.fail_room.fetch_add(1, Ordering::Relaxed);
            self.bal.tier_nodes[dst as usize].short.store(true, Ordering::Relaxed);
            self.bal.kick();
            return self.fail_and_map_back(idx);
        }
        if self.bal.over_budget.load(Ordering::Relaxed) {
            st.fail_vma.fetch_add(1, Ordering::Relaxed);
            return self.fail_and_map_back(idx);
        }
        let t0 = os::now_ns();
        let eager = self.bal.mode() == MigrateMode::Eager;
        // SAFETY: a mapped page of this region, claimed.
        if eager && unsafe { self.reveal_in_use(self.start + idx * PAGE, PAGE) }.is_err() {
            return self.fail_and_map_back(idx);
        }
        let Some(new) = self.bal.reserves[dst as usize].take(self.bal.z.current_cpu()) else {
            st.fail_reserve.fetch_add(1, Ordering::Relaxed);
            self.bal.kick();
            return if eager { self.fail_done(idx) } else { self.fail_and_map_back(idx) };
        };
        self.bal.kick_if_low(dst);
        self.move_pages(idx, dst, new, false, eager, t0)
    }

    /// Counts `moved` pages migrated to `dst` by hint faults, of which `promoted` came up
    /// from a lower tier.
    fn count_migrated(&self, dst: u16, moved: u64, promoted: u64) {
        let n = &self.bal.tier_nodes[dst as usize];
        n.pages_migrated.fetch_add(moved, Ordering::Relaxed);
        if promoted > 0 {
            n.pgpromote_success.fetch_add(promoted, Ordering::Relaxed);
        }
    }

    /// Whether a page moving from `src` to `dst` is a promotion (tiering on, lower tier to
    /// top tier), as Linux counts `pgpromote_success`.
    fn promotes(&self, src: u16, dst: u16) -> bool {
        self.bal.tiering() && !self.bal.tiers.is_top(src) && self.bal.tiers.is_top(dst)
    }

    /// Moves page `idx` (claimed, hidden, or accessible again when `eager`) to node `dst`
    /// onto frame `new`, taken for it: its slot in its window's destination block (`slot`),
    /// with the untouched neighbours that come along into theirs (`gather_cold`), or a
    /// reserve frame alone. Counts the pages whose node changed as migrated, the others
    /// (a local fault's move into its slot) as `numab_coalesced`.
    fn move_pages(&self, idx: usize, dst: u16, new: usize, slot: bool, eager: bool, t0: u64) -> Outcome {
        let e = &self.entries[idx];
        let addr = self.start + idx * PAGE;
        let st = &self.bal.stats;
        let z = &self.bal.z;
        // Into a slot, the cold neighbours come along into theirs: a page used among pages
        // nobody touches would otherwise stay a mapping of its own.
        let (a, b) = if slot { self.gather_cold(idx) } else { (idx, idx + 1) };
        // The new frame of page `a`; page j's is `first + (j - a) * PAGE` (consecutive in a
        // block, or the one reserve frame when a..b is the page alone).
        let first = new - (idx - a) * PAGE;
        // SAFETY: a mapped page of this region, claimed.
        if eager && unsafe { self.hide(addr, PAGE, Hide::ZapFirst) }.is_err() {
            self.drop_run(a, b, idx, first);
            return self.fail_done(idx);
        }
        for j in a..b {
            let old = self.entries[j].frame.load(Ordering::Relaxed);
            // SAFETY: both frames are allocated and mapped read-write in the arena; the
            // region's pages a..b are inaccessible and claimed, so no thread writes the old
            // frames during the copy.
            unsafe { std::ptr::copy_nonoverlapping(old as *const u8, (first + (j - a) * PAGE) as *mut u8, PAGE) };
        }
        // SAFETY: the pages are this region's and claimed.
        if unsafe { self.map_pages(self.start + a * PAGE, first, b - a) }.is_err() {
            st.map_fail.fetch_add(1, Ordering::Relaxed);
            // The failed MAP_FIXED may have taken the old mappings: each old frame again.
            self.remap_old(a, idx - a);
            self.remap_old(idx + 1, b - idx - 1);
            for j in a..b {
                // SAFETY: the new frames are ours and mapped nowhere but the arena.
                unsafe { self.bal.to_free.push(first + (j - a) * PAGE) };
            }
            self.bal.kick();
            return self.fail_and_map_back(idx);
        }
        let (mut moved, mut own, mut promoted) = (0u64, false, 0u64);
        for j in a..b {
            let old = self.entries[j].frame.swap(first + (j - a) * PAGE, Ordering::Relaxed);
            let from = z.page_to_nid(old as *const u8).map(|n| n.0).ok();
            let across = from != Some(dst);
            moved += across as u64;
            promoted += from.is_some_and(|n| across && self.promotes(n, dst)) as u64;
            own |= across && j == idx;
            // SAFETY: the old frame is mapped nowhere now but the arena, and ours alone.
            unsafe { self.bal.to_free.push(old) };
        }
        st.pages_migrated.fetch_add(moved, Ordering::Relaxed);
        st.migrate_success.fetch_add(moved, Ordering::Relaxed);
        self.count_migrated(dst, moved, promoted);
        st.migrated_along.fetch_add(moved - own as u64, Ordering::Relaxed);
        st.coalesced.fetch_add((b - a) as u64 - moved, Ordering::Relaxed);
        if own {
            st.migrate_ns.fetch_add(os::now_ns().saturating_sub(t0), Ordering::Relaxed);
        }
        for j in (a..b).filter(|&j| j != idx) {
            self.entries[j].release(PRESENT);
        }
        e.release(PRESENT);
        Ok(())
    }

    /// Claims the cold neighbours of page `idx` (claimed, moving into its slot of its
    /// window's destination block) that can come along, and takes their slots: contiguous
    /// with it in the window, hidden since before the last scan period began
    /// (`PageEntry::cold`), never hint-faulted on (no `last` on record: the program has not
    /// touched them since the scanner first hid them), not pinned, not in their slots
    /// already. Pages used in a window thus move with the pages nobody uses between them,
    /// which keeps the window one mapping instead of a mapping per used page; every page in
    /// use moves on its own hint fault, as Linux moves it (one only waiting for its turn
    /// while the threads are busy faulting may look cold, but it has a hint fault on record
    /// from before). Returns the run `a..b` around `idx`.
    fn gather_cold(&self, idx: usize) -> (usize, usize) {
        let c = idx / crate::dest::WINDOW * crate::dest::WINDOW;
        let end = (c + crate::dest::WINDOW).min(self.entries.len());
        let seq = self.scan_seq.load(Ordering::Relaxed) as u32;
        let comes = |j: usize| {
            let e = &self.entries[j];
            // A look first, then the claim, then every test again (a pin is read after the
            // claim: see `table`).
            if e.state.load(Ordering::Relaxed) != HINT || e.pinned() || !e.cold(seq) || !e.claim(HINT) {
                return false;
            }
            let last = Cpupid(e.last.load(Ordering::Relaxed));
            // A page hidden with its entry kept would cost its run's mapping a shootdown.
            let ok = !e.pinned()
                && e.cold(seq)
                && last.is_unset()
                && !e.kept.load(Ordering::Relaxed)
                && self.take_neighbour_slot(j);
            if !ok {
                e.release(HINT);
            }
            ok
        };
        let mut a = idx;
        while a > c && comes(a - 1) {
            a -= 1;
        }
        let mut b = idx + 1;
        while b < end && comes(b) {
            b += 1;
        }
        (a, b)
    }

    /// Undoes `gather_cold` and the frames taken for `a..b` (page `idx`'s own included)
    /// when the migration stops before its copy: the neighbours stay hinted as they were,
    /// the frames go back to be freed.
    fn drop_run(&self, a: usize, b: usize, idx: usize, first: usize) {
        for j in a..b {
            if j != idx {
                self.entries[j].release(HINT);
            }
            // SAFETY: the new frames are ours and mapped nowhere but the arena.
            unsafe { self.bal.to_free.push(first + (j - a) * PAGE) };
        }
        self.bal.kick();
    }

    /// Moves the whole aligned chunk of `CHUNK_PAGES` pages around page `idx` (claimed) to
    /// `dst` in one step when every other page of it is hinted with its frame on `src`: the
    /// others are claimed one by one (a page another thread claimed first ends the attempt,
    /// and everything claimed is put back), the chunk is copied into consecutive frames and
    /// mapped with one `mmap`, so its 512 mappings become one. `None`: nothing changed, and
    /// the single page moves as usual; else what became of page `idx`.
    fn try_chunk(&self, idx: usize, src: u16, dst: u16, this: Cpupid, t0: u64) -> Option<Outcome> {
        let n = crate::CHUNK_PAGES;
        let c = idx / n * n;
        let z = &self.bal.z;
        if !self.bal.chunk_migration || c + n > self.entries.len() {
            return None;
        }
        let on_src = |j: usize| {
            let f = self.entries[j].frame.load(Ordering::Relaxed);
            f != 0 && z.page_to_nid(f as *const u8).is_ok_and(|nid| nid.0 == src)
        };
        // A look first, without claiming: most chunks have a page in use.
        if (c..c + n).any(|j| j != idx && self.entries[j].state.load(Ordering::Relaxed) != HINT)
            || !self.bal.has_room_for(dst, n)
        {
            return None;
        }
        let block = self.bal.chunks[dst as usize].take()?;
        let mut claimed = c;
        while claimed < c + n && (claimed == idx || self.entries[claimed].claim(HINT)) {
            claimed += 1;
        }
        // No page of the chunk pinned (checked after the claims: see `table`).
        let all = claimed == c + n && (c..c + n).all(on_src) && !(c..c + n).any(|j| self.entries[j].pinned());
        let release = |to: usize| {
            for j in (c..to).filter(|&j| j != idx) {
                self.entries[j].release(HINT);
            }
        };
        if !all {
            release(claimed);
            self.bal.give_back_chunk(dst, block);
            return None;
        }
        let addr = self.start + c * PAGE;
        let eager = self.bal.mode() == MigrateMode::Eager;
        // SAFETY: the chunk's pages are this region's, mapped and claimed by this thread.
        if eager && (!self.reveal_pages(addr, n) || unsafe { self.hide(addr, n * PAGE, Hide::ZapFirst) }.is_err()) {
            // Revealed or not, the pages are hidden or mapped as before: map each back.
            for j in (c..c + n).filter(|&j| j != idx) {
                // A page that cannot be mapped back stays hinted: its own fault says so.
                let _ = self.map_back(j);
            }
            self.bal.give_back_chunk(dst, block);
            return None;
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
            // Page `idx` is mapped back (or left hinted, its next access faulting again);
            // the caller's single-page path must not run again.
            return Some(Ok(()));
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
        self.count_migrated(dst, n as u64, if self.promotes(src, dst) { n as u64 } else { 0 });
        st.chunks_migrated.fetch_add(1, Ordering::Relaxed);
        st.migrate_ns.fetch_add(os::now_ns().saturating_sub(t0), Ordering::Relaxed);
        self.bal.kick();
        for j in c..c + n {
            self.entries[j].release(PRESENT);
        }
        Some(Ok(()))
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

    /// Maps the page back read-write (no migration). When neither revealing it nor mapping
    /// its frame again works (the kernel out of mappings), the page stays hidden and `HINT`
    /// (the truth: an access faults), and the fault is unresolved: the caller's access would
    /// only fault again.
    fn map_back(&self, idx: usize) -> Outcome {
        let addr = self.start + idx * PAGE;
        // SAFETY: a mapped page of this region, claimed.
        if unsafe { self.reveal(addr, PAGE) }.is_err() {
            // Out of VMAs: map the frame again over the whole page instead, which needs no
            // split of a neighbouring mapping's protection.
            let frame = self.entries[idx].frame.load(Ordering::Relaxed);
            // SAFETY: as above.
            if unsafe { self.map(addr, frame) }.is_err() {
                self.bal.stats.map_fail.fetch_add(1, Ordering::Relaxed);
                self.entries[idx].release(HINT);
                return Err(Unresolved::Map);
            }
        }
        self.entries[idx].release(PRESENT);
        Ok(())
    }

    fn fail_and_map_back(&self, idx: usize) -> Outcome {
        self.bal.stats.migrate_fail.fetch_add(1, Ordering::Relaxed);
        self.bal.window_fail();
        self.map_back(idx)
    }

    /// A failed eager migration whose page is already accessible. Released `PRESENT` even if
    /// the reveal fails: a fault on it then repairs the mapping (`repair`).
    fn fail_done(&self, idx: usize) -> Outcome {
        self.bal.stats.migrate_fail.fetch_add(1, Ordering::Relaxed);
        self.bal.window_fail();
        let addr = self.start + idx * PAGE;
        // SAFETY: as in `map_back`; the page may have been hidden again for the copy.
        let _ = unsafe { self.reveal(addr, PAGE) };
        self.entries[idx].release(PRESENT);
        Ok(())
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
        // SAFETY: per the caller's contract.
        unsafe { self.map_pages(addr, frame, 1) }
    }

    /// [`RegionShared::map`] for `n` pages from `addr` onto `n` consecutive frames from
    /// `frame`, with one `mmap`.
    ///
    /// # Safety
    /// The pages are this region's and the caller has claimed them; the frames are ours.
    pub(crate) unsafe fn map_pages(&self, addr: usize, frame: usize, n: usize) -> Result<(), i32> {
        let off = self.bal.z.frame_offset(frame as *const u8).map_err(|_| libc::EINVAL)?;
        // SAFETY: per the caller's contract; the frames are allocated and ours.
        unsafe { os::map_frame(addr, n * PAGE, self.bal.z.frame_file(), off, false) }?;
        self.mapped_anew(addr, n * PAGE);
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
    pub(crate) unsafe fn hide_new(&self, addr: usize, len: usize, how: Hide) -> Result<(), i32> {
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
        unsafe { self.hide(addr, len, how) }
    }

    /// Takes pages away so the next access faults: `PROT_NONE`, or a zap under userfaultfd
    /// (of pages whose mapping is registered: ones this layer hid before and has only
    /// revealed since, in place; others go through [`RegionShared::hide_new`]). Under
    /// mprotect, `how` says in which order, or whether the pages are zapped too (see
    /// [`Hide`]).
    ///
    /// # Safety
    /// The pages are mapped pages of this region that the caller has claimed.
    pub(crate) unsafe fn hide(&self, addr: usize, len: usize, how: Hide) -> Result<(), i32> {
        // SAFETY: per the caller's contract; the region's pages map the arena's memfd shared,
        // so a zap drops page-table entries and keeps the data.
        unsafe {
            match (&self.bal.uffd, how) {
                (Some(_), _) => os::zap(addr, len),
                (None, Hide::ZapFirst) => os::zap(addr, len).and_then(|()| os::protect(addr, len, true)),
                (None, Hide::ProtectFirst) => os::protect(addr, len, true).and_then(|()| os::zap(addr, len)),
                (None, Hide::ProtectOnly) => os::protect(addr, len, true),
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

impl From<Unresolved> for crate::Error {
    fn from(u: Unresolved) -> crate::Error {
        match u {
            Unresolved::NoFrame => {
                crate::Error::Zonal(zonal::Error::OutOfMemory { order: zonal::Order::new(0).expect("order 0") })
            }
            Unresolved::Map | Unresolved::Repair => crate::Error::Os { call: "mmap", errno: libc::ENOMEM },
            Unresolved::Forked => crate::Error::Forked,
        }
    }
}
