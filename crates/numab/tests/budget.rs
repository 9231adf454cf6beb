//! Mappings and memory at scale: a region of more pages than the kernel allows mappings,
//! touched in random order; the mapping budget reached while pages migrate; a region of
//! gigabytes dropped while another first-touches with a small reserve. One case at a time
//! (they use gigabytes).
//!
//! A test binary of its own, not a module of tests/suite: these tests count the whole
//! process's mappings (`/proc/self/maps` against `vm.max_map_count`) and take gigabytes,
//! which other tests' regions beside them would disturb.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use zonal::topology::Machine;
use zonal::{Config, MemPolicy, Topology, Zonal};
use zonal_numab::{Balancer, PAGE};

static SERIAL: Mutex<()> = Mutex::new(());

fn zonal(size: &str) -> Arc<Zonal> {
    let spec = format!("nodes=2,size={size},cpus=0:1");
    let t = Topology::parse_for(&spec, Machine { nr_cpus: 2, mem_total: 64 << 30 }).unwrap();
    Arc::new(Zonal::new(Config::new(t)).unwrap())
}

fn max_map_count() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(65_530)
}

fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().count()
}

/// Writes page `i`'s index into its first word and checks it reads back later.
fn stamp(p: usize, i: usize) {
    // SAFETY: a page of the live region.
    unsafe { ((p + i * PAGE) as *mut u64).write_volatile(i as u64 ^ 0x5a5a) };
}

fn stamped(p: usize, i: usize) -> bool {
    // SAFETY: a page of the live region.
    unsafe { ((p + i * PAGE) as *const u64).read_volatile() == i as u64 ^ 0x5a5a }
}

/// Every page of a region of more pages than `vm.max_map_count`, touched in a random order
/// with balancing off: first touches map whole windows, so the region stays within a
/// quarter of the mapping budget (before, each page was a mapping of its own and the
/// process died at the kernel's limit).
#[test]
fn a_random_first_touch_of_more_pages_than_mappings_stays_in_budget() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let pages = (max_map_count() + 1).next_power_of_two();
    let z = zonal(&format!("{}M", (pages * PAGE * 2) >> 20));
    let cfg = zonal_numab::Config { enabled: false, ..Default::default() };
    let b = Balancer::new(z.clone(), cfg).unwrap();
    let r = b.region(pages * PAGE, MemPolicy::Local).unwrap();
    assert!(r.first_touch_pages() > 1, "a region this large touches in windows");
    let p = r.as_ptr() as usize;
    // A permutation of the pages: an odd stride times a large prime, modulo a power of two.
    let stride = (2_654_435_761usize % pages) | 1;
    for k in 0..pages {
        stamp(p, k.wrapping_mul(stride) % pages);
    }
    assert!((0..pages).all(|i| stamped(p, i)), "a page lost its stamp");
    let budget = max_map_count() / 4 * 3;
    let runs = r.vma_runs();
    assert!(runs <= budget / 4 + 1, "{runs} runs for {pages} pages (budget {budget})");
    assert!(mappings() < budget, "{} mappings", mappings());
    assert_eq!(b.stats().first_touch, pages as u64);
    drop(r);
    drop(b);
    assert_eq!(z.check_invariants().unwrap(), 0);
}

/// The budget reached while two threads hop between the nodes and the scanner runs every
/// 2 ms: migrations and scans stop, first touches go on, nothing is lost.
#[test]
fn the_budget_reached_mid_run_stops_migrations_and_loses_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    const PAGES: usize = 2048;
    let z = zonal("64M");
    let cfg = zonal_numab::Config {
        scan_delay_ms: 0,
        scan_period_min_ms: 2,
        scan_period_max_ms: 2,
        reserve_pages: 128,
        ..Default::default()
    };
    let b = Balancer::new(z.clone(), cfg).unwrap();
    let r = b.region(PAGES * PAGE, MemPolicy::Local).unwrap();
    let p = r.as_ptr() as usize;
    let phase = AtomicU64::new(0);
    let counts: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u32)
            .map(|t| {
                let phase = &phase;
                s.spawn(move || {
                    let mut n = vec![0u64; PAGES];
                    let mut round = 0u32;
                    while phase.load(Ordering::Relaxed) < 2 {
                        zonal::cpu::set_affinity((round + t) % 2).unwrap();
                        // The first half before the budget, all of it after.
                        let upto = if phase.load(Ordering::Relaxed) == 0 { PAGES / 2 } else { PAGES };
                        for (pg, c) in n.iter_mut().enumerate().take(upto) {
                            let w = (p + pg * PAGE + 8 * (1 + t as usize)) as *const AtomicU64;
                            // SAFETY: a word of a live region page, this thread's own.
                            unsafe { (*w).fetch_add(1, Ordering::Relaxed) };
                            *c += 1;
                        }
                        round += 1;
                    }
                    n
                })
            })
            .collect();
        while b.stats().numa_pages_migrated < 200 {
            std::thread::yield_now();
        }
        b.set_vma_budget(1);
        let migrated = b.stats().numa_pages_migrated;
        phase.store(1, Ordering::Relaxed);
        // The other half is first-touched now, past the budget.
        while b.stats().first_touch < PAGES as u64 {
            std::thread::yield_now();
        }
        let scans = b.stats().numa_pte_updates;
        std::thread::sleep(std::time::Duration::from_millis(100));
        phase.store(2, Ordering::Relaxed);
        let s = b.stats();
        assert_eq!(s.numa_pte_updates, scans, "scans went on past the budget: {s:?}");
        // Faults already in flight when the budget was set may finish their migration.
        assert!(s.numa_pages_migrated <= migrated + 2 * PAGES as u64 / 2, "{s:?}");
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (t, n) in counts.iter().enumerate() {
        for (pg, &c) in n.iter().enumerate() {
            // SAFETY: a word of a live region page; the threads have stopped.
            let got = unsafe { ((p + pg * PAGE + 8 * (1 + t)) as *const u64).read_volatile() };
            assert_eq!(got, c, "page {pg}: thread {t} lost increments");
        }
    }
    drop(r);
    drop(b);
    assert_eq!(z.check_invariants().unwrap(), 0);
}

/// A region of 3 GiB dropped while another region first-touches page after page with a
/// reserve of 32 frames: the balancer's thread goes on refilling while the drop unmaps and
/// frees (before, the drop held the region's scan lock through it all, the thread waited on
/// it, and first touches gave up after ~60 ms of waiting: the process died of SIGBUS).
#[test]
fn dropping_gigabytes_does_not_starve_first_touches() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    const BIG: usize = 3 << 30;
    const SMALL_PAGES: usize = 16 << 8;
    let z = zonal("4G");
    let cfg = zonal_numab::Config { enabled: false, reserve_pages: 32, ..Default::default() };
    let b = Balancer::new(z.clone(), cfg).unwrap();
    let big = b.region(BIG, MemPolicy::Local).unwrap();
    let bp = big.as_ptr() as usize;
    for i in 0..BIG / PAGE {
        stamp(bp, i);
    }
    let small = b.region(SMALL_PAGES * PAGE, MemPolicy::Local).unwrap();
    let sp = small.as_ptr() as usize;
    std::thread::scope(|s| {
        let toucher = s.spawn(|| {
            for i in 0..SMALL_PAGES {
                stamp(sp, i);
            }
        });
        drop(big);
        toucher.join().unwrap();
    });
    assert!((0..SMALL_PAGES).all(|i| stamped(sp, i)));
    drop(small);
    drop(b);
    assert_eq!(z.check_invariants().unwrap(), 0);
}
