//! The thread that serves a published handle's socket.
//!
//! One thread per published handle, asleep in `poll` on the listening socket and a stop
//! pipe. Connections are served one at a time, each bounded in size and time, so a client
//! can delay other clients by at most the timeout and never the process: the allocation
//! paths never wait for this thread.

use super::{live_err, protocol, sock, MAX_REQUEST};
use crate::error::Result;
use crate::page_alloc::Zonal;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Connections waiting to be accepted: the server serves one at a time, each within its
/// timeout, so a longer queue only makes its last clients wait longer; past it a client's
/// connect waits (within its own deadline) or, for a probe, finds the server busy.
const BACKLOG: i32 = 64;

/// A running server; dropping it stops the thread and removes the socket.
pub(crate) struct Server {
    path: PathBuf,
    stop: OwnedFd,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the server counts, for the `info` request.
#[derive(Default)]
pub(crate) struct ServerStats {
    pub(crate) served: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) failed: AtomicU64,
}

impl Server {
    /// Binds `path` (replacing a stale socket there) and starts serving.
    pub(crate) fn start(z: Weak<Zonal>, path: PathBuf, timeout: Duration) -> Result<Server> {
        // The name holds this process's pid: whatever is there was left by a process that had
        // this pid before, by this one for a handle since dropped, or is a live server of a
        // process with this pid in another pid namespace sharing the directory. Only a socket
        // nothing listens on is removed; the probe does not wait (a stopped server's full
        // queue counts as in use).
        match sock::connect(&path, None) {
            Ok(_) => return Err(live_err(format!("{} is in use by a running server", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(live_err(format!("{} is in use by a running server (its queue is full)", path.display())))
            }
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                let is_socket = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket());
                if !is_socket {
                    return Err(live_err(format!(
                        "{} exists and is not a socket: refusing to replace it",
                        path.display()
                    )));
                }
                std::fs::remove_file(&path)
                    .map_err(|e| live_err(format!("cannot remove the stale socket {}: {e}", path.display())))?;
            }
            Err(_) if std::fs::symlink_metadata(&path).is_ok() => {
                return Err(live_err(format!("{} exists and is not a socket: refusing to replace it", path.display())))
            }
            Err(_) => {}
        }
        let listener =
            UnixListener::bind(&path).map_err(|e| live_err(format!("cannot bind {}: {e}", path.display())))?;
        // The directory is 0700 already; the socket is 0600 too, so that moving it or
        // loosening the directory does not open it.
        let setup = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .and_then(|_| sock::set_backlog(listener.as_fd(), BACKLOG))
            .and_then(|_| listener.set_nonblocking(true));
        if let Err(e) = setup {
            let _ = std::fs::remove_file(&path);
            return Err(live_err(format!("cannot set up {}: {e}", path.display())));
        }
        let (stop_r, stop_w) = match crate::sys::pipe() {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let stats = Arc::new(ServerStats::default());
        let spawned = std::thread::Builder::new()
            .name("zonal-live".into())
            .spawn(move || serve_loop(&listener, &stop_r, &z, timeout, &stats));
        match spawned {
            Ok(t) => Ok(Server { path, stop: stop_w, thread: Some(t) }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(live_err(format!("cannot start the server thread: {e}")))
            }
        }
    }

    /// The socket.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        crate::sys::poke(self.stop.as_fd());
        if let Some(t) = self.thread.take() {
            // The last reference to the handle may be the one the server took to answer a
            // request: then this runs on the server thread, which ends once it returns.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve_loop(listener: &UnixListener, stop: &OwnedFd, z: &Weak<Zonal>, timeout: Duration, stats: &ServerStats) {
    loop {
        let ready = match crate::sys::poll_readable(&[listener.as_fd(), stop.as_fd()], -1) {
            Ok(r) => r,
            Err(_) => return,
        };
        if ready[1] {
            return;
        }
        if !ready[0] {
            continue;
        }
        let conn = match listener.accept() {
            Ok((c, _)) => c,
            // Another wake-up took it, or the client left before it was accepted.
            Err(_) => continue,
        };
        let Some(z) = z.upgrade() else { return };
        match serve(&conn, &z, timeout, stats) {
            Ok(()) => stats.served.fetch_add(1, Ordering::Relaxed),
            Err(Refused) => stats.refused.fetch_add(1, Ordering::Relaxed),
            Err(Failed) => stats.failed.fetch_add(1, Ordering::Relaxed),
            // A probe (`list` checking the socket is alive): nothing to count.
            Err(Empty) => 0,
        };
    }
}

/// Why a connection was not served.
enum Outcome {
    Refused,
    Failed,
    /// The client closed without sending a byte.
    Empty,
}
use Outcome::{Empty, Failed, Refused};

fn serve(conn: &UnixStream, z: &Arc<Zonal>, timeout: Duration, stats: &ServerStats) -> Result<(), Outcome> {
    conn.set_nonblocking(false).map_err(|_| Failed)?;
    let deadline = Instant::now() + timeout;
    let me = crate::sys::euid();
    match crate::sys::peer_cred(conn.as_fd()) {
        Ok((_, uid)) if uid == me || uid == 0 => {}
        Ok((pid, uid)) => {
            let why = format!("permission denied: peer pid {pid} is uid {uid}; this handle serves uid {me} and root");
            if reply(conn, deadline, Err(why)).is_ok() {
                discard_input(conn);
            }
            return Err(Refused);
        }
        Err(e) => {
            let _ = reply(conn, deadline, Err(format!("cannot read the peer's credentials: {e}")));
            return Err(Refused);
        }
    }
    let line = match read_request(conn, deadline) {
        Ok(None) => return Err(Empty),
        Ok(Some(l)) => l,
        Err(why) => {
            if reply(conn, Instant::now() + timeout, Err(why)).is_ok() {
                discard_input(conn);
            }
            return Err(Failed);
        }
    };
    let answer = protocol::answer(z, &line, stats);
    let ok = answer.is_ok();
    // The reply gets a time of its own: a big report to a slow reader.
    reply(conn, Instant::now() + timeout, answer).map_err(|_| Failed)?;
    if ok {
        Ok(())
    } else {
        Err(Failed)
    }
}

/// Reads one request line before `deadline`: at most `MAX_REQUEST` bytes, UTF-8; `None`
/// when the client closed without sending anything.
fn read_request(mut conn: &UnixStream, deadline: Instant) -> Result<Option<String>, String> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("timed out waiting for the request".into());
        }
        conn.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match conn.read(&mut chunk) {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err("timed out waiting for the request".into())
            }
            Err(e) => return Err(format!("cannot read the request: {e}")),
        }
        if buf.contains(&b'\n') || buf.len() >= MAX_REQUEST {
            break;
        }
    }
    frame(&buf).map(Some)
}

