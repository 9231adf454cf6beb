//! One test per error of the public API, each checking the exact error, its errno and
//! message, and that the refused call changed nothing (invariants, free counts, buddyinfo);
//! then the watermark steps (`KERNEL` stops at `min`, `HIGH` at half of it, `NO_WATERMARKS`
//! at zero) and the zonelist's fallback order by distance.

use std::time::Duration;
use zonal::topology::Machine;
use zonal::vmstat::VmEvent;
use zonal::zone::{Watermark, Zone};
use zonal::{Config, Error, Gfp, MemPolicy, NodeId, NodeMask, Order, Pfn, Topology, Zonal, ZoneId, PAGE_SIZE};

const MACHINE: Machine = Machine { nr_cpus: 2, mem_total: 1 << 30 };

fn zonal_with(spec: &str, max_order: u8, pcp: bool, min_free_kbytes: Option<u64>) -> Zonal {
    let t = Topology::parse_for(spec, MACHINE).unwrap();
    let mut c = Config::new(t).max_order(max_order).pcp(pcp);
    c.min_free_kbytes = min_free_kbytes;
    // No background decay of the per-CPU lists between a snapshot and the next.
    c.stat_interval = Duration::from_secs(3600);
    Zonal::new(c).unwrap()
}

/// Two nodes of 16 frames, `MAX_ORDER` 3, and a `min` watermark of one frame per zone (the
/// default `min_free_kbytes`, 128, would put every watermark at or above the zone's size).
fn tiny(pcp: bool) -> Zonal {
    zonal_with("nodes=2,sizes=64K:64K,cpus=0:1", 3, pcp, Some(8))
}

/// Everything a refused call must leave as it was.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    invariants: Result<usize, String>,
    buddyinfo: String,
    free: Vec<usize>,
    pcp: Vec<usize>,
}

fn snapshot(z: &Zonal) -> Snapshot {
    let nodes = 0..z.topology().nr_nodes() as u16;
    Snapshot {
        invariants: z.check_invariants(),
        buddyinfo: z.buddyinfo(),
        free: nodes.clone().map(|n| z.nr_free_pages(NodeId(n)).unwrap()).collect(),
        pcp: nodes.map(|n| z.nr_pcp_pages(NodeId(n)).unwrap()).collect(),
    }
}

/// Runs a call that must fail with `want` and change nothing.
fn refused<T: std::fmt::Debug>(z: &Zonal, want: Error, call: impl FnOnce() -> Result<T, Error>) {
    let before = snapshot(z);
    let got = call();
    match got {
        Err(e) => assert_eq!(e, want),
        Ok(v) => panic!("expected {want:?}, got Ok({v:?})"),
    }
    assert_eq!(snapshot(z), before, "the refused call ({want}) changed the allocator");
}

/// The arena's first address: any frame's address minus its frame number.
fn base(z: &Zonal) -> usize {
    let p = z.alloc_pages_node(NodeId(0), Gfp::THISNODE | Gfp::NO_WATERMARKS, 0).unwrap();
    let b = p.as_ptr() as usize - z.addr_to_pfn(p.as_ptr()).unwrap().0 * PAGE_SIZE;
    z.free_pages(p.as_ptr(), 0).unwrap();
    b
}

fn zone(z: &Zonal, node: u16) -> &Zone {
    &z.zones()[z.node_zones(NodeId(node)).unwrap()[0].0 as usize]
}

/// Allocates order-`order` blocks from `node` with `gfp | THISNODE` until it fails; returns
/// the blocks and the error.
fn exhaust(z: &Zonal, node: u16, gfp: Gfp, order: u32) -> (Vec<*mut u8>, Error) {
    let mut got = Vec::new();
    loop {
        match z.alloc_pages_node(NodeId(node), gfp | Gfp::THISNODE, order) {
            Ok(p) => {
                assert_eq!(z.page_to_nid(p.as_ptr()), Ok(NodeId(node)));
                got.push(p.as_ptr());
            }
            Err(e) => return (got, e),
        }
        assert!(got.len() <= zone(z, node).managed, "more blocks than frames");
    }
}

