//! Held blocks (`Zonal::hold`, `free_held`, `unhold`): a block a layer holds cannot be freed
//! by safe code, through any free path (the restartable sequences of orders 0-3 and 9, the
//! locked path, the bulk free, the C ABI); the holder's free frees it. And the test hooks a
//! layer's lock-freedom tests need: `hold_every_lock`, `nr_free_pages_approx`.

use std::sync::mpsc;
use std::time::Duration;
use zonal::{Config, Error, Gfp, NodeId, Topology, Zonal};

const PAGE: usize = 4096;

fn zonal(spec: &str) -> Zonal {
    Zonal::new(Config::new(Topology::parse(spec).unwrap())).unwrap()
}

/// Every frame of node 0 free again after a drain, and the invariants true.
fn all_free(z: &Zonal) {
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
    let managed: usize = z.zones().iter().map(|zn| zn.managed).sum();
    let free: usize = (0..z.topology().nr_nodes()).map(|n| z.nr_free_pages(NodeId(n as u16)).unwrap()).sum();
    assert_eq!(free, managed);
}

#[test]
fn a_held_block_is_freed_by_its_holder_only() {
    let z = zonal("nodes=1,size=64M");
    // The orders of every free path: order 0's and 1-3's restartable sequences, the
    // pageblock order's, and the locked path's (4).
    for order in [0u32, 1, 3, 4, 9] {
        // Twice: the second round runs the fast paths with warm caches.
        for _ in 0..2 {
            let p = z.alloc_pages(Gfp::KERNEL, order).unwrap();
            let pfn = z.addr_to_pfn(p.as_ptr()).unwrap();
            z.hold(p.as_ptr(), order).unwrap();
            assert_eq!(z.check_invariants(), Ok(1 << order), "order {order}: a held block counts as allocated");
            assert_eq!(z.free_pages(p.as_ptr(), order), Err(Error::Held { pfn }), "order {order}");
            assert_eq!(z.free_pages(p.as_ptr(), order), Err(Error::Held { pfn }), "order {order}, again");
            assert_eq!(z.hold(p.as_ptr(), order), Err(Error::Held { pfn }), "order {order}: held already");
            assert_eq!(z.check_invariants(), Ok(1 << order), "order {order}: the refused frees changed nothing");
            // SAFETY: this test holds the block.
            assert_eq!(unsafe { z.free_held(p.as_ptr(), order) }, Ok(()), "order {order}");
            assert_eq!(z.check_invariants(), Ok(0), "order {order}: the block is free");
            // SAFETY: as above; the hold was freed once, so this is the holder's double free.
            let again = unsafe { z.free_held(p.as_ptr(), order) };
            assert_eq!(again, Err(Error::DoubleFree { pfn }), "order {order}");
            let r = z.hold(p.as_ptr(), order);
            assert_eq!(r, Err(Error::DoubleFree { pfn }), "order {order}: a free block cannot be held");
        }
    }
    all_free(&z);
}

#[test]
fn bulk_and_c_frees_of_a_held_frame_are_refused() {
    let z = zonal("nodes=1,size=16M");
    // Bulk frees of 2, 4 (the few-page path) and 20 (the run path) frames, the held one in
    // the middle: every other frame is freed, the held one reported with its index.
    for n in [2usize, 4, 20] {
        let mut pages: Vec<*mut u8> = (0..n).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr()).collect();
        let held = pages[n / 2];
        z.hold(held, 0).unwrap();
        let pfn = z.addr_to_pfn(held).unwrap();
        assert_eq!(z.free_pages_bulk(&pages), Err((n / 2, Error::Held { pfn })), "{n} frames");
        assert_eq!(z.check_invariants(), Ok(1), "{n} frames: all but the held one were freed");
        pages.retain(|&p| p != held);
        // SAFETY: a live handle, and an address checked, never dereferenced.
        let rc = unsafe { zonal::ffi::zonal_free_pages(&z, held.cast(), 0) };
        assert_eq!(rc, -libc::EBUSY, "the C ABI's errno for a held block");
        let mut bad = usize::MAX;
        let list = [held.cast::<libc::c_void>()];
        // SAFETY: `list` holds one pointer; `bad` is writable.
        let rc = unsafe { zonal::ffi::zonal_free_pages_bulk(&z, list.as_ptr(), 1, &mut bad) };
        assert_eq!((rc, bad), (-libc::EBUSY, 0));
        assert_eq!(z.check_invariants(), Ok(1));
        // SAFETY: this test holds the frame.
        unsafe { z.free_held(held, 0) }.unwrap();
    }
    all_free(&z);
}

