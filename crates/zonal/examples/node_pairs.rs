//! Within-node scaling, with its control: T threads doing order-0 alloc + free pairs on one
//! zone shared by every CPU (`nodes=1`), against the same threads each on a handle of its own
//! (nothing of zonal's shared), in alternating repetitions. What the shared handle loses
//! beyond the per-thread handles is what the CPUs of one node share in zonal; what both lose
//! is the machine's (SMT siblings, frequency):
//! `cargo run --release -p zonal --features examples --example node_pairs -- [reps] [pairs]`.

use std::time::Instant;
use zonal::{Config, Gfp, Topology, Zonal};

fn handle() -> Zonal {
    Zonal::new(Config::new(Topology::parse("nodes=1,size=128M").expect("topology"))).expect("zonal")
}

/// ns per pair per thread, `threads` threads each on `zs[t % zs.len()]`, each pinned to CPU t.
fn cell(zs: &[Zonal], threads: usize, n: u64) -> f64 {
    let barrier = std::sync::Barrier::new(threads);
    let per: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (z, barrier) = (&zs[t % zs.len()], &barrier);
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
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    per.iter().sum::<f64>() / per.len() as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(11);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2_000_000);
    let shared = [handle()];
    let own = [handle(), handle()];
    let (mut s_ratio, mut o_ratio) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let (s1, o1) = (cell(&shared, 1, n), cell(&own, 1, n));
        let (s2, o2) = (cell(&shared, 2, n), cell(&own, 2, n));
        s_ratio.push(s1 / s2);
        o_ratio.push(o1 / o2);
    }
    println!(
        "per-thread rate at T = 2 against T = 1: one shared zone {:.0}%, a handle per thread {:.0}% (medians of {reps})",
        median(s_ratio) * 100.0,
        median(o_ratio) * 100.0
    );
}
