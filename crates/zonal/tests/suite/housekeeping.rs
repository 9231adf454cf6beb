//! Housekeeping that does not grow with the machine (issue 10): an idle handle's worker and
//! the reports make no `membarrier` calls (`pcp_fence`), a drain of a remote cache that holds
//! frames does, and fake topologies with more CPUs than the machine stay correct.

use crate::common;

use common::on_cpu;

use std::time::{Duration, Instant};

use zonal::topology::Machine;
use zonal::{Config, Gfp, NodeId, Topology, VmEvent, Zonal, ZoneId, ZoneStatItem};

fn zonal_on(spec: &str, cpus: usize, interval: Duration) -> Zonal {
    let t = Topology::parse_for(spec, Machine { nr_cpus: cpus, mem_total: 1 << 34 }).unwrap();
    let mut c = Config::new(t);
    c.stat_interval = interval;
    Zonal::new(c).unwrap()
}

/// Allocations and frees on each CPU, so that every CPU's local lists and cache hold frames
/// (and have a non-zero cache bound): what made the old worker fence every interval.
fn leave_frames_on_lists(z: &Zonal) {
    for cpu in 0..2 {
        on_cpu(cpu, || {
            let held: Vec<_> = (0..300).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
            for p in held {
                z.free_pages(p.as_ptr(), 0).unwrap();
            }
        });
    }
    let on_lists: usize =
        (0..2).map(|n| z.zone_page_state_snapshot(ZoneId(n), ZoneStatItem::NrPcpPages).unwrap()).sum();
    assert!(on_lists > 0, "the frames sit on the per-CPU lists");
}

fn machine_has_two_cpus() -> bool {
    if zonal::cpu::nr_cpus_online() < 2 {
        eprintln!("one CPU: no remote lists to fence, nothing to test");
        return false;
    }
    true
}

/// At the default interval, with `high` fixed (so a decay has nothing to do once it has seen
/// the lists), a handle that does nothing for 3 s makes no membarrier call.
#[test]
fn an_idle_handle_makes_no_membarrier_calls_at_the_default_interval() {
    if !machine_has_two_cpus() {
        return;
    }
    let t = Topology::parse_for("nodes=2,size=8M,cpus=0:1", Machine { nr_cpus: 2, mem_total: 1 << 34 }).unwrap();
    let z = Zonal::new(Config::new(t)).unwrap();
    z.set_percpu_pagelist_high_fraction(8).unwrap();
    leave_frames_on_lists(&z);
    // One decay pass settles what the activity left (it may fence: it works on the caches).
    z.decay_pcp_high();
    let before = z.event(VmEvent::PcpFence);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(z.event(VmEvent::PcpFence) - before, 0, "an idle handle fenced");
}

/// At a 10 ms interval, with `high` auto-tuned: once the worker's decay has brought the lists
/// down to what they keep (real work, which may fence), fifty more intervals of nothing make
/// no membarrier call. The old worker fenced each CPU with frames in its cache every interval.
#[test]
fn an_idle_handle_makes_no_membarrier_calls_at_10ms() {
    if !machine_has_two_cpus() {
        return;
    }
    let z = zonal_on("nodes=2,size=8M,cpus=0:1", 2, Duration::from_millis(10));
    leave_frames_on_lists(&z);
    // Settle: wait (bounded) until 30 intervals pass without a fence.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let f = z.event(VmEvent::PcpFence);
        std::thread::sleep(Duration::from_millis(300));
        if z.event(VmEvent::PcpFence) == f {
            break;
        }
        assert!(Instant::now() < deadline, "the decay never settled");
    }
    assert!(
        (0..2).map(|n| z.zone_page_state_snapshot(ZoneId(n), ZoneStatItem::NrPcpPages).unwrap()).sum::<usize>() > 0,
        "frames still sit on the lists while the worker idles"
    );
    let before = z.event(VmEvent::PcpFence);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(z.event(VmEvent::PcpFence) - before, 0, "an idle handle fenced");
}

