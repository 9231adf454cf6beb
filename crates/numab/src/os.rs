//! Every system call of the layer, each a thin wrapper that says what it needs to be sound.
//! All of them are async-signal-safe (raw system calls, no allocation, no lock), because the
//! fault handler uses them.

use std::os::fd::{AsRawFd, BorrowedFd};

/// The OS page size zonal's frames have.
pub const PAGE: usize = zonal::PAGE_SIZE;

/// `errno` of the last failed call of this thread.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Reserves `len` bytes of address space, inaccessible and backed by nothing, aligned to
/// `align` (a power of two). Returns the aligned start; the reservation is exactly
/// `start..start + len` (the slack around it is given back).
pub fn reserve(len: usize, align: usize) -> Result<usize, i32> {
    let total = len.checked_add(align).ok_or(libc::ENOMEM)?;
    // SAFETY: a fresh private anonymous PROT_NONE mapping at an address the kernel picks
    // touches no existing memory.
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
        return Err(errno());
    }
    let raw = p as usize;
    let start = (raw + align - 1) & !(align - 1);
    // SAFETY: both trims lie inside the mapping just made, which nothing else knows of.
    unsafe {
        if start > raw {
            libc::munmap(raw as *mut libc::c_void, start - raw);
        }
        let end = start + len;
        if raw + total > end {
            libc::munmap(end as *mut libc::c_void, raw + total - end);
        }
    }
    Ok(start)
}

/// Unmaps `addr..addr + len`.
///
/// # Safety
/// The range is the caller's (a region's reservation) and no reference points into it.
pub unsafe fn unmap(addr: usize, len: usize) {
    // SAFETY: per the caller's contract.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

/// Maps `len` bytes of `fd` at `offset` onto `addr` (`MAP_SHARED | MAP_FIXED`), readable and
/// writable, or inaccessible when `prot_none`; the page-table entries are filled at once
/// (`MAP_POPULATE`), so the first access takes no fault (under userfaultfd MINOR
/// registration an empty entry would be a fault of its own).
///
/// # Safety
/// `addr..addr + len` is the caller's (a region's reservation): whatever was mapped there is
/// replaced, so nothing may rely on it.
pub unsafe fn map_frame(addr: usize, len: usize, fd: BorrowedFd<'_>, offset: u64, prot_none: bool) -> Result<(), i32> {
    let prot = if prot_none { libc::PROT_NONE } else { libc::PROT_READ | libc::PROT_WRITE };
    let off = libc::off_t::try_from(offset).map_err(|_| libc::EFBIG)?;
    // SAFETY: per the caller's contract the range is the caller's to replace.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            prot,
            libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(errno());
    }
    Ok(())
}

/// Changes the protection of `addr..addr + len` to read-write, or none.
///
/// # Safety
/// The range is the caller's (mapped pages of a region): no other code relies on its
/// protection.
pub unsafe fn protect(addr: usize, len: usize, none: bool) -> Result<(), i32> {
    let prot = if none { libc::PROT_NONE } else { libc::PROT_READ | libc::PROT_WRITE };
    // SAFETY: per the caller's contract.
    if unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// Drops the page-table entries of `addr..addr + len` (`MADV_DONTNEED`); the file keeps
/// the pages, and the next access faults.
///
/// # Safety
/// The range is the caller's and mapped `MAP_SHARED` from a file (on private memory this
/// would discard the data).
pub unsafe fn zap(addr: usize, len: usize) -> Result<(), i32> {
    // SAFETY: per the caller's contract.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// Fills the page-table entries of `addr..addr + len` writable (`MADV_POPULATE_WRITE`), as
/// an access to each page would.
///
/// # Safety
/// The range is the caller's, mapped read-write.
pub unsafe fn populate(addr: usize, len: usize) -> Result<(), i32> {
    // SAFETY: per the caller's contract; populating changes no contents of a shared mapping.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// Nanoseconds on the monotonic clock (`clock_gettime`, async-signal-safe).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is valid for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This thread's id (`gettid`).
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Wakes every waiter on `word` (`FUTEX_WAKE`).
pub fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: `word` is a valid aligned u32 for the duration of the call.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX);
    }
}

/// Waits on `word` while it holds `val`, at most `timeout` (`FUTEX_WAIT`); returns on a wake,
/// a change, a signal or the timeout.
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, val: u32, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` and `ts` are valid for the duration of the call.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, val, &ts);
    }
}

/// Yields the CPU (`sched_yield`, async-signal-safe).
pub fn yield_cpu() {
    // SAFETY: sched_yield has no preconditions.
    unsafe { libc::sched_yield() };
}

/// Writes a message to standard error from any context (one `write`).
pub fn write_stderr(msg: &[u8]) {
    // SAFETY: `msg` is valid for its length.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// The system's `vm.max_map_count`, or Linux's default when it cannot be read.
pub fn max_map_count() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(65_530)
}

/// The process's mappings now (lines of `/proc/self/maps`), or `None` when unreadable.
pub fn nr_mappings() -> Option<usize> {
    use std::io::Read;
    let mut f = std::fs::File::open("/proc/self/maps").ok()?;
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0;
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Some(n),
            Ok(k) => n += buf[..k].iter().filter(|&&b| b == b'\n').count(),
            Err(_) => return None,
        }
    }
}

/// Replaces `addr..addr + len` with an inaccessible private reservation backed by nothing
/// (one `mmap`, `MAP_FIXED`): whatever was mapped there is gone, and nothing else can be
/// mapped there by the kernel's choice.
///
/// # Safety
/// The range is the caller's (a region's reservation) and no reference points into it.
pub unsafe fn replace_with_reservation(addr: usize, len: usize) {
    // SAFETY: per the caller's contract the range is the caller's to replace.
    unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

/// Asynchronous signals blocked on this thread while it lives (`pthread_sigmask`), the
/// faults' signals left open: a thread holding a page `BUSY` must not run a handler of the
/// program's that could touch that page and wait for itself. Restores the mask on drop.
pub struct SignalsBlocked {
    old: libc::sigset_t,
}

impl SignalsBlocked {
    /// Blocks every signal but the synchronous ones a fault raises.
    pub fn new() -> SignalsBlocked {
        // SAFETY: the sets are valid for the calls; pthread_sigmask changes this thread's
        // mask only, and the synchronous signals stay deliverable.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            for s in [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP] {
                libc::sigdelset(&mut all, s);
            }
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            SignalsBlocked { old }
        }
    }
}

impl Default for SignalsBlocked {
    fn default() -> SignalsBlocked {
        SignalsBlocked::new()
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask `new` saved, for this thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}
