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

mod collapse;
mod dest;
mod fault;
pub mod ffi;
mod os;
mod reserve;
mod scan;
mod table;
mod uffd;

use reserve::{FreeStack, NodeReserve, Reserve};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use table::{PageEntry, BUSY, HINT, PRESENT, UNMAPPED};
use zonal::zone::Watermark;
use zonal::{Gfp, MemPolicy, NodeId, Zonal};

pub use fault::MAX_REGIONS;
pub use os::PAGE;

/// README.md's Rust examples, compiled and run as this crate's doc-tests (`cargo test
/// --release -p zonal-numab --doc`), so the README cannot drift from the API. Here because
/// the balancing example needs both zonal and zonal-numab, and this crate sees both. Only
/// under `cfg(doctest)`: the README is not this crate's documentation. (Its C examples are
/// built and run by tests/install.rs at the root.)
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

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

/// The largest region: 1 TiB.
pub const MAX_REGION_BYTES: usize = 1 << 40;

/// When a migrating page is mapped (`numa_balancing_migrate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MigrateMode {
    /// Copy while the page is inaccessible, then map the new frame (seed 004).
    #[default]
    Delayed,
    /// Map the page accessible, then unmap it again to copy (before seed 004).
    Eager,
}

impl std::str::FromStr for MigrateMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "delayed" => Ok(MigrateMode::Delayed),
            "eager" => Ok(MigrateMode::Eager),
            _ => Err(format!("numa_balancing_migrate: `{s}` is not delayed or eager")),
        }
    }
}

/// How hint faults reach the balancer (`numa_balancing_backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// userfaultfd where the kernel allows it, else mprotect.
    #[default]
    Auto,
    /// `mprotect(PROT_NONE)` to scan, `SIGSEGV` for the fault: works everywhere; a migration
    /// replaces an inaccessible mapping, so it costs one TLB flush delayed and two eager.
    Mprotect,
    /// `MADV_DONTNEED` to scan, userfaultfd MINOR faults delivered as `SIGBUS` in the faulting
    /// thread: the delayed mapping maps the new frame over an empty entry, with no TLB flush.
    Userfaultfd,
    /// The same, with the faults served by a handler thread of the balancer: slower per
    /// fault, but it serves faults taken in the kernel too, so a system call that reads or
    /// writes a region page (a `read(2)` into it) waits for its hint fault instead of getting
    /// `EFAULT`. Needs the privilege kernel-mode userfaultfd asks for
    /// (`vm.unprivileged_userfaultfd` or `CAP_SYS_PTRACE`).
    UserfaultfdThread,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Backend::Auto),
            "mprotect" => Ok(Backend::Mprotect),
            "userfaultfd" | "uffd" => Ok(Backend::Userfaultfd),
            "userfaultfd-thread" | "uffd-thread" => Ok(Backend::UserfaultfdThread),
            _ => Err(format!("numa_balancing_backend: `{s}` is not auto, mprotect, userfaultfd or userfaultfd-thread")),
        }
    }
}

/// The balancer's settings, Linux's defaults.
#[derive(Clone, Debug)]
pub struct Config {
    /// `kernel.numa_balancing` (bit 0: normal balancing).
    pub enabled: bool,
    /// Delayed or eager mapping.
    pub mode: MigrateMode,
    /// Wait before the first scan of a new region (`scan_delay_ms`, 1000).
    pub scan_delay_ms: u64,
    /// Fastest scan period (`scan_period_min_ms`, 1000).
    pub scan_period_min_ms: u64,
    /// Slowest scan period (`scan_period_max_ms`, 60000).
    pub scan_period_max_ms: u64,
    /// Mapped memory marked per scan pass (`scan_size_mb`, 256).
    pub scan_size_mb: u64,
    /// Frames kept ready per node for the fault handler.
    pub reserve_pages: usize,
    /// How hint faults are taken.
    pub backend: Backend,
    /// Mappings the process may have before the balancer stops adding to them (no new scan,
    /// no migration: both split mappings), `None` for three quarters of `vm.max_map_count`.
    pub vma_budget: Option<usize>,
    /// Move a whole aligned 2 MiB chunk (order 9) in one migration when a hint fault finds
    /// every page of it hinted on the same node: one copy loop and one mapping for 512
    /// pages, and the chunk's mappings merged into one.
    pub chunk_migration: bool,
    /// Most MiB a second the balancer's thread copies to collapse fragmented windows of a
    /// region into one block and one mapping each (see the `collapse` module; 0: never).
    pub collapse_mb: u64,
    /// A page migrating alone takes frame k of a 2 MiB block its aligned window keeps on
    /// the destination node (k its place in the window), and its neighbours nobody touched
    /// for a scan period come along into theirs: a window's pages migrated one by one, in
    /// any order, map consecutive frames and stay one mapping, so that hiding them stays one
    /// TLB shootdown (see the `dest` module). Off: any frame of the node's reserve, a
    /// mapping per page until a collapse.
    pub window_migration: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            enabled: true,
            mode: MigrateMode::Delayed,
            scan_delay_ms: 1000,
            scan_period_min_ms: 1000,
            scan_period_max_ms: 60_000,
            scan_size_mb: 256,
            reserve_pages: 256,
            backend: Backend::Auto,
            vma_budget: None,
            chunk_migration: true,
            collapse_mb: 64,
            window_migration: true,
        }
    }
}

impl Config {
    /// Parses `key=value` items separated by `;` over the defaults: `numa_balancing` (0 or
    /// 1), `mode` (delayed or eager), `backend` (auto, mprotect, userfaultfd),
    /// `scan_delay_ms`, `scan_period_min_ms`, `scan_period_max_ms`, `scan_size_mb`,
    /// `reserve_pages`, `vma_budget`, `chunk_migration` (0 or not), `collapse_mb`,
    /// `window_migration` (0 or not). An empty string is the defaults.
    pub fn parse(s: &str) -> Result<Config> {
        let mut c = Config::default();
        for item in s.split(';').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| Error::InvalidConfig(format!("numab config: `{item}` is not key=value")))?;
            let num = |v: &str| -> Result<u64> {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| Error::InvalidConfig(format!("numab config: {k}: `{v}` is not a number")))
            };
            match k.trim() {
                "numa_balancing" => {
                    c.enabled = match v.trim() {
                        "0" => false,
                        "1" => true,
                        _ => return Err(Error::InvalidConfig(format!("numa_balancing: `{v}` is not 0 or 1"))),
                    }
                }
                "mode" | "numa_balancing_migrate" => c.mode = v.trim().parse().map_err(Error::InvalidConfig)?,
                "backend" | "numa_balancing_backend" => c.backend = v.trim().parse().map_err(Error::InvalidConfig)?,
                "scan_delay_ms" => c.scan_delay_ms = num(v)?,
                "scan_period_min_ms" => c.scan_period_min_ms = num(v)?.max(1),
                "scan_period_max_ms" => c.scan_period_max_ms = num(v)?.max(1),
                "scan_size_mb" => c.scan_size_mb = num(v)?.clamp(1, 1 << 20),
                "reserve_pages" => c.reserve_pages = num(v)?.clamp(1, 1 << 20) as usize,
                "vma_budget" => c.vma_budget = Some(num(v)? as usize),
                "chunk_migration" => c.chunk_migration = num(v)? != 0,
                "collapse_mb" => c.collapse_mb = num(v)?.min(1 << 20),
                "window_migration" => c.window_migration = num(v)? != 0,
                other => {
                    return Err(Error::InvalidConfig(format!(
                        "numab config: unknown key `{other}` (numa_balancing, mode, backend, scan_delay_ms, \
                         scan_period_min_ms, scan_period_max_ms, scan_size_mb, reserve_pages, vma_budget, \
                         chunk_migration, collapse_mb, window_migration)"
                    )))
                }
            }
        }
        if c.scan_period_min_ms > c.scan_period_max_ms {
            return Err(Error::InvalidConfig(format!(
                "numab config: scan_period_min_ms {} is above scan_period_max_ms {}",
                c.scan_period_min_ms, c.scan_period_max_ms
            )));
        }
        Ok(c)
    }
}

/// The settings, changeable at run time.
pub(crate) struct Tunables {
    enabled: AtomicBool,
    mode: AtomicU8,
    scan_delay_ms: AtomicU64,
    scan_period_min_ms: AtomicU64,
    scan_period_max_ms: AtomicU64,
    pub(crate) scan_size_mb: AtomicU64,
    collapse_mb: AtomicU64,
}

