//! Regions end to end on a fake two-node topology with CPU 0 on node 0 and CPU 1 on node 1:
//! first-touch placement by policy, hint faults and migration in both mapping orders, the
//! two-stage filter, the counters, bad input, and every frame back when a region goes.
//!
//! A test binary of its own, not a module of tests/suite: one test forks a child that must
//! die touching a region's range just unmapped, which another test's new mapping could take
//! in the meantime; the fewer tests beside it making regions, the safer.

mod common;

use common::{driven_balancer, on_cpu};
use std::sync::Arc;
use zonal::topology::Machine;
use zonal::{Config, MemPolicy, NodeId, NodeMask, Topology, Zonal};
use zonal_numab::{Backend, Balancer, Error, MigrateMode, PAGE};

/// The backends this machine has: mprotect always; userfaultfd unless the kernel refuses
/// the system call itself (blocked or too old), which is said on stderr.
fn backends() -> Vec<Backend> {
    let mut v = vec![Backend::Mprotect];
    for (b, avail) in [
        (Backend::Userfaultfd, zonal_numab::userfaultfd_available()),
        (Backend::UserfaultfdThread, zonal_numab::userfaultfd_thread_available()),
    ] {
        match avail {
            Ok(()) => v.push(b),
            Err((call, errno)) if errno == libc::EPERM || errno == libc::ENOSYS || errno == libc::ENOTSUP => {
                eprintln!("{b:?} backend not tested: {call} refused with errno {errno} on this machine")
            }
            Err(e) => panic!("{b:?}: userfaultfd failed unexpectedly: {e:?}"),
        }
    }
    v
}

