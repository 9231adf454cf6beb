//! Live introspection: a published handle answers report and tunable requests from other
//! processes of its user on a Unix socket, as `/proc` answers for the kernel's allocator.
//!
//! Kernel counterpart: none in mm; the role of `/proc/zoneinfo`, `/proc/vmstat`,
//! `/proc/sys/vm/*` and node_exporter for a process that runs its own page allocator.
//!
//! - Where: one directory per user, `$ZONAL_RUNTIME_DIR` if set, else
//!   `$XDG_RUNTIME_DIR/zonal`, else `zonal-<uid>` under the temporary directory. It is made
//!   0700 and must be a real directory (not a link) owned by the user with no access for
//!   others, or publishing refuses it, and so does every reader ([`list`], [`request`]):
//!   a directory someone else made first (the fallback under the temporary directory is
//!   anyone's to make) is an error naming it, never read. Each handle's socket is
//!   `<pid>.<handle>.sock`, mode 0600.
//! - Readers trust no path: they hold the checked directory by a descriptor and act
//!   relative to it (`fstatat`, `unlinkat`, connects through `/proc/self/fd`), so a
//!   directory swapped after the check changes nothing. They read only sockets owned by
//!   the directory's owner, name each server by its credentials (`SO_PEERCRED` pid) rather
//!   than the socket's name, and remove a socket only when a connect to it was refused
//!   (nothing listens) and it is still the file examined. Connects never wait past a
//!   deadline: a probe does not wait at all, a request waits for a full queue as long as
//!   its timeout allows.
//! - Who: the server reads the peer's credentials (`SO_PEERCRED`) and serves only its own
//!   user and root; anyone else gets `error` and the connection closes.
//! - What: one request per connection, a line of at most [`MAX_REQUEST`] bytes
//!   ([`REQUESTS`] lists them); the reply is a status line, `ok` or `error <why>`, then the
//!   body until the connection closes.
//! - Robustness: the request must arrive within the timeout and the whole reply be taken
//!   within it (every send waits only what is left), or the connection is dropped; a client that vanishes is an error of that
//!   connection only (`MSG_NOSIGNAL`: no `SIGPIPE`). The server is one thread that sleeps in
//!   `poll` between connections: an idle published handle makes no system calls.
//! - Locks: a report takes no lock the allocation paths take (pagesets and free blocks are
//!   read from their lock-free figures); a `sysctl set` takes what writing the tunable takes,
//!   as writing `/proc/sys/vm` does.
//! - Lifetime: the server holds the handle weakly; dropping the handle (or
//!   [`Zonal::unpublish`]) stops the thread and removes the socket. Sockets of processes that
//!   died without removing theirs are removed by [`list`] (a connection refused) and when a
//!   handle publishes.
//! - Routes: `Arc<Zonal>::publish`, [`Zonal::shared`] with `publish=1` or
//!   `ZONAL_PUBLISH=1`, the C ABI (which builds with `shared`). `Zonal::new` cannot publish
//!   (the server shares the handle): asked to by either the config or the environment, it
//!   refuses with an error saying so, never silently.

mod protocol;
mod server;
mod sock;

pub use protocol::REQUESTS;

pub use crate::config::publish_from_env;
use crate::error::{Error, Result};
use crate::page_alloc::Zonal;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
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
    /// The process: as the kernel names the server's (`SO_PEERCRED`) when the probe was
    /// accepted, else as the socket's name says ([`Probe`]).
    pub pid: i32,
    /// The handle's id in that process ([`Zonal::id`]).
    pub handle: u64,
    /// Its socket.
    pub path: PathBuf,
    /// What the probe found, and so where `pid` comes from.
    pub probe: Probe,
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

/// A directory of sockets that passed the checks, held by a descriptor: every later call
/// (listing, `fstatat`, `unlinkat`, connecting through `/proc/self/fd`) acts in the
/// directory that was checked, whatever happens to its path meanwhile.
struct CheckedDir {
    fd: std::os::fd::OwnedFd,
    /// Its owner: the caller's effective uid.
    owner: u32,
}

