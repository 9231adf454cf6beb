//! Run ownership across CPUs (issue 38): a frame freed on a CPU that does not own its run
//! goes back toward its owner (the freeing CPU's outbox, then the owner's inbox, which its
//! next refill takes first), so that after any traffic each CPU's fast path writes only
//! state lines no other CPU of its zone writes; accounting, double-free detection and
//! `drain_all_pages` stay exact throughout.
//!
//! Each test pins its threads to CPUs 0 and 1 of a one-node handle (both CPUs share its one
//! zone) and reads the lists' state directly; on a machine with one CPU it says so and
//! checks nothing.

use super::*;

/// A handle on `spec` (one node, which both CPUs share, but for one test), with the
/// worker's decay out of the way (a decay
/// moves frames between the places these tests look at), or `None` (with a word on stderr)
/// where the machine has fewer than two CPUs to pin to.
fn shared_zone(spec: &str) -> Option<Zonal> {
    if sys::nr_cpus_online() < 2 || sys::set_affinity(1).is_err() {
        eprintln!("SKIPPED: two CPUs are needed to free on one what the other allocated");
        return None;
    }
    let _ = sys::allow_all_cpus();
    let mut config = Config::new(Topology::parse(spec).unwrap());
    config.stat_interval = Duration::from_secs(3600);
    let z = Zonal::new(config).unwrap();
    assert!(z.nr_cpus() >= 2, "{spec}: two CPUs");
    Some(z)
}

/// Runs `f` on a thread pinned to `cpu`.
fn on<R: Send>(cpu: u32, f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| {
        s.spawn(|| {
            sys::set_affinity(cpu).unwrap();
            f()
        })
        .join()
        .unwrap()
    })
}

/// The frames CPU `cpu` holds for its pairs: its order-0 cache and order-0 list.
fn held_by(z: &Zonal, cpu: usize) -> Vec<usize> {
    let zone = &z.mem.zones[0];
    let pcp = z.pcp(cpu, zone.id);
    let mut frames = pcp.lock_lists(zone).with(|p| p.order0_list().to_vec());
    frames.extend(pcp.cached_frames());
    frames
}

/// At most the first 16 of `v`, for a message.
fn first(v: &[usize]) -> &[usize] {
    &v[..v.len().min(16)]
}

/// The runs (of `mem_map::RUN_ORDER` frames: two whole state lines) of `frames`.
fn runs_of(frames: &[usize]) -> std::collections::BTreeSet<usize> {
    frames.iter().map(|&p| p >> mem_map::RUN_ORDER.0).collect()
}

