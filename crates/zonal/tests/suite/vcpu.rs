//! Virtual CPUs (issue 38 §4): a topology that declares more CPUs than the machine has
//! (`vcpus=`), and threads acting as any CPU of it (`Zonal::act_as_cpu`). Their lists take
//! frames and give them back as a running CPU's do; drains, reports and the invariant walk
//! cover every one of them; frees across CPUs go back to the runs' owners; and no holder of a
//! virtual CPU's lists ever fences it (no thread runs there).

use std::time::Duration;

use zonal::topology::Machine;
use zonal::{Config, CpuId, Error, Gfp, NodeId, Topology, VmEvent, Zonal, ZoneId, ZoneStatItem};

/// A handle on `spec`, parsed against this machine's CPUs and plenty of memory, with the
/// worker's decay out of the way (a decay moves frames between the places these tests count).
fn zonal_on(spec: &str) -> Zonal {
    let machine = Machine { nr_cpus: zonal::cpu::nr_cpus_online(), mem_total: 1 << 34 };
    let mut c = Config::new(Topology::parse_for(spec, machine).unwrap());
    c.stat_interval = Duration::from_secs(3600);
    Zonal::new(c).unwrap()
}

/// Frames on every CPU's lists of `zone` (`pcp_info`, which counts the caches, the outboxes
/// and the inbox too).
fn on_lists(z: &Zonal, zone: ZoneId) -> Vec<usize> {
    (0..z.nr_cpus()).map(|c| z.pcp_info(c, zone).unwrap().count).collect()
}

#[test]
fn an_id_the_topology_does_not_have_is_refused() {
    let z = zonal_on("nodes=2,size=8M,vcpus=64");
    assert_eq!(z.nr_cpus(), 64);
    assert!(z.act_as_cpu(63).is_ok());
    for cpu in [64, 8192, usize::MAX] {
        let e = z.act_as_cpu(cpu).unwrap_err();
        assert!(matches!(e, Error::InvalidCpu { nr_cpus: 64, .. }), "{e:?}");
        assert_eq!(e.errno(), libc::ENODEV);
        assert!(e.to_string().contains("the topology has cpus 0 to 63"), "{e}");
    }
    assert_eq!(z.act_as_cpu(64).unwrap_err(), Error::InvalidCpu { cpu: CpuId(64), nr_cpus: 64 });
    // Without virtual CPUs, the machine's are all there is.
    let real = zonal_on("nodes=1,size=8M");
    assert!(real.act_as_cpu(real.nr_cpus()).is_err());
}