fn zonal() -> Arc<Zonal> {
    let t = Topology::parse_for("nodes=2,size=64M,cpus=0:1", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    Arc::new(Zonal::new(Config::new(t)).unwrap())
}

/// A balancer whose own thread never scans nor collapses (the tests drive the scanner with
/// `scan_now` and collapses with `collapse_now`).
fn balancer(z: &Arc<Zonal>, mode: MigrateMode, backend: Backend) -> Balancer {
    let cfg = zonal_numab::Config {
        mode,
        backend,
        scan_delay_ms: 3_600_000,
        reserve_pages: 64,
        collapse_mb: 0,
        ..Default::default()
    };
    let b = Balancer::new(z.clone(), cfg).unwrap();
    assert_eq!(b.backend(), backend);
    b
}

fn allocated(z: &Zonal) -> usize {
    z.check_invariants().expect("invariants")
}

/// Page `i` of the region at `p` (addresses as integers: closures on other threads take them).
fn page(p: usize, i: usize) -> *mut u64 {
    (p + i * PAGE) as *mut u64
}

#[test]
fn first_touch_places_pages_by_policy_and_a_drop_frees_them() {
    for backend in backends() {
        let z = zonal();
        let b = balancer(&z, MigrateMode::Delayed, backend);
        {
            let r = b.region(8 * PAGE, MemPolicy::Local).unwrap();
            let p = r.as_ptr() as usize;
            assert_eq!(r.page_to_nid(page(p, 0).cast()).unwrap(), None, "no frame before the first touch");
            // SAFETY: the region is 8 pages; each access faults the page in.
            on_cpu(0, || unsafe {
                assert_eq!(page(p, 0).read_volatile(), 0, "a first touch reads zeros");
                page(p, 1).write_volatile(11);
            });
            // SAFETY: as above.
            on_cpu(1, || unsafe { page(p, 2).write_volatile(22) });
            assert_eq!(r.page_to_nid(page(p, 0).cast()).unwrap(), Some(NodeId(0)));
            assert_eq!(r.page_to_nid(page(p, 1).cast()).unwrap(), Some(NodeId(0)));
            assert_eq!(r.page_to_nid(page(p, 2).cast()).unwrap(), Some(NodeId(1)));
            assert_eq!(r.node_pages(), vec![2, 1]);
            // SAFETY: mapped pages of the region.
            unsafe { assert_eq!((page(p, 1).read_volatile(), page(p, 2).read_volatile()), (11, 22)) };
            assert_eq!(b.stats().first_touch, 3);

            let pref = b.region(2 * PAGE, MemPolicy::Preferred(NodeId(1))).unwrap();
            // SAFETY: a page of the region.
            let q = pref.as_ptr() as usize;
            // SAFETY: a page of the region.
            on_cpu(0, || unsafe { page(q, 0).write_volatile(1) });
            assert_eq!(pref.node_pages(), vec![0, 1]);

            let il = b.region(4 * PAGE, MemPolicy::Interleave(NodeMask::from_nodes([NodeId(0), NodeId(1)]))).unwrap();
            for i in 0..4 {
                // SAFETY: pages of the region.
                let q = il.as_ptr() as usize;
                // SAFETY: pages of the region.
                on_cpu(0, || unsafe { page(q, i).write_volatile(i as u64) });
                assert_eq!(il.page_to_nid(page(q, i).cast()).unwrap(), Some(NodeId((i % 2) as u16)));
            }
            let bind = b.region(PAGE, MemPolicy::Bind(NodeMask::from_nodes([NodeId(1)]))).unwrap();
            // SAFETY: a page of the region.
            let q = bind.as_ptr() as usize;
            // SAFETY: a page of the region.
            on_cpu(0, || unsafe { page(q, 0).write_volatile(9) });
            assert_eq!(bind.node_pages(), vec![0, 1], "bind takes the allowed node, not the CPU's");
        }
        // Every region frame is back with zonal, and with the balancer its reserves.
        drop(b);
        assert_eq!(allocated(&z), 0);
    }
}

/// A page touched on node 0 and then used from CPU 1 moves to node 1 on its hint fault, with
/// its contents, in both mapping orders; local faults count as local and move nothing.
#[test]
fn hint_faults_move_pages_to_the_faulting_node() {
    for backend in backends() {
        for mode in [MigrateMode::Delayed, MigrateMode::Eager] {
            let z = zonal();
            let b = balancer(&z, mode, backend);
            let n = 16;
            let r = b.region(n * PAGE, MemPolicy::Local).unwrap();
            let p = r.as_ptr() as usize;
            // SAFETY: pages of the region.
            on_cpu(0, || (0..n).for_each(|i| unsafe { page(p, i).write_volatile(0xa000 + i as u64) }));
            assert_eq!(r.node_pages(), vec![n, 0]);
            let runs = r.vma_runs();
            assert!((1..=n).contains(&runs), "{runs} runs for {n} pages");
            assert_eq!(b.stats().vma_runs, runs as u64);
            assert_eq!(b.scan_now(), n, "every mapped page marked");
            assert_eq!(b.stats().numa_pte_updates, n as u64);
            // Half the pages are used from node 0 again: local hint faults, nothing moves.
            // SAFETY: pages of the region.
            on_cpu(0, || (0..n / 2).for_each(|i| unsafe { assert_eq!(page(p, i).read_volatile(), 0xa000 + i as u64) }));
            let s = b.stats();
            assert_eq!(
                (s.numa_hint_faults, s.numa_hint_faults_local, s.numa_pages_migrated),
                (n as u64 / 2, n as u64 / 2, 0),
                "{mode:?} {backend:?}"
            );
            // The other half from node 1: they move (early phase, nobody faulted on them).
            // SAFETY: pages of the region.
            on_cpu(1, || (n / 2..n).for_each(|i| unsafe { assert_eq!(page(p, i).read_volatile(), 0xa000 + i as u64) }));
            let s = b.stats();
            assert_eq!(s.numa_hint_faults, n as u64, "{mode:?} {backend:?}");
            assert_eq!(s.numa_hint_faults_local, n as u64 / 2);
            assert_eq!(
                (s.numa_pages_migrated, s.pgmigrate_success, s.pgmigrate_fail),
                (n as u64 / 2, n as u64 / 2, 0),
                "{mode:?} {backend:?} {s:?}"
            );
            assert_eq!(r.node_pages(), vec![n / 2, n / 2]);
            // Contents survived and the pages are writable again.
            // SAFETY: pages of the region.
            on_cpu(1, || {
                (0..n).for_each(|i| unsafe {
                    assert_eq!(page(p, i).read_volatile(), 0xa000 + i as u64);
                    page(p, i).write_volatile(i as u64);
                })
            });
            // The layer's counters are in the handle's reports.
            assert_eq!(z.vmstat_value("numa_pages_migrated").unwrap(), n as u64 / 2);
            assert_eq!(z.vmstat_value("numa_hint_faults_local").unwrap(), n as u64 / 2);
            assert!(z.vmstat().contains(&format!("numa_pte_updates {n}\n")));
            assert!(z.prometheus().contains("numa_pages_migrated"));
            drop(r);
            b.housekeep();
            assert_eq!(b.stats().numa_pages_migrated, n as u64 / 2);
            drop(b);
            assert!(z.vmstat_value("numa_pages_migrated").is_err(), "gone with the balancer");
        }
    }
}

/// Past the early phase a page moves only on the second hint fault in a row from the
/// destination node; off, nothing moves.
#[test]
fn the_two_stage_filter_and_the_switch() {
    for backend in backends() {
        let z = zonal();
        let b = balancer(&z, MigrateMode::Delayed, backend);
        let r = b.region(PAGE, MemPolicy::Local).unwrap();
        let p = r.as_ptr() as usize;
        let w = move || page(p, 0);
        // SAFETY: the region's page.
        on_cpu(0, || unsafe { w().write_volatile(5) });
        // Five passes end the early phase (`numa_scan_seq <= 4`); each is followed by a local
        // fault, which records node 0 as the last.
        for _ in 0..5 {
            b.scan_now();
            // SAFETY: as above.
            on_cpu(0, || unsafe { w().read_volatile() });
        }
        assert_eq!(r.node_pages(), vec![1, 0]);
        b.scan_now();
        // SAFETY: as above.
        on_cpu(1, || unsafe { w().read_volatile() });
        assert_eq!(r.node_pages(), vec![1, 0], "first fault from node 1: the filter holds it");
        b.scan_now();
        // SAFETY: as above.
        on_cpu(1, || unsafe { w().read_volatile() });
        assert_eq!(r.node_pages(), vec![0, 1], "second in a row from node 1: it moves ({backend:?})");
        b.set_enabled(false);
        b.scan_now();
        // SAFETY: as above.
        on_cpu(0, || unsafe { w().read_volatile() });
        on_cpu(0, || unsafe { w().read_volatile() });
        assert_eq!(r.node_pages(), vec![0, 1], "off: hint faults map pages back where they are");
        // SAFETY: as above.
        assert_eq!(unsafe { w().read_volatile() }, 5);
    }
}

#[test]
fn bad_input_gets_a_clear_error() {
    for backend in backends() {
        let z = zonal();
        let b = balancer(&z, MigrateMode::Delayed, backend);
        assert_eq!(b.region(0, MemPolicy::Local).err(), Some(Error::InvalidSize { bytes: 0 }));
        assert!(matches!(b.region(usize::MAX, MemPolicy::Local), Err(Error::InvalidSize { .. })));
        assert!(matches!(b.region(PAGE, MemPolicy::Preferred(NodeId(7))), Err(Error::Zonal(_))));
        assert!(matches!(b.region(PAGE, MemPolicy::Bind(NodeMask::new())), Err(Error::Zonal(_))));
        let r = b.region(3 * PAGE + 1, MemPolicy::Local).unwrap();
        assert_eq!(r.len(), 4 * PAGE);
        let out = r.as_ptr().wrapping_add(4 * PAGE);
        assert!(matches!(r.page_to_nid(out), Err(Error::OutOfRange { .. })));
        assert!(matches!(r.prefault(PAGE, 4 * PAGE), Err(Error::OutOfRange { .. })));
        // A region address is not a zonal frame: freeing it is refused and changes nothing.
        r.prefault(0, PAGE).unwrap();
        assert!(matches!(z.free_pages(r.as_ptr(), 0), Err(zonal::Error::NotOwned { .. })));
        // SAFETY: prefaulted above.
        assert_eq!(unsafe { r.as_ptr().cast::<u64>().read_volatile() }, 0);
        assert_eq!(b.stats().first_touch, 1);
    }
}

/// `prefault` maps pages so that system calls can use them: a `read(2)` into a region page
/// the scanner marked would get EFAULT; after `prefault` it lands.
#[test]
fn prefault_makes_pages_usable_by_system_calls() {
    for backend in backends() {
        let z = zonal();
        let b = balancer(&z, MigrateMode::Delayed, backend);
        let r = b.region(2 * PAGE, MemPolicy::Local).unwrap();
        r.prefault(0, 2 * PAGE).unwrap();
        assert_eq!(r.node_pages().iter().sum::<usize>(), 2);
        b.scan_now();
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let read = |buf: *mut u8| {
            // SAFETY: `buf` points at a region page (mapped or not: the kernel checks).
            unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(&f), buf.cast(), 16) }
        };
        if backend == Backend::UserfaultfdThread {
            // The handler thread serves the kernel's fault: the read lands, and it was a hint.
            assert_eq!(read(r.as_ptr()), 16, "the handler thread serves system calls");
            assert_eq!(b.stats().numa_hint_faults, 1);
        } else {
            assert_eq!(read(r.as_ptr()), -1, "a marked page: EFAULT, not a fault");
            r.prefault(0, PAGE).unwrap();
            assert_eq!(read(r.as_ptr()), 16);
        }
    }
}

