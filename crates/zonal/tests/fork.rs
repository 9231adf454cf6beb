//! fork() never shares frames: the child of a process with a handle cannot touch the
//! parent's frames (they fault), cannot allocate or free through the inherited handle
//! (`Error::Forked`, -EPERM through the C ABI), and no mapping of its own lands in the
//! handle's range; the parent's handle is whole after the child is gone.
//!
//! Each child runs only this file's code and zonal's, then `_exit`s with a status the
//! parent checks; a failed check in the child writes its message to stderr with one
//! `write` (no lock a parent thread may have held) and exits with status 1.
//!
//! A test binary of its own, not a module of tests/suite: it forks, and its children run
//! zonal's code after the fork, which is safe only when no other thread of the process can
//! be inside the allocator or hold a lock at that moment (true of this file's few tests, not
//! of the suite's).

use std::ffi::c_void;
use std::ptr::NonNull;
use zonal::{Config, Error, Gfp, MemPolicy, NodeId, Topology, Zonal};

const PAGE: usize = 4096;

fn zonal() -> Zonal {
    Zonal::new(Config::new(Topology::parse("nodes=2,size=32M").unwrap())).unwrap()
}

/// Forks; the child runs `child` and exits with 0 when it returns `Ok`, 1 with the message
/// on stderr otherwise (or on a panic). Returns the child's wait status.
fn in_child(child: impl FnOnce() -> Result<(), String>) -> i32 {
    // SAFETY: the child runs only `child` (this file's checks and zonal's calls, which are
    // fork-safe: the allocator glibc resets at fork, no lock another thread may hold) and
    // leaves with `_exit`, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child))
            .unwrap_or_else(|_| Err("the child panicked".into()));
        let code = match r {
            Ok(()) => 0,
            Err(msg) => {
                let msg = format!("fork child: {msg}\n");
                // SAFETY: writes the message's bytes to fd 2.
                unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
                1
            }
        };
        // SAFETY: leaves the child at once, running no atexit handler or destructor of the
        // parent's state.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just made; `status` is writable.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
    status
}

/// Pins the calling thread to the CPU it runs on.
fn pin_to_this_cpu() {
    // SAFETY: `sched_getcpu` has no precondition; the set is a zeroed `cpu_set_t` with one
    // CPU added, passed with its size.
    unsafe {
        let cpu = libc::sched_getcpu();
        assert!(cpu >= 0, "sched_getcpu: {}", std::io::Error::last_os_error());
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        assert_eq!(libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set), 0);
    }
}

fn exited_ok(status: i32) -> bool {
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

/// `Err` with `what` unless `r` is `Error::Forked` naming this test's process.
fn forked<T: std::fmt::Debug>(what: &str, r: Result<T, Error>, parent: u32) -> Result<(), String> {
    match r {
        Err(Error::Forked { creator }) if creator == parent => {
            let msg = Error::Forked { creator }.to_string();
            let named = format!("created by process {parent}; a forked child (process {})", std::process::id());
            if msg.contains(&named) {
                Ok(())
            } else {
                Err(format!("{what}: the message does not name the processes: {msg}"))
            }
        }
        r => Err(format!("{what}: {r:?}, not Forked by {parent}")),
    }
}

fn check(what: &str, ok: bool) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what.to_string())
    }
}

