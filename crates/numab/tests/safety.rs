//! What a program does around balanced memory that the balancer must survive: faults taken
//! while zonal's locks are held, safe code freeing frames it does not own, its own
//! `MADV_DONTNEED` on a region page, and its own signal handlers touching region pages.
//! A hang is the failure of most of these, so each runs under a bound (`within`).
//!
//! A test binary of its own, not a module of tests/suite: it installs a SIGUSR1 handler for
//! the whole process, whose test relies on nothing else in the binary using SIGUSR1.

mod common;

use common::{driven_balancer, on_cpu};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zonal::topology::Machine;
use zonal::{Config, MemPolicy, Topology, Zonal};
use zonal_numab::{Backend, MigrateMode, PAGE};

fn zonal() -> Arc<Zonal> {
    let t = Topology::parse_for("nodes=2,size=64M,cpus=0:1", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    Arc::new(Zonal::new(Config::new(t)).unwrap())
}

fn backends() -> Vec<Backend> {
    let mut v = vec![Backend::Mprotect];
    if zonal_numab::userfaultfd_available().is_ok() {
        v.push(Backend::Userfaultfd);
    }
    if zonal_numab::userfaultfd_thread_available().is_ok() {
        v.push(Backend::UserfaultfdThread);
    }
    v
}

/// Runs `f` on its own thread and waits at most `secs` for it: a hang fails the test
/// instead of the suite (the stuck thread is left behind).
fn within<R: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(r) => r,
        Err(_) => panic!("{what}: still running after {secs} s"),
    }
}

/// Hint faults and migrations proceed while every zonal lock is held: the handler takes
/// none (before, its room test waited for the housekeeping pass's lock).
#[test]
fn hint_faults_take_no_zonal_lock() {
    for backend in backends() {
        let z = zonal();
        let b = driven_balancer(&z, backend, MigrateMode::Delayed, 64);
        let r = b.region(32 * PAGE, MemPolicy::Local).unwrap();
        let p = r.as_ptr() as usize;
        on_cpu(0, || (0..32).for_each(|i| unsafe { ((p + i * PAGE) as *mut u64).write_volatile(i as u64 + 1) }));
        assert_eq!(b.scan_now(), 32);
        z.hold_every_lock(|| {
            within(30, "hint faults under zonal's locks", move || {
                on_cpu(1, || {
                    for i in 0..32 {
                        // SAFETY: a page of the live region (the test keeps it alive).
                        assert_eq!(unsafe { ((p + i * PAGE) as *const u64).read_volatile() }, i as u64 + 1);
                    }
                })
            })
        });
        let s = b.stats();
        assert_eq!(s.numa_hint_faults, 32, "{backend:?}: {s:?}");
        assert!(s.numa_pages_migrated > 0, "{backend:?}: {s:?}");
        drop(r);
        drop(b);
        assert_eq!(z.check_invariants().unwrap(), 0);
    }
}

/// Safe code given the handle frees every frame of the arena it can name: none the
/// balancer holds (reserves, region pages, frames waiting to be freed) goes, the region
/// keeps its data, and every frame is back once the region and the balancer are.
#[test]
fn safe_code_cannot_free_the_balancers_frames() {
    let z = zonal();
    let b = driven_balancer(&z, Backend::Mprotect, MigrateMode::Delayed, 64);
    let r = b.region(64 * PAGE, MemPolicy::Local).unwrap();
    let p = r.as_ptr() as usize;
    on_cpu(0, || (0..64).for_each(|i| unsafe { ((p + i * PAGE) as *mut u64).write_volatile(i as u64 + 7) }));
    b.scan_now();
    // Half the pages move to node 1: their old frames wait on the free stack.
    on_cpu(1, || {
        (0..32).for_each(|i| unsafe {
            ((p + i * PAGE) as *const u64).read_volatile();
        })
    });
    assert!(b.stats().numa_pages_migrated > 0);
    let probe = b.zonal().alloc_pages(zonal::Gfp::empty(), 0).unwrap().as_ptr() as usize;
    let base = probe - b.zonal().addr_to_pfn(probe as *const u8).unwrap().0 * PAGE;
    let mut freed = Vec::new();
    let mut held = 0;
    for zone in b.zonal().zones() {
        for pfn in zone.start_pfn.0..zone.start_pfn.0 + zone.spanned {
            let a = base + pfn * PAGE;
            match b.zonal().free_pages(a as *mut u8, 0) {
                Ok(()) => freed.push(a),
                Err(zonal::Error::Held { .. }) => held += 1,
                Err(_) => {}
            }
        }
    }
    assert_eq!(freed, vec![probe], "safe frees took frames that were not theirs");
    assert!(held >= 64 + 64, "the region's frames and the reserves are held ({held})");
    for i in 0..64 {
        // SAFETY: a page of the live region.
        assert_eq!(unsafe { ((p + i * PAGE) as *const u64).read_volatile() }, i as u64 + 7);
    }
    b.housekeep();
    drop(r);
    drop(b);
    assert_eq!(z.check_invariants().unwrap(), 0, "frames left allocated");
}

