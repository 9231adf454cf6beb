//! Zone counters (per-CPU diffs folded past `stat_threshold`), event counters and the
//! reports built on them: Linux's thresholds, exact snapshots after quiescence, the periodic
//! fold, the pressure threshold, every counter moving, and every report parsed back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use zonal::report::{parse_name_values, parse_prometheus, parse_zoneinfo};
use zonal::topology::Machine;
use zonal::vmstat::{normal_threshold, percpu_drift_mark, pressure_threshold};
use zonal::zone::Watermark;
use zonal::{Config, Gfp, NodeId, Topology, VmEvent, Zonal, ZoneId, ZoneStatItem};

const MIB: usize = 1 << 20;

fn zonal_on(spec: &str, cpus: usize) -> Zonal {
    let t = Topology::parse_for(spec, Machine { nr_cpus: cpus, mem_total: 1 << 34 }).unwrap();
    // A worker that never wakes during a test: folds happen when the test asks.
    let mut c = Config::new(t);
    c.stat_interval = Duration::from_secs(3600);
    Zonal::new(c).unwrap()
}

/// The true counts of a zone, from the lists themselves: (free frames, frames on per-CPU
/// lists, free blocks per order).
fn truth(z: &Zonal, zone: ZoneId) -> (usize, usize, Vec<usize>) {
    let blocks = z.zone_stats()[zone.0 as usize].free_blocks.clone();
    let free = blocks.iter().enumerate().map(|(o, n)| n << o).sum();
    let lists: usize = (0..z.nr_cpus()).map(|c| z.pcp_info(c, zone).unwrap().count).sum();
    (free, lists + z.zone_stats()[zone.0 as usize].transfer, blocks)
}

fn snapshot(z: &Zonal, zone: ZoneId) -> (usize, usize, Vec<usize>) {
    let s = |i| z.zone_page_state_snapshot(zone, i).unwrap();
    let blocks =
        (0..=z.max_order().get()).map(|o| s(ZoneStatItem::NrFreeOrder(zonal::Order::new(o).unwrap()))).collect();
    (s(ZoneStatItem::NrFreePages), s(ZoneStatItem::NrPcpPages), blocks)
}

fn folded(z: &Zonal, zone: ZoneId) -> (usize, usize, Vec<usize>) {
    let s = |i| z.zone_page_state(zone, i).unwrap();
    let blocks =
        (0..=z.max_order().get()).map(|o| s(ZoneStatItem::NrFreeOrder(zonal::Order::new(o).unwrap()))).collect();
    (s(ZoneStatItem::NrFreePages), s(ZoneStatItem::NrPcpPages), blocks)
}

#[test]
fn thresholds_follow_linux() {
    // 2 * fls(cpus) * (1 + fls(managed / 128 MiB)), at most 125; mm/vmstat.c's samples:
    // 1 CPU and 0.9 GB -> 8; 2 CPUs and 8-16 GB -> 32; 2 CPUs under 128 MB -> 4; 64 CPUs and
    // 2 GB -> 84; 1024 CPUs -> 125.
    let pages = |mb: usize| (mb << 20) >> 12;
    assert_eq!(normal_threshold(1, pages(920)), 8);
    assert_eq!(normal_threshold(1, pages(1024)), 10);
    assert_eq!(normal_threshold(2, pages(8 << 10)), 32);
    assert_eq!(normal_threshold(2, pages(12 << 10)), 32);
    assert_eq!(normal_threshold(2, pages(64)), 4);
    assert_eq!(normal_threshold(64, pages(2 << 10)), 84);
    assert_eq!(normal_threshold(1024, pages(64 << 10)), 125);
    assert_eq!(pressure_threshold(4, 300, 100), 50);
    assert_eq!(pressure_threshold(64, 110, 100), 1);
    assert_eq!(pressure_threshold(1, 10_000, 0), 125);
    // The drift mark exists only when the drift could exceed low - min.
    assert_eq!(percpu_drift_mark(2, 4, 100, 150, 200), 0);
    assert_eq!(percpu_drift_mark(64, 14, 45, 56, 67), 67 + 64 * 14);

    // And the allocator applies them: 64 CPUs over two 4 MiB zones.
    let z = zonal_on("nodes=2,size=4M", 64);
    let zone = ZoneId(0);
    let zn = &z.zones()[0];
    let t = normal_threshold(64, zn.managed);
    assert_eq!(t, 14);
    assert_eq!(z.zone_stat_threshold(zone, 5).unwrap(), (t, false));
    let (min, low, high) = (zn.watermark(Watermark::Min), zn.watermark(Watermark::Low), zn.watermark(Watermark::High));
    assert_eq!(z.zone_percpu_drift_mark(zone).unwrap(), percpu_drift_mark(64, t, min, low, high));
    assert!(z.zone_percpu_drift_mark(zone).unwrap() > high);
    assert!(z.zone_stat_threshold(ZoneId(9), 0).is_err());
}