#[test]
fn out_of_memory_is_an_error_and_recoverable() {
    for pcp in [false, true] {
        let z = tiny(pcp);
        let fails = z.event(VmEvent::AllocFail);
        let (frames, e) = exhaust(&z, 1, Gfp::NO_WATERMARKS, 0);
        assert_eq!(frames.len(), 16, "NO_WATERMARKS takes every frame");
        assert_eq!(e, Error::OutOfMemory { order: Order::new(0).unwrap() });
        assert!(e.to_string().starts_with("out of memory"), "{e}");
        assert_eq!(e.errno(), libc::ENOMEM);
        assert_eq!(z.event(VmEvent::AllocFail), fails + 1);
        assert_eq!(z.nr_free_pages(NodeId(1)), Ok(0));
        assert_eq!(z.nr_pcp_pages(NodeId(1)), Ok(0));
        // Another failure changes nothing, for every order.
        for order in 0..=3 {
            refused(&z, Error::OutOfMemory { order: Order::new(order as u8).unwrap() }, || {
                z.alloc_pages_node(NodeId(1), Gfp::THISNODE | Gfp::NO_WATERMARKS, order)
            });
        }
        assert_eq!(z.check_invariants(), Ok(16));
        // Node 0 is untouched and still serves.
        assert_eq!(z.nr_free_pages(NodeId(0)).unwrap() + z.nr_pcp_pages(NodeId(0)).unwrap(), 16);
        // Free one frame: the next allocation gets exactly that frame back.
        z.free_pages(frames[5], 0).unwrap();
        let again = z.alloc_pages_node(NodeId(1), Gfp::THISNODE | Gfp::NO_WATERMARKS, 0).unwrap();
        assert_eq!(again.as_ptr(), frames[5]);
        // Free two buddies: an order-1 block is there again.
        let pfn = |p: *mut u8| z.addr_to_pfn(p).unwrap().0;
        let pair: Vec<*mut u8> = frames.iter().copied().filter(|&p| pfn(p) / 2 == pfn(frames[8]) / 2).collect();
        assert_eq!(pair.len(), 2);
        for &p in &pair {
            z.free_pages(p, 0).unwrap();
        }
        let big = z.alloc_pages_node(NodeId(1), Gfp::THISNODE | Gfp::NO_WATERMARKS, 1).unwrap();
        assert_eq!(pfn(big.as_ptr()), pfn(frames[8]) & !1);
        z.free_pages(big.as_ptr(), 1).unwrap();
        for &p in frames.iter().filter(|p| !pair.contains(p)) {
            z.free_pages(p, 0).unwrap();
        }
        // Without THISNODE the whole machine runs out, and only then.
        let mut all = Vec::new();
        let e = loop {
            match z.alloc_pages_node(NodeId(1), Gfp::NO_WATERMARKS, 0) {
                Ok(p) => all.push(p.as_ptr()),
                Err(e) => break e,
            }
        };
        assert_eq!(e, Error::OutOfMemory { order: Order::new(0).unwrap() });
        assert_eq!(all.len(), 32);
        assert_eq!(z.check_invariants(), Ok(32));
        for p in all {
            z.free_pages(p, 0).unwrap();
        }
        z.drain_all_pages();
        assert_eq!(z.check_invariants(), Ok(0));
        assert_eq!(z.nr_free_blocks(NodeId(1), 3), Ok(2));
    }
}

