//! The one module that talks to the operating system: memory mappings, memfd, mbind,
//! the current CPU, and the files under `/sys` and `/proc` that describe the machine.
//!
//! Everything here returns [`Error::Os`] on failure with the call's name and errno, so a
//! caller can say which step failed; nothing here panics.

use crate::error::{Error, Result};
use std::ffi::CStr;
use std::os::fd::{FromRawFd, OwnedFd};

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

fn os_err(call: &'static str) -> Error {
    Error::Os { call, errno: errno() }
}

/// Creates an anonymous memory file (`memfd_create`) of `len` bytes.
pub fn memfd(name: &CStr, len: usize) -> Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(os_err("memfd_create"));
    }
    // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len_off = libc::off_t::try_from(len).map_err(|_| Error::Os { call: "ftruncate", errno: libc::EFBIG })?;
    // SAFETY: `fd` is a valid open descriptor owned by this function.
    if unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&fd), len_off) } != 0 {
        return Err(os_err("ftruncate"));
    }
    Ok(fd)
}

/// Reserves `len` bytes of address space with no access, aligned to `align` (a power of two).
/// Returns the aligned start; the whole reservation (start - slack .. ) is returned as the
/// second value so that it can be unmapped.
pub fn reserve(len: usize, align: usize) -> Result<(usize, usize, usize)> {
    let total = len.checked_add(align).ok_or(Error::Os { call: "mmap", errno: libc::ENOMEM })?;
    // SAFETY: a fresh anonymous PROT_NONE mapping at an address the kernel chooses touches no
    // existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap"));
    }
    let raw = p as usize;
    let start = (raw + align - 1) & !(align - 1);
    Ok((start, raw, total))
}

/// Maps `len` bytes of `fd` from `offset`, shared and read-write, exactly at `addr`, which
/// must lie inside a reservation made by [`reserve`].
///
/// # Safety
/// `addr..addr + len` must be address space this process reserved for zonal and that no live
/// Rust reference points into: the mapping replaces whatever was there.
pub unsafe fn map_shared_fixed(addr: usize, len: usize, fd: &OwnedFd, offset: usize, populate: bool) -> Result<()> {
    let mut flags = libc::MAP_SHARED | libc::MAP_FIXED;
    if populate {
        flags |= libc::MAP_POPULATE;
    }
    let off = libc::off_t::try_from(offset).map_err(|_| Error::Os { call: "mmap", errno: libc::EFBIG })?;
    // SAFETY: the caller guarantees the range is zonal's own reservation (see # Safety).
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            std::os::fd::AsRawFd::as_raw_fd(fd),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap"));
    }
    Ok(())
}

/// Marks a mapped range `MADV_DONTFORK` (as DPDK marks its memory): a child made by
/// `fork()` does not inherit it, so it shares none of these pages with the parent (the
/// range is a hole in the child until something maps it).
pub fn madvise_dontfork(addr: usize, len: usize) -> Result<()> {
    // SAFETY: MADV_DONTFORK changes only what a later fork copies; it never changes this
    // process's view of the range.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTFORK) } != 0 {
        return Err(os_err("madvise"));
    }
    Ok(())
}

/// Registers `child` to run in the child of every later `fork()` (`pthread_atfork`, no
/// prepare or parent handler). The handler must be async-signal-safe: the child of a
/// multi-threaded process may run nothing else before `exec`.
pub fn atfork_child(child: unsafe extern "C" fn()) -> Result<()> {
    // SAFETY: registering a handler has no precondition; the handler's own contract is the
    // caller's (above).
    match unsafe { libc::pthread_atfork(None, None, Some(child)) } {
        0 => Ok(()),
        errno => Err(Error::Os { call: "pthread_atfork", errno }),
    }
}

/// Maps private anonymous `PROT_NONE` memory over `addr..addr + len` (`MAP_FIXED`), so that
/// no later mapping can land there and every access faults; `false` if the kernel refused.
/// Async-signal-safe (one `mmap`, no allocation): for the child handler of `fork()`.
///
/// # Safety
/// Nothing may use the range's current contents afterwards: they are gone.
pub unsafe fn map_none_fixed(addr: usize, len: usize) -> bool {
    // SAFETY: the caller gives up the range (see # Safety); MAP_FIXED replaces whatever is
    // mapped there with inaccessible memory.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    p != libc::MAP_FAILED
}

/// Unmaps a range made by [`reserve`].
///
/// # Safety
/// No reference into the range may outlive this call.
pub unsafe fn unmap(addr: usize, len: usize) {
    // SAFETY: per the caller's contract the range is ours and unused.
    unsafe {
        libc::munmap(addr as *mut libc::c_void, len);
    }
}

