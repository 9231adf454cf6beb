//! Memory tiers (Linux's `mm/memory-tiers.c`) and the promotion decision of NUMA
//! balancing's tiering mode (`kernel.numa_balancing` bit 1, Linux 5.18+).
//!
//! **Tiers.** Each node gets an *abstract distance*: 576 for a node with CPUs (Linux's
//! `MEMTIER_ADISTANCE_DRAM`, 4 × 128 + 64), and for a memory-only node 576 scaled by its
//! distance to the nearest node with CPUs over the local distance (a CXL expander at
//! distance 20 is twice as far: 1152). Nodes whose abstract distances fall in one chunk of
//! 128 (`MEMTIER_CHUNK_SIZE`) share a tier; tiers are numbered from 0, the fastest. The
//! topology spec may give the tiers instead (`tiers=0:1`). Every tier at or above the
//! slowest tier holding a CPU node is *top tier* (`node_is_toptier`); each node's demotion
//! target is the nearest node of the next tier down.
//!
//! **Hot pages** (`should_numa_migrate_memory`'s tiering branch). The scanner stamps the
//! time it hid a page; a hint fault on a lower-tier page then measures its *latency*, and
//! the page is a promotion candidate when the latency is below the node's threshold.
//! Candidates are counted per destination node (`pgpromote_candidate`) in windows of one
//! second; once a window's count passes the rate limit, candidates wait for the next one.
//! Every `scan_period_max_ms` the threshold moves a step (an eighth of the tunable) toward
//! the rate: lower when the period's candidates exceeded the limit's share by 10%, higher
//! (up to twice the tunable) when they fell 10% short. A node with plenty of free memory
//! (above high by 1 GiB or a sixteenth of the node, `pgdat_free_space_enough`) promotes
//! without the test.
//!
//! Locking: none. Every field is an atomic; the hint-fault path (a signal handler) reads
//! and updates them with no lock, and the windows change hands with a CAS on their start.
//!
//! Invariant: per node, `pgpromote_success <= pgpromote_candidate` plus the promotions of
//! the free-space rule (which are not candidates).

use crate::os;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use zonal::topology::LOCAL_DISTANCE;
use zonal::{NodeId, Topology};

/// Linux's abstract distance of DRAM (`MEMTIER_ADISTANCE_DRAM`).
pub const ADISTANCE_DRAM: u32 = 4 * ADISTANCE_CHUNK + ADISTANCE_CHUNK / 2;
/// Abstract distances in one chunk share a tier (`MEMTIER_CHUNK_SIZE`).
pub const ADISTANCE_CHUNK: u32 = 128;

/// Steps of the threshold's adjustment: a step is twice the tunable over this
/// (`NUMA_MIGRATION_ADJUST_STEPS`).
const ADJUST_STEPS: u64 = 16;

/// The nodes ranked into memory tiers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tiers {
    /// Per node: its tier, 0 the fastest.
    tier: Vec<u8>,
    /// Per node: its abstract distance, `None` when the spec gave the tiers.
    adistance: Vec<Option<u32>>,
    /// Per node: whether its tier is a top tier.
    top: Vec<bool>,
    /// Per node: the nearest node of the next tier down.
    demote_to: Vec<Option<u16>>,
}

