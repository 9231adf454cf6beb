//! A loop of alloc + free pairs of one order, for profilers (`valgrind --tool=callgrind`,
//! `perf`): `cargo run --release -p zonal --features examples --example pairs -- [N] [ORDER]` (order 0 by
//! default; 1–3 and 9 take the per-CPU lists' locked paths).

use zonal::{Config, Gfp, Topology, Zonal};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000_000);
    let order: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let z = Zonal::new(Config::new(Topology::parse("nodes=2,size=64M").expect("topology"))).expect("zonal");
    let t = std::time::Instant::now();
    for _ in 0..n {
        let p = z.alloc_pages(Gfp::KERNEL, order).expect("alloc");
        z.free_pages(std::hint::black_box(p.as_ptr()), order).expect("free");
    }
    println!("{:.2} ns per pair of order {order}", t.elapsed().as_nanos() as f64 / n as f64);
}