#[test]
fn invalid_node() {
    let z = tiny(true);
    let held = z.alloc_pages_node(NodeId(0), Gfp::KERNEL, 1).unwrap();
    let bad = |n: u16| Error::InvalidNode { node: NodeId(n), nr_nodes: 2 };
    refused(&z, bad(2), || z.alloc_pages_node(NodeId(2), Gfp::KERNEL, 0));
    refused(&z, bad(2), || z.alloc_pages_node(NodeId(2), Gfp::THISNODE, 3));
    refused(&z, bad(u16::MAX), || z.alloc_pages_node(NodeId(u16::MAX), Gfp::KERNEL, 0));
    refused(&z, bad(2), || z.alloc_pages_policy(Gfp::KERNEL, 0, &MemPolicy::Preferred(NodeId(2))));
    let mask = NodeMask::from_nodes([NodeId(0), NodeId(5)]);
    refused(&z, bad(5), || z.alloc_pages_policy(Gfp::KERNEL, 0, &MemPolicy::Bind(mask.clone())));
    refused(&z, bad(5), || z.alloc_pages_policy(Gfp::KERNEL, 0, &MemPolicy::Interleave(mask.clone())));
    // A refused thread policy keeps the old one.
    z.set_thread_policy(MemPolicy::Preferred(NodeId(1))).unwrap();
    refused(&z, bad(7), || z.set_thread_policy(MemPolicy::Preferred(NodeId(7))));
    refused(&z, bad(5), || z.set_thread_policy(MemPolicy::Bind(mask.clone())));
    assert_eq!(z.thread_policy(), MemPolicy::Preferred(NodeId(1)));
    z.set_thread_policy(MemPolicy::Local).unwrap();
    // The queries refuse it too.
    assert_eq!(z.nr_free_pages(NodeId(2)), Err(bad(2)));
    assert_eq!(z.nr_pcp_pages(NodeId(2)), Err(bad(2)));
    assert_eq!(z.nr_free_blocks(NodeId(2), 0), Err(bad(2)));
    assert_eq!(z.node_zones(NodeId(2)).map(|_| ()), Err(bad(2)));
    assert_eq!(z.zonelists(NodeId(2)).map(|_| ()), Err(bad(2)));
    let e = bad(2);
    assert_eq!(e.errno(), libc::ENODEV);
    assert_eq!(e.to_string(), "invalid node 2: the topology has nodes 0 to 1");
    // An empty mask is a configuration error, not a node error.
    let empty = z.alloc_pages_policy(Gfp::KERNEL, 0, &MemPolicy::Bind(NodeMask::new()));
    assert!(matches!(empty, Err(Error::InvalidConfig(ref m)) if m.contains("empty")), "{empty:?}");
    z.free_pages(held.as_ptr(), 1).unwrap();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn invalid_order() {
    let z = tiny(true);
    let held = z.alloc_pages_node(NodeId(1), Gfp::KERNEL, 2).unwrap();
    let bad = |o: u32| Error::InvalidOrder { order: o, max_order: Order::new(3).unwrap() };
    for o in [4, 10, 16, 255, 256, u32::MAX] {
        refused(&z, bad(o), || z.alloc_pages(Gfp::KERNEL, o));
        refused(&z, bad(o), || z.alloc_pages_node(NodeId(0), Gfp::NO_WATERMARKS, o));
        refused(&z, bad(o), || z.alloc_pages_policy(Gfp::KERNEL, o, &MemPolicy::Preferred(NodeId(1))));
        refused(&z, bad(o), || z.free_pages(held.as_ptr(), o));
        // The order is checked before the address.
        refused(&z, bad(o), || z.free_pages(std::ptr::null_mut(), o));
        assert_eq!(z.nr_free_blocks(NodeId(0), o), Err(bad(o)));
    }
    let e = bad(4);
    assert_eq!(e.errno(), libc::EDOM);
    assert_eq!(e.to_string(), "invalid order 4: the maximum is 3");
    // The maximum itself is fine.
    let max = z.alloc_pages_node(NodeId(0), Gfp::THISNODE, 3).unwrap();
    z.free_pages(max.as_ptr(), 3).unwrap();
    z.free_pages(held.as_ptr(), 2).unwrap();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn not_owned() {
    // With the default MAX_ORDER 10 (4 MiB blocks), a 6 MiB node leaves a 2 MiB gap before the
    // next node: frames 1536..2048 belong to no zone.
    let z = zonal_with("nodes=2,sizes=6M:4M,cpus=0:1", 10, true, None);
    let base = base(&z);
    assert_eq!(zone(&z, 0).start_pfn, Pfn(0));
    assert_eq!(zone(&z, 1).start_pfn, Pfn(2048));
    let held = z.alloc_pages_node(NodeId(1), Gfp::KERNEL, 0).unwrap();
    let mut on_stack = [0u8; 4096];
    let heap = vec![0u8; 3 * PAGE_SIZE];
    let heap_page = (heap.as_ptr() as usize).next_multiple_of(PAGE_SIZE);
    let addrs = [
        ("stack", on_stack.as_mut_ptr() as usize),
        ("heap", heap_page),
        ("null", 0),
        ("the frame before the arena", base - PAGE_SIZE),
        ("the first byte past the arena", base + (2048 + 1024) * PAGE_SIZE),
        ("far past the arena", base + (1 << 40)),
        ("the gap's first frame", base + 1536 * PAGE_SIZE),
        ("the gap's last frame", base + 2047 * PAGE_SIZE),
        ("the top of the address space", usize::MAX & !(PAGE_SIZE - 1)),
    ];
    for (what, addr) in addrs {
        for order in [0, 1, 10] {
            let want = Error::NotOwned { addr };
            let before = snapshot(&z);
            assert_eq!(z.free_pages(addr as *mut u8, order), Err(want.clone()), "{what}, order {order}");
            assert_eq!(snapshot(&z), before, "{what}");
        }
        assert_eq!(z.page_to_nid(addr as *const u8), Err(Error::NotOwned { addr }), "{what}");
        assert_eq!(z.addr_to_pfn(addr as *const u8), Err(Error::NotOwned { addr }), "{what}");
    }
    // The frames around the gap are owned, by the right nodes.
    assert_eq!(z.page_to_nid((base + 1535 * PAGE_SIZE) as *const u8), Ok(NodeId(0)));
    assert_eq!(z.page_to_nid((base + 2048 * PAGE_SIZE) as *const u8), Ok(NodeId(1)));
    assert_eq!(z.page_to_nid((base + (2048 + 1023) * PAGE_SIZE + 4095) as *const u8), Ok(NodeId(1)));
    let e = Error::NotOwned { addr: 0x1000 };
    assert_eq!(e.errno(), libc::EFAULT);
    assert_eq!(e.to_string(), "address 0x1000 is not owned by zonal");
    z.free_pages(held.as_ptr(), 0).unwrap();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn misaligned() {
    let z = tiny(true);
    let a = z.alloc_pages_node(NodeId(0), Gfp::KERNEL, 0).unwrap().as_ptr() as usize;
    for off in [1, 8, 2048, PAGE_SIZE - 1] {
        refused(&z, Error::Misaligned { addr: a + off, order: Order::new(0).unwrap() }, || {
            z.free_pages((a + off) as *mut u8, 0)
        });
    }
    // An order-1 free of an odd frame: misaligned whether the frame is live or free.
    let mut frames = vec![a];
    while frames.iter().all(|&f| z.addr_to_pfn(f as *const u8).unwrap().0 % 2 == 0) {
        frames.push(z.alloc_pages_node(NodeId(0), Gfp::KERNEL, 0).unwrap().as_ptr() as usize);
    }
    let odd = *frames.iter().find(|&&f| z.addr_to_pfn(f as *const u8).unwrap().0 % 2 == 1).unwrap();
    refused(&z, Error::Misaligned { addr: odd, order: Order::new(1).unwrap() }, || z.free_pages(odd as *mut u8, 1));
    // Every odd frame of the node, live or free.
    let node_start = odd & !(16 * PAGE_SIZE - 1);
    for f in (1..16).step_by(2) {
        let addr = node_start + f * PAGE_SIZE;
        refused(&z, Error::Misaligned { addr, order: Order::new(1).unwrap() }, || z.free_pages(addr as *mut u8, 1));
    }
    // A frame aligned to order 2 but not 3, given with order 3.
    let b = z.alloc_pages_node(NodeId(1), Gfp::KERNEL, 3).unwrap().as_ptr() as usize;
    refused(&z, Error::Misaligned { addr: b + 4 * PAGE_SIZE, order: Order::new(3).unwrap() }, || {
        z.free_pages((b + 4 * PAGE_SIZE) as *mut u8, 3)
    });
    let e = Error::Misaligned { addr: 0x1001, order: Order::new(0).unwrap() };
    assert_eq!(e.errno(), libc::EINVAL);
    assert_eq!(e.to_string(), "address 0x1001 is not aligned to a block of order 0");
    for f in frames {
        z.free_pages(f as *mut u8, 0).unwrap();
    }
    z.free_pages(b as *mut u8, 3).unwrap();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn double_free() {
    for pcp in [false, true] {
        let z = tiny(pcp);
        let keep = z.alloc_pages_node(NodeId(0), Gfp::KERNEL, 0).unwrap();
        for order in 0..=3u32 {
            let p = z.alloc_pages_node(NodeId(1), Gfp::THISNODE | Gfp::NO_WATERMARKS, order).unwrap();
            let pfn = z.addr_to_pfn(p.as_ptr()).unwrap();
            z.free_pages(p.as_ptr(), order).unwrap();
            // Right after the free (on a per-CPU list or merged in the buddy lists) ...
            refused(&z, Error::DoubleFree { pfn }, || z.free_pages(p.as_ptr(), order));
            // ... and after the lists are drained and the block merged into a larger one.
            z.drain_all_pages();
            refused(&z, Error::DoubleFree { pfn }, || z.free_pages(p.as_ptr(), order));
            assert_eq!(z.check_invariants(), Ok(1));
        }
        // A frame never handed out is not freeable either.
        let base = base(&z);
        let never = Pfn(zone(&z, 1).start_pfn.0 + 5);
        let addr = (base + never.0 * PAGE_SIZE) as *mut u8;
        refused(&z, Error::DoubleFree { pfn: never }, || z.free_pages(addr, 0));
        let e = Error::DoubleFree { pfn: Pfn(16) };
        assert_eq!(e.errno(), libc::EALREADY);
        assert_eq!(e.to_string(), "double free: the block at pfn 0x10 is already free");
        z.free_pages(keep.as_ptr(), 0).unwrap();
        assert_eq!(z.check_invariants(), Ok(0));
    }
}

#[test]
fn order_mismatch_bigger_and_smaller() {
    let z = tiny(true);
    // An order-2 block that starts on an order-3 boundary, so that order 3 is aligned.
    let mut spare = Vec::new();
    let p = loop {
        let p = z.alloc_pages_node(NodeId(0), Gfp::THISNODE | Gfp::NO_WATERMARKS, 2).unwrap();
        if z.addr_to_pfn(p.as_ptr()).unwrap().is_aligned(Order::new(3).unwrap()) {
            break p;
        }
        spare.push(p);
    };
    let pfn = z.addr_to_pfn(p.as_ptr()).unwrap();
    let mismatch =
        |freed| Error::OrderMismatch { pfn, allocated: Order::new(2).unwrap(), freed: Order::new(freed).unwrap() };
    refused(&z, mismatch(3), || z.free_pages(p.as_ptr(), 3));
    refused(&z, mismatch(1), || z.free_pages(p.as_ptr(), 1));
    refused(&z, mismatch(0), || z.free_pages(p.as_ptr(), 0));
    // An order-0 block on an even frame, given with order 1.
    let mut zeros = Vec::new();
    let q = loop {
        let q = z.alloc_pages_node(NodeId(1), Gfp::THISNODE | Gfp::NO_WATERMARKS, 0).unwrap();
        if z.addr_to_pfn(q.as_ptr()).unwrap().is_aligned(Order::new(1).unwrap()) {
            break q;
        }
        zeros.push(q);
    };
    let qpfn = z.addr_to_pfn(q.as_ptr()).unwrap();
    refused(
        &z,
        Error::OrderMismatch { pfn: qpfn, allocated: Order::new(0).unwrap(), freed: Order::new(1).unwrap() },
        || z.free_pages(q.as_ptr(), 1),
    );

    let e = mismatch(3);
    assert_eq!(e.errno(), libc::ERANGE);
    assert!(e.to_string().starts_with("order mismatch"), "{e}");
    assert!(e.to_string().contains("allocated with order 2 and freed with order 3"), "{e}");
    z.free_pages(p.as_ptr(), 2).unwrap();
    z.free_pages(q.as_ptr(), 0).unwrap();
    for q in zeros {
        z.free_pages(q.as_ptr(), 0).unwrap();
    }
    for s in spare {
        z.free_pages(s.as_ptr(), 2).unwrap();
    }
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn interior_frame() {
    let z = tiny(true);
    let p = z.alloc_pages_node(NodeId(1), Gfp::KERNEL, 3).unwrap();
    let block = z.addr_to_pfn(p.as_ptr()).unwrap();
    for (k, order) in [(1usize, 0u32), (2, 1), (3, 0), (4, 2), (6, 1), (7, 0)] {
        let addr = (p.as_ptr() as usize + k * PAGE_SIZE) as *mut u8;
        let want = Error::InteriorFrame { pfn: Pfn(block.0 + k), block, order: Order::new(3).unwrap() };
        refused(&z, want, || z.free_pages(addr, order));
    }
    let e = Error::InteriorFrame { pfn: Pfn(9), block: Pfn(8), order: Order::new(3).unwrap() };
    assert_eq!(e.errno(), libc::ENOTBLK);
    assert_eq!(e.to_string(), "pfn 0x9 is inside the allocated block at pfn 0x8 (order 3), not its first frame");
    z.free_pages(p.as_ptr(), 3).unwrap();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn errno_mapping() {
    let cases = [
        (Error::OutOfMemory { order: Order::new(0).unwrap() }, libc::ENOMEM),
        (Error::InvalidNode { node: NodeId(3), nr_nodes: 2 }, libc::ENODEV),
        (Error::InvalidOrder { order: 11, max_order: Order::new(10).unwrap() }, libc::EDOM),
        (Error::NotOwned { addr: 0 }, libc::EFAULT),
        (Error::Misaligned { addr: 1, order: Order::new(0).unwrap() }, libc::EINVAL),
        (Error::DoubleFree { pfn: Pfn(0) }, libc::EALREADY),
        (
            Error::OrderMismatch { pfn: Pfn(0), allocated: Order::new(1).unwrap(), freed: Order::new(0).unwrap() },
            libc::ERANGE,
        ),
        (Error::InteriorFrame { pfn: Pfn(1), block: Pfn(0), order: Order::new(1).unwrap() }, libc::ENOTBLK),
        (Error::InvalidConfig("x".into()), libc::EINVAL),
        (Error::Os { call: "mmap", errno: libc::EPERM }, libc::EPERM),
    ];
    for (e, errno) in &cases {
        assert_eq!(e.errno(), *errno, "{e:?}");
        assert!(*errno > 0);
        assert!(!e.to_string().is_empty());
    }
    // The errors of a free or an allocation are told apart by their errno alone.
    let mut seen: Vec<i32> = cases[..8].iter().map(|(e, _)| e.errno()).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 8, "allocation and free errors need distinct errnos");
    assert!(Error::Os { call: "mmap", errno: libc::ENOMEM }.to_string().starts_with("mmap failed: "));
}

/// Watermarks follow `__setup_per_zone_wmarks`: two 4 MiB zones, `min_free_kbytes` =
/// sqrt(8192 * 16) = 362 -> 90 frames, 45 per zone; tmp = max(45 / 4, 1024 * 10 / 10000) = 11.
#[test]
fn watermarks_bound_each_kind_of_allocation() {
    for pcp in [false, true] {
        let z = zonal_with("nodes=2,size=4M,cpus=0:1", 3, pcp, None);
        assert_eq!(z.min_free_kbytes(), 362);
        let zn = zone(&z, 1);
        let (min, low, high) =
            (zn.watermark(Watermark::Min), zn.watermark(Watermark::Low), zn.watermark(Watermark::High));
        assert_eq!((min, low, high), (45, 56, 67));
        let managed = zn.managed;
        let free = |z: &Zonal| z.nr_free_pages(NodeId(1)).unwrap() + z.nr_pcp_pages(NodeId(1)).unwrap();

        // GFP_KERNEL (with THISNODE so it cannot fall back) stops at min: the last frame it
        // takes leaves exactly min free (a frame may be taken while more than min are free).
        let (kernel, e) = exhaust(&z, 1, Gfp::KERNEL, 0);
        assert_eq!(e, Error::OutOfMemory { order: Order::new(0).unwrap() });
        assert_eq!(free(&z), min, "pcp {pcp}");
        assert_eq!(kernel.len(), managed - min);
        assert_eq!(z.nr_pcp_pages(NodeId(1)), Ok(0), "the failure drained the per-CPU lists");
        // Higher orders stop where taking the block would leave min or less.
        refused(&z, Error::OutOfMemory { order: Order::new(2).unwrap() }, || {
            z.alloc_pages_node(NodeId(1), Gfp::THISNODE, 2)
        });

        // __GFP_HIGH may go down to half of min.
        let (high_prio, e) = exhaust(&z, 1, Gfp::HIGH, 0);
        assert_eq!(e, Error::OutOfMemory { order: Order::new(0).unwrap() });
        assert_eq!(free(&z), min - min / 2);
        assert_eq!(high_prio.len(), min / 2);

        // NO_WATERMARKS takes everything.
        let (reserve, e) = exhaust(&z, 1, Gfp::NO_WATERMARKS, 0);
        assert_eq!(e, Error::OutOfMemory { order: Order::new(0).unwrap() });
        assert_eq!(free(&z), 0);
        assert_eq!(reserve.len(), min - min / 2);
        assert_eq!(z.check_invariants(), Ok(managed));

        // The other node was never touched.
        assert_eq!(z.nr_free_pages(NodeId(0)).unwrap() + z.nr_pcp_pages(NodeId(0)).unwrap(), managed);
        for p in kernel.into_iter().chain(high_prio).chain(reserve) {
            z.free_pages(p, 0).unwrap();
        }
        z.drain_all_pages();
        assert_eq!(z.check_invariants(), Ok(0));
        assert_eq!(z.nr_free_blocks(NodeId(1), 3), Ok(managed / 8));
    }
}

/// The first pass of an allocation stops at `low` in every zone of the zonelist before the
/// second dips to `min`: with node 1 between min and low, a plain allocation from node 1 goes
/// to node 0, which is above low.
#[test]
fn low_watermark_first_then_min() {
    let z = zonal_with("nodes=2,size=4M,cpus=0:1", 3, false, None);
    let (min, low) = (zone(&z, 1).watermark(Watermark::Min), zone(&z, 1).watermark(Watermark::Low));
    let mut held = Vec::new();
    // Bring node 1 to exactly low free frames.
    for _ in 0..zone(&z, 1).managed - low {
        held.push(z.alloc_pages_node(NodeId(1), Gfp::THISNODE, 0).unwrap());
    }
    assert_eq!(z.nr_free_pages(NodeId(1)), Ok(low));
    let p = z.alloc_pages_node(NodeId(1), Gfp::KERNEL, 0).unwrap();
    assert_eq!(z.page_to_nid(p.as_ptr()), Ok(NodeId(0)), "node 1 is at low: the first pass moves on");
    held.push(p);
    // With node 0 at its low too, the second pass comes back to node 1, down to min.
    while z.nr_free_pages(NodeId(0)).unwrap() > low {
        held.push(z.alloc_pages_node(NodeId(0), Gfp::THISNODE, 0).unwrap());
    }
    let mut on_node = [0usize; 2];
    loop {
        match z.alloc_pages_node(NodeId(1), Gfp::KERNEL, 0) {
            Ok(p) => {
                let n = z.page_to_nid(p.as_ptr()).unwrap().0 as usize;
                // Node 1 first (its own list), until it reaches min; then node 0.
                if n == 0 {
                    assert_eq!(z.nr_free_pages(NodeId(1)), Ok(min), "node 0 before node 1 reached min");
                }
                on_node[n] += 1;
                held.push(p);
            }
            Err(e) => {
                assert_eq!(e, Error::OutOfMemory { order: Order::new(0).unwrap() });
                break;
            }
        }
    }
    assert_eq!(on_node, [low - min, low - min]);
    for p in held {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    assert_eq!(z.check_invariants(), Ok(0));
}

/// Fallback follows distance: node 0's nearest node is 2 (20), then 1 (40).
#[test]
fn zonelist_fallback_by_distance() {
    for pcp in [false, true] {
        let z = zonal_with("nodes=3,size=1M,cpus=0:1:,distance=10 40 20:40 10 30:20 30 10", 3, pcp, None);
        let nodes_of =
            |list: &[ZoneId]| -> Vec<u16> { list.iter().map(|id| z.zones()[id.0 as usize].node.0).collect() };
        let zl = z.zonelists(NodeId(0)).unwrap();
        assert_eq!(nodes_of(&zl.fallback), vec![0, 2, 1]);
        assert_eq!(nodes_of(&zl.nofallback), vec![0]);
        assert_eq!(nodes_of(&z.zonelists(NodeId(1)).unwrap().fallback), vec![1, 2, 0]);
        assert_eq!(nodes_of(&z.zonelists(NodeId(2)).unwrap().fallback), vec![2, 0, 1]);

        // Exhaust node 0 entirely; the next plain allocation from node 0 lands on node 2.
        let (mut held, e) = exhaust(&z, 0, Gfp::NO_WATERMARKS, 0);
        assert_eq!(e, Error::OutOfMemory { order: Order::new(0).unwrap() });
        let first = z.alloc_pages_node(NodeId(0), Gfp::KERNEL, 0).unwrap();
        assert_eq!(z.page_to_nid(first.as_ptr()), Ok(NodeId(2)), "pcp {pcp}");
        held.push(first.as_ptr());
        // Every later one lands on 2 or 1, never 0, and 2 while it is above low.
        let low2 = zone(&z, 2).watermark(Watermark::Low);
        let mut seen = [0usize; 3];
        let e = loop {
            let free2 = z.nr_free_pages(NodeId(2)).unwrap();
            match z.alloc_pages_node(NodeId(0), Gfp::KERNEL, 0) {
                Ok(p) => {
                    let n = z.page_to_nid(p.as_ptr()).unwrap().0 as usize;
                    if !pcp && free2 > low2 {
                        assert_eq!(n, 2, "node 2 is above low and nearer than node 1");
                    }
                    seen[n] += 1;
                    held.push(p.as_ptr());
                }
                Err(e) => break e,
            }
        };
        assert_eq!(e, Error::OutOfMemory { order: Order::new(0).unwrap() });
        assert_eq!(seen[0], 0);
        assert!(seen[2] > 0 && seen[1] > 0, "{seen:?}");
        // Each fallback node was taken down to exactly its min.
        for n in [1u16, 2] {
            let zn = zone(&z, n);
            assert_eq!(z.nr_free_pages(NodeId(n)).unwrap(), zn.watermark(Watermark::Min), "node {n}");
        }
        assert_eq!(z.check_invariants(), Ok(held.len()));
        for p in held {
            z.free_pages(p, 0).unwrap();
        }
        z.drain_all_pages();
        assert_eq!(z.check_invariants(), Ok(0));
    }
}

/// A bulk free checks every entry as a single free does: the good ones are freed, the first
/// bad one is reported with its index, and the bad ones change nothing.
#[test]
fn bulk_free_reports_the_first_bad_entry() {
    for pcp in [false, true] {
        let z = tiny(pcp);
        let mut list = Vec::new();
        assert_eq!(z.alloc_pages_bulk_list(Gfp::NO_WATERMARKS, 6, &mut list), 6);
        let frames: Vec<*mut u8> = list.iter().map(|p| p.as_ptr()).collect();
        let big = z.alloc_pages_node(NodeId(1), Gfp::KERNEL, 2).unwrap().as_ptr();
        let mut on_stack = 0u64;
        let stack = &mut on_stack as *mut u64 as *mut u8;
        let pfn0 = z.addr_to_pfn(frames[0]).unwrap();
        let interior = (big as usize + PAGE_SIZE) as *mut u8;
        let batch = [frames[0], stack, frames[1], frames[0], interior, frames[2]];
        let r = z.free_pages_bulk(&batch);
        assert_eq!(r, Err((1, Error::NotOwned { addr: stack as usize })));
        // frames 0, 1 and 2 were freed; the duplicate and the interior frame were refused.
        assert_eq!(z.check_invariants(), Ok(3 + 4));
        let again = z.free_pages_bulk(&[frames[3], frames[0], frames[4]]);
        assert_eq!(again, Err((1, Error::DoubleFree { pfn: pfn0 })));
        let interior_pfn = z.addr_to_pfn(interior).unwrap();
        let block = z.addr_to_pfn(big).unwrap();
        assert_eq!(
            z.free_pages_bulk(&[interior, frames[5]]),
            Err((0, Error::InteriorFrame { pfn: interior_pfn, block, order: Order::new(2).unwrap() }))
        );
        assert_eq!(z.check_invariants(), Ok(4));
        assert_eq!(z.free_pages_bulk::<*mut u8>(&[]), Ok(0));
        z.free_pages(big, 2).unwrap();
        z.drain_all_pages();
        assert_eq!(z.check_invariants(), Ok(0));
        assert_eq!(z.nr_free_blocks(NodeId(0), 3).unwrap() + z.nr_free_blocks(NodeId(1), 3).unwrap(), 4);
    }
}

/// Invalid tunable values and machines that cannot be built are refused, and the old values
/// (and the watermarks they produced) stay.
#[test]
fn invalid_tunables_keep_the_old_values() {
    let z = zonal_with("nodes=2,size=4M,cpus=0:1", 3, true, None);
    let marks = |z: &Zonal| -> Vec<(usize, usize, usize)> {
        z.zones()
            .iter()
            .map(|zn| (zn.watermark(Watermark::Min), zn.watermark(Watermark::Low), zn.watermark(Watermark::High)))
            .collect()
    };
    let before = marks(&z);
    for kb in [0, 8192 + 1, u64::MAX] {
        assert!(matches!(z.set_min_free_kbytes(kb), Err(Error::InvalidConfig(_))), "min_free_kbytes {kb}");
    }
    for wsf in [0, 3001, u32::MAX] {
        assert!(matches!(z.set_watermark_scale_factor(wsf), Err(Error::InvalidConfig(_))), "wsf {wsf}");
    }
    for f in [1, 7] {
        assert!(matches!(z.set_percpu_pagelist_high_fraction(f), Err(Error::InvalidConfig(_))), "fraction {f}");
    }
    assert_eq!((z.min_free_kbytes(), z.watermark_scale_factor(), z.percpu_pagelist_high_fraction()), (362, 10, 0));
    assert_eq!(marks(&z), before);
    // A valid value takes effect: 1024 kB -> 256 frames, 128 per zone; a scale factor of
    // 1000 puts low 10% of the zone (1024 frames) above min.
    z.set_watermark_scale_factor(1000).unwrap();
    let s = &z.zone_stats()[0];
    assert_eq!(s.low - s.min, 1024 * 1000 / 10_000);
    z.set_watermark_scale_factor(10).unwrap();
    z.set_min_free_kbytes(1024).unwrap();
    assert_eq!(zone(&z, 0).watermark(Watermark::Min), 128);
    assert_eq!(z.check_invariants(), Ok(0));

    let small = Machine { nr_cpus: 2, mem_total: 8 << 20 };
    let e = Topology::parse_for("nodes=3,size=4M", small).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(ref m) if m.contains("more than the machine's memory")), "{e}");
    assert_eq!(e.errno(), libc::EINVAL);
    let e = Topology::parse_for("nodes=2,sizes=4M:6K", MACHINE).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(ref m) if m.contains("multiple of 4K")), "{e}");
    let t = Topology::parse_for("nodes=1,size=4M", MACHINE).unwrap();
    let e = Zonal::new(Config::new(t.clone()).max_order(16)).err().expect("max_order 16 is above the limit");
    assert!(matches!(e, Error::InvalidConfig(ref m) if m.contains("max_order")), "{e}");
    // A config is bounded as the tunables are: the same bounds, whichever way a value comes.
    let mut c = Config::new(t.clone());
    c.min_free_kbytes = Some(4 << 10 << 10);
    let e = Zonal::new(c).err().expect("min_free_kbytes above the memory");
    assert!(matches!(e, Error::InvalidConfig(ref m) if m.contains("min_free_kbytes")), "{e}");
    let mut c = Config::new(t.clone());
    c.stat_interval = std::time::Duration::ZERO;
    let e = Zonal::new(c).err().expect("stat_interval 0");
    assert!(matches!(e, Error::InvalidConfig(ref m) if m.contains("stat_interval") && m.contains("1..=")), "{e}");
    let mut c = Config::new(t);
    c.percpu_pagelist_high_fraction = 7;
    let e = Zonal::new(c).err().expect("fraction 7");
    assert!(matches!(e, Error::InvalidConfig(ref m) if m.contains("at least 8")), "{e}");
}

#[test]
fn policies_place_blocks() {
    let z = zonal_with("nodes=3,size=4M", 3, false, None);
    z.set_thread_policy(MemPolicy::parse("interleave=0,2", 3).unwrap()).unwrap();
    let nodes: Vec<u16> =
        (0..6).map(|_| z.page_to_nid(z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr()).unwrap().0).collect();
    assert_eq!(nodes, vec![0, 2, 0, 2, 0, 2]);
    z.set_thread_policy(MemPolicy::Preferred(NodeId(1))).unwrap();
    assert_eq!(z.page_to_nid(z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr()), Ok(NodeId(1)));
    assert_eq!(z.thread_policy(), MemPolicy::Preferred(NodeId(1)));
    // A per-call policy leaves the thread's alone.
    let p = z.alloc_pages_policy(Gfp::KERNEL, 0, &MemPolicy::parse("bind=2", 3).unwrap()).unwrap();
    assert_eq!(z.page_to_nid(p.as_ptr()), Ok(NodeId(2)));
    assert_eq!(z.thread_policy(), MemPolicy::Preferred(NodeId(1)));
    // Another thread has its own (default) policy.
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(z.thread_policy(), MemPolicy::Local));
    });
    assert_eq!(z.check_invariants(), Ok(8));
}