impl Tiers {
    /// The tiers of `t`: from the spec's `tiers=` if it gave them, else by distance.
    pub fn of(t: &Topology) -> Tiers {
        let n = t.nr_nodes();
        let id = |i: usize| NodeId(i as u16);
        let cpu_nodes: Vec<usize> = (0..n).filter(|&i| t.has_cpus(id(i)).unwrap_or(false)).collect();
        let (tier, adistance) = match t.tier_override() {
            Some(given) => (given.to_vec(), vec![None; n]),
            None => {
                let adist: Vec<u32> = (0..n)
                    .map(|i| {
                        if cpu_nodes.contains(&i) || cpu_nodes.is_empty() {
                            return ADISTANCE_DRAM;
                        }
                        let d = cpu_nodes.iter().filter_map(|&c| t.distance(id(i), id(c)).ok()).min();
                        ADISTANCE_DRAM.saturating_mul(d.unwrap_or(LOCAL_DISTANCE)) / LOCAL_DISTANCE
                    })
                    .collect();
                let mut chunks: Vec<u32> = adist.iter().map(|a| a / ADISTANCE_CHUNK).collect();
                chunks.sort_unstable();
                chunks.dedup();
                let tier = adist
                    .iter()
                    .map(|a| chunks.iter().position(|&c| c == a / ADISTANCE_CHUNK).unwrap_or(0) as u8)
                    .collect();
                (tier, adist.into_iter().map(Some).collect())
            }
        };
        // Top tier: at or above the slowest tier with a CPU node (all, without CPU nodes).
        let top_bound = cpu_nodes.iter().map(|&c| tier[c]).max().unwrap_or(u8::MAX);
        let top = tier.iter().map(|&x| x <= top_bound).collect();
        let demote_to = (0..n)
            .map(|i| {
                let next = tier.iter().copied().filter(|&x| x > tier[i]).min()?;
                (0..n)
                    .filter(|&j| tier[j] == next)
                    .min_by_key(|&j| (t.distance(id(i), id(j)).unwrap_or(u32::MAX), j))
                    .map(|j| j as u16)
            })
            .collect();
        Tiers { tier, adistance, top, demote_to }
    }

    /// Node `nid`'s tier, 0 the fastest.
    pub fn tier(&self, nid: u16) -> u8 {
        self.tier.get(nid as usize).copied().unwrap_or(0)
    }

    /// Whether node `nid` is in a top tier (`node_is_toptier`).
    pub fn is_top(&self, nid: u16) -> bool {
        self.top.get(nid as usize).copied().unwrap_or(true)
    }

    /// Node `nid`'s demotion target: the nearest node of the next tier down.
    pub fn demote_to(&self, nid: u16) -> Option<u16> {
        self.demote_to.get(nid as usize).copied().flatten()
    }

    /// Node `nid`'s abstract distance, `None` when the topology spec gave the tiers.
    pub fn adistance(&self, nid: u16) -> Option<u32> {
        self.adistance.get(nid as usize).copied().flatten()
    }

    /// Whether any node is below the top tiers (tiering has somewhere to promote from).
    pub fn has_lower(&self) -> bool {
        self.top.iter().any(|t| !t)
    }

    /// The ranking as `zonal topology` prints it: a line per tier, fastest first.
    pub fn describe(&self) -> String {
        let mut s = String::from("memory tiers (0 fastest; top tiers take promotions, demotion goes one tier down):\n");
        let mut tiers: Vec<u8> = self.tier.clone();
        tiers.sort_unstable();
        tiers.dedup();
        for t in tiers {
            let nodes: Vec<usize> = (0..self.tier.len()).filter(|&i| self.tier[i] == t).collect();
            let list: Vec<String> = nodes
                .iter()
                .map(|&i| match (self.adistance[i], self.demote_to[i]) {
                    (Some(a), Some(d)) => format!("{i} (adistance {a}, demotes to {d})"),
                    (Some(a), None) => format!("{i} (adistance {a})"),
                    (None, Some(d)) => format!("{i} (demotes to {d})"),
                    (None, None) => format!("{i}"),
                })
                .collect();
            let top = if nodes.first().is_some_and(|&i| self.top[i]) { " top" } else { "" };
            s.push_str(&format!("tier {t}{top}: nodes {}\n", list.join(", ")));
        }
        s
    }
}

/// One destination node's tiering state: the rate limit's window, the threshold and its
/// adjustment period, and the node's counters (Linux keeps them in its `pglist_data`).
#[derive(Default)]
pub(crate) struct TierNode {
    /// The rate limit's window: its start (ms) and the candidates counted before it
    /// (`nbp_rl_start`, `nbp_rl_nr_cand`).
    rl_start_ms: AtomicU64,
    rl_cand: AtomicU64,
    /// The threshold's adjustment period: its start and the candidates before it
    /// (`nbp_th_start`, `nbp_th_nr_cand`), and the threshold in use, 0 for the tunable's
    /// (`nbp_threshold`).
    th_start_ms: AtomicU64,
    th_cand: AtomicU64,
    pub(crate) threshold_ms: AtomicU64,
    /// A promotion found the node without room since its last demotion pass: the balancer's
    /// thread demotes (Linux's `wakeup_kswapd` from `migrate_balanced_pgdat`).
    pub(crate) short: AtomicBool,
    pub(crate) pgpromote_success: AtomicU64,
    pub(crate) pgpromote_candidate: AtomicU64,
    pub(crate) pgdemote_kswapd: AtomicU64,
    pub(crate) pgdemote_direct: AtomicU64,
    /// Pages hint faults moved here (`numa_pages_migrated`, by destination).
    pub(crate) pages_migrated: AtomicU64,
}

