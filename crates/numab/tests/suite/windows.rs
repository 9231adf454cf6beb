//! Migration waves and the mappings they leave (issue 39): pages migrating one by one take
//! their slots in their windows' destination blocks, so a wave leaves a mapping or two per
//! 2 MiB window, never one per page moved, and a scan pass after it is one call per window.
//! A hide costs a TLB shootdown per mapping it empties an entry in, so these counts are what
//! the scanner's flushes come to; the kernel's own `/proc/self/maps` is checked beside the
//! balancer's count. On a fake two-node topology with CPU 0 on node 0 and CPU 1 on node 1.

use crate::common;

use common::{driven_balancer, on_cpu};
use std::sync::Arc;
use zonal::topology::Machine;
use zonal::{Config, MemPolicy, NodeId, Topology, Zonal};
use zonal_numab::{Backend, MigrateMode, PAGE};

/// Pages of a window (2 MiB).
const WINDOW: usize = 512;
/// Windows of the test regions.
const WINDOWS: usize = 4;
const PAGES: usize = WINDOW * WINDOWS;
/// Mappings a wave may leave beyond one a window: a migration that finds its node's reserve
/// of blocks empty, and the balancer's thread too slow to refill it (a loaded machine), moves
/// its page onto a reserve frame, a mapping of its own. Far below one per page moved.
const SLACK: usize = 16;

fn backends() -> Vec<Backend> {
    let mut v = vec![Backend::Mprotect];
    match zonal_numab::userfaultfd_available() {
        Ok(()) => v.push(Backend::Userfaultfd),
        Err((call, errno)) => eprintln!("userfaultfd backend not tested: {call} refused with errno {errno}"),
    }
    v
}

fn zonal() -> Arc<Zonal> {
    let t = Topology::parse_for("nodes=2,size=64M,cpus=0:1", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    Arc::new(Zonal::new(Config::new(t)).unwrap())
}

fn page(p: usize, i: usize) -> *mut u64 {
    (p + i * PAGE) as *mut u64
}

/// Mappings of the process that overlap `start..start + len`, as the kernel counts them.
fn kernel_mappings(start: usize, len: usize) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?))
        })
        .filter(|&(a, b)| a < start + len && b > start)
        .count()
}

/// Every page of the region moves to node 1, one hint fault each, in an order that scatters
/// them (a stride prime to the region's pages). Before issue 39 each moved page was a
/// mapping of its own (2,048 here); now each window's pages land in its destination block,
/// so the region is about one mapping a window, and the scan pass after the wave hides each
/// window with one call.
#[test]
fn a_migration_wave_leaves_a_mapping_per_window_not_per_page() {
    for backend in backends() {
        for mode in [MigrateMode::Delayed, MigrateMode::Eager] {
            let z = zonal();
            let b = driven_balancer(&z, backend, mode, 1024);
            let r = b.region(PAGES * PAGE, MemPolicy::Local).unwrap();
            let p = r.as_ptr() as usize;
            // SAFETY: pages of the region.
            on_cpu(0, || (0..PAGES).for_each(|i| unsafe { page(p, i).write_volatile(0x39_0000 + i as u64) }));
            assert_eq!(r.node_pages(), vec![PAGES, 0]);
            assert_eq!(b.scan_now(), PAGES);
            on_cpu(1, || {
                for k in 0..PAGES {
                    let i = k * 9 % PAGES;
                    // SAFETY: a page of the region.
                    unsafe { assert_eq!(page(p, i).read_volatile(), 0x39_0000 + i as u64) };
                }
            });
            let s = b.stats();
            let what = format!("{backend:?} {mode:?}: {s:?}");
            assert_eq!(r.node_pages(), vec![0, PAGES], "{what}");
            assert_eq!(s.numa_pages_migrated, PAGES as u64, "{what}");
            assert!((1..=WINDOWS as u64).contains(&s.window_blocks), "{what}");
            // The balancer's count and the kernel's: a mapping a window, not one a page.
            let runs = r.vma_runs();
            assert!(runs <= WINDOWS + SLACK, "{what}: {runs} runs after moving {PAGES} pages");
            let kernel = kernel_mappings(p, PAGES * PAGE);
            assert!(kernel <= 2 * WINDOWS + SLACK, "{what}: {kernel} kernel mappings after moving {PAGES} pages");
            // The next pass: one call a window, whatever order the pages moved in (or none
            // for a window still many mappings, which waits: `numab_scan_skips`).
            b.scan_now();
            let t = b.stats();
            let (calls, skips) = (t.scan_calls - s.scan_calls, t.scan_skips - s.scan_skips);
            assert_eq!(calls + skips, WINDOWS as u64, "{what}");
            assert!(skips <= 1, "{what}");
            assert!(kernel_mappings(p, PAGES * PAGE) <= 2 * WINDOWS + SLACK, "{what}");
            // Every byte came along, and the pages are writable.
            on_cpu(1, || {
                for i in 0..PAGES {
                    // SAFETY: pages of the region.
                    unsafe {
                        assert_eq!(page(p, i).read_volatile(), 0x39_0000 + i as u64, "{backend:?} {mode:?} page {i}");
                        page(p, i).write_volatile(i as u64);
                    }
                }
            });
            drop(r);
            drop(b);
            assert_eq!(z.check_invariants().unwrap(), 0, "{backend:?} {mode:?}: every frame back");
        }
    }
}

