//! Within-node scaling before and after cross-CPU frees (issue 38): on one zone shared by
//! CPUs 0 and 1, the per-thread time of order-0 alloc + free pairs at T = 2 against T = 1,
//! on a fresh handle and on the same handle after a phase where CPU 0 allocates and CPU 1
//! frees (what `zonal bench cross` does), with the ideal per-thread stack as control:
//! `cargo run --release -p zonal --features examples --example owner_pairs -- [reps] [pairs] [cross frames]`.
//! Each repetition builds a fresh handle; medians over the repetitions.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Instant;
use zonal::{Config, Gfp, Topology, Zonal};

/// Mean ns per pair per thread of `n` pairs on each of `threads` threads (thread `t` on CPU
/// `t`), started together.
fn pairs(z: &Zonal, threads: usize, n: u64) -> f64 {
    let barrier = Barrier::new(threads);
    let per: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let _ = zonal::cpu::set_affinity(t as u32);
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..n {
                        let p = z.alloc_pages(Gfp::KERNEL, 0).expect("alloc");
                        z.free_pages(std::hint::black_box(p.as_ptr()), 0).expect("free");
                    }
                    start.elapsed().as_nanos() as f64 / n as f64
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    per.iter().sum::<f64>() / threads as f64
}

/// The same loop over a per-thread stack of 64 pages (no allocator): what the machine allows.
fn ideal(threads: usize, n: u64) -> f64 {
    let barrier = Barrier::new(threads);
    let per: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let _ = zonal::cpu::set_affinity(t as u32);
                    let mut stack: Vec<usize> = (0..64).map(|i| 0x1000 * (i + 1)).collect();
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..n {
                        let p = stack.pop().unwrap();
                        stack.push(std::hint::black_box(p));
                    }
                    start.elapsed().as_nanos() as f64 / n as f64
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    per.iter().sum::<f64>() / threads as f64
}

/// CPU 0 allocates `n` frames and hands them over a ring of 256 to CPU 1, which frees them.
fn cross(z: &Zonal, n: usize) {
    const RING: usize = 256;
    let slots: Vec<AtomicUsize> = (0..RING).map(|_| AtomicUsize::new(0)).collect();
    let (head, tail) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = zonal::cpu::set_affinity(1);
            for i in 0..n {
                while head.load(Ordering::Acquire) == i {
                    std::hint::spin_loop();
                }
                let p = slots[i % RING].load(Ordering::Relaxed);
                tail.store(i + 1, Ordering::Release);
                z.free_pages(p as *mut u8, 0).expect("free");
            }
        });
        s.spawn(|| {
            let _ = zonal::cpu::set_affinity(0);
            for i in 0..n {
                while i - tail.load(Ordering::Acquire) >= RING {
                    std::hint::spin_loop();
                }
                let p = z.alloc_pages(Gfp::KERNEL, 0).expect("alloc").as_ptr() as usize;
                slots[i % RING].store(p, Ordering::Relaxed);
                head.store(i + 1, Ordering::Release);
            }
        });
    });
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5_000_000);
    let frames: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let spec = std::env::var("OWNER_TOPOLOGY").unwrap_or_else(|_| "nodes=1,size=256M".into());
    let (mut fresh, mut after, mut ideals) = (Vec::new(), Vec::new(), Vec::new());
    let (mut f1s, mut f2s, mut t1s, mut t2s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        let z = Zonal::new(Config::new(Topology::parse(&spec).expect("topology"))).expect("zonal");
        let (f1, f2) = (pairs(&z, 1, n), pairs(&z, 2, n));
        cross(&z, frames);
        let (a1, a2) = (pairs(&z, 1, n), pairs(&z, 2, n));
        let (i1, i2) = (ideal(1, n), ideal(2, n));
        fresh.push(f2 / f1);
        after.push(a2 / a1);
        ideals.push(i2 / i1);
        f1s.push(f1);
        f2s.push(f2);
        t1s.push(a1);
        t2s.push(a2);
        assert_eq!(z.check_invariants(), Ok(0));
    }
    println!(
        "{spec}: T=2 per-pair time over T=1: fresh {:.2}× ({:.2} / {:.2} ns), after cross {:.2}× \
         ({:.2} / {:.2} ns); ideal stack {:.2}× (medians of {reps})",
        median(fresh),
        median(f2s),
        median(f1s),
        median(after),
        median(t2s),
        median(t1s),
        median(ideals)
    );
}
