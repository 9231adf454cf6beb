//! The kernel touching region memory while pages migrate: io_uring registered buffers and
//! O_DIRECT reads (the kernel holds the frame, not the mapping), and plain `read`, `write`,
//! `send` and `recv` (the kernel copies through the mapping). Buffers are pinned
//! (`Region::pin`); everything else in the region migrates under two threads that hop
//! between the nodes' CPUs while the balancer's thread scans every 2 ms and collapses.
//! Every byte the kernel wrote must be in the region, every byte it read must be what the
//! region held, and no call may fail with `EFAULT`.
//!
//! Without pins these fail: a pinned page that migrated leaves the kernel writing into the
//! old frame (the region keeps the old bytes), and a hidden buffer page makes a system call
//! fail with `EFAULT` under the `mprotect` and `userfaultfd` backends.

use crate::common;

use common::io::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use zonal::MemPolicy;
use zonal_numab::{Backend, Region, PAGE};

/// Region pages; the first `BUFS` are the pinned buffers.
const PAGES: usize = 512;
const BUFS: usize = 16;

/// mprotect and userfaultfd (SIGBUS), the backends whose system calls do not wait for a
/// hint fault; the handler-thread backend too where the machine allows it.
fn backends() -> Vec<Backend> {
    let mut v = vec![Backend::Mprotect];
    if zonal_numab::userfaultfd_available().is_ok() {
        v.push(Backend::Userfaultfd);
    } else {
        eprintln!("userfaultfd backend not tested: the kernel refuses it here");
    }
    v
}

/// Two threads, one bound to each CPU in turn, reading every page of the region (the
/// pinned ones included: their faults, were they hidden, would move them) and writing a
/// word of each unpinned one, until `stop`. Returns the words written per page.
fn movers<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    base: usize,
    stop: &'s AtomicBool,
) -> Vec<std::thread::ScopedJoinHandle<'s, Vec<u64>>> {
    (0..2u32)
        .map(|t| {
            s.spawn(move || {
                let mut writes = vec![0u64; PAGES];
                let mut round = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    zonal::cpu::set_affinity((round + t) % 2).expect("bind");
                    for (pg, count) in writes.iter_mut().enumerate() {
                        let w = (base + pg * PAGE + 8 * (1 + t as usize)) as *const AtomicU64;
                        // SAFETY: a word of a live region page; words 1 and 2 of the unpinned
                        // pages are these threads' own, atomics.
                        unsafe {
                            std::ptr::read_volatile((base + pg * PAGE) as *const u8);
                            if pg >= BUFS {
                                (*w).fetch_add(1, Ordering::Relaxed);
                                *count += 1;
                            }
                        }
                    }
                    round += 1;
                }
                writes
            })
        })
        .collect()
}

/// Checks the movers' words: every increment landed.
fn check_movers(r: &Region, writes: Vec<Vec<u64>>) {
    for (t, w) in writes.iter().enumerate() {
        for (pg, &n) in w.iter().enumerate().skip(BUFS) {
            // SAFETY: a word of a live region page; the movers have stopped.
            let got = unsafe { ((r.as_ptr() as usize + pg * PAGE + 8 * (1 + t)) as *const u64).read_volatile() };
            assert_eq!(got, n, "page {pg}: mover {t} lost increments");
        }
    }
}

