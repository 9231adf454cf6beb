//! A caller's racing double frees under `free_check = sequential` (the default): two threads
//! free the same order-0 frames at once, with the bulk call and with single frees, and the
//! same blocks of orders 1 to 3 and 9 (whose frees claim them for their own rseq caches). Such a
//! race may go undetected (as with malloc), but it must never put a frame on the allocator's
//! own lists twice: once everything is freed and drained, every zone must hold exactly its
//! managed frames, each once (issue 10 part 3: two threads bulk-freeing the same 128 frames
//! drove `nr_free_pages` to 4106 of 4096).

use std::sync::atomic::{AtomicUsize, Ordering};
use zonal::topology::Machine;
use zonal::{Config, Gfp, NodeId, Topology, Zonal};

const MACHINE: Machine = Machine { nr_cpus: 2, mem_total: 1 << 30 };
/// As many racers as the test machines have CPUs; they spin so they start a round together.
const RACERS: usize = 2;
const ROUNDS: usize = 2000;

/// Frees won by two racers at once (undetected double frees): shows the race happened.
static DOUBLE_WINS: AtomicUsize = AtomicUsize::new(0);

/// Spins (racers must start within nanoseconds of each other to race) until `cell` reaches
/// `value`; yields now and then so that a preempted peer can run.
fn wait_for(cell: &AtomicUsize, value: usize) {
    let mut spins = 0u32;
    while cell.load(Ordering::Acquire) < value {
        spins += 1;
        // Rarely: a yield gives the CPU away for a whole time slice on a loaded machine,
        // and the racers would then hardly ever overlap.
        if spins % (1 << 20) == 0 {
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
}

/// Two racers free the same `frames` blocks of `order` (frames of order 0, by bulk and
/// single frees; blocks of a larger order by single frees), round after round.
fn racing_frees(spec: &str, order: u32, frames: usize) {
    let t = Topology::parse_for(spec, MACHINE).unwrap();
    let z = Zonal::new(Config::new(t)).unwrap();
    assert_eq!(z.sysctl_get("free_check").unwrap(), "sequential");
    let managed: usize = z.zones().iter().map(|zone| zone.managed).sum();
    // Round `i`: racer 0 allocates the frames into `round`, then sets `start` to `i + 1`; both
    // free them all; each adds one to `done`, and the round ends at `(i + 1) * RACERS`.
    let (start, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let round: Vec<AtomicUsize> = (0..frames).map(|_| AtomicUsize::new(0)).collect();
    let wins: Vec<AtomicUsize> = (0..frames).map(|_| AtomicUsize::new(0)).collect();
    std::thread::scope(|s| {
        for r in 0..RACERS {
            let (z, start, done, round, wins) = (&z, &start, &done, &round, &wins);
            s.spawn(move || {
                let mut list = Vec::with_capacity(frames);
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 + r as u64;
                for i in 0..ROUNDS {
                    if r == 0 {
                        wait_for(done, i * RACERS);
                        list.clear();
                        while list.len() < frames {
                            if order == 0 {
                                assert!(z.alloc_pages_bulk_list(Gfp::KERNEL, frames - list.len(), &mut list) > 0);
                            } else {
                                list.push(z.alloc_pages(Gfp::KERNEL, order).unwrap());
                            }
                        }
                        for (slot, p) in round.iter().zip(&list) {
                            slot.store(p.as_ptr() as usize, Ordering::Relaxed);
                        }
                        wins.iter().for_each(|w| w.store(0, Ordering::Relaxed));
                        start.store(i + 1, Ordering::Release);
                    } else {
                        wait_for(start, i + 1);
                    }
                    // Each racer in its own order, so that they meet on frames all along.
                    let mut shuffled: Vec<usize> = (0..frames).collect();
                    for k in (1..frames).rev() {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        shuffled.swap(k, (rng % (k as u64 + 1)) as usize);
                    }
                    let pages: Vec<*mut u8> =
                        shuffled.iter().map(|&k| round[k].load(Ordering::Relaxed) as *mut u8).collect();
                    // Round by round: both bulk, both single, one of each. Errors are
                    // expected: the other racer freed some frames first.
                    if order == 0 && ((i % 3 == 0) || (i % 3 == 2 && r == 0)) {
                        let _ = z.free_pages_bulk(&pages);
                    } else {
                        for (k, &p) in pages.iter().enumerate() {
                            if z.free_pages(p, order).is_ok() && wins[shuffled[k]].fetch_add(1, Ordering::Relaxed) == 1
                            {
                                DOUBLE_WINS.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    done.fetch_add(1, Ordering::AcqRel);
                }
            });
        }
    });
    eprintln!(
        "{spec}, {frames} blocks of order {order}: {} single frees passed twice",
        DOUBLE_WINS.swap(0, Ordering::Relaxed)
    );
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
    let free: usize = (0..z.topology().nr_nodes()).map(|n| z.nr_free_pages(NodeId(n as u16)).unwrap()).sum();
    assert_eq!(free, managed, "every frame is free, and only once");
}

#[test]
fn racing_double_frees_never_list_a_frame_twice() {
    racing_frees("nodes=1,size=16M", 0, 128);
    racing_frees("nodes=1,size=16M", 0, 1024);
    racing_frees("nodes=2,size=8M,cpus=0:1", 0, 512);
}

#[test]
fn racing_double_frees_of_small_orders_never_list_a_block_twice() {
    racing_frees("nodes=1,size=16M", 1, 64);
    racing_frees("nodes=1,size=16M", 3, 32);
    racing_frees("nodes=2,size=8M,cpus=0:1", 2, 64);
}

/// The pageblock order's blocks, whose frees claim them for the THP list's rseq cache.
#[test]
fn racing_double_frees_of_the_pageblock_order_never_list_a_block_twice() {
    racing_frees("nodes=1,size=64M", 9, 8);
    racing_frees("nodes=2,size=16M,cpus=0:1", 9, 4);
}