/// The tiering clock: the test's when it has one, else the monotonic clock. Async-signal-
/// safe (an atomic load, or `clock_gettime`).
pub(crate) struct Clock(pub(crate) Option<Arc<AtomicU64>>);

impl Clock {
    pub(crate) fn now_ms(&self) -> u64 {
        match &self.0 {
            Some(c) => c.load(Ordering::Relaxed),
            None => os::now_ns() / 1_000_000,
        }
    }
}

/// What a promotion candidate is judged with: the tunables, read once per fault.
pub(crate) struct Limits {
    pub(crate) now_ms: u64,
    /// `numa_balancing_hot_threshold_ms`.
    pub(crate) hot_ms: u64,
    /// `numa_balancing_promote_rate_limit_MBps` in pages.
    pub(crate) rate_pages: u64,
    /// `scan_period_max_ms`: the threshold's adjustment period.
    pub(crate) period_ms: u64,
}

impl TierNode {
    /// Starts the windows at `now`, so the first adjustment comes a period later.
    pub(crate) fn start(&self, now_ms: u64) {
        self.rl_start_ms.store(now_ms, Ordering::Relaxed);
        self.th_start_ms.store(now_ms, Ordering::Relaxed);
    }

    /// The threshold in use (ms).
    pub(crate) fn threshold(&self, hot_ms: u64) -> u64 {
        match self.threshold_ms.load(Ordering::Relaxed) {
            0 => hot_ms,
            t => t,
        }
    }

    /// Whether a page whose hint fault came `latency_ms` after its scan, `pages` of them,
    /// should be promoted here: hot, and within the rate limit. Counts the candidate.
    pub(crate) fn promote(&self, latency_ms: u64, pages: u64, l: &Limits) -> bool {
        self.adjust_threshold(l);
        if latency_ms >= self.threshold(l.hot_ms) {
            return false;
        }
        let cand = self.pgpromote_candidate.fetch_add(pages, Ordering::Relaxed) + pages;
        let start = self.rl_start_ms.load(Ordering::Relaxed);
        if l.now_ms.saturating_sub(start) >= 1000
            && self.rl_start_ms.compare_exchange(start, l.now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            // A new window, this candidate its first.
            self.rl_cand.store(cand - pages, Ordering::Relaxed);
        }
        cand.saturating_sub(self.rl_cand.load(Ordering::Relaxed)) <= l.rate_pages
    }

    /// Moves the threshold a step toward the rate limit once a period.
    fn adjust_threshold(&self, l: &Limits) {
        let start = self.th_start_ms.load(Ordering::Relaxed);
        if l.now_ms.saturating_sub(start) <= l.period_ms
            || self.th_start_ms.compare_exchange(start, l.now_ms, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return;
        }
        let cand = self.pgpromote_candidate.load(Ordering::Relaxed);
        let diff = cand.saturating_sub(self.th_cand.swap(cand, Ordering::Relaxed));
        let want = l.rate_pages.saturating_mul(l.period_ms) / 1000;
        let th = next_threshold(self.threshold(l.hot_ms), l.hot_ms, diff, want);
        self.threshold_ms.store(th, Ordering::Relaxed);
    }
}

