//! Everything a program does to balanced memory, at once, for a bounded time (`ZONAL_CHAOS_SECS`,
//! default 10, split between the backends): io_uring fixed buffers and plain system calls on
//! pinned pages, threads hopping between the nodes' CPUs with increments (and a handler of
//! their own that reads a region page, signalled again and again), regions made, touched at
//! random, zapped by the program and dropped, forked children touching what they inherited,
//! and the mapping budget pulled down and let go, while the balancer's thread scans every
//! 2 ms and collapses. Every byte and every increment is checked, and every frame is back at
//! the end.
//!
//! A test binary of its own, not a module of tests/suite: it installs a SIGUSR1 handler and
//! forks children, both process-wide, and .ci/run runs it alone for longer
//! (`ZONAL_CHAOS_SECS=40 cargo test --release -p zonal-numab --test chaos`).

mod common;

use common::io::*;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use zonal::MemPolicy;
use zonal_numab::{Backend, PAGE};

const PAGES: usize = 1024;
/// Pinned pages: io_uring's buffers, then the system calls'.
const IO_BUFS: usize = 8;
const SYS_BUFS: usize = 8;
const PINNED: usize = IO_BUFS + SYS_BUFS;

static USR1_PAGE: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_usr1(_sig: libc::c_int) {
    let p = USR1_PAGE.load(Ordering::Relaxed);
    if p != 0 {
        // SAFETY: a pinned page of the live region (cleared before the region goes).
        unsafe { std::ptr::read_volatile(p as *const u64) };
    }
}

fn secs() -> f64 {
    std::env::var("ZONAL_CHAOS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10.0)
}

#[test]
fn everything_at_once_for_a_bounded_time() {
    // SAFETY: a plain SIGUSR1 handler, which nothing else in this binary uses.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_usr1 as *const () as usize;
        act.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &act, std::ptr::null_mut()), 0);
    }
    let mut backends = vec![Backend::Mprotect];
    if zonal_numab::userfaultfd_available().is_ok() {
        backends.push(Backend::Userfaultfd);
    }
    let each = Duration::from_secs_f64(secs() / backends.len() as f64);
    for backend in backends {
        run(backend, each);
    }
}

