//! What the region tests share: a thread bound to a CPU, and a balancer whose own thread
//! neither scans nor collapses (the tests drive both) with room for many migrations at once;
//! and cases run in a child process (`child`). Not every test binary uses every helper.

#![allow(dead_code)]

pub mod child;
pub mod io;

use std::sync::Arc;
use zonal::Zonal;
use zonal_numab::{Backend, Balancer, MigrateMode};

/// Runs `f` on a thread bound to `cpu` (both CPUs exist here: the machine has 2).
pub fn on_cpu<R: Send>(cpu: u32, f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| {
        s.spawn(|| {
            zonal::cpu::set_affinity(cpu).expect("bind to a CPU of this machine");
            f()
        })
        .join()
        .unwrap()
    })
}

/// A balancer that moves pages one at a time (no chunk migration), scans and collapses only
/// when a test says, and keeps `reserve_pages` frames ready per node.
pub fn driven_balancer(z: &Arc<Zonal>, backend: Backend, mode: MigrateMode, reserve_pages: usize) -> Balancer {
    let cfg = zonal_numab::Config {
        mode,
        backend,
        scan_delay_ms: 3_600_000,
        reserve_pages,
        collapse_mb: 0,
        chunk_migration: false,
        ..Default::default()
    };
    Balancer::new(z.clone(), cfg).unwrap()
}