/// The layer's counters, named as Linux's `/proc/vmstat` names them where it has them.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) pte_updates: AtomicU64,
    pub(crate) hint_faults: AtomicU64,
    pub(crate) hint_faults_local: AtomicU64,
    pub(crate) pages_migrated: AtomicU64,
    pub(crate) migrate_success: AtomicU64,
    pub(crate) migrate_fail: AtomicU64,
    pub(crate) fail_reserve: AtomicU64,
    pub(crate) fail_room: AtomicU64,
    pub(crate) fail_pinned: AtomicU64,
    pub(crate) map_fail: AtomicU64,
    pub(crate) scan_fail: AtomicU64,
    pub(crate) register_fail: AtomicU64,
    pub(crate) registered: AtomicU64,
    pub(crate) migrate_ns: AtomicU64,
    pub(crate) fail_vma: AtomicU64,
    pub(crate) scan_capped: AtomicU64,
    pub(crate) chunks_migrated: AtomicU64,
    pub(crate) collapsed: AtomicU64,
    pub(crate) collapsed_pages: AtomicU64,
    pub(crate) collapse_fail: AtomicU64,
    pub(crate) first_touch: AtomicU64,
    pub(crate) migrated_along: AtomicU64,
    pub(crate) window_blocks: AtomicU64,
    pub(crate) scan_calls: AtomicU64,
    pub(crate) scan_skips: AtomicU64,
    pub(crate) coalesced: AtomicU64,
    pub(crate) scans: AtomicU64,
}

/// A snapshot of the counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Pages made inaccessible by the scanner (`numa_pte_updates`).
    pub numa_pte_updates: u64,
    /// Huge pages so marked (`numa_huge_pte_updates`): always 0, regions map 4 KiB pages.
    pub numa_huge_pte_updates: u64,
    /// Hint faults (`numa_hint_faults`), counted by the thread that maps the page.
    pub numa_hint_faults: u64,
    /// Hint faults on a page already on the faulting CPU's node (`numa_hint_faults_local`).
    pub numa_hint_faults_local: u64,
    /// Pages moved by hint faults (`numa_pages_migrated`).
    pub numa_pages_migrated: u64,
    /// Migrations that succeeded (`pgmigrate_success`).
    pub pgmigrate_success: u64,
    /// Migrations that failed (`pgmigrate_fail`); the page was mapped back where it was.
    pub pgmigrate_fail: u64,
    /// ... because the destination's reserve was empty.
    pub pgmigrate_fail_reserve: u64,
    /// ... because the destination node was below its high watermark.
    pub pgmigrate_fail_room: u64,
    /// ... because the page was pinned while it was hinted (`Region::pin`).
    pub pgmigrate_fail_pinned: u64,
    /// `mmap` of a page failed (out of VMAs).
    pub map_fail: u64,
    /// Scanner runs that could not be protected (out of VMAs) and were left mapped.
    pub scan_fail: u64,
    /// Runs a scan or a collapse could not register with the userfaultfd before hiding them
    /// (they were left mapped, untouched).
    pub register_fail: u64,
    /// Runs a scan or a collapse registered with the userfaultfd before hiding them (only
    /// runs with a page mapped anew since its last registration need it).
    pub registered: u64,
    /// Scan periods lengthened by the overhead cap.
    pub scan_capped: u64,
    /// Chunk migrations (512 pages each, counted in `numa_pages_migrated` too).
    pub chunks_migrated: u64,
    /// Windows collapsed into one block of consecutive frames and one mapping (khugepaged's
    /// `thp_collapse_alloc`, at orders 1 to 9), and the pages they copied.
    pub collapsed: u64,
    pub collapsed_pages: u64,
    /// Collapses that could not hide or map their window (it was mapped back as it was).
    pub collapse_fail: u64,
    /// Runs of pages mapped as one over every live region (`Region::vma_runs`), what the
    /// regions add to the process's mappings at most.
    pub vma_runs: u64,
    /// Migrations refused because the process was at its mapping budget.
    pub pgmigrate_fail_vma: u64,
    /// The process's mappings at the last check, and the most seen (`vm.max_map_count`
    /// counts them).
    pub vmas: u64,
    pub vmas_peak: u64,
    /// Time the faulting threads spent in successful migrations (from the decision to the
    /// new frame mapped), in ns: divided by `pgmigrate_success`, a migration's cost.
    pub migrate_ns: u64,
    /// Pages given a frame on first touch.
    pub first_touch: u64,
    /// Pages that moved along with a neighbour's migration into their slots of the window's
    /// destination block, untouched for a scan period (counted in `numa_pages_migrated`).
    pub migrated_along: u64,
    /// Destination blocks windows took for their pages migrating one by one.
    pub window_blocks: u64,
    /// Calls the scanner made to hide pages (at most one per 2 MiB window and pass).
    pub scan_calls: u64,
    /// Windows a scan pass left alone while pages migrated into them (many mappings then).
    pub scan_skips: u64,
    /// Pages moved into their slots of their window's destination block on their own node
    /// (a local hint fault's page, or an untouched page coming along): a window made one
    /// mapping without a collapse.
    pub coalesced: u64,
    /// Scan passes made.
    pub scans: u64,
    /// The current scan period in ms.
    pub scan_period_ms: u64,
}

impl Stats {
    /// The counters as `(name, value)` in `/proc/vmstat` style.
    pub fn items(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("numa_pte_updates", self.numa_pte_updates),
            ("numa_huge_pte_updates", self.numa_huge_pte_updates),
            ("numa_hint_faults", self.numa_hint_faults),
            ("numa_hint_faults_local", self.numa_hint_faults_local),
            ("numa_pages_migrated", self.numa_pages_migrated),
            ("pgmigrate_success", self.pgmigrate_success),
            ("pgmigrate_fail", self.pgmigrate_fail),
            ("pgmigrate_fail_reserve", self.pgmigrate_fail_reserve),
            ("pgmigrate_fail_room", self.pgmigrate_fail_room),
            ("pgmigrate_fail_pinned", self.pgmigrate_fail_pinned),
            ("numab_map_fail", self.map_fail),
            ("numab_scan_fail", self.scan_fail),
            ("pgmigrate_fail_vma", self.pgmigrate_fail_vma),
            ("numab_scan_capped", self.scan_capped),
            ("numab_chunks_migrated", self.chunks_migrated),
            ("numab_collapsed", self.collapsed),
            ("numab_collapsed_pages", self.collapsed_pages),
            ("numab_collapse_fail", self.collapse_fail),
            ("numab_vma_runs", self.vma_runs),
            ("numab_vmas", self.vmas),
            ("numab_vmas_peak", self.vmas_peak),
            ("numab_register_fail", self.register_fail),
            ("numab_registered", self.registered),
            ("numab_migrate_ns", self.migrate_ns),
            ("numab_first_touch", self.first_touch),
            ("numab_migrated_along", self.migrated_along),
            ("numab_window_blocks", self.window_blocks),
            ("numab_scan_calls", self.scan_calls),
            ("numab_scan_skips", self.scan_skips),
            ("numab_coalesced", self.coalesced),
            ("numab_scans", self.scans),
            ("numab_scan_period_ms", self.scan_period_ms),
        ]
    }
}

