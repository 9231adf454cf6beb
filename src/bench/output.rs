//! Where `zonal bench --json` writes, settled before the run: a file checked writable up
//! front, or stdout (`-`), in which case the report moves to stderr.

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};

/// The destination of the JSON records.
pub enum JsonOut {
    /// The process's original stdout; fd 1 now writes to stderr.
    Stdout(std::fs::File),
    /// A file, found writable before the run.
    File(String),
}

impl JsonOut {
    /// Settles `--json ARG` before anything runs: `-` is stdout (the report printed on fd 1
    /// is sent to stderr from now on, in this process and the children it starts); any other
    /// ARG is a file that must be writable now.
    pub fn open(arg: &str) -> Result<JsonOut, String> {
        if arg == "-" {
            return stdout_for_json().map(JsonOut::Stdout);
        }
        check_writable(arg)?;
        Ok(JsonOut::File(arg.to_string()))
    }

    /// Writes the records so far where they can be written again, a file, so that a run
    /// killed later (a second SIGINT) keeps the experiments that finished; stdout gets the
    /// records once, at the end ([`JsonOut::write`]).
    pub fn checkpoint(&self, records: &[serde_json::Value]) -> Result<(), String> {
        match self {
            JsonOut::Stdout(_) => Ok(()),
            JsonOut::File(_) => self.write(records).map(drop),
        }
    }

    /// Writes the records as one pretty-printed JSON array; returns where they went. Once for
    /// stdout; a file is written whole each time.
    pub fn write(&self, records: &[serde_json::Value]) -> Result<String, String> {
        let text = serde_json::to_string_pretty(records).map_err(|e| e.to_string())? + "\n";
        match self {
            JsonOut::Stdout(f) => {
                // `Write` for `&File`: the file itself is not changed, only written to.
                let mut f = f;
                f.write_all(text.as_bytes())
                    .and_then(|()| f.flush())
                    .map_err(|e| format!("cannot write to stdout: {e}"))?;
                Ok("stdout".into())
            }
            JsonOut::File(path) => {
                std::fs::write(path, text).map_err(|e| format!("cannot write {path}: {e}"))?;
                Ok(path.clone())
            }
        }
    }
}

/// Whether `path` can be written: opened for writing (created when missing, and then removed
/// again; an existing file is left as it is).
pub fn check_writable(path: &str) -> Result<(), String> {
    let p = std::path::Path::new(path);
    let existed = p.symlink_metadata().is_ok();
    std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(p).map_err(|e| {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
        match dir {
            Some(d) if !d.is_dir() => format!("--json {path}: cannot write it: {} is not a directory", d.display()),
            _ => format!("--json {path}: cannot write it: {e}"),
        }
    })?;
    if !existed {
        std::fs::remove_file(p).map_err(|e| format!("--json {path}: cannot remove the probe: {e}"))?;
    }
    Ok(())
}

/// Keeps the process's stdout for the JSON and points fd 1 at stderr, so that everything
/// the report prints goes to stderr.
fn stdout_for_json() -> Result<std::fs::File, String> {
    std::io::stdout().flush().map_err(|e| format!("cannot flush stdout: {e}"))?;
    // SAFETY: dup of fd 1, which is open for the whole process; the new fd is ours alone.
    let saved = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
    if saved < 0 {
        return Err(format!("--json -: cannot keep stdout: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `saved` was just returned by fcntl and nothing else owns it.
    let saved = unsafe { OwnedFd::from_raw_fd(saved) };
    // SAFETY: dup2 of two open fds; Rust's stdout holds no buffered bytes (flushed above)
    // and keeps writing to fd 1, which now is stderr's file.
    if unsafe { libc::dup2(2, 1) } < 0 {
        return Err(format!("--json -: cannot send the report to stderr: {}", std::io::Error::last_os_error()));
    }
    Ok(std::fs::File::from(saved))
}