/// At the mapping budget the balancer adds no mapping: no scan, and hint faults map pages
/// back where they are, counted as `pgmigrate_fail_vma`; nothing is lost.
#[test]
fn the_mapping_budget_stops_scans_and_migrations() {
    for backend in backends() {
        let z = zonal();
        let b = balancer(&z, MigrateMode::Delayed, backend);
        let n = 8;
        let r = b.region(n * PAGE, MemPolicy::Local).unwrap();
        let p = r.as_ptr() as usize;
        // SAFETY: pages of the region.
        on_cpu(0, || (0..n).for_each(|i| unsafe { page(p, i).write_volatile(i as u64 + 1) }));
        assert_eq!(b.scan_now(), n);
        b.set_vma_budget(1);
        let s = b.stats();
        assert!(s.vmas > 1 && s.vmas_peak >= s.vmas, "{s:?}");
        // SAFETY: pages of the region.
        on_cpu(1, || (0..n).for_each(|i| unsafe { assert_eq!(page(p, i).read_volatile(), i as u64 + 1) }));
        let s = b.stats();
        assert_eq!((s.pgmigrate_fail_vma, s.numa_pages_migrated), (n as u64, 0), "{backend:?}");
        assert_eq!(r.node_pages(), vec![n, 0]);
        assert_eq!(b.scan_now(), 0, "over budget: no scan");
        b.set_vma_budget(usize::MAX);
        assert_eq!(b.scan_now(), n);
    }
}