/// What the balancer's thread, the regions and the fault handler share.
pub(crate) struct Shared {
    pub(crate) z: Arc<Zonal>,
    pub(crate) cfg: Tunables,
    pub(crate) stats: Counters,
    /// Frames ready for the handler, per node (a slot per CPU).
    pub(crate) reserves: Vec<NodeReserve>,
    /// Per node: whether its last refill found the node without a free frame.
    pub(crate) node_out: Vec<AtomicBool>,
    /// Per node: blocks of `CHUNK_PAGES` consecutive frames (order 9, split) for chunk
    /// migrations and windows' destination blocks, by first frame; empty when both are off.
    pub(crate) chunks: Vec<Reserve>,
    /// `Config::chunk_migration` and `Config::window_migration`.
    pub(crate) chunk_migration: bool,
    pub(crate) aligned_migration: bool,
    /// Per node: windows that found `chunks` empty since the last refill (each asks for one
    /// more block at the next), and the refills of `chunks` ended, which a migration waiting
    /// for a block sleeps on.
    pub(crate) chunk_misses: Vec<AtomicUsize>,
    pub(crate) chunk_refills: AtomicU32,
    /// Per node: the blocks `chunks` is kept at (the balancer's thread's own).
    chunk_want: Vec<AtomicUsize>,
    /// Per node: blocks of `CHUNK_PAGES` consecutive frames (split) that regions carve their
    /// first-touch windows from, filled while a region touches in windows.
    pub(crate) blocks: Vec<Reserve>,
    /// Per node: whether its last refill found no free block of that order.
    pub(crate) blocks_out: Vec<AtomicBool>,
    /// Live regions that touch in windows.
    ft_regions: AtomicUsize,
    /// Refill passes ended: a handler waiting for frames sleeps on it (`FUTEX_WAIT`), and
    /// gives up only once a pass that started after it asked found no frame anywhere.
    refills: AtomicU32,
    /// Frames to free (old frames of migrated pages, frames a handler could not use).
    pub(crate) to_free: FreeStack,
    /// Regions to scan, in registration order.
    regions: Mutex<Vec<Weak<RegionShared>>>,
    /// Bumped to wake the balancer's thread (refill, a new region, a setting).
    kick: AtomicU32,
    stop: AtomicBool,
    /// The scan window's local and remote hint faults and failed migrations.
    win_local: AtomicU64,
    win_remote: AtomicU64,
    win_fail: AtomicU64,
    period_ms: AtomicU64,
    /// Per node: its zones' high watermarks summed (`migrate_balanced_pgdat`'s test).
    high: Vec<usize>,
    /// The userfaultfd of the userfaultfd backend; `None` under mprotect.
    pub(crate) uffd: Option<uffd::Uffd>,
    /// The id of the counters added to the zonal handle's reports.
    source: std::sync::OnceLock<u64>,
    /// The mapping budget, the mappings at the last check and the most seen, and whether
    /// the process is at the budget (scans and migrations wait).
    vma_budget: AtomicUsize,
    vmas: AtomicUsize,
    vmas_peak: AtomicUsize,
    pub(crate) over_budget: AtomicBool,
    last_vma_check: Mutex<Option<Instant>>,
    /// Where `Balancer::scan_now` stopped.
    scan_cursor: Mutex<scan::Cursor>,
    /// Where the last collapse pass stopped.
    collapse_cursor: Mutex<scan::Cursor>,
}

impl Shared {
    pub(crate) fn enabled(&self) -> bool {
        self.cfg.enabled.load(Ordering::Relaxed)
    }

    pub(crate) fn mode(&self) -> MigrateMode {
        if self.cfg.mode.load(Ordering::Relaxed) == 1 {
            MigrateMode::Eager
        } else {
            MigrateMode::Delayed
        }
    }

    /// Wakes the balancer's thread (async-signal-safe).
    pub(crate) fn kick(&self) {
        self.kick.fetch_add(1, Ordering::Release);
        os::futex_wake(&self.kick);
    }

    /// Wakes the balancer's thread when a reserve fell below half.
    pub(crate) fn kick_if_low(&self, nid: u16) {
        let r = &self.reserves[nid as usize];
        if r.len() < r.capacity() / 2 {
            self.kick();
        }
    }