#[test]
fn a_child_that_writes_a_parent_frame_dies_and_the_parent_keeps_its_value() {
    let z = zonal();
    let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr().cast::<u64>();
    // SAFETY: `p` is a frame this test allocated.
    unsafe { p.write_volatile(1) };
    let status = in_child(|| {
        // No core file for the fault this child is meant to die of.
        let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: sets this process's core limit from a valid struct.
        unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
        // SAFETY: the frame is the parent's; in the child it must fault, which is the test.
        unsafe { p.write_volatile(0xdead) };
        Err("the child wrote the parent's frame".into())
    });
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
        "the child was not killed by SIGSEGV (status {status:#x}): it shared the frame"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { p.read_volatile() }, 1, "the parent's frame changed");
    z.free_pages(p.cast(), 0).unwrap();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn a_raw_fork_shares_no_frame_either() {
    let z = zonal();
    let p = z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr().cast::<u64>();
    // SAFETY: `p` is a frame this test allocated.
    unsafe { p.write_volatile(1) };
    // The fork system call itself, which runs no pthread_atfork handler: MADV_DONTFORK alone
    // keeps the frames out of the child.
    // SAFETY: the child only sets its core limit, writes the frame (which must fault) and
    // `_exit`s.
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) } as libc::pid_t;
    assert!(pid >= 0, "clone: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: as above.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            p.write_volatile(0xbeef);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child just made.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
        "the raw child was not killed by SIGSEGV (status {status:#x}): it shared the frame"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { p.read_volatile() }, 1, "the parent's frame changed");
    z.free_pages(p.cast(), 0).unwrap();
}