/// Reports from another CPU cost no fence for a CPU whose cache is empty (but has room, which
/// made the old lock fence), nor for one whose cache holds frames: they never touch a cache.
/// A drain of a cache that holds frames does fence, so the count is live.
#[test]
fn reports_cost_no_fence() {
    if !machine_has_two_cpus() {
        return;
    }
    let z = zonal_on("nodes=2,size=8M,cpus=0:1", 2, Duration::from_secs(3600));
    let reports = |z: &Zonal| {
        for zone in [ZoneId(0), ZoneId(1)] {
            assert!(z.pcp_info(0, zone).is_some());
            z.zone_page_state_snapshot(zone, ZoneStatItem::NrPcpPages).unwrap();
        }
        z.nr_pcp_pages(NodeId(0)).unwrap();
        assert!(!z.zoneinfo().is_empty() && !z.vmstat().is_empty() && !z.prometheus().is_empty());
        z.check_invariants().unwrap();
        z.refresh_vm_stats();
    };
    // CPU 0's cache empty with room: its lists drained from CPU 0 itself (no fence needed).
    let p = on_cpu(0, || {
        let held: Vec<_> = (0..100).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
        for p in &held[1..] {
            z.free_pages(p.as_ptr(), 0).unwrap();
        }
        z.drain_cpu_pages(0);
        held[0].as_ptr() as usize
    });
    assert_eq!(z.pcp_info(0, ZoneId(0)).unwrap().count, 0);
    let before = z.event(VmEvent::PcpFence);
    on_cpu(1, || reports(&z));
    assert_eq!(z.event(VmEvent::PcpFence), before, "a report fenced a CPU with an empty cache");

    // CPU 0's cache holds a frame: reports still leave it alone.
    on_cpu(0, || z.free_pages(p as *mut u8, 0).unwrap());
    assert!(z.pcp_info(0, ZoneId(0)).unwrap().count > 0);
    let before = z.event(VmEvent::PcpFence);
    on_cpu(1, || reports(&z));
    assert_eq!(z.event(VmEvent::PcpFence), before, "a report fenced");

    // A drain from CPU 1 works on CPU 0's cache: it must fence when the cache runs at all.
    on_cpu(1, || z.drain_cpu_pages(0));
    assert_eq!(z.pcp_info(0, ZoneId(0)).unwrap().count, 0, "the drain reached the cache");
    let fenced = z.event(VmEvent::PcpFence) - before;
    if zonal::cpu::rseq_fast_path() {
        assert!(fenced > 0, "a remote drain of a cache holding frames fences");
    } else {
        assert_eq!(fenced, 0, "without rseq there is nothing to fence");
    }
    assert_eq!(z.check_invariants(), Ok(0));
}

/// A fake topology with more CPUs than the machine (lists of CPUs no thread can run on):
/// allocation, free and drains from every machine CPU, with drains and reports of every
/// listed CPU, keep the invariants.
#[test]
fn more_cpus_than_the_machine_stays_correct() {
    let machine = zonal::cpu::nr_cpus_online();
    let cpus = machine + 6;
    let z = zonal_on("nodes=2,size=8M", cpus, Duration::from_millis(5));
    let rounds = 200;
    std::thread::scope(|s| {
        for cpu in 0..machine.min(4) as u32 {
            let z = &z;
            s.spawn(move || {
                zonal::cpu::set_affinity(cpu).unwrap();
                let mut held = Vec::new();
                for i in 0..rounds {
                    let order = (i % 2) as u32;
                    for _ in 0..16 {
                        held.push((z.alloc_pages(Gfp::KERNEL, order).unwrap(), order));
                    }
                    if i % 3 == 0 {
                        for (p, order) in held.drain(..) {
                            z.free_pages(p.as_ptr(), order).unwrap();
                        }
                    }
                    z.drain_cpu_pages((i + cpu as usize * 3) % cpus);
                    assert!(z.pcp_info(cpus - 1, ZoneId(0)).is_some());
                }
                for (p, order) in held {
                    z.free_pages(p.as_ptr(), order).unwrap();
                }
            });
        }
    });
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
    assert_eq!(z.nr_pcp_pages(NodeId(0)).unwrap() + z.nr_pcp_pages(NodeId(1)).unwrap(), 0);
}