/// A destroyed region's range is unmapped: touching it is a defined fault (SIGSEGV, the
/// previous handler's business), in a child process so the test survives it.
#[test]
fn touching_a_destroyed_region_is_a_segfault() {
    let z = zonal();
    let b = balancer(&z, MigrateMode::Delayed, Backend::Mprotect);
    let r = b.region(PAGE, MemPolicy::Local).unwrap();
    let p = r.as_ptr() as usize;
    // SAFETY: a page of the live region.
    unsafe { page(p, 0).write_volatile(1) };
    drop(r);
    // SAFETY: fork in a test process: the child only touches memory and exits with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: the child restores the default action and touches the dead range.
        unsafe {
            libc::signal(libc::SIGSEGV, libc::SIG_DFL);
            page(p, 0).write_volatile(2);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV, "status {status:#x}");
    drop(b);
    assert_eq!(z.check_invariants().unwrap(), 0, "every frame is back");
}

/// A hint fault on a chunk whose 512 pages are all hinted on one node moves the whole chunk
/// in one migration into consecutive frames: one mapping instead of 512, every byte kept.
/// With chunk migration off, the same fault moves its page alone.
#[test]
fn a_hinted_chunk_moves_whole() {
    for backend in backends() {
        for (chunks, mode) in [(true, MigrateMode::Delayed), (true, MigrateMode::Eager), (false, MigrateMode::Delayed)]
        {
            let z = zonal();
            let cfg = zonal_numab::Config {
                mode,
                backend,
                scan_delay_ms: 3_600_000,
                collapse_mb: 0,
                chunk_migration: chunks,
                ..Default::default()
            };
            let b = Balancer::new(z.clone(), cfg).unwrap();
            let n = 1024;
            let r = b.region(n * PAGE, MemPolicy::Local).unwrap();
            let p = r.as_ptr() as usize;
            // SAFETY: pages of the region.
            on_cpu(0, || (0..n).for_each(|i| unsafe { page(p, i).write_volatile(0xc0de_0000 + i as u64) }));
            assert_eq!(r.node_pages(), vec![n, 0]);
            assert_eq!(b.scan_now(), n);
            // One access from node 1 in the second chunk.
            // SAFETY: as above.
            on_cpu(1, || unsafe { assert_eq!(page(p, 700).read_volatile(), 0xc0de_0000 + 700) });
            let s = b.stats();
            let moved = if chunks { 512 } else { 1 };
            assert_eq!((s.numa_pages_migrated, s.chunks_migrated), (moved, chunks as u64), "{backend:?} {mode:?}");
            assert_eq!(r.node_pages(), vec![n - moved as usize, moved as usize]);
            if chunks {
                // The chunk's pages are one run of consecutive frames on node 1.
                for i in 512..1024 {
                    assert_eq!(r.page_to_nid(page(p, i).cast()).unwrap(), Some(NodeId(1)));
                }
            }
            // Every byte kept, the pages writable.
            // SAFETY: as above.
            on_cpu(1, || {
                (0..n).for_each(|i| unsafe {
                    assert_eq!(page(p, i).read_volatile(), 0xc0de_0000 + i as u64);
                    page(p, i).write_volatile(i as u64);
                })
            });
            drop(r);
            drop(b);
            assert_eq!(z.check_invariants().unwrap(), 0, "every frame back");
        }
    }
}

