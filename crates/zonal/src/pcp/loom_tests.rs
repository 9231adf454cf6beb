//! loom models of the pcp protocol: a try-lock that gives way to the buddy path, racing an
//! allocation, a free and a remote drain on one CPU's lists. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p zonal --release --lib loom_`.
//!
//! Kernel counterpart: none (the kernel's lists are per-CPU with preemption off; zonal's
//! try-lock is what lets a thread preempted or migrated mid-operation give way). Locking:
//! the models take the lists' lock as the allocation and free paths do (try-lock, falling
//! back to the zone lock) and as a remote drain does (blocking). Invariant checked after
//! every interleaving: the zone's and the lists' invariants hold and every frame is
//! accounted exactly once (free in the buddy, on the lists, or allocated).

use super::*;
use crate::mem_map::ALLOCATED;
use crate::types::{NodeId, ZoneId};
use loom::sync::Arc;

fn setup() -> (Arc<Zone>, Arc<PerCpuPages>) {
    let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 8, Order(2));
    (Arc::new(z), Arc::new(PerCpuPages::new(0, 1, 4, 4)))
}

/// The allocation path: pcp if the try-lock succeeds, else the buddy lists.
fn alloc(z: &Zone, pcp: &PerCpuPages) -> Option<Pfn> {
    let pfn = match pcp.try_lock(&z) {
        Some(mut g) => g.with(|p| rmqueue_pcplist(z, p, Order(0)))?,
        None => {
            let mut l = z.lock();
            let p = l.buddy().rmqueue_smallest(Order(0))?;
            p
        }
    };
    z.state(pfn).store(mem_map::state(ALLOCATED, Order(0)), Ordering::Release);
    Some(pfn)
}

/// The free path: claim by CAS, then pcp if the try-lock succeeds, else the buddy lists.
fn free(z: &Zone, pcp: &PerCpuPages, pfn: Pfn) -> bool {
    let claimed = z
        .state(pfn)
        .compare_exchange(mem_map::state(ALLOCATED, Order(0)), mem_map::NONE, Ordering::Acquire, Ordering::Relaxed)
        .is_ok();
    if !claimed {
        return false;
    }
    match pcp.try_lock(&z) {
        Some(mut g) => {
            g.with(|p| free_to_pcp(z, p, pfn, Order(0)));
        }
        None => {
            let mut l = z.lock();
            l.buddy().free_one(pfn, Order(0));
        }
    }
    true
}

fn check_all(z: &Zone, pcp: &PerCpuPages, live: usize) {
    let on_pcp = pcp.lock(&z).with(|p| check(z, p)).unwrap();
    assert_eq!(z.check_invariants(on_pcp), Ok(live));
}

#[test]
fn loom_alloc_free_drain_race() {
    loom::model(|| {
        let (z, pcp) = setup();
        let first = alloc(&z, &pcp).unwrap();
        let t1 = {
            let (z, pcp) = (z.clone(), pcp.clone());
            loom::thread::spawn(move || alloc(&z, &pcp))
        };
        let t2 = {
            let (z, pcp) = (z.clone(), pcp.clone());
            loom::thread::spawn(move || assert!(free(&z, &pcp, first)))
        };
        pcp.lock(&z).with(|p| drain(&z, p));
        let second = t1.join().unwrap().expect("128 frames: the allocation cannot fail");
        t2.join().unwrap();
        assert_ne!(second, Pfn(usize::MAX));
        check_all(&z, &pcp, 1);
    });
}

#[test]
fn loom_double_free_exactly_one_wins() {
    loom::model(|| {
        let (z, pcp) = setup();
        let p = alloc(&z, &pcp).unwrap();
        let t = {
            let (z, pcp) = (z.clone(), pcp.clone());
            loom::thread::spawn(move || free(&z, &pcp, p))
        };
        let here = free(&z, &pcp, p);
        let there = t.join().unwrap();
        assert!(here ^ there, "exactly one of two racing frees succeeds");
        check_all(&z, &pcp, 0);
    });
}