    pub(crate) fn window_fault(&self, local: bool) {
        if local {
            self.win_local.fetch_add(1, Ordering::Relaxed);
        } else {
            self.win_remote.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn window_fail(&self) {
        self.win_fail.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether node `nid` has room for one more page above its high watermark
    /// (`migrate_balanced_pgdat`).
    pub(crate) fn has_room(&self, nid: u16) -> bool {
        self.has_room_for(nid, 1)
    }

    /// Whether node `nid` has room for `pages` more above its high watermark, by
    /// [`Zonal::nr_free_pages_approx`] (as Linux's `migrate_balanced_pgdat` reads
    /// `zone_page_state`): atomics only, no lock, so the signal handler may ask.
    pub(crate) fn has_room_for(&self, nid: u16, pages: usize) -> bool {
        self.z.nr_free_pages_approx(NodeId(nid)).is_ok_and(|free| free > self.high[nid as usize] + pages)
    }

    /// Returns a chunk a handler took but could not use (to its queue, or frame by frame to
    /// the free stack).
    pub(crate) fn give_back_chunk(&self, nid: u16, block: usize) {
        if self.chunks[nid as usize].put(block).is_err() {
            for i in 0..CHUNK_PAGES {
                // SAFETY: the chunk's frames are allocated, split and mapped nowhere else.
                unsafe { self.to_free.push(block + i * PAGE) };
            }
            self.kick();
        }
    }

    /// A frame for node `nid`, or the nearest node that has one in reserve, waiting for the
    /// balancer's thread to refill when every reserve is empty (however long that takes).
    /// `None` only when a refill pass that started after the first look found none of these
    /// nodes with a free frame: out of memory. Async-signal-safe (a futex wait).
    pub(crate) fn frame_for(&self, nid: u16, fallback: &[u16]) -> Option<usize> {
        let asked = self.refills.load(Ordering::Acquire);
        loop {
            // The node's own reserve; the others only once the node itself has run out (an
            // empty reserve is only a refill behind), as a first touch falls back by distance
            // when the node is full.
            let mut all_out = true;
            for &n in std::iter::once(&nid).chain(fallback) {
                if let Some(f) = self.reserves[n as usize].take(self.z.current_cpu()) {
                    self.kick_if_low(n);
                    return Some(f);
                }
                if !self.node_out[n as usize].load(Ordering::Acquire) {
                    all_out = false;
                    break;
                }
            }
            let seen = self.refills.load(Ordering::Acquire);
            // Two ends past the first look: a whole pass ran after it.
            if all_out && seen.wrapping_sub(asked) >= 2 {
                return None;
            }
            self.wait_refill(seen);
        }
    }

    /// Wakes the balancer's thread and sleeps until its next refill pass ends (at most
    /// 10 ms, then the caller looks again). Async-signal-safe.
    fn wait_refill(&self, seen: u32) {
        self.kick();
        os::futex_wait(&self.refills, seen, Duration::from_millis(10));
    }

    /// A block of `CHUNK_PAGES` consecutive frames of node `nid` (split, zeroed) for
    /// first-touch windows, waiting for a refill when the node's reserve is behind; `None`
    /// when the node's last refill found no free block of that order. Async-signal-safe.
    pub(crate) fn block_for(&self, nid: u16) -> Option<usize> {
        let r = self.blocks.get(nid as usize)?;
        loop {
            if let Some(b) = r.take() {
                self.kick();
                return Some(b);
            }
            if r.capacity() == 0 || self.blocks_out[nid as usize].load(Ordering::Acquire) {
                return None;
            }
            self.wait_refill(self.refills.load(Ordering::Acquire));
        }
    }

    /// Returns a frame a handler took but could not use.
    pub(crate) fn give_back(&self, frame: usize) {
        // SAFETY: the frame was taken from a reserve and is mapped nowhere but the arena.
        unsafe { self.to_free.push(frame) };
        self.kick();
    }

    fn stats(&self) -> Stats {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            numa_pte_updates: l(&s.pte_updates),
            numa_huge_pte_updates: 0,
            numa_hint_faults: l(&s.hint_faults),
            numa_hint_faults_local: l(&s.hint_faults_local),
            numa_pages_migrated: l(&s.pages_migrated),
            pgmigrate_success: l(&s.migrate_success),
            pgmigrate_fail: l(&s.migrate_fail),
            pgmigrate_fail_reserve: l(&s.fail_reserve),
            pgmigrate_fail_room: l(&s.fail_room),
            pgmigrate_fail_pinned: l(&s.fail_pinned),
            map_fail: l(&s.map_fail),
            scan_fail: l(&s.scan_fail),
            register_fail: l(&s.register_fail),
            registered: l(&s.registered),
            migrate_ns: l(&s.migrate_ns),
            pgmigrate_fail_vma: l(&s.fail_vma),
            scan_capped: l(&s.scan_capped),
            chunks_migrated: l(&s.chunks_migrated),
            collapsed: l(&s.collapsed),
            collapsed_pages: l(&s.collapsed_pages),
            collapse_fail: l(&s.collapse_fail),
            vma_runs: self.live_regions().iter().map(|r| r.vma_runs() as u64).sum(),
            vmas: self.vmas.load(Ordering::Relaxed) as u64,
            vmas_peak: self.vmas_peak.load(Ordering::Relaxed) as u64,
            first_touch: l(&s.first_touch),
            migrated_along: l(&s.migrated_along),
            window_blocks: l(&s.window_blocks),
            scan_calls: l(&s.scan_calls),
            scan_skips: l(&s.scan_skips),
            coalesced: l(&s.coalesced),
            scans: l(&s.scans),
            scan_period_ms: self.period_ms.load(Ordering::Relaxed),
        }
    }

    /// Frees the frames handlers left, and tops the reserves up (zeroed frames, as a first
    /// touch of anonymous memory reads zeros). Returns whether any reserve is still empty.
    fn housekeep(&self) -> bool {
        let short = self.refill();
        // The pass's end, for the handlers waiting on it (`frame_for`, `block_for`).
        self.refills.fetch_add(1, Ordering::Release);
        os::futex_wake(&self.refills);
        short
    }

    /// A block of `2^order` frames of node `nid`, held ([`Zonal::hold`]: no safe code given
    /// the handle can free a frame the balancer's unsafe code relies on) and split, each
    /// frame then freed alone with [`Shared::free_frame`]; `None` when the node has no free
    /// block of the order.
    pub(crate) fn alloc_held(&self, nid: u16, order: u32) -> Option<*mut u8> {
        let b = self.z.alloc_pages_node(NodeId(nid), Gfp::THISNODE, order).ok()?.as_ptr();
        if self.z.hold(b, order).is_err() {
            let _ = self.z.free_pages(b, order);
            return None;
        }
        if order > 0 && self.z.split_pages(b, order).is_err() {
            // SAFETY: the block was held just above, by this balancer, and is freed once.
            let _ = unsafe { self.z.free_held(b, order) };
            return None;
        }
        Some(b)
    }

    /// Frees a frame this balancer holds (from [`Shared::alloc_held`]).
    pub(crate) fn free_frame(&self, f: usize) {
        // SAFETY: every frame the balancer frees it holds, and it frees each once (a frame is
        // in exactly one of: a reserve, the free stack, a region page, a carve block).
        let _ = unsafe { self.z.free_held(f as *mut u8, 0) };
    }

    /// A split block of `CHUNK_PAGES` frames of node `nid`, held, zeroed when `zero`, or
    /// `None` when the node has no free block of that order.
    fn alloc_block(&self, nid: usize, zero: bool) -> Option<usize> {
        let b = self.alloc_held(nid as u16, 9)?;
        if zero {
            // SAFETY: a block zonal just handed out, 512 frames, ours.
            unsafe { std::ptr::write_bytes(b, 0, CHUNK_PAGES * PAGE) };
        }
        Some(b as usize)
    }

    /// Frees a split block's frames `from..CHUNK_PAGES`.
    fn free_block_from(&self, block: usize, from: usize) {
        for i in from..CHUNK_PAGES {
            self.free_frame(block + i * PAGE);
        }
    }

    /// [`Shared::housekeep`]'s work: frees, then fills every reserve.
    fn refill(&self) -> bool {
        self.check_mappings(false);
        for f in self.to_free.take_all() {
            self.free_frame(f);
        }
        for (nid, c) in self.chunks.iter().enumerate() {
            // Two blocks for chunk migrations; for windows' destination blocks, one more for
            // each window that found the reserve empty since the last pass (a migration wave
            // starts in many windows at once), up to the capacity, and one fewer each pass
            // nobody missed one: no block is held for windows before a migration asks. Only
            // from a node with room for them above its high watermark: a block held in
            // reserve is memory the node's own allocations cannot have.
            let base = if self.chunk_migration { CHUNK_RESERVE.min(c.capacity()) } else { 0 };
            let misses = self.chunk_misses[nid].swap(0, Ordering::AcqRel);
            let want = match (misses, self.chunk_want[nid].load(Ordering::Relaxed)) {
                (0, w) => w.saturating_sub(1).max(base),
                (m, w) => (w.max(base) + m).min(c.capacity()),
            };
            self.chunk_want[nid].store(want, Ordering::Relaxed);
            while c.len() < want && self.has_room_for(nid as u16, CHUNK_PAGES * want) {
                let Some(b) = self.alloc_block(nid, false) else { break };
                if c.put(b).is_err() {
                    self.free_block_from(b, 0);
                }
            }
            if c.len() > want {
                if let Some(b) = c.take() {
                    self.free_block_from(b, 0);
                }
            }
        }
        // The blocks' own wake-up: a migration waiting for one need not wait for the frame
        // reserves' refill below (zeroing up to `reserve_pages` frames per CPU).
        self.chunk_refills.fetch_add(1, Ordering::Release);
        os::futex_wake(&self.chunk_refills);
        // Blocks for first-touch windows, while a region touches in windows.
        let windows = self.ft_regions.load(Ordering::Acquire) > 0;
        for (nid, r) in self.blocks.iter().enumerate() {
            while windows && r.len() < r.capacity() {
                let Some(b) = self.alloc_block(nid, true) else {
                    self.blocks_out[nid].store(true, Ordering::Release);
                    break;
                };
                self.blocks_out[nid].store(false, Ordering::Release);
                if r.put(b).is_err() {
                    self.free_block_from(b, 0);
                }
            }
        }
        let mut short = false;
        for (nid, r) in self.reserves.iter().flat_map(|nr| nr.slots()).enumerate() {
            let nid = nid / self.reserves[0].slots().len();
            while r.len() < r.capacity() {
                // Runs of consecutive frames (a block split into frames, queued in order), so
                // pages first touched in order get consecutive frames and their mappings
                // merge into one VMA: the largest block that fits the room left, down to a
                // single frame when the node has no larger block.
                let room = r.capacity() - r.len();
                let mut order = (usize::BITS - 1 - room.leading_zeros()).min(9);
                let block = loop {
                    match self.alloc_held(nid as u16, order) {
                        Some(p) => break Some(p),
                        None if order > 0 => order -= 1,
                        None => break None,
                    }
                };
                let Some(block) = block else {
                    short |= self.reserves[nid].len() == 0;
                    self.node_out[nid].store(true, Ordering::Relaxed);
                    break;
                };
                self.node_out[nid].store(false, Ordering::Relaxed);
                // SAFETY: a block zonal just handed out, 2^order frames, ours.
                unsafe { std::ptr::write_bytes(block, 0, PAGE << order) };
                for i in 0..1usize << order {
                    let f = block as usize + i * PAGE;
                    if r.put(f).is_err() {
                        self.free_frame(f);
                    }
                }
            }
        }
        short
    }

    /// Counts the process's mappings (unless `now`, every second while below half the
    /// budget, every 50 ms above: a read of `/proc/self/maps` costs ~0.1 µs a line) and sets
    /// `over_budget`: a region must never push the process past `vm.max_map_count`, and both
    /// a scan (`mprotect` splits) and a migration (a mapping of another frame) can add some.
    fn check_mappings(&self, now: bool) {
        let mut last = self.last_vma_check.lock().unwrap_or_else(|p| p.into_inner());
        let near = self.vmas.load(Ordering::Relaxed) * 2 >= self.vma_budget.load(Ordering::Relaxed);
        let every = Duration::from_millis(if near { 50 } else { 1000 });
        if !now && last.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        *last = Some(Instant::now());
        if let Some(n) = os::nr_mappings() {
            self.vmas.store(n, Ordering::Relaxed);
            self.vmas_peak.fetch_max(n, Ordering::Relaxed);
            self.over_budget.store(n >= self.vma_budget.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// One collapse pass copying at most `pages`, from where the last one stopped; returns
    /// the pages copied.
    fn collapse(&self, pages: usize) -> usize {
        if pages == 0 {
            return 0;
        }
        let regions = self.live_regions();
        let mut cur = self.collapse_cursor.lock().unwrap_or_else(|p| p.into_inner());
        collapse::pass(self, &regions, &mut cur, pages)
    }

    /// Retires the destination blocks windows stopped using (see `dest`), region by region
    /// under the scan lock, which keeps a region from being torn down meanwhile.
    fn retire_idle_dests(&self) {
        for r in self.live_regions() {
            let dead = r.scan_lock.lock().unwrap_or_else(|p| p.into_inner());
            if !*dead {
                r.retire_idle_dests();
            }
        }
    }

    /// The live regions, dropping the dead ones from the list.
    fn live_regions(&self) -> Vec<Arc<RegionShared>> {
        let mut l = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        l.retain(|w| w.upgrade().is_some_and(|r| !r.is_dead()));
        l.iter().filter_map(Weak::upgrade).collect()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // In a child of fork(): nothing here is the child's to free (see `fault::in_child`).
        if fault::forked() {
            return;
        }
        if let Some(&id) = self.source.get() {
            self.z.remove_counter_source(id);
        }
        for f in self.to_free.take_all() {
            self.free_frame(f);
        }
        for r in &self.reserves {
            while let Some(f) = r.take(0) {
                self.free_frame(f);
            }
        }
        for c in self.chunks.iter().chain(&self.blocks) {
            while let Some(b) = c.take() {
                self.free_block_from(b, 0);
            }
        }
    }
}

/// Pages of a chunk migration: an aligned 2 MiB, order 9.
pub const CHUNK_PAGES: usize = 512;

/// Order-9 blocks a node's reserve (`Shared::chunks`) keeps ready, and the most it holds
/// when windows' first migrations ask for more at once.
const CHUNK_RESERVE: usize = 2;
const CHUNK_RESERVE_MAX: usize = 8;

/// NUMA balancing over one zonal handle: the regions, the reserves, the scanner.
pub struct Balancer {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The handler thread of the userfaultfd handler-thread backend.
    server: Option<std::thread::JoinHandle<()>>,
}

impl Balancer {
    /// A balancer over `z` with `cfg`: installs the fault handler (once per process) and
    /// starts the balancer's thread, which fills the reserves and scans.
    pub fn new(z: Arc<Zonal>, cfg: Config) -> Result<Balancer> {
        fault::install().map_err(|errno| Error::Os { call: "sigaction", errno })?;
        let uffd = match cfg.backend {
            Backend::Mprotect => None,
            Backend::Userfaultfd => Some(uffd::Uffd::open().map_err(|(call, errno)| Error::Os { call, errno })?),
            Backend::UserfaultfdThread => {
                Some(uffd::Uffd::open_for_thread().map_err(|(call, errno)| Error::Os { call, errno })?)
            }
            Backend::Auto => uffd::Uffd::open().ok(),
        };
        let nodes = z.topology().nr_nodes();
        let high = (0..nodes)
            .map(|n| {
                z.node_zones(NodeId(n as u16))
                    .map(|ids| ids.iter().map(|id| z.zones()[id.0 as usize].watermark(Watermark::High)).sum())
                    .unwrap_or(0)
            })
            .collect();
        let shared = Arc::new(Shared {
            cfg: Tunables {
                enabled: AtomicBool::new(cfg.enabled),
                mode: AtomicU8::new((cfg.mode == MigrateMode::Eager) as u8),
                scan_delay_ms: AtomicU64::new(cfg.scan_delay_ms),
                scan_period_min_ms: AtomicU64::new(cfg.scan_period_min_ms.max(1)),
                scan_period_max_ms: AtomicU64::new(cfg.scan_period_max_ms.max(1)),
                scan_size_mb: AtomicU64::new(cfg.scan_size_mb.max(1)),
                collapse_mb: AtomicU64::new(cfg.collapse_mb),
            },
            stats: Counters::default(),
            reserves: (0..nodes).map(|_| NodeReserve::new(cfg.reserve_pages.max(1), z.topology().nr_cpus())).collect(),
            chunks: (0..nodes)
                .map(|_| match (cfg.chunk_migration, cfg.window_migration) {
                    (_, true) => Reserve::new(CHUNK_RESERVE_MAX),
                    (true, false) => Reserve::new(CHUNK_RESERVE),
                    (false, false) => Reserve::new(0),
                })
                .collect(),
            chunk_misses: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
            chunk_want: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
            chunk_refills: AtomicU32::new(0),
            chunk_migration: cfg.chunk_migration,
            aligned_migration: cfg.window_migration,
            blocks: (0..nodes).map(|_| Reserve::new(2)).collect(),
            blocks_out: (0..nodes).map(|_| AtomicBool::new(false)).collect(),
            ft_regions: AtomicUsize::new(0),
            refills: AtomicU32::new(0),
            node_out: (0..nodes).map(|_| AtomicBool::new(false)).collect(),
            to_free: FreeStack::default(),
            regions: Mutex::new(Vec::new()),
            kick: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            win_local: AtomicU64::new(0),
            win_remote: AtomicU64::new(0),
            win_fail: AtomicU64::new(0),
            period_ms: AtomicU64::new(cfg.scan_period_min_ms.max(1)),
            high,
            uffd,
            source: std::sync::OnceLock::new(),
            vma_budget: AtomicUsize::new(cfg.vma_budget.unwrap_or(os::max_map_count() / 4 * 3)),
            vmas: AtomicUsize::new(0),
            vmas_peak: AtomicUsize::new(0),
            over_budget: AtomicBool::new(false),
            last_vma_check: Mutex::new(None),
            scan_cursor: Mutex::new(scan::Cursor::default()),
            collapse_cursor: Mutex::new(scan::Cursor::default()),
            z,
        });
        // The layer's counters in the handle's vmstat, JSON and Prometheus reports. A weak
        // reference: the handle must not keep the balancer alive (it holds the handle).
        let weak = Arc::downgrade(&shared);
        let id = shared.z.add_counter_source(Box::new(move || {
            weak.upgrade()
                .map(|s| s.stats().items().into_iter().map(|(n, v)| (n.to_string(), v)).collect())
                .unwrap_or_default()
        }));
        let _ = shared.source.set(id);
        shared.housekeep();
        let weak = Arc::downgrade(&shared);
        let thread = std::thread::Builder::new()
            .name("zonal-numab".into())
            .spawn(move || worker(weak))
            .map_err(|e| Error::Os { call: "pthread_create", errno: e.raw_os_error().unwrap_or(0) })?;
        let server = match shared.uffd.as_ref().is_some_and(|u| u.is_thread()) {
            true => {
                let weak = Arc::downgrade(&shared);
                Some(
                    std::thread::Builder::new()
                        .name("zonal-numab-faults".into())
                        .spawn(move || fault_server(weak))
                        .map_err(|e| Error::Os { call: "pthread_create", errno: e.raw_os_error().unwrap_or(0) })?,
                )
            }
            false => None,
        };
        Ok(Balancer { shared, thread: Some(thread), server })
    }

    /// A region of `bytes` (rounded up to pages) under `policy`: no frame until a page is
    /// touched.
    pub fn region(&self, bytes: usize, policy: MemPolicy) -> Result<Region> {
        if fault::forked() {
            return Err(Error::Forked);
        }
        if bytes == 0 || bytes > MAX_REGION_BYTES {
            return Err(Error::InvalidSize { bytes });
        }
        let z = &self.shared.z;
        policy.validate(z.topology().nr_nodes())?;
        if let MemPolicy::Bind(m) | MemPolicy::Interleave(m) = &policy {
            if m.is_empty() {
                return Err(Error::Zonal(zonal::Error::InvalidNode {
                    node: NodeId(u16::MAX),
                    nr_nodes: z.topology().nr_nodes(),
                }));
            }
        }
        let pages = bytes.div_ceil(PAGE);
        let start = os::reserve(pages * PAGE, 2 << 20).map_err(|errno| Error::Os { call: "mmap", errno })?;
        let nodes = z.topology().nr_nodes();
        let fallback = (0..nodes)
            .map(|n| {
                let order: Vec<u16> = z
                    .zonelists(NodeId(n as u16))
                    .map(|l| l.fallback.iter().map(|id| z.zones()[id.0 as usize].node.0).collect())
                    .unwrap_or_default();
                let mut seen = Vec::new();
                for x in order {
                    if x as usize != n && !seen.contains(&x) && allowed(&policy, x) {
                        seen.push(x);
                    }
                }
                seen
            })
            .collect();
        // First touches in windows of 2^ft_order pages, so that the region adds at most a
        // quarter of the mapping budget however it is touched (a region of up to a quarter
        // of the budget in pages touches page by page, as before).
        let share = (self.shared.vma_budget.load(Ordering::Relaxed) / 4).max(1);
        let mut ft_order = 0;
        while ft_order < collapse::MAX_ORDER && pages >> ft_order > share {
            ft_order += 1;
        }
        if ft_order > 0 {
            self.shared.ft_regions.fetch_add(1, Ordering::AcqRel);
            self.shared.kick();
        }
        let r = Arc::new(RegionShared {
            start,
            ft_order,
            carve: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
            dead: AtomicBool::new(false),
            entries: (0..pages).map(|_| PageEntry::default()).collect(),
            dest: dest::table(pages),
            policy,
            fallback,
            scan_seq: AtomicUsize::new(0),
            group: table::Group::new(z.topology().nr_nodes()),
            born: Instant::now(),
            slot: AtomicUsize::new(usize::MAX),
            scan_lock: Mutex::new(false),
            bal: self.shared.clone(),
        });
        let Some(slot) = fault::register(Arc::as_ptr(&r)) else {
            // SAFETY: the reservation was just made and is not registered: nothing uses it.
            unsafe { os::unmap(start, pages * PAGE) };
            // Nothing to undo in `r`: no frame yet, and no slot to leave.
            return Err(Error::TooManyRegions);
        };
        r.slot.store(slot, Ordering::Relaxed);
        self.shared.regions.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(&r));
        self.shared.kick();
        Ok(Region { shared: r })
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Turns balancing on or off (`numa_balancing`): off, the scanner stops and hint faults
    /// already pending map pages back without moving them.
    pub fn set_enabled(&self, on: bool) {
        self.shared.cfg.enabled.store(on, Ordering::Relaxed);
        self.shared.kick();
    }

    /// Whether balancing is on.
    pub fn enabled(&self) -> bool {
        self.shared.enabled()
    }

    /// Sets the mapping order (`numa_balancing_migrate`).
    pub fn set_mode(&self, mode: MigrateMode) {
        self.shared.cfg.mode.store((mode == MigrateMode::Eager) as u8, Ordering::Relaxed);
    }

    /// The mapping order.
    pub fn mode(&self) -> MigrateMode {
        self.shared.mode()
    }

    /// The backend in use (`Auto` resolved).
    pub fn backend(&self) -> Backend {
        match &self.shared.uffd {
            Some(u) if u.is_thread() => Backend::UserfaultfdThread,
            Some(_) => Backend::Userfaultfd,
            None => Backend::Mprotect,
        }
    }

    /// Sets the scan period bounds and size; `scan_period_min_ms <= scan_period_max_ms`, all
    /// at least 1.
    pub fn set_scan(&self, delay_ms: u64, period_min_ms: u64, period_max_ms: u64, size_mb: u64) -> Result<()> {
        if period_min_ms == 0 || period_max_ms < period_min_ms || size_mb == 0 {
            return Err(Error::InvalidSize { bytes: size_mb as usize });
        }
        let c = &self.shared.cfg;
        c.scan_delay_ms.store(delay_ms, Ordering::Relaxed);
        c.scan_period_min_ms.store(period_min_ms, Ordering::Relaxed);
        c.scan_period_max_ms.store(period_max_ms, Ordering::Relaxed);
        c.scan_size_mb.store(size_mb, Ordering::Relaxed);
        let p = self.shared.period_ms.load(Ordering::Relaxed).clamp(period_min_ms, period_max_ms);
        self.shared.period_ms.store(p, Ordering::Relaxed);
        self.shared.kick();
        Ok(())
    }

    /// Runs one scan pass now, from the calling thread, over every region past its scan
    /// delay; returns the pages marked. For tests and benchmarks that drive the scanner.
    pub fn scan_now(&self) -> usize {
        if fault::forked() {
            return 0;
        }
        let _signals = os::SignalsBlocked::new();
        self.shared.check_mappings(true);
        if self.shared.over_budget.load(Ordering::Relaxed) {
            return 0;
        }
        let regions = self.shared.live_regions();
        self.shared.stats.scans.fetch_add(1, Ordering::Relaxed);
        // Resumes where the last call stopped, as the balancer's own passes do.
        let mut cur = self.shared.scan_cursor.lock().unwrap_or_else(|p| p.into_inner());
        scan::scan_pass(&self.shared, &regions, &mut cur)
    }

    /// Runs one collapse pass now, from the calling thread, copying at most `max_pages`
    /// (see [`Config::collapse_mb`]); returns the pages copied. For tests and benchmarks.
    pub fn collapse_now(&self, max_pages: usize) -> usize {
        if fault::forked() {
            return 0;
        }
        let _signals = os::SignalsBlocked::new();
        let n = self.shared.collapse(max_pages);
        self.shared.check_mappings(true);
        n
    }

    /// Frees what handlers left, refills the reserves and counts the process's mappings
    /// now, from the calling thread.
    pub fn housekeep(&self) {
        if fault::forked() {
            return;
        }
        self.shared.check_mappings(true);
        self.shared.housekeep();
    }

    /// Sets the mapping budget (see [`Config::vma_budget`]) and checks it now.
    pub fn set_vma_budget(&self, mappings: usize) {
        self.shared.vma_budget.store(mappings, Ordering::Relaxed);
        self.shared.check_mappings(true);
    }

    /// The zonal handle.
    pub fn zonal(&self) -> &Arc<Zonal> {
        &self.shared.z
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        // In a child of fork() the threads do not exist (joining or detaching their stale
        // handles would touch threads of the parent), and nothing is the child's to free.
        if fault::forked() {
            std::mem::forget(self.thread.take());
            std::mem::forget(self.server.take());
            return;
        }
        // The thread runs while a region lives (it holds only a weak reference and stops when
        // the last one goes); a balancer dropped before its regions leaves it to them.
        // Without regions it stops the thread and waits for it, so that the reserves are back
        // with zonal when this returns.
        if self.shared.live_regions().is_empty() {
            self.shared.stop.store(true, Ordering::Release);
            self.shared.kick();
            for t in [self.thread.take(), self.server.take()].into_iter().flatten() {
                let _ = t.join();
            }
        }
    }
}

/// How often the balancer's thread runs a collapse pass.
const COLLAPSE_EVERY: Duration = Duration::from_millis(100);

/// The balancer's thread: frees and refills, scans every period, and collapses fragmented
/// windows.
fn worker(weak: Weak<Shared>) {
    // The program's asynchronous signals go to its own threads: this one holds pages BUSY.
    let _signals = os::SignalsBlocked::new();
    let mut cur = scan::Cursor::default();
    let mut next_scan: Option<Instant> = None;
    let mut next_collapse = Instant::now();
    loop {
        let Some(s) = weak.upgrade() else { return };
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let kick = s.kick.load(Ordering::Acquire);
        let short = s.housekeep();
        let now = Instant::now();
        let regions = s.live_regions();
        let delay = Duration::from_millis(s.cfg.scan_delay_ms.load(Ordering::Relaxed));
        let due: Vec<Arc<RegionShared>> = regions.into_iter().filter(|r| now.duration_since(r.born) >= delay).collect();
        let over = s.over_budget.load(Ordering::Relaxed);
        if s.enabled() && !over && !due.is_empty() && next_scan.is_none_or(|t| now >= t) {
            s.stats.scans.fetch_add(1, Ordering::Relaxed);
            scan::scan_pass(&s, &due, &mut cur);
            let cost = now.elapsed();
            let (min, max) =
                (s.cfg.scan_period_min_ms.load(Ordering::Relaxed), s.cfg.scan_period_max_ms.load(Ordering::Relaxed));
            let p = scan::next_period(
                s.period_ms.load(Ordering::Relaxed),
                s.win_local.swap(0, Ordering::Relaxed),
                s.win_remote.swap(0, Ordering::Relaxed),
                s.win_fail.swap(0, Ordering::Relaxed),
                min,
                max,
            );
            // The overhead cap: a pass may take at most `SCAN_OVERHEAD_PCT` of the time
            // between passes (Linux keeps `task_numa_work` near 3% of the task's run time).
            let capped = scan::capped_period(p, cost, max);
            if capped > p {
                s.stats.scan_capped.fetch_add(1, Ordering::Relaxed);
            }
            s.period_ms.store(capped, Ordering::Relaxed);
            next_scan = Some(now + Duration::from_millis(capped));
        }
        // Collapses at most a tenth of `collapse_mb` each tenth of a second.
        if now >= next_collapse {
            let pages = (s.cfg.collapse_mb.load(Ordering::Relaxed) as usize).saturating_mul(256) / 10;
            s.collapse(pages);
            s.retire_idle_dests();
            next_collapse = now + COLLAPSE_EVERY;
        }
        let wait = if short {
            Duration::from_millis(1)
        } else {
            next_scan.map_or(Duration::from_millis(100), |t| t.saturating_duration_since(Instant::now()))
        };
        let wait = wait.clamp(Duration::from_micros(100), Duration::from_millis(100));
        // Let go of the shared state while waiting, so that dropping the last region or the
        // balancer ends this thread.
        let word: *const AtomicU32 = &s.kick;
        let keep = Arc::downgrade(&s);
        drop(s);
        if let Some(s) = keep.upgrade() {
            // SAFETY: `word` points into `s`, alive for this call.
            os::futex_wait(unsafe { &*word }, kick, wait);
            drop(s);
        }
    }
}

/// The handler thread of the userfaultfd handler-thread backend: serves faults until the
/// balancer and its regions are gone.
fn fault_server(weak: Weak<Shared>) {
    let _signals = os::SignalsBlocked::new();
    loop {
        let Some(s) = weak.upgrade() else { return };
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let Some(u) = &s.uffd else { return };
        if let Some(f) = u.next_fault(50) {
            fault::serve_thread_fault(&s, f);
        }
    }
}

/// A region of balanced memory (see the crate's docs). Dropping it frees every frame.
pub struct Region {
    shared: Arc<RegionShared>,
}

/// A region's state, shared with the scanner and the fault handler.
pub struct RegionShared {
    pub(crate) start: usize,
    /// First touches map aligned windows of `2^ft_order` pages (0: a page at a time).
    pub(crate) ft_order: u32,
    /// Per node: the block first-touch windows are being carved from and the frames of it
    /// taken, in one word (`block | taken`: blocks are 2 MiB-aligned), 0 when none.
    carve: Box<[AtomicUsize]>,
    /// Set once, under `scan_lock`, when the region is torn down.
    dead: AtomicBool,
    pub(crate) entries: Box<[PageEntry]>,
    /// Per whole 2 MiB window: its destination block for pages migrating one by one.
    pub(crate) dest: Box<[dest::Dest]>,
    policy: MemPolicy,
    /// Per node: the other nodes the policy allows, nearest first (first-touch fallback).
    pub(crate) fallback: Vec<Vec<u16>>,
    /// Scan passes over the region (`numa_scan_seq`).
    pub(crate) scan_seq: AtomicUsize,
    /// Its threads' hint faults per node, for shared pages (`numa_group`).
    pub(crate) group: table::Group,
    born: Instant,
    slot: AtomicUsize,
    /// Held while the scanner marks the region and while it is torn down; `true` once dead.
    pub(crate) scan_lock: Mutex<bool>,
    pub(crate) bal: Arc<Shared>,
}

fn allowed(policy: &MemPolicy, nid: u16) -> bool {
    match policy {
        MemPolicy::Bind(m) => m.contains(NodeId(nid)),
        _ => true,
    }
}

impl RegionShared {
    /// Runs of pages mapped as one (consecutive frames with the same access), what the
    /// region adds to the process's mappings (`vm.max_map_count`) at most. The access that
    /// splits a mapping is the protection under mprotect (a hidden page is `PROT_NONE`), and
    /// the registration under userfaultfd (a hidden page is only zapped, in a mapping that
    /// the kernel merges with its neighbours' when both are registered or both are not).
    pub(crate) fn vma_runs(&self) -> usize {
        let mut runs = 0;
        let mut prev: Option<(usize, u8)> = None;
        let uffd = self.bal.uffd.is_some();
        for e in self.entries.iter() {
            let f = e.frame.load(Ordering::Relaxed);
            let s = e.state.load(Ordering::Relaxed);
            let class = match uffd {
                true => 1 + e.unregistered.load(Ordering::Relaxed) as u8,
                false if s == PRESENT => 1,
                false => 2,
            };
            let cur = (f != 0).then_some((f, class));
            match (prev, cur) {
                (Some((pf, pc)), Some((f, c))) if f == pf + PAGE && c == pc => {}
                (_, Some(_)) => runs += 1,
                _ => {}
            }
            prev = cur;
        }
        runs
    }
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// `n` consecutive frames (a power of two up to `CHUNK_PAGES`) of node `nid`, zeroed,
    /// for a first-touch window: carved from the region's current block of that node, or a
    /// new one from the node's reserve of blocks (whose frames the old block had left go to
    /// be freed). Lock-free (a CAS on the carve word) and async-signal-safe; `None` when
    /// the node has no block.
    pub(crate) fn carve(&self, nid: u16, n: usize) -> Option<usize> {
        const BLOCK: usize = CHUNK_PAGES * PAGE;
        let w = &self.carve[nid as usize];
        loop {
            let cur = w.load(Ordering::Acquire);
            let (blk, used) = (cur & !(BLOCK - 1), cur & (BLOCK - 1));
            if blk != 0 && used + n <= CHUNK_PAGES {
                if w.compare_exchange(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    return Some(blk + used * PAGE);
                }
                continue;
            }
            let new = self.bal.block_for(nid)?;
            if new % BLOCK != 0 {
                // Not aligned (an arena aligned below 2 MiB): the word cannot hold it.
                (0..CHUNK_PAGES).for_each(|i| self.bal.give_back(new + i * PAGE));
                return None;
            }
            if w.compare_exchange(cur, new | n, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                if self.bal.blocks[nid as usize].put(new).is_err() {
                    (0..CHUNK_PAGES).for_each(|i| self.bal.give_back(new + i * PAGE));
                }
                continue;
            }
            // The old block's frames nobody took: the CAS made them this thread's.
            for i in used..CHUNK_PAGES {
                if blk != 0 {
                    self.bal.give_back(blk + i * PAGE);
                }
            }
            return Some(new);
        }
    }

    pub(crate) fn contains(&self, addr: usize) -> bool {
        addr.wrapping_sub(self.start) < self.entries.len() * PAGE
    }

    /// The node a first touch of page `idx` takes its frame from, by the policy and the
    /// touching CPU (first-touch placement).
    pub(crate) fn place(&self, idx: usize) -> u16 {
        let here = self.bal.z.local_node().0;
        match &self.policy {
            MemPolicy::Local => here,
            MemPolicy::Preferred(n) => n.0,
            MemPolicy::Bind(m) => {
                if m.contains(NodeId(here)) {
                    here
                } else {
                    self.fallback[here as usize].first().copied().unwrap_or(here)
                }
            }
            MemPolicy::Interleave(m) => interleave(m, idx),
        }
    }

    /// Where a hint fault from a CPU of node `here` would move page `idx`
    /// (`mpol_misplaced`): the faulting CPU's node under the local policy and a bind that
    /// allows it; the preferred node; the page's interleave node.
    pub(crate) fn target(&self, idx: usize, here: u16) -> Option<u16> {
        match &self.policy {
            MemPolicy::Local => Some(here),
            MemPolicy::Preferred(n) => Some(n.0),
            MemPolicy::Bind(m) => m.contains(NodeId(here)).then_some(here),
            MemPolicy::Interleave(m) => Some(interleave(m, idx)),
        }
    }
}

/// The node of an interleaved page: the (page index mod nodes)-th node of the mask, as
/// Linux interleaves a mapping by page offset.
fn interleave(m: &zonal::NodeMask, idx: usize) -> u16 {
    let n = m.iter().count().max(1);
    m.iter().nth(idx % n).map_or(0, |x| x.0)
}

impl RegionShared {
    /// Ends the region now, whoever still holds a reference: no handler inside it any more
    /// (unregistered), no scan of it (the scan lock, and the mark `dead` the scanner checks),
    /// the range unmapped and every frame back with zonal. Idempotent.
    fn teardown(&self) {
        // In a child of fork() nothing here is the child's (see `fault::in_child`).
        if fault::forked() {
            return;
        }
        {
            // Marked dead under the lock, then let go: the scanner and the collapse check
            // the mark under it, and the work below (an unmap and a free per frame, seconds
            // for a region of gigabytes) must not hold up the balancer's thread, whose
            // refills the other regions' first touches wait for.
            let mut dead = self.scan_lock.lock().unwrap_or_else(|p| p.into_inner());
            if *dead {
                return;
            }
            *dead = true;
            self.dead.store(true, Ordering::Release);
        }
        let slot = self.slot.load(Ordering::Relaxed);
        if slot != usize::MAX {
            fault::unregister(slot);
        }
        // SAFETY: no handler is inside the region (unregistered), the scanner and the collapse
        // cannot touch it (marked dead under the lock they check it under), and its owner
        // gave up its pointer.
        unsafe { os::unmap(self.start, self.entries.len() * PAGE) };
        for e in self.entries.iter() {
            let f = e.frame.swap(0, Ordering::Relaxed);
            if f != 0 {
                self.bal.free_frame(f);
            }
        }
        self.free_dests();
        for w in self.carve.iter() {
            let cur = w.swap(0, Ordering::AcqRel);
            let (blk, used) = (cur & !(CHUNK_PAGES * PAGE - 1), cur & (CHUNK_PAGES * PAGE - 1));
            if blk != 0 {
                self.bal.free_block_from(blk, used);
            }
        }
        if self.ft_order > 0 {
            self.bal.ft_regions.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for RegionShared {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.shared.teardown();
    }
}

impl Region {
    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.shared.start as *mut u8
    }

    /// Bytes in the region (whole pages).
    pub fn len(&self) -> usize {
        self.shared.entries.len() * PAGE
    }

    /// Whether the region is empty (never: a region has at least a page).
    pub fn is_empty(&self) -> bool {
        self.shared.entries.is_empty()
    }

    /// The policy.
    pub fn policy(&self) -> &MemPolicy {
        &self.shared.policy
    }

    fn page_of(&self, addr: *const u8) -> Result<usize> {
        let a = addr as usize;
        if !self.shared.contains(a) {
            return Err(Error::OutOfRange { addr: a });
        }
        Ok((a - self.shared.start) / PAGE)
    }

    /// The node of the frame behind `addr`, `None` while the page has none.
    pub fn page_to_nid(&self, addr: *const u8) -> Result<Option<NodeId>> {
        let e = &self.shared.entries[self.page_of(addr)?];
        let f = e.frame.load(Ordering::Acquire);
        if f == 0 {
            return Ok(None);
        }
        Ok(Some(self.shared.bal.z.page_to_nid(f as *const u8)?))
    }

    /// Pages with a frame, per node.
    pub fn node_pages(&self) -> Vec<usize> {
        let mut v = vec![0; self.shared.bal.z.topology().nr_nodes()];
        for e in self.shared.entries.iter() {
            let f = e.frame.load(Ordering::Acquire);
            if let (true, Ok(n)) = (f != 0, self.shared.bal.z.page_to_nid(f as *const u8)) {
                v[n.0 as usize] += 1;
            }
        }
        v
    }

    /// The pages `offset..offset + len` covers, checked to lie in the region and not empty.
    fn pages_of(&self, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
        if len == 0 {
            return Err(Error::InvalidSize { bytes: 0 });
        }
        let end = offset.checked_add(len).filter(|&e| e <= self.len()).ok_or(Error::OutOfRange { addr: offset })?;
        Ok(offset / PAGE..end.div_ceil(PAGE))
    }

    /// Gives every page of `offset..offset + len` a frame now and makes it accessible, from
    /// the calling thread. The scanner may hide the pages again at its next pass: for memory
    /// the kernel reads or writes (system call buffers), use [`Region::pin`].
    pub fn prefault(&self, offset: usize, len: usize) -> Result<()> {
        if fault::forked() {
            return Err(Error::Forked);
        }
        let pages = self.pages_of(offset, len)?;
        let _signals = os::SignalsBlocked::new();
        pages.into_iter().try_for_each(|idx| self.shared.make_present(idx))
    }

    /// Pins the pages of `offset..offset + len` until the guard is dropped: each is given a
    /// frame now if it has none, made accessible, and left so (the scanner never hides it,
    /// no migration or collapse moves it) while any pin on it lasts. Pins nest.
    ///
    /// Required for memory the kernel keeps using past a system call, which it reaches
    /// through the frame and not the mapping: io_uring registered (fixed) buffers, O_DIRECT
    /// and AIO buffers, `vmsplice`d pages, RDMA memory registrations. Moving such a page
    /// would leave the kernel writing into the old frame. Plain `read(2)`/`write(2)` buffers
    /// need a pin (or a stopped scanner) under the `mprotect` and `userfaultfd` backends,
    /// where a system call touching a hidden page fails with `EFAULT`; the
    /// `userfaultfd-thread` backend serves such accesses itself.
    pub fn pin(&self, offset: usize, len: usize) -> Result<Pin<'_>> {
        self.pin_pages(offset, len)?;
        Ok(Pin { region: self, offset, len })
    }

    /// [`Region::pin`] without a guard (the C ABI's `zonal_region_pin`): each call is undone
    /// by one [`Region::unpin`] of the same range. On an error nothing stays pinned.
    pub fn pin_pages(&self, offset: usize, len: usize) -> Result<()> {
        if fault::forked() {
            return Err(Error::Forked);
        }
        let pages = self.pages_of(offset, len)?;
        let _signals = os::SignalsBlocked::new();
        let r = &self.shared;
        for idx in pages.clone() {
            let e = &r.entries[idx];
            // The count first, then the state (see `table`): a claimer after this sees it.
            let raised = e.pins.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_add(1)).is_ok();
            let res = match raised {
                true => r.make_present(idx),
                false => Err(Error::InvalidConfig(format!("page {idx} of the region holds 2^32-1 pins already"))),
            };
            if let Err(err) = res {
                if raised {
                    e.pins.fetch_sub(1, Ordering::SeqCst);
                }
                for j in pages.start..idx {
                    r.entries[j].pins.fetch_sub(1, Ordering::SeqCst);
                }
                return Err(err);
            }
        }
        Ok(())
    }

    /// Drops one pin from each page of `offset..offset + len`. A page that holds none is an
    /// error ([`Error::NotPinned`]), and then nothing changes.
    pub fn unpin(&self, offset: usize, len: usize) -> Result<()> {
        if fault::forked() {
            return Err(Error::Forked);
        }
        let pages = self.pages_of(offset, len)?;
        let r = &self.shared;
        for idx in pages.clone() {
            let dropped = r.entries[idx].pins.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if dropped.is_err() {
                for j in pages.start..idx {
                    r.entries[j].pins.fetch_add(1, Ordering::SeqCst);
                }
                return Err(Error::NotPinned { addr: r.start + idx * PAGE });
            }
        }
        Ok(())
    }

    /// Runs of pages mapped as one (consecutive frames with the same access), what the
    /// region adds to the process's mappings (`vm.max_map_count`) at most.
    pub fn vma_runs(&self) -> usize {
        self.shared.vma_runs()
    }

    /// Pages first touched together as one window (`2^order`; 1 when the region touches
    /// page by page): chosen from the region's size and the mapping budget.
    pub fn first_touch_pages(&self) -> usize {
        1 << self.shared.ft_order
    }
}

/// Pins on pages of a region ([`Region::pin`]), dropped with the guard.
#[must_use = "the pages are unpinned when the guard is dropped"]
pub struct Pin<'a> {
    region: &'a Region,
    offset: usize,
    len: usize,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        // The guard's own pins: the unpin cannot find a page without one.
        let _ = self.region.unpin(self.offset, self.len);
    }
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

impl RegionShared {
    /// Makes page `idx` `PRESENT`, from a thread (not a signal handler): a first touch when
    /// it has no frame, its mapping back when it is hidden, a wait while another thread
    /// changes it.
    fn make_present(&self, idx: usize) -> Result<()> {
        let e = &self.entries[idx];
        loop {
            match e.state.load(Ordering::SeqCst) {
                PRESENT => return Ok(()),
                UNMAPPED if e.claim(UNMAPPED) => self.first_touch(idx)?,
                HINT if e.claim(HINT) => {
                    // SAFETY: a mapped page of this region, claimed.
                    let res = unsafe { self.reveal(self.start + idx * PAGE, PAGE) };
                    e.release(if res.is_ok() { PRESENT } else { HINT });
                    res.map_err(|errno| Error::Os { call: "mprotect", errno })?;
                }
                BUSY => std::thread::yield_now(),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_every_key_and_refuses_the_rest() {
        let c = Config::parse(
            "numa_balancing=0; mode=eager;backend=mprotect;scan_delay_ms=5;scan_period_min_ms=10;\
             scan_period_max_ms=20;scan_size_mb=4;reserve_pages=8;vma_budget=100",
        )
        .unwrap();
        assert!(!c.enabled);
        assert_eq!((c.mode, c.backend), (MigrateMode::Eager, Backend::Mprotect));
        assert_eq!((c.scan_delay_ms, c.scan_period_min_ms, c.scan_period_max_ms), (5, 10, 20));
        assert_eq!((c.scan_size_mb, c.reserve_pages, c.vma_budget), (4, 8, Some(100)));
        assert_eq!(Config::parse("").unwrap().scan_size_mb, 256);
        for bad in [
            "mode=sideways",
            "numa_balancing=2",
            "colour=red",
            "scan_size_mb=lots",
            "novalue",
            "scan_period_min_ms=9;scan_period_max_ms=3",
        ] {
            assert!(matches!(Config::parse(bad), Err(Error::InvalidConfig(_))), "{bad}");
        }
    }
}