/// The threshold after a period with `cand` candidates where the rate limit allows `want`:
/// a step lower (not below one step) past 110% of it, a step higher (not above twice
/// `hot_ms`) below 90%, else the same. A step is `2 * hot_ms / 16`.
pub(crate) fn next_threshold(th: u64, hot_ms: u64, cand: u64, want: u64) -> u64 {
    let step = (hot_ms * 2 / ADJUST_STEPS).max(1);
    if cand > want.saturating_mul(11) / 10 {
        th.saturating_sub(step).max(step)
    } else if cand < want.saturating_mul(9) / 10 {
        (th + step).min((hot_ms * 2).max(step))
    } else {
        th
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zonal::topology::Machine;

    fn topo(spec: &str) -> Topology {
        Topology::parse_for(spec, Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap()
    }

    #[test]
    fn cpu_nodes_are_the_top_tier_and_farther_memory_lower() {
        let t = Tiers::of(&topo("nodes=4,size=4M,cpus=0:1::,distance=10 20 20 30:20 10 30 20:20 30 10 40:30 20 40 10"));
        // Nodes 0 and 1 have CPUs; node 2 is 20 from node 0 (adistance 1152), node 3 is 20
        // from node 1 (1152 too): one tier below DRAM.
        assert_eq!((0..4).map(|n| t.tier(n)).collect::<Vec<_>>(), vec![0, 0, 1, 1]);
        assert_eq!((t.adistance(0), t.adistance(2)), (Some(576), Some(1152)));
        assert!(t.is_top(0) && t.is_top(1) && !t.is_top(2) && !t.is_top(3));
        assert_eq!((t.demote_to(0), t.demote_to(1), t.demote_to(2)), (Some(2), Some(3), None));
        let far = Tiers::of(&topo("nodes=3,size=4M,cpus=0-1::,distance=10 20 30:20 10 20:30 20 10"));
        assert_eq!((far.tier(0), far.tier(1), far.tier(2)), (0, 1, 2));
        assert_eq!((far.demote_to(0), far.demote_to(1)), (Some(1), Some(2)));
        assert!(far.describe().contains("tier 0 top: nodes 0 (adistance 576, demotes to 1)"), "{}", far.describe());
        // Every node with CPUs, or none: one tier, nothing to demote to.
        let flat = Tiers::of(&topo("nodes=2,size=4M,cpus=0:1"));
        assert!(!flat.has_lower() && flat.demote_to(0).is_none());
    }

    #[test]
    fn the_spec_overrides_the_ranking() {
        // Node 2, memory-only at distance 20, declared as fast as DRAM: top tier; node 1 with
        // CPUs but declared tier 1 makes tier 1 top too (at or above the slowest CPU tier).
        let t = Tiers::of(&topo("nodes=3,size=4M,cpus=0::1,tiers=0:2:0"));
        assert!(t.is_top(0) && t.is_top(2) && !t.is_top(1));
        assert_eq!(t.adistance(0), None);
        let u = Tiers::of(&topo("nodes=3,size=4M,cpus=0:1:,tiers=0:1:2"));
        assert!(u.is_top(1) && !u.is_top(2));
        assert_eq!((u.demote_to(0), u.demote_to(1)), (Some(1), Some(2)));
    }

    #[test]
    fn the_threshold_follows_the_rate_limit() {
        // Twice the limit's share: a step (2 * 1000 / 16 = 125) lower; a tenth: higher.
        assert_eq!(next_threshold(1000, 1000, 2000, 1000), 875);
        assert_eq!(next_threshold(1000, 1000, 100, 1000), 1125);
        assert_eq!(next_threshold(1000, 1000, 1000, 1000), 1000);
        assert_eq!(next_threshold(125, 1000, 9999, 1000), 125, "never below a step");
        assert_eq!(next_threshold(2000, 1000, 0, 1000), 2000, "never above twice the tunable");
    }

    #[test]
    fn candidates_past_the_rate_limit_wait_for_the_next_second() {
        let n = TierNode::default();
        n.start(0);
        let l = |now_ms| Limits { now_ms, hot_ms: 1000, rate_pages: 3, period_ms: 60_000 };
        let got: Vec<bool> = (0..5).map(|_| n.promote(10, 1, &l(500))).collect();
        assert_eq!(got, vec![true, true, true, false, false]);
        assert!(!n.promote(1000, 1, &l(500)), "not hot");
        assert!(n.promote(10, 1, &l(1500)), "a new window");
        assert_eq!(n.pgpromote_candidate.load(Ordering::Relaxed), 6);
    }
}