/// `split_pages`: a live block becomes order-0 frames each freed on its own, and every bad
/// split is refused with the free's reason and changes nothing.
#[test]
fn split_pages_makes_frames_of_a_block() {
    let z = tiny(false);
    let b = z.alloc_pages_node(NodeId(0), Gfp::THISNODE, 2).unwrap().as_ptr();
    refused(&z, Error::InvalidOrder { order: 9, max_order: Order::new(3).unwrap() }, || z.split_pages(b, 9));
    refused(&z, Error::Misaligned { addr: b as usize + PAGE_SIZE, order: Order::new(2).unwrap() }, || {
        z.split_pages(b.wrapping_add(PAGE_SIZE), 2)
    });
    let pfn = z.addr_to_pfn(b).unwrap();
    refused(&z, Error::OrderMismatch { pfn, freed: Order::new(1).unwrap(), allocated: Order::new(2).unwrap() }, || {
        z.split_pages(b, 1)
    });
    let before = z.check_invariants().unwrap();
    z.split_pages(b, 2).unwrap();
    assert_eq!(z.check_invariants().unwrap(), before, "the same frames allocated");
    // A second split, or a free at the old order, is refused: the block is gone.
    assert!(z.split_pages(b, 2).is_err());
    assert!(z.free_pages(b, 2).is_err());
    for i in (0..4).rev() {
        z.free_pages(b.wrapping_add(i * PAGE_SIZE), 0).unwrap();
    }
    assert_eq!(z.check_invariants().unwrap(), 0);
}
