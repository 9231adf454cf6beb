//! zonal: a NUMA-aware page-frame allocator for user space, built on the design of the Linux
//! page allocator.
//!
//! ```
//! use zonal::{Config, Gfp, NodeId, Topology, Zonal};
//!
//! let topo = Topology::parse("nodes=2,size=16M").unwrap();
//! let z = Zonal::new(Config::new(topo)).unwrap();
//! let page = z.alloc_pages_node(NodeId(1), Gfp::THISNODE, 0).unwrap();
//! assert_eq!(z.page_to_nid(page.as_ptr()).unwrap(), NodeId(1));
//! z.free_pages(page.as_ptr(), 0).unwrap();
//! // A second free is an error, not a corruption.
//! assert!(z.free_pages(page.as_ptr(), 0).is_err());
//! ```
//!
//! The map from kernel names to modules and types is in [`design`].

#![warn(missing_docs)]

// The public API is what a user needs: the handle, its errors, config, topology, gfp flags,
// policies, reports and counters, the read-only zone figures, and the CPU helpers
// benchmarks use. The buddy, the per-CPU lists, the frame states, the zonelist caches, the
// OS layer and the sync facade are the allocator's own: safe code outside cannot reach them.

mod arena;
mod buddy;
pub mod config;
pub mod cpu;
pub mod error;
pub mod ffi;
mod fork;
pub mod gfp;
pub mod live;
mod mem_map;
pub mod mempolicy;
mod page_alloc;
mod pcp;
pub mod report;
mod sync;
mod sys;
pub mod sysctl;
pub mod topology;
pub mod tunables;
pub mod types;
pub mod vmstat;
mod zlc;
pub mod zone;
pub mod zonelist;

#[doc = include_str!("../../../docs/DESIGN.md")]
pub mod design {}

pub use arena::ArenaOptions;
pub use config::Config;
pub use error::{Error, Result};
pub use gfp::Gfp;
pub use mempolicy::{MemPolicy, NodeMask};
pub use page_alloc::{ActingCpu, BulkPage, CounterSource, PcpInfo, Zonal, LOG_LINES};
pub use topology::Topology;
pub use types::{CpuId, NodeId, Order, Pfn, ZoneId, PAGE_SIZE};
pub use vmstat::{NumaStat, VmEvent, ZoneStatItem};