/// Binds the pages of a range to one NUMA node (`mbind(MPOL_BIND)`).
pub fn mbind_node(addr: usize, len: usize, node: u16) -> Result<()> {
    const MPOL_BIND: libc::c_long = 2;
    let mut mask = vec![0u64; (node as usize / 64) + 1];
    mask[node as usize / 64] |= 1u64 << (node % 64);
    let maxnode = (mask.len() * 64 + 1) as libc::c_ulong;
    // SAFETY: mbind reads `mask` (valid for maxnode bits) and changes only the policy of the
    // range, which is zonal's own mapping.
    let r = unsafe { libc::syscall(libc::SYS_mbind, addr, len, MPOL_BIND, mask.as_ptr(), maxnode, 0usize) };
    if r != 0 {
        return Err(os_err("mbind"));
    }
    Ok(())
}

/// Locks a range in memory (`mlock`).
pub fn mlock(addr: usize, len: usize) -> Result<()> {
    // SAFETY: mlock does not change memory contents; the range is a live mapping of ours.
    if unsafe { libc::mlock(addr as *const libc::c_void, len) } != 0 {
        return Err(os_err("mlock"));
    }
    Ok(())
}

/// Asks for transparent huge pages on a range (`madvise(MADV_HUGEPAGE)`).
pub fn madvise_hugepage(addr: usize, len: usize) -> Result<()> {
    // SAFETY: MADV_HUGEPAGE is advice only; it never changes the contents of the range.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_HUGEPAGE) } != 0 {
        return Err(os_err("madvise"));
    }
    Ok(())
}

/// Faults a range of a fresh mapping in: `MADV_POPULATE_WRITE` (Linux 5.14), else one write
/// per frame.
///
/// # Safety
/// `addr..addr + len` is a live read-write mapping of zonal's that holds zeros and that no
/// one has been given yet, so writing the zero it holds changes nothing but residency.
pub unsafe fn populate(addr: usize, len: usize) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: advice on a mapping of ours (the caller's contract); it does not change contents.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len, MADV_POPULATE_WRITE) } == 0 {
        return;
    }
    for off in (0..len).step_by(crate::types::PAGE_SIZE) {
        // SAFETY: addr+off is inside the caller's fresh mapping, which holds the zero written.
        unsafe { std::ptr::write_volatile((addr + off) as *mut u8, 0) };
    }
}

/// The CPU this thread runs on now, as a hint: the `cpu_id` the kernel keeps in the
/// thread's rseq area when glibc registered one (two loads, no call), else `sched_getcpu`,
/// else 0. For choosing which lists to try; never for deciding whether a fence can be
/// skipped (see [`current_cpu_known`]).
#[inline]
pub fn current_cpu() -> u32 {
    current_cpu_known().unwrap_or(0)
}

/// The CPU this thread ran on at the moment of the call, or `None` when neither the rseq
/// area nor `sched_getcpu` can say: for callers whose correctness depends on the answer.
#[inline]
pub fn current_cpu_known() -> Option<u32> {
    rseq_cpu_id().or_else(sched_getcpu)
}

/// The `cpu_id` the kernel wrote into this thread's rseq area, when glibc registered one and
/// the kernel has set it (it is negative until then). The kernel rewrites it before the
/// thread returns to user space on another CPU, so while the thread runs it names the CPU it
/// runs on: a value read after some store was made was true at a moment after that store.
#[inline]
pub fn rseq_cpu_id() -> Option<u32> {
    let area = rseq_area()?;
    // SAFETY: `rseq_area` is this thread's registered area: glibc registered one for every
    // thread at `thread pointer + offset` (it published `__rseq_offset` with a non-zero
    // `__rseq_size`).
    unsafe { rseq_area_cpu_id(area) }
}

/// The `cpu_id` the kernel keeps in an rseq area (an i32 at byte 4 of `struct rseq`; negative
/// until the kernel has set it), read with a volatile load so that each call sees its latest
/// value: the fast paths read it from the area they already hold.
///
/// # Safety
/// `area` is the calling thread's registered `struct rseq` (see [`rseq_area`]).
#[inline(always)]
pub unsafe fn rseq_area_cpu_id(area: *mut u8) -> Option<u32> {
    // SAFETY: the caller passes this thread's live rseq area, at least 16 bytes long
    // (`rseq_offset` requires it), so byte 4..8 is its `cpu_id`.
    let id = unsafe { std::ptr::read_volatile(area.add(4) as *const i32) };
    u32::try_from(id).ok()
}

