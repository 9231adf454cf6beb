//! Live introspection: a published handle answers report and tunable requests from other
//! processes of its user on a Unix socket, as `/proc` answers for the kernel's allocator.
//!
//! Kernel counterpart: none in mm; the role of `/proc/zoneinfo`, `/proc/vmstat`,
//! `/proc/sys/vm/*` and node_exporter for a process that runs its own page allocator.
//!
//! - Where: one directory per user, `$ZONAL_RUNTIME_DIR` if set, else
//!   `$XDG_RUNTIME_DIR/zonal`, else `zonal-<uid>` under the temporary directory. It is made
//!   0700 and must be a real directory (not a link) owned by the user with no access for
//!   others, or publishing refuses it. Each handle's socket is `<pid>.<handle>.sock`, mode 0600.
//! - Who: the server reads the peer's credentials (`SO_PEERCRED`) and serves only its own
//!   user and root; anyone else gets `error` and the connection closes.
//! - What: one request per connection, a line of at most [`MAX_REQUEST`] bytes
//!   ([`protocol`] lists them); the reply is a status line, `ok` or `error <why>`, then the
//!   body until the connection closes.
//! - Robustness: the request must arrive within the timeout and the reply be taken within
//!   it, or the connection is dropped; a client that vanishes is an error of that
//!   connection only (`MSG_NOSIGNAL`: no `SIGPIPE`). The server is one thread that sleeps in
//!   `poll` between connections: an idle published handle makes no system calls.
//! - Locks: a report takes no lock the allocation paths take (pagesets and free blocks are
//!   read from their lock-free figures); a `sysctl set` takes what writing the tunable takes,
//!   as writing `/proc/sys/vm` does.
//! - Lifetime: the server holds the handle weakly; dropping the handle (or
//!   [`Zonal::unpublish`]) stops the thread and removes the socket. Sockets of processes that
//!   died without removing theirs are removed by [`list`] (a connection refused) and when a
//!   handle publishes.

mod protocol;
mod server;

pub use protocol::REQUESTS;

use crate::error::{Error, Result};
use crate::page_alloc::Zonal;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use server::Server;

/// The longest request line a server reads, newline included.
pub const MAX_REQUEST: usize = 4096;

/// How long a server waits for a request and for its reply to be taken, by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest reply a client reads.
pub const MAX_REPLY: usize = 64 << 20;

/// How a handle is published.
#[derive(Clone, Debug)]
pub struct PublishOptions {
    /// The directory of the sockets; `None`: [`runtime_dir`].
    pub dir: Option<PathBuf>,
    /// How long a connection may take to send its request, and to take its reply.
    pub timeout: Duration,
}

impl Default for PublishOptions {
    fn default() -> PublishOptions {
        PublishOptions { dir: None, timeout: DEFAULT_TIMEOUT }
    }
}

/// A published handle found in a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// The process.
    pub pid: i32,
    /// The handle's id in that process ([`Zonal::id`]).
    pub handle: u64,
    /// Its socket.
    pub path: PathBuf,
}

fn live_err(msg: impl Into<String>) -> Error {
    Error::Live(msg.into())
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    live_err(format!("{what} {}: {e}", path.display()))
}

/// The directory of the user's published handles (see the module docs); not created.
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ZONAL_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Path::new(&d).join("zonal");
    }
    std::env::temp_dir().join(format!("zonal-{}", crate::sys::euid()))
}

/// Makes `dir` (mode 0700) if missing and checks that only this user can reach it: a real
/// directory, not a symbolic link, owned by this user, with no permission for group or
/// others. A directory that fails the check is refused, never repaired: someone else may
/// have made it.
pub fn secure_dir(dir: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err("cannot create the directory", dir, e)),
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| io_err("cannot read", dir, e))?;
    if !m.file_type().is_dir() {
        return Err(live_err(format!("{} is not a directory (a link or a file): refusing to use it", dir.display())));
    }
    let me = crate::sys::euid();
    if m.uid() != me {
        return Err(live_err(format!(
            "{} belongs to uid {}, not to this user (uid {me}): refusing to use it",
            dir.display(),
            m.uid()
        )));
    }
    if m.mode() & 0o077 != 0 {
        return Err(live_err(format!(
            "{} has mode {:o}: others could reach the sockets in it; it must be 0700",
            dir.display(),
            m.mode() & 0o777
        )));
    }
    Ok(())
}