/// Folded counters lag by less than `nr_cpus * threshold`; snapshots are exact once
/// allocation stops; a refresh makes the folded counters exact too.
#[test]
fn snapshots_are_exact_after_quiescence_and_a_refresh_folds_everything() {
    let z = zonal_on("nodes=2,size=16M,cpus=0:1", 2);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let z = &z;
            s.spawn(move || {
                let mut held = Vec::new();
                let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                for i in 0..20_000u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x % 3 != 0 || held.is_empty() {
                        let order = (x >> 8) as u32 % 4;
                        if let Ok(p) = z.alloc_pages(Gfp::KERNEL, order) {
                            held.push((p.as_ptr(), order));
                        }
                    } else {
                        let (p, o) = held.swap_remove((x >> 16) as usize % held.len());
                        z.free_pages(p, o).unwrap();
                    }
                    if i % 4096 == 0 {
                        let mut list = Vec::new();
                        z.alloc_pages_bulk_list(Gfp::KERNEL, 100, &mut list);
                        let ptrs: Vec<*mut u8> = list.iter().map(|p| p.as_ptr()).collect();
                        z.free_pages_bulk(&ptrs).unwrap();
                    }
                }
                // Leave some allocated, on purpose.
                for (p, o) in held.drain(..held.len() / 2) {
                    z.free_pages(p, o).unwrap();
                }
                std::mem::forget(held);
            });
        }
    });
    let allocated = z.check_invariants().unwrap();
    let mut counted_allocated = 0;
    for zone in [ZoneId(0), ZoneId(1)] {
        let truth = truth(&z, zone);
        assert_eq!(snapshot(&z, zone), truth, "zone {}", zone.0);
        let f = folded(&z, zone);
        let drift = z.nr_cpus() * z.zone_stat_threshold(zone, 0).unwrap().0;
        assert!(f.0.abs_diff(truth.0) <= drift, "folded free {} vs {} beyond {drift}", f.0, truth.0);
        counted_allocated += z.zone_allocated_pages(zone).unwrap();
    }
    assert_eq!(counted_allocated, allocated);
    z.refresh_vm_stats();
    for zone in [ZoneId(0), ZoneId(1)] {
        assert_eq!(folded(&z, zone), truth(&z, zone), "after the refresh, zone {}", zone.0);
    }
    let global_free = z.global_page_state(ZoneStatItem::NrFreePages);
    assert_eq!(global_free, truth(&z, ZoneId(0)).0 + truth(&z, ZoneId(1)).0);
    assert_eq!(z.global_page_state_snapshot(ZoneStatItem::NrFreePages), global_free);
}