/// Node 1 uses every fourth page, the rest nobody touches for two scan periods: the
/// untouched pages come along with the first migration of their window into their slots,
/// so the used pages do not each stay a mapping among unmoved neighbours. A pinned page
/// never moves and splits the calls around it, and a page last used from node 0 stays.
#[test]
fn untouched_neighbours_move_along_and_pins_stay() {
    for backend in backends() {
        let z = zonal();
        let b = driven_balancer(&z, backend, MigrateMode::Delayed, 1024);
        let r = b.region(PAGES * PAGE, MemPolicy::Local).unwrap();
        let p = r.as_ptr() as usize;
        // SAFETY: pages of the region.
        on_cpu(0, || (0..PAGES).for_each(|i| unsafe { page(p, i).write_volatile(0x39_1000 + i as u64) }));
        let pinned = WINDOW + 7;
        let pin = r.pin(pinned * PAGE, PAGE).unwrap();
        // Page 2·WINDOW + 2 is used from node 0 between the passes: its hint fault records
        // node 0, so nothing may carry it to node 1 without a fault of its own.
        let used_here = 2 * WINDOW + 2;
        assert_eq!(b.scan_now(), PAGES - 1);
        // SAFETY: a page of the region.
        on_cpu(0, || unsafe { assert_eq!(page(p, used_here).read_volatile(), 0x39_1000 + used_here as u64) });
        assert_eq!(b.scan_now(), 1, "only the page used since is hidden again");
        b.scan_now();
        on_cpu(1, || {
            for i in (0..PAGES).step_by(4) {
                // SAFETY: a page of the region.
                unsafe { assert_eq!(page(p, i).read_volatile(), 0x39_1000 + i as u64) };
            }
        });
        let s = b.stats();
        let what = format!("{backend:?}: {s:?}");
        assert_eq!(r.page_to_nid(page(p, pinned).cast()).unwrap(), Some(NodeId(0)), "{what}: a pinned page stays");
        assert_eq!(r.page_to_nid(page(p, used_here).cast()).unwrap(), Some(NodeId(0)), "{what}");
        assert_eq!(r.node_pages(), vec![2, PAGES - 2], "{what}");
        assert!(s.migrated_along as usize >= PAGES - PAGES / 4, "{what}");
        let runs = r.vma_runs();
        assert!(runs <= WINDOWS + 4 + SLACK, "{what}: {runs} runs");
        let kernel = kernel_mappings(p, PAGES * PAGE);
        assert!(kernel <= 2 * WINDOWS + 4 + SLACK, "{what}: {kernel} kernel mappings");
        drop(pin);
        on_cpu(1, || {
            for i in 0..PAGES {
                // SAFETY: pages of the region.
                unsafe { assert_eq!(page(p, i).read_volatile(), 0x39_1000 + i as u64, "{backend:?} page {i}") };
            }
        });
        drop(r);
        drop(b);
        assert_eq!(z.check_invariants().unwrap(), 0, "{backend:?}: every frame back");
    }
}