/// The socket name of a handle: `<pid>.<handle>.sock`.
fn socket_name(pid: i32, handle: u64) -> String {
    format!("{pid}.{handle}.sock")
}

/// Reads a socket name back; `None` for any other file.
fn parse_socket_name(name: &str) -> Option<(i32, u64)> {
    let stem = name.strip_suffix(".sock")?;
    let (pid, handle) = stem.split_once('.')?;
    let pid: i32 = pid.parse().ok().filter(|&p| p > 0)?;
    Some((pid, handle.parse().ok()?))
}

/// Whether a socket is stale: its process is gone, or nothing listens on it any more.
fn is_stale(pid: i32, path: &Path) -> bool {
    if !crate::sys::process_exists(pid) {
        return true;
    }
    matches!(UnixStream::connect(path), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// The published handles in `dir`, by pid then handle. Sockets left by processes that died
/// are removed on the way (where this user may remove them). A missing directory lists
/// nothing.
pub fn list(dir: &Path) -> Result<Vec<Published>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("cannot list", dir, e)),
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((pid, handle)) = name.to_str().and_then(parse_socket_name) else { continue };
        let path = e.path();
        if is_stale(pid, &path) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        out.push(Published { pid, handle, path });
    }
    out.sort_by_key(|p| (p.pid, p.handle));
    Ok(out)
}

/// The published handle of `pid` in `dir`: `handle` if given, else the process's only one.
pub fn find(dir: &Path, pid: i32, handle: Option<u64>) -> Result<Published> {
    let all: Vec<Published> = list(dir)?.into_iter().filter(|p| p.pid == pid).collect();
    let ids = |v: &[Published]| v.iter().map(|p| p.handle.to_string()).collect::<Vec<_>>().join(", ");
    match handle {
        Some(h) => all.iter().find(|p| p.handle == h).cloned().ok_or_else(|| {
            if all.is_empty() {
                live_err(format!("process {pid} has no published handle in {}", dir.display()))
            } else {
                live_err(format!("process {pid} has no published handle {h}; its handles: {}", ids(&all)))
            }
        }),
        None => match all.len() {
            0 => Err(live_err(format!(
                "process {pid} has no published handle in {} (publish one with ZONAL_PUBLISH=1, the config key \
                 publish=1, Zonal::publish or zonal_publish)",
                dir.display()
            ))),
            1 => Ok(all[0].clone()),
            _ => Err(live_err(format!("process {pid} has several published handles ({}): choose one", ids(&all)))),
        },
    }
}

