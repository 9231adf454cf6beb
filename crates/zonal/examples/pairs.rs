//! A loop of order-0 alloc + free pairs, for profilers (`valgrind --tool=callgrind`,
//! `perf`): `cargo run --release -p zonal --example pairs -- [N]`.

use zonal::{Config, Gfp, Topology, Zonal};

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10_000_000);
    let z = Zonal::new(Config::new(Topology::parse("nodes=2,size=64M").expect("topology"))).expect("zonal");
    let t = std::time::Instant::now();
    for _ in 0..n {
        let p = z.alloc_pages(Gfp::KERNEL, 0).expect("alloc");
        z.free_pages(std::hint::black_box(p.as_ptr()), 0).expect("free");
    }
    println!("{:.2} ns per pair", t.elapsed().as_nanos() as f64 / n as f64);
}
