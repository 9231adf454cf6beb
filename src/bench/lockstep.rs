//! The tcmalloc child in lockstep with the main process: each of its repetitions runs right
//! after the main process's repetition of the same experiment, and never beside one.
//!
//! Why: the targets compare zonal's ratio to mimalloc in the main process with tcmalloc per-CPU's
//! ratio to mimalloc in the child (tcmalloc's per-CPU caches need glibc's rseq off, so it
//! cannot share zonal's process; see [`super::start_tcmalloc_child`]). This machine's speed
//! moves 2–4× between phases lasting from a fraction of a second to tens of seconds, and not
//! every allocator moves by the same factor: in one run zonal's cross measured 31.4 ns in a
//! fast phase and, a second later, tcmalloc per-CPU's 90.3 ns in a slow one, each against its
//! own mimalloc at 140 and 438 ns. Two processes run one after the other compare two phases; in
//! lockstep, repetition `r` of the child follows repetition `r` of the main process within a
//! few tens of milliseconds, so both medians are taken over the same phases.
//!
//! Protocol: the child is started with `--lockstep`, its stdout and stderr piped. Before each
//! repetition ([`super::rotate`]) it writes [`GATE`] on a line of its stderr and waits for a
//! line on its stdin. The main process waits for that gate before each of its own repetitions
//! and after its last ([`Lockstep::wait`]), so the child is stopped while the main process
//! measures, and releases it after each ([`Lockstep::release`]). Either side may run out of
//! repetitions first: a child that has exited reads as stopped, and a child whose stdin is
//! closed ([`Lockstep::finish`]) runs the rest without waiting. The child's tables are printed
//! when it has finished, after the main process's.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStderr, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// The line the child writes on its stderr when it stops before a repetition.
pub const GATE: &str = "zonal bench: tcmalloc child stopped before a repetition";

/// The main process's end of a child running one experiment in lockstep.
#[derive(Debug)]
pub struct Lockstep {
    child: Child,
    /// Closed by [`Lockstep::finish`]: the child then runs without stopping.
    stdin: Option<ChildStdin>,
    stderr: BufReader<ChildStderr>,
    /// The child's stderr lines other than gates (its errors), shown if it fails.
    said: Vec<String>,
    /// The child's stdout (its tables), read by a thread so that it never blocks writing.
    stdout: Option<JoinHandle<String>>,
    /// Stopped at a gate, not yet released.
    stopped: bool,
    /// The child closed its stderr: it has exited, or is about to.
    gone: bool,
}

impl Lockstep {
    /// Starts `cmd` (the child's command line, which gets `--lockstep`) and waits until it is
    /// stopped before its first repetition (it has built its allocators and sized its cells).
    pub fn start(mut cmd: Command) -> Result<Lockstep, String> {
        let mut child = cmd
            .arg("--lockstep")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run the tcmalloc child: {e}"))?;
        let (Some(stdin), Some(mut out), Some(err)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the tcmalloc child has no pipes".into());
        };
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let mut l = Lockstep {
            child,
            stdin: Some(stdin),
            stderr: BufReader::new(err),
            said: Vec::new(),
            stdout: Some(stdout),
            stopped: false,
            gone: false,
        };
        l.wait();
        Ok(l)
    }

    /// Returns once the child is stopped at a gate, or gone.
    pub fn wait(&mut self) {
        let mut line = String::new();
        while !self.stopped && !self.gone {
            line.clear();
            match self.stderr.read_line(&mut line) {
                Ok(0) | Err(_) => self.gone = true,
                Ok(_) if line.trim_end() == GATE => self.stopped = true,
                Ok(_) => self.said.push(line.trim_end().to_string()),
            }
        }
    }

    /// Lets a stopped child run its next repetition.
    pub fn release(&mut self) {
        if !self.stopped {
            return;
        }
        self.stopped = false;
        let sent = self.stdin.as_mut().is_some_and(|i| i.write_all(b"\n").and_then(|()| i.flush()).is_ok());
        if !sent {
            // It cannot be told to go on: let it run free rather than wait for it.
            self.stdin = None;
        }
    }

    /// Lets the child run the rest without stopping, waits for it, prints its tables and
    /// returns its stdout's text for the caller to print. An error if it failed.
    pub fn finish(mut self) -> Result<String, String> {
        self.stdin = None;
        // Drain the rest of its stderr (gates it no longer waits at, and errors).
        self.stopped = false;
        while !self.gone {
            self.wait();
            self.stopped = false;
        }
        let status = self.child.wait().map_err(|e| format!("cannot wait for the tcmalloc child: {e}"))?;
        let out = self.stdout.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        if !status.success() {
            return Err(format!("the tcmalloc child process failed ({status}): {}", self.said.join("\n")));
        }
        Ok(out)
    }
}

