//! The zonelist cache (seed 003) through the allocator: lazy set-up, marking, skipping, the
//! zap after the interval on an injected clock, no false out-of-memory from a stale cache,
//! a failed large allocation that does not send small ones away, concurrent marking, and the
//! tunables.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zonal::topology::Machine;
use zonal::{Config, Gfp, NodeId, Topology, VmEvent, Zonal};

/// `nodes` nodes of `size`, every CPU on node 0 (so every thread's local node is 0), the
/// caches on a clock the test moves, starting one interval in.
fn zonal(nodes: usize, size: &str) -> (Zonal, Arc<AtomicU64>) {
    let cpus = format!("0-1{}", ":".repeat(nodes - 1));
    let t = Topology::parse_for(
        &format!("nodes={nodes},size={size},cpus={cpus}"),
        Machine { nr_cpus: 2, mem_total: 1 << 34 },
    )
    .unwrap();
    let mut c = Config::new(t);
    c.stat_interval = Duration::from_secs(3600);
    let z = Zonal::new(c).unwrap();
    let clock = Arc::new(AtomicU64::new(10_000));
    z.set_zonelist_cache_clock(Arc::clone(&clock)).unwrap();
    (z, clock)
}

/// Node 0's fallback zonelist, as nodes.
fn order(z: &Zonal) -> Vec<NodeId> {
    z.zonelists(NodeId(0)).unwrap().fallback.iter().map(|id| z.zones()[id.0 as usize].node).collect()
}

/// Takes every order-0 frame a node gives under `THISNODE` (down to its min watermark).
fn fill(z: &Zonal, n: NodeId) -> Vec<*mut u8> {
    std::iter::from_fn(|| z.alloc_pages_node(n, Gfp::THISNODE, 0).ok()).map(|p| p.as_ptr()).collect()
}

fn free_all(z: &Zonal, ps: Vec<*mut u8>, order: u32) {
    for p in ps {
        z.free_pages(p, order).unwrap();
    }
}

fn alloc_node(z: &Zonal, gfp: Gfp, order: u32) -> (NodeId, *mut u8) {
    let p = z.alloc_pages(gfp, order).unwrap().as_ptr();
    (z.page_to_nid(p).unwrap(), p)
}

#[test]
fn lazy_setup_nothing_happens_while_the_first_zone_has_room() {
    let (z, _) = zonal(4, "4M");
    for _ in 0..100 {
        let (n, p) = alloc_node(&z, Gfp::KERNEL, 1);
        assert_eq!(n, NodeId(0));
        z.free_pages(p, 1).unwrap();
    }
    for e in [VmEvent::ZlcFullMarks, VmEvent::ZlcZaps, VmEvent::ZlcSkipped] {
        assert_eq!(z.event(e), 0, "{}", e.name());
    }
    assert!(z.zonelist_cache_full_nodes(NodeId(0)).unwrap().is_empty());
}

#[test]
fn full_zones_are_marked_then_skipped() {
    let (z, _) = zonal(6, "4M");
    let order = order(&z);
    let held: Vec<_> = order[..4].iter().flat_map(|&n| fill(&z, n)).collect();
    let (n, p) = alloc_node(&z, Gfp::KERNEL, 0);
    assert_eq!(n, order[4]);
    assert_eq!(z.event(VmEvent::ZlcZaps), 1, "the first set-up after the interval zaps");
    assert_eq!(z.zonelist_cache_full_nodes(NodeId(0)).unwrap(), order[..4].to_vec());
    assert_eq!(z.event(VmEvent::ZlcSkipped), 0);
    // The next walk checks the first zone (before the set-up), then skips the three others.
    let (n2, p2) = alloc_node(&z, Gfp::KERNEL, 0);
    assert_eq!(n2, order[4]);
    assert_eq!(z.event(VmEvent::ZlcSkipped), 3);
    free_all(&z, vec![p, p2], 0);
    free_all(&z, held, 0);
    // Off: walks neither skip nor mark.
    z.sysctl_set("zonelist_cache", "0").unwrap();
    let marks = z.event(VmEvent::ZlcFullMarks);
    let held: Vec<_> = order[..4].iter().flat_map(|&n| fill(&z, n)).collect();
    let (n, p) = alloc_node(&z, Gfp::KERNEL, 0);
    assert_eq!(n, order[4]);
    assert_eq!(z.event(VmEvent::ZlcFullMarks), marks);
    z.free_pages(p, 0).unwrap();
    free_all(&z, held, 0);
}

