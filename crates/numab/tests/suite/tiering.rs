//! Memory tiering (issue 41): promotion of hot lower-tier pages, its hot threshold and rate
//! limit, demotion of the coldest top-tier pages, and no thrashing between the two. On a
//! fake two-node topology with both CPUs on node 0 (the top tier) and node 1 memory-only
//! (distance 20: the tier below). The tests drive the scanner (`scan_now`), the demotion
//! (`demote_now`) and the tiering clock (`Config::tier_clock`), so hint-fault latencies and
//! rate windows are exact: nothing here depends on how fast the machine runs.
//!
//! Each test was run once with its mechanism taken out, and fails then (see each test's
//! note): the promotion branch of the hint fault (`fault::promotion_fault` never called), the
//! latency test (`TierNode::promote` ignoring the threshold), the rate limit (always within
//! it), the demotion pass (a no-op), and the coldness of demotion's candidates (any page of
//! the node, present or hinted, taken in address order).

use crate::common::on_cpu;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use zonal::topology::Machine;
use zonal::{Config, Gfp, MemPolicy, NodeId, Topology, Zonal};
use zonal_numab::{Backend, Balancer, Region, PAGE};

fn zonal() -> Arc<Zonal> {
    let t = Topology::parse_for("nodes=2,sizes=16M:48M,cpus=0-1:", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    Arc::new(Zonal::new(Config::new(t)).unwrap())
}

/// A balancer in tiering mode alone whose thread never scans nor demotes (the tests do:
/// a pass of the thread's own, started when a demotion's kick woke it, moved pages while a
/// test read its counters), on the test's clock, keeping frames ready for a promotion of
/// every page the promotion tests hide at once (a migration that finds the reserve empty
/// fails, as Linux's does without a free page), and few for the demotion tests, whose node
/// 0 is short.
fn balancer(z: &Arc<Zonal>, clock: &Arc<AtomicU64>, demotion: bool, rate_mbps: u64) -> Balancer {
    Balancer::new(z.clone(), config(clock, demotion, rate_mbps)).unwrap()
}

/// [`balancer`]'s settings.
fn config(clock: &Arc<AtomicU64>, demotion: bool, rate_mbps: u64) -> zonal_numab::Config {
    zonal_numab::Config {
        enabled: false,
        tiering: true,
        demotion_enabled: demotion,
        kswapd: false,
        promote_rate_limit_mbps: rate_mbps,
        tier_clock: Some(clock.clone()),
        backend: Backend::Mprotect,
        scan_delay_ms: 3_600_000,
        reserve_pages: if demotion { 16 } else { 640 },
        collapse_mb: 0,
        chunk_migration: false,
        ..Default::default()
    }
}

/// Every block node `nid` gives, so that first touches fall back to the next node.
fn eat(z: &Zonal, nid: u16) -> Vec<(*mut u8, u32)> {
    let mut held = Vec::new();
    for o in (0..=z.max_order().get() as u32).rev() {
        while let Ok(p) = z.alloc_pages_node(NodeId(nid), Gfp::THISNODE, o) {
            held.push((p.as_ptr(), o));
        }
    }
    held
}

fn release(z: &Zonal, held: Vec<(*mut u8, u32)>) {
    for (p, o) in held {
        z.free_pages(p, o).unwrap();
    }
}

fn word(r: &Region, i: usize) -> *mut u64 {
    (r.as_ptr() as usize + i * PAGE) as *mut u64
}

/// Writes page `i`'s tag (its first touch, from node 0's CPUs).
fn fill(r: &Region, pages: impl Iterator<Item = usize> + Send, tag: u64) {
    // SAFETY: pages of the region, alive for the call.
    on_cpu(0, || pages.for_each(|i| unsafe { word(r, i).write_volatile(tag + i as u64) }));
}

/// Reads page `i` from node 0's CPUs (a hint fault if it is hidden) and checks its tag.
fn touch(r: &Region, pages: impl Iterator<Item = usize> + Send, tag: u64) {
    // SAFETY: as in `fill`.
    on_cpu(0, || pages.for_each(|i| assert_eq!(unsafe { word(r, i).read_volatile() }, tag + i as u64, "page {i}")));
}

fn node_of(r: &Region, i: usize) -> u16 {
    r.page_to_nid(word(r, i) as *const u8).unwrap().unwrap().0
}

/// A balancer (see `balancer`, no demotion) and a region of `pages` first touched on node
/// 1, node 0 eaten meanwhile (from before the balancer, whose reserve would hold node 0's
/// frames), then given back and the reserves refilled: every page a promotion candidate,
/// with room above.
fn on_slow_tier(z: &Arc<Zonal>, clock: &Arc<AtomicU64>, rate_mbps: u64, pages: usize, tag: u64) -> (Balancer, Region) {
    let eater = eat(z, 0);
    let b = balancer(z, clock, false, rate_mbps);
    let r = b.region(pages * PAGE, MemPolicy::Local).unwrap();
    fill(&r, 0..pages, tag);
    release(z, eater);
    b.housekeep();
    (b, r)
}

/// Promotion: in tiering mode the scanner hides only the lower tier's pages, and a hint
/// fault soon after the scan moves the page to the faulting CPU's top-tier node, counted
/// as Linux counts it. (Checked to fail with the promotion branch of the hint fault taken
/// out: the pages stay on node 1.)
#[test]
fn hot_pages_of_the_lower_tier_are_promoted() {
    let z = zonal();
    let clock = Arc::new(AtomicU64::new(0));
    let (b, r) = on_slow_tier(&z, &clock, 65536, 256, 0x41_1000);
    assert!(b.tiers().is_top(0) && !b.tiers().is_top(1));
    let fast = b.region(64 * PAGE, MemPolicy::Local).unwrap();
    fill(&fast, 0..64, 0x41_0000);
    assert_eq!(fast.node_pages(), vec![64, 0]);
    let slow: Vec<usize> = (0..256).filter(|&i| node_of(&r, i) == 1).collect();
    assert!(slow.len() >= 200, "{} of 256 pages on node 1", slow.len());
    // The top tier's pages are not hidden: only the lower tier's.
    assert_eq!(b.scan_now(), slow.len());
    clock.store(10, Ordering::Relaxed);
    touch(&r, 0..256, 0x41_1000);
    touch(&fast, 0..64, 0x41_0000);
    let s = b.stats();
    let what = format!("{s:?}");
    assert_eq!(r.node_pages(), vec![256, 0], "{what}");
    assert_eq!(s.pgpromote_success, slow.len() as u64, "{what}");
    assert_eq!(s.nodes[0].pgpromote_success, slow.len() as u64, "{what}");
    assert_eq!(s.nodes[0].pgpromote_candidate, slow.len() as u64, "{what}");
    assert_eq!(s.nodes[0].numa_pages_migrated, slow.len() as u64, "{what}");
    assert_eq!(s.numa_pages_migrated, slow.len() as u64, "{what}");
    assert_eq!(s.numa_hint_faults, slow.len() as u64, "{what}");
    // Reported where zonal's counters are read, per node too.
    assert_eq!(z.vmstat_value("pgpromote_success").unwrap(), slow.len() as u64);
    assert_eq!(z.vmstat_value("pgpromote_success_node0").unwrap(), slow.len() as u64);
    touch(&r, 0..256, 0x41_1000);
    drop((r, fast, b));
    assert_eq!(z.check_invariants().unwrap(), 0);
}

/// The hot threshold: a fault 10 ms after the scan promotes, one 5 s after does not (the
/// page was cold); neither counts as a candidate then. (Checked to fail with the latency
/// test taken out: the late pages are promoted too.)
#[test]
fn pages_faulting_after_the_hot_threshold_stay() {
    let z = zonal();
    let clock = Arc::new(AtomicU64::new(1_000_000));
    let (b, r) = on_slow_tier(&z, &clock, 65536, 256, 0x42_0000);
    let slow: Vec<usize> = (0..256).filter(|&i| node_of(&r, i) == 1).collect();
    b.scan_now();
    let (hot, cold): (Vec<usize>, Vec<usize>) = slow.iter().partition(|&&i| i % 2 == 0);
    clock.fetch_add(10, Ordering::Relaxed);
    touch(&r, hot.iter().copied(), 0x42_0000);
    clock.fetch_add(5000, Ordering::Relaxed);
    touch(&r, cold.iter().copied(), 0x42_0000);
    let s = b.stats();
    assert!(hot.iter().all(|&i| node_of(&r, i) == 0), "{s:?}");
    assert!(cold.iter().all(|&i| node_of(&r, i) == 1), "{s:?}");
    assert_eq!((s.pgpromote_success, s.pgpromote_candidate), (hot.len() as u64, hot.len() as u64), "{s:?}");
    // A threshold of 0 ms: nothing is hot.
    b.sysctl_set("numa_balancing_hot_threshold_ms", "0").unwrap();
    b.scan_now();
    touch(&r, cold.iter().copied(), 0x42_0000);
    assert!(cold.iter().all(|&i| node_of(&r, i) == 1));
    drop((r, b));
    assert_eq!(z.check_invariants().unwrap(), 0);
}

/// The rate limit: 1 MiB/s is 256 pages a second; of 600 hot candidates in one second, 256
/// are promoted, and 256 more in the next second. (Checked to fail with the limit taken
/// out: all 600 move in the first second.)
#[test]
fn promotions_stop_at_the_rate_limit_for_the_rest_of_the_second() {
    let z = zonal();
    let clock = Arc::new(AtomicU64::new(0));
    let (b, r) = on_slow_tier(&z, &clock, 1, 700, 0x43_0000);
    let slow: Vec<usize> = (0..700).filter(|&i| node_of(&r, i) == 1).take(600).collect();
    assert_eq!(slow.len(), 600);
    b.scan_now();
    clock.store(10, Ordering::Relaxed);
    touch(&r, slow.iter().copied(), 0x43_0000);
    let s = b.stats();
    assert_eq!(s.pgpromote_candidate, 600, "{s:?}");
    assert_eq!(s.pgpromote_success, 256, "{s:?}");
    // The next second: the pages left are hidden again and 256 more go.
    clock.store(1500, Ordering::Relaxed);
    b.scan_now();
    clock.store(1510, Ordering::Relaxed);
    touch(&r, slow.iter().copied(), 0x43_0000);
    assert_eq!(b.stats().pgpromote_success, 512, "{:?}", b.stats());
    drop((r, b));
    assert_eq!(z.check_invariants().unwrap(), 0);
}

/// A region of 512 pages on node 0, then node 0 made short (the eater, returned, takes what
/// is left) and its pages aged by four scans, every fourth page (the hot ones, returned)
/// touched after each: the cold pages are demotion's candidates.
fn aged_on_a_short_node(
    z: &Zonal,
    b: &Balancer,
    clock: &AtomicU64,
    tag: u64,
) -> (Region, Vec<(*mut u8, u32)>, Vec<usize>) {
    let r = b.region(512 * PAGE, MemPolicy::Local).unwrap();
    fill(&r, 0..512, tag);
    assert_eq!(r.node_pages(), vec![512, 0]);
    let eater = eat(z, 0);
    let hot: Vec<usize> = (0..512).step_by(4).collect();
    for _ in 0..4 {
        clock.fetch_add(100, Ordering::Relaxed);
        assert!(b.scan_now() > 0, "node 0 is short: its pages are aged");
        touch(&r, hot.iter().copied(), tag);
    }
    (r, eater, hot)
}

/// Demotion: a top-tier node below its promo watermark has its pages aged by the scanner
/// (hidden, under tiering alone, only while it is short), and the pages still untouched
/// two passes later go to node 1, never one the program kept using. (Checked to fail with
/// the demotion pass made a no-op: nothing moves.)
#[test]
fn the_coldest_pages_of_a_short_top_tier_node_are_demoted() {
    let z = zonal();
    let clock = Arc::new(AtomicU64::new(0));
    let b = balancer(&z, &clock, true, 65536);
    let (r, eater, hot) = aged_on_a_short_node(&z, &b, &clock, 0x44_0000);
    let moved = b.demote_now(usize::MAX);
    let s = b.stats();
    let demoted = s.pgdemote_kswapd + s.pgdemote_direct;
    assert!(demoted > 0 && demoted as usize == moved && s.pgdemote_kswapd == 0, "only this pass demoted: {s:?}");
    assert_eq!(r.node_pages()[1] as u64, demoted, "{s:?}");
    assert_eq!(s.nodes[0].pgdemote_kswapd + s.nodes[0].pgdemote_direct, demoted);
    assert!(hot.iter().all(|&i| node_of(&r, i) == 0), "a page in use was demoted: {s:?}");
    assert_eq!(s.pgpromote_success, 0);
    touch(&r, 0..512, 0x44_0000);
    release(&z, eater);
    drop((r, b));
    assert_eq!(z.check_invariants().unwrap(), 0);
}

/// The balancer's thread demotes by itself (Linux's kswapd, `Config::kswapd`, on by
/// default): once the scanner has aged a short node's pages, its next pass moves the cold
/// ones down, counted as `pgdemote_kswapd`, and leaves the pages in use. The test waits for
/// the thread's pass (it runs on its own schedule), at most 20 s. (Checked to fail with the
/// thread's pass taken out: nothing moves.)
#[test]
fn the_balancers_thread_demotes_by_itself() {
    let z = zonal();
    let clock = Arc::new(AtomicU64::new(0));
    let b = Balancer::new(z.clone(), zonal_numab::Config { kswapd: true, ..config(&clock, true, 65536) }).unwrap();
    let (r, eater, hot) = aged_on_a_short_node(&z, &b, &clock, 0x46_0000);
    let start = std::time::Instant::now();
    while b.stats().pgdemote_kswapd == 0 {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "the thread never demoted: {:?}", b.stats());
        std::thread::yield_now();
    }
    let s = b.stats();
    assert_eq!(s.pgdemote_direct, 0, "{s:?}");
    assert!(r.node_pages()[1] > 0, "{s:?}");
    assert!(hot.iter().all(|&i| node_of(&r, i) == 0), "a page in use was demoted: {s:?}");
    touch(&r, 0..512, 0x46_0000);
    release(&z, eater);
    drop((r, b));
    assert_eq!(z.check_invariants().unwrap(), 0);
}