fn run(backend: Backend, time: Duration) {
    let (z, b) = scanning_balancer(backend, "256M");
    let r = b.region(PAGES * PAGE, MemPolicy::Local).unwrap();
    let pin = r.pin(0, PINNED * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    USR1_PAGE.store(base, Ordering::Relaxed);
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + time;
    let (ios, calls, forks, regions) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let movers_tid: Vec<AtomicUsize> = (0..2).map(|_| AtomicUsize::new(0)).collect();
    let tallies = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        // Movers: increments on the unpinned pages from both nodes in turn.
        let movers: Vec<_> = (0..2u32)
            .map(|t| {
                let (stop, tid) = (&stop, &movers_tid[t as usize]);
                s.spawn(move || {
                    // SAFETY: pthread_self has no preconditions.
                    tid.store(unsafe { libc::pthread_self() } as usize, Ordering::Release);
                    let mut n = vec![0u64; PAGES];
                    let mut round = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        zonal::cpu::set_affinity((round + t) % 2).unwrap();
                        for (pg, c) in n.iter_mut().enumerate().skip(PINNED) {
                            let w = (base + pg * PAGE + 8 * (1 + t as usize)) as *const AtomicU64;
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
        // io_uring on the first pinned pages.
        s.spawn(|| {
            let Ok(mut ring) = io_uring::IoUring::new(8) else { return };
            let iov: Vec<libc::iovec> = (0..IO_BUFS)
                .map(|k| libc::iovec { iov_base: (base + k * PAGE) as *mut libc::c_void, iov_len: PAGE })
                .collect();
            // SAFETY: pinned region pages, registered while the ring lives (dropped here).
            unsafe { ring.submitter().register_buffers(&iov) }.unwrap();
            let (rd, wr) = pipe();
            let mut want = vec![0u8; PAGE];
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let k = i % IO_BUFS;
                pattern(i, &mut want);
                write_all(wr.as_raw_fd(), &want);
                let sqe = io_uring::opcode::ReadFixed::new(
                    io_uring::types::Fd(rd.as_raw_fd()),
                    (base + k * PAGE) as *mut u8,
                    PAGE as u32,
                    k as u16,
                )
                .offset(u64::MAX)
                .build();
                // SAFETY: a registered, pinned buffer, alive until the completion.
                unsafe { ring.submission().push(&sqe).unwrap() };
                while let Err(e) = ring.submit_and_wait(1) {
                    assert_eq!(e.raw_os_error(), Some(libc::EINTR), "{backend:?}: io_uring: {e}");
                }
                assert_eq!(ring.completion().next().unwrap().result(), PAGE as i32);
                // SAFETY: page k of the live region, this thread's alone.
                assert!(unsafe { region_bytes_at(base + k * PAGE, PAGE) } == want, "{backend:?}: READ_FIXED {i} lost");
                ios.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
        // read/write through a pipe on the other pinned pages.
        s.spawn(|| {
            let (rd, wr) = pipe();
            let mut want = vec![0u8; 256];
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let (src, dst) = (IO_BUFS + i % SYS_BUFS, IO_BUFS + (i + 3) % SYS_BUFS);
                let (src, dst) = (base + src * PAGE + 512, base + dst * PAGE + 1024);
                pattern(i, &mut want);
                // SAFETY: pinned region bytes, this thread's alone; the pipe is open.
                unsafe {
                    std::ptr::copy_nonoverlapping(want.as_ptr(), src as *mut u8, want.len());
                    assert_eq!(libc::write(wr.as_raw_fd(), src as *const libc::c_void, 256), 256, "{backend:?}");
                    assert_eq!(libc::read(rd.as_raw_fd(), dst as *mut libc::c_void, 256), 256, "{backend:?}");
                    assert!(region_bytes_at(dst, 256) == want, "{backend:?}: read {i}");
                }
                calls.fetch_add(2, Ordering::Relaxed);
                i += 1;
            }
        });
        // Regions made, touched at random, zapped by the program, checked and dropped.
        s.spawn(|| {
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let n = 64 + (k * 37) % 192;
                let q = b.region(n * PAGE, MemPolicy::Local).unwrap();
                let p = q.as_ptr() as usize;
                for j in 0..n {
                    // A prime stride above every size: each page once, in a scattered order.
                    let pg = (j * 7919 + k) % n;
                    // SAFETY: a page of the live region.
                    unsafe { ((p + pg * PAGE) as *mut u64).write_volatile(pg as u64 + 1) };
                }
                // SAFETY: the region's own pages; a zap of its shared mapping keeps the data.
                unsafe { libc::madvise((p + PAGE) as *mut libc::c_void, 8 * PAGE, libc::MADV_DONTNEED) };
                for pg in 0..n {
                    // SAFETY: as above.
                    assert_eq!(unsafe { ((p + pg * PAGE) as *const u64).read_volatile() }, pg as u64 + 1);
                }
                drop(q);
                regions.fetch_add(1, Ordering::Relaxed);
                k += 1;
            }
        });
        // Children that touch what they inherited, and the budget pulled down and let go.
        s.spawn(|| {
            let null = std::fs::OpenOptions::new().write(true).open("/dev/null").unwrap();
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if i % 2 == 0 {
                    // SAFETY: the child writes an inherited page (it must die of it) and exits.
                    let pid = unsafe { libc::fork() };
                    if pid == 0 {
                        // SAFETY: as above; the child's message goes nowhere (it is tested
                        // in fork.rs), so that the log keeps to the parent's lines.
                        unsafe {
                            libc::dup2(null.as_raw_fd(), 2);
                            ((base + (PINNED + 5) * PAGE) as *mut u64).write_volatile(0xdead);
                            libc::_exit(0);
                        }
                    }
                    let mut status = 0;
                    // SAFETY: `pid` is this process's child.
                    unsafe { libc::waitpid(pid, &mut status, 0) };
                    assert!(libc::WIFSIGNALED(status), "{backend:?}: a child wrote its parent's region");
                    forks.fetch_add(1, Ordering::Relaxed);
                } else {
                    b.set_vma_budget(1);
                    std::thread::sleep(Duration::from_millis(20));
                    b.set_vma_budget(usize::MAX);
                }
                std::thread::sleep(Duration::from_millis(30));
                i += 1;
            }
        });
        // Signals to the movers.
        s.spawn(|| {
            while movers_tid.iter().any(|t| t.load(Ordering::Acquire) == 0) {
                std::thread::yield_now();
            }
            while !stop.load(Ordering::Relaxed) {
                for t in &movers_tid {
                    // SAFETY: the movers live until `stop` (they are joined after it).
                    unsafe { libc::pthread_kill(t.load(Ordering::Relaxed) as libc::pthread_t, libc::SIGUSR1) };
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        movers.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    USR1_PAGE.store(0, Ordering::Relaxed);
    for (t, n) in tallies.iter().enumerate() {
        for (pg, &c) in n.iter().enumerate().skip(PINNED) {
            // SAFETY: a word of a live region page; the movers have stopped.
            let got = unsafe { ((base + pg * PAGE + 8 * (1 + t)) as *const u64).read_volatile() };
            assert_eq!(got, c, "{backend:?}: page {pg}: mover {t} lost increments");
        }
    }
    let st = b.stats();
    eprintln!(
        "{backend:?}: {} I/Os, {} calls, {} forks, {} regions; {} pages migrated, {} collapsed",
        ios.load(Ordering::Relaxed),
        calls.load(Ordering::Relaxed),
        forks.load(Ordering::Relaxed),
        regions.load(Ordering::Relaxed),
        st.numa_pages_migrated,
        st.collapsed_pages
    );
    assert!(st.numa_pages_migrated > 0 && forks.load(Ordering::Relaxed) > 0, "{backend:?}: {st:?}");
    drop(pin);
    drop(r);
    drop(b);
    assert_eq!(z.check_invariants().unwrap(), 0, "{backend:?}: frames left allocated");
}