/// The process's mappings that overlap `[start, start + len)`, from `/proc/self/maps`: what
/// the kernel really has, where `vma_runs` is the layer's own count.
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

/// A driven balancer whose pages migrating one by one take any frame of the node's reserve
/// (`window_migration` off), so that a scattered wave leaves a mapping per page, as before
/// windows had destination blocks: what collapses exist to merge.
fn scattering_balancer(z: &Arc<Zonal>, backend: Backend) -> Balancer {
    let cfg = zonal_numab::Config {
        backend,
        scan_delay_ms: 3_600_000,
        reserve_pages: 1024,
        collapse_mb: 0,
        chunk_migration: false,
        window_migration: false,
        ..Default::default()
    };
    Balancer::new(z.clone(), cfg).unwrap()
}

/// Pages migrated one by one in a scattered order map a frame each; a collapse pass copies
/// every aligned window of pages on one node into one block of that node and maps it once
/// (orders 7, 8 and 9 here, around 128 pages left on the other node), leaves a window with a
/// misplaced page alone, keeps every byte, and gives every frame back.
#[test]
fn collapse_merges_what_single_page_migrations_split() {
    for backend in backends() {
        let z = zonal();
        // Room for every migration at once: a burst larger than the reserve fails some.
        let b = scattering_balancer(&z, backend);
        let n = 1024;
        let stay = 128;
        let r = b.region(n * PAGE, MemPolicy::Local).unwrap();
        let p = r.as_ptr() as usize;
        // SAFETY: pages of the region.
        on_cpu(0, || (0..n).for_each(|i| unsafe { page(p, i).write_volatile(0xc000 + i as u64) }));
        assert_eq!(b.scan_now(), n);
        // Pages `stay..` move to node 1 in a scattered order (9 is prime to 896), so
        // neighbouring pages get frames far apart: a mapping each.
        let moved = n - stay;
        on_cpu(1, || {
            for k in 0..moved {
                let i = stay + k * 9 % moved;
                // SAFETY: a page of the region.
                assert_eq!(unsafe { page(p, i).read_volatile() }, 0xc000 + i as u64);
            }
        });
        assert_eq!(r.node_pages(), vec![stay, moved], "{backend:?} {:?}", b.stats());
        assert_eq!(b.stats().numa_pages_migrated, moved as u64);
        let before = r.vma_runs();
        assert!(before > moved / 2, "{backend:?}: {before} runs after scattered migrations");
        // Page 700 is used from node 0 now: its hint fault leaves it on node 1 (the filter
        // wants a second fault in a row) but marks it misplaced, so its windows stay as they are.
        // (Pages `..stay` are still hinted from the first scan.)
        assert_eq!(b.scan_now(), moved);
        let faults = b.stats().numa_hint_faults;
        // SAFETY: a page of the region.
        on_cpu(0, || unsafe { assert_eq!(page(p, 700).read_volatile(), 0xc000 + 700) });
        // A migrated page maps a new mapping, which the scan registered before hiding it
        // (under userfaultfd, a zap of an unregistered page refills without a fault).
        assert_eq!(b.stats().numa_hint_faults, faults + 1, "{backend:?}: the migrated page's hint fault");
        assert_eq!(r.page_to_nid(page(p, 700).cast()).unwrap(), Some(NodeId(1)), "{backend:?}");
        let mapped_700 = kernel_mappings(p + 700 * PAGE, PAGE);
        assert_eq!(mapped_700, 1);

        let copied = b.collapse_now(usize::MAX);
        let s = b.stats();
        assert_eq!(s.collapsed_pages, copied as u64);
        assert_eq!(s.collapse_fail, 0, "{backend:?}");
        assert!(copied >= 256 + 128, "{backend:?}: {copied} pages copied");
        let after = r.vma_runs();
        assert!(after <= 16, "{backend:?}: {before} runs before, {after} after");
        // The kernel agrees: the region is a few mappings, not hundreds.
        let kernel = kernel_mappings(p, n * PAGE);
        assert!(kernel <= after + 2, "{backend:?}: {kernel} kernel mappings for {after} runs");
        // Pages 128..256 and 256..512 held no misplaced page: one block and one run each.
        for (lo, hi) in [(128, 256), (256, 512)] {
            let first = r.page_to_nid(page(p, lo).cast()).unwrap();
            assert_eq!(first, Some(NodeId(1)));
            assert_eq!(kernel_mappings(p + lo * PAGE, (hi - lo) * PAGE), 1, "{backend:?}: {lo}..{hi}");
        }
        assert_eq!(r.node_pages(), vec![stay, moved], "a collapse keeps each page on its node");
        // A second pass has nothing left to do but the misplaced page's windows.
        let again = b.collapse_now(usize::MAX);
        assert_eq!(again, 0, "{backend:?}");
        // Every byte survived, and the pages are writable.
        on_cpu(1, || {
            for i in 0..n {
                // SAFETY: pages of the region.
                unsafe {
                    assert_eq!(page(p, i).read_volatile(), 0xc000 + i as u64, "{backend:?} page {i}");
                    page(p, i).write_volatile(i as u64);
                }
            }
        });
        drop(r);
        drop(b);
        assert_eq!(allocated(&z), 0, "{backend:?}");
    }
}

