//! NUMA balancing for zonal (seed 004): memory that follows the threads using it.
//!
//! A [`Balancer`] over a zonal handle hands out [`Region`]s: ranges of address space whose
//! pages get a frame on first touch, on the node the region's policy picks for the touching
//! CPU, and which a scanner then makes inaccessible a chunk at a time so that the next access
//! is a *hint fault*. A hint fault from a CPU of another node than the page's, passing
//! Linux's two-stage filter, moves the page: a frame of the faulting CPU's node, a copy, and
//! the new frame mapped at the same address. Frames are zonal's, allocated and freed through
//! its public API, so every zone's counts (zoneinfo, numastat) stay exact.
//!
//! Mapping orders (`MigrateMode`): *delayed* (the seed's, the default) copies while the page
//! is still inaccessible and maps the new frame, so the old mapping is never made accessible
//! again; *eager* (before the seed) maps the page accessible first and takes it away again
//! for the copy, a second TLB flush.
//!
//! Backend: `mprotect` + `SIGSEGV`, handled in the faulting thread. A system call that reads
//! or writes an inaccessible region page (a `read(2)` into it) gets `EFAULT` instead of a
//! fault. The userfaultfd backends (MINOR faults delivered as `SIGBUS` to the faulting
//! thread, where a system call gets `EFAULT` too, or read by a handler thread, which also
//! serves faults taken inside system calls) hide a page by zapping it, which splits no
//! mapping.
//!
//! The kernel and the program (see the README's rules): memory the kernel keeps using past
//! a system call (io_uring fixed buffers, O_DIRECT, `vmsplice`, RDMA), and system-call
//! buffers under the first two backends, are pinned ([`Region::pin`]): never hidden, moved
//! or collapsed while pinned. A child of `fork()` gets none of the regions' frames
//! (`fault::in_child`) and every call on what it inherited is [`Error::Forked`]. Signals
//! that are not faults, and faults outside regions, go to the handler installed before.
//! Every frame the balancer owns is held in zonal (`Zonal::hold`), so safe code cannot free
//! one under it.
//!
//! Mappings: a page migrated alone maps a frame that does not follow its neighbours', so
//! the balancer's thread collapses fragmented windows of 2 to 512 pages back into one block
//! of consecutive frames and one mapping each (`collapse`, khugepaged's counterpart). A
//! region large for the mapping budget is first-touched in aligned windows, carved from 2
//! MiB blocks (`RegionShared::carve`), so a random first touch adds a mapping per window.
//!
//! Kernel counterparts: `task_numa_work` and `change_prot_numa` (`scan`), `do_numa_page`
//! and `migrate_misplaced_folio` (`fault`), `collapse_huge_page` (`collapse`), `should_numa_migrate_memory` and the page's
//! `_last_cpupid` (`table`), `update_task_scan_period` (`scan::next_period`).

mod balancer;
mod collapse;
mod config;
mod demote;
mod dest;
mod error;
mod fault;
pub mod ffi;
mod os;
mod region;
mod reserve;
mod scan;
mod state;
mod stats;
mod table;
mod tier;
pub mod tunable;
mod uffd;
mod window;

pub use balancer::Balancer;
pub(crate) use config::Tunables;
pub use config::{Backend, Config, MigrateMode};
pub use dest::CHUNK_PAGES;
pub use error::{Error, Result};
pub use os::PAGE;
pub use region::{Pin, Region, MAX_REGION_BYTES};
pub use state::RegionShared;
pub(crate) use state::Shared;
pub(crate) use stats::Counters;
pub use stats::{NodeTierStats, Stats};
pub use table::MAX_REGIONS;
pub use tier::Tiers;
pub use uffd::{userfaultfd_available, userfaultfd_thread_available};

/// README.md's Rust examples, compiled and run as this crate's doc-tests (`cargo test
/// --release -p zonal-numab --doc`), so the README cannot drift from the API. Here because
/// the balancing example needs both zonal and zonal-numab, and this crate sees both. Only
/// under `cfg(doctest)`: the README is not this crate's documentation. (Its C examples are
/// built and run by tests/suite/install.rs at the root.)
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