/// Opens `dir` and checks that only this user can reach it: a real directory, not a
/// symbolic link, owned by this user (root included: root trusts no other user's
/// directory either), with no permission for group or others. `Ok(None)`: it does not
/// exist. Publishers and readers apply the same checks.
fn check_dir(dir: &Path) -> Result<Option<CheckedDir>> {
    let fd = match sock::open_dir(dir) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
            return Err(live_err(format!(
                "{} is not a directory (a link or a file): refusing to use it",
                dir.display()
            )))
        }
        Err(e) => return Err(io_err("cannot open the directory", dir, e)),
    };
    let st = sock::fstat(std::os::fd::AsFd::as_fd(&fd)).map_err(|e| io_err("cannot read", dir, e))?;
    if !st.is_dir() {
        return Err(live_err(format!("{} is not a directory: refusing to use it", dir.display())));
    }
    let me = crate::sys::euid();
    if st.uid != me {
        return Err(live_err(format!(
            "{} belongs to uid {}, not to this user (uid {me}): refusing to use it; someone else made it (remove \
             it, or set ZONAL_RUNTIME_DIR to a directory of your own)",
            dir.display(),
            st.uid
        )));
    }
    if st.mode & 0o077 != 0 {
        return Err(live_err(format!(
            "{} has mode {:o}: others could reach the sockets in it; it must be 0700",
            dir.display(),
            st.mode & 0o777
        )));
    }
    Ok(Some(CheckedDir { fd, owner: me }))
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
    match check_dir(dir)? {
        Some(_) => Ok(()),
        None => Err(live_err(format!("{} vanished as it was made", dir.display()))),
    }
}

/// The socket name of a handle: `<pid>.<handle>.sock`.
fn socket_name(pid: i32, handle: u64) -> String {
    format!("{pid}.{handle}.sock")
}

/// Reads a socket name back; `None` for any other file.
fn parse_socket_name(name: &str) -> Option<(i32, u64)> {
    let stem = name.strip_suffix(".sock")?;
    let (pid, handle) = stem.split_once('.')?;
    if !pid.bytes().all(|b| b.is_ascii_digit()) || !handle.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let pid: i32 = pid.parse().ok().filter(|&p| p > 0)?;
    Some((pid, handle.parse().ok()?))
}

/// Lets the fuzz targets reach the socket-name parser.
#[doc(hidden)]
pub fn fuzz_parse_socket_name(name: &str) -> Option<(i32, u64)> {
    parse_socket_name(name)
}

/// What the probe of a socket found (see [`list`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The server accepted the probe; the pid is the kernel's (`SO_PEERCRED`).
    Accepted,
    /// The server accepted, but its process is in a pid namespace this one cannot see (the
    /// kernel gives pid 0): the pid is the one in the socket's name.
    Hidden,
    /// The server's queue was full (a stopped or wedged process): the pid is the one in
    /// the socket's name.
    Busy,
}

/// The published handles in `dir`, by pid then handle. `dir` gets the checks a publisher
/// gives it (see [`secure_dir`]), or it is refused with the reason; a missing directory
/// lists nothing. Each socket owned by the directory's owner is probed with a connect that
/// does not wait: one that accepts is listed under the pid the kernel gives for its server,
/// one whose queue is full is listed as [`Probe::Busy`], and one nothing listens on
/// (`ECONNREFUSED`) is stale and removed, relative to the directory's descriptor and only
/// if it is still the socket probed. Nothing else is ever removed: not a file of another
/// kind or owner, and not a socket because its pid looks gone (it may live in another pid
/// namespace).
pub fn list(dir: &Path) -> Result<Vec<Published>> {
    use std::os::fd::AsFd;
    let Some(d) = check_dir(dir)? else { return Ok(Vec::new()) };
    let names = sock::read_names(d.fd.as_fd()).map_err(|e| io_err("cannot list", dir, e))?;
    let mut out = Vec::new();
    for name in names {
        let Some((name_pid, handle)) = name.to_str().and_then(parse_socket_name) else { continue };
        let Ok(st) = sock::stat_at(d.fd.as_fd(), &name) else { continue };
        if !st.is_socket() || st.uid != d.owner {
            continue;
        }
        // Without /proc the path is the directory's own: the probe may then reach another
        // file than the one examined, so nothing is removed on its word.
        let (target, exact) = match sock::path_at(d.fd.as_fd(), &name) {
            Some(p) => (p, true),
            None => (dir.join(&name), false),
        };
        let (pid, probe) = match sock::connect(&target, None) {
            Ok(s) => match crate::sys::peer_cred(s.as_fd()) {
                Ok((_, uid)) if uid != d.owner && uid != 0 => continue,
                Ok((pid, _)) if pid > 0 => (pid, Probe::Accepted),
                Ok(_) => (name_pid, Probe::Hidden),
                Err(_) => continue,
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => (name_pid, Probe::Busy),
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                if exact && sock::stat_at(d.fd.as_fd(), &name).ok() == Some(st) {
                    let _ = sock::unlink_at(d.fd.as_fd(), &name);
                }
                continue;
            }
            // Gone meanwhile, or not ours to reach: neither listed nor removed.
            Err(_) => continue,
        };
        out.push(Published { pid, handle, path: dir.join(&name), probe });
    }
    out.sort_by_key(|p| (p.pid, p.handle));
    Ok(out)
}