/// The worker folds every `stat_interval`: no refresh needed. One allocation's changes stay
/// in a CPU's diffs (each below the threshold), so the folded counts differ from the
/// snapshot until a fold; a handle whose worker runs every second folds them, and one whose
/// worker waits an hour, built at the same time, does not.
#[test]
fn the_worker_folds_on_its_own() {
    let build = |interval| {
        // 1 GiB on 2 CPUs: a threshold of 20, above any one counter's change below.
        let t = Topology::parse_for("nodes=1,size=1G", Machine { nr_cpus: 2, mem_total: 1 << 34 }).unwrap();
        let mut c = Config::new(t).pcp(false);
        c.stat_interval = interval;
        Zonal::new(c).unwrap()
    };
    let (interval, idle) = (Duration::from_secs(1), Duration::from_secs(3600));
    for attempt in 0.. {
        let built = Instant::now();
        let (working, sleeping) = (build(interval), build(idle));
        assert!(normal_threshold(2, working.zones()[0].managed) > 8);
        // One order-3 block splits a largest block: -8 free frames, -1 free block of the
        // largest order and +1 of each order from 3 below it, all within the threshold.
        let held: Vec<_> = [&working, &sleeping].map(|z| z.alloc_pages(Gfp::KERNEL, 3).unwrap()).into();
        let unfolded = [&working, &sleeping].map(|z| folded(z, ZoneId(0)) != snapshot(z, ZoneId(0)));
        if built.elapsed() >= interval {
            // Too slow to tell the worker's fold from the allocation's: try again.
            assert!(attempt < 5, "the machine never let a test step finish within {interval:?}");
            continue;
        }
        assert_eq!(unfolded, [true, true], "the allocation's changes were folded before any worker ran");
        // Wait for the worker, not for a time: the folded counts reach the snapshot once it ran.
        let deadline = Instant::now() + Duration::from_secs(30);
        while folded(&working, ZoneId(0)) != snapshot(&working, ZoneId(0)) {
            assert!(Instant::now() < deadline, "the worker never folded: {:?}", folded(&working, ZoneId(0)));
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(folded(&working, ZoneId(0)), truth(&working, ZoneId(0)));
        // The other handle lived as long, past the first handle's interval: its worker is
        // still waiting, and nothing else folds.
        assert!(built.elapsed() >= interval);
        assert_ne!(folded(&sleeping, ZoneId(0)), snapshot(&sleeping, ZoneId(0)), "folded with no worker run");
        for (z, p) in [&working, &sleeping].into_iter().zip(held) {
            z.free_pages(p.as_ptr(), 3).unwrap();
        }
        break;
    }
}

/// Below `low` the allocator applies the pressure threshold (where Linux's kswapd would
/// wake), and the worker's fold restores the normal one once the zone is above `high`.
#[test]
fn pressure_threshold_under_low_normal_above_high() {
    let z = zonal_on("nodes=1,size=4M", 2);
    let zn = &z.zones()[0];
    let (min, low) = (zn.watermark(Watermark::Min), zn.watermark(Watermark::Low));
    let normal = normal_threshold(2, zn.managed);
    assert_eq!(z.zone_stat_threshold(ZoneId(0), 0).unwrap(), (normal, false));
    let mut held = Vec::new();
    while let Ok(p) = z.alloc_pages(Gfp::KERNEL, 0) {
        held.push(p);
    }
    assert_eq!(z.zone_stat_threshold(ZoneId(0), 1).unwrap(), (pressure_threshold(2, low, min), true));
    // Stopped at min exactly: the checks near the marks read snapshots.
    assert_eq!(z.nr_free_pages(NodeId(0)).unwrap() + z.nr_pcp_pages(NodeId(0)).unwrap(), min);
    for p in held {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    z.drain_all_pages();
    z.refresh_vm_stats();
    assert_eq!(z.zone_stat_threshold(ZoneId(0), 0).unwrap(), (normal, false));
}

/// Every counter of `/proc/vmstat` moves in a workload made to move it.
#[test]
fn every_counter_moves() {
    let z = zonal_on("nodes=3,size=8M,cpus=0:1:", 2);
    // The zonelist caches' clock starts past one interval, so the first set-up zaps.
    z.set_zonelist_cache_clock(std::sync::Arc::new(std::sync::atomic::AtomicU64::new(5_000))).unwrap();
    z.set_numa_stats_mode("strict").unwrap();
    let before: BTreeMap<String, u64> = z.vmstat_items().into_iter().collect();
    // Gauges may come back to where they were: sample them mid-way too.
    let samples = std::sync::Mutex::new(Vec::new());
    let sample = || samples.lock().unwrap().push(z.vmstat_items().into_iter().collect::<BTreeMap<String, u64>>());
    // Local allocations and frees, refills and drains, on CPU 0.
    let pinned = |cpu: u32, f: &(dyn Fn() + Sync)| {
        std::thread::scope(|s| {
            s.spawn(|| {
                zonal::cpu::set_affinity(cpu).unwrap();
                f()
            });
        })
    };
    pinned(0, &|| {
        let ps: Vec<_> = (0..2000).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
        sample();
        for p in ps {
            z.free_pages(p.as_ptr(), 0).unwrap();
        }
        sample();
        let mut list = Vec::new();
        z.alloc_pages_bulk_list(Gfp::KERNEL, 64, &mut list);
        let ptrs: Vec<*mut u8> = list.iter().map(|p| p.as_ptr()).collect();
        z.free_pages_bulk(&ptrs).unwrap();
        // numa_miss / numa_foreign / numa_other: node 1's memory from CPU 0, preferring node 0
        // but bound to node 1; numa_interleave: interleaving.
        let p = z.alloc_pages_node(NodeId(1), Gfp::THISNODE, 0).unwrap();
        z.free_pages(p.as_ptr(), 0).unwrap();
        let bind = zonal::MemPolicy::Bind(zonal::NodeMask::from_nodes([NodeId(1)]));
        let p = z.alloc_pages_policy(Gfp::KERNEL, 0, &bind).unwrap();
        z.free_pages(p.as_ptr(), 0).unwrap();
        let il = zonal::MemPolicy::Interleave(zonal::NodeMask::from_nodes([NodeId(0), NodeId(1)]));
        for _ in 0..4 {
            let p = z.alloc_pages_policy(Gfp::KERNEL, 0, &il).unwrap();
            z.free_pages(p.as_ptr(), 0).unwrap();
        }
        // alloc_fail: more than a node has.
        assert!(z.alloc_pages_node(NodeId(0), Gfp::THISNODE, z.max_order().get() as u32).is_ok());
        let big: Vec<_> = std::iter::from_fn(|| z.alloc_pages_node(NodeId(0), Gfp::THISNODE, 5).ok()).collect();
        for p in big {
            z.free_pages(p.as_ptr(), 5).unwrap();
        }
        // The zonelist cache: with the first two zones of node 0's zonelist full, an
        // allocation from node 0 sets the cache up (a zap), marks them, and the next skips.
        let order: Vec<NodeId> =
            z.zonelists(NodeId(0)).unwrap().fallback.iter().map(|id| z.zones()[id.0 as usize].node).collect();
        let mut fill = Vec::new();
        for &n in &order[..2] {
            while let Ok(p) = z.alloc_pages_node(n, Gfp::THISNODE, 0) {
                fill.push(p);
            }
        }
        for _ in 0..3 {
            let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
            assert_eq!(z.page_to_nid(p.as_ptr()).unwrap(), order[2]);
            z.free_pages(p.as_ptr(), 0).unwrap();
        }
        for p in fill {
            z.free_pages(p.as_ptr(), 0).unwrap();
        }
    });
    // pcp_trylock_fail: another thread holds CPU 0's lists (reading them) while this one,
    // on CPU 0, allocates. Bounded by a deadline, not a sleep: it stops once seen.
    let deadline = Instant::now() + Duration::from_secs(60);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            zonal::cpu::set_affinity(0).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for zone in [ZoneId(0), ZoneId(1)] {
                    let _ = z.pcp_info(0, zone);
                }
            }
        });
        pinned(0, &|| {
            while z.event(VmEvent::PcpTrylockFail) == 0 && Instant::now() < deadline {
                let p = z.alloc_pages(Gfp::KERNEL, 1).unwrap();
                z.free_pages(p.as_ptr(), 1).unwrap();
            }
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    // pcp_fence: CPU 0's cache holds frames after a free there; draining CPU 0's lists from
    // CPU 1 must fence CPU 0 first. Without rseq there is no cache and nothing to fence.
    pinned(0, &|| {
        let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
        z.free_pages(p.as_ptr(), 0).unwrap();
    });
    pinned(1, &|| {
        z.drain_cpu_pages(0);
    });
    sample();
    let samples = samples.into_inner().unwrap();
    let rseq = zonal::cpu::rseq_fast_path();
    let still: Vec<&String> = before
        .iter()
        .filter(|(k, v)| samples.iter().all(|s| s.get(*k) == Some(v)))
        .map(|(k, _)| k)
        .filter(|k| rseq || k.as_str() != "pcp_fence")
        // One CPU a node here, so no frame crosses CPUs within a zone: the owner tests and
        // `pcp_routed_counts_the_frames_handed_back` count it.
        .filter(|k| k.as_str() != "pcp_routed")
        .collect();
    assert!(still.is_empty(), "counters that did not move: {still:?}");
    z.drain_all_pages();
    for zone in [ZoneId(0), ZoneId(1), ZoneId(2)] {
        assert_eq!(snapshot(&z, zone), truth(&z, zone));
    }
}

/// `pcp_routed` counts the order-0 frames a CPU frees of another CPU's runs once they reach
/// that CPU's inbox: none while each CPU frees its own frames; when CPU 1 frees what CPU 0
/// allocated, at least a batch and at most what the inbox holds (its bound is CPU 0's `high`
/// within 256 and 1024: the rest go to the transfer list or the buddy, and the outbox waits
/// for a whole batch); and a drain, which returns frames to the buddy, routes nothing. The
/// report names it.
#[test]
fn pcp_routed_counts_the_frames_handed_back() {
    let z = zonal_on("nodes=1,size=64M", 2);
    let on = |cpu: u32, f: &(dyn Fn() + Sync)| {
        std::thread::scope(|s| {
            s.spawn(|| {
                zonal::cpu::set_affinity(cpu).unwrap();
                f()
            });
        })
    };
    let alloc = || (0..500).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr() as usize).collect::<Vec<_>>();
    let free = |held: &[usize]| held.iter().for_each(|&a| z.free_pages(a as *mut u8, 0).unwrap());
    on(0, &|| free(&alloc()));
    on(1, &|| free(&alloc()));
    assert_eq!(z.event(VmEvent::PcpRouted), 0, "every frame freed on the CPU that owns its run");
    let held = std::sync::Mutex::new(Vec::new());
    on(0, &|| *held.lock().unwrap() = alloc());
    on(1, &|| free(&held.lock().unwrap()));
    let routed = z.event(VmEvent::PcpRouted);
    assert!((64..=500).contains(&routed), "{routed} of 500 frames routed to CPU 0");
    z.drain_all_pages();
    assert_eq!(z.event(VmEvent::PcpRouted), routed, "a drain routes nothing");
    let items: BTreeMap<String, u64> = z.vmstat_items().into_iter().collect();
    assert_eq!(items.get("pcp_routed"), Some(&routed));
}

