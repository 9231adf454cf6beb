//! Cases run in a child process of their own, whose end the parent checks.

use std::sync::Arc;
use zonal::topology::Machine;
use zonal::{Config, Topology, Zonal};
use zonal_numab::{Backend, Balancer};

/// Two nodes of 64 MiB, CPU 0 on node 0 and CPU 1 on node 1.
pub fn zonal() -> Arc<Zonal> {
    let t = Topology::parse_for("nodes=2,size=64M,cpus=0:1", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    Arc::new(Zonal::new(Config::new(t)).unwrap())
}

/// A balancer that scans only when told, without chunk migration or collapse.
pub fn balancer(z: &Arc<Zonal>, backend: Backend) -> Balancer {
    let cfg = zonal_numab::Config {
        backend,
        scan_delay_ms: 3_600_000,
        collapse_mb: 0,
        chunk_migration: false,
        reserve_pages: 64,
        ..Default::default()
    };
    Balancer::new(z.clone(), cfg).unwrap()
}

/// How a child ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// `exit` with this code.
    Exit(i32),
    /// Killed by this signal.
    Signal(i32),
}

/// Runs `f` in a child process (with a 30 s alarm: a hang ends as `Signal(SIGALRM)`), and
/// returns how it ended: `Exit(0)` when `f` returns.
pub fn in_child(f: impl FnOnce()) -> End {
    // SAFETY: the child runs `f` and exits without returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: alarm and _exit have no preconditions.
        unsafe { libc::alarm(30) };
        // A panic must not unwind into the harness's copy: it ends the child with 101.
        let code = if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_ok() { 0 } else { 101 };
        // SAFETY: ends the child.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: `status` is valid for the call; `pid` is this process's child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    if libc::WIFSIGNALED(status) {
        End::Signal(libc::WTERMSIG(status))
    } else {
        End::Exit(libc::WEXITSTATUS(status))
    }
}

/// Exits the child with `code` unless `ok`.
pub fn check(ok: bool, code: i32) {
    if !ok {
        // SAFETY: ends the child.
        unsafe { libc::_exit(code) };
    }
}

pub fn backends() -> Vec<Backend> {
    let mut v = vec![Backend::Mprotect];
    if zonal_numab::userfaultfd_available().is_ok() {
        v.push(Backend::Userfaultfd);
    }
    v
}
