//! NUMA counters (seed 000) with Linux's `zone_statistics` semantics, and numa_stats_mode
//! (seed 001): every counter moves in a scenario made for it; auto counts nothing before the
//! first read; coarse zeroes; strict counts; an invalid value changes nothing.

use crate::common;

use common::on_cpu;
use zonal::topology::Machine;
use zonal::vmstat::NumaStat::{self, *};
use zonal::{Config, Gfp, MemPolicy, NodeId, NodeMask, Topology, Zonal};

fn zonal() -> Zonal {
    // CPU 0 on node 0, CPU 1 on node 1; node 2 memory-only. Buddy only, so counts are exact.
    let m = Machine { nr_cpus: 2, mem_total: 1 << 30 };
    let t = Topology::parse_for("nodes=3,size=4M,cpus=0:1:", m).unwrap();
    let z = Zonal::new(Config::new(t).pcp(false)).unwrap();
    z.set_numa_stats_mode("strict").unwrap();
    z
}

fn stat(z: &Zonal, node: u16, s: NumaStat) -> u64 {
    z.numa_stat(z.node_zones(NodeId(node)).unwrap()[0], s)
}

#[test]
fn local_allocation_is_a_local_hit() {
    let z = zonal();
    on_cpu(0, || z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr() as usize);
    assert_eq!((stat(&z, 0, NumaHit), stat(&z, 0, NumaLocal)), (1, 1));
    assert_eq!(stat(&z, 0, NumaMiss) + stat(&z, 0, NumaOther) + stat(&z, 0, NumaForeign), 0);
}

#[test]
fn fallback_is_a_miss_here_and_foreign_on_the_preferred_zone() {
    let z = zonal();
    on_cpu(0, || while z.alloc_pages_node(NodeId(0), Gfp::THISNODE | Gfp::NO_WATERMARKS, 0).is_ok() {});
    let hits = stat(&z, 0, NumaHit);
    let p = on_cpu(0, || z.alloc_pages_node(NodeId(0), Gfp::KERNEL, 0).unwrap().as_ptr() as usize);
    let landed = z.page_to_nid(p as *const u8).unwrap().0;
    assert_ne!(landed, 0);
    assert_eq!(stat(&z, landed, NumaMiss), 1);
    assert_eq!(stat(&z, 0, NumaForeign), 1);
    assert_eq!(stat(&z, 0, NumaHit), hits, "no hit for the fallback");
    assert_eq!(stat(&z, landed, NumaOther), 1, "cpu 0 is on node 0, the frame is not");
}

#[test]
fn a_cpu_of_another_node_counts_other() {
    let z = zonal();
    on_cpu(1, || z.alloc_pages_node(NodeId(0), Gfp::KERNEL, 0).unwrap().as_ptr() as usize);
    assert_eq!(stat(&z, 0, NumaHit), 1, "node 0 was preferred and used");
    assert_eq!(stat(&z, 0, NumaOther), 1, "but the CPU is on node 1");
    assert_eq!(stat(&z, 0, NumaLocal), 0);
}

#[test]
fn interleave_hits() {
    let z = zonal();
    z.set_thread_policy(MemPolicy::Interleave(NodeMask::parse("0-2").unwrap())).unwrap();
    for _ in 0..6 {
        z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    }
    for n in 0..3 {
        assert_eq!(stat(&z, n, NumaInterleaveHit), 2, "node {n}");
        assert_eq!(stat(&z, n, NumaHit), 2, "node {n}");
    }
}

#[test]
fn bulk_counts_its_batch_once() {
    let m = Machine { nr_cpus: 2, mem_total: 1 << 30 };
    let z = Zonal::new(Config::new(Topology::parse_for("nodes=2,size=8M,cpus=0:1", m).unwrap())).unwrap();
    z.set_numa_stats_mode("strict").unwrap();
    let n = on_cpu(0, || {
        let mut list = Vec::new();
        z.alloc_pages_bulk_list(Gfp::KERNEL, 32, &mut list)
    });
    assert_eq!(n, 32);
    let zone0 = z.node_zones(NodeId(0)).unwrap()[0];
    assert_eq!(z.numa_stat(zone0, NumaHit), 32);
    assert_eq!(z.numa_stat(zone0, NumaLocal), 32);
}