/// zoneinfo, vmstat (text and JSON) and the Prometheus exposition parse back to the values
/// the API gives.
#[test]
fn reports_parse_back() {
    let z = zonal_on("nodes=2,size=8M,cpus=0:1", 2);
    z.set_numa_stats_mode("strict").unwrap();
    let held: Vec<_> = (0..300).map(|i| z.alloc_pages(Gfp::KERNEL, i % 3).unwrap()).collect();
    let items = z.vmstat_items();

    let vm = parse_name_values(&z.vmstat()).unwrap();
    assert_eq!(vm, items);
    assert_eq!(vm[0].0, "nr_free_pages");
    let pos = |n: &str| vm.iter().position(|(k, _)| k == n).unwrap();
    // /proc/vmstat's order: zone items, then NUMA items, then events.
    assert!(pos("nr_free_order_10") < pos("numa_hit") && pos("numa_other") < pos("pgalloc_normal"));
    let json: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&z.vmstat_json()).unwrap();
    for (k, v) in &items {
        assert_eq!(json[k].as_u64(), Some(*v), "{k}");
    }
    assert_eq!(z.vmstat_value("pgalloc_normal").unwrap(), z.event(VmEvent::PgallocNormal));
    assert!(z.vmstat_value("nr_bogus").unwrap_err().to_string().contains("counters: nr_free_pages"));

    let zones = parse_zoneinfo(&z.zoneinfo());
    assert_eq!(zones.len(), 2);
    for (i, pz) in zones.iter().enumerate() {
        let zone = ZoneId(i as u16);
        assert_eq!((pz.node, pz.zone.as_str()), (i as u16, "Normal"));
        let snap = |it| z.zone_page_state_snapshot(zone, it).unwrap() as u64;
        assert_eq!(pz.get("pages free"), Some(snap(ZoneStatItem::NrFreePages)));
        assert_eq!(pz.get("nr_free_pages"), Some(snap(ZoneStatItem::NrFreePages)));
        assert_eq!(pz.get("nr_zone_pcp_pages"), Some(snap(ZoneStatItem::NrPcpPages)));
        assert_eq!(pz.get("nr_zone_allocated"), Some(z.zone_allocated_pages(zone).unwrap() as u64));
        assert_eq!(
            pz.get("high"),
            Some(z.zones()[i].watermark(Watermark::High) as u64),
            "the watermark, not a pageset's"
        );
        assert_eq!(pz.get("numa_hit"), Some(z.numa_stat(zone, zonal::NumaStat::NumaHit)));
        let sets: Vec<(u64, u64, u64, u64, u64)> = (0..z.nr_cpus())
            .map(|c| {
                let p = z.pcp_info(c, zone).unwrap();
                (
                    c as u64,
                    p.count as u64,
                    p.high as u64,
                    p.batch as u64,
                    z.zone_stat_threshold(zone, c).unwrap().0 as u64,
                )
            })
            .collect();
        assert_eq!(pz.pagesets, sets);
        // Items come before the NUMA items, and the pagesets after both (seed 000, 6.x).
        let keys: Vec<&str> = pz.fields.iter().map(|(k, _)| k.as_str()).collect();
        let at = |k: &str| keys.iter().position(|x| *x == k).unwrap();
        assert!(at("nr_free_pages") < at("numa_hit") && at("numa_other") < at("node_unreclaimable"));
    }

    let prom = parse_prometheus(&z.prometheus()).expect("well-formed exposition");
    let sample = |s: &str| prom.iter().find(|(k, _)| k == s).map(|(_, v)| *v as u64);
    for (k, v) in &items {
        assert_eq!(sample(&format!("zonal_vmstat_{k}")), Some(*v), "{k}");
    }
    assert_eq!(
        sample("zonal_zoneinfo_nr_free_pages{node=\"1\",zone=\"Normal\"}"),
        Some(z.zone_page_state_snapshot(ZoneId(1), ZoneStatItem::NrFreePages).unwrap() as u64)
    );
    assert_eq!(
        sample("zonal_zoneinfo_numa_hit_total{node=\"0\",zone=\"Normal\"}"),
        Some(z.numa_stat(ZoneId(0), zonal::NumaStat::NumaHit))
    );
    assert_eq!(
        sample("zonal_zoneinfo_pageset_batch{node=\"0\",zone=\"Normal\",cpu=\"1\"}"),
        Some(z.pcp_info(1, ZoneId(0)).unwrap().batch as u64)
    );
    assert_eq!(
        sample("zonal_zoneinfo_transfer_pages{node=\"0\",zone=\"Normal\"}"),
        Some(z.zone_stats()[0].transfer as u64)
    );
    assert_eq!(
        sample("zonal_zoneinfo_managed_pages{node=\"0\",zone=\"Normal\"}"),
        Some((8 * MIB / zonal::PAGE_SIZE) as u64)
    );
    for (i, p) in held.into_iter().enumerate() {
        z.free_pages(p.as_ptr(), (i % 3) as u32).unwrap();
    }
}

