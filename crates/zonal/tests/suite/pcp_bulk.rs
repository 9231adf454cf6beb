//! Per-CPU lists and the bulk allocator through the public API: drains return everything,
//! bulk calls fill exactly the empty slots, counters move once per call, tunables reject bad
//! values and keep the old one.

use crate::common;

use std::ptr::NonNull;
use zonal::topology::Machine;
use zonal::vmstat::VmEvent;
use zonal::{Config, Error, Gfp, NodeId, Topology, Zonal};

const M: Machine = Machine { nr_cpus: 2, mem_total: 1 << 30 };

fn zonal(spec: &str) -> Zonal {
    // No background decay between the reads a test compares.
    let mut c = Config::new(Topology::parse_for(spec, M).unwrap());
    c.stat_interval = std::time::Duration::from_secs(3600);
    Zonal::new(c).unwrap()
}

fn managed(z: &Zonal, nid: u16) -> usize {
    z.zones()[z.node_zones(NodeId(nid)).unwrap()[0].0 as usize].managed
}

#[test]
fn frees_go_to_per_cpu_lists_and_drain_returns_them() {
    let z = zonal("nodes=1,size=16M");
    let pages: Vec<NonNull<u8>> = (0..64).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
    for p in &pages {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    let on_pcp = z.nr_pcp_pages(NodeId(0)).unwrap();
    assert!(on_pcp > 0, "freed frames wait on the per-CPU lists");
    assert_eq!(z.nr_free_pages(NodeId(0)).unwrap() + on_pcp, managed(&z, 0));
    assert_eq!(z.check_invariants(), Ok(0));
    assert_eq!(z.drain_all_pages(), on_pcp);
    assert_eq!(z.nr_pcp_pages(NodeId(0)).unwrap(), 0);
    assert_eq!(z.nr_free_pages(NodeId(0)).unwrap(), managed(&z, 0));
    // Everything merged back into maximal blocks.
    assert_eq!(z.nr_free_blocks(NodeId(0), 10).unwrap(), 4);
}

/// The bulk free takes the pages as the bulk calls hand them out: the array form's slots
/// (empty ones skipped, neither freed nor an error) and the list form's `NonNull`s.
#[test]
fn bulk_free_takes_the_array_and_the_list_as_they_are() {
    let z = zonal("nodes=1,size=16M");
    let mut slots = [None; 6];
    assert_eq!(z.alloc_pages_bulk_array(Gfp::KERNEL, &mut slots), 6);
    let taken = slots[2].take().unwrap();
    z.free_pages(taken.as_ptr(), 0).unwrap();
    assert_eq!(z.free_pages_bulk(&slots), Ok(5));
    assert_eq!(z.free_pages_bulk(&[None::<NonNull<u8>>]), Ok(0));
    // Freed once: the same slots again are double frees, the first reported by its index.
    let first = slots[0].unwrap().as_ptr();
    assert_eq!(z.free_pages_bulk(&slots), Err((0, Error::DoubleFree { pfn: z.addr_to_pfn(first).unwrap() })));
    let mut list = Vec::new();
    assert_eq!(z.alloc_pages_bulk_list(Gfp::KERNEL, 9, &mut list), 9);
    assert_eq!(z.free_pages_bulk(&list), Ok(9));
    assert_eq!(z.check_invariants(), Ok(0));
}

/// Pageblock-order blocks go through the CPU's THP list (`NR_PCP_THP`): a pair reuses the
/// block it freed, the list's frames are counted as per-CPU frames, and a drain returns them.
#[test]
fn thp_pairs_reuse_the_cpu_list_and_drains_return_it() {
    let z = zonal("nodes=1,size=64M");
    let m = managed(&z, 0);
    common::on_cpu(0, || {
        let a = z.alloc_pages(Gfp::KERNEL, 9).unwrap();
        assert_eq!(z.nr_pcp_pages(NodeId(0)).unwrap(), 512, "the refill's second block waits on the list");
        assert_eq!(z.check_invariants(), Ok(512));
        z.free_pages(a.as_ptr(), 9).unwrap();
        assert_eq!(z.nr_pcp_pages(NodeId(0)).unwrap(), 1024);
        assert_eq!(z.nr_free_pages(NodeId(0)).unwrap() + 1024, m);
        let b = z.alloc_pages(Gfp::KERNEL, 9).unwrap();
        assert_eq!(b, a, "the block freed last is handed out first");
        assert_eq!(
            z.free_pages(b.as_ptr(), 3),
            Err(Error::OrderMismatch {
                pfn: z.addr_to_pfn(b.as_ptr()).unwrap(),
                allocated: zonal::Order::new(9).unwrap(),
                freed: zonal::Order::new(3).unwrap(),
            })
        );
        z.free_pages(b.as_ptr(), 9).unwrap();
        assert_eq!(z.free_pages(b.as_ptr(), 9), Err(Error::DoubleFree { pfn: z.addr_to_pfn(b.as_ptr()).unwrap() }));
        assert_eq!(z.pcp_info(0, z.node_zones(NodeId(0)).unwrap()[0]).unwrap().count, 1024);
        assert_eq!(z.check_invariants(), Ok(0));
    });
    assert_eq!(z.drain_all_pages(), 1024);
    assert_eq!(z.nr_free_pages(NodeId(0)).unwrap(), m);
    assert_eq!(z.nr_free_blocks(NodeId(0), 10).unwrap(), 16);
}

/// A node whose every huge block is wanted gets them all: blocks parked on a CPU's THP list
/// are drained by the slow path, not lost.
#[test]
fn every_huge_block_can_be_allocated_after_frees() {
    let z = zonal("nodes=1,size=8M");
    let take_all = |z: &Zonal| -> Vec<NonNull<u8>> {
        std::iter::from_fn(|| z.alloc_pages(Gfp::KERNEL | Gfp::NO_WATERMARKS, 9).ok()).collect()
    };
    let first = take_all(&z);
    assert_eq!(first.len(), 4, "8 MiB is four 2 MiB blocks");
    for p in &first {
        z.free_pages(p.as_ptr(), 9).unwrap();
    }
    let again = take_all(&z);
    assert_eq!(again.len(), 4);
    for p in &again {
        z.free_pages(p.as_ptr(), 9).unwrap();
    }
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn pcp_counts_stay_within_high_plus_batch() {
    let z = zonal("nodes=2,size=8M");
    let mut live = Vec::new();
    for i in 0..3000usize {
        let order = (i % 4) as u32;
        if i % 3 == 2 {
            if let Some((p, o)) = live.pop() {
                z.free_pages(p, o).unwrap();
            }
        } else if let Ok(p) = z.alloc_pages(Gfp::KERNEL, order) {
            live.push((p.as_ptr(), order));
        }
        if i % 97 == 0 {
            for cpu in 0..z.nr_cpus() {
                for zone in z.zones() {
                    let info = z.pcp_info(cpu, zone.id).unwrap();
                    assert!(info.count <= info.high + info.batch, "{info:?}");
                    assert!(info.high_min <= info.high && info.high <= info.high_max, "{info:?}");
                }
            }
            assert!(z.check_invariants().is_ok());
        }
    }
    for (p, o) in live {
        z.free_pages(p, o).unwrap();
    }
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn an_allocation_that_would_fail_drains_other_cpus_first() {
    // One small node; fill it, park frames on CPU lists, then ask for a large block: only
    // a drain can make it.
    let z = zonal("nodes=1,size=4M");
    let mut pages = Vec::new();
    while let Ok(p) = z.alloc_pages(Gfp::NO_WATERMARKS, 0) {
        pages.push(p);
    }
    assert!(matches!(z.alloc_pages(Gfp::NO_WATERMARKS, 0), Err(Error::OutOfMemory { .. })));
    for p in &pages {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    assert!(z.nr_pcp_pages(NodeId(0)).unwrap() > 0);
    let big = z.alloc_pages(Gfp::NO_WATERMARKS, 10).expect("the drain frees the stranded frames");
    z.free_pages(big.as_ptr(), 10).unwrap();
}

/// A one-frame bulk call takes the single path (the rseq cache when it has a frame) and is
/// still counted as one bulk call and one page, whichever path served it.
#[test]
fn a_one_frame_bulk_call_counts_as_one_call() {
    let z = zonal("nodes=1,size=16M");
    // Warm this CPU's lists and cache, so the second call may take the fast path.
    let warm = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    z.free_pages(warm.as_ptr(), 0).unwrap();
    for round in 0..2 {
        let (calls, pgalloc) = (z.event(VmEvent::AllocBulk), z.event(VmEvent::PgallocNormal));
        let mut one = vec![None];
        assert_eq!(z.alloc_pages_bulk_array(Gfp::KERNEL, &mut one), 1);
        assert_eq!(z.event(VmEvent::AllocBulk), calls + 1, "round {round}");
        assert_eq!(z.event(VmEvent::PgallocNormal), pgalloc + 1, "round {round}");
        assert_eq!(z.check_invariants(), Ok(1));
        z.free_pages_bulk(&[one[0].unwrap().as_ptr()]).unwrap();
    }
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn bulk_array_fills_exactly_the_empty_slots() {
    let z = zonal("nodes=1,size=16M");
    let keep = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    let mut arr: Vec<Option<NonNull<u8>>> = vec![None; 16];
    arr[3] = Some(keep);
    arr[9] = Some(keep);
    let calls = z.event(VmEvent::AllocBulk);
    let pgalloc = z.event(VmEvent::PgallocNormal);
    assert_eq!(z.alloc_pages_bulk_array(Gfp::KERNEL, &mut arr), 16);
    assert_eq!(arr[3], Some(keep));
    assert_eq!(arr[9], Some(keep));
    assert_eq!(z.event(VmEvent::AllocBulk), calls + 1, "one bulk call counted once");
    assert_eq!(z.event(VmEvent::PgallocNormal), pgalloc + 14, "the batch counted with its size");
    let mut fresh: Vec<*mut u8> =
        arr.iter().enumerate().filter(|(i, _)| *i != 3 && *i != 9).map(|(_, p)| p.unwrap().as_ptr()).collect();
    fresh.sort();
    fresh.dedup();
    assert_eq!(fresh.len(), 14, "no frame handed out twice");
    assert_eq!(z.check_invariants(), Ok(15));
    // A full array: nothing to do, the count is returned.
    assert_eq!(z.alloc_pages_bulk_array(Gfp::KERNEL, &mut arr), 16);
    assert_eq!(z.free_pages_bulk(&fresh), Ok(14));
    z.free_pages(keep.as_ptr(), 0).unwrap();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn bulk_list_appends_and_is_partial_under_pressure() {
    let z = zonal("nodes=1,size=4M");
    let mut list = Vec::new();
    assert_eq!(z.alloc_pages_bulk_list(Gfp::KERNEL, 100, &mut list), 100);
    assert_eq!(list.len(), 100);
    // Ask for more than the node has: a partial fill, not an error.
    let mut more = Vec::new();
    let n = z.alloc_pages_bulk_list(Gfp::NO_WATERMARKS, 2000, &mut more);
    assert_eq!(n, more.len());
    assert!(n < 2000 && n > 800, "{n}");
    assert_eq!(z.check_invariants(), Ok(100 + n));
    let all: Vec<*mut u8> = list.iter().chain(&more).map(|p| p.as_ptr()).collect();
    assert_eq!(z.free_pages_bulk(&all), Ok(all.len()));
    assert_eq!(z.alloc_pages_bulk_list(Gfp::KERNEL, 0, &mut more), 0);
}

#[test]
fn bulk_free_frees_the_good_and_reports_the_first_bad() {
    let z = zonal("nodes=1,size=4M");
    let a = z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr();
    let b = z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr();
    let mut x = 0u8;
    let r = z.free_pages_bulk(&[a, &mut x as *mut u8, b, a]);
    assert!(matches!(r, Err((1, Error::NotOwned { .. }))), "{r:?}");
    assert_eq!(z.check_invariants(), Ok(0), "a and b were freed, the double free of a refused");
}

/// A few pages freed in one call (the single fast path each, up to four) are checked and
/// reported as more are (the bulk path): empty slots skipped, the first bad entry by its
/// index, every good one freed.
#[test]
fn a_few_pages_freed_in_one_call_are_checked_as_many_are() {
    let z = zonal("nodes=1,size=16M");
    for n in 2..=8 {
        let mut slots = vec![None; n];
        assert_eq!(z.alloc_pages_bulk_array(Gfp::KERNEL, &mut slots), n);
        let gone = slots[1].take().unwrap();
        z.free_pages(gone.as_ptr(), 0).unwrap();
        assert_eq!(z.free_pages_bulk(&slots), Ok(n - 1), "{n} slots, one empty");
        assert_eq!(z.check_invariants(), Ok(0));
        // The same slots again: each a double free, the first reported by its index.
        let pfn = |i: usize| z.addr_to_pfn(slots[i].unwrap().as_ptr()).unwrap();
        assert_eq!(z.free_pages_bulk(&slots), Err((0, Error::DoubleFree { pfn: pfn(0) })), "{n}");
        if n > 2 {
            let third = pfn(2);
            slots[0] = None;
            assert_eq!(z.free_pages_bulk(&slots), Err((2, Error::DoubleFree { pfn: third })), "{n}");
        }
        assert_eq!(z.check_invariants(), Ok(0));
    }
}

#[test]
fn bulk_respects_thisnode_and_bind() {
    let z = zonal("nodes=2,size=8M");
    let mut list = Vec::new();
    z.set_thread_policy(zonal::MemPolicy::Bind(zonal::NodeMask::parse("1").unwrap())).unwrap();
    assert_eq!(z.alloc_pages_bulk_list(Gfp::KERNEL, 64, &mut list), 64);
    assert!(list.iter().all(|p| z.page_to_nid(p.as_ptr()).unwrap() == NodeId(1)));
    z.set_thread_policy(zonal::MemPolicy::Local).unwrap();
    let ptrs: Vec<*mut u8> = list.iter().map(|p| p.as_ptr()).collect();
    z.free_pages_bulk(&ptrs).unwrap();
}

#[test]
fn high_fraction_is_validated_and_fixes_high() {
    let z = zonal("nodes=1,size=64M");
    let zone = z.zones()[0].id;
    let auto = z.pcp_info(0, zone).unwrap();
    assert!(auto.high_min < auto.high_max, "auto-tuned by default: {auto:?}");
    for bad in [1, 7] {
        let e = z.set_percpu_pagelist_high_fraction(bad).unwrap_err();
        assert!(e.to_string().contains("at least 8"), "{e}");
        assert_eq!(z.percpu_pagelist_high_fraction(), 0, "the old value stays");
    }
    z.set_percpu_pagelist_high_fraction(8).unwrap();
    let fixed = z.pcp_info(0, zone).unwrap();
    assert_eq!(fixed.high_min, fixed.high_max);
    assert_eq!(fixed.high, fixed.high_min);
    // managed / 8 split over the node's CPUs (both machine CPUs are on node 0).
    assert_eq!(fixed.high, 16384 / 8 / 2);
    z.set_percpu_pagelist_high_fraction(0).unwrap();
    assert_eq!(z.pcp_info(0, zone).unwrap().high_max, auto.high_max);
}

#[test]
fn decay_lowers_high_of_idle_lists() {
    // No background decay during the test: only the explicit passes below.
    let mut c = Config::new(Topology::parse_for("nodes=1,size=64M", M).unwrap());
    c.stat_interval = std::time::Duration::from_secs(3600);
    let z = Zonal::new(c).unwrap();
    let zone = z.zones()[0].id;
    let cpu = z.current_cpu();
    let pages: Vec<NonNull<u8>> = (0..3000).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
    for p in &pages {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    // The thread may have moved; look at the CPU whose lists grew.
    let grown = (0..z.nr_cpus()).map(|c| z.pcp_info(c, zone).unwrap()).max_by_key(|i| i.high).unwrap();
    assert!(grown.high > grown.high_min, "sustained traffic grows high: {grown:?} (cpu {cpu})");
    for _ in 0..50 {
        z.decay_pcp_high();
    }
    for c in 0..z.nr_cpus() {
        let i = z.pcp_info(c, zone).unwrap();
        assert_eq!(i.high, i.high_min, "idle lists decay to high_min");
        assert!(i.count <= i.high);
    }
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn pcp_can_be_turned_off() {
    let z = Zonal::new(Config::new(Topology::parse_for("nodes=1,size=4M", M).unwrap()).pcp(false)).unwrap();
    let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    z.free_pages(p.as_ptr(), 0).unwrap();
    assert_eq!(z.nr_pcp_pages(NodeId(0)).unwrap(), 0);
    assert_eq!(z.nr_free_pages(NodeId(0)).unwrap(), 1024);
    let mut arr = [None; 8];
    assert_eq!(z.alloc_pages_bulk_array(Gfp::KERNEL, &mut arr), 8);
}
