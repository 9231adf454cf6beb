//! `fork()` of a process with regions: the child shares no frame of its parent's regions.
//!
//! A test binary of its own, not a module of tests/suite: its children use the allocator
//! after `fork()`, which is safe only when no other thread of the process can hold a lock at
//! that moment (`SERIAL` below orders this file's tests; the suite's run on other threads).

mod common;

use common::child::*;
use std::sync::Mutex;
use zonal::MemPolicy;
use zonal_numab::{Error, PAGE};

/// One case at a time: a fork while another test's thread is inside the allocator would
/// leave the child a lock nobody releases.
static SERIAL: Mutex<()> = Mutex::new(());

/// A child of `fork()` shares no frame with its parent: touching an inherited region kills
/// it (with a message) instead of writing the parent's memory, and every call on the
/// inherited balancer and region is refused while dropping them does nothing. The parent
/// keeps its data and goes on balancing.
#[test]
fn a_forked_child_shares_no_frame_of_its_parent() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for backend in backends() {
        let z = zonal();
        let b = balancer(&z, backend);
        let r = b.region(32 * PAGE, MemPolicy::Local).unwrap();
        let p = r.as_ptr() as usize;
        // SAFETY: pages of the live region.
        (0..32).for_each(|i| unsafe { ((p + i * PAGE) as *mut u64).write_volatile(1) });
        b.scan_now();
        // A write in the child.
        let end = in_child(|| {
            // SAFETY: the inherited region's address (the write is the test).
            unsafe { (p as *mut u64).write_volatile(0xdead) };
            check(false, 10);
        });
        assert_eq!(end, End::Signal(libc::SIGSEGV), "{backend:?}: the child wrote the parent's page");
        // Calls in the child.
        let end = in_child(|| {
            check(matches!(r.prefault(0, PAGE), Err(Error::Forked)), 11);
            check(matches!(r.pin(0, PAGE), Err(Error::Forked)), 12);
            check(matches!(b.region(PAGE, MemPolicy::Local), Err(Error::Forked)), 13);
            check(b.scan_now() == 0, 14);
            // Dropping inherited state does nothing and does not hang.
            // SAFETY: the child's own copies; nothing uses them after.
            unsafe {
                std::ptr::read(&r);
                std::ptr::read(&b);
            }
        });
        assert_eq!(end, End::Exit(0), "{backend:?}");
        // The parent writes on, and its pages migrate.
        // SAFETY: pages of the live region.
        (0..32).for_each(|i| unsafe { ((p + i * PAGE) as *mut u64).write_volatile(2) });
        let sum: u64 = (0..32).map(|i| unsafe { ((p + i * PAGE) as *const u64).read_volatile() }).sum();
        assert_eq!(sum, 64, "{backend:?}: the parent's data changed");
        drop(r);
        drop(b);
        assert_eq!(z.check_invariants().unwrap(), 0);
    }
}