/// Off (`window_migration=0`), the same wave leaves a mapping per page (the control: what
/// the test above guards against), until a collapse.
#[test]
fn without_window_migration_a_wave_leaves_a_mapping_per_page() {
    for backend in backends() {
        let z = zonal();
        let cfg = zonal_numab::Config {
            backend,
            scan_delay_ms: 3_600_000,
            reserve_pages: 1024,
            collapse_mb: 0,
            chunk_migration: false,
            window_migration: false,
            ..Default::default()
        };
        let b = zonal_numab::Balancer::new(z.clone(), cfg).unwrap();
        let n = WINDOW;
        let r = b.region(n * PAGE, MemPolicy::Local).unwrap();
        let p = r.as_ptr() as usize;
        // SAFETY: pages of the region.
        on_cpu(0, || (0..n).for_each(|i| unsafe { page(p, i).write_volatile(i as u64) }));
        b.scan_now();
        // SAFETY: pages of the region.
        on_cpu(1, || {
            (0..n).for_each(|k| unsafe { assert_eq!(page(p, k * 9 % n).read_volatile(), (k * 9 % n) as u64) })
        });
        assert_eq!(b.stats().numa_pages_migrated, n as u64);
        assert_eq!(b.stats().window_blocks, 0);
        let runs = r.vma_runs();
        assert!(runs > n / 2, "{backend:?}: {runs} runs");
    }
}

/// Pages first touched in a scattered order map frames in the order they were touched: a
/// mapping each. Their local hint faults move them into a destination block of their own
/// node, with no shootdown (each is hidden, its entry empty), so the window becomes one
/// mapping without a collapse; a collapse pass meanwhile leaves the window to them.
#[test]
fn local_faults_merge_a_scattered_window() {
    for backend in backends() {
        let z = zonal();
        let cfg = zonal_numab::Config {
            backend,
            scan_delay_ms: 3_600_000,
            reserve_pages: 1024,
            collapse_mb: 0,
            chunk_migration: false,
            ..Default::default()
        };
        let b = zonal_numab::Balancer::new(z.clone(), cfg).unwrap();
        let r = b.region(WINDOW * PAGE, MemPolicy::Local).unwrap();
        let p = r.as_ptr() as usize;
        // SAFETY: pages of the region.
        on_cpu(0, || (0..WINDOW).for_each(|k| unsafe { page(p, k * 9 % WINDOW).write_volatile(k as u64) }));
        let before = r.vma_runs();
        assert!(before > WINDOW / 2, "{backend:?}: {before} runs after a scattered first touch");
        for round in 0..3 {
            b.scan_now();
            // Local faults; the collapse would copy the window, it waits for them instead.
            on_cpu(0, || {
                for k in 0..WINDOW {
                    // SAFETY: pages of the region.
                    unsafe { assert_eq!(page(p, k * 9 % WINDOW).read_volatile(), k as u64, "round {round}") };
                }
            });
            assert_eq!(b.collapse_now(usize::MAX), 0, "{backend:?}: the collapse leaves the window to the faults");
            b.housekeep();
        }
        // A last pass: pages moved in the last round are new mappings, which it registers
        // under userfaultfd (merging them with their registered neighbours).
        b.scan_now();
        let s = b.stats();
        let what = format!("{backend:?}: {s:?}");
        assert_eq!(r.node_pages(), vec![WINDOW, 0], "{what}");
        assert_eq!(s.numa_pages_migrated, 0, "{what}");
        assert!(s.coalesced as usize >= WINDOW - SLACK, "{what}");
        assert!(r.vma_runs() <= 2 + SLACK, "{what}: {} runs", r.vma_runs());
        assert!(kernel_mappings(p, WINDOW * PAGE) <= 3 + SLACK, "{what}");
        drop(r);
        drop(b);
        assert_eq!(z.check_invariants().unwrap(), 0, "{backend:?}: every frame back");
    }
}