#[test]
fn auto_counts_nothing_until_the_first_read() {
    let m = Machine { nr_cpus: 2, mem_total: 1 << 30 };
    let z = Zonal::new(Config::new(Topology::parse_for("nodes=1,size=4M", m).unwrap()).pcp(false)).unwrap();
    assert_eq!(z.numa_stats_mode().name(), "auto");
    assert!(!z.numa_stats_counting());
    z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    // The first read sees nothing and turns counting on.
    assert_eq!(stat(&z, 0, NumaHit), 0);
    assert!(z.numa_stats_counting());
    z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    assert_eq!(stat(&z, 0, NumaHit), 1);
    assert!(z.log().iter().any(|l| l.contains("auto mode")), "{:?}", z.log());
}

#[test]
fn any_report_is_a_read() {
    let m = Machine { nr_cpus: 2, mem_total: 1 << 30 };
    for report in ["zoneinfo", "numastat", "json"] {
        let z = Zonal::new(Config::new(Topology::parse_for("nodes=1,size=4M", m).unwrap())).unwrap();
        let _ = match report {
            "zoneinfo" => z.zoneinfo(),
            "numastat" => z.numastat(),
            _ => z.zone_stats_json(),
        };
        assert!(z.numa_stats_counting(), "{report}");
    }
    // buddyinfo does not read the NUMA counters.
    let z = Zonal::new(Config::new(Topology::parse_for("nodes=1,size=4M", m).unwrap())).unwrap();
    let _ = z.buddyinfo();
    assert!(!z.numa_stats_counting());
}

#[test]
fn coarse_zeroes_and_stops_strict_counts_auto_keeps_state() {
    let z = zonal();
    z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    assert!(stat(&z, 0, NumaHit) + stat(&z, 1, NumaHit) > 0);
    z.set_numa_stats_mode("coarse").unwrap();
    assert_eq!(NumaStat::ALL.iter().map(|&s| stat(&z, 0, s) + stat(&z, 1, s)).sum::<u64>(), 0);
    z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    assert_eq!(stat(&z, 0, NumaHit) + stat(&z, 1, NumaHit), 0, "coarse does not count, reads or not");
    // auto keeps the current (off) state until the next read, which turns it on.
    z.set_numa_stats_mode("Auto").unwrap();
    assert!(!z.numa_stats_counting());
    z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    assert_eq!(stat(&z, 0, NumaHit) + stat(&z, 1, NumaHit), 0);
    z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    assert_eq!(stat(&z, 0, NumaHit) + stat(&z, 1, NumaHit), 1);
    z.set_numa_stats_mode("Strict\n").unwrap();
    assert!(z.numa_stats_counting());
    let log = z.log();
    assert!(log.iter().any(|l| l == "numa stats changes from strict mode to coarse mode"), "{log:?}");
    assert!(log.iter().any(|l| l == "numa stats changes from auto mode to strict mode"), "{log:?}");
}

#[test]
fn invalid_modes_change_nothing() {
    let z = zonal();
    for bad in ["", "lazy", "autox", "STRICTLY", "1"] {
        let e = z.set_numa_stats_mode(bad).unwrap_err().to_string();
        assert!(e.contains("valid: auto, strict, coarse"), "{e}");
        assert_eq!(z.numa_stats_mode().name(), "strict");
        assert!(z.numa_stats_counting());
    }
    assert!(z.log().iter().any(|l| l.starts_with("Ignoring invalid numa_stats_mode value")));
}

#[test]
fn reports_parse_back() {
    let z = zonal();
    on_cpu(0, || z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr() as usize);
    let node0 = z.numastat_node(NodeId(0)).unwrap();
    let lines: Vec<&str> = node0.lines().collect();
    assert_eq!(lines[0], "numa_hit 1");
    assert_eq!(
        lines.iter().map(|l| l.split(' ').next().unwrap()).collect::<Vec<_>>(),
        ["numa_hit", "numa_miss", "numa_foreign", "interleave_hit", "local_node", "other_node"]
    );
    let table = z.numastat();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["node0", "node1", "node2"]);
    let hit: Vec<u64> = table.lines().nth(1).unwrap().split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
    assert_eq!(hit, vec![1, 0, 0]);
    // zoneinfo: the NUMA items come after the zone items (seed 000).
    let zi = z.zoneinfo();
    let first = zi.split("Node 1").next().unwrap();
    let free_at = first.find("nr_free_pages").unwrap();
    let hit_at = first.find("numa_hit").unwrap();
    assert!(free_at < hit_at);
    let zones = zonal::report::parse_zoneinfo(&zi);
    assert_eq!(zones[0].get("numa_hit"), Some(1));
}

