//! Typed errors. Every failure of the public API is one of these; none leaves the allocator
//! changed (a rejected free frees nothing, a failed allocation takes nothing).

use crate::types::{CpuId, NodeId, Order, Pfn, ZoneId};
use std::fmt;

/// What went wrong, with enough detail to say where. (Fields are named for what they hold.)
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Error {
    /// No zone the allocation may use has a free block of the order (after falling back).
    OutOfMemory { order: Order },
    /// A node id that the topology does not have, or a node without memory where one is needed.
    InvalidNode { node: NodeId, nr_nodes: usize },
    /// A zone id that the allocator does not have.
    InvalidZone { zone: ZoneId, nr_zones: usize },
    /// A CPU id that the topology does not have (`Zonal::act_as_cpu`).
    InvalidCpu { cpu: CpuId, nr_cpus: usize },
    /// An order above the configured maximum.
    InvalidOrder { order: u32, max_order: Order },
    /// The address lies outside every arena this allocator owns.
    NotOwned { addr: usize },
    /// The address is not aligned to a frame, or to a block of the order given.
    Misaligned { addr: usize, order: Order },
    /// The block at this address is already free.
    DoubleFree { pfn: Pfn },
    /// The block was allocated with another order than the one given to free it.
    OrderMismatch { pfn: Pfn, allocated: Order, freed: Order },
    /// The address is inside an allocated block but is not its first frame.
    InteriorFrame { pfn: Pfn, block: Pfn, order: Order },
    /// A layer holds the block (`Zonal::hold`): only its `Zonal::free_held` frees it, and a
    /// plain free changes nothing.
    Held { pfn: Pfn },
    /// `Zonal::free_held` or `Zonal::unhold` of a live block that is not held: the holder's
    /// bookkeeping is wrong; nothing changed.
    NotHeld { pfn: Pfn },
    /// The handle was inherited through `fork()`: its frames stayed with the process that
    /// created it (`creator`), and no call of the child may allocate, free or move them.
    Forked { creator: u32 },
    /// A configuration, topology spec or policy that cannot be used; the message says where.
    InvalidConfig(String),
    /// The operating system refused a call zonal needs (mapping memory, reading sysfs).
    Os { call: &'static str, errno: i32 },
    /// Publishing a handle, or a request to a published one, failed; the message says why
    /// (a refused directory, no such handle, the server's error reply).
    Live(String),
}

impl Error {
    /// The errno the C ABI returns for this error (negated there).
    pub fn errno(&self) -> i32 {
        match self {
            Error::OutOfMemory { .. } => libc::ENOMEM,
            Error::InvalidNode { .. } | Error::InvalidZone { .. } | Error::InvalidCpu { .. } => libc::ENODEV,
            Error::InvalidOrder { .. } => libc::EDOM,
            Error::NotOwned { .. } => libc::EFAULT,
            Error::Misaligned { .. } => libc::EINVAL,
            Error::DoubleFree { .. } => libc::EALREADY,
            Error::OrderMismatch { .. } => libc::ERANGE,
            Error::InteriorFrame { .. } => libc::ENOTBLK,
            // The block is in use by its holder, as a mounted device is busy.
            Error::Held { .. } => libc::EBUSY,
            Error::NotHeld { .. } => libc::EINVAL,
            // POSIX's EPERM: an operation limited to "the owner of a file or other
            // resource", and the handle's owner is the process that created it. No other
            // error of an allocation or free is EPERM, so a C caller can tell it by the code.
            Error::Forked { .. } => libc::EPERM,
            Error::InvalidConfig(_) => libc::EINVAL,
            Error::Live(_) => libc::EPROTO,
            Error::Os { errno, .. } => *errno,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OutOfMemory { order } => {
                write!(f, "out of memory: no zone allowed has a free block of {order}")
            }
            Error::InvalidNode { node, nr_nodes } => match nr_nodes {
                0 => write!(f, "invalid node {}: the topology has no nodes", node.0),
                1 => write!(f, "invalid node {}: the topology has node 0 only", node.0),
                n => write!(f, "invalid node {}: the topology has nodes 0 to {}", node.0, n - 1),
            },
            Error::InvalidZone { zone, nr_zones } => match nr_zones {
                0 => write!(f, "invalid zone {}: the allocator has no zones", zone.0),
                1 => write!(f, "invalid zone {}: the allocator has zone 0 only", zone.0),
                n => write!(f, "invalid zone {}: the allocator has zones 0 to {}", zone.0, n - 1),
            },
            Error::InvalidCpu { cpu, nr_cpus } => match nr_cpus {
                0 => write!(f, "invalid cpu {}: the topology has no cpus", cpu.0),
                1 => write!(f, "invalid cpu {}: the topology has cpu 0 only", cpu.0),
                n => write!(f, "invalid cpu {}: the topology has cpus 0 to {}", cpu.0, n - 1),
            },
            Error::InvalidOrder { order, max_order } => {
                write!(f, "invalid order {order}: the maximum is {}", max_order.0)
            }
            Error::NotOwned { addr } => write!(f, "address {addr:#x} is not owned by zonal"),
            Error::Misaligned { addr, order } => {
                write!(f, "address {addr:#x} is not aligned to a block of {order}")
            }
            Error::DoubleFree { pfn } => write!(f, "double free: the block at {pfn} is already free"),
            Error::OrderMismatch { pfn, allocated, freed } => {
                write!(f, "order mismatch: the block at {pfn} was allocated with {allocated} and freed with {freed}")
            }
            Error::InteriorFrame { pfn, block, order } => {
                write!(f, "{pfn} is inside the allocated block at {block} ({order}), not its first frame")
            }
            Error::Held { pfn } => {
                write!(f, "the block at {pfn} is held by a layer built on zonal: only that layer frees it")
            }
            Error::NotHeld { pfn } => write!(f, "the block at {pfn} is allocated but not held"),
            Error::Forked { creator } => write!(
                f,
                "this zonal handle was created by process {creator}; a forked child (process {}) cannot use its \
                 frames: the arena is not inherited (MADV_DONTFORK) and its metadata is the parent's. Create a \
                 new handle in the child",
                std::process::id()
            ),
            Error::InvalidConfig(msg) | Error::Live(msg) => f.write_str(msg),
            Error::Os { call, errno } => {
                write!(f, "{call} failed: {}", std::io::Error::from_raw_os_error(*errno))
            }
        }
    }
}

impl std::error::Error for Error {}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
