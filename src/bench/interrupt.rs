//! SIGINT during `zonal bench`: the run stops at the next repetition of the experiment in
//! hand, writes the records of the experiments that finished (`--json`, `--plot`), says after
//! which one it stopped, and exits 130, as a shell reports a command ended by SIGINT.
//!
//! The handler only sets a flag: a handler may run between any two instructions of the
//! thread it lands on, in the middle of a write or of malloc, so it may not print, allocate
//! or take a lock. The run reads the flag before each repetition ([`super::rotate`]) and
//! each experiment. The handler is installed with `SA_RESETHAND`, so a second SIGINT finds
//! the default action again and kills at once: a user who does not want to wait for the
//! repetition in hand is not made to. `SA_RESTART`: a system call the signal lands in (a
//! read of the tcmalloc child's pipe, a wait for a history run) goes on as if nothing had
//! happened, and the flag is read when it returns.
//!
//! Every bench process installs it, the children a run starts included: a Ctrl-C on the
//! terminal reaches the whole process group, and each child then stops at its next
//! repetition too rather than run on after its parent has given up on it.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the handler: SIGINT arrived.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Set when a repetition loop stopped early because of it: the experiment in hand did not
/// finish, and its records are not the experiment's.
static CUT_SHORT: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    // An atomic store is async-signal-safe; nothing else happens here.
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Installs the handler (for the rest of the process: the bench is the whole command).
pub fn install() -> Result<(), String> {
    // SAFETY: sigaction is plain data, valid when zeroed; sigemptyset initialises its mask;
    // the handler is an `extern "C" fn(c_int)` that only stores to an atomic, which is
    // async-signal-safe; no old action is asked for.
    let r = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut())
    };
    if r != 0 {
        return Err(format!("cannot handle SIGINT: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Whether SIGINT has arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// Whether an experiment stopped before its last repetition because of SIGINT.
pub fn cut_short() -> bool {
    CUT_SHORT.load(Ordering::Relaxed)
}

/// For a repetition loop, before each repetition after the first: whether to stop there.
/// The first repetition always runs, so that every subject has a figure and the experiment
/// can finish its tables without a special case; its records are left out all the same.
pub fn stop_before_repetition() -> bool {
    let stop = interrupted();
    if stop {
        CUT_SHORT.store(true, Ordering::Relaxed);
    }
    stop
}