#[test]
fn holder_errors_and_unhold() {
    let z = zonal("nodes=1,size=16M");
    let p = z.alloc_pages(Gfp::KERNEL, 2).unwrap().as_ptr();
    let pfn = z.addr_to_pfn(p).unwrap();
    // SAFETY: this test is the only user of the handle's blocks, and holds `p` from its
    // `hold` below to its `unhold`.
    unsafe {
        assert_eq!(z.free_held(p, 2), Err(Error::NotHeld { pfn }), "a live block that is not held");
        assert_eq!(z.unhold(p, 2), Err(Error::NotHeld { pfn }));
        z.hold(p, 2).unwrap();
        let r = z.free_held(p, 1);
        assert_eq!(
            r,
            Err(Error::OrderMismatch {
                pfn,
                allocated: zonal::Order::new(2).unwrap(),
                freed: zonal::Order::new(1).unwrap()
            })
        );
        let interior = p.wrapping_add(PAGE);
        assert!(matches!(z.free_pages(interior, 0), Err(Error::InteriorFrame { .. })));
        assert!(matches!(z.free_held(interior, 0), Err(Error::InteriorFrame { .. })));
        assert!(matches!(z.hold(p.wrapping_add(1), 0), Err(Error::Misaligned { .. })));
        let mut x = 0u64;
        assert!(matches!(z.hold((&raw mut x).cast(), 0), Err(Error::NotOwned { .. })));
        assert!(matches!(z.hold(p, 99), Err(Error::InvalidOrder { .. })));
        z.unhold(p, 2).unwrap();
        assert_eq!(z.unhold(p, 2), Err(Error::NotHeld { pfn }));
    }
    // Unheld, it is a plain block again.
    z.free_pages(p, 2).unwrap();
    all_free(&z);
}

#[test]
fn a_held_block_splits_into_held_frames() {
    let z = zonal("nodes=1,size=16M");
    let p = z.alloc_pages(Gfp::KERNEL, 3).unwrap().as_ptr();
    z.hold(p, 3).unwrap();
    z.split_pages(p, 3).unwrap();
    assert_eq!(z.check_invariants(), Ok(8), "split frames are allocated");
    for i in 0..8 {
        let f = p.wrapping_add(i * PAGE);
        let pfn = z.addr_to_pfn(f).unwrap();
        assert_eq!(z.free_pages(f, 0), Err(Error::Held { pfn }), "frame {i} stays held");
    }
    assert_eq!(z.check_invariants(), Ok(8));
    for i in 0..8 {
        // SAFETY: this test holds every frame of the split block.
        unsafe { z.free_held(p.wrapping_add(i * PAGE), 0) }.unwrap();
    }
    // A plain block splits into plain frames, as before.
    let q = z.alloc_pages(Gfp::KERNEL, 1).unwrap().as_ptr();
    z.split_pages(q, 1).unwrap();
    z.free_pages(q, 0).unwrap();
    z.free_pages(q.wrapping_add(PAGE), 0).unwrap();
    all_free(&z);
}

/// Runs `f` on another thread and waits for it: `None` if it did not return within a minute,
/// a bound for a test that must not hang, not a measure of speed.
fn on_another_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60)).ok()
}

#[test]
fn the_approximate_free_count_takes_no_lock() {
    let z = std::sync::Arc::new(zonal("nodes=2,size=16M"));
    let held: Vec<_> = (0..100).map(|_| z.alloc_pages_node(NodeId(1), Gfp::THISNODE, 0).unwrap()).collect();
    z.drain_all_pages();
    let exact = z.nr_free_pages(NodeId(1)).unwrap();
    assert_eq!(z.nr_free_pages_approx(NodeId(1)), Ok(exact), "quiescent, the two agree");
    assert_eq!(z.nr_free_pages_approx(NodeId(2)), Err(Error::InvalidNode { node: NodeId(2), nr_nodes: 2 }));
    let (z2, z3) = (std::sync::Arc::clone(&z), std::sync::Arc::clone(&z));
    // The exact count waits for the housekeeping pass the hook holds: started inside the
    // hook, it has not returned when the hook's closure ends, and returns after.
    let (exact_tx, exact_rx) = mpsc::channel();
    let approx = z.hold_every_lock(|| {
        std::thread::spawn(move || {
            let _ = exact_tx.send(z3.nr_free_pages(NodeId(1)).unwrap());
        });
        let approx = on_another_thread(move || z2.nr_free_pages_approx(NodeId(1)).unwrap());
        assert!(exact_rx.try_recv().is_err(), "nr_free_pages returned while the pass was held");
        approx
    });
    assert_eq!(approx, Some(exact), "nr_free_pages_approx waited for a lock");
    assert_eq!(exact_rx.recv().unwrap(), exact);
    for p in held {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    all_free(&z);
}

#[test]
fn every_lock_is_released_after_the_hook() {
    let z = zonal("nodes=2,size=16M");
    let n = z.hold_every_lock(|| 7);
    assert_eq!(n, 7);
    let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    z.free_pages(p.as_ptr(), 0).unwrap();
    all_free(&z);
}