impl Drop for Lockstep {
    /// A child left behind by an error on the main side is stopped, not orphaned.
    fn drop(&mut self) {
        if !self.gone {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Set once the main process has closed the child's stdin: no more gates.
static RUNS_FREE: AtomicBool = AtomicBool::new(false);

/// The child's end: with `--lockstep`, stops before a repetition until the main process
/// releases it (a line on stdin); after the main process has closed stdin, returns at once.
pub fn gate(lockstep: bool) {
    if !lockstep || RUNS_FREE.load(Ordering::Relaxed) {
        return;
    }
    eprintln!("{GATE}");
    let mut line = String::new();
    if !matches!(std::io::stdin().lock().read_line(&mut line), Ok(n) if n > 0) {
        RUNS_FREE.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A shell standing in for the child: `script` runs with `$LOG` set (the events' file),
    /// and `gate` in it stops as the real child does.
    fn child(script: &str, log: &PathBuf) -> Command {
        let mut cmd = Command::new("sh");
        let gate = format!("gate() {{ echo '{GATE}' >&2; read -r _ || true; }}");
        cmd.arg("-c").arg(format!("{gate}\n{script}")).env("LOG", log);
        cmd
    }

    fn log(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("zonal-lockstep-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    fn note(log: &PathBuf, what: &str) {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("the log opens");
        writeln!(f, "{what}").expect("the log takes a line");
    }

    /// What `rotate` does in the main process for `reps` repetitions.
    fn rotate(l: &mut Lockstep, log: &PathBuf, reps: usize) {
        for r in 1..=reps {
            l.wait();
            note(log, &format!("main {r}"));
            l.release();
        }
        l.wait();
    }

    #[test]
    fn each_repetition_of_the_child_follows_the_same_of_the_main_process() {
        let log = log("alternate");
        let script = r#"echo built >> "$LOG"; for r in 1 2 3; do gate; echo "child $r" >> "$LOG"; done; echo tables"#;
        let mut l = Lockstep::start(child(script, &log)).expect("the child starts");
        // Started: the child has done its set-up and stopped before its first repetition.
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "built\n");
        rotate(&mut l, &log, 3);
        assert_eq!(l.finish(), Ok("tables\n".to_string()));
        let events = std::fs::read_to_string(&log).unwrap();
        assert_eq!(events, "built\nmain 1\nchild 1\nmain 2\nchild 2\nmain 3\nchild 3\n");
        std::fs::remove_file(&log).unwrap();
    }

    #[test]
    fn either_side_may_run_out_of_repetitions_first() {
        // The child has fewer: once it is gone the main process no longer waits for it.
        let log = log("fewer");
        let mut l = Lockstep::start(child(r#"gate; echo "child 1" >> "$LOG""#, &log)).expect("the child starts");
        rotate(&mut l, &log, 3);
        assert_eq!(l.finish(), Ok(String::new()));
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "main 1\nchild 1\nmain 2\nmain 3\n");
        // The child has more: finishing closes its stdin and it runs the rest without stopping.
        let log2 = self::log("more");
        let script = r#"for r in 1 2 3 4; do gate; echo "child $r" >> "$LOG"; done"#;
        let mut l = Lockstep::start(child(script, &log2)).expect("the child starts");
        rotate(&mut l, &log2, 2);
        assert_eq!(l.finish(), Ok(String::new()));
        let events = std::fs::read_to_string(&log2).unwrap();
        assert_eq!(events, "main 1\nchild 1\nmain 2\nchild 2\nchild 3\nchild 4\n");
        for p in [log, log2] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn a_failed_child_is_reported_with_what_it_said() {
        let log = log("failed");
        let mut l = Lockstep::start(child("gate; echo 'no such experiment' >&2; exit 3", &log)).expect("it starts");
        rotate(&mut l, &log, 2);
        let err = l.finish().expect_err("the child failed");
        assert!(err.contains("exit status: 3") && err.contains("no such experiment"), "{err}");
        // One that cannot start at all.
        let err = Lockstep::start(Command::new("/nonexistent/zonal")).expect_err("no such program");
        assert!(err.contains("cannot run the tcmalloc child"), "{err}");
        let _ = std::fs::remove_file(&log);
    }

    #[test]
    fn a_child_left_running_is_stopped_when_dropped() {
        let log = log("dropped");
        let l = Lockstep::start(child(r#"gate; echo "child ran" >> "$LOG""#, &log)).expect("the child starts");
        let pid = l.child.id();
        drop(l);
        // Killed and reaped (no zombie left), and it never ran its repetition.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "child {pid} is still there");
        assert!(!log.exists(), "the stopped child never ran on");
    }
}