/// The budget bounds a pass: at most the pages asked for are copied, and the next pass goes
/// on where this one stopped.
#[test]
fn a_collapse_pass_copies_at_most_its_budget() {
    let z = zonal();
    let b = scattering_balancer(&z, Backend::Mprotect);
    let n = 512;
    let r = b.region(n * PAGE, MemPolicy::Local).unwrap();
    let p = r.as_ptr() as usize;
    // SAFETY: pages of the region.
    on_cpu(0, || (0..n).for_each(|i| unsafe { page(p, i).write_volatile(i as u64) }));
    assert_eq!(b.scan_now(), n);
    on_cpu(1, || {
        for k in 0..n {
            // SAFETY: a page of the region.
            unsafe { page(p, k * 5 % n).read_volatile() };
        }
    });
    // 100 pages: the 512-page window does not fit, nor its halves, its 64-page windows do;
    // the second one would pass the budget, so the pass ends before it (no window is cut
    // smaller than the budget allows only to fill it) and the next pass starts there.
    assert_eq!(b.collapse_now(0), 0);
    for k in 0..n / 64 {
        assert_eq!(b.collapse_now(100), 64, "pass {k}");
    }
    assert_eq!(b.collapse_now(100), 0, "every 64-page window is one block");
    // With the budget for it, the 512 pages become one block (unless the eight blocks
    // already follow each other: the buddy hands out a split block's halves in order).
    let runs = r.vma_runs();
    let last = b.collapse_now(usize::MAX);
    assert_eq!(last, if runs > 1 { n } else { 0 });
    assert_eq!(r.vma_runs(), 1);
    assert_eq!(b.stats().collapsed_pages, (n + last) as u64);
    // SAFETY: pages of the region.
    on_cpu(1, || (0..n).for_each(|i| unsafe { assert_eq!(page(p, i).read_volatile(), i as u64) }));
    drop(r);
    drop(b);
    assert_eq!(allocated(&z), 0);
}

