//! The userfaultfd backend's system calls: a userfaultfd with MINOR faults on shmem delivered
//! as `SIGBUS` in the faulting thread, registration of a mapped page, and `UFFDIO_CONTINUE`,
//! which maps the page the file already holds. All are raw `ioctl`s, async-signal-safe.
//!
//! The constants are Linux's UAPI (include/uapi/linux/userfaultfd.h), which the libc crate
//! does not carry.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const UFFD_API: u64 = 0xaa;
const UFFDIO: u64 = 0xaa;
/// `_IOWR(UFFDIO, nr, size)`: read and write, the size, the type, the number.
const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}
const UFFDIO_API: u64 = iowr(0x3f, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = iowr(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_CONTINUE: u64 = iowr(0x07, std::mem::size_of::<UffdioContinue>());
/// `_IOR(UFFDIO, _UFFDIO_WAKE, struct uffdio_range)`.
const UFFDIO_WAKE: u64 = (2 << 30) | ((std::mem::size_of::<UffdioRange>() as u64) << 16) | (UFFDIO << 8) | 0x02;
const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
const UFFDIO_CONTINUE_MODE_DONTWAKE: u64 = 1 << 0;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFDIO_REGISTER_MODE_MINOR: u64 = 1 << 2;
const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
const UFFD_FEATURE_MINOR_SHMEM: u64 = 1 << 10;
/// `userfaultfd(2)` flag: only faults from user mode (what an unprivileged process may ask
/// for when `vm.unprivileged_userfaultfd` is 0).
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    mapped: i64,
}

/// `struct uffd_msg` for a page fault: the event, then (at 8) flags, address and the
/// faulting thread's id.
#[repr(C)]
#[derive(Default)]
struct UffdMsg {
    event: u8,
    _reserved: [u8; 7],
    flags: u64,
    address: u64,
    ptid: u32,
    _pad: u32,
}

/// A fault read from a handler-thread userfaultfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub address: usize,
    pub tid: u32,
}

/// A userfaultfd set up for MINOR faults on shmem: delivered as `SIGBUS` in the faulting
/// thread, or (`thread`) queued for a handler thread, which also serves faults taken in
/// the kernel (a system call's access to a region page).
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    thread: bool,
}

impl Uffd {
    /// Opens one, user-mode faults only first (allowed unprivileged), else any. `Err` names
    /// the call and errno, or `ENOTSUP` when the kernel lacks MINOR shmem faults or SIGBUS
    /// delivery.
    pub fn open() -> Result<Uffd, (&'static str, i32)> {
        Uffd::open_with(false)
    }

    /// Opens one for a handler thread: faults are queued, kernel-mode faults included, which
    /// needs the privilege `userfaultfd(2)` asks for them (`vm.unprivileged_userfaultfd`, or
    /// `CAP_SYS_PTRACE`).
    pub fn open_for_thread() -> Result<Uffd, (&'static str, i32)> {
        Uffd::open_with(true)
    }

