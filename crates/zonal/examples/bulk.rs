//! A loop of bulk allocations of N order-0 frames, each batch freed with one bulk free, for
//! profilers (`valgrind --tool=callgrind`, `perf`):
//! `cargo run --release -p zonal --features examples --example bulk -- [N] [ROUNDS]`.

use std::ptr::NonNull;
use zonal::{Config, Gfp, Topology, Zonal};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>().ok());
    let n = args.next().flatten().unwrap_or(128) as usize;
    let rounds = args.next().flatten().unwrap_or(200_000);
    let z = Zonal::new(Config::new(Topology::parse("nodes=2,size=64M").expect("topology"))).expect("zonal");
    let mut array: Vec<Option<NonNull<u8>>> = vec![None; n];
    let mut pages: Vec<*mut u8> = Vec::with_capacity(n);
    let t = std::time::Instant::now();
    for _ in 0..rounds {
        array.iter_mut().for_each(|s| *s = None);
        let got = z.alloc_pages_bulk_array(Gfp::KERNEL, &mut array);
        assert_eq!(got, n, "bulk allocation fell short");
        pages.clear();
        pages.extend(array.iter().flatten().map(|p| p.as_ptr()));
        z.free_pages_bulk(std::hint::black_box(&pages)).expect("bulk free");
    }
    println!("{:.2} ns per page", t.elapsed().as_nanos() as f64 / (rounds * n as u64) as f64);
}
