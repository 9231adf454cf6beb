//! What can go wrong, and whether this machine allows the userfaultfd backends.

use crate::table::MAX_REGIONS;

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
            Error::TooManyRegions => write!(f, "too many regions (at most {} at once)", MAX_REGIONS),
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