#[test]
fn seed_000_threshold_strategy_counts_exactly_and_switches_both_ways() {
    let z = zonal();
    on_cpu(0, || {
        for _ in 0..3 {
            z.alloc_pages(Gfp::KERNEL, 0).unwrap();
        }
    });
    z.sysctl_set("numa_stat_strategy", "threshold").unwrap();
    z.sysctl_set("numa_stat_threshold", "4").unwrap();
    assert_eq!(z.sysctl_get("numa_stat_strategy").unwrap(), "threshold");
    on_cpu(0, || {
        for _ in 0..10 {
            z.alloc_pages(Gfp::KERNEL, 0).unwrap();
        }
    });
    // Folded (twice past 4) and unfolded parts together: exact.
    assert_eq!(stat(&z, 0, NumaHit), 13);
    assert_eq!(stat(&z, 0, NumaLocal), 13);
    // A bulk batch larger than the threshold folds at once.
    on_cpu(0, || {
        let mut arr = [None; 9];
        z.alloc_pages_bulk_array(Gfp::KERNEL, &mut arr)
    });
    assert_eq!(stat(&z, 0, NumaHit), 22);
    z.sysctl_set("numa_stat_strategy", "percpu").unwrap();
    on_cpu(0, || z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr() as usize);
    assert_eq!(stat(&z, 0, NumaHit), 23);
    // Coarse zeroes every form.
    z.sysctl_set("numa_stats_mode", "coarse").unwrap();
    assert_eq!(stat(&z, 0, NumaHit) + stat(&z, 0, NumaLocal), 0);
    assert!(z.sysctl_set("numa_stat_threshold", "65534").is_err());
    assert_eq!(z.numa_stat_threshold(), 4);
}

/// With the per-CPU lists on, order-0 allocations take the fast path, whose local hits the
/// per-CPU strategy counts as its `pgalloc` count. Every strategy, and every switch between
/// them and between modes, must still count each allocation once.
#[test]
fn fast_path_counts_once_in_every_strategy_and_across_switches() {
    let m = Machine { nr_cpus: 2, mem_total: 1 << 30 };
    let z = Zonal::new(Config::new(Topology::parse_for("nodes=2,size=8M,cpus=0:1", m).unwrap())).unwrap();
    let alloc = |n: usize| {
        on_cpu(0, || {
            for _ in 0..n {
                let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
                z.free_pages(p.as_ptr(), 0).unwrap();
            }
        })
    };
    // auto: nothing counted before the first read.
    alloc(5);
    assert_eq!(stat(&z, 0, NumaHit), 0);
    let mut want = 0;
    for (strategy, n) in [("percpu", 7), ("shared", 11), ("threshold", 13), ("percpu", 17), ("shared", 3)] {
        z.sysctl_set("numa_stat_strategy", strategy).unwrap();
        alloc(n);
        want += n as u64;
        assert_eq!(stat(&z, 0, NumaHit), want, "after {strategy}");
        assert_eq!(stat(&z, 0, NumaLocal), want, "after {strategy}");
        assert_eq!(stat(&z, 0, NumaMiss) + stat(&z, 0, NumaOther) + stat(&z, 1, NumaHit), 0);
    }
    // Every allocation is a pgalloc event, counted or not.
    assert_eq!(z.event(zonal::VmEvent::PgallocNormal), want + 5);
    z.sysctl_set("numa_stat_strategy", "percpu").unwrap();
    z.set_numa_stats_mode("coarse").unwrap();
    alloc(4);
    assert_eq!(stat(&z, 0, NumaHit) + stat(&z, 0, NumaLocal), 0, "coarse zeroes and stops");
    z.set_numa_stats_mode("strict").unwrap();
    alloc(6);
    assert_eq!((stat(&z, 0, NumaHit), stat(&z, 0, NumaLocal)), (6, 6), "strict counts from zero");
}

