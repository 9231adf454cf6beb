//! Seed 003's memory hog as `bench zlc` sets it up, for profilers (`perf record`,
//! `valgrind --tool=callgrind`): 28 nodes, every CPU on node 0, every zone of node 0's
//! zonelist but the last held down to its `min` watermark, and threads allocating order-0
//! frames past them in rounds of 1024, then freeing them.
//! `cargo run --release -p zonal --features examples --example zlc_hog -- [ROUNDS] [on|off] [THREADS] [touch]`
//! (20 000 rounds, the zonelist cache on, one thread by default; `touch` writes a word of
//! each frame between the allocations and the frees, as the seed's hog and `bench zlc` do).
//! Prints each thread's ns a page: the allocations alone and the whole round.

use std::time::{Duration, Instant};
use zonal::{Config, Gfp, NodeId, Topology, Zonal};

const USAGE: &str = "usage: zlc_hog [ROUNDS] [on|off] [THREADS] [touch]
  ROUNDS   rounds of 1024 order-0 allocations and frees per thread (default 20000)
  on|off   the zonelist cache (default on)
  THREADS  allocating threads, each on its own CPU when there are enough (default 1)
  touch    write a word of each frame between the allocations and the frees";

/// The arguments, each checked: a word out of place is an error, never a silent default.
fn args() -> Result<(usize, bool, usize, bool), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return Err(String::new());
    }
    let num = |i: usize, what: &str, default: usize| match args.get(i) {
        None => Ok(default),
        Some(a) => a.parse().ok().filter(|&n| n > 0).ok_or_else(|| format!("{what} `{a}`: give a positive number")),
    };
    let rounds = num(0, "ROUNDS", 20_000)?;
    let on = match args.get(1).map(String::as_str) {
        None | Some("on") => true,
        Some("off") => false,
        Some(a) => return Err(format!("`{a}`: give on or off for the zonelist cache")),
    };
    let threads = num(2, "THREADS", 1)?;
    let touch = match args.get(3).map(String::as_str) {
        None => false,
        Some("touch") => true,
        Some(a) => return Err(format!("`{a}`: the fourth argument can only be `touch`")),
    };
    if args.len() > 4 {
        return Err(format!("`{}`: too many arguments", args[4]));
    }
    Ok((rounds, on, threads, touch))
}

fn main() {
    let (rounds, on, threads, touch) = match args() {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("zlc_hog: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let nodes = 28;
    let ncpu = zonal::cpu::nr_cpus_online();
    let spec = format!("nodes={nodes},size=256M,cpus=0-{}{}", ncpu - 1, ":".repeat(nodes - 1));
    let z = Zonal::new(Config::new(Topology::parse(&spec).expect("topology"))).expect("zonal");
    let zonelist = &z.zonelists(NodeId(0)).expect("node 0").fallback;
    let order: Vec<NodeId> = zonelist.iter().map(|id| z.zones()[id.0 as usize].node).collect();
    let mut held = Vec::new();
    for &n in &order[..order.len() - 1] {
        for o in (0..=z.max_order().get() as u32).rev().step_by(5) {
            while let Ok(p) = z.alloc_pages_node(n, Gfp::THISNODE, o) {
                held.push((p.as_ptr(), o));
            }
        }
    }
    z.drain_all_pages();
    z.set_zonelist_cache(on);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut pages = Vec::with_capacity(1024);
                let mut alloc = Duration::ZERO;
                let t = Instant::now();
                for _ in 0..rounds {
                    let a = Instant::now();
                    for _ in 0..1024 {
                        pages.push(z.alloc_pages(Gfp::KERNEL, 0).expect("alloc"));
                    }
                    alloc += a.elapsed();
                    if touch {
                        for p in &pages {
                            // SAFETY: a frame zonal handed out, writable and ours until freed.
                            unsafe { std::ptr::write_volatile(p.as_ptr().cast::<u64>(), 0x5a5a) };
                        }
                    }
                    for p in pages.drain(..) {
                        z.free_pages(p.as_ptr(), 0).expect("free");
                    }
                }
                let n = (rounds * 1024) as f64;
                println!(
                    "cache {}: {:.2} ns a page allocated, {:.2} a page allocated and freed",
                    if on { "on" } else { "off" },
                    alloc.as_nanos() as f64 / n,
                    t.elapsed().as_nanos() as f64 / n
                );
            });
        }
    });
    for (p, o) in held {
        z.free_pages(p, o).expect("free");
    }
}