/// Order-0 frames CPU 0 allocates and CPU 1 frees stay off CPU 1's cache and list: they wait
/// in its outbox (rseq, or locked without rseq) and its owner's inbox, past which the
/// transfer list and the buddy take them, and CPU 0's next refill takes its inbox before the
/// buddy. Every frame is accounted for throughout (`check_invariants`), a second free of one
/// on its way back is refused, and `drain_all_pages` returns every one to the buddy.
#[test]
fn a_frame_freed_on_another_cpu_goes_back_to_its_owner() {
    let Some(z) = shared_zone("nodes=1,size=256M") else { return };
    let zone = &z.mem.zones[0];
    let node = NodeId(0);
    let held: Vec<usize> =
        on(0, || (0..2000).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr() as usize).collect());
    let pfns: Vec<usize> = held.iter().map(|&a| z.addr_to_pfn(a as *const u8).unwrap().0).collect();
    assert!(pfns.iter().all(|&p| zone.run_owner(Pfn(p)) == 0), "CPU 0's refills own the runs they took");
    // CPU 1 has lists of its own too.
    on(1, || {
        let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
        z.free_pages(p.as_ptr(), 0).unwrap();
    });
    let cpu1 = held_by(&z, 1);
    assert!(!cpu1.is_empty() && runs_of(&cpu1).is_disjoint(&runs_of(&pfns)));

    let frees = z.event(VmEvent::Pgfree);
    assert_eq!(z.event(VmEvent::PcpRouted), 0, "no frame crossed yet");
    on(1, || {
        for &a in &held {
            z.free_pages(a as *mut u8, 0).unwrap();
        }
    });
    assert_eq!(z.event(VmEvent::Pgfree), frees + 2000, "every free counted once, outbox pushes too");
    let freed: std::collections::BTreeSet<usize> = pfns.iter().copied().collect();
    let stayed: Vec<usize> = held_by(&z, 1).into_iter().filter(|p| freed.contains(p)).collect();
    assert!(
        stayed.is_empty(),
        "{} frames of CPU 0's runs stayed on CPU 1's lists: {:x?}",
        stayed.len(),
        first(&stayed)
    );
    assert_eq!(held_by(&z, 1), cpu1, "CPU 1's lists are as they were");
    let (p0, p1) = (z.pcp(0, zone.id), z.pcp(1, zone.id));
    let outbox = p1.outbox_frames().len() + p1.lock_lists(zone).with(|p| p.outbox.len());
    let inbox = p0.inbox().len_hint();
    assert!(outbox < 2 * pcp::OUTBOX_CAP, "{outbox} frames in CPU 1's outboxes");
    assert_eq!(inbox, p0.inbox_cap(), "the deliveries filled CPU 0's inbox");
    assert_eq!(z.event(VmEvent::PcpRouted), inbox as u64, "pcp_routed counts what the inbox took in");
    assert_eq!(z.check_invariants(), Ok(0), "every frame accounted for, once");
    assert_eq!(z.nr_free_pages(node).unwrap() + z.nr_pcp_pages(node).unwrap(), zone.managed);

    // A frame on its way back is free: a second free of it is refused, and changes nothing.
    let back = p0.inbox().lock().frames().next().expect("a frame on its way back");
    let again = z.pfn_to_ptr(Pfn(back)).as_ptr() as usize;
    for cpu in [0, 1] {
        assert_eq!(on(cpu, || z.free_pages(again as *mut u8, 0)), Err(Error::DoubleFree { pfn: Pfn(back) }));
    }
    assert_eq!(p0.inbox().len_hint(), inbox);
    assert_eq!(z.event(VmEvent::Pgfree), frees + 2000, "the refused frees count nothing");
    assert_eq!(z.event(VmEvent::PcpRouted), inbox as u64, "nor route anything");
    assert_eq!(z.check_invariants(), Ok(0));

    // CPU 0's refill takes its inbox first: the buddy gives nothing meanwhile.
    on(0, || {
        let free = z.nr_free_pages(node).unwrap();
        let mut again = Vec::new();
        while p0.inbox().len_hint() == inbox {
            again.push(z.alloc_pages(Gfp::KERNEL, 0).unwrap());
            assert!(again.len() < 10_000, "the inbox is never taken");
        }
        assert_eq!(z.nr_free_pages(node).unwrap(), free, "the refill took the inbox, not the buddy");
        for p in again {
            z.free_pages(p.as_ptr(), 0).unwrap();
        }
    });
    assert_eq!(z.check_invariants(), Ok(0));
    assert!(z.drain_all_pages() > 0);
    assert_eq!((p0.inbox().len_hint(), p1.outbox_frames().len()), (0, 0), "drained");
    assert_eq!((z.nr_free_pages(node).unwrap(), z.nr_pcp_pages(node).unwrap()), (zone.managed, 0));
    assert_eq!(z.check_invariants(), Ok(0));
}

