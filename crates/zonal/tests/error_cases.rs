//! One test per error of the public API, each checking that nothing changed; the watermark
//! steps of the allocation path; zonelist fallback order.

use zonal::topology::Machine;
use zonal::zone::Watermark;
use zonal::{Config, Error, Gfp, NodeId, Topology, Zonal};

const M: Machine = Machine { nr_cpus: 2, mem_total: 1 << 30 };

fn zonal(spec: &str) -> Zonal {
    // Buddy only, so free counts are exact after every call.
    Zonal::new(Config::new(Topology::parse_for(spec, M).unwrap()).pcp(false)).unwrap()
}

fn snapshot(z: &Zonal) -> (String, Result<usize, String>) {
    (z.buddyinfo(), z.check_invariants())
}

#[test]
fn out_of_memory_is_an_error_and_recoverable() {
    let z = zonal("nodes=2,size=4M");
    let mut pages = Vec::new();
    let err = loop {
        match z.alloc_pages_node(NodeId(0), Gfp::THISNODE | Gfp::NO_WATERMARKS, 0) {
            Ok(p) => pages.push(p),
            Err(e) => break e,
        }
    };
    assert_eq!(pages.len(), 1024);
    assert!(matches!(err, Error::OutOfMemory { .. }));
    assert!(err.to_string().contains("out of memory"), "{err}");
    assert_eq!(err.errno(), libc::ENOMEM);
    // Node 1 is untouched; node 0 recovers after a free.
    assert_eq!(z.nr_free_pages(NodeId(1)).unwrap(), 1024);
    z.free_pages(pages.pop().unwrap().as_ptr(), 0).unwrap();
    let again = z.alloc_pages_node(NodeId(0), Gfp::THISNODE | Gfp::NO_WATERMARKS, 0).unwrap();
    assert_eq!(z.page_to_nid(again.as_ptr()).unwrap(), NodeId(0));
    pages.push(again);
    for p in pages {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn invalid_node_and_order() {
    let z = zonal("nodes=2,size=4M");
    let before = snapshot(&z);
    assert_eq!(z.alloc_pages_node(NodeId(2), Gfp::KERNEL, 0), Err(Error::InvalidNode { node: NodeId(2), nr_nodes: 2 }));
    assert!(matches!(z.alloc_pages(Gfp::KERNEL, 11), Err(Error::InvalidOrder { order: 11, .. })));
    assert!(matches!(z.alloc_pages(Gfp::KERNEL, u32::MAX), Err(Error::InvalidOrder { .. })));
    assert!(matches!(z.free_pages(std::ptr::null_mut(), 11), Err(Error::InvalidOrder { .. })));
    assert!(matches!(z.nr_free_pages(NodeId(9)), Err(Error::InvalidNode { .. })));
    assert!(matches!(z.set_thread_policy(zonal::MemPolicy::Preferred(NodeId(5))), Err(Error::InvalidNode { .. })));
    assert_eq!(snapshot(&z), before);
}

#[test]
fn not_owned_addresses() {
    // 6M nodes leave a 2M gap after each node up to the next 4M boundary.
    let z = zonal("nodes=2,size=6M");
    let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    let before = snapshot(&z);
    let mut on_stack = 0u8;
    let base = z.zones()[0].start_pfn.0; // 0: the arena starts at node 0
    assert_eq!(base, 0);
    let arena_start = p.as_ptr() as usize - z.addr_to_pfn(p.as_ptr()).unwrap().0 * 4096;
    for addr in [
        std::ptr::null_mut(),
        &mut on_stack as *mut u8,
        (arena_start - 4096) as *mut u8,
        (arena_start + (6 << 20)) as *mut u8,  // the gap after node 0
        (arena_start + (14 << 20)) as *mut u8, // the gap after node 1
        (arena_start + (16 << 20)) as *mut u8, // past the arena
    ] {
        assert!(matches!(z.free_pages(addr, 0), Err(Error::NotOwned { .. })), "{addr:?}");
        assert!(matches!(z.page_to_nid(addr), Err(Error::NotOwned { .. })), "{addr:?}");
    }
    assert_eq!(z.page_to_nid((arena_start + (8 << 20)) as *const u8), Ok(NodeId(1)));
    assert_eq!(snapshot(&z), before);
    z.free_pages(p.as_ptr(), 0).unwrap();
}

#[test]
fn misaligned() {
    let z = zonal("nodes=1,size=4M");
    let p = z.alloc_pages(Gfp::KERNEL, 1).unwrap().as_ptr();
    let before = snapshot(&z);
    assert!(matches!(z.free_pages(p.wrapping_add(1), 1), Err(Error::Misaligned { .. })));
    assert!(matches!(z.free_pages(p.wrapping_add(4096), 1), Err(Error::Misaligned { .. })));
    assert!(matches!(z.free_pages(p.wrapping_add(2048), 0), Err(Error::Misaligned { .. })));
    assert_eq!(snapshot(&z), before);
    z.free_pages(p, 1).unwrap();
}

#[test]
fn double_free() {
    let z = zonal("nodes=1,size=4M");
    let a = z.alloc_pages(Gfp::KERNEL, 2).unwrap().as_ptr();
    let b = z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr();
    z.free_pages(a, 2).unwrap();
    let before = snapshot(&z);
    assert!(matches!(z.free_pages(a, 2), Err(Error::DoubleFree { .. })));
    // Any frame of the freed block, any order.
    assert!(matches!(z.free_pages(a.wrapping_add(4096), 0), Err(Error::DoubleFree { .. })));
    assert!(matches!(z.free_pages(a, 0), Err(Error::DoubleFree { .. })));
    assert_eq!(snapshot(&z), before);
    let e = z.free_pages(a, 2).unwrap_err();
    assert!(e.to_string().starts_with("double free"), "{e}");
    assert_eq!(e.errno(), libc::EALREADY);
    z.free_pages(b, 0).unwrap();
}

#[test]
fn order_mismatch_both_ways() {
    let z = zonal("nodes=1,size=4M");
    let p = z.alloc_pages(Gfp::KERNEL, 2).unwrap().as_ptr();
    let before = snapshot(&z);
    assert_eq!(
        z.free_pages(p, 1),
        Err(Error::OrderMismatch {
            pfn: z.addr_to_pfn(p).unwrap(),
            allocated: zonal::Order(2),
            freed: zonal::Order(1)
        })
    );
    assert!(matches!(z.free_pages(p, 0), Err(Error::OrderMismatch { .. })));
    assert!(matches!(z.free_pages(p, 3), Err(Error::OrderMismatch { .. }) | Err(Error::Misaligned { .. })));
    assert_eq!(snapshot(&z), before);
    z.free_pages(p, 2).unwrap();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn interior_frame() {
    let z = zonal("nodes=1,size=4M");
    let p = z.alloc_pages(Gfp::KERNEL, 3).unwrap().as_ptr();
    let before = snapshot(&z);
    for i in 1..8 {
        let r = z.free_pages(p.wrapping_add(i * 4096), 0);
        assert!(matches!(r, Err(Error::InteriorFrame { order: zonal::Order(3), .. })), "{i}: {r:?}");
    }
    assert!(matches!(z.free_pages(p.wrapping_add(4 * 4096), 2), Err(Error::InteriorFrame { .. })));
    assert_eq!(snapshot(&z), before);
    z.free_pages(p, 3).unwrap();
}

#[test]
fn errnos_are_distinct() {
    let errs = [
        Error::OutOfMemory { order: zonal::Order(0) }.errno(),
        Error::InvalidNode { node: NodeId(0), nr_nodes: 1 }.errno(),
        Error::InvalidOrder { order: 0, max_order: zonal::Order(0) }.errno(),
        Error::NotOwned { addr: 0 }.errno(),
        Error::Misaligned { addr: 0, order: zonal::Order(0) }.errno(),
        Error::DoubleFree { pfn: zonal::Pfn(0) }.errno(),
        Error::OrderMismatch { pfn: zonal::Pfn(0), allocated: zonal::Order(0), freed: zonal::Order(1) }.errno(),
        Error::InteriorFrame { pfn: zonal::Pfn(0), block: zonal::Pfn(0), order: zonal::Order(1) }.errno(),
    ];
    let mut d = errs.to_vec();
    d.sort_unstable();
    d.dedup();
    assert_eq!(d.len(), errs.len());
}

/// Frees every frame `alloc` can get from node 0 with `gfp`; returns (count, free after).
fn exhaust(z: &Zonal, gfp: Gfp) -> (usize, usize) {
    let mut pages = Vec::new();
    while let Ok(p) = z.alloc_pages_node(NodeId(0), Gfp::THISNODE | gfp, 0) {
        pages.push(p);
    }
    let left = z.nr_free_pages(NodeId(0)).unwrap();
    let n = pages.len();
    for p in pages {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    (n, left)
}

#[test]
fn watermarks_bound_each_kind_of_allocation() {
    let z = zonal("nodes=1,size=16M");
    let min = z.zones()[0].watermark(Watermark::Min);
    assert!(min > 8, "{min}");
    // The second pass stops at min: free pages end at exactly min.
    let (_, left) = exhaust(&z, Gfp::KERNEL);
    assert_eq!(left, min);
    // HIGH may go down to half of min.
    let (_, left) = exhaust(&z, Gfp::HIGH);
    assert_eq!(left, min - min / 2);
    // NO_WATERMARKS takes everything.
    let (n, left) = exhaust(&z, Gfp::NO_WATERMARKS);
    assert_eq!((n, left), (4096, 0));
    // Raising min_free_kbytes raises the floor; a bad value is refused and the old one kept.
    let old = z.min_free_kbytes();
    z.set_min_free_kbytes(old * 4).unwrap();
    assert!(z.zones()[0].watermark(Watermark::Min) > min);
    assert!(z.set_min_free_kbytes(0).is_err());
    assert!(z.set_min_free_kbytes(1 << 40).is_err());
    assert_eq!(z.min_free_kbytes(), old * 4);
    assert!(z.set_watermark_scale_factor(0).is_err());
    assert!(z.set_watermark_scale_factor(3001).is_err());
    z.set_watermark_scale_factor(1000).unwrap();
    let s = &z.zone_stats()[0];
    assert_eq!(s.low - s.min, 4096 * 1000 / 10_000);
}

#[test]
fn fallback_follows_distance() {
    // Node 0's nearest is node 2, then node 1.
    let z = zonal("nodes=3,size=4M,distance=10 30 20:30 10 30:20 30 10");
    let order: Vec<u16> =
        z.zonelists(NodeId(0)).unwrap().fallback.iter().map(|id| z.zones()[id.0 as usize].node.0).collect();
    assert_eq!(order, vec![0, 2, 1]);
    let mut held = Vec::new();
    while let Ok(p) = z.alloc_pages_node(NodeId(0), Gfp::THISNODE | Gfp::NO_WATERMARKS, 0) {
        held.push(p);
    }
    let p = z.alloc_pages_node(NodeId(0), Gfp::KERNEL, 0).unwrap();
    assert_eq!(z.page_to_nid(p.as_ptr()).unwrap(), NodeId(2));
    // THISNODE never falls back.
    assert!(matches!(z.alloc_pages_node(NodeId(0), Gfp::THISNODE, 0), Err(Error::OutOfMemory { .. })));
    z.free_pages(p.as_ptr(), 0).unwrap();
    for p in held {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
}

#[test]
fn policies_place_blocks() {
    let z = zonal("nodes=3,size=4M");
    z.set_thread_policy(zonal::MemPolicy::parse("interleave=0,2", 3).unwrap()).unwrap();
    let nodes: Vec<u16> =
        (0..6).map(|_| z.page_to_nid(z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr()).unwrap().0).collect();
    assert_eq!(nodes, vec![0, 2, 0, 2, 0, 2]);
    z.set_thread_policy(zonal::MemPolicy::Preferred(NodeId(1))).unwrap();
    assert_eq!(z.page_to_nid(z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr()), Ok(NodeId(1)));
    assert_eq!(z.thread_policy(), zonal::MemPolicy::Preferred(NodeId(1)));
    // A per-call policy leaves the thread's alone.
    let p = z.alloc_pages_policy(Gfp::KERNEL, 0, &zonal::MemPolicy::parse("bind=2", 3).unwrap()).unwrap();
    assert_eq!(z.page_to_nid(p.as_ptr()), Ok(NodeId(2)));
    assert_eq!(z.thread_policy(), zonal::MemPolicy::Preferred(NodeId(1)));
    // Another thread has its own (default) policy.
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(z.thread_policy(), zonal::MemPolicy::Local));
    });
    assert_eq!(z.check_invariants(), Ok(8));
}