/// Sends one request to a published handle and returns the body of its reply; an `error`
/// reply becomes [`Error::Live`] with the server's words. Waits at most `timeout` for each
/// step (connect, send, every read).
pub fn request(path: &Path, line: &str, timeout: Duration) -> Result<String> {
    if line.contains('\n') || line.len() >= MAX_REQUEST {
        return Err(live_err(format!("a request is one line of fewer than {MAX_REQUEST} bytes")));
    }
    let mut s = UnixStream::connect(path).map_err(|e| io_err("cannot connect to", path, e))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|_| s.set_write_timeout(Some(timeout)))
        .map_err(|e| io_err("", path, e))?;
    let msg = format!("{line}\n");
    // A server that refuses the peer may answer and close before the request is sent: its
    // answer is still there to read, so a failed send reads it before giving up.
    let sent = crate::sys::send_all(std::os::fd::AsFd::as_fd(&s), msg.as_bytes());
    let mut buf = Vec::new();
    let deadline = Instant::now() + timeout.saturating_mul(4);
    let mut chunk = [0u8; 65536];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > MAX_REPLY {
                    return Err(live_err(format!(
                        "the reply from {} is larger than {MAX_REPLY} bytes",
                        path.display()
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A reset after the reply arrived (the server closed with our request unread).
            Err(_) if !buf.is_empty() && sent.is_err() => break,
            Err(e) => return Err(io_err("no reply from", path, e)),
        }
        if Instant::now() > deadline {
            return Err(live_err(format!("the reply from {} took too long", path.display())));
        }
    }
    if let (Err(e), true) = (sent, buf.is_empty()) {
        return Err(io_err("cannot send to", path, e));
    }
    let text = String::from_utf8(buf).map_err(|_| live_err("the reply is not UTF-8"))?;
    let (status, body) = text.split_once('\n').unwrap_or((text.as_str(), ""));
    match status.split_once(' ').map_or((status, ""), |(a, b)| (a, b)) {
        ("ok", _) => Ok(body.to_string()),
        ("error", why) => Err(live_err(why.to_string())),
        _ => Err(live_err(format!("{} is not a zonal handle (reply `{status}`)", path.display()))),
    }
}

impl Zonal {
    /// Publishes this handle in [`runtime_dir`] (see [`crate::live`]); returns its socket.
    /// Publishing a published handle returns its socket again.
    pub fn publish(self: &Arc<Self>) -> Result<PathBuf> {
        self.publish_with(PublishOptions::default())
    }

    /// Publishes this handle as `opts` says.
    pub fn publish_with(self: &Arc<Self>, opts: PublishOptions) -> Result<PathBuf> {
        let mut slot = self.live_slot();
        if let Some(s) = slot.as_ref() {
            return Ok(s.path().to_path_buf());
        }
        let dir = opts.dir.clone().unwrap_or_else(runtime_dir);
        secure_dir(&dir)?;
        let path = dir.join(socket_name(std::process::id() as i32, self.id()));
        let server = Server::start(Arc::downgrade(self), path, opts.timeout)?;
        let p = server.path().to_path_buf();
        *slot = Some(server);
        Ok(p)
    }

    /// Stops serving requests and removes the socket; `false` if the handle was not
    /// published.
    pub fn unpublish(&self) -> bool {
        // Take it out first: the server's drop joins its thread, which may want the slot.
        let s = self.live_slot().take();
        s.is_some()
    }

    /// The socket of this handle if it is published.
    pub fn published_path(&self) -> Option<PathBuf> {
        self.live_slot().as_ref().map(|s| s.path().to_path_buf())
    }

    /// Builds a shared handle, and publishes it when the config says so (`publish=1`) or the
    /// environment has `ZONAL_PUBLISH=1`: the handle the C ABI builds, and the one to build
    /// for a program that should be watched with `zonal --pid`.
    pub fn shared(config: crate::Config) -> Result<Arc<Zonal>> {
        let publish = config.publish || publish_from_env()?;
        let z = Arc::new(Zonal::new(crate::Config { publish: false, ..config })?);
        if publish {
            z.publish()?;
        }
        Ok(z)
    }
}

/// `ZONAL_PUBLISH`: unset or empty is off, else a flag as the config key takes it.
fn publish_from_env() -> Result<bool> {
    match std::env::var("ZONAL_PUBLISH").as_deref() {
        Err(_) | Ok("") => Ok(false),
        Ok(v) => crate::config::parse_flag(v)
            .ok_or_else(|| Error::InvalidConfig(format!("ZONAL_PUBLISH=`{v}`: use 1 to publish, 0 not to"))),
    }
}

/// Lets a test of another crate check a directory's mode the way the server made it.
#[doc(hidden)]
pub fn mode_of(path: &Path) -> Option<u32> {
    std::fs::symlink_metadata(path).ok().map(|m| m.permissions().mode() & 0o7777)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_round_trip() {
        assert_eq!(parse_socket_name(&socket_name(42, 7)), Some((42, 7)));
        assert_eq!(parse_socket_name("42.7.sock.tmp"), None);
        assert_eq!(parse_socket_name("0.1.sock"), None);
        assert_eq!(parse_socket_name("-3.1.sock"), None);
        assert_eq!(parse_socket_name("x.1.sock"), None);
    }
}