/// A batch of frees of another CPU's frames moves the freeing CPU's outbox to the owner and
/// leaves that CPU's own caches where they are: its cache of order-0 frames holds the same
/// frames in the same order (a flush and refill there left it 32 frames, so its own
/// allocations soon took the locked path), and no fence was needed.
#[test]
fn foreign_frees_leave_the_freeing_cpus_cache_in_place() {
    let Some(z) = shared_zone("nodes=1,size=256M") else { return };
    let zone = &z.mem.zones[0];
    let held: Vec<usize> =
        on(0, || (0..1000).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr() as usize).collect());
    let p1 = z.pcp(1, zone.id);
    let (cached, fences) = on(1, || {
        let mine: Vec<_> = (0..100).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
        for p in mine {
            z.free_pages(p.as_ptr(), 0).unwrap();
        }
        let cached = p1.cached_frames();
        for &a in &held {
            z.free_pages(a as *mut u8, 0).unwrap();
        }
        (cached, p1.fences())
    });
    if pcp::rseq::enabled() {
        assert!(cached.len() >= 100, "CPU 1's cache holds its 100 frames: {}", cached.len());
    }
    assert_eq!(p1.cached_frames(), cached, "CPU 1's cache is as it was");
    assert_eq!(fences, 0, "the frees fenced nothing");
    let p0 = z.pcp(0, zone.id);
    assert_eq!(p0.inbox().len_hint(), p0.inbox_cap(), "the deliveries filled CPU 0's inbox");
    assert_eq!(z.check_invariants(), Ok(0), "every frame accounted for, once");
    assert!(z.drain_all_pages() > 0);
    assert_eq!(z.nr_free_pages(NodeId(0)).unwrap(), zone.managed);
    assert_eq!(z.check_invariants(), Ok(0));
}

/// The experiment as an assertion: pairs on both CPUs of one zone, then a phase
/// where CPU 0 allocates and CPU 1 frees (`bench cross`), then pairs on both again. After
/// it, the frames each CPU's lists hold are of runs it owns, no run has frames on both
/// CPUs' lists, and the frame each CPU's pairs write (the top of its cache) shares no state
/// line, nor the line beside it, with anything the other CPU holds: neither CPU's fast path
/// writes a line the other writes.
#[test]
fn after_cross_frees_each_cpu_writes_its_own_state_lines() {
    let Some(z) = shared_zone("nodes=1,size=256M") else { return };
    let zone = &z.mem.zones[0];
    let pairs = |n: usize| {
        for _ in 0..n {
            let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
            z.free_pages(std::hint::black_box(p.as_ptr()), 0).unwrap();
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| on(0, || pairs(10_000)));
        s.spawn(|| on(1, || pairs(10_000)));
    });
    // Cross: CPU 0 allocates, CPU 1 frees, through a bounded channel.
    let (tx, rx) = std::sync::mpsc::sync_channel::<usize>(256);
    let z = &z;
    std::thread::scope(|s| {
        s.spawn(move || {
            on(1, move || {
                for a in rx {
                    z.free_pages(a as *mut u8, 0).unwrap();
                }
            })
        });
        s.spawn(move || {
            on(0, move || {
                for _ in 0..50_000 {
                    tx.send(z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr() as usize).unwrap();
                }
            })
        });
    });
    std::thread::scope(|s| {
        s.spawn(|| on(0, || pairs(10_000)));
        s.spawn(|| on(1, || pairs(10_000)));
    });
    let held = [held_by(z, 0), held_by(z, 1)];
    for (cpu, frames) in held.iter().enumerate() {
        assert!(!frames.is_empty(), "CPU {cpu} holds frames for its pairs");
        let foreign: Vec<usize> = frames.iter().copied().filter(|&p| zone.run_owner(Pfn(p)) != cpu as u16).collect();
        assert!(
            foreign.is_empty(),
            "CPU {cpu} holds {} frames of runs it does not own: {:x?}",
            foreign.len(),
            first(&foreign)
        );
    }
    let (a, b) = (runs_of(&held[0]), runs_of(&held[1]));
    let both: Vec<usize> = a.intersection(&b).copied().collect();
    assert!(both.is_empty(), "{} runs on both CPUs' lists: {:x?}", both.len(), first(&both));
    for (cpu, other) in [(0, 1), (1, 0)] {
        // The cache's top, or without rseq the list's: `held_by` puts the cache last.
        let top = *held[cpu].last().unwrap();
        assert!(!runs_of(&held[other]).contains(&(top >> mem_map::RUN_ORDER.0)), "CPU {cpu}'s pairs share a line");
    }
    assert_eq!(z.check_invariants(), Ok(0));
}

