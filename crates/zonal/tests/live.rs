//! Live introspection at the library level: publishing, the directory's and socket's
//! modes, the protocol's replies, and a server that bad clients cannot stop or hold up.
//!
//! A test binary of its own, not a module of tests/suite: one test sets `ZONAL_RUNTIME_DIR`
//! in the process's environment (the default directory of `Zonal::shared`), which every other
//! test running beside it would see; and two tests run this binary again by a test's exact
//! name (`child_publisher`, `child_env_publish`) to get a published process of their own.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zonal::live::{self, PublishOptions};
use zonal::{Config, Error, Gfp, NodeId, Topology, Zonal};

/// A directory for one test's sockets, not yet created (publishing makes it 0700).
fn test_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("zonal-live-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn handle() -> Arc<Zonal> {
    Arc::new(Zonal::new(Config::new(Topology::parse("nodes=2,size=16M").unwrap())).unwrap())
}

fn publish(z: &Arc<Zonal>, dir: &Path, timeout: Duration) -> PathBuf {
    z.publish_with(PublishOptions { dir: Some(dir.to_path_buf()), timeout }).unwrap()
}

/// Sends raw bytes and reads the whole reply.
fn raw(path: &Path, bytes: &[u8]) -> String {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn a_published_handle_answers_its_reports_with_the_local_text() {
    let dir = test_dir("reports");
    let z = handle();
    let path = publish(&z, &dir, live::DEFAULT_TIMEOUT);
    assert_eq!(live::mode_of(&dir), Some(0o700), "the directory is private");
    assert_eq!(live::mode_of(&path), Some(0o600), "the socket is private");
    assert_eq!(path.file_name().unwrap().to_str().unwrap(), format!("{}.{}.sock", std::process::id(), z.id()));
    let pages: Vec<_> = (0..10).map(|_| z.alloc_pages_node(NodeId(1), Gfp::THISNODE, 0).unwrap()).collect();
    let ask = |r: &str| live::request(&path, r, Duration::from_secs(10)).unwrap();
    // Quiescent: the remote reports are the local ones, byte for byte.
    assert_eq!(ask("zoneinfo"), z.zoneinfo());
    assert_eq!(ask("buddyinfo"), z.buddyinfo());
    assert_eq!(ask("vmstat"), z.vmstat());
    assert_eq!(ask("numastat node 1"), z.numastat_node(NodeId(1)).unwrap());
    assert_eq!(ask("topology"), z.topology_text());
    let vm: serde_json::Value = serde_json::from_str(&ask("vmstat json")).unwrap();
    assert_eq!(vm["pgalloc_normal"].as_u64(), Some(z.vmstat_value("pgalloc_normal").unwrap()));
    assert!(vm["pgalloc_normal"].as_u64().unwrap() >= 10);
    let buddy: serde_json::Value = serde_json::from_str(&ask("buddyinfo json")).unwrap();
    assert_eq!(buddy[1]["node"], 1);
    assert_eq!(buddy[1]["free_blocks"].as_array().unwrap().len(), z.max_order().get() as usize + 1);
    let info: serde_json::Value = serde_json::from_str(&ask("info")).unwrap();
    assert_eq!(info["pid"].as_u64(), Some(std::process::id() as u64));
    assert_eq!(info["handle"].as_u64(), Some(z.id()));
    let top: serde_json::Value = serde_json::from_str(&ask("top")).unwrap();
    let n1 = &top["nodes"][1];
    let used = n1["managed"].as_u64().unwrap() - n1["free"].as_u64().unwrap() - n1["pcp"].as_u64().unwrap();
    assert_eq!(used, 10, "node 1 has the ten pages allocated: {n1}");
    for p in pages {
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    drop(z);
    assert!(!path.exists(), "dropping the handle removes its socket");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sysctl_requests_tune_the_handle_and_refusals_keep_the_old_value() {
    let dir = test_dir("sysctl");
    let z = handle();
    let path = publish(&z, &dir, live::DEFAULT_TIMEOUT);
    let ask = |r: &str| live::request(&path, r, Duration::from_secs(10));
    assert_eq!(ask("sysctl set watermark_scale_factor 50").unwrap(), "50\n");
    assert_eq!(z.sysctl_get("watermark_scale_factor").unwrap(), "50");
    let e = ask("sysctl set watermark_scale_factor 0").unwrap_err();
    assert!(matches!(e, Error::Live(_)), "{e:?}");
    assert_eq!(z.sysctl_get("watermark_scale_factor").unwrap(), "50", "a refused value changes nothing");
    assert!(ask("sysctl get nosuch").unwrap_err().to_string().contains("nosuch"));
    assert!(ask("sysctl all").unwrap().contains("watermark_scale_factor = 50\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn malformed_and_hostile_requests_get_an_error_and_the_server_goes_on() {
    let dir = test_dir("hostile");
    let z = handle();
    let path = publish(&z, &dir, Duration::from_millis(500));
    assert!(raw(&path, b"nosuch request\n").starts_with("error unknown request `nosuch request`"));
    assert!(raw(&path, b"zoneinfo xml\n").starts_with("error unknown request"));
    assert!(raw(&path, b"numastat node 99\n").starts_with("error invalid node 99"));
    assert!(raw(&path, b"numastat node -1\n").starts_with("error numastat node `-1`"));
    assert!(raw(&path, &[0xff, 0xfe, b'\n']).starts_with("error the request is not UTF-8"));
    assert!(raw(&path, &[b'a'; 10_000]).starts_with("error request too long"));
    // A request without its newline is read to the end of the stream.
    assert!(raw(&path, b"help").starts_with("ok\ninfo "));
    // A client that sends its request and leaves before the reply: the server's send fails
    // (without SIGPIPE) and it serves the next client.
    for _ in 0..20 {
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"zoneinfo\n").unwrap();
        drop(s);
    }
    assert!(raw(&path, b"info\n").starts_with("ok\n{"));
    let info: serde_json::Value =
        serde_json::from_str(&live::request(&path, "info", Duration::from_secs(10)).unwrap()).unwrap();
    assert!(info["requests_failed"].as_u64().unwrap() >= 6, "{info}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stuck_client_holds_up_neither_the_allocator_nor_the_next_client_past_the_timeout() {
    let dir = test_dir("stuck");
    let z = handle();
    let timeout = Duration::from_millis(300);
    let path = publish(&z, &dir, timeout);
    // Connected, silent, never reading.
    let stuck = UnixStream::connect(&path).unwrap();
    // The allocator does not wait for the server.
    for _ in 0..1000 {
        let p = z.alloc_pages(Gfp::empty(), 0).unwrap();
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    // The next client is served once the stuck one's time is up.
    let t = Instant::now();
    let reply = live::request(&path, "info", Duration::from_secs(10)).unwrap();
    assert!(reply.starts_with('{'));
    assert!(t.elapsed() < Duration::from_secs(5), "served after {:?}", t.elapsed());
    // The stuck client was told why it was dropped.
    let mut s = String::new();
    stuck.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (&stuck).read_to_string(&mut s).unwrap();
    assert_eq!(s, "error timed out waiting for the request\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn publishing_refuses_a_directory_others_can_reach() {
    let z = handle();
    let opts = |d: &Path| PublishOptions { dir: Some(d.to_path_buf()), timeout: live::DEFAULT_TIMEOUT };
    // Group and others may enter.
    let open = test_dir("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = z.publish_with(opts(&open)).unwrap_err().to_string();
    assert!(e.contains("must be 0700"), "{e}");
    // A link to a private directory is not the directory.
    let real = test_dir("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = test_dir("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let e = z.publish_with(opts(&link)).unwrap_err().to_string();
    assert!(e.contains("not a directory"), "{e}");
    // A file.
    let file = test_dir("file");
    std::fs::write(&file, b"").unwrap();
    assert!(z.publish_with(opts(&file)).is_err());
    assert_eq!(z.published_path(), None, "nothing was published");
    for p in [&open, &real, &link, &file] {
        let _ = std::fs::remove_file(p);
        let _ = std::fs::remove_dir_all(p);
    }
}

#[test]
fn list_finds_handles_and_removes_stale_sockets() {
    let dir = test_dir("list");
    let a = handle();
    let b = handle();
    let pa = publish(&a, &dir, live::DEFAULT_TIMEOUT);
    publish(&b, &dir, live::DEFAULT_TIMEOUT);
    // Publishing again returns the same socket.
    assert_eq!(publish(&a, &dir, live::DEFAULT_TIMEOUT), pa);
    // A socket left by a process that is gone: bound, then its process exited.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id() as i32;
    child.wait().unwrap();
    let stale = dir.join(format!("{dead}.1.sock"));
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    // A socket of this process whose server is gone (a handle leaked by a crashed thread).
    let orphan = dir.join(format!("{}.999999.sock", std::process::id()));
    drop(std::os::unix::net::UnixListener::bind(&orphan).unwrap());
    let found = live::list(&dir).unwrap();
    let me = std::process::id() as i32;
    assert_eq!(
        found.iter().map(|p| (p.pid, p.handle)).collect::<Vec<_>>(),
        vec![(me, a.id().min(b.id())), (me, a.id().max(b.id()))]
    );
    assert!(!stale.exists() && !orphan.exists(), "stale sockets are removed");
    // Several handles: find needs the handle.
    let e = live::find(&dir, me, None).unwrap_err().to_string();
    assert!(e.contains("several published handles"), "{e}");
    assert_eq!(live::find(&dir, me, Some(b.id())).unwrap().handle, b.id());
    assert!(live::find(&dir, me, Some(123_456_789)).is_err());
    assert!(a.unpublish());
    assert!(!a.unpublish());
    assert!(!pa.exists());
    assert_eq!(live::find(&dir, me, None).unwrap().handle, b.id());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn publish_needs_a_shared_handle_and_shared_publishes_on_request() {
    let mut c = Config::new(Topology::parse("nodes=1,size=8M").unwrap());
    c.publish = true;
    let e = Zonal::new(c.clone()).err().expect("Zonal::new cannot publish").to_string();
    assert!(e.contains("Zonal::shared"), "{e}");
    let parsed = Config::parse("topology=nodes=1,size=8M;publish=1").unwrap();
    assert!(parsed.publish);
    assert!(Config::parse("topology=nodes=1,size=8M;publish=maybe").is_err());
    // Zonal::shared publishes in the default directory; point it at a test one.
    let dir = test_dir("shared");
    std::env::set_var("ZONAL_RUNTIME_DIR", &dir);
    let z = Zonal::shared(c).unwrap();
    std::env::remove_var("ZONAL_RUNTIME_DIR");
    let path = z.published_path().expect("published");
    assert!(path.starts_with(&dir));
    assert!(live::request(&path, "info", Duration::from_secs(10)).is_ok());
    // The server holds the handle weakly: the last Arc going ends it all.
    drop(z);
    assert!(!path.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- Issue 37: readers that trust no directory, connects and replies that cannot hang ----

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};

fn is_root() -> bool {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A pid no process has: a child's, once it has been waited for.
fn dead_pid() -> i32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    pid
}

/// A socket at `path` that nothing listens on any more (bound, then closed).
fn stale_socket(path: &Path) {
    drop(std::os::unix::net::UnixListener::bind(path).unwrap());
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
}

/// A connect that does not wait: `None` when the server's queue is full.
fn connect_nowait(path: &Path) -> Option<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data, valid when zeroed.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_bytes();
    assert!(b.len() < addr.sun_path.len());
    for (d, s) in addr.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket takes no pointers.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: `fd` is fresh and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is an initialised sockaddr_un of `len` bytes; `fd` is open.
    let r =
        unsafe { libc::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), (&addr as *const libc::sockaddr_un).cast(), len) };
    if r == 0 {
        return Some(fd);
    }
    let e = std::io::Error::last_os_error();
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
    None
}

/// Not a test of its own: the published process the tests below stop, when they run this
/// binary again with `ZONAL_TEST_PUBLISH_IN` set. Publishes a handle there, prints its
/// socket and waits for its stdin to close.
#[test]
fn child_publisher() {
    let Some(dir) = std::env::var_os("ZONAL_TEST_PUBLISH_IN") else { return };
    let z = handle();
    let path = publish(&z, Path::new(&dir), Duration::from_millis(500));
    println!("published {}", path.display());
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// A published process of its own, stopped and continued at will; killed when dropped.
struct Publisher {
    child: Child,
    path: PathBuf,
}

impl Publisher {
    fn start(dir: &Path) -> Publisher {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_publisher", "--nocapture", "--test-threads=1"])
            .env("ZONAL_TEST_PUBLISH_IN", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let line = std::io::BufRead::lines(out)
            .map(Result::unwrap)
            .find_map(|l| l.split_once("published ").map(|(_, p)| p.to_string()))
            .expect("the child publishes");
        Publisher { path: PathBuf::from(line), child }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill takes no pointers; the child is ours and not yet waited for.
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
    }

    /// Stops it, and returns once it has stopped (kill only queues the signal).
    fn stop(&self) {
        self.signal(libc::SIGSTOP);
        wait_stopped(self.pid());
    }
}

/// Waits until the child `pid` has stopped (`waitpid` with `WUNTRACED`).
fn wait_stopped(pid: i32) {
    let mut status = 0;
    // SAFETY: `status` is valid for a write; `pid` is our child, not yet reaped.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
    assert!(r == pid && libc::WIFSTOPPED(status), "waitpid: {r} {status:#x}");
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn readers_refuse_a_link_a_file_and_an_open_directory_and_touch_nothing_in_them() {
    // The directory a link points to, private and ours, holding a file named like a socket
    // of a dead process: the old reader followed the link and deleted it as stale.
    let real = test_dir("reader-real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    let bait = real.join(format!("{}.1.sock", dead_pid()));
    std::fs::write(&bait, b"not a socket").unwrap();
    let link = test_dir("reader-link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    for e in [
        live::list(&link).unwrap_err(),
        live::request(&link.join("1.1.sock"), "info", Duration::from_secs(1)).unwrap_err(),
    ] {
        let e = e.to_string();
        assert!(e.contains("not a directory") && e.contains(link.to_str().unwrap()), "{e}");
    }
    assert!(bait.exists(), "nothing in a link's target is removed");
    // Open to group and others.
    let open = test_dir("reader-open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = live::list(&open).unwrap_err().to_string();
    assert!(e.contains("must be 0700") && e.contains(open.to_str().unwrap()), "{e}");
    // A file.
    let file = test_dir("reader-file");
    std::fs::write(&file, b"").unwrap();
    assert!(live::list(&file).unwrap_err().to_string().contains("not a directory"));
    // Missing: nothing published there yet.
    assert_eq!(live::list(&test_dir("reader-missing")).unwrap(), vec![]);
    for p in [&link, &file] {
        let _ = std::fs::remove_file(p);
    }
    for p in [&real, &open] {
        let _ = std::fs::remove_dir_all(p);
    }
}

#[test]
fn as_root_a_directory_someone_else_made_is_refused_by_readers_and_publishers() {
    // Runs as root (the only uid that can make a directory another user owns); as any other
    // user it cannot set the scene and says so.
    if !is_root() {
        eprintln!("not root: a directory of another uid is tested where the test can chown");
        return;
    }
    // `zonal-0` as an attacker makes it first: theirs, private, with their stale socket and
    // a file named like a socket in it.
    let squat = test_dir("squat").join("zonal-0");
    std::fs::create_dir_all(&squat).unwrap();
    std::fs::set_permissions(&squat, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sock = squat.join(format!("{}.1.sock", dead_pid()));
    stale_socket(&sock);
    let file = squat.join(format!("{}.2.sock", dead_pid()));
    std::fs::write(&file, b"").unwrap();
    for p in [&squat, &sock, &file] {
        chown(p, 65534);
    }
    let e = live::list(&squat).unwrap_err().to_string();
    assert!(e.contains(squat.to_str().unwrap()) && e.contains("belongs to uid 65534"), "{e}");
    assert!(e.contains("someone else made it"), "{e}");
    assert!(sock.exists() && file.exists(), "nothing in another user's directory is removed");
    let z = handle();
    let e = z.publish_with(PublishOptions { dir: Some(squat.clone()), ..Default::default() }).unwrap_err().to_string();
    assert!(e.contains(squat.to_str().unwrap()) && e.contains("belongs to uid 65534"), "{e}");
    assert_eq!(Error::Live(String::new()).errno(), libc::EPROTO, "the C ABI's code for it");
    let _ = std::fs::remove_dir_all(squat.parent().unwrap());
}

#[test]
fn list_removes_only_a_stale_socket_of_its_owner_and_nothing_else() {
    let dir = test_dir("only-sockets");
    let z = handle();
    publish(&z, &dir, live::DEFAULT_TIMEOUT);
    let dead = dead_pid();
    // A regular file, a FIFO and a link to a stale socket elsewhere, each named like a socket.
    let file = dir.join(format!("{dead}.1.sock"));
    std::fs::write(&file, b"").unwrap();
    let fifo = dir.join(format!("{dead}.2.sock"));
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let elsewhere = test_dir("only-sockets-target");
    std::fs::create_dir(&elsewhere).unwrap();
    let target = elsewhere.join("target.sock");
    stale_socket(&target);
    let link = dir.join(format!("{dead}.3.sock"));
    std::os::unix::fs::symlink(&target, &link).unwrap();
    // A stale socket of this user: the one thing to remove.
    let stale = dir.join(format!("{dead}.4.sock"));
    stale_socket(&stale);
    // A stale socket of another user (root can set one up; others cannot and skip it).
    let foreign = dir.join(format!("{dead}.5.sock"));
    if is_root() {
        stale_socket(&foreign);
        chown(&foreign, 65534);
    }
    let found = live::list(&dir).unwrap();
    assert_eq!(found.iter().map(|p| p.handle).collect::<Vec<_>>(), vec![z.id()], "only the live handle is listed");
    assert!(!stale.exists(), "the owner's stale socket is removed");
    assert!(file.exists() && fifo.exists() && link.exists() && target.exists(), "files that are not sockets stay");
    if is_root() {
        assert!(foreign.exists(), "another uid's socket stays, stale or not");
    } else {
        eprintln!("not root: the socket of another uid is tested where the test can chown");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&elsewhere);
}

#[test]
fn a_server_is_named_by_its_credentials_and_kept_whatever_pid_its_name_claims() {
    let dir = test_dir("peer-pid");
    let z = handle();
    let path = publish(&z, &dir, live::DEFAULT_TIMEOUT);
    // Renamed to claim a pid no process has here (as a server in another pid namespace
    // sharing the directory looks): it is alive, and a connect proves it, so it stays.
    let dead = dead_pid();
    let renamed = dir.join(format!("{dead}.{}.sock", z.id()));
    std::fs::rename(&path, &renamed).unwrap();
    // And one that claims pid 1.
    let other = handle();
    let other_path = publish(&other, &dir, live::DEFAULT_TIMEOUT);
    let forged = dir.join(format!("1.{}.sock", other.id()));
    std::fs::rename(&other_path, &forged).unwrap();
    let found = live::list(&dir).unwrap();
    let me = std::process::id() as i32;
    assert_eq!(found.len(), 2, "{found:?}");
    for p in &found {
        assert_eq!(p.pid, me, "the kernel's pid, not the name's: {p:?}");
        assert_eq!(p.probe, live::Probe::Accepted);
    }
    assert!(renamed.exists() && forged.exists(), "live sockets stay");
    assert!(live::find(&dir, 1, None).is_err(), "no handle is found under the pid its name forges");
    assert!(live::find(&dir, dead, None).is_err());
    let mine = live::find(&dir, me, Some(z.id())).unwrap();
    assert!(mine.request("info", Duration::from_secs(10)).unwrap().contains(&format!("\"handle\":{}", z.id())));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stopped_process_costs_a_reader_at_most_its_deadline() {
    let dir = test_dir("stopped");
    let child = Publisher::start(&dir);
    let z = handle();
    publish(&z, &dir, live::DEFAULT_TIMEOUT);
    let bound = Duration::from_secs(1);
    // Stopped with room in its queue: the connect is taken by the kernel, no reply comes.
    child.stop();
    let found = live::list(&dir).unwrap();
    let p = found.iter().find(|p| p.pid == child.pid()).unwrap_or_else(|| panic!("{found:?}"));
    assert_eq!(p.probe, live::Probe::Accepted);
    let t = Instant::now();
    let e = live::request(&child.path, "info", bound).unwrap_err().to_string();
    assert!(e.contains("took too long"), "{e}");
    assert!(t.elapsed() < bound * 3, "gave up after {:?}", t.elapsed());
    // Its queue full (the probes of `list` and the request above are in it): the old
    // blocking connect sat here for good.
    let mut held = Vec::new();
    while let Some(fd) = connect_nowait(&child.path) {
        held.push(fd);
        assert!(held.len() < 10_000, "the queue never filled");
    }
    let t = Instant::now();
    let found = live::list(&dir).unwrap();
    let p = found.iter().find(|p| p.path == child.path).unwrap_or_else(|| panic!("{found:?}"));
    assert_eq!((p.probe, p.pid), (live::Probe::Busy, child.pid()), "listed, busy, under its name's pid");
    assert!(child.path.exists(), "a busy socket is not stale");
    let e = live::request(&child.path, "info", bound).unwrap_err().to_string();
    assert!(e.contains("did not accept"), "{e}");
    // Many handles at once: the stopped one does not hold up the live one.
    let answers = live::request_all(&found, "info", bound);
    assert!(t.elapsed() < bound * 3, "gave up after {:?}", t.elapsed());
    for (p, a) in found.iter().zip(&answers) {
        assert_eq!(a.is_ok(), p.path != child.path, "{p:?}: {a:?}");
    }
    // Continued, with the queue drained, it answers again.
    drop(held);
    child.signal(libc::SIGCONT);
    assert!(live::request(&child.path, "info", Duration::from_secs(30)).is_ok());
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reply_taken_a_little_at_a_time_is_cut_at_the_timeout() {
    let dir = test_dir("drip");
    // 256 nodes: a Prometheus exposition of about half a megabyte, more than the socket's
    // buffer holds, so the server must wait for the reader.
    let z = Arc::new(Zonal::new(Config::new(Topology::parse("nodes=256,size=4M").unwrap())).unwrap());
    let timeout = Duration::from_millis(500);
    let path = publish(&z, &dir, timeout);
    let full = z.prometheus().len() + "ok\n".len();
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(b"vmstat prometheus\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // Taking 8 KiB every 20 ms keeps each send of the server moving: with a timeout per send,
    // the old server sent all of it.
    let mut got = 0;
    let mut chunk = [0u8; 8192];
    loop {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(got < full, "the server stopped sending at its deadline: {got} of {full} bytes");
    let info: serde_json::Value =
        serde_json::from_str(&live::request(&path, "info", Duration::from_secs(10)).unwrap()).unwrap();
    assert_eq!(info["requests_failed"], 1, "{info}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Not a test of its own: run again by the test below with `ZONAL_TEST_ENV_PUBLISH` set to
/// the value of `ZONAL_PUBLISH` it expects; checks that `Zonal::new` and `Zonal::shared`
/// agree on it.
#[test]
fn child_env_publish() {
    let Some(v) = std::env::var_os("ZONAL_TEST_ENV_PUBLISH") else { return };
    let c = Config::new(Topology::parse("nodes=1,size=8M").unwrap());
    match v.to_str().unwrap() {
        "1" => {
            let e = Zonal::new(c.clone()).err().expect("Zonal::new refuses to ignore ZONAL_PUBLISH=1").to_string();
            assert!(e.contains("ZONAL_PUBLISH=1") && e.contains("Zonal::shared"), "{e}");
            let z = Zonal::shared(c).unwrap();
            assert!(z.published_path().is_some(), "Zonal::shared publishes on ZONAL_PUBLISH=1");
        }
        "0" => {
            drop(Zonal::new(c.clone()).unwrap());
            assert!(Zonal::shared(c).unwrap().published_path().is_none());
        }
        bad => {
            for e in [Zonal::new(c.clone()).err().unwrap(), Zonal::shared(c.clone()).err().unwrap()] {
                assert!(e.to_string().contains(&format!("ZONAL_PUBLISH=`{bad}`")), "{e}");
            }
        }
    }
}

#[test]
fn zonal_publish_is_never_ignored_and_both_constructors_agree() {
    // In a process of its own each: the environment is the whole process's.
    let dir = test_dir("env-publish");
    for v in ["1", "0", "maybe"] {
        let o = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_env_publish", "--nocapture", "--test-threads=1"])
            .env("ZONAL_TEST_ENV_PUBLISH", v)
            .env("ZONAL_PUBLISH", v)
            .env("ZONAL_RUNTIME_DIR", &dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "ZONAL_PUBLISH={v}: {}", String::from_utf8_lossy(&o.stdout));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