/// The THP list's holders take the lock lists-only (no cache flush, no fence): a failed
/// attempt must leave the lock to its holder. A pageblock-order allocation and free race an
/// order-0 allocation and a remote drain on one CPU's lists; loom's cell checks that no two
/// holders ever reach the lists at once.
#[test]
fn loom_thp_holder_races_small_orders_and_a_drain() {
    // A pageblock is 512 frames: the checks' state loads alone pass loom's default branch
    // bound (they run after the joins, with nothing left to interleave).
    let mut model = loom::model::Builder::new();
    model.max_branches = 20_000;
    model.check(|| {
        let z = Arc::new(Zone::new(ZoneId(0), NodeId(0), Pfn(0), 2048, Order(9)));
        let pcp = Arc::new(PerCpuPages::new(0, 1, 4, 4));
        let huge = {
            let (z, pcp) = (z.clone(), pcp.clone());
            loom::thread::spawn(move || {
                // As the paths do: a busy lock sends each operation to the buddy lists.
                let thp = PCP_THP_ORDER;
                let pfn = match pcp.try_lock_lists(&z) {
                    Some(mut g) => g.with(|p| rmqueue_pcplist(&z, p, thp)),
                    None => z.lock().buddy().rmqueue_smallest(thp),
                }
                .expect("four blocks, the THP list takes two at most");
                z.state(pfn).store(mem_map::state(ALLOCATED, thp), Ordering::Release);
                let claim = z.state(pfn).compare_exchange(
                    mem_map::state(ALLOCATED, thp),
                    mem_map::NONE,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                );
                assert!(claim.is_ok());
                match pcp.try_lock_lists(&z) {
                    Some(mut g) => {
                        g.with(|p| free_to_pcp(&z, p, pfn, thp));
                    }
                    None => {
                        z.lock().buddy().free_one(pfn, thp);
                    }
                }
            })
        };
        let small = alloc(&z, &pcp).expect("the THP list holds two of four blocks at most");
        pcp.lock(&z).with(|p| drain(&z, p));
        huge.join().unwrap();
        pcp.lock(&z).with(|p| drain(&z, p));
        check_all(&z, &pcp, 1);
        assert_eq!(z.state(small).load(Ordering::Relaxed), mem_map::state(ALLOCATED, Order(0)));
    });
}

/// Run ownership (issue 38): two CPUs' lists of one zone, which the zone knows (so a free
/// can route a frame to its run's owner). CPU 0's refill owns the zone's run; CPU 1 frees
/// a frame of it (into its outbox, as the locked free does without rseq) and delivers it to
/// CPU 0's inbox, racing CPU 0's allocation (whose refill may take the inbox first) and a
/// drain of CPU 0's lists (which empties its inbox too). Every frame is accounted for once
/// after every interleaving: free, on a list, an outbox or an inbox, or allocated.
#[test]
fn loom_foreign_free_goes_to_the_owner_racing_its_refill_and_a_drain() {
    loom::model(|| {
        let z = Arc::new(Zone::new(ZoneId(0), NodeId(0), Pfn(0), 128, Order(2)));
        let pcps: std::sync::Arc<[PerCpuPages]> = (0..2).map(|c| PerCpuPages::new(c, 1, 4, 4).routing()).collect();
        crate::pcp::ZoneLists::install(&z, std::sync::Arc::clone(&pcps), 1);
        let first = alloc(&z, &pcps[0]).unwrap();
        assert_eq!(z.run_owner(first), 0, "CPU 0's refill owns the run");
        let freer = {
            let (z, pcps) = (z.clone(), std::sync::Arc::clone(&pcps));
            loom::thread::spawn(move || {
                assert!(free(&z, &pcps[1], first));
                // What a full outbox's holder does on unlock.
                pcps[1].lock(&z).with(|p| lists::deliver(&z, p));
            })
        };
        let allocator = {
            let (z, pcps) = (z.clone(), std::sync::Arc::clone(&pcps));
            loom::thread::spawn(move || alloc(&z, &pcps[0]))
        };
        pcps[0].lock(&z).with(|p| drain(&z, p));
        freer.join().unwrap();
        let second = allocator.join().unwrap().expect("128 frames: the allocation cannot fail");
        assert_ne!(second, Pfn(usize::MAX));
        let mut on_pcp = 0;
        for (c, pcp) in pcps.iter().enumerate() {
            on_pcp += pcp.lock(&z).with(|p| check(&z, p)).unwrap() + check_inbox(&z, c).unwrap();
        }
        assert_eq!(pcps[1].lock(&z).with(|p| p.order0_list_len()), 0, "CPU 1 kept no frame of CPU 0's run");
        assert_eq!(z.check_invariants(on_pcp + check_transfer(&z).unwrap()), Ok(1));
    });
}
