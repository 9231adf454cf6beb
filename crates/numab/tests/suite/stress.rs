//! Nothing is lost: threads hammer a region with atomic increments and read-after-write
//! checks while the scanner runs every millisecond and the threads hop between the two
//! nodes' CPUs, so pages migrate under them again and again, in both mapping orders. Every
//! increment must land (a write that went to an old frame during a copy would be lost), every
//! value read must be the last one written, and every frame must be back when it is over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use zonal::topology::Machine;
use zonal::{Config, MemPolicy, Topology, Zonal};
use zonal_numab::{Backend, Balancer, MigrateMode, PAGE};

/// Two chunks: threads work in the first and touch the second now and then, so a fault in
/// the second often finds it all hinted and moves it whole while others touch it.
const PAGES: usize = 1024;
const THREADS: usize = 4;
const WORDS: usize = PAGE / 8;
/// Migrations each run must see before it stops (it stops at `MAX_OPS` per thread anyway,
/// and fails if it saw none).
const WANT_MIGRATIONS: u64 = 2_000;
const MIN_OPS: u64 = 200_000;
const MAX_OPS: u64 = 50_000_000;

fn run(mode: MigrateMode, backend: Backend) {
    let t = Topology::parse_for("nodes=2,size=64M,cpus=0:1", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    let z = Arc::new(Zonal::new(Config::new(t)).unwrap());
    let cfg = zonal_numab::Config {
        mode,
        backend,
        scan_delay_ms: 0,
        scan_period_min_ms: 1,
        scan_period_max_ms: 1,
        scan_size_mb: 4,
        reserve_pages: 128,
        // Collapses as fast as the balancer's thread can copy, racing the threads' faults
        // and the migrations.
        collapse_mb: 1 << 12,
        ..Default::default()
    };
    let b = Balancer::new(z.clone(), cfg).unwrap();
    let r = b.region(PAGES * PAGE, MemPolicy::Local).unwrap();
    let p = r.as_ptr() as usize;
    let word = |page: usize, w: usize| (p + page * PAGE + w * 8) as *const AtomicU64;
    let ncpu = zonal::cpu::nr_cpus_online().max(1) as u32;
    // Per thread, per page: the increments it made.
    let tallies: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let b = &b;
                s.spawn(move || {
                    let mut tally = vec![0u64; PAGES];
                    // The thread's own check word per page: the last value it wrote there.
                    let own = WORDS - 1 - t;
                    let mut last = vec![0u64; PAGES];
                    let mut i: u64 = 0;
                    loop {
                        if i % 5_000 == 0 {
                            let _ = zonal::cpu::set_affinity(((i / 5_000) as u32 + t as u32) % ncpu);
                        }
                        let pg = if i % 16 == 0 {
                            PAGES / 2 + (i as usize * 13 + t) % (PAGES / 2)
                        } else {
                            (i as usize * 7 + t * 31) % (PAGES / 2)
                        };
                        let w = (i as usize) % (WORDS - THREADS);
                        // SAFETY: inside the region; every page is valid, mapped on first touch.
                        unsafe { (*word(pg, w)).fetch_add(1, Ordering::Relaxed) };
                        tally[pg] += 1;
                        // SAFETY: as above; word `own` of each page is this thread's alone.
                        let seen = unsafe { (*word(pg, own)).load(Ordering::Relaxed) };
                        assert_eq!(seen, last[pg], "{mode:?}: thread {t} page {pg}: read {seen}, wrote {}", last[pg]);
                        last[pg] = i + 1;
                        // SAFETY: as above.
                        unsafe { (*word(pg, own)).store(i + 1, Ordering::Relaxed) };
                        i += 1;
                        if i >= MAX_OPS || (i >= MIN_OPS && b.stats().numa_pages_migrated >= WANT_MIGRATIONS) {
                            break;
                        }
                    }
                    tally
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let s = b.stats();
    assert!(s.numa_pages_migrated > 0, "{mode:?} {backend:?}: no page migrated ({s:?})");
    eprintln!(
        "{mode:?} {backend:?}: {} pages migrated, {} in chunks; {} pages collapsed in {} windows",
        s.numa_pages_migrated,
        s.chunks_migrated * 512,
        s.collapsed_pages,
        s.collapsed
    );
    for pg in 0..PAGES {
        let want: u64 = tallies.iter().map(|t| t[pg]).sum();
        // SAFETY: as above; every thread has stopped.
        let got: u64 = (0..WORDS - THREADS).map(|w| unsafe { (*word(pg, w)).load(Ordering::Relaxed) }).sum();
        assert_eq!(got, want, "{mode:?}: page {pg} lost {} increments", want as i64 - got as i64);
    }
    assert_eq!(s.numa_hint_faults_local + (s.numa_hint_faults - s.numa_hint_faults_local), s.numa_hint_faults);
    assert!(s.numa_pte_updates >= s.numa_hint_faults, "{s:?}");
    drop(r);
    drop(b);
    // The balancer's reserves and the region's frames are all back.
    assert_eq!(z.check_invariants().unwrap(), 0, "{mode:?}: frames left allocated");
}

#[test]
fn mprotect_delayed_loses_nothing() {
    run(MigrateMode::Delayed, Backend::Mprotect);
}

#[test]
fn mprotect_eager_loses_nothing() {
    run(MigrateMode::Eager, Backend::Mprotect);
}

/// A userfaultfd backend where the machine allows it (else said on stderr): `available` is
/// the crate's check for that backend.
fn uffd_run(mode: MigrateMode, backend: Backend, available: fn() -> Result<(), (&'static str, i32)>) {
    match available() {
        Ok(()) => run(mode, backend),
        Err((call, errno)) if errno == libc::EPERM || errno == libc::ENOSYS || errno == libc::ENOTSUP => {
            eprintln!("{backend:?} backend not tested: {call} refused with errno {errno} on this machine")
        }
        Err(e) => panic!("{backend:?}: userfaultfd failed unexpectedly: {e:?}"),
    }
}

#[test]
fn userfaultfd_delayed_loses_nothing() {
    uffd_run(MigrateMode::Delayed, Backend::Userfaultfd, zonal_numab::userfaultfd_available);
}

#[test]
fn userfaultfd_eager_loses_nothing() {
    uffd_run(MigrateMode::Eager, Backend::Userfaultfd, zonal_numab::userfaultfd_available);
}

#[test]
fn userfaultfd_thread_delayed_loses_nothing() {
    uffd_run(MigrateMode::Delayed, Backend::UserfaultfdThread, zonal_numab::userfaultfd_thread_available);
}

#[test]
fn userfaultfd_thread_eager_loses_nothing() {
    uffd_run(MigrateMode::Eager, Backend::UserfaultfdThread, zonal_numab::userfaultfd_thread_available);
}