/// Under userfaultfd a scan registers a run only when a page of it was mapped anew since its
/// last registration (an `UFFDIO_REGISTER` takes the mmap lock for writing): a second scan of
/// pages only revealed in place registers nothing, one after a migration registers again.
#[test]
fn a_scan_registers_only_runs_with_new_mappings() {
    for backend in backends().into_iter().filter(|b| *b != Backend::Mprotect) {
        let z = zonal();
        let b = driven_balancer(&z, backend, MigrateMode::Delayed, 64);
        let n = 16;
        let r = b.region(n * PAGE, MemPolicy::Local).unwrap();
        let p = r.as_ptr() as usize;
        // SAFETY: pages of the region.
        on_cpu(0, || (0..n).for_each(|i| unsafe { page(p, i).write_volatile(i as u64) }));
        assert_eq!(b.scan_now(), n);
        let first = b.stats().registered;
        assert!(first >= 1, "{backend:?}: first-touch mappings are registered before the zap");
        // Local hint faults: every page revealed in place, no new mapping.
        // SAFETY: pages of the region.
        on_cpu(0, || (0..n).for_each(|i| unsafe { assert_eq!(page(p, i).read_volatile(), i as u64) }));
        assert_eq!(b.stats().numa_hint_faults_local, n as u64);
        assert_eq!(b.scan_now(), n);
        assert_eq!(b.stats().registered, first, "{backend:?}: nothing mapped anew, nothing registered");
        // Page 3 moves to node 1 on its second fault in a row from one thread there: a new
        // mapping, registered by the next scan.
        on_cpu(1, || {
            // SAFETY: a page of the region.
            unsafe { assert_eq!(page(p, 3).read_volatile(), 3) };
            b.scan_now();
            // SAFETY: as above.
            unsafe { assert_eq!(page(p, 3).read_volatile(), 3) };
        });
        assert_eq!(b.stats().numa_pages_migrated, 1, "{backend:?}");
        assert_eq!(b.stats().registered, first, "{backend:?}: page 3 was revealed in place before it moved");
        // SAFETY: pages of the region (the rest come back in place).
        on_cpu(0, || (0..n).for_each(|i| unsafe { assert_eq!(page(p, i).read_volatile(), i as u64) }));
        assert_eq!(b.scan_now(), n);
        assert!(b.stats().registered > first, "{backend:?}: the migrated page's run is registered");
        let hints = b.stats().numa_hint_faults;
        // SAFETY: a page of the region.
        on_cpu(1, || unsafe { assert_eq!(page(p, 3).read_volatile(), 3) });
        assert_eq!(b.stats().numa_hint_faults, hints + 1, "{backend:?}: the migrated page takes its hint");
        drop(r);
        drop(b);
        assert_eq!(allocated(&z), 0);
    }
}