/// Only the lists of a zone on their CPU's node route frees (`PcpInner::routes`): CPU 1 of
/// another node frees frames of node 0's zone onto its own lists of that zone, which drain
/// past `high` to the zone's transfer list as before, and nothing goes to CPU 0's inbox
/// (routing there, as the fast free's section never does on that branch, sent every free
/// of a full cache to the locked path: `bench cross` ran 9 times slower).
#[test]
fn another_nodes_frees_are_not_routed() {
    let Some(z) = shared_zone("nodes=2,size=64M,cpus=0:1") else { return };
    let zone = &z.mem.zones[0];
    assert_eq!(z.topology().cpu_to_node(CpuId(1)), NodeId(1));
    let held: Vec<usize> =
        on(0, || (0..4000).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr() as usize).collect());
    assert!(held.iter().all(|&a| z.page_to_nid(a as *const u8) == Ok(NodeId(0))));
    on(1, || {
        for &a in &held {
            z.free_pages(a as *mut u8, 0).unwrap();
        }
    });
    let (p0, p1) = (z.pcp(0, zone.id), z.pcp(1, zone.id));
    assert_eq!(p0.inbox().len_hint(), 0, "nothing was routed to CPU 0");
    assert_eq!(p1.outbox_frames().len() + p1.lock_lists(zone).with(|p| p.outbox.len()), 0);
    assert!(zone.transfer().len_hint() > 0, "CPU 1's lists drained past high to the transfer list");
    assert_eq!(z.check_invariants(), Ok(0));
}

/// A run that a zone's edge cuts is nobody's: with zones of 64 KiB (16 frames) side by
/// side, one run of 128 frames holds both zones' frames. Were CPU 1's refill of zone 1 to name it the run's
/// owner, its fast free of a zone-0 frame would take the run for its own and push the frame
/// onto its zone-1 lists (the section trusts an owner to be the local zone's). The frame
/// goes to CPU 1's lists of zone 0 instead, and every frame is where its zone says.
#[test]
fn a_run_two_zones_share_is_nobodys() {
    if shared_zone("nodes=1,size=1M").is_none() {
        return;
    }
    // Blocks of 8 frames (`MAX_ORDER` 3) put the zones side by side; a `min` mark of one
    // frame leaves their 16 frames allocatable.
    let mut config = Config::new(Topology::parse("nodes=2,sizes=64K:64K,cpus=0:1").unwrap()).max_order(3);
    config.min_free_kbytes = Some(8);
    config.stat_interval = Duration::from_secs(3600);
    let z = Zonal::new(config).unwrap();
    let (z0, z1) = (&z.mem.zones[0], &z.mem.zones[1]);
    assert_eq!(z0.start_pfn.0 >> mem_map::RUN_ORDER.0, z1.start_pfn.0 >> mem_map::RUN_ORDER.0, "one run, two zones");
    let a = on(0, || z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr() as usize);
    let b = on(1, || z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr() as usize);
    assert_eq!(z.page_to_nid(a as *const u8), Ok(NodeId(0)));
    assert_eq!(z.page_to_nid(b as *const u8), Ok(NodeId(1)));
    assert_eq!(z0.run_owner(z0.start_pfn), mem_map::NO_OWNER, "a cut run has no owner");
    on(1, || z.free_pages(a as *mut u8, 0).unwrap());
    on(1, || z.free_pages(b as *mut u8, 0).unwrap());
    assert_eq!(z.check_invariants(), Ok(0));
}