/// Runs `io` on the pinned first `BUFS` pages of a region while movers migrate the rest
/// under a scanner every 2 ms and collapses, then checks every increment, that enough
/// migrated to mean anything, and that every frame is back.
fn under_migration(backend: Backend, io: impl FnOnce(&Region) + Send) {
    let (z, b) = scanning_balancer(backend, "64M");
    let r = b.region(PAGES * PAGE, MemPolicy::Local).unwrap();
    let pin = r.pin(0, BUFS * PAGE).unwrap();
    let stop = AtomicBool::new(false);
    let writes = std::thread::scope(|s| {
        let hs = movers(s, r.as_ptr() as usize, &stop);
        let _stop = StopOnDrop(&stop);
        io(&r);
        stop.store(true, Ordering::Relaxed);
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    check_movers(&r, writes);
    let s = b.stats();
    eprintln!(
        "{backend:?}: {} pages migrated, {} collapsed, {} refused as pinned",
        s.numa_pages_migrated, s.collapsed_pages, s.pgmigrate_fail_pinned
    );
    assert!(s.numa_pages_migrated >= 100, "{backend:?}: too few migrations to mean anything: {s:?}");
    drop(pin);
    drop(r);
    drop(b);
    assert_eq!(z.check_invariants().unwrap(), 0, "{backend:?}: frames left allocated");
}

/// io_uring `READ_FIXED` from a pipe into pinned region pages and `WRITE_FIXED` from them,
/// 10,000 of each per backend, while the rest of the region migrates.
#[test]
fn io_uring_fixed_buffers_in_pinned_pages_lose_no_write() {
    if let Err(e) = io_uring::IoUring::new(8) {
        eprintln!("io_uring not tested: {e}");
        return;
    }
    for backend in backends() {
        under_migration(backend, |r| {
            let mut ring = io_uring::IoUring::new(8).unwrap();
            let iov: Vec<libc::iovec> = (0..BUFS)
                .map(|k| libc::iovec { iov_base: r.as_ptr().wrapping_add(k * PAGE).cast(), iov_len: PAGE })
                .collect();
            // SAFETY: the buffers are pinned region pages that outlive the registration (it
            // is dropped with the ring, before the pin).
            unsafe { ring.submitter().register_buffers(&iov) }.expect("register the pinned pages");
            let (rd, wr) = pipe();
            let mut want = vec![0u8; PAGE];
            let mut got = vec![0u8; PAGE];
            for i in 0..10_000usize {
                let k = i % BUFS;
                let buf = r.as_ptr().wrapping_add(k * PAGE);
                // The kernel writes the page (READ_FIXED from the pipe).
                pattern(i, &mut want);
                write_all(wr.as_raw_fd(), &want);
                let sqe =
                    io_uring::opcode::ReadFixed::new(io_uring::types::Fd(rd.as_raw_fd()), buf, PAGE as u32, k as u16)
                        .offset(u64::MAX)
                        .build();
                // SAFETY: the buffer is registered and pinned, alive until the completion.
                unsafe { ring.submission().push(&sqe).unwrap() };
                ring.submit_and_wait(1).unwrap();
                let cqe = ring.completion().next().unwrap();
                assert_eq!(cqe.result(), PAGE as i32, "{backend:?}: READ_FIXED {i}");
                // SAFETY: page k of the live region, written by nobody else.
                assert!(unsafe { region_bytes(r, k * PAGE, PAGE) } == want, "{backend:?}: READ_FIXED {i} lost");
                // The kernel reads the page (WRITE_FIXED to the pipe) after a store through
                // the mapping.
                pattern(i + 1_000_003, &mut want);
                // SAFETY: page k of the live region, this thread's alone.
                unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), buf, PAGE) };
                let sqe =
                    io_uring::opcode::WriteFixed::new(io_uring::types::Fd(wr.as_raw_fd()), buf, PAGE as u32, k as u16)
                        .offset(u64::MAX)
                        .build();
                // SAFETY: as above.
                unsafe { ring.submission().push(&sqe).unwrap() };
                ring.submit_and_wait(1).unwrap();
                let cqe = ring.completion().next().unwrap();
                assert_eq!(cqe.result(), PAGE as i32, "{backend:?}: WRITE_FIXED {i}");
                read_exact(rd.as_raw_fd(), &mut got);
                assert!(got == want, "{backend:?}: WRITE_FIXED {i} sent stale bytes");
            }
        });
    }
}

/// O_DIRECT reads (the block layer writes the frames the call pinned) into pinned region
/// pages, where the temporary directory's filesystem supports O_DIRECT.
#[test]
fn o_direct_reads_into_pinned_pages_land() {
    const FILE_PAGES: usize = 64;
    let dir = std::env::temp_dir();
    let path = dir.join(format!("zonal-numab-odirect-{}", std::process::id()));
    let mut data = vec![0u8; FILE_PAGES * PAGE];
    pattern(7, &mut data);
    std::fs::write(&path, &data).unwrap();
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECT | libc::O_CLOEXEC) };
    let _ = std::fs::remove_file(&path);
    if fd < 0 {
        eprintln!("O_DIRECT not tested: {} refuses it ({})", dir.display(), std::io::Error::last_os_error());
        return;
    }
    // SAFETY: a fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    for backend in backends() {
        under_migration(backend, |r| {
            for i in 0..2_000usize {
                let pages = 1 + i % 4;
                let k = (i * 5) % (BUFS - pages + 1);
                let at = (i * 3) % (FILE_PAGES - pages + 1);
                // SAFETY: pinned region pages `k..k + pages`, this thread's alone; the
                // descriptor is open.
                let n = unsafe {
                    libc::pread(
                        fd.as_raw_fd(),
                        r.as_ptr().add(k * PAGE).cast(),
                        pages * PAGE,
                        (at * PAGE) as libc::off_t,
                    )
                };
                assert_eq!(n, (pages * PAGE) as isize, "{backend:?}: pread {i}: {}", std::io::Error::last_os_error());
                // SAFETY: as above.
                let got = unsafe { region_bytes(r, k * PAGE, pages * PAGE) };
                assert!(got == data[at * PAGE..(at + pages) * PAGE], "{backend:?}: O_DIRECT read {i} lost");
            }
        });
    }
}

