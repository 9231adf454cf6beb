//! Multi-threaded stress: threads allocate blocks of random orders from random nodes and
//! policies, hand some to other threads to free, race double frees, and move between CPUs
//! (`sched_setaffinity`) mid-run. Every handed-out block is recorded in a shared live set
//! that proves, at each step, that no frame is handed out twice; at the end every frame is
//! back, the invariants hold and the zones are maximal blocks again.

use std::collections::BTreeMap;
use std::sync::{Barrier, Mutex};
use zonal::topology::Machine;
use zonal::{Config, Error, Gfp, MemPolicy, NodeId, NodeMask, Topology, Zonal};

const THREADS: usize = 4;
const STEPS: usize = 100_000;

fn zonal(pcp: bool) -> Zonal {
    let m = Machine::current().unwrap();
    let t = Topology::parse_for("nodes=3,sizes=4M:4M:2M", m).unwrap();
    Zonal::new(Config::new(t).pcp(pcp)).unwrap()
}

/// Live blocks by address, checked for overlap on every insert.
struct LiveSet(Mutex<BTreeMap<usize, usize>>);

impl LiveSet {
    fn insert(&self, addr: usize, order: u32) {
        let len = 4096usize << order;
        let mut m = self.0.lock().unwrap();
        if let Some((&a, &l)) = m.range(..=addr).next_back() {
            assert!(a + l <= addr, "block {addr:#x} overlaps live block {a:#x}");
        }
        if let Some((&a, _)) = m.range(addr..).next() {
            assert!(addr + len <= a, "block {addr:#x} overlaps live block {a:#x}");
        }
        m.insert(addr, len);
    }
    fn remove(&self, addr: usize) {
        assert!(self.0.lock().unwrap().remove(&addr).is_some());
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn stress(pcp: bool, move_cpus: bool) {
    let z = zonal(pcp);
    let initial = z.buddyinfo();
    let live = LiveSet(Mutex::new(BTreeMap::new()));
    // Blocks handed to other threads to free: (addr, order).
    let handoff: Mutex<Vec<(usize, u32)>> = Mutex::new(Vec::new());
    let nproc = zonal::sys::nr_cpus_online() as u32;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (z, live, handoff) = (&z, &live, &handoff);
            s.spawn(move || {
                let mut rng = Rng(0x9e37_79b9 + t as u64 * 7919);
                let mut mine: Vec<(usize, u32)> = Vec::new();
                if t % 2 == 1 {
                    z.set_thread_policy(MemPolicy::Interleave(NodeMask::parse("0-2").unwrap())).unwrap();
                }
                for step in 0..STEPS {
                    if move_cpus && step % 997 == 0 {
                        zonal::sys::set_affinity((rng.next() % nproc as u64) as u32).unwrap();
                    }
                    match rng.next() % 10 {
                        0..=4 => {
                            let order = (rng.next() % 5) as u32;
                            let r = match rng.next() % 3 {
                                0 => z.alloc_pages(Gfp::KERNEL, order),
                                1 => z.alloc_pages_node(NodeId((rng.next() % 3) as u16), Gfp::KERNEL, order),
                                _ => z.alloc_pages_node(NodeId((rng.next() % 3) as u16), Gfp::THISNODE, order),
                            };
                            match r {
                                Ok(p) => {
                                    live.insert(p.as_ptr() as usize, order);
                                    mine.push((p.as_ptr() as usize, order));
                                }
                                Err(Error::OutOfMemory { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                        5 | 6 => {
                            if let Some(b) = mine.pop() {
                                live.remove(b.0);
                                z.free_pages(b.0 as *mut u8, b.1).unwrap();
                            }
                        }
                        7 => {
                            if let Some(b) = mine.pop() {
                                handoff.lock().unwrap().push(b);
                            }
                        }
                        8 => {
                            let b = handoff.lock().unwrap().pop();
                            if let Some(b) = b {
                                live.remove(b.0);
                                z.free_pages(b.0 as *mut u8, b.1).unwrap();
                            }
                        }
                        _ => {
                            let mut list = Vec::new();
                            let n = z.alloc_pages_bulk_list(Gfp::KERNEL, (rng.next() % 16) as usize, &mut list);
                            assert_eq!(n, list.len());
                            for p in &list {
                                live.insert(p.as_ptr() as usize, 0);
                            }
                            for p in &list {
                                live.remove(p.as_ptr() as usize);
                            }
                            let ptrs: Vec<*mut u8> = list.iter().map(|p| p.as_ptr()).collect();
                            assert_eq!(z.free_pages_bulk(&ptrs), Ok(n));
                        }
                    }
                }
                for b in mine {
                    live.remove(b.0);
                    z.free_pages(b.0 as *mut u8, b.1).unwrap();
                }
                let _ = zonal::sys::allow_all_cpus();
            });
        }
    });
    for (a, o) in handoff.into_inner().unwrap() {
        live.remove(a);
        z.free_pages(a as *mut u8, o).unwrap();
    }
    assert!(live.0.lock().unwrap().is_empty());
    assert_eq!(z.check_invariants(), Ok(0), "every frame is free or on a pcp list, once");
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
    for n in 0..3u16 {
        let managed: usize = z.zones()[n as usize].managed;
        assert_eq!(z.nr_free_pages(NodeId(n)).unwrap(), managed);
    }
    assert_eq!(z.buddyinfo(), initial);
}

#[test]
fn threads_with_cross_frees_pcp() {
    stress(true, false);
}

#[test]
fn threads_with_cross_frees_buddy_only() {
    stress(false, false);
}

#[test]
fn threads_moving_between_cpus() {
    stress(true, true);
}

#[test]
fn racing_double_frees_exactly_one_wins() {
    let z = zonal(true);
    // Racing frees of one frame are a data race in the caller; the CAS claim arbitrates them.
    z.set_free_check_atomic(true);
    for round in 0..2000 {
        let order = (round % 4) as u32;
        let p = z.alloc_pages(Gfp::KERNEL, order).unwrap().as_ptr() as usize;
        let barrier = Barrier::new(2);
        let results: Vec<Result<(), Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        z.free_pages(p as *mut u8, order)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "round {round}: {results:?}");
        assert!(results.iter().any(|r| matches!(r, Err(Error::DoubleFree { .. }))));
    }
    assert_eq!(z.check_invariants(), Ok(0));
}