/// `bulk_accounting=per_page` (the seeds' "before") counts what `batch` counts.
#[test]
fn per_page_bulk_accounting_counts_what_batched_does() {
    let m = Machine { nr_cpus: 2, mem_total: 1 << 30 };
    let mut seen = Vec::new();
    for mode in ["batch", "per_page"] {
        for strategy in ["percpu", "threshold", "shared"] {
            let z = Zonal::new(Config::new(Topology::parse_for("nodes=2,size=8M,cpus=0:1", m).unwrap())).unwrap();
            z.set_numa_stats_mode("strict").unwrap();
            z.sysctl_set("bulk_accounting", mode).unwrap();
            z.sysctl_set("numa_stat_strategy", strategy).unwrap();
            on_cpu(0, || {
                // Past the rseq cache too: 300 frames take the locked lists as well.
                let mut list = Vec::new();
                assert_eq!(z.alloc_pages_bulk_list(Gfp::KERNEL, 300, &mut list), 300);
                let ptrs: Vec<*mut u8> = list.iter().map(|p| p.as_ptr()).collect();
                z.free_pages_bulk(&ptrs).unwrap();
            });
            let counts: Vec<u64> = NumaStat::ALL.iter().map(|&s| stat(&z, 0, s)).collect();
            assert_eq!(counts[0], 300, "{mode} {strategy}: {counts:?}");
            seen.push((counts, z.event(zonal::VmEvent::PgallocNormal), z.event(zonal::VmEvent::Pgfree)));
        }
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
}

/// Bulk calls of a few frames (which take the single fast path frame by frame under the
/// per-CPU strategy) count as the bulk path does, under every strategy: one `alloc_bulk` a
/// call, a `pgalloc` and a local hit a frame, a `pgfree` a frame freed in one call; also
/// when the cache runs dry in the middle of a call and the rest takes the locked path.
#[test]
fn a_few_frames_a_bulk_call_count_as_the_bulk_path_does() {
    let m = Machine { nr_cpus: 2, mem_total: 1 << 30 };
    for strategy in ["percpu", "threshold", "shared"] {
        let z = Zonal::new(Config::new(Topology::parse_for("nodes=2,size=8M,cpus=0:1", m).unwrap())).unwrap();
        z.set_numa_stats_mode("strict").unwrap();
        z.sysctl_set("numa_stat_strategy", strategy).unwrap();
        let (calls, frees) = (z.event(zonal::VmEvent::AllocBulk), z.event(zonal::VmEvent::Pgfree));
        let mut want = 0u64;
        let mut nr_calls = 0u64;
        on_cpu(0, || {
            // 1..=8 frames a call, held: 600 frames pass the cache's 256, so some calls find
            // it empty part way.
            let mut held: Vec<Vec<Option<std::ptr::NonNull<u8>>>> = Vec::new();
            for i in 0..132 {
                let mut slots = vec![None; 1 + i % 8];
                assert_eq!(z.alloc_pages_bulk_array(Gfp::KERNEL, &mut slots), slots.len(), "{strategy} call {i}");
                want += slots.len() as u64;
                nr_calls += 1;
                assert_eq!(z.event(zonal::VmEvent::AllocBulk), calls + nr_calls, "{strategy} call {i}");
                held.push(slots);
            }
            let mut all: Vec<usize> = held.iter().flatten().map(|p| p.unwrap().as_ptr() as usize).collect();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len() as u64, want, "{strategy}: no frame handed out twice");
            assert_eq!(z.check_invariants(), Ok(want as usize));
            for slots in &held {
                assert_eq!(z.free_pages_bulk(slots), Ok(slots.len()), "{strategy}");
            }
        });
        assert_eq!(z.event(zonal::VmEvent::PgallocNormal), want, "{strategy}");
        assert_eq!(z.event(zonal::VmEvent::Pgfree) - frees, want, "{strategy}");
        assert_eq!((stat(&z, 0, NumaHit), stat(&z, 0, NumaLocal)), (want, want), "{strategy}");
        assert_eq!(z.check_invariants(), Ok(0), "{strategy}");
    }
}
