//! The live commands end to end: this test process publishes a handle, and the `zonal`
//! command reads it (`ps`, `--pid` reports, `sysctl`, `top`), the exporter serves it over
//! HTTP to a real client, and a peer of another uid is refused.

use crate::common;
use common::{err, ok};
use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;
use zonal::live::PublishOptions;
use zonal::{Config, Gfp, NodeId, Topology, Zonal};

fn test_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("zonal-cli-live-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn published(dir: &Path) -> Arc<Zonal> {
    let z = Arc::new(Zonal::new(Config::new(Topology::parse("nodes=2,size=16M").unwrap())).unwrap());
    z.publish_with(PublishOptions { dir: Some(dir.to_path_buf()), ..Default::default() }).unwrap();
    z
}

fn zonal(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zonal")).arg("--dir").arg(dir).args(args).output().expect("zonal runs")
}

#[test]
fn ps_and_every_report_of_a_running_process() {
    let dir = test_dir("reports");
    let z = published(&dir);
    let pid = std::process::id().to_string();
    let pages: Vec<_> = (0..7).map(|_| z.alloc_pages_node(NodeId(0), Gfp::THISNODE, 0).unwrap()).collect();

    let ps = ok(&zonal(&dir, &["ps"]));
    let row = ps.lines().find(|l| l.starts_with(&pid)).unwrap_or_else(|| panic!("{ps}"));
    assert_eq!(row.split_whitespace().nth(1), Some(z.id().to_string().as_str()), "{row}");
    let ps_json: serde_json::Value = serde_json::from_str(&ok(&zonal(&dir, &["ps", "--json"]))).unwrap();
    assert_eq!(ps_json[0]["info"]["nodes"], 2);

    // Each report is the process's own, as its handle prints it.
    let p = ["--pid", pid.as_str()];
    assert_eq!(ok(&zonal(&dir, &[&p[..], &["zoneinfo"]].concat())), z.zoneinfo());
    assert_eq!(ok(&zonal(&dir, &[&p[..], &["vmstat"]].concat())), z.vmstat());
    assert_eq!(ok(&zonal(&dir, &[&p[..], &["buddyinfo"]].concat())), z.buddyinfo());
    assert_eq!(ok(&zonal(&dir, &[&p[..], &["numastat", "--node", "0"]].concat())), z.numastat_node(NodeId(0)).unwrap());
    assert_eq!(ok(&zonal(&dir, &[&p[..], &["topology"]].concat())), z.topology_text());
    let prom = ok(&zonal(&dir, &[&p[..], &["vmstat", "--prometheus"]].concat()));
    assert!(prom.contains("zonal_zoneinfo_managed_pages{node=\"1\",zone=\"Normal\"}"), "{prom}");
    let zi: serde_json::Value =
        serde_json::from_str(&ok(&zonal(&dir, &[&p[..], &["zoneinfo", "--json"]].concat()))).unwrap();
    assert_eq!(zi.as_array().unwrap().len(), 2);

    // Options of a local allocator are refused with --pid, as is a handle it does not have.
    assert!(err(&zonal(&dir, &[&p[..], &["--topology", "nodes=1,size=8M", "vmstat"]].concat())).contains("--topology"));
    assert!(err(&zonal(&dir, &[&p[..], &["zoneinfo", "--workload", "allocs=1"]].concat())).contains("--workload"));
    assert!(
        err(&zonal(&dir, &[&p[..], &["--handle", "987654", "vmstat"]].concat())).contains("no published handle 987654")
    );
    assert!(err(&zonal(&dir, &["--pid", "1", "vmstat"])).contains("process 1 has no published handle"));
    for page in pages {
        z.free_pages(page.as_ptr(), 0).unwrap();
    }
    drop(z);
    assert!(ok(&zonal(&dir, &["ps"])).starts_with("no published handles"));
    let nowhere = dir.join("nonexistent");
    let o = ok(&zonal(&nowhere, &["ps"]));
    assert!(o.starts_with("no published handles") && o.contains("does not exist"), "{o}");
    let e = err(&zonal(&dir, &["--pid", &dead_pid().to_string(), "top"]));
    assert!(e.contains("no process") && !e.contains("has no published handle"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sysctl_with_pid_tunes_the_running_process() {
    let dir = test_dir("sysctl");
    let z = published(&dir);
    let pid = std::process::id().to_string();
    let out = ok(&zonal(&dir, &["--pid", &pid, "sysctl", "min_free_kbytes=2048"]));
    assert_eq!(out, "min_free_kbytes = 2048\n");
    assert_eq!(z.sysctl_get("min_free_kbytes").unwrap(), "2048");
    assert!(
        err(&zonal(&dir, &["--pid", &pid, "sysctl", "watermark_scale_factor=0"])).contains("watermark_scale_factor")
    );
    assert!(err(&zonal(&dir, &["--pid", &pid, "sysctl", "nosuch"])).contains("unknown tunable `nosuch`"));
    let all: serde_json::Value =
        serde_json::from_str(&ok(&zonal(&dir, &["--pid", &pid, "sysctl", "-a", "--json"]))).unwrap();
    assert_eq!(all["min_free_kbytes"], 2048, "numbers are JSON numbers: {all}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn top_shows_each_node_and_its_rates() {
    let dir = test_dir("top");
    let z = published(&dir);
    let pid = std::process::id().to_string();
    let out = ok(&zonal(&dir, &["--pid", &pid, "top", "--count", "2", "--interval", "0.1"]));
    let frames: Vec<&str> = out.split("zonal top:").filter(|f| !f.trim().is_empty()).collect();
    assert_eq!(frames.len(), 2, "{out}");
    for f in &frames {
        for node in ["0", "1"] {
            assert!(f.lines().any(|l| l.split_whitespace().next() == Some(node)), "node {node} in {f}");
        }
    }
    // The first frame has no rates yet; the second has them, as numbers.
    let row = |f: &str| {
        f.lines().find(|l| l.starts_with("0 ")).unwrap().split_whitespace().map(String::from).collect::<Vec<_>>()
    };
    assert_eq!(row(frames[0])[6], "-");
    assert!(row(frames[1])[6].parse::<f64>().is_ok(), "{}", frames[1]);
    assert!(frames[1].contains("all nodes: pgalloc/s"), "{}", frames[1]);
    assert!(err(&zonal(&dir, &["top"])).contains("--pid"));
    assert!(err(&zonal(&dir, &["--pid", &pid, "top", "--interval", "0"])).contains("--interval"));
    // --timeout: a bound in range is taken, one out of it refused with the range, and it
    // means nothing without a process to wait for.
    ok(&zonal(&dir, &["--pid", &pid, "vmstat", "--timeout", "0.5"]));
    ok(&zonal(&dir, &["ps", "--timeout", "3600"]));
    for (args, want) in [
        (&["--pid", &pid, "top", "--count", "1", "--timeout", "0"][..], "--timeout 0: give 0.1 to 3600 seconds"),
        (&["ps", "--timeout", "99999"][..], "--timeout 99999: give 0.1 to 3600 seconds"),
        (&["exporter", "--timeout", "0.01"][..], "--timeout 0.01: give 0.1 to 3600 seconds"),
        (&["vmstat", "--timeout", "1"][..], "--pid"),
    ] {
        let e = err(&zonal(&dir, args));
        assert!(e.contains(want), "{args:?}: {e}");
    }
    drop(z);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn top_marks_the_numa_columns_under_coarse_and_counts_pages_apart_from_allocations() {
    let dir = test_dir("top-coarse");
    let z = published(&dir);
    let pid = std::process::id().to_string();
    let column = |frame: &str, name: &str| {
        let mut lines = frame.lines().skip_while(|l| !l.starts_with("NODE"));
        let at = lines.next().unwrap().split_whitespace().position(|h| h == name).unwrap();
        lines.next().unwrap().split_whitespace().nth(at).unwrap().to_string()
    };
    for (mode, counted) in [("strict", true), ("coarse", false)] {
        z.sysctl_set("numa_stats_mode", mode).unwrap();
        let out = ok(&zonal(&dir, &["--pid", &pid, "top", "--count", "2", "--interval", "0.1"]));
        let second = out.rsplit("zonal top:").next().unwrap();
        assert!(second.contains(&format!("numa_stats_mode {mode}")), "{second}");
        for c in ["ALLOC/s", "FREE/s"] {
            assert!(column(second, c).parse::<f64>().is_ok(), "{c}: pages, in every mode: {second}");
        }
        let hits = column(second, "HIT/s");
        assert_eq!(hits.parse::<f64>().is_ok(), counted, "{mode}: {second}");
        assert_eq!(hits == "-", !counted, "{mode}: {second}");
        assert_eq!(second.contains("-: numa_stats_mode is coarse"), !counted, "{mode}: {second}");
    }
    drop(z);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_exporter_serves_every_handle_to_a_prometheus_scrape() {
    let dir = test_dir("exporter");
    let a = published(&dir);
    let b = published(&dir);
    let pages: Vec<_> = (0..5).map(|_| a.alloc_pages(Gfp::empty(), 0).unwrap()).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_zonal"))
        .arg("--dir")
        .arg(&dir)
        .args(["exporter", "--listen", "127.0.0.1:0", "--timeout", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let url =
        first.split_whitespace().find(|w| w.starts_with("http://")).unwrap_or_else(|| panic!("{first}")).to_string();
    let scrape = ureq::get(&url).call().and_then(|mut r| r.body_mut().read_to_string());
    let missing = ureq::get(url.replace("/metrics", "/nosuch")).call();
    let _ = child.kill();
    let _ = child.wait();
    let text = scrape.unwrap();
    assert!(matches!(missing, Err(ureq::Error::StatusCode(404))), "{missing:?}");
    let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let pid = std::process::id().to_string();
    let value = |name: &str, h: &Zonal| {
        let s = parsed
            .samples
            .iter()
            .find(|s| {
                s.metric == name
                    && s.labels.get("pid") == Some(&pid)
                    && s.labels.get("handle") == Some(&h.id().to_string())
            })
            .unwrap_or_else(|| panic!("{name} of handle {} in\n{text}", h.id()));
        match s.value {
            prometheus_parse::Value::Untyped(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Counter(v) => v,
            ref other => panic!("{name}: {other:?}"),
        }
    };
    assert_eq!(value("zonal_up", &a), 1.0);
    assert_eq!(value("zonal_up", &b), 1.0);
    assert_eq!(value("zonal_vmstat_pgalloc_normal", &a), a.vmstat_value("pgalloc_normal").unwrap() as f64);
    assert_eq!(value("zonal_vmstat_pgalloc_normal", &b), 0.0);
    // Each family once, with both handles' samples under it.
    assert_eq!(text.matches("# TYPE zonal_vmstat_pgalloc_normal ").count(), 1);
    let zone_free = parsed
        .samples
        .iter()
        .filter(|s| s.metric == "zonal_zoneinfo_managed_pages" && s.labels.get("pid") == Some(&pid))
        .count();
    assert_eq!(zone_free, 4, "two handles of two zones");
    for p in pages {
        a.free_pages(p.as_ptr(), 0).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Not a test of its own: the client of another uid that the test below runs this binary
/// as, with `ZONAL_TEST_RAW_SOCKET` set. Sends a request on a raw connection (no reader's
/// checks: the server's own check is what is tested) and prints the reply.
#[test]
fn child_raw_client() {
    let Some(sock) = std::env::var_os("ZONAL_TEST_RAW_SOCKET") else { return };
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(b"vmstat\n");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    println!("reply: {reply}");
}

#[test]
fn a_peer_of_another_uid_is_refused() {
    // Needs a uid to switch to: only root can.
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: the refusal of another uid is tested where the test can switch uid");
        return;
    }
    let dir = test_dir("uid");
    let z = published(&dir);
    let sock = z.published_path().unwrap();
    // Open the way so that only the server's own check stands between the peer and it.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    use std::os::unix::process::CommandExt;
    // The command as that user does not read root's directory at all.
    let o = Command::new(env!("CARGO_BIN_EXE_zonal"))
        .arg("--dir")
        .arg(&dir)
        .args(["--pid", &std::process::id().to_string(), "vmstat"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let e = err(&o);
    assert!(e.contains("belongs to uid 0") && e.contains(dir.to_str().unwrap()), "{e}");
    // A raw client of that uid reaches the server, which refuses it.
    let o = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "live::child_raw_client", "--nocapture", "--test-threads=1"])
        .env("ZONAL_TEST_RAW_SOCKET", &sock)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("reply: error permission denied") && out.contains("uid 65534"), "{out}");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let info: serde_json::Value =
        serde_json::from_str(&zonal::live::request(&sock, "info", Duration::from_secs(10)).unwrap()).unwrap();
    assert!(info["requests_refused"].as_u64().unwrap() >= 1, "{info}");
    // (This request is counted once answered.)
    assert_eq!(info["requests_served"], 0, "nothing was served to the refused peer: {info}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn top_shows_balancing_rates_once_regions_are_balanced() {
    let dir = test_dir("top-numab");
    let z = published(&dir);
    let cfg = zonal_numab::Config { scan_delay_ms: 3_600_000, ..Default::default() };
    let bal = zonal_numab::Balancer::new(z.clone(), cfg).unwrap();
    let pid = std::process::id().to_string();
    let out = ok(&zonal(&dir, &["--pid", &pid, "top", "--count", "2", "--interval", "0.1"]));
    let second = out.rsplit("zonal top:").next().unwrap();
    assert!(second.contains("balancing: hint faults/s 0  local/s 0  migrated/s 0"), "{second}");
    assert!(second.contains("PROMO/s"), "a balancer's per-node tiering counters, as columns: {second}");
    drop(bal);
    // Without a balancer the line is gone.
    let out = ok(&zonal(&dir, &["--pid", &pid, "top", "--count", "2", "--interval", "0.1"]));
    assert!(!out.contains("balancing:") && !out.contains("PROMO/s"), "{out}");
    drop(z);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A running balancer's tunables are the process's: `zonal --pid P sysctl` reads and sets
/// them (checked as the balancer checks them), lists them with zonal's, and says so when the
/// process runs no balancer; `top` shows each node's promotions and demotions.
#[test]
fn sysctl_with_pid_reaches_the_balancer_and_top_shows_tiering_per_node() {
    let dir = test_dir("sysctl-numab");
    let z = published(&dir);
    let pid = std::process::id().to_string();
    let p = ["--pid", pid.as_str(), "sysctl"];
    let sysctl = |args: &[&str]| zonal(&dir, &[&p[..], args].concat());
    let e = err(&sysctl(&["numa_balancing=2"]));
    assert!(e.contains("runs no NUMA balancing") && e.contains("numa_balancing"), "{e}");

    let cfg = zonal_numab::Config { scan_delay_ms: 3_600_000, ..Default::default() };
    let bal = zonal_numab::Balancer::new(z.clone(), cfg).unwrap();
    assert_eq!(ok(&sysctl(&["numa_balancing=2"])), "numa_balancing = 2\n");
    assert_eq!(bal.numa_balancing(), 2, "set in the process's balancer");
    assert_eq!(
        ok(&sysctl(&["numa_balancing_hot_threshold_ms=250", "demotion_enabled"])),
        "numa_balancing_hot_threshold_ms = 250\ndemotion_enabled = 0\n"
    );
    assert_eq!(bal.sysctl_get("numa_balancing_hot_threshold_ms").unwrap(), "250");
    let e = err(&sysctl(&["numa_balancing=4"]));
    assert!(e.contains("2 (memory tiering)") && e.contains("kept the old value"), "{e}");
    assert_eq!(bal.numa_balancing(), 2, "an invalid value changes nothing");
    let all: serde_json::Value = serde_json::from_str(&ok(&sysctl(&["-a", "--json"]))).unwrap();
    assert_eq!((all["numa_balancing"].as_u64(), all["min_free_kbytes"].is_number()), (Some(2), true), "{all}");

    let out = ok(&zonal(&dir, &["--pid", &pid, "top", "--count", "2", "--interval", "0.1"]));
    let second = out.rsplit("zonal top:").next().unwrap();
    let head = second.lines().find(|l| l.starts_with("NODE")).unwrap();
    assert!(
        head.ends_with("PROMO/s  DEMO/s") || head.split_whitespace().rev().take(2).eq(["DEMO/s", "PROMO/s"]),
        "{second}"
    );
    drop(bal);
    let e = err(&sysctl(&["numa_balancing"]));
    assert!(e.contains("runs no NUMA balancing"), "the balancer's tunables leave with it: {e}");
    drop(z);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- Issue 37: the commands as root, and a stopped process ----

/// A pid no process has: a child's, once it has been waited for.
fn dead_pid() -> i32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    pid
}

/// `zonal` with the default directory: no `--dir`, the runtime variables cleared and the
/// temporary directory at `tmp`, as `sudo` leaves root's environment.
fn zonal_fallback(tmp: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zonal"))
        .args(args)
        .env_remove("ZONAL_RUNTIME_DIR")
        .env_remove("XDG_RUNTIME_DIR")
        .env("TMPDIR", tmp)
        .output()
        .expect("zonal runs")
}

#[test]
fn as_root_ps_and_the_exporter_refuse_a_squatted_or_linked_fallback_and_delete_nothing() {
    // Runs as root, as the review did (`sudo zonal ps`); another user cannot make a
    // directory that someone else owns, and says so.
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: the squatted fallback is tested where the test can chown");
        return;
    }
    let tmp = test_dir("fallback");
    std::fs::create_dir(&tmp).unwrap();
    // Another user's directory with their files in it, named like stale sockets.
    let victim = tmp.join("victim");
    std::fs::create_dir(&victim).unwrap();
    let file = victim.join(format!("{}.1.sock", dead_pid()));
    std::fs::write(&file, b"theirs").unwrap();
    let sock = victim.join(format!("{}.2.sock", dead_pid()));
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    for p in [&victim, &file, &sock] {
        std::os::unix::fs::lchown(p, Some(65534), Some(65534)).unwrap();
    }
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o700)).unwrap();
    let fallback = tmp.join("zonal-0");
    // Squatted by a link to it (the old `ps` followed it and deleted both files), then by
    // the directory itself.
    std::os::unix::fs::symlink(&victim, &fallback).unwrap();
    let e = err(&zonal_fallback(&tmp, &["ps"]));
    assert!(e.contains(fallback.to_str().unwrap()) && e.contains("not a directory"), "{e}");
    let e = err(&zonal_fallback(&tmp, &["exporter", "--listen", "127.0.0.1:0"]));
    assert!(e.contains(fallback.to_str().unwrap()), "{e}");
    std::fs::remove_file(&fallback).unwrap();
    std::fs::rename(&victim, &fallback).unwrap();
    let e = err(&zonal_fallback(&tmp, &["ps"]));
    assert!(e.contains(fallback.to_str().unwrap()) && e.contains("belongs to uid 65534"), "{e}");
    assert!(e.contains("someone else made it"), "{e}");
    for f in [&file, &sock] {
        assert!(fallback.join(f.file_name().unwrap()).exists(), "{} is kept", f.display());
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Not a test of its own: the published process the test below stops, when it runs this
/// binary again with `ZONAL_TEST_PUBLISH_IN` set.
#[test]
fn child_publisher() {
    let Some(dir) = std::env::var_os("ZONAL_TEST_PUBLISH_IN") else { return };
    let z = published(Path::new(&dir));
    println!("published {}", z.published_path().unwrap().display());
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
}

/// A connect that does not wait: `false` when the server's queue is full.
fn connect_nowait(path: &Path, held: &mut Vec<std::os::fd::OwnedFd>) -> bool {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data, valid when zeroed.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket takes no pointers.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: `fd` is fresh and owned by nothing else.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is an initialised sockaddr_un of `len` bytes; `fd` is open.
    let r =
        unsafe { libc::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), (&addr as *const libc::sockaddr_un).cast(), len) };
    if r == 0 {
        held.push(fd);
        return true;
    }
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EAGAIN));
    false
}

/// This test binary again as `child_publisher`, publishing a handle in `dir`: the child (its
/// stdin kept open, which it waits on) and its socket.
fn spawn_publisher(dir: &std::path::Path) -> (std::process::Child, PathBuf) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "live::child_publisher", "--nocapture", "--test-threads=1"])
        .env("ZONAL_TEST_PUBLISH_IN", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = std::io::BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(Result::unwrap)
        .find_map(|l| l.split_once("published ").map(|(_, p)| PathBuf::from(p)))
        .expect("the child publishes");
    (child, sock)
}

#[test]
fn the_exporter_and_ps_answer_within_their_bound_while_a_published_process_is_stopped() {
    let dir = test_dir("stopped");
    let mine = published(&dir);
    let (mut child, child_sock) = spawn_publisher(&dir);
    let child_pid = child.id() as i32;
    let signal = |sig| {
        // SAFETY: kill takes no pointers; the child is ours and not yet waited for.
        assert_eq!(unsafe { libc::kill(child_pid, sig) }, 0);
    };
    let mut exporter = Command::new(env!("CARGO_BIN_EXE_zonal"))
        .arg("--dir")
        .arg(&dir)
        .args(["exporter", "--listen", "127.0.0.1:0", "--timeout", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(exporter.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let url =
        first.split_whitespace().find(|w| w.starts_with("http://")).unwrap_or_else(|| panic!("{first}")).to_string();
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(60))).build().into();
    let pid = std::process::id().to_string();
    let child_pid_s = child_pid.to_string();
    // The exporter asks the handles for 1 s (`--timeout`; 2 s by default); a scrape must
    // answer within that and a margin, whatever the stopped process does.
    let bound = Duration::from_secs(5);
    let scrape = || {
        let t = std::time::Instant::now();
        let text = agent.get(&url).call().and_then(|mut r| r.body_mut().read_to_string()).unwrap();
        assert!(t.elapsed() < bound, "the scrape took {:?}", t.elapsed());
        let up = |p: &str| {
            text.lines()
                .find(|l| l.starts_with("zonal_up{") && l.contains(&format!("pid=\"{p}\"")))
                .unwrap_or_else(|| panic!("zonal_up of {p} in\n{text}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_string()
        };
        (up(&pid), up(&child_pid_s))
    };
    assert_eq!(scrape(), ("1".into(), "1".into()));
    // Stopped: first with room in its queue, then with its queue full. The old exporter's
    // connect blocked for good on the second and wedged it.
    signal(libc::SIGSTOP);
    // kill only queues the signal: wait until the child has stopped.
    let mut status = 0;
    // SAFETY: `status` is valid for a write; the child is ours, not yet reaped.
    let r = unsafe { libc::waitpid(child_pid, &mut status, libc::WUNTRACED) };
    assert!(r == child_pid && libc::WIFSTOPPED(status), "waitpid: {r} {status:#x}");
    let mut held = Vec::new();
    for full in [false, true] {
        if full {
            while connect_nowait(&child_sock, &mut held) {
                assert!(held.len() < 10_000, "the queue never filled");
            }
        }
        assert_eq!(scrape(), ("1".into(), "0".into()), "the stopped handle is down, the other up (full {full})");
        let t = std::time::Instant::now();
        let ps = ok(&zonal(&dir, &["ps", "--timeout", "1"]));
        assert!(t.elapsed() < Duration::from_secs(5), "ps took {:?}", t.elapsed());
        let row = ps.lines().find(|l| l.starts_with(&child_pid_s)).unwrap_or_else(|| panic!("{ps}"));
        assert!(row.contains("(no answer"), "{ps}");
        assert!(ps.lines().any(|l| l.starts_with(&pid) && !l.contains("(no answer")), "{ps}");
    }
    drop(held);
    signal(libc::SIGCONT);
    let _ = child.kill();
    let _ = child.wait();
    let _ = exporter.kill();
    let _ = exporter.wait();
    drop(mine);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn zonal_publish_publishes_the_commands_handle_and_the_bench_refuses_it() {
    // A directory the publisher must refuse (a regular file) shows that the command tried to
    // publish into it; with ZONAL_PUBLISH=0 the same command never looks at it.
    let file = test_dir("publish-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let run = |v: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_zonal"))
            .arg("--dir")
            .arg(&file)
            .args(args)
            .env("ZONAL_PUBLISH", v)
            .output()
            .expect("zonal runs")
    };
    let e = err(&run("1", &["vmstat"]));
    assert!(e.contains("ZONAL_PUBLISH=1") && e.contains(&*file.to_string_lossy()), "{e}");
    ok(&run("0", &["vmstat"]));
    let e = err(&run("maybe", &["vmstat"]));
    assert!(e.contains("ZONAL_PUBLISH=`maybe`"), "{e}");
    let e = err(&run("1", &["bench", "numab"]));
    assert!(e.contains("publishes none"), "{e}");
    let _ = std::fs::remove_file(&file);

    // Into a good directory it publishes, and the socket goes when the command ends.
    let dir = test_dir("publish-cli");
    let o = Command::new(env!("CARGO_BIN_EXE_zonal"))
        .arg("--dir")
        .arg(&dir)
        .args(["vmstat", "--workload", "allocs=200"])
        .env("ZONAL_PUBLISH", "1")
        .output()
        .expect("zonal runs");
    ok(&o);
    assert!(dir.is_dir(), "the command made its socket directory");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "the socket is removed when the command ends: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- Issue 40: what a stopped process's reader is told ----

#[test]
fn top_and_vmstat_say_a_stopped_process_did_not_answer() {
    let dir = test_dir("stopped-readers");
    let (mut child, sock) = spawn_publisher(&dir);
    let pid = child.id() as i32;
    // SAFETY: kill takes no pointers; the child is ours and not yet waited for.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let mut status = 0;
    // SAFETY: `status` is valid for a write; the child is ours, not yet reaped.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
    assert!(r == pid && libc::WIFSTOPPED(status), "waitpid: {r} {status:#x}");
    // `--timeout` (5 s by default) bounds the wait, and the error names it.
    let want = format!("zonal: error: process {pid} did not answer within 1.5 s (stopped, or busy)");
    // Both commands at once: each waits out its 1.5 s.
    let readers = || {
        let pid = pid.to_string();
        let vmstat = ["--pid", &pid, "vmstat", "--timeout", "1.5"];
        let top = ["--pid", &pid, "top", "--count", "1", "--timeout", "1.5"];
        let runs: Vec<_> = [&vmstat[..], &top[..]]
            .into_iter()
            .map(|args| {
                let child = Command::new(env!("CARGO_BIN_EXE_zonal"))
                    .arg("--dir")
                    .arg(&dir)
                    .args(args)
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                (args, child)
            })
            .collect();
        for (args, run) in runs {
            let o = run.wait_with_output().unwrap();
            let e = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
            assert_eq!(e.trim_end(), want, "{args:?}");
        }
    };
    // With room in its queue the connection is taken by the kernel and no reply comes; with
    // the queue full the connection is never accepted. Either way, the same words.
    readers();
    let mut held = Vec::new();
    while connect_nowait(&sock, &mut held) {
        assert!(held.len() < 10_000, "the queue never filled");
    }
    readers();
    drop(held);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