/// Milliseconds on `CLOCK_MONOTONIC_COARSE`: the kernel's tick-granular clock, read from the
/// vDSO without a syscall (the user-space `jiffies`), for hints that only need a tick's
/// precision. 0 if the clock cannot be read.
#[inline]
pub fn coarse_now_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime has no other precondition.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// `sched_getcpu`, or `None` if the kernel cannot say (`ENOSYS`): callers that only want a
/// hint pick their own default, and none mistakes a failure for CPU 0.
pub fn sched_getcpu() -> Option<u32> {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).ok()
}

/// The bytes of `struct rseq` zonal touches: `cpu_id_start`, `cpu_id`, `rseq_cs`.
const RSEQ_BYTES_USED: u32 = 16;

/// glibc's `__rseq_offset` when glibc registered rseq areas (glibc 2.35+, unless turned off
/// with `GLIBC_TUNABLES=glibc.pthread.rseq=0`); looked up once with `dlsym` so that zonal
/// still loads on an older libc.
#[inline]
pub fn rseq_offset() -> Option<isize> {
    static OFFSET: std::sync::OnceLock<Option<isize>> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(|| {
        if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            return None;
        }
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no other precondition.
        let (off, size) = unsafe {
            (
                libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
                libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
            )
        };
        if off.is_null() || size.is_null() {
            return None;
        }
        // SAFETY: glibc defines `__rseq_offset` as a ptrdiff_t and `__rseq_size` as an
        // unsigned int, both constant after startup.
        let (off, size) = unsafe { (*(off as *const isize), *(size as *const u32)) };
        // zonal reads `cpu_id` (bytes 4..8) and writes `rseq_cs` (bytes 8..16): an area
        // registered shorter than that is not used.
        (size >= RSEQ_BYTES_USED).then_some(off)
    })
}

/// This thread's rseq area (`struct rseq`) registered by glibc, if there is one.
#[inline]
pub fn rseq_area() -> Option<*mut u8> {
    rseq_offset().map(|off| (thread_pointer() as isize + off) as *mut u8)
}

/// `membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ)` once per process; whether
/// this process may fence rseq critical sections on a CPU (Linux 5.10+).
pub fn membarrier_rseq_registered() -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| {
        const QUERY: libc::c_long = 0;
        const PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 7;
        const REGISTER_PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 8;
        // SAFETY: membarrier queries and registrations take no pointers.
        let supported = unsafe { libc::syscall(libc::SYS_membarrier, QUERY, 0, 0) };
        if supported < 0 || supported & PRIVATE_EXPEDITED_RSEQ == 0 {
            return false;
        }
        // SAFETY: as above.
        unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_PRIVATE_EXPEDITED_RSEQ, 0, 0) == 0 }
    })
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 7;

/// Restarts any rseq critical section of this process running on `cpu` and waits until that
/// CPU has passed a full barrier (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, CPU)`).
/// The error carries the errno: `EPERM` before registration, `ENOMEM` when the kernel could
/// not allocate, and on some kernels `EINVAL` or `ENXIO` for a CPU that does not exist or is
/// offline (others return 0 for those).
pub fn membarrier_rseq_fence(cpu: u32) -> Result<()> {
    const FLAG_CPU: libc::c_long = 1;
    let cpu = libc::c_long::from(cpu);
    // SAFETY: membarrier takes no pointers.
    if unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, FLAG_CPU, cpu) } != 0 {
        return Err(os_err("membarrier"));
    }
    Ok(())
}

/// Restarts every rseq critical section of this process on every CPU
/// (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)` without a CPU): the fallback when the
/// one-CPU form fails.
pub fn membarrier_rseq_fence_all() -> Result<()> {
    // SAFETY: membarrier takes no pointers.
    if unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, 0, 0) } != 0 {
        return Err(os_err("membarrier"));
    }
    Ok(())
}

/// The thread pointer (the TLS base the rseq offset is relative to).
#[inline]
pub(crate) fn thread_pointer() -> usize {
    let tp: usize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads the TCB's self pointer at %fs:0, which glibc sets for every thread.
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: reads the thread pointer register, which has no side effects.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        tp = 0;
    }
    tp
}

/// Number of CPUs the machine has configured (`_SC_NPROCESSORS_CONF`), at least 1.
pub fn nr_cpus_configured() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    if n < 1 {
        1
    } else {
        n as usize
    }
}

/// Number of CPUs online (`_SC_NPROCESSORS_ONLN`), at least 1.
pub fn nr_cpus_online() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n < 1 {
        1
    } else {
        n as usize
    }
}

