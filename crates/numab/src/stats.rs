//! The layer's counters, named as Linux's `/proc/vmstat` names them where it has them, and
//! their snapshot.

use std::sync::atomic::AtomicU64;

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
    /// Memory tiering, summed over the nodes (see [`NodeTierStats`] for each's).
    pub pgpromote_success: u64,
    pub pgpromote_candidate: u64,
    pub pgdemote_kswapd: u64,
    pub pgdemote_direct: u64,
    /// Per node: its tiering counters.
    pub nodes: Vec<NodeTierStats>,
}

/// One node's counters of memory tiering and migration, as Linux's
/// `/sys/devices/system/node/nodeN/vmstat` has them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeTierStats {
    /// Pages promoted to this node from a lower tier (`pgpromote_success`).
    pub pgpromote_success: u64,
    /// Hot lower-tier pages whose hint fault asked for this node, rate-limited or not
    /// (`pgpromote_candidate`).
    pub pgpromote_candidate: u64,
    /// Pages demoted from this node by the balancer's thread (`pgdemote_kswapd`: Linux's
    /// kswapd demotes in its reclaim).
    pub pgdemote_kswapd: u64,
    /// Pages demoted from this node by a caller's own thread (`Balancer::demote_now`;
    /// `pgdemote_direct`: Linux's direct reclaim runs in the allocating task).
    pub pgdemote_direct: u64,
    /// Pages hint faults moved to this node (`numa_pages_migrated`, by destination).
    pub numa_pages_migrated: u64,
    /// The hot threshold in use for promotions to this node, ms.
    pub hot_threshold_ms: u64,
}

impl NodeTierStats {
    /// The counters as `(name, value)`, Linux's names.
    pub fn items(&self) -> [(&'static str, u64); 6] {
        [
            ("pgpromote_success", self.pgpromote_success),
            ("pgpromote_candidate", self.pgpromote_candidate),
            ("pgdemote_kswapd", self.pgdemote_kswapd),
            ("pgdemote_direct", self.pgdemote_direct),
            ("numa_pages_migrated", self.numa_pages_migrated),
            ("numab_hot_threshold_ms", self.hot_threshold_ms),
        ]
    }
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
            ("pgpromote_success", self.pgpromote_success),
            ("pgpromote_candidate", self.pgpromote_candidate),
            ("pgdemote_kswapd", self.pgdemote_kswapd),
            ("pgdemote_direct", self.pgdemote_direct),
        ]
    }

    /// Every counter, then each node's tiering counters as `<name>_node<N>` (what the
    /// balancer adds to zonal's vmstat, JSON and Prometheus reports).
    pub fn all_items(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self.items().into_iter().map(|(n, v)| (n.to_string(), v)).collect();
        for (nid, n) in self.nodes.iter().enumerate() {
            v.extend(n.items().into_iter().map(|(name, x)| (format!("{name}_node{nid}"), x)));
        }
        v
    }
}