/// Acting as CPU 40 (of node 1, virtual): allocations refill CPU 40's lists of its node's
/// zone and nobody else's, frees go back onto them, the counters count on it, no section
/// runs (`fast_path_allocs`) and no holder fences it. Bad frees get the same errors as
/// through the handle, and change nothing.
#[test]
fn allocations_land_on_the_acting_cpus_lists() {
    let z = zonal_on("nodes=2,size=16M,vcpus=64");
    assert!(z.topology().is_virtual(CpuId(40)) && z.topology().cpu_to_node(CpuId(40)) == NodeId(1));
    let (fast, fences) = (z.fast_path_allocs(), z.event(VmEvent::PcpFence));
    let a = z.act_as_cpu(40).unwrap();
    assert_eq!(a.cpu(), CpuId(40));
    let held: Vec<_> = (0..10).map(|_| a.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
    assert!(held.iter().all(|p| z.page_to_nid(p.as_ptr()) == Ok(NodeId(1))), "the acting CPU's node is local");
    let lists = on_lists(&z, ZoneId(1));
    assert!(lists[40] > 0, "the refill's frames wait on CPU 40's lists");
    assert!(lists.iter().enumerate().all(|(c, &n)| c == 40 || n == 0), "{lists:?}");
    assert!(on_lists(&z, ZoneId(0)).iter().all(|&n| n == 0));
    for p in &held {
        a.free_pages(p.as_ptr(), 0).unwrap();
    }
    assert_eq!(z.pcp_info(40, ZoneId(1)).unwrap().count, lists[40] + held.len(), "the frees join CPU 40's lists");
    // Orders 1 to 3 and the pageblock order keep lists too; a larger order takes the buddy.
    for order in [1, 3, 9] {
        a.drain();
        let p = a.alloc_pages(Gfp::KERNEL, order).unwrap();
        a.free_pages(p.as_ptr(), order).unwrap();
        assert!(z.pcp_info(40, ZoneId(1)).unwrap().count >= 1 << order, "order {order}");
    }
    let p = a.alloc_pages(Gfp::KERNEL, 10).unwrap();
    a.free_pages(p.as_ptr(), 10).unwrap();
    // Another node's zone, on the acting CPU's lists of that zone.
    let p = a.alloc_pages_node(NodeId(0), Gfp::THISNODE, 0).unwrap();
    assert_eq!(z.page_to_nid(p.as_ptr()), Ok(NodeId(0)));
    assert!(z.pcp_info(40, ZoneId(0)).unwrap().count > 0);
    // The errors of the handle's free, and nothing changes.
    let before = z.pcp_info(40, ZoneId(0)).unwrap().count;
    assert!(matches!(a.free_pages(p.as_ptr(), 1), Err(Error::OrderMismatch { .. } | Error::Misaligned { .. })));
    assert!(matches!(a.free_pages(p.as_ptr().wrapping_add(1), 0), Err(Error::Misaligned { .. })));
    assert!(matches!(a.free_pages(std::ptr::null_mut(), 0), Err(Error::NotOwned { .. })));
    assert!(matches!(a.alloc_pages(Gfp::KERNEL, 16), Err(Error::InvalidOrder { .. })));
    assert!(matches!(a.alloc_pages_node(NodeId(2), Gfp::KERNEL, 0), Err(Error::InvalidNode { .. })));
    assert_eq!(z.pcp_info(40, ZoneId(0)).unwrap().count, before);
    a.free_pages(p.as_ptr(), 0).unwrap();
    assert!(matches!(a.free_pages(p.as_ptr(), 0), Err(Error::DoubleFree { .. })));
    assert_eq!(z.fast_path_allocs(), fast, "acting never takes a restartable sequence");
    assert_eq!(z.event(VmEvent::PcpFence), fences, "no holder fences a virtual CPU");
    let held = on_lists(&z, ZoneId(0))[40] + on_lists(&z, ZoneId(1))[40];
    assert_eq!(a.drain(), held);
    assert_eq!(z.check_invariants(), Ok(0));
    // A real CPU may be acted as too, from whatever CPU the thread runs on.
    let r = z.act_as_cpu(0).unwrap();
    let p = r.alloc_pages(Gfp::KERNEL, 0).unwrap();
    r.free_pages(p.as_ptr(), 0).unwrap();
    assert!(z.pcp_info(0, ZoneId(0)).unwrap().count > 0);
    assert_eq!(z.check_invariants(), Ok(0));
}

/// 256 CPUs on four nodes, every one of them holding frames of its own node and of the next
/// one on its lists, and frames allocated on one CPU freed on another: at every step each
/// frame is free or allocated exactly once (`check_invariants`), `drain_all_pages` empties
/// every CPU's lists and outboxes, and every frame is free once the last ones are freed.
#[test]
fn every_frame_is_free_or_allocated_once_across_many_virtual_cpus() {
    let z = zonal_on("nodes=4,size=32M,vcpus=256");
    let nodes: usize = 4;
    let managed: Vec<usize> = z.zones().iter().map(|zn| zn.managed).collect();
    let mut kept: Vec<(usize, usize)> = Vec::new();
    for cpu in 0..z.nr_cpus() {
        let a = z.act_as_cpu(cpu).unwrap();
        let home = z.topology().cpu_to_node(CpuId(cpu as u32));
        let next = NodeId(((home.0 as usize + 1) % nodes) as u16);
        let mut got: Vec<_> = (0..6).map(|_| a.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
        got.push(a.alloc_pages_node(next, Gfp::empty(), 0).unwrap());
        got.push(a.alloc_pages(Gfp::KERNEL, 2).unwrap());
        // Half freed here (they stay on this CPU's lists), the order-2 block kept.
        let block = got.pop().unwrap();
        kept.push((block.as_ptr() as usize, 2));
        for p in got.drain(..4) {
            a.free_pages(p.as_ptr(), 0).unwrap();
        }
        kept.extend(got.iter().map(|p| (p.as_ptr() as usize, 0)));
    }
    let allocated: usize = kept.iter().map(|&(_, o)| 1 << o).sum();
    assert_eq!(z.check_invariants(), Ok(allocated));
    let holding = (0..nodes).map(|n| on_lists(&z, ZoneId(n as u16))).collect::<Vec<_>>();
    let cpus_holding = (0..z.nr_cpus()).filter(|&c| holding.iter().any(|l| l[c] > 0)).count();
    assert_eq!(cpus_holding, 256, "every CPU holds frames on its lists");
    // Every other kept frame freed by another CPU of the same node: routed to its owner.
    let (cross, keep): (Vec<_>, Vec<_>) = kept.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    for (i, &(addr, order)) in cross {
        let by = (i * 7 + 3) % z.nr_cpus();
        z.act_as_cpu(by).unwrap().free_pages(addr as *mut u8, order as u32).unwrap();
    }
    let kept: Vec<(usize, usize)> = keep.into_iter().map(|(_, &k)| k).collect();
    let allocated: usize = kept.iter().map(|&(_, o)| 1 << o).sum();
    assert_eq!(z.check_invariants(), Ok(allocated));
    let drained = z.drain_all_pages();
    assert!(drained > 0);
    for n in 0..nodes {
        let zone = ZoneId(n as u16);
        assert!(on_lists(&z, zone).iter().all(|&c| c == 0), "node {n}: a CPU's lists kept frames");
        assert_eq!(z.zone_page_state_snapshot(zone, ZoneStatItem::NrPcpPages), Ok(0));
    }
    assert_eq!(z.check_invariants(), Ok(allocated));
    let free: usize = (0..nodes).map(|n| z.nr_free_pages(NodeId(n as u16)).unwrap()).sum();
    assert_eq!(free + allocated, managed.iter().sum::<usize>(), "every frame free or allocated, once");
    for (addr, order) in kept {
        z.act_as_cpu(255).unwrap().free_pages(addr as *mut u8, order as u32).unwrap();
    }
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
    for (n, &m) in managed.iter().enumerate() {
        assert_eq!(z.nr_free_pages(NodeId(n as u16)), Ok(m), "node {n}");
    }
    // The reports cover every CPU: a pageset per CPU and zone.
    assert_eq!(z.zoneinfo().matches("\n    cpu: ").count(), 256 * nodes, "{}", &z.zoneinfo()[..2000]);
}

/// Run ownership between virtual CPUs: frames CPU 10 allocated and CPU 11 (same node) frees
/// do not stay on CPU 11's lists: they go through its outbox, a batch at a time, to CPU 10's
/// inbox, which CPU 10's next refill takes first.
#[test]
fn frees_on_another_virtual_cpu_go_back_to_the_owner() {
    let z = zonal_on("nodes=1,size=64M,vcpus=16");
    let zone = ZoneId(0);
    let (a, b) = (z.act_as_cpu(10).unwrap(), z.act_as_cpu(11).unwrap());
    let held: Vec<_> = (0..200).map(|_| a.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
    let a_before = z.pcp_info(10, zone).unwrap().count;
    for p in &held {
        b.free_pages(p.as_ptr(), 0).unwrap();
    }
    let (a_after, b_after) = (z.pcp_info(10, zone).unwrap().count, z.pcp_info(11, zone).unwrap().count);
    // 64 frames a delivery: three delivered, the rest waiting in CPU 11's outbox.
    assert_eq!(b_after, 200 % 64, "CPU 11 keeps only its outbox");
    assert_eq!(a_after, a_before + 192, "CPU 10's inbox holds the deliveries");
    // CPU 10's next refill takes its inbox: its lists give the frames out again.
    let freed: std::collections::BTreeSet<usize> = held.iter().map(|p| p.as_ptr() as usize).collect();
    let again: Vec<_> = (0..a_after).map(|_| a.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
    let back = again.iter().filter(|p| freed.contains(&(p.as_ptr() as usize))).count();
    assert!(back >= 192, "{back} of the delivered frames came back to CPU 10");
    assert_eq!(z.check_invariants(), Ok(again.len()));
    for p in again {
        a.free_pages(p.as_ptr(), 0).unwrap();
    }
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
    assert_eq!(z.nr_free_pages(NodeId(0)), Ok(z.zones()[0].managed));
}

/// The worker's pass, one sweep zone by zone (`vmstat_update`), does what a decay pass and
/// a fold do one after the other: two handles given the same traffic by virtual CPUs of
/// every node hold the same lists after it, each decay drained as many frames, and every
/// zone's folded counters equal their exact snapshots.
#[test]
fn one_sweep_decays_and_folds_as_the_two_passes_do() {
    let spec = "nodes=4,size=16M,vcpus=64";
    // Every third CPU allocates 300 frames of its node and frees 250 of them, so its lists
    // hold frames, its `high` has grown and its counter diffs are not zero.
    let traffic = |z: &Zonal| -> Vec<(usize, usize)> {
        let mut held = Vec::new();
        for cpu in (0..64).step_by(3) {
            let a = z.act_as_cpu(cpu).unwrap();
            let got: Vec<_> = (0..300).map(|_| a.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
            for p in &got[50..] {
                a.free_pages(p.as_ptr(), 0).unwrap();
            }
            held.extend(got[..50].iter().map(|p| (cpu, p.as_ptr() as usize)));
        }
        held
    };
    let lists = |z: &Zonal| -> Vec<(usize, usize)> {
        (0..4)
            .flat_map(|n| (0..64).map(move |c| (c, ZoneId(n))))
            .map(|(c, zone)| z.pcp_info(c, zone).map(|i| (i.count, i.high)).unwrap())
            .collect()
    };
    let (two, one) = (zonal_on(spec), zonal_on(spec));
    let (held_two, held_one) = (traffic(&two), traffic(&one));
    assert_eq!(lists(&two), lists(&one), "the same traffic leaves the same lists");
    // Pass after pass, `high` comes down by the count the lists kept through the last
    // interval (a fifth of `high` at most), until it is below the count and a decay drains.
    let mut drained = 0;
    for pass in 0..30 {
        let drained_two = two.decay_pcp_high();
        two.refresh_vm_stats();
        let drained_one = one.vmstat_update();
        assert_eq!(drained_one, drained_two, "pass {pass}");
        assert_eq!(lists(&one), lists(&two), "pass {pass}");
        drained += drained_one;
    }
    assert!(drained > 0, "the decays drained frames");
    for n in 0..4 {
        for item in [ZoneStatItem::NrFreePages, ZoneStatItem::NrPcpPages] {
            let folded = one.zone_page_state(ZoneId(n), item).unwrap();
            assert_eq!(folded, one.zone_page_state_snapshot(ZoneId(n), item).unwrap(), "zone {n} {item:?}");
            assert_eq!(folded, two.zone_page_state(ZoneId(n), item).unwrap(), "zone {n} {item:?}");
        }
    }
    for (z, held) in [(&one, held_one), (&two, held_two)] {
        for (cpu, p) in held {
            z.act_as_cpu(cpu).unwrap().free_pages(p as *mut u8, 0).unwrap();
        }
        assert_eq!(z.check_invariants().unwrap(), 0);
    }
}