/// The request line in what a client sent: up to its first newline (or the end), fewer
/// than `MAX_REQUEST` bytes, UTF-8.
pub(super) fn frame(buf: &[u8]) -> Result<String, String> {
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    if line.len() >= MAX_REQUEST {
        return Err(format!("request too long: a request is one line of fewer than {MAX_REQUEST} bytes"));
    }
    String::from_utf8(line.to_vec()).map_err(|_| "the request is not UTF-8 text".to_string())
}

/// What the server would send for the bytes `input` from a client of its own user: the
/// framing, the request and the reply's layout, without a socket (for the fuzz target).
pub(super) fn reply_to(z: &Zonal, input: &[u8]) -> Vec<u8> {
    let answer = frame(input).and_then(|line| protocol::answer(z, &line, &ServerStats::default()));
    reply_text(answer).into_bytes()
}

/// After an error reply to a request not read to its end: reads what the client still
/// sends (a little, briefly) so that closing does not reset the connection before the
/// client has read the reply (a Unix socket closed with unread input resets its peer).
fn discard_input(mut conn: &UnixStream) {
    let _ = conn.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + Duration::from_millis(100);
    let mut chunk = [0u8; 4096];
    let mut left = 1usize << 20;
    while left > 0 {
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() || conn.set_read_timeout(Some(wait)).is_err() {
            return;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// Writes the status line and the body, giving up at `deadline`: the whole reply, not each
/// send, is bounded, so a client that takes a byte now and then is dropped all the same.
fn reply(conn: &UnixStream, deadline: Instant, answer: Result<String, String>) -> std::io::Result<()> {
    let text = reply_text(answer);
    sock::send_until(conn, text.as_bytes(), deadline.max(Instant::now() + Duration::from_millis(1)))
}

/// A reply's bytes: `ok` and the body, or one `error <why>` line.
fn reply_text(answer: Result<String, String>) -> String {
    match answer {
        Ok(body) => format!("ok\n{body}"),
        // One line: the status line carries the whole error.
        Err(why) => format!("error {}\n", why.replace('\n', " ")),
    }
}
