//! The application's own SIGSEGV handler keeps working for faults outside regions: installed
//! before the balancer, it is chained to; region faults never reach it. (Its own process:
//! the handler is process-wide.)
//!
//! A test binary of its own, not a module of tests/suite: the program's handler must be
//! installed before any balancer of the process, and it is process-wide.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use zonal::topology::Machine;
use zonal::{Config, MemPolicy, Topology, Zonal};
use zonal_numab::{Balancer, PAGE};

static APP_FAULTS: AtomicUsize = AtomicUsize::new(0);
static APP_PAGE: AtomicUsize = AtomicUsize::new(0);

/// The application's handler: makes its own guard page accessible and counts.
extern "C" fn app_handler(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: a valid siginfo from the kernel; mprotect is async-signal-safe and the page is
    // the test's own.
    unsafe {
        let addr = (*info).si_addr() as usize & !(PAGE - 1);
        if addr == APP_PAGE.load(Ordering::Relaxed) {
            APP_FAULTS.fetch_add(1, Ordering::Relaxed);
            libc::mprotect(addr as *mut libc::c_void, PAGE, libc::PROT_READ | libc::PROT_WRITE);
        }
    }
}

#[test]
fn faults_outside_regions_reach_the_previous_handler() {
    // SAFETY: zeroed sigaction is valid; the test owns the process's SIGSEGV disposition
    // until the balancer chains to it.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = app_handler as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGSEGV, &act, std::ptr::null_mut()), 0);
    }
    let t = Topology::parse_for("nodes=2,size=16M,cpus=0:1", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    let z = Arc::new(Zonal::new(Config::new(t)).unwrap());
    let cfg = zonal_numab::Config { scan_delay_ms: 3_600_000, ..Default::default() };
    let b = Balancer::new(z, cfg).unwrap();
    let r = b.region(4 * PAGE, MemPolicy::Local).unwrap();
    // SAFETY: a fresh inaccessible page of the test's own.
    let guard = unsafe {
        libc::mmap(std::ptr::null_mut(), PAGE, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert_ne!(guard, libc::MAP_FAILED);
    APP_PAGE.store(guard as usize, Ordering::Relaxed);
    // SAFETY: the region's page (first touch) and the guard page (the app's handler opens it).
    unsafe {
        r.as_ptr().cast::<u64>().write_volatile(1);
        guard.cast::<u64>().write_volatile(2);
        assert_eq!(guard.cast::<u64>().read_volatile(), 2);
        r.as_ptr().add(PAGE).cast::<u64>().write_volatile(3);
    }
    assert_eq!(APP_FAULTS.load(Ordering::Relaxed), 1, "the app's fault went to the app's handler");
    assert_eq!(b.stats().first_touch, 2, "region faults stayed with the balancer");
    // SAFETY: the test's own mapping.
    unsafe { libc::munmap(guard, PAGE) };
}