    fn open_with(thread: bool) -> Result<Uffd, (&'static str, i32)> {
        let mut last = 0;
        let modes: &[libc::c_int] = if thread { &[0] } else { &[UFFD_USER_MODE_ONLY, 0] };
        for &flags in modes {
            // SAFETY: userfaultfd takes flags only.
            let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK | flags) };
            if fd < 0 {
                last = crate::os::errno();
                continue;
            }
            // SAFETY: a fresh descriptor that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
            let want = UFFD_FEATURE_MINOR_SHMEM | if thread { UFFD_FEATURE_THREAD_ID } else { UFFD_FEATURE_SIGBUS };
            let mut api = UffdioApi { api: UFFD_API, features: want, ioctls: 0 };
            // SAFETY: `api` is valid for the ioctl's read and write.
            if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
                return Err(("ioctl(UFFDIO_API)", crate::os::errno()));
            }
            if api.features & want != want {
                return Err(("ioctl(UFFDIO_API)", libc::ENOTSUP));
            }
            return Ok(Uffd { fd, thread });
        }
        Err(("userfaultfd", last))
    }

    /// Whether faults go to a handler thread (not `SIGBUS`).
    pub fn is_thread(&self) -> bool {
        self.thread
    }

    /// Waits up to `timeout_ms` for a fault (handler-thread mode); `None` on a timeout or a
    /// message that is not a page fault.
    pub fn next_fault(&self, timeout_ms: i32) -> Option<Fault> {
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: `pfd` is valid for the call.
        if unsafe { libc::poll(&mut pfd, 1, timeout_ms) } <= 0 {
            return None;
        }
        let mut m = UffdMsg::default();
        let size = std::mem::size_of::<UffdMsg>();
        // SAFETY: `m` is valid for `size` bytes of writes.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut m as *mut UffdMsg).cast(), size) };
        (n == size as isize && m.event == UFFD_EVENT_PAGEFAULT)
            .then_some(Fault { address: m.address as usize, tid: m.ptid })
    }

    /// Wakes the threads waiting on a fault in `addr..addr + len` (handler-thread mode), so
    /// they retry their access.
    pub fn wake(&self, addr: usize, len: usize) {
        let mut r = UffdioRange { start: addr as u64, len: len as u64 };
        // SAFETY: `r` is valid for the ioctl.
        unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WAKE as _, &mut r) };
    }

    /// Registers `addr..addr + len` (mapped from the arena's memfd) for MINOR faults.
    pub fn register_minor(&self, addr: usize, len: usize) -> Result<(), i32> {
        let mut r = UffdioRegister {
            range: UffdioRange { start: addr as u64, len: len as u64 },
            mode: UFFDIO_REGISTER_MODE_MINOR,
            ioctls: 0,
        };
        // SAFETY: `r` is valid for the ioctl; registration changes only how faults in the
        // range are reported.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER as _, &mut r) } != 0 {
            return Err(crate::os::errno());
        }
        Ok(())
    }

    /// Maps the pages the file holds at `addr..addr + len` (`UFFDIO_CONTINUE`), which must
    /// have no page-table entry (zapped). In handler-thread mode the faulting threads are not
    /// woken here (`DONTWAKE`): the handler wakes them once the page's state says it is
    /// done, so a woken thread never finds its page still changing.
    pub fn continue_(&self, addr: usize, len: usize) -> Result<(), i32> {
        let mode = if self.thread { UFFDIO_CONTINUE_MODE_DONTWAKE } else { 0 };
        let mut c = UffdioContinue { range: UffdioRange { start: addr as u64, len: len as u64 }, mode, mapped: 0 };
        // SAFETY: `c` is valid for the ioctl, which maps file pages into the caller's range.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_CONTINUE as _, &mut c) } != 0 {
            let e = crate::os::errno();
            // Already mapped (another path mapped it first): what the caller wanted.
            return if e == libc::EEXIST { Ok(()) } else { Err(e) };
        }
        Ok(())
    }
}

/// Whether this machine lets a process use the userfaultfd backend: `Ok`, or the call and
/// errno that refused it (`EPERM` where `userfaultfd(2)` is blocked, `ENOTSUP` on a kernel
/// without MINOR shmem faults or SIGBUS delivery).
pub fn userfaultfd_available() -> std::result::Result<(), (&'static str, i32)> {
    Uffd::open().map(drop)
}

/// Whether this machine lets a process use the userfaultfd handler-thread backend (kernel-mode
/// faults need privilege): `Ok`, or the call and errno that refused it.
pub fn userfaultfd_thread_available() -> std::result::Result<(), (&'static str, i32)> {
    Uffd::open_for_thread().map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ioctl numbers are Linux's (from the UAPI header on x86_64 and arm64).
    #[test]
    fn ioctl_numbers_match_linux() {
        assert_eq!(UFFDIO_API, 0xc018_aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020_aa00);
        assert_eq!(UFFDIO_CONTINUE, 0xc020_aa07);
        assert_eq!(UFFDIO_WAKE, 0x8010_aa02);
        assert_eq!(std::mem::size_of::<UffdMsg>(), 32);
    }
}