/// `write` from and `read` into pinned pages through a pipe, `send` and `recv` through a
/// socket pair: 100,000 calls per backend, none failing, every byte checked.
#[test]
fn system_calls_on_pinned_pages_never_fault() {
    for backend in backends() {
        under_migration(backend, |r| {
            let (rd, wr) = pipe();
            let mut sv = [0; 2];
            // SAFETY: `sv` is valid for the call.
            assert_eq!(
                unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, sv.as_mut_ptr()) },
                0
            );
            // SAFETY: fresh descriptors.
            let (sa, sb) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
            let mut calls = 0;
            let len = 512;
            let mut want = vec![0u8; len];
            let mut i = 0usize;
            while calls < 100_000 {
                let (src, dst) = (i % BUFS, (i + 1 + i / BUFS) % BUFS);
                let (src, dst) = (src * PAGE + (i * 64) % (PAGE - len), dst * PAGE + (i * 128) % (PAGE - len));
                pattern(i, &mut want);
                // SAFETY: pinned region bytes, this thread's alone; descriptors open.
                unsafe {
                    std::ptr::copy_nonoverlapping(want.as_ptr(), r.as_ptr().add(src), len);
                    let (via_r, via_w) = if i % 2 == 0 { (&rd, &wr) } else { (&sb, &sa) };
                    let n = if i % 2 == 0 {
                        libc::write(via_w.as_raw_fd(), r.as_ptr().add(src).cast(), len)
                    } else {
                        libc::send(via_w.as_raw_fd(), r.as_ptr().add(src).cast(), len, 0)
                    };
                    assert_eq!(n, len as isize, "{backend:?}: call {i}: {}", std::io::Error::last_os_error());
                    let n = if i % 2 == 0 {
                        libc::read(via_r.as_raw_fd(), r.as_ptr().add(dst).cast(), len)
                    } else {
                        libc::recv(via_r.as_raw_fd(), r.as_ptr().add(dst).cast(), len, libc::MSG_WAITALL)
                    };
                    assert_eq!(n, len as isize, "{backend:?}: call {i}: {}", std::io::Error::last_os_error());
                    assert!(region_bytes(r, dst, len) == want, "{backend:?}: call {i}: bytes differ");
                }
                calls += 2;
                i += 1;
            }
        });
    }
}

/// Pins nest, need a live range, and an unpin of a page without one changes nothing.
#[test]
fn pins_nest_and_bad_unpins_are_errors() {
    let (z, b) = scanning_balancer(Backend::Mprotect, "64M");
    b.set_enabled(false);
    let r = b.region(8 * PAGE, MemPolicy::Local).unwrap();
    assert!(matches!(r.pin(0, 0), Err(zonal_numab::Error::InvalidSize { bytes: 0 })));
    assert!(matches!(r.pin(PAGE, 8 * PAGE), Err(zonal_numab::Error::OutOfRange { .. })));
    assert!(matches!(r.pin(usize::MAX, 2), Err(zonal_numab::Error::OutOfRange { .. })));
    r.pin_pages(0, 2 * PAGE).unwrap();
    {
        let _inner = r.pin(PAGE, 10).unwrap();
    }
    // Page 1 still holds the outer pin; page 2 holds none, so the whole unpin is refused.
    assert!(matches!(r.unpin(PAGE, 2 * PAGE), Err(zonal_numab::Error::NotPinned { .. })));
    r.unpin(0, 2 * PAGE).unwrap();
    assert!(matches!(r.unpin(0, PAGE), Err(zonal_numab::Error::NotPinned { .. })));
    // A pin gave pages frames: the first two pages were touched by it.
    assert!(r.page_to_nid(r.as_ptr()).unwrap().is_some());
    drop(r);
    drop(b);
    assert_eq!(z.check_invariants().unwrap(), 0);
}
