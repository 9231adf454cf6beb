//! The state the balancer's thread, the regions and the fault handler share: `Shared`, one
//! per balancer, and `RegionShared`, one per region. Data only: what each room does with
//! them is in that room (`fault`, `scan`, `collapse`, `window`, `region`, `balancer`).

use crate::reserve::{FreeStack, NodeReserve, Reserve};
use crate::table::PageEntry;
use crate::{dest, table, uffd, Counters, Tunables};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;
use zonal::{MemPolicy, Zonal};

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
    /// `Config::kswapd`: whether the balancer's thread runs demotion passes.
    pub(crate) kswapd: bool,
    /// Per node: windows that found `chunks` empty since the last refill (each asks for one
    /// more block at the next), and the refills of `chunks` ended, which a migration waiting
    /// for a block sleeps on.
    pub(crate) chunk_misses: Vec<AtomicUsize>,
    pub(crate) chunk_refills: AtomicU32,
    /// Per node: the blocks `chunks` is kept at (the balancer's thread's own).
    pub(crate) chunk_want: Vec<AtomicUsize>,
    /// Per node: blocks of `CHUNK_PAGES` consecutive frames (split) that regions carve their
    /// first-touch windows from, filled while a region touches in windows.
    pub(crate) blocks: Vec<Reserve>,
    /// Per node: whether its last refill found no free block of that order.
    pub(crate) blocks_out: Vec<AtomicBool>,
    /// Live regions that touch in windows.
    pub(crate) ft_regions: AtomicUsize,
    /// Refill passes ended: a handler waiting for frames sleeps on it (`FUTEX_WAIT`), and
    /// gives up only once a pass that started after it asked found no frame anywhere.
    pub(crate) refills: AtomicU32,
    /// Frames to free (old frames of migrated pages, frames a handler could not use).
    pub(crate) to_free: FreeStack,
    /// Regions to scan, in registration order.
    pub(crate) regions: Mutex<Vec<Weak<RegionShared>>>,
    /// Bumped to wake the balancer's thread (refill, a new region, a setting).
    pub(crate) kick: AtomicU32,
    pub(crate) stop: AtomicBool,
    /// The scan window's local and remote hint faults and failed migrations.
    pub(crate) win_local: AtomicU64,
    pub(crate) win_remote: AtomicU64,
    pub(crate) win_fail: AtomicU64,
    pub(crate) period_ms: AtomicU64,
    /// Per node: its zones' high watermarks summed (`migrate_balanced_pgdat`'s test).
    pub(crate) high: Vec<usize>,
    /// The userfaultfd of the userfaultfd backend; `None` under mprotect.
    pub(crate) uffd: Option<uffd::Uffd>,
    /// The id of the counters added to the zonal handle's reports.
    pub(crate) source: std::sync::OnceLock<u64>,
    /// The id of the tunables added to the zonal handle's sysctl.
    pub(crate) tunable_source: std::sync::OnceLock<u64>,
    /// The mapping budget, the mappings at the last check and the most seen, and whether
    /// the process is at the budget (scans and migrations wait).
    pub(crate) vma_budget: AtomicUsize,
    pub(crate) vmas: AtomicUsize,
    pub(crate) vmas_peak: AtomicUsize,
    pub(crate) over_budget: AtomicBool,
    pub(crate) last_vma_check: Mutex<Option<Instant>>,
    /// Where `Balancer::scan_now` stopped.
    pub(crate) scan_cursor: Mutex<Cursor>,
    /// Where the last collapse pass stopped.
    pub(crate) collapse_cursor: Mutex<Cursor>,
    /// The nodes' memory tiers, their tiering state (per node), and the tiering clock.
    pub(crate) tiers: crate::tier::Tiers,
    pub(crate) tier_nodes: Vec<crate::tier::TierNode>,
    pub(crate) clock: crate::tier::Clock,
    /// Held by a demotion pass (the thread's or `Balancer::demote_now`'s): one at a time.
    pub(crate) demoting: Mutex<()>,
}

/// A region's state, shared with the scanner and the fault handler.
pub struct RegionShared {
    pub(crate) start: usize,
    /// First touches map aligned windows of `2^ft_order` pages (0: a page at a time).
    pub(crate) ft_order: u32,
    /// Per node: the block first-touch windows are being carved from and the frames of it
    /// taken, in one word (`block | taken`: blocks are 2 MiB-aligned), 0 when none.
    pub(crate) carve: Box<[AtomicUsize]>,
    /// Set once, under `scan_lock`, when the region is torn down.
    pub(crate) dead: AtomicBool,
    pub(crate) entries: Box<[PageEntry]>,
    /// Per whole 2 MiB window: its destination block for pages migrating one by one.
    pub(crate) dest: Box<[dest::Dest]>,
    pub(crate) policy: MemPolicy,
    /// Per node: the other nodes the policy allows, nearest first (first-touch fallback).
    pub(crate) fallback: Vec<Vec<u16>>,
    /// Scan passes over the region (`numa_scan_seq`).
    pub(crate) scan_seq: AtomicUsize,
    /// Its threads' hint faults per node, for shared pages (`numa_group`).
    pub(crate) group: table::Group,
    pub(crate) born: Instant,
    pub(crate) slot: AtomicUsize,
    /// Held while the scanner marks the region and while it is torn down; `true` once dead.
    pub(crate) scan_lock: Mutex<bool>,
    pub(crate) bal: Arc<Shared>,
}

/// Where the scanner stopped: a region (by registration order) and a page in it.
#[derive(Default)]
pub(crate) struct Cursor {
    pub(crate) region: usize,
    pub(crate) page: usize,
}