/// The program's own `MADV_DONTNEED` on a region page it has mapped (the file keeps the
/// data): under userfaultfd the next access is a MINOR fault on a page the table has
/// `PRESENT`, which used to be retried for ever. It maps the page again.
#[test]
fn the_programs_own_madv_dontneed_is_repaired() {
    for backend in backends() {
        let z = zonal();
        let b = driven_balancer(&z, backend, MigrateMode::Delayed, 64);
        let r = b.region(16 * PAGE, MemPolicy::Local).unwrap();
        let p = r.as_ptr() as usize;
        // Touched, hidden (the scan registers the pages with the userfaultfd) and faulted
        // back on the same node (mapped in place, still registered).
        on_cpu(0, || (0..16).for_each(|i| unsafe { ((p + i * PAGE) as *mut u64).write_volatile(i as u64 + 3) }));
        b.scan_now();
        on_cpu(0, || {
            (0..16).for_each(|i| unsafe {
                ((p + i * PAGE) as *const u64).read_volatile();
            })
        });
        // SAFETY: the region's own pages; on this shared file mapping a zap keeps the data.
        assert_eq!(unsafe { libc::madvise(p as *mut libc::c_void, 16 * PAGE, libc::MADV_DONTNEED) }, 0);
        let sum = within(20, "an access after MADV_DONTNEED", move || {
            (0..16).map(|i| unsafe { ((p + i * PAGE) as *const u64).read_volatile() }).sum::<u64>()
        });
        assert_eq!(sum, (0..16).map(|i| i + 3).sum::<u64>(), "{backend:?}");
        drop(r);
        drop(b);
        assert_eq!(z.check_invariants().unwrap(), 0);
    }
}

static HANDLER_PAGE: AtomicUsize = AtomicUsize::new(0);
static HANDLER_RUNS: AtomicUsize = AtomicUsize::new(0);

/// The program's own asynchronous handler reads a region page.
extern "C" fn app_usr1(_sig: libc::c_int) {
    let p = HANDLER_PAGE.load(Ordering::Relaxed);
    if p != 0 {
        // SAFETY: a page of the live region (the test clears the address before the end).
        unsafe { std::ptr::read_volatile(p as *const u64) };
        HANDLER_RUNS.fetch_add(1, Ordering::Relaxed);
    }
}

/// A program's signal handler that reads a region page, delivered again and again to a
/// thread whose faults migrate that very page: the balancer's handler runs with signals
/// blocked, so the program's never runs while its thread holds the page `BUSY` (it would
/// wait for itself for ever).
#[test]
fn an_async_handler_touching_a_busy_page_does_not_deadlock() {
    // SAFETY: a plain handler for SIGUSR1, which nothing else in this test binary uses.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = app_usr1 as *const () as usize;
        act.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &act, std::ptr::null_mut()), 0);
    }
    for backend in backends().into_iter().filter(|b| *b != Backend::UserfaultfdThread) {
        let z = zonal();
        let b = Arc::new(driven_balancer(&z, backend, MigrateMode::Delayed, 256));
        let r = Arc::new(b.region(8 * PAGE, MemPolicy::Local).unwrap());
        let p = r.as_ptr() as usize;
        HANDLER_PAGE.store(p, Ordering::Relaxed);
        let (b2, r2) = (b.clone(), r.clone());
        within(60, "a handler touching a migrating page", move || {
            let stop = AtomicBool::new(false);
            let tid = AtomicUsize::new(0);
            std::thread::scope(|s| {
                let worker = s.spawn(|| {
                    // SAFETY: pthread_self has no preconditions.
                    tid.store(unsafe { libc::pthread_self() } as usize, Ordering::Release);
                    for round in 0..2_000u32 {
                        zonal::cpu::set_affinity(round % 2).unwrap();
                        for i in 0..8 {
                            // SAFETY: a page of the live region.
                            unsafe { ((p + i * PAGE) as *mut u64).write_volatile(round as u64) };
                        }
                        b2.scan_now();
                    }
                    stop.store(true, Ordering::Relaxed);
                });
                while tid.load(Ordering::Acquire) == 0 {
                    std::thread::yield_now();
                }
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: the worker thread lives until `stop` (it is joined below).
                    unsafe { libc::pthread_kill(tid.load(Ordering::Relaxed) as libc::pthread_t, libc::SIGUSR1) };
                    std::thread::sleep(Duration::from_micros(5));
                }
                worker.join().unwrap();
            });
            drop(r2);
        });
        HANDLER_PAGE.store(0, Ordering::Relaxed);
        assert!(b.stats().numa_pages_migrated > 0, "{backend:?}: {:?}", b.stats());
        drop(r);
        drop(b);
        assert_eq!(z.check_invariants().unwrap(), 0);
    }
    assert!(HANDLER_RUNS.load(Ordering::Relaxed) > 0);
}