/// Bad or extreme input to the counter and watermark APIs is an error or a plain answer,
/// never a panic.
#[test]
fn counter_apis_refuse_what_a_zone_does_not_have() {
    let z = zonal_on("nodes=2,size=4M", 2);
    let bad_order = ZoneStatItem::NrFreeOrder(zonal::Order::new(15).unwrap());
    assert!(z.zone_page_state(ZoneId(0), bad_order).unwrap_err().to_string().contains("invalid order 15"));
    assert!(z.zone_page_state_snapshot(ZoneId(0), bad_order).is_err());
    assert!(z
        .zone_page_state(ZoneId(7), ZoneStatItem::NrFreePages)
        .unwrap_err()
        .to_string()
        .contains("invalid zone 7"));
    assert_eq!(z.numa_stat(ZoneId(7), zonal::NumaStat::NumaHit), 0);
    assert!(!z.zones()[0].watermark_ok(zonal::Order::new(10).unwrap(), usize::MAX, false));
    // A bulk call asking for more than there is fills what it can.
    let mut list = Vec::new();
    let n = z.alloc_pages_bulk_list(Gfp::KERNEL, usize::MAX, &mut list);
    assert!(n > 0 && n == list.len() && n < 2 * 1024);
    let ptrs: Vec<*mut u8> = list.iter().map(|p| p.as_ptr()).collect();
    assert_eq!(z.free_pages_bulk(&ptrs), Ok(n));
}