/// No thrashing: node 0 full of a hot set and cold pages, more hot pages on node 1.
/// Rounds of scan, accesses to every hot page, and demotion move the cold pages down and
/// the hot ones up, each hot page once; once converged, nothing moves. (Checked to fail
/// with the demotion taking any page of the node rather than the cold ones: hot pages go
/// down and come back up round after round.)
#[test]
fn promotion_and_demotion_settle_without_thrashing() {
    let z = zonal();
    let clock = Arc::new(AtomicU64::new(0));
    let b = balancer(&z, &clock, true, 65536);
    let fast = b.region(1024 * PAGE, MemPolicy::Local).unwrap();
    fill(&fast, 0..1024, 0x45_0000);
    let fast_hot: Vec<usize> = (0..1024).step_by(8).collect();
    let eater = eat(&z, 0);
    b.housekeep();
    let slow = b.region(128 * PAGE, MemPolicy::Local).unwrap();
    fill(&slow, 0..128, 0x45_1000);
    let slow_hot: Vec<usize> = (0..128).filter(|&i| node_of(&slow, i) == 1).collect();
    assert!(slow_hot.len() >= 64, "{}", slow_hot.len());
    let mut per_round = Vec::new();
    for _ in 0..24 {
        clock.fetch_add(100, Ordering::Relaxed);
        let before = b.stats().pgpromote_success;
        b.scan_now();
        clock.fetch_add(1, Ordering::Relaxed);
        touch(&fast, fast_hot.iter().copied(), 0x45_0000);
        touch(&slow, 0..128, 0x45_1000);
        b.demote_now(usize::MAX);
        // The frames a demotion frees wait on the CPUs' lists, where the buddy's count, which
        // the promotions' room test reads, does not see them; a program that reclaims for
        // room drains them (the thread's own passes, off here, kept demoting until it did).
        z.drain_all_pages();
        b.housekeep();
        per_round.push(b.stats().pgpromote_success - before);
    }
    let s = b.stats();
    let what = format!("promotions per round {per_round:?}: {s:?}");
    assert!(slow_hot.iter().all(|&i| node_of(&slow, i) == 0), "{what}");
    assert!(fast_hot.iter().all(|&i| node_of(&fast, i) == 0), "{what}");
    assert_eq!(s.pgpromote_success, slow_hot.len() as u64, "each hot page promoted once: {what}");
    assert!(per_round[16..].iter().all(|&p| p == 0), "{what}");
    assert!(s.pgdemote_kswapd + s.pgdemote_direct >= s.pgpromote_success, "{what}");
    touch(&fast, 0..1024, 0x45_0000);
    release(&z, eater);
    drop((fast, slow, b));
    assert_eq!(z.check_invariants().unwrap(), 0);
}

/// The tunables by name: each set and read back, bad values refused and the old kept.
#[test]
fn tiering_tunables_are_checked() {
    let z = zonal();
    let clock = Arc::new(AtomicU64::new(0));
    let b = balancer(&z, &clock, false, 65536);
    assert_eq!(b.sysctl_get("numa_balancing").unwrap(), "2");
    for (name, v) in [
        ("numa_balancing", "3"),
        ("numa_balancing_hot_threshold_ms", "250"),
        ("numa_balancing_promote_rate_limit_MBps", "128"),
        ("demotion_enabled", "1"),
    ] {
        b.sysctl_set(name, v).unwrap();
        assert_eq!(b.sysctl_get(name).unwrap(), v);
        let e = b.sysctl_set(name, "x9").unwrap_err().to_string();
        assert!(e.contains("kept the old value"), "{e}");
        assert_eq!(b.sysctl_get(name).unwrap(), v);
    }
    assert_eq!(b.numa_balancing(), 3);
    assert!(b.set_numa_balancing(4).is_err());
    assert_eq!(b.sysctl_all().len(), 4);
}
