//! Live introspection at the library level: publishing, the directory's and socket's
//! modes, the protocol's replies, and a server that bad clients cannot stop or hold up.

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