/// The published handle of `pid` in `dir`: `handle` if given, else the process's only one.
pub fn find(dir: &Path, pid: i32, handle: Option<u64>) -> Result<Published> {
    let all: Vec<Published> = list(dir)?.into_iter().filter(|p| p.pid == pid).collect();
    if all.is_empty() && !crate::sys::process_exists(pid) {
        return Err(live_err(format!("no process {pid} (no process has that pid in this pid namespace)")));
    }
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
/// reply becomes [`Error::Live`] with the server's words. The whole exchange (connect,
/// send, reply) takes at most `timeout`: a server that does not accept (stopped, its queue
/// full) or does not answer in time is an error, never a hang. The socket's directory gets
/// the checks [`list`] gives it, and the server must run as the directory's owner or root.
pub fn request(path: &Path, line: &str, timeout: Duration) -> Result<String> {
    request_until(path, line, Instant::now() + timeout, None)
}

impl Published {
    /// [`request`] to this handle, which must still be served by the process [`list`] found.
    pub fn request(&self, line: &str, timeout: Duration) -> Result<String> {
        let pid = (self.probe == Probe::Accepted).then_some(self.pid);
        request_until(&self.path, line, Instant::now() + timeout, pid)
    }
}

/// The same request to many handles at once, each answered or failed by `deadline`
/// whatever the others do: a scrape bounded by its budget however many handles are silent.
pub fn request_all(handles: &[Published], line: &str, timeout: Duration) -> Vec<Result<String>> {
    // Threads in flight at once; each mostly sleeps in poll or connect.
    const WIDTH: usize = 32;
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(handles.len());
    for chunk in handles.chunks(WIDTH) {
        let results: Vec<Result<String>> = std::thread::scope(|s| {
            let threads: Vec<_> = chunk
                .iter()
                .map(|p| {
                    let pid = (p.probe == Probe::Accepted).then_some(p.pid);
                    s.spawn(move || request_until(&p.path, line, deadline, pid))
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|_| Err(live_err("the request's thread panicked"))))
                .collect()
        });
        out.extend(results);
    }
    out
}

fn request_until(path: &Path, line: &str, deadline: Instant, expect_pid: Option<i32>) -> Result<String> {
    use std::os::fd::AsFd;
    if line.contains('\n') || line.len() >= MAX_REQUEST {
        return Err(live_err(format!("a request is one line of fewer than {MAX_REQUEST} bytes")));
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(live_err(format!("{} does not name a socket in a directory", path.display())));
    };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let d =
        check_dir(dir)?.ok_or_else(|| live_err(format!("cannot connect to {}: no such directory", path.display())))?;
    let st = sock::stat_at(d.fd.as_fd(), name).map_err(|e| io_err("cannot connect to", path, e))?;
    if !st.is_socket() {
        return Err(live_err(format!("{} is not a socket", path.display())));
    }
    if st.uid != d.owner {
        return Err(live_err(format!("{} belongs to uid {}, not to the directory's owner", path.display(), st.uid)));
    }
    let target = sock::path_at(d.fd.as_fd(), name).unwrap_or_else(|| path.to_path_buf());
    let s = sock::connect(&target, Some(deadline)).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock => {
            live_err(format!("{} did not accept the connection in time (its process may be stopped)", path.display()))
        }
        _ => io_err("cannot connect to", path, e),
    })?;
    match crate::sys::peer_cred(s.as_fd()) {
        Ok((_, uid)) if uid != d.owner && uid != 0 => {
            return Err(live_err(format!("{} is served by uid {uid}, not by this user", path.display())))
        }
        Ok((pid, _)) if expect_pid.is_some_and(|e| e != pid) => {
            return Err(live_err(format!(
                "{} is now served by pid {pid}, not by pid {}",
                path.display(),
                expect_pid.unwrap_or_default()
            )))
        }
        Ok(_) => {}
        Err(e) => return Err(live_err(format!("{}: {e}", path.display()))),
    }
    let msg = format!("{line}\n");
    // A server that refuses the peer may answer and close before the request is sent: its
    // answer is still there to read, so a failed send reads it before giving up. The line
    // (under MAX_REQUEST) fits a fresh connection's buffer: one send, under the time left.
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let sent = s.set_write_timeout(Some(left)).and_then(|_| crate::sys::send_all(s.as_fd(), msg.as_bytes()));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(live_err(format!("the reply from {} took too long", path.display())));
        }
        s.set_read_timeout(Some(left)).map_err(|e| io_err("", path, e))?;
        match (&s).read(&mut chunk) {
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
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(live_err(format!("the reply from {} took too long", path.display())))
            }
            // A reset after the reply arrived (the server closed with our request unread).
            Err(_) if !buf.is_empty() && sent.is_err() => break,
            Err(e) => return Err(io_err("no reply from", path, e)),
        }
    }
    if let (Err(e), true) = (sent, buf.is_empty()) {
        return Err(io_err("cannot send to", path, e));
    }
    parse_reply(&buf).map_err(|e| match e {
        Error::Live(m) if m.is_empty() => live_err(format!("{} is not a zonal handle", path.display())),
        e => e,
    })
}

