//! What can go wrong, and whether this machine allows the userfaultfd backends.

use crate::{fault, uffd};

/// What can go wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A region of zero bytes, or one whose size overflows.
    InvalidSize { bytes: usize },
    /// The policy names a node the topology lacks, or is empty.
    Zonal(zonal::Error),
    /// A system call failed.
    Os { call: &'static str, errno: i32 },
    /// Every region slot of the process is in use.
    TooManyRegions,
    /// An address outside the region.
    OutOfRange { addr: usize },
    /// A config or policy string that does not parse.
    InvalidConfig(String),
    /// An unpin of a page that holds no pin.
    NotPinned { addr: usize },
    /// A call on a balancer or region this process inherited across `fork()`: the child has
    /// no balancer thread and none of its parent's frames (see the crate's docs).
    Forked,
}

impl Error {
    /// The errno the C ABI returns negated for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::InvalidSize { .. } | Error::InvalidConfig(_) | Error::NotPinned { .. } => libc::EINVAL,
            Error::Forked => libc::EPERM,
            Error::Zonal(e) => e.errno(),
            Error::Os { errno, .. } => *errno,
            Error::TooManyRegions => libc::EMFILE,
            Error::OutOfRange { .. } => libc::EFAULT,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::InvalidSize { bytes } => write!(f, "invalid region size: {bytes} bytes (need 1 byte to 1 TiB)"),
            Error::Zonal(e) => write!(f, "{e}"),
            Error::Os { call, errno } => {
                write!(f, "{call} failed: {}", std::io::Error::from_raw_os_error(*errno))
            }
            Error::TooManyRegions => write!(f, "too many regions (at most {} at once)", fault::MAX_REGIONS),
            Error::OutOfRange { addr } => write!(f, "address {addr:#x} is not in the region"),
            Error::InvalidConfig(m) => write!(f, "{m}"),
            Error::NotPinned { addr } => write!(f, "unpin of {addr:#x}: the page holds no pin"),
            Error::Forked => write!(
                f,
                "this balancer or region belongs to the parent process: a child of fork() inherits none of its memory"
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<zonal::Error> for Error {
    fn from(e: zonal::Error) -> Error {
        Error::Zonal(e)
    }
}

/// Result of the layer.
pub type Result<T> = std::result::Result<T, Error>;

/// Whether this machine lets a process use the userfaultfd backend: `Ok`, or the call and
/// errno that refused it (`EPERM` where `userfaultfd(2)` is blocked, `ENOTSUP` on a kernel
/// without MINOR shmem faults or SIGBUS delivery).
pub fn userfaultfd_available() -> std::result::Result<(), (&'static str, i32)> {
    uffd::Uffd::open().map(drop)
}

/// Whether this machine lets a process use the userfaultfd handler-thread backend (kernel-mode
/// faults need privilege): `Ok`, or the call and errno that refused it.
pub fn userfaultfd_thread_available() -> std::result::Result<(), (&'static str, i32)> {
    uffd::Uffd::open_for_thread().map(drop)
}

impl From<fault::Unresolved> for Error {
    fn from(u: fault::Unresolved) -> Error {
        match u {
            fault::Unresolved::NoFrame => {
                Error::Zonal(zonal::Error::OutOfMemory { order: zonal::Order::new(0).expect("order 0") })
            }
            fault::Unresolved::Map | fault::Unresolved::Repair => Error::Os { call: "mmap", errno: libc::ENOMEM },
            fault::Unresolved::Forked => Error::Forked,
        }
    }
}