/// Pins the calling thread to one CPU (`sched_setaffinity`).
pub fn set_affinity(cpu: u32) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu as usize >= libc::CPU_SETSIZE as usize {
        return Err(Error::Os { call: "sched_setaffinity", errno: libc::EINVAL });
    }
    // SAFETY: CPU_SET writes within `set` for cpu < CPU_SETSIZE, checked just before.
    unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(os_err("sched_setaffinity"));
    }
    Ok(())
}

/// Lets the calling thread run on every online CPU again (undoes [`set_affinity`]).
pub fn allow_all_cpus() -> Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in 0..nr_cpus_configured().min(libc::CPU_SETSIZE as usize) {
        // SAFETY: cpu < CPU_SETSIZE, so CPU_SET writes within `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(os_err("sched_setaffinity"));
    }
    Ok(())
}

/// Total memory of the machine in bytes (`MemTotal` of `/proc/meminfo`).
pub fn mem_total() -> Result<u64> {
    let s = read_file("/proc/meminfo")?;
    meminfo_kb(&s, "MemTotal:").map(|kb| kb * 1024).ok_or(Error::Os { call: "read /proc/meminfo", errno: libc::EINVAL })
}

/// Parses a `Name: N kB` line of a meminfo file (also the per-node ones, which start with
/// `Node N `).
pub fn meminfo_kb(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let i = l.find(key)?;
        l[i + key.len()..].split_whitespace().next()?.parse().ok()
    })
}

/// Reads a whole text file, mapping failure to [`Error::Os`].
pub fn read_file(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::Os { call: "read", errno: e.raw_os_error().unwrap_or(libc::EIO) })
}

/// The effective user id of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// The process id and effective user id of the peer of a connected Unix socket
/// (`SO_PEERCRED`), as the kernel recorded them when the peer connected.
pub fn peer_cred(fd: std::os::fd::BorrowedFd<'_>) -> Result<(i32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, and `fd` is an open
    // descriptor for the duration of the call.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(os_err("getsockopt(SO_PEERCRED)"));
    }
    Ok((cred.pid, cred.uid))
}

/// A pipe whose ends close on exec: `(read, write)`.
pub fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(os_err("pipe2"));
    }
    // SAFETY: pipe2 returned two fresh descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Writes one byte to a descriptor, ignoring a full pipe (a wake-up already pending).
pub fn poke(fd: std::os::fd::BorrowedFd<'_>) {
    let b = 1u8;
    // SAFETY: the buffer is one valid byte and `fd` is open for the call.
    let _ = unsafe { libc::write(std::os::fd::AsRawFd::as_raw_fd(&fd), (&b as *const u8).cast(), 1) };
}

/// Waits until one of `fds` is readable (or has hung up); returns which are. `EINTR` is
/// retried. `timeout_ms` < 0 waits for ever.
pub fn poll_readable(fds: &[std::os::fd::BorrowedFd<'_>], timeout_ms: i32) -> Result<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(fd), events: libc::POLLIN, revents: 0 })
        .collect();
    loop {
        // SAFETY: `p` holds `p.len()` valid pollfd entries for the call.
        let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
        if r >= 0 {
            return Ok(p.iter().map(|e| e.revents != 0).collect());
        }
        if errno() != libc::EINTR {
            return Err(os_err("poll"));
        }
    }
}

/// Sends all of `buf` on a connected socket without raising `SIGPIPE` when the peer is
/// gone (`MSG_NOSIGNAL`): a vanished client is an error here, never a dead process. Waits
/// as the socket's send timeout allows.
pub fn send_all(fd: std::os::fd::BorrowedFd<'_>, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for reads of its length and `fd` is open for the call.
        let n = unsafe {
            libc::send(std::os::fd::AsRawFd::as_raw_fd(&fd), buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL)
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// Whether a process exists (`kill(pid, 0)`: a process of another user counts).
pub fn process_exists(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || errno() == libc::EPERM }
}

#[cfg(test)]
mod cpu_tests {
    use super::*;

    #[test]
    fn rseq_cpu_agrees_with_sched_getcpu() {
        // Pin to each CPU in turn: both sources must name it.
        for cpu in 0..nr_cpus_online() as u32 {
            if set_affinity(cpu).is_err() {
                continue;
            }
            assert_eq!(current_cpu(), cpu);
            assert_eq!(current_cpu_known(), Some(cpu));
            assert_eq!(sched_getcpu(), Some(cpu));
            if rseq_offset().is_some() {
                assert_eq!(rseq_cpu_id(), Some(cpu));
            }
        }
    }
}
