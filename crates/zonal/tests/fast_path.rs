//! The order-0 fast path (rseq cache): that it runs where rseq is available, and that a
//! thread policy on one handle leaves the fast path of every other handle alone, while the
//! handle lives and after it is dropped on another thread.
//!
//! Handles are built one at a time (`BUILD`), so the handles of one test get consecutive ids
//! and the per-thread policy bits (`handle id % 64`) of two handles of a test never collide.
//!
//! A test binary of its own, not a module of tests/suite: handle ids are process-wide, and
//! other tests building handles at the same time would break the consecutive ids above (two
//! ids 64 apart share a policy bit); and the fast path's share of allocations
//! (`>= 128 of 256`) assumes no other test's threads preempting these on both CPUs.

use std::sync::{mpsc, Arc, Mutex};

use zonal::topology::Machine;
use zonal::{Config, Gfp, MemPolicy, NodeId, Topology, VmEvent, Zonal};

static BUILD: Mutex<()> = Mutex::new(());

/// Two handles with consecutive ids.
fn two() -> (Zonal, Zonal) {
    let _g = BUILD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    (handle(), handle())
}

fn handle() -> Zonal {
    let t = Topology::parse_for("nodes=1,size=16M", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    Zonal::new(Config::new(t)).unwrap()
}

/// Whether the rseq fast path must run in this process. Where it legitimately cannot, says
/// why on stderr and checks that the allocator agrees; never skips silently.
fn rseq_expected() -> bool {
    let why_not = if std::env::var_os("ZONAL_NO_RSEQ").is_some() {
        Some("ZONAL_NO_RSEQ is set")
    } else if !cfg!(target_arch = "x86_64") {
        Some("the rseq sections are x86-64 only")
    } else if !zonal::cpu::glibc_rseq_registered() {
        Some("glibc registered no rseq area (e.g. GLIBC_TUNABLES=glibc.pthread.rseq=0)")
    } else if !zonal::cpu::membarrier_rseq() {
        Some("the kernel has no membarrier PRIVATE_EXPEDITED_RSEQ")
    } else {
        None
    };
    match why_not {
        Some(why) => {
            eprintln!("SKIPPED (fast path legitimately off): {why}");
            assert!(!zonal::cpu::rseq_fast_path(), "rseq reported on although {why}");
            false
        }
        None => {
            assert!(zonal::cpu::rseq_fast_path(), "rseq and membarrier are available, but the fast path is off");
            true
        }
    }
}

/// Frames of `n` order-0 allocations (each freed at once) that took the fast path.
fn fast_allocs(z: &Zonal, n: usize) -> u64 {
    let before = z.fast_path_allocs();
    for _ in 0..n {
        let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    z.fast_path_allocs() - before
}

#[test]
fn the_order0_fast_path_runs() {
    let z = handle();
    let expected = rseq_expected();
    let before = z.event(VmEvent::PgallocNormal);
    let fast = fast_allocs(&z, 256);
    // Every allocation is counted once, whichever path took it.
    assert_eq!(z.event(VmEvent::PgallocNormal) - before, 256);
    if expected {
        // The first allocation refills the cache through the locked path; after that a pop
        // fails only when the thread is preempted or migrated inside the section.
        assert!(fast >= 128, "only {fast} of 256 allocations took the fast path");
    } else {
        assert_eq!(fast, 0);
    }
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn a_policy_on_another_live_handle_leaves_the_fast_path_on() {
    let expected = rseq_expected();
    let (a, b) = two();
    std::thread::scope(|s| {
        s.spawn(|| {
            a.set_thread_policy(MemPolicy::Preferred(NodeId(0))).unwrap();
            let fast_b = fast_allocs(&b, 256);
            // A's own allocations follow its policy: the general path.
            assert_eq!(fast_allocs(&a, 64), 0);
            if expected {
                assert!(fast_b >= 128, "handle B: only {fast_b} of 256 allocations took the fast path");
            } else {
                assert_eq!(fast_b, 0);
            }
            // Cleared, A takes the fast path again.
            a.set_thread_policy(MemPolicy::Local).unwrap();
            let fast_a = fast_allocs(&a, 256);
            assert_eq!(fast_a >= 128, expected, "handle A after clearing: {fast_a} of 256 fast");
        });
    });
}

#[test]
fn a_policy_on_a_handle_dropped_elsewhere_leaves_the_fast_path_on() {
    let expected = rseq_expected();
    let (a, b) = two();
    let a = Arc::new(a);
    let (to_main, from_thread) = mpsc::channel();
    let (to_thread, from_main) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let a2 = Arc::clone(&a);
        let b = &b;
        s.spawn(move || {
            a2.set_thread_policy(MemPolicy::Preferred(NodeId(0))).unwrap();
            drop(a2);
            to_main.send(()).unwrap();
            // The main thread drops A: this thread's entry for it is now stale.
            from_main.recv().unwrap();
            let fast_b = fast_allocs(b, 256);
            if expected {
                assert!(fast_b >= 128, "handle B: only {fast_b} of 256 allocations took the fast path");
            } else {
                assert_eq!(fast_b, 0);
            }
        });
        from_thread.recv().unwrap();
        let a = Arc::into_inner(a).expect("the thread let go of A");
        drop(a);
        to_thread.send(()).unwrap();
    });
}

/// Past its cache (always, without rseq) order 0 takes this CPU's lists under their lock,
/// skipping the zonelist walk, only where the walk would give the same answer: a thread
/// policy sends it to the walk, and so does a local zone below `low` although its lists
/// hold frames (the walk then finds every zone below `min` and fails).
#[test]
fn the_locked_order0_path_keeps_the_policy_and_the_watermarks() {
    let _ = rseq_expected();
    let t = Topology::parse_for("nodes=2,size=16M", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    let z = Zonal::new(Config::new(t)).unwrap();
    let _ = zonal::cpu::set_affinity(0);
    let local = z.local_node();
    let other = NodeId(1 - local.0);
    // Frames on both nodes' lists of this CPU.
    for nid in [local, other] {
        let held: Vec<_> = (0..64).map(|_| z.alloc_pages_node(nid, Gfp::KERNEL, 0).unwrap()).collect();
        for p in held {
            z.free_pages(p.as_ptr(), 0).unwrap();
        }
    }
    z.set_thread_policy(MemPolicy::Preferred(other)).unwrap();
    let held: Vec<_> = (0..64).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
    for p in &held {
        assert_eq!(z.page_to_nid(p.as_ptr()), Ok(other), "the thread policy prefers node {}", other.0);
    }
    for p in held {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    z.set_thread_policy(MemPolicy::Local).unwrap();
    let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    z.free_pages(p.as_ptr(), 0).unwrap();
    // Every zone's `min` at all it manages: nothing passes any watermark, and the frames on
    // the lists are not handed out past them.
    z.set_min_free_kbytes(32 << 10).unwrap();
    assert!(matches!(z.alloc_pages(Gfp::KERNEL, 0), Err(zonal::Error::OutOfMemory { .. })));
    z.set_min_free_kbytes(1024).unwrap();
    let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap();
    z.free_pages(p.as_ptr(), 0).unwrap();
    assert_eq!(z.check_invariants(), Ok(0));
}