#[test]
fn an_inherited_handle_neither_allocates_nor_frees() {
    let z = zonal();
    let parent = std::process::id();
    // Blocks of every free path's order (0, 1-3 and 9 take restartable sequences, 4 the
    // locked path), frames for the bulk frees (2: the few-page path; 10: the run path).
    let blocks: Vec<(NonNull<u8>, u32)> =
        [0u32, 1, 3, 4, 9].iter().map(|&o| (z.alloc_pages(Gfp::KERNEL, o).unwrap(), o)).collect();
    let frames: Vec<*mut u8> = (0..12).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap().as_ptr()).collect();
    let held_pages: usize = blocks.iter().map(|(_, o)| 1usize << o).sum::<usize>() + frames.len();
    // This thread (and so the child) on one CPU, whose caches the frees below leave warm:
    // without the child handler's stand-ins, the child's sections would pop these blocks
    // and push its frees next to them.
    pin_to_this_cpu();
    for o in [0u32, 1, 3, 9] {
        let b: Vec<_> = (0..2).map(|_| z.alloc_pages(Gfp::KERNEL, o).unwrap()).collect();
        for p in b {
            z.free_pages(p.as_ptr(), o).unwrap();
        }
    }
    let status = in_child(|| {
        forked("check_not_forked", z.check_not_forked(), parent)?;
        for o in [0u32, 1, 3, 4, 9] {
            forked(&format!("alloc_pages order {o}"), z.alloc_pages(Gfp::KERNEL, o), parent)?;
        }
        forked("alloc_pages_node", z.alloc_pages_node(NodeId(1), Gfp::THISNODE, 0), parent)?;
        let policy = MemPolicy::Preferred(NodeId(1));
        forked("alloc_pages_policy", z.alloc_pages_policy(Gfp::KERNEL, 0, &policy), parent)?;
        let mut array = [None; 1];
        check("a one-slot bulk allocation filled its slot", z.alloc_pages_bulk_array(Gfp::KERNEL, &mut array) == 0)?;
        let mut array = [None; 16];
        check("a bulk allocation filled slots", z.alloc_pages_bulk_array(Gfp::KERNEL, &mut array) == 0)?;
        let mut list = Vec::new();
        check("a bulk list allocation", z.alloc_pages_bulk_list(Gfp::KERNEL, 16, &mut list) == 0 && list.is_empty())?;
        for &(b, o) in &blocks {
            forked(&format!("free_pages order {o}"), z.free_pages(b.as_ptr(), o), parent)?;
            forked(&format!("free_pages order {o} again"), z.free_pages(b.as_ptr(), o), parent)?;
            forked(&format!("hold order {o}"), z.hold(b.as_ptr(), o), parent)?;
        }
        forked("split_pages", z.split_pages(blocks[2].0.as_ptr(), 3), parent)?;
        for n in [1, 2, 10] {
            match z.free_pages_bulk(&frames[..n]) {
                Err((0, e)) => forked(&format!("free_pages_bulk of {n}"), Err::<(), _>(e), parent)?,
                r => return Err(format!("free_pages_bulk of {n}: {r:?}")),
            }
        }
        check("drain_all_pages moved frames", z.drain_all_pages() == 0)?;
        // The C ABI: -EPERM.
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live handle and a writable out pointer.
        let rc = unsafe { zonal::ffi::zonal_alloc_pages(&z, 0, 0, &mut out) };
        check(&format!("zonal_alloc_pages: {rc}"), rc == -libc::EPERM && out.is_null())?;
        // SAFETY: as above.
        let rc = unsafe { zonal::ffi::zonal_free_pages(&z, frames[0].cast(), 0) };
        check(&format!("zonal_free_pages: {rc}"), rc == -libc::EPERM)?;
        let mut slots = [std::ptr::null_mut::<c_void>(); 8];
        // SAFETY: as above.
        let rc = unsafe { zonal::ffi::zonal_alloc_pages_bulk_array(&z, 0, slots.as_mut_ptr(), slots.len()) };
        check(&format!("zonal_alloc_pages_bulk_array: {rc}"), rc == -libc::EPERM)?;
        // SAFETY: as above.
        let rc = unsafe { zonal::ffi::zonal_drain_all_pages(&z) };
        check(&format!("zonal_drain_all_pages: {rc}"), rc == -libc::EPERM)?;
        // The lock-free figures still read the child's copy.
        check("nr_free_pages_approx", z.nr_free_pages_approx(NodeId(0)).is_ok())?;
        // A handle of the child's own works.
        let own = zonal();
        let q = own.alloc_pages(Gfp::KERNEL, 0).map_err(|e| format!("the child's own handle: {e}"))?;
        own.free_pages(q.as_ptr(), 0).map_err(|e| e.to_string())?;
        own.drain_all_pages();
        check("the child's own handle's invariants", own.check_invariants() == Ok(0))?;
        // Dropping the inherited handle waits for no thread of the parent's (the worker's
        // and the live server's are not in the child).
        // SAFETY: the child's copy of the handle is dropped once, here, and never used again:
        // the child `_exit`s after this closure, and `z` itself is the parent's to drop.
        drop(unsafe { std::ptr::read(&z) });
        Ok(())
    });
    assert!(exited_ok(status), "the child's checks failed (status {status:#x}; its message is above)");
    // The parent's handle is whole: every block still allocated, and it allocates on.
    assert_eq!(z.check_invariants(), Ok(held_pages));
    for &(b, o) in &blocks {
        z.free_pages(b.as_ptr(), o).unwrap();
    }
    assert_eq!(z.free_pages_bulk(&frames), Ok(frames.len()));
    let more: Vec<_> = (0..100).map(|_| z.alloc_pages(Gfp::KERNEL, 0).unwrap()).collect();
    for p in more {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
}

#[test]
fn no_mapping_of_the_child_lands_in_the_handles_range() {
    let z = zonal();
    let p = z.alloc_pages(Gfp::KERNEL, 4).unwrap().as_ptr();
    let len = 16 * PAGE;
    let status = in_child(|| {
        // MAP_FIXED_NOREPLACE maps only where nothing is mapped: the inherited handle's range
        // must be taken (inaccessible memory), not a hole a later mmap of the child could
        // fill while the handle's metadata still names it.
        // SAFETY: a fresh anonymous mapping that replaces nothing.
        let q = unsafe {
            libc::mmap(
                p.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        let errno = std::io::Error::last_os_error().raw_os_error();
        check(
            &format!("mmap at the handle's frame: {q:?}, errno {errno:?}"),
            q == libc::MAP_FAILED && errno == Some(libc::EEXIST),
        )
    });
    assert!(exited_ok(status), "the child's checks failed (status {status:#x}; its message is above)");
    z.free_pages(p, 4).unwrap();
    assert_eq!(z.check_invariants(), Ok(0));
}
