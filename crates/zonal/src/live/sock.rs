//! The system calls of the live surface: a directory held by a descriptor and read,
//! examined and cleaned relative to it (`openat`-style: `fstatat`, `unlinkat`), connects
//! bounded by a deadline, and sends bounded by one.
//!
//! Kernel counterpart: none; these are the calls `crate::sys` makes for the rest of the
//! crate, kept beside their only user (they belong in `sys` once that file is free to take
//! them).
//!
//! Invariant: nothing here follows a symbolic link in the last component of a path it is
//! given, and every name it is given is one component (no `/`), so that a directory checked
//! through its descriptor is the directory every later call acts in.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// One component of a path: a name with no `/`, not `.` or `..`.
fn component(name: &OsStr) -> io::Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a file name"));
    }
    cstr(b)
}

/// Opens `path` as a directory without following a link in its last component
/// (`O_DIRECTORY | O_NOFOLLOW`): a link fails with `ELOOP`, a file with `ENOTDIR`.
pub(super) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `open` returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What `fstat`/`fstatat` tell the live module about a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stat {
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) mode: u32,
    pub(super) uid: u32,
}

impl Stat {
    fn of(st: &libc::stat) -> Stat {
        Stat { dev: st.st_dev, ino: st.st_ino, mode: st.st_mode, uid: st.st_uid }
    }
    pub(super) fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    pub(super) fn is_socket(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFSOCK
    }
}

/// `fstat` of an open descriptor.
pub(super) fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` has room for one `stat`, which the call fills on success; `fd` is open.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat returned 0, so it wrote the whole struct.
    Ok(Stat::of(unsafe { st.assume_init_ref() }))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, a link as a link.
pub(super) fn stat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Stat> {
    let c = component(name)?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `c` is NUL-terminated, `st` has room for one `stat`, `dir` is open.
    if unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), st.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatat returned 0, so it wrote the whole struct.
    Ok(Stat::of(unsafe { st.assume_init_ref() }))
}

/// `unlinkat(dir, name, 0)`: removes the entry in the directory `dir` holds (a link
/// itself, never what it points to).
pub(super) fn unlink_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let c = component(name)?;
    // SAFETY: `c` is NUL-terminated and `dir` is open for the call.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The names in the directory `dir` holds (without `.` and `..`).
pub(super) fn read_names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    // fdopendir takes the descriptor it is given: give it a duplicate, so that `dir` stays
    // open for the `*at` calls that follow.
    let dup = dir.try_clone_to_owned()?;
    let raw = std::os::fd::IntoRawFd::into_raw_fd(dup);
    // SAFETY: `raw` is an open directory descriptor that this function owns; on success the
    // stream owns it, on failure it is closed below.
    let d = unsafe { libc::fdopendir(raw) };
    if d.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `raw` is still ours to close.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        return Err(e);
    }
    // The descriptor was opened here, at offset 0; rewinding makes that explicit.
    // SAFETY: `d` is the open stream returned above.
    unsafe { libc::rewinddir(d) };
    let mut out = Vec::new();
    let result = loop {
        // SAFETY: errno is thread-local; clearing it tells the end of the stream from an
        // error, as readdir(3) prescribes.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `d` is open; the entry returned stays valid until the next readdir on it.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            let err = io::Error::last_os_error();
            break if err.raw_os_error() == Some(0) { Ok(()) } else { Err(err) };
        }
        // SAFETY: `e` points to a valid dirent whose d_name is NUL-terminated.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        let b = name.to_bytes();
        if b != b"." && b != b".." {
            out.push(OsString::from_vec(b.to_vec()));
        }
    };
    // SAFETY: `d` is open and is not used after this; closedir closes its descriptor.
    unsafe { libc::closedir(d) };
    result.map(|()| out)
}

/// A path that names `name` inside the directory `dir` holds whatever happens to the
/// directory's own path (`/proc/self/fd/N/name`), for the calls that have no `*at` form
/// (`connect`); `None` without `/proc`.
pub(super) fn path_at(dir: BorrowedFd<'_>, name: &OsStr) -> Option<PathBuf> {
    component(name).ok()?;
    let base = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    base.is_dir().then(|| base.join(name))
}

/// Connects to the Unix socket at `path`. With no deadline the connect does not wait at
/// all (`SOCK_NONBLOCK`: a server whose queue is full gives `WouldBlock` at once); with
/// one it waits for room in the queue until then at most (a Unix socket's connect waits
/// under the send timeout, `SO_SNDTIMEO`, and gives `EAGAIN` when it runs out). The stream
/// returned is blocking, with no timeouts set.
pub(super) fn connect(path: &Path, deadline: Option<Instant>) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data, valid when zeroed.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a socket path too long for sockaddr_un"));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let ty = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | if deadline.is_none() { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: socket takes no pointers.
    let raw = unsafe { libc::socket(libc::AF_UNIX, ty, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `socket` returned a fresh descriptor that nothing else owns.
    let s = UnixStream::from(unsafe { OwnedFd::from_raw_fd(raw) });
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    loop {
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::WouldBlock, "the server did not accept in time"));
            }
            // A zero timeout would mean none at all: at least a millisecond.
            s.set_write_timeout(Some(left.max(Duration::from_millis(1))))?;
        }
        // SAFETY: `addr` is an initialised sockaddr_un and `len` does not exceed its size;
        // `s` is open for the call.
        let r = unsafe { libc::connect(s.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) };
        if r == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // Interrupted while waiting for room: the socket is still unconnected; again.
            Some(libc::EINTR) => continue,
            // A non-blocking connect never returns EINPROGRESS for AF_UNIX, but the send
            // timeout running out is reported so by some kernels: both mean "not accepted".
            Some(libc::EINPROGRESS) => {
                return Err(io::Error::new(io::ErrorKind::WouldBlock, "the server did not accept in time"))
            }
            _ => return Err(e),
        }
    }
    s.set_nonblocking(false)?;
    s.set_write_timeout(None)?;
    Ok(s)
}

/// Sends all of `buf` before `deadline` or fails (`TimedOut`). Each `send` is
/// non-blocking (`MSG_DONTWAIT`) and the wait for room is a `poll` of what is left of the
/// time: a blocking send of a large buffer would wait out the send timeout afresh for every
/// buffer's worth the reader takes, so a reader taking a little now and then could stretch
/// one send without end. `MSG_NOSIGNAL`: a vanished peer is an error, not `SIGPIPE`.
pub(super) fn send_until(s: &UnixStream, mut buf: &[u8], deadline: Instant) -> io::Result<()> {
    let fd = s.as_fd().as_raw_fd();
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for reads of its length and `fd` is open for the call.
        let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if n >= 0 {
            buf = &buf[n as usize..];
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => {}
            _ => return Err(e),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the reply was not taken in time"));
        }
        let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
        // Round up: a wait of 0 ms would spin until the deadline.
        let ms = i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX);
        // SAFETY: `p` is one valid pollfd for the call.
        if unsafe { libc::poll(&mut p, 1, ms) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Sets a listening socket's queue of connections not yet accepted (`listen` again on a
/// listening socket changes only its backlog).
pub(super) fn set_backlog(fd: BorrowedFd<'_>, backlog: i32) -> io::Result<()> {
    // SAFETY: listen takes no pointers; `fd` is open for the call.
    if unsafe { libc::listen(fd.as_raw_fd(), backlog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
