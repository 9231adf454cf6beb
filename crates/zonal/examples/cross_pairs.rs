//! Cross-CPU frees, pinned: one thread allocates order-0 frames on CPU 0 and hands them over
//! a single-producer single-consumer ring to a thread on CPU 1 that frees them (RX buffers
//! freed by workers), against the same ring carrying frames a thread of CPU 1 never frees
//! (the ring alone), in alternating repetitions; ns per frame:
//! `cargo run --release -p zonal --features examples --example cross_pairs -- [reps] [frames]`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use zonal::{Config, Gfp, Topology, Zonal};

const RING: usize = 256;

/// A bounded single-producer single-consumer ring of addresses, head and tail on lines of
/// their own.
struct Ring {
    slots: Vec<AtomicUsize>,
    head: crossbeam_pad::Padded,
    tail: crossbeam_pad::Padded,
}

mod crossbeam_pad {
    /// A counter on a line of its own.
    #[repr(align(128))]
    #[derive(Default)]
    pub struct Padded(pub std::sync::atomic::AtomicUsize);
}

fn run(z: &Zonal, n: usize, free: bool) -> f64 {
    let r = Ring {
        slots: (0..RING).map(|_| AtomicUsize::new(0)).collect(),
        head: Default::default(),
        tail: Default::default(),
    };
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = zonal::cpu::set_affinity(1);
            for i in 0..n {
                while r.head.0.load(Ordering::Acquire) == i {
                    std::hint::spin_loop();
                }
                let p = r.slots[i % RING].load(Ordering::Relaxed);
                r.tail.0.store(i + 1, Ordering::Release);
                if free {
                    z.free_pages(p as *mut u8, 0).expect("free");
                }
            }
        });
        let _ = zonal::cpu::set_affinity(0);
        let mut kept = Vec::new();
        for i in 0..n {
            while i - r.tail.0.load(Ordering::Acquire) >= RING {
                std::hint::spin_loop();
            }
            let p = if free || kept.len() < RING {
                let p = z.alloc_pages(Gfp::KERNEL, 0).expect("alloc").as_ptr() as usize;
                if !free {
                    kept.push(p);
                }
                p
            } else {
                kept[i % RING]
            };
            r.slots[i % RING].store(p, Ordering::Relaxed);
            r.head.0.store(i + 1, Ordering::Release);
        }
        for p in kept {
            z.free_pages(p as *mut u8, 0).expect("free");
        }
    });
    let _ = zonal::cpu::allow_all_cpus();
    t.elapsed().as_nanos() as f64 / n as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(9);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(500_000);
    let z = Zonal::new(Config::new(Topology::parse("nodes=2,size=64M").expect("topology"))).expect("zonal");
    let (mut cross, mut ring) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        cross.push(run(&z, n, true));
        ring.push(run(&z, n, false));
    }
    println!(
        "cross-CPU alloc and free: {:.1} ns per frame; the ring alone: {:.1} ns (medians of {reps})",
        median(cross),
        median(ring)
    );
}
