//! Restartable sequences over the per-CPU caches: pop and push of one block (order 0, or one
//! of orders 1 to 3 or the pageblock order in its order's cache) or of a run of order-0
//! blocks, with no lock and no atomic read-modify-write, the way Linux relies on preemption
//! being disabled.
//!
//! Each critical section reads the CPU id from the thread's rseq area (registered by glibc),
//! finds that CPU's `PerCpuPages`, gives up if its lock is held, and commits with one store
//! of the cache length. If the thread is preempted, migrated or signalled inside the section,
//! the kernel restarts it at the abort handler, which reports failure, and the caller takes
//! the locked path. Lockers on another CPU fence it with `membarrier` first
//! ([`PerCpuPages::try_lock`]). x86-64 only; elsewhere, and when rseq or membarrier is
//! unavailable (e.g. `GLIBC_TUNABLES=glibc.pthread.rseq=0`), `enabled()` is false.
//!
//! Kernel counterpart: the rseq ABI (`struct rseq`, `struct rseq_cs`, kernel/rseq.c) and
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)`; the pattern is tcmalloc's per-CPU
//! caches and librseq's `rseq_cmpeqv_storev`.
//!
//! Locking: none inside a section; a section gives way whenever its CPU's lists are locked,
//! and a locker on another CPU fences that CPU ([`fence`]) before it touches the cache.
//! Invariant: a section commits with exactly one store of the cache's word, the last
//! instruction of its restartable range, so the cache is either untouched or changed as a
//! whole; a push commits only below its cache's bound (`cache_limit <= CACHE_CAP`, a small
//! cache's `limit <= SMALL_CACHE_CAP`), which it reads before the word.
//!
//! This file is the portable part (whether sections can run, the fence, the table, the
//! public functions); the bodies are per architecture: `x86_64.rs` holds the sections in
//! assembly, `stub.rs` the empty bodies for other architectures and for loom builds.

use super::PerCpuPages;
use std::mem::MaybeUninit;

#[cfg(all(target_arch = "x86_64", not(loom)))]
mod x86_64;
#[cfg(all(target_arch = "x86_64", not(loom)))]
use x86_64 as arch;

#[cfg(not(all(target_arch = "x86_64", not(loom))))]
mod stub;
#[cfg(not(all(target_arch = "x86_64", not(loom))))]
use stub as arch;

/// Whether the critical sections can run in this process.
#[inline]
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    arch::SUPPORTED
        && *ON.get_or_init(|| {
            std::env::var_os("ZONAL_NO_RSEQ").is_none()
                && crate::sys::rseq_offset().is_some()
                && crate::sys::membarrier_rseq_registered()
        })
}

/// Restarts critical sections on `cpu`, adding the `membarrier` calls made to `calls`;
/// whether it is done, so that a lock holder may touch that CPU's cache.
pub fn fence(cpu: u32, calls: &mut u64) -> bool {
    fence_with(
        cpu,
        crate::sys::nr_cpus_configured(),
        |c| crate::sys::membarrier_rseq_fence(c).map_err(os_errno),
        || crate::sys::membarrier_rseq_fence_all().map_err(os_errno),
        calls,
    )
}

fn os_errno(e: crate::error::Error) -> i32 {
    match e {
        crate::error::Error::Os { errno, .. } => errno,
        _ => libc::EIO,
    }
}

/// The fence's decision, with the two `membarrier` forms passed in (tests inject
/// failures). The one-CPU form first. Failing with `EINVAL` or `ENXIO` for a CPU the
/// machine does not have (a fake topology may have more CPUs than the machine, e.g.
/// lists of CPU 5 on 2 CPUs) is as good as done: no thread can run there, so no section
/// can be inside. Any other failure (or one for a CPU that exists, possibly offline)
/// falls back to the all-CPU form, as tcmalloc falls back to fencing every CPU; if that
/// fails too, the fence is not done and the holder must leave the cache alone.
pub fn fence_with(
    cpu: u32,
    machine_cpus: usize,
    one: impl FnOnce(u32) -> Result<(), i32>,
    all: impl FnOnce() -> Result<(), i32>,
    calls: &mut u64,
) -> bool {
    *calls += 1;
    match one(cpu) {
        Ok(()) => return true,
        Err(libc::EINVAL | libc::ENXIO) if cpu as usize >= machine_cpus => return true,
        Err(_) => {}
    }
    *calls += 1;
    all().is_ok()
}

/// Where the critical sections find the per-CPU structures: `pcps[cpu * nr_zones + zone]`.
// Only the architecture files' sections read the fields; the stub (other targets, loom) does not.
#[cfg_attr(not(all(target_arch = "x86_64", not(loom))), allow(dead_code))]
#[derive(Clone, Copy, Debug)]
pub struct Table {
    /// glibc's `__rseq_offset`: the calling thread's registered rseq area (`struct rseq`)
    /// lies at the thread pointer plus this, which the sections address through the thread
    /// pointer's segment (`fs:` on x86-64) rather than loading the pointer first.
    pub rseq: isize,
    /// `pcps.as_ptr()`.
    pub base: *const PerCpuPages,
    /// CPUs in the table.
    pub nr_cpus: usize,
    /// Zones per CPU.
    pub nr_zones: usize,
}

/// Where the local-zone section finds the lists of the current CPU's local zone:
/// `local[cpu]` is the address of that `PerCpuPages`, or of a stand-in whose lock is always
/// held for a CPU the fast path does not serve (see [`LOCKED_STANDIN`]) and for a CPU id
/// the handle does not have ([`ABSENT_STANDIN`]).
#[cfg_attr(not(all(target_arch = "x86_64", not(loom))), allow(dead_code))]
#[derive(Clone, Copy, Debug)]
pub struct LocalTable {
    /// As [`Table::rseq`].
    pub rseq: isize,
    /// [`LOCAL_CPUS`] addresses.
    pub local: *const usize,
}

/// Entries of a handle's local table, one per CPU id below it, whatever the handle's CPUs:
/// the sections bound the id with this constant, not with a count loaded from the handle
/// (a memory operation in each of the pair's two sections, which bound it). A CPU id at or
/// above it takes the general paths.
pub(crate) const LOCAL_CPUS: usize = 4096;

/// Where the fast free's section finds the lists for a frame: the current CPU's local lists
/// (`local`, as in [`LocalTable`]) when the frame lies in their zone's span, else those of
/// the frame's zone (`block_zone[pfn >> block_shift]`, when below `nr_zones`), that CPU's
/// (`remote[zone * nr_cpus + cpu]`; a CPU id the handle does not have finds
/// [`ABSENT_STANDIN`], whose span holds every frame, so it never gets there). Built once
/// per handle; the section reads `local` on every free, the rest only for a frame of
/// another zone.
#[cfg_attr(not(all(target_arch = "x86_64", not(loom))), allow(dead_code))]
#[repr(C)]
#[derive(Debug)]
pub struct FrameTable {
    /// [`LOCAL_CPUS`] addresses: each CPU's lists of its local zone, or a stand-in.
    pub local: *const usize,
    /// CPUs in the tables.
    pub nr_cpus: usize,
    /// `nr_zones * nr_cpus` addresses: every CPU's lists of every zone, `[zone * nr_cpus + cpu]`.
    pub remote: *const usize,
    /// Zones in `remote`.
    pub nr_zones: usize,
    /// The zone of each block of `1 << block_shift` frames (a `ZoneId`, or none when at
    /// least `nr_zones`).
    pub block_zone: *const u16,
    /// Entries of `block_zone`.
    pub nr_blocks: usize,
    /// log2 of the frames of a block of `block_zone` (the handle's `max_order`).
    pub block_shift: u64,
}

// SAFETY: the pointers are addresses of tables that the handle holding this one owns and
// never changes after building it; the table is only read.
unsafe impl Send for FrameTable {}
// SAFETY: as above: shared reads of immutable tables.
unsafe impl Sync for FrameTable {}

/// A stand-in for a CPU's lists in a [`LocalTable`]: 128 bytes, every one 1, so that the
/// lock byte a section reads first is set and it reads nothing further.
#[repr(C, align(128))]
pub struct Standin([u8; 128]);

/// The stand-in `LocalTable` points a CPU at when the fast path does not serve it: every
/// byte is 1, so the gate and lock read as held (0x101) and an allocation's section gives
/// way at once; the span the fast free compares starts at frame 0x0101_0101_0101_0101,
/// past any frame (a frame's number is an address shifted by 12), so a free takes the
/// frame's zone's lists, which serve it.
pub static LOCKED_STANDIN: Standin = Standin([1; 128]);

/// The stand-in for CPU ids the handle does not have (from its CPU count to
/// [`LOCAL_CPUS`]): as [`LOCKED_STANDIN`], but its span holds every frame, so that a free's
/// section tests its lock too and gives way, rather than index the other zones' table
/// with a CPU id past it.
pub static ABSENT_STANDIN: Standin = Standin(absent_bytes());

const fn absent_bytes() -> [u8; 128] {
    let mut b = [1u8; 128];
    let (start, pages) = (std::mem::offset_of!(PerCpuPages, span_start), std::mem::offset_of!(PerCpuPages, span_pages));
    let mut i = 0;
    while i < 8 {
        b[start + i] = 0;
        b[pages + i] = 0xff;
        i += 1;
    }
    b
}

// The gate, the lock and the span a section reads of an entry lie inside a stand-in.
const _: () = assert!(std::mem::offset_of!(PerCpuPages, gate) < std::mem::size_of::<Standin>());
const _: () = assert!(std::mem::offset_of!(PerCpuPages, lock) < std::mem::size_of::<Standin>());
const _: () = assert!(std::mem::offset_of!(PerCpuPages, span_start) + 8 <= std::mem::size_of::<Standin>());
const _: () = assert!(std::mem::offset_of!(PerCpuPages, span_pages) + 8 <= std::mem::size_of::<Standin>());

/// Pops an order-0 block from the cache of the current CPU's local-zone lists in one
/// section (the CPU id, its lists from the table, their gate and lock in one load, the pop),
/// counting it in the cache word's pops (`pcp::word`), and returns it with that CPU; `None`
/// when the zone is not above `low` (the lists' gate, `Zone::above_low`'s copy), the cache is empty, the lists are
/// locked or a stand-in, the count is at its guard bit, or the section was interrupted.
///
/// # Safety
/// `t.rseq` places the calling thread's registered rseq area; `t.local` points to
/// [`LOCAL_CPUS`] addresses, each of live `PerCpuPages` that outlive the call or of a
/// stand-in ([`LOCKED_STANDIN`], [`ABSENT_STANDIN`]).
#[inline]
pub unsafe fn pop_local(t: &LocalTable) -> Option<(usize, usize)> {
    // SAFETY: the caller's contract, which is the section's.
    unsafe { arch::pop_local(t) }
}

/// Pops an order-0 block from the cache of the current CPU's lists for `zone`; `None`
/// when the cache is empty, the lists are locked, the word's pops are at their guard bit
/// (so that the locked path runs and folds them, see `pcp::word`), or the section was
/// interrupted.
///
/// # Safety
/// `t.rseq` places the calling thread's registered rseq area, `t.base` points to
/// `t.nr_cpus * t.nr_zones` live `PerCpuPages` laid out `[cpu * nr_zones + zone]` that outlive
/// the call, and `zone < t.nr_zones`: the section indexes the table with the CPU id the
/// kernel wrote (checked against `nr_cpus`) and `zone` (not checked).
#[inline]
pub unsafe fn pop(t: &Table, zone: usize) -> Option<usize> {
    // SAFETY: the caller's contract, which is the section's.
    unsafe { arch::pop(t, zone) }
}

/// Pushes an order-0 block (head already tagged `PCP`) onto the cache of the current CPU's
/// lists for the block's zone, counting it in the cache word's pushes (`pcp::word`), and
/// returns the CPU; `usize::MAX` when the cache is at its bound, the lists are locked, the
/// count is at its guard bit, the frame's block has no zone in `t`, or the section was
/// interrupted. The lists are the CPU's local ones when the frame lies in their zone's
/// span, which a frame freed on its own node's CPU does, and are found from `t.remote`
/// otherwise, in one section either way. On the local lists, a frame whose run's `owner`
/// (the hint the caller read, `mem_map::MapRef::run_owner`) is not the current CPU goes to
/// the lists' outbox instead (counted in the outbox's word, its bound as the cache's), on
/// its way back to its owner's lists (`pcp::lists::deliver`).
///
/// # Safety
/// `rseq` places the calling thread's registered rseq area; `t.local` points to
/// [`LOCAL_CPUS`] addresses, each of live `PerCpuPages` or of [`LOCKED_STANDIN`] for a CPU
/// below `t.nr_cpus`, of [`ABSENT_STANDIN`] from there on; `t.remote` to
/// `t.nr_zones * t.nr_cpus` addresses, `[zone * nr_cpus + cpu]` of the live `PerCpuPages` of
/// `cpu` for `zone`; `t.block_zone` to `t.nr_blocks` entries; all outlive the call. The
/// spans of the lists' zones do not overlap, and a frame in a zone's span has that zone in
/// `block_zone`.
#[inline]
pub unsafe fn push_frame(rseq: isize, t: &FrameTable, pfn: usize, owner: u16) -> usize {
    // SAFETY: the caller's contract, which is the section's.
    unsafe { arch::push_frame(rseq, t, pfn, owner) }
}

/// Pops a block of `order` (1 to [`crate::pcp::PCP_MAX_ORDER`], or the pageblock order)
/// from that order's cache of the current CPU's local-zone lists in one section, as
/// [`pop_local`] does for order 0, and returns it with that CPU, counting it in the cache's
/// word (its pops, `pcp::word`); `None` when the zone's level is below `LEVEL` (the lists'
/// gate, `Zone::above_low`: `ABOVE_LOW_SMALL` for orders up to 3, `ABOVE_LOW_THP` for the
/// pageblock order), the cache is empty, the lists are locked or a stand-in, the count of
/// pops is at its guard bit, or the section was interrupted.
///
/// # Safety
/// As [`pop_local`], and `order` is 1 to `PCP_MAX_ORDER` or `PCP_THP_ORDER`.
#[inline]
pub unsafe fn pop_small_local<const LEVEL: u8>(t: &LocalTable, order: crate::types::Order) -> Option<(usize, usize)> {
    // SAFETY: the caller's contract, which is the section's.
    unsafe { arch::pop_small_local::<LEVEL>(t, order) }
}

/// Pushes a block of `order` (1 to [`crate::pcp::PCP_MAX_ORDER`] or the pageblock order,
/// its head already tagged `PCP|order`) onto that order's cache of the current CPU's lists for the block's zone,
/// found as [`push_frame`] finds them, in one section, counting it in the cache's word (its
/// pushes), and returns the CPU; `usize::MAX` when the cache is at its bound, the lists are
/// locked, the count of pushes is at its guard bit, the block has no zone in `t`, or the
/// section was interrupted.
///
/// # Safety
/// As [`push_frame`], and `order` is 1 to `PCP_MAX_ORDER` or `PCP_THP_ORDER`.
#[inline]
pub unsafe fn push_small_frame(rseq: isize, t: &FrameTable, pfn: usize, order: crate::types::Order) -> usize {
    // SAFETY: the caller's contract, which is the section's.
    unsafe { arch::push_small_frame(rseq, t, pfn, order) }
}

/// Pops up to `out.len()` order-0 blocks from the cache of the current CPU's lists for
/// `zone` in one critical section into the front of `out`, and returns them (none when
/// the cache is empty, the lists are locked, or the section was interrupted). `out` needs
/// no initialising: the bulk allocator calls this per chunk, and zeroing a buffer first
/// would cost as much as the pops.
///
/// # Safety
/// `t.rseq` places the calling thread's registered rseq area, `t.base` points to
/// `t.nr_cpus * t.nr_zones` live `PerCpuPages` laid out `[cpu * nr_zones + zone]` that outlive
/// the call, and `zone < t.nr_zones`: the section indexes the table with the CPU id the
/// kernel wrote (checked against `nr_cpus`) and `zone` (not checked).
#[inline]
pub unsafe fn pop_many<'a>(t: &Table, zone: usize, out: &'a mut [MaybeUninit<usize>]) -> &'a [usize] {
    // SAFETY: the caller's contract, which is the section's.
    unsafe { arch::pop_many(t, zone, out) }
}

/// Pushes a prefix of `pfns` (order-0 blocks, heads already tagged `PCP`) onto the cache
/// of the current CPU's lists for `zone` in one critical section, as much as the cache's
/// bound allows; returns how many (0 when full, locked, or interrupted).
///
/// # Safety
/// `t.rseq` places the calling thread's registered rseq area, `t.base` points to
/// `t.nr_cpus * t.nr_zones` live `PerCpuPages` laid out `[cpu * nr_zones + zone]` that outlive
/// the call, and `zone < t.nr_zones`: the section indexes the table with the CPU id the
/// kernel wrote (checked against `nr_cpus`) and `zone` (not checked).
#[inline]
pub unsafe fn push_many(t: &Table, zone: usize, pfns: &[usize]) -> usize {
    // SAFETY: the caller's contract, which is the section's.
    unsafe { arch::push_many::<false>(t, zone, pfns) }
}

/// [`push_many`] onto the outbox of the current CPU's lists for `zone` (frames of runs
/// other CPUs own, on their way back to them), as much as the outbox's bound allows;
/// returns how many.
///
/// # Safety
/// As [`push_many`].
#[inline]
pub unsafe fn push_outbox_many(t: &Table, zone: usize, pfns: &[usize]) -> usize {
    // SAFETY: the caller's contract, which is the section's.
    unsafe { arch::push_many::<true>(t, zone, pfns) }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The fence's fallbacks: a failure for a CPU the machine lacks counts as done; other
    /// failures fall back to the all-CPU fence; if that fails too the holder may not touch
    /// the cache. Every call is counted.
    #[test]
    fn fence_falls_back_and_reports_failure() {
        let mut calls = 0;
        assert!(fence_with(1, 2, |_| Ok(()), || panic!("no fallback needed"), &mut calls));
        assert_eq!(calls, 1);
        let mut calls = 0;
        assert!(fence_with(5, 2, |_| Err(libc::EINVAL), || panic!("CPU 5 does not exist"), &mut calls));
        assert!(fence_with(5, 2, |_| Err(libc::ENXIO), || panic!("CPU 5 does not exist"), &mut calls));
        assert_eq!(calls, 2);
        let mut calls = 0;
        assert!(fence_with(1, 2, |_| Err(libc::EINVAL), || Ok(()), &mut calls), "an existing CPU falls back");
        assert!(fence_with(7, 2, |_| Err(libc::ENOMEM), || Ok(()), &mut calls));
        assert_eq!(calls, 4);
        let mut calls = 0;
        assert!(!fence_with(1, 2, |_| Err(libc::EPERM), || Err(libc::EPERM), &mut calls));
        assert_eq!(calls, 2);
        // The real calls: a CPU far beyond the machine is fenced (or safely refused).
        if enabled() {
            let mut calls = 0;
            assert!(fence(crate::sys::nr_cpus_configured() as u32 + 3, &mut calls));
            assert!(fence(0, &mut calls));
            assert!(calls >= 2);
        }
    }

    /// A CPU whose table entry is a stand-in gives way at once: its gate and lock read as
    /// held, and nothing past them is read or written. A free on a CPU id the handle does
    /// not have gives way too, without reaching the other zones' table (null here, which
    /// the section would fault on).
    #[test]
    fn the_stand_ins_give_way() {
        let Some(rseq) = crate::sys::rseq_offset().filter(|_| enabled()) else {
            eprintln!("SKIPPED: no restartable sequences here");
            return;
        };
        for standin in [&LOCKED_STANDIN, &ABSENT_STANDIN] {
            let local = vec![std::ptr::from_ref(standin) as usize; LOCAL_CPUS];
            let t = LocalTable { rseq, local: local.as_ptr() };
            // SAFETY: this thread's rseq area; every one of the `LOCAL_CPUS` entries is a
            // stand-in.
            unsafe {
                assert_eq!(pop_local(&t), None);
                assert_eq!(pop_small_local::<{ crate::zone::ABOVE_LOW_SMALL }>(&t, crate::types::Order(2)), None);
                assert_eq!(pop_small_local::<{ crate::zone::ABOVE_LOW_THP }>(&t, crate::pcp::PCP_THP_ORDER), None);
            }
        }
        let absent = vec![std::ptr::from_ref(&ABSENT_STANDIN) as usize; LOCAL_CPUS];
        let ft = FrameTable {
            local: absent.as_ptr(),
            nr_cpus: 0,
            remote: std::ptr::null(),
            nr_zones: 0,
            block_zone: std::ptr::null(),
            nr_blocks: 0,
            block_shift: 10,
        };
        // SAFETY: this thread's rseq area; every entry is the absent stand-in, whose span
        // holds every frame, so the sections read no other table.
        unsafe {
            assert_eq!(push_frame(rseq, &ft, 0x1234, 0), usize::MAX);
            assert_eq!(push_frame(rseq, &ft, 0x1234, crate::mem_map::NO_OWNER), usize::MAX);
            assert_eq!(push_small_frame(rseq, &ft, 0x1234, crate::types::Order(1)), usize::MAX);
            assert_eq!(push_small_frame(rseq, &ft, 0x1200, crate::pcp::PCP_THP_ORDER), usize::MAX);
        }
        assert!(LOCKED_STANDIN.0.iter().all(|&b| b == 1), "the stand-in is never written");
        assert_eq!(ABSENT_STANDIN.0, absent_bytes(), "nor is the absent one");
    }
}