/// Seed 003's hog in its steady state: allocations past full zones, from the cache those
/// frames were freed to (the step `Zonal::alloc_past_full` takes in one, with rseq). Every
/// frame comes from the first zone with room, and the counts are the walk's: three zones
/// skipped an allocation (the first zone is tested, not skipped), one `pgalloc`, no new
/// mark, and a miss there, foreign on node 0 and other-node there, never a hit.
#[test]
fn the_hogs_steady_state_counts_as_the_walk_does() {
    use zonal::vmstat::NumaStat;
    let (z, _) = zonal(6, "4M");
    z.set_numa_stats_mode("strict").unwrap();
    let order = order(&z);
    let held: Vec<_> = order[..4].iter().flat_map(|&n| fill(&z, n)).collect();
    // The first allocation sets the cache up and marks the four full zones.
    let (n, p) = alloc_node(&z, Gfp::KERNEL, 0);
    assert_eq!(n, order[4]);
    z.free_pages(p, 0).unwrap();
    let zone = |n: NodeId| z.node_zones(n).unwrap()[0];
    let (there, home) = (zone(order[4]), zone(NodeId(0)));
    let counts = || {
        (
            [VmEvent::ZlcSkipped, VmEvent::PgallocNormal, VmEvent::ZlcFullMarks].map(|e| z.event(e)),
            [
                z.numa_stat(there, NumaStat::NumaMiss),
                z.numa_stat(there, NumaStat::NumaOther),
                z.numa_stat(home, NumaStat::NumaForeign),
                z.numa_stat(there, NumaStat::NumaHit) + z.numa_stat(home, NumaStat::NumaHit),
            ],
        )
    };
    let before = counts();
    let (rounds, per) = (4, 64u64);
    for _ in 0..rounds {
        let ps: Vec<_> = (0..per).map(|_| alloc_node(&z, Gfp::KERNEL, 0)).collect();
        for (n, p) in ps {
            assert_eq!(n, order[4]);
            z.free_pages(p, 0).unwrap();
        }
    }
    let allocs = rounds * per;
    let after = counts();
    let events: Vec<u64> = (0..3).map(|k| after.0[k] - before.0[k]).collect();
    assert_eq!(events, [3 * allocs, allocs, 0], "skipped, pgalloc, full marks");
    let numa: Vec<u64> = (0..4).map(|k| after.1[k] - before.1[k]).collect();
    assert_eq!(numa, [allocs, allocs, allocs, 0], "miss, other-node, foreign, hits");
    free_all(&z, held, 0);
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn the_zap_comes_after_the_interval() {
    let (z, clock) = zonal(4, "4M");
    z.sysctl_set("zonelist_cache_interval_ms", "250").unwrap();
    let order = order(&z);
    let held: Vec<_> = order[..2].iter().flat_map(|&n| fill(&z, n)).collect();
    let (_, p) = alloc_node(&z, Gfp::KERNEL, 0);
    z.free_pages(p, 0).unwrap();
    assert_eq!(z.event(VmEvent::ZlcZaps), 1);
    // Node order[1] gets room back; inside the interval the cache still skips it.
    let room: Vec<_> = held.iter().copied().filter(|&p| z.page_to_nid(p).unwrap() == order[1]).take(512).collect();
    let mut held: Vec<_> = held.into_iter().filter(|p| !room.contains(p)).collect();
    free_all(&z, room, 0);
    clock.fetch_add(249, Ordering::Relaxed);
    let (n, p) = alloc_node(&z, Gfp::KERNEL, 0);
    assert_eq!(n, order[2], "a zone stays marked for the interval");
    assert_eq!(z.event(VmEvent::ZlcZaps), 1);
    z.free_pages(p, 0).unwrap();
    // One interval after the zap: zapped at the next set-up, and node order[1] is tried.
    clock.fetch_add(1, Ordering::Relaxed);
    let (n, p) = alloc_node(&z, Gfp::KERNEL, 0);
    assert_eq!(n, order[1]);
    assert_eq!(z.event(VmEvent::ZlcZaps), 2);
    held.push(p);
    free_all(&z, held, 0);
    assert!(z.sysctl_set("zonelist_cache_interval_ms", "0").is_err());
    assert_eq!(z.zonelist_cache_interval_ms(), 250);
}

#[test]
fn a_stale_cache_never_fails_an_allocation() {
    let (z, _) = zonal(4, "4M");
    let order = order(&z);
    let mut held: Vec<_> = order.iter().flat_map(|&n| fill(&z, n)).collect();
    // Everything is at min: a plain allocation fails, marking every zone.
    assert!(z.alloc_pages(Gfp::KERNEL, 0).is_err());
    assert_eq!(z.zonelist_cache_full_nodes(NodeId(0)).unwrap().len(), 4);
    // Room comes back on the last node; the cache still has it full, the second walk finds it.
    let back: Vec<_> = held.iter().copied().filter(|&p| z.page_to_nid(p).unwrap() == order[3]).take(64).collect();
    held.retain(|p| !back.contains(p));
    free_all(&z, back, 0);
    let skipped = z.event(VmEvent::ZlcSkipped);
    let (n, p) = alloc_node(&z, Gfp::KERNEL, 0);
    assert_eq!(n, order[3]);
    assert!(z.event(VmEvent::ZlcSkipped) > skipped, "the first walk skipped");
    held.push(p);
    free_all(&z, held, 0);
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
}

/// Linux deleted its cache partly because a failed THP allocation marked a zone full for
/// order-0 allocations. Here a zone without a large block still serves small ones.
#[test]
fn a_failed_large_allocation_does_not_send_small_ones_away() {
    let (z, _) = zonal(4, "8M");
    let order = order(&z);
    // The first zone full; the second half free but without a block larger than one frame.
    let first = fill(&z, order[0]);
    let all = fill(&z, order[1]);
    let (keep, back): (Vec<_>, Vec<_>) = all.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    free_all(&z, back.into_iter().map(|(_, p)| p).collect(), 0);
    z.drain_all_pages();
    // A THP-sized block (order 9) comes from the third zone and marks the first two.
    let (n, big) = alloc_node(&z, Gfp::KERNEL, 9);
    assert_eq!(n, order[2]);
    assert_eq!(z.zonelist_cache_full_nodes(NodeId(0)).unwrap(), order[..2].to_vec());
    // Order 0 still comes from the second zone: its mark is for order 9 and up. (The seed's
    // cache skipped it and sent these to the third node.)
    let skipped = z.event(VmEvent::ZlcSkipped);
    for _ in 0..50 {
        let (n, p) = alloc_node(&z, Gfp::KERNEL, 0);
        assert_eq!(n, order[1], "an order-0 allocation skipped a zone that fits it");
        z.free_pages(p, 0).unwrap();
    }
    assert_eq!(z.event(VmEvent::ZlcSkipped), skipped);
    // A second large allocation skips it.
    let (n2, big2) = alloc_node(&z, Gfp::KERNEL, 9);
    assert_eq!(n2, order[2]);
    assert_eq!(z.event(VmEvent::ZlcSkipped), skipped + 1);
    z.free_pages(big, 9).unwrap();
    z.free_pages(big2, 9).unwrap();
    free_all(&z, keep.into_iter().map(|(_, p)| p).collect(), 0);
    free_all(&z, first, 0);
}

/// Threads marking and skipping at once: the cache stays a hint, every frame is handed out
/// once, and everything comes back.
#[test]
fn concurrent_walks_mark_and_skip_without_losing_a_frame() {
    let (z, clock) = zonal(8, "4M");
    z.sysctl_set("zonelist_cache_interval_ms", "1").unwrap();
    let order = order(&z);
    let held: Vec<_> = order[..6].iter().flat_map(|&n| fill(&z, n)).collect();
    let got: Vec<Vec<usize>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let (z, clock) = (&z, &clock);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..400 {
                        if i % 50 == 0 && t == 0 {
                            clock.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Ok(p) = z.alloc_pages(Gfp::KERNEL, (i % 3) as u32) {
                            mine.push((p.as_ptr() as usize, (i % 3) as u32));
                        }
                        // The threads hold more than the two free nodes have, so a thread
                        // that starts late may find nothing at all: it has nothing to free.
                        if i % 4 == 3 && !mine.is_empty() {
                            let (p, o) = mine.swap_remove(0);
                            z.free_pages(p as *mut u8, o).unwrap();
                        }
                    }
                    mine.into_iter().map(|(p, o)| p | o as usize).collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<usize> = got.iter().flatten().map(|a| a & !3).collect();
    all.sort_unstable();
    let n = all.len();
    all.dedup();
    assert_eq!(all.len(), n, "a frame was handed out twice");
    assert!(z.event(VmEvent::ZlcSkipped) > 0 && z.event(VmEvent::ZlcZaps) > 1);
    for a in got.into_iter().flatten() {
        z.free_pages((a & !3) as *mut u8, (a & 3) as u32).unwrap();
    }
    free_all(&z, held, 0);
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
}