/// A reply read back: `ok` and the body, or `error <why>`; anything else is not a zonal
/// handle (an empty message, which the caller completes with the socket's name).
fn parse_reply(buf: &[u8]) -> Result<String> {
    let text = std::str::from_utf8(buf).map_err(|_| live_err("the reply is not UTF-8"))?;
    let (status, body) = text.split_once('\n').unwrap_or((text, ""));
    match status.split_once(' ').map_or((status, ""), |(a, b)| (a, b)) {
        ("ok", _) => Ok(body.to_string()),
        ("error", why) => Err(live_err(why.to_string())),
        _ => Err(live_err("")),
    }
}

/// Lets the fuzz targets reach the server without a socket: the reply it sends a client
/// of its own user that sent `input` (framing, request, reply layout).
#[doc(hidden)]
pub fn fuzz_reply_to(z: &Zonal, input: &[u8]) -> Vec<u8> {
    server::reply_to(z, input)
}

/// Lets the fuzz targets reach the client's reading of a reply.
#[doc(hidden)]
pub fn fuzz_parse_reply(buf: &[u8]) -> Result<String> {
    parse_reply(buf)
}

impl Zonal {
    /// Publishes this handle in [`runtime_dir`] (see [`crate::live`]); returns its socket.
    /// Publishing a published handle returns its socket again.
    pub fn publish(self: &Arc<Self>) -> Result<PathBuf> {
        self.publish_with(PublishOptions::default())
    }

    /// Publishes this handle as `opts` says.
    pub fn publish_with(self: &Arc<Self>, opts: PublishOptions) -> Result<PathBuf> {
        let mut slot = self.attached();
        if let Some(s) = slot.as_ref().and_then(|a| a.downcast_ref::<Server>()) {
            return Ok(s.path().to_path_buf());
        }
        let dir = opts.dir.clone().unwrap_or_else(runtime_dir);
        secure_dir(&dir)?;
        let path = dir.join(socket_name(std::process::id() as i32, self.id()));
        let server = Server::start(Arc::downgrade(self), path, opts.timeout)?;
        let p = server.path().to_path_buf();
        *slot = Some(Box::new(server));
        Ok(p)
    }

    /// Stops serving requests and removes the socket; `false` if the handle was not
    /// published.
    pub fn unpublish(&self) -> bool {
        // Take it out first: the server's drop joins its thread, which may want the slot.
        let s = self.attached().take();
        s.is_some()
    }

    /// The socket of this handle if it is published.
    pub fn published_path(&self) -> Option<PathBuf> {
        self.attached().as_ref().and_then(|a| a.downcast_ref::<Server>()).map(|s| s.path().to_path_buf())
    }

    /// Builds a shared handle, and publishes it when the config says so (`publish=1`) or the
    /// environment has `ZONAL_PUBLISH=1`: the handle the C ABI builds, and the one to build
    /// for a program that should be watched with `zonal --pid`.
    pub fn shared(config: crate::Config) -> Result<Arc<Zonal>> {
        let publish = config.publish || crate::config::publish_from_env()?;
        let z = Arc::new(Zonal::build(crate::Config { publish: false, ..config })?);
        if publish {
            z.publish()?;
        }
        Ok(z)
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
