//! The live commands end to end: this test process publishes a handle, and the `zonal`
//! command reads it (`ps`, `--pid` reports, `sysctl`, `top`), the exporter serves it over
//! HTTP to a real client, and a peer of another uid is refused.

mod common;
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
        .args(["exporter", "--listen", "127.0.0.1:0"])
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
    let o = Command::new(env!("CARGO_BIN_EXE_zonal"))
        .arg("--dir")
        .arg(&dir)
        .args(["--pid", &std::process::id().to_string(), "vmstat"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let e = err(&o);
    assert!(e.contains("permission denied") && e.contains("uid 65534"), "{e}");
    let info: serde_json::Value =
        serde_json::from_str(&zonal::live::request(&sock, "info", Duration::from_secs(10)).unwrap()).unwrap();
    // The client's liveness probe of the socket is refused too, before its request.
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
    drop(bal);
    // Without a balancer the line is gone.
    let out = ok(&zonal(&dir, &["--pid", &pid, "top", "--count", "2", "--interval", "0.1"]));
    assert!(!out.contains("balancing:"), "{out}");
    drop(z);
    let _ = std::fs::remove_dir_all(&dir);
}
