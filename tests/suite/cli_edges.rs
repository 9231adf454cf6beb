//! The rough edges a new user found in the `zonal` command, each fixed: a closed pipe, the
//! words of errors, `sysctl`'s checks and JSON, `--workload`'s checks, buddyinfo's JSON.

use crate::common;
use common::{err, ok};
use std::io::Read;
use std::process::{Command, Output, Stdio};

fn zonal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zonal")).args(args).output().expect("zonal runs")
}

#[test]
fn a_reader_that_leaves_ends_the_command_quietly() {
    // A report far bigger than a pipe's buffer, whose reader takes one line and goes.
    for args in [&["--topology", "nodes=64,size=8M", "topology"][..], &["--topology", "nodes=64,size=8M", "zoneinfo"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_zonal"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 16];
        child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
        drop(child.stdout.take());
        let mut stderr = String::new();
        child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let status = child.wait().unwrap();
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
        // Ended by SIGPIPE, as `cat` would be, or done before the reader left: never a panic.
        use std::os::unix::process::ExitStatusExt;
        assert!(status.signal() == Some(libc::SIGPIPE) || status.success(), "{args:?}: {status:?}");
    }
}

#[test]
fn errors_say_what_is_wrong_in_words() {
    let e = err(&zonal(&["--topology", "/nonexistent/file", "topology"]));
    assert!(e.contains("topology file /nonexistent/file does not exist"), "{e}");
    let e = err(&zonal(&["--max-order", "16", "topology"]));
    assert!(e.contains("give an order from 0 to 15"), "{e}");
    assert!(!e.contains("..="), "{e}");
    let e = err(&zonal(&["--topology", "nodes=2,size=8M", "numastat", "--node", "2"]));
    assert!(e.contains("invalid node 2: the topology has nodes 0 to 1"), "{e}");
}

#[test]
fn sysctl_refuses_unknown_names_everywhere_and_speaks_json() {
    for args in [&["sysctl", "-a", "nosuch"][..], &["sysctl", "--doc", "nosuch"], &["sysctl", "nosuch"]] {
        assert!(err(&zonal(args)).contains("unknown tunable `nosuch`"), "{args:?}");
    }
    let doc = ok(&zonal(&["sysctl", "--doc"]));
    assert!(!doc.contains("Choice(") && !doc.contains("Range(") && !doc.contains("18446744073709551615"), "{doc}");
    assert!(doc.contains("numa_stats_mode (default auto, one of auto, strict, coarse"), "{doc}");
    assert!(!doc.contains("unit mode") && doc.contains("stat_interval (default 1000, 1 to 3600000, unit ms)"), "{doc}");
    let one: serde_json::Value =
        serde_json::from_str(&ok(&zonal(&["sysctl", "--doc", "--json", "stat_interval"]))).unwrap();
    assert_eq!(one.as_array().unwrap().len(), 1);
    assert_eq!(one[0]["default"], 1000);
    let all: serde_json::Value = serde_json::from_str(&ok(&zonal(&["sysctl", "-a", "--json"]))).unwrap();
    assert!(all["watermark_scale_factor"].is_u64(), "{all}");
    assert_eq!(all["numa_stats_mode"], "auto");
    let set: serde_json::Value =
        serde_json::from_str(&ok(&zonal(&["sysctl", "--json", "watermark_scale_factor=20"]))).unwrap();
    assert_eq!(set["watermark_scale_factor"], 20);
    let help = ok(&zonal(&["sysctl", "--help"]));
    assert!(help.contains("ends with the command"), "{help}");
}

#[test]
fn workload_specs_are_checked() {
    let e = err(&zonal(&["zoneinfo", "--workload", "allocs=10,policy=bind"]));
    assert!(e.contains("bind needs the nodes"), "{e}");
    let e = err(&zonal(&["zoneinfo", "--workload", "allocs=10,allocs=20"]));
    assert!(e.contains("`allocs` is given twice"), "{e}");
    let help = ok(&zonal(&["zoneinfo", "--help"]));
    assert!(help.contains("allocs=1000") && help.contains("interleave[=NODES]"), "{help}");
}

#[test]
fn buddyinfo_json_is_buddyinfo() {
    let v: serde_json::Value =
        serde_json::from_str(&ok(&zonal(&["--topology", "nodes=2,size=8M", "buddyinfo", "--json"]))).unwrap();
    let zones = v.as_array().unwrap();
    assert_eq!(zones.len(), 2);
    assert_eq!(zones[1]["node"], 1);
    // Two nodes of 8M: two free 4M blocks each.
    assert_eq!(zones[1]["free_blocks"][10], 2);
    assert!(zones[0].get("watermarks").is_none() && zones[0].get("pagesets").is_none(), "{v}");
}

#[test]
fn commands_of_every_handle_refuse_pid() {
    for cmd in ["ps", "exporter"] {
        let e = err(&zonal(&["--pid", "1", cmd]));
        assert!(e.contains("`ps` and `exporter` cover every published handle"), "{cmd}: {e}");
    }
}

#[test]
fn numastat_after_a_workload_says_why_auto_mode_reads_zero() {
    let auto = zonal(&["numastat", "--workload", "allocs=100"]);
    ok(&auto);
    let said = String::from_utf8_lossy(&auto.stderr);
    assert!(said.contains("numa_stats_mode is auto") && said.contains("numa_stats_mode=strict"), "{said}");
    let strict = zonal(&["--set", "numa_stats_mode=strict", "numastat", "--workload", "allocs=100"]);
    let counted = ok(&strict);
    assert!(!String::from_utf8_lossy(&strict.stderr).contains("numa_stats_mode is auto"));
    let hits: u64 = counted
        .lines()
        .find(|l| l.starts_with("numa_hit"))
        .map(|l| l.split_whitespace().skip(1).filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap();
    assert_eq!(hits, 100, "strict mode counts the workload: {counted}");
}

#[test]
fn each_command_lists_only_its_own_options() {
    let help = |cmd: &str| ok(&zonal(&[cmd, "--help"]));
    let bench = help("bench");
    assert!(!bench.contains("--pid") && !bench.contains("--dir") && !bench.contains("--handle"), "{bench}");
    assert!(bench.contains("--topology") && bench.contains("--reps"), "{bench}");
    let top = help("top");
    for local in ["--topology", "--max-order", "--populate", "--set", "--workload"] {
        assert!(!top.contains(local), "top --help shows {local}: {top}");
    }
    assert!(top.contains("--pid") && top.contains("--interval"), "{top}");
    for cmd in ["ps", "exporter"] {
        let h = help(cmd);
        assert!(!h.contains("--topology") && !h.contains("--pid") && h.contains("--dir"), "{cmd}: {h}");
    }
    for cmd in ["topology", "zoneinfo", "numastat", "vmstat", "buddyinfo", "sysctl"] {
        let h = help(cmd);
        assert!(h.contains("--topology") && h.contains("--pid") && h.contains("--dir"), "{cmd}: {h}");
    }
}

#[test]
fn the_command_list_is_one_short_line_each() {
    let help = ok(&zonal(&["--help"]));
    let commands: Vec<&str> =
        help.lines().skip_while(|l| *l != "Commands:").skip(1).take_while(|l| !l.trim().is_empty()).collect();
    assert!(commands.len() >= 10, "{help}");
    for line in commands {
        assert!(line.chars().count() <= 100, "{} columns: {line}", line.chars().count());
    }
    // The long text is still there, under the command's own --help.
    assert!(ok(&zonal(&["zoneinfo", "--help"])).contains("numa_stats_mode=strict"));
}

#[test]
fn options_before_the_command_name_still_work_where_they_apply() {
    let before = ok(&zonal(&["--topology", "nodes=3,size=8M", "--max-order=5", "topology", "--json"]));
    let after = ok(&zonal(&["topology", "--json", "--topology", "nodes=3,size=8M", "--max-order", "5"]));
    assert_eq!(before, after);
    let v: serde_json::Value = serde_json::from_str(&before).unwrap();
    assert_eq!(v["topology"]["nodes"].as_array().unwrap().len(), 3, "{v}");
    // An option of another command is a usage error that says where it applies, before or
    // after the name.
    for args in [&["--pid", "1", "bench"][..], &["bench", "--pid", "1"], &["--topology", "nodes=1,size=8M", "top"]] {
        let o = zonal(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.starts_with("zonal: error: --") && e.contains("does not apply to"), "{args:?}: {e}");
    }
}

#[test]
fn every_error_has_one_prefix_and_usage_errors_exit_2() {
    // clap's refusals of the command line, in zonal's style, with its exit status for them.
    for args in [&["nosuch"][..], &["bench", "--reps", "0"], &["zoneinfo", "--nosuch"], &["top"], &[]] {
        let o = zonal(args);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.starts_with("zonal: error: "), "{args:?}: {e}");
        assert!(!e.contains("\nerror:"), "{args:?}: {e}");
    }
    // zonal's own refusals, once the command line is parsed: exit 1.
    for args in [&["--topology", "nodes=2,colour=blue", "topology"][..], &["bench", "nosuch"]] {
        let o = zonal(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).starts_with("zonal: error: "), "{args:?}");
    }
    let help = ok(&zonal(&["--help"]));
    assert!(help.contains("Exit status: 0 on success; 2 when the command line cannot be parsed"), "{help}");
    // Help and the version are not errors.
    assert!(ok(&zonal(&["--version"])).starts_with("zonal "));
    assert!(ok(&zonal(&["bench", "-h"])).contains("Usage: zonal bench"));
}

#[test]
fn an_interrupted_bench_writes_the_experiments_that_finished_and_exits_130() {
    let json = std::env::temp_dir().join(format!("zonal-cli-edges-{}-interrupted.json", std::process::id()));
    let _ = std::fs::remove_file(&json);
    let mut child = Command::new(env!("CARGO_BIN_EXE_zonal"))
        // bulk's 150 repetitions (~8 s here, and as much slower as the machine is) are the
        // window the signal must land in after single's records appear: one repetition of it
        // always runs, and the run stops before the next.
        .args(["bench", "single", "bulk", "--reps", "150", "--cell-ms", "1", "--json"])
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read on a thread, so that the bench never waits on a full pipe.
    let mut stderr = child.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let records = |path: &std::path::Path| -> Vec<serde_json::Value> {
        // A file being written may not parse yet: that is "not yet".
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    };
    // The bench writes the file after each experiment: wait for single's records, bounded.
    let bound = std::time::Duration::from_secs(300);
    let start = std::time::Instant::now();
    while !records(&json).iter().any(|r| r["experiment"] == "single") {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the bench ended ({status}) before single's records appeared in {}", json.display());
        }
        assert!(start.elapsed() < bound, "single's records did not appear in {} within {bound:?}", json.display());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // SAFETY: kill takes no pointers; the child is ours and not yet waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    let said = said.join().unwrap();
    assert_eq!(status.code(), Some(130), "{said}");
    // Progress lines end in a carriage return, not a newline.
    let line =
        said.split(['\r', '\n']).find(|l| l.starts_with("zonal bench: interrupted (SIGINT) ")).unwrap_or_else(|| {
            panic!("the bench ran to its end before SIGINT arrived, or did not say it was interrupted: {said}")
        });
    assert!(line.contains("after experiment 1 of 2 (single)"), "{line}");
    let got = records(&json);
    assert!(said.contains(&format!("wrote {} records to", got.len())), "{said}");
    let single = got.iter().filter(|r| r["experiment"] == "single" && r["process"] == "main").count();
    assert!(single >= 7, "single's records, a subject each: {got:?}");
    // The experiment stopped unfinished is left out: what the file holds finished.
    assert!(line.contains("bulk was stopped unfinished"), "{line}");
    assert!(got.iter().all(|r| r["experiment"] == "single"), "{got:?}");
    let _ = std::fs::remove_file(&json);
}

#[test]
fn the_targets_are_named_by_what_they_measure_and_a_miss_says_what_it_means() {
    let report = ok(&zonal(&["bench", "modes", "--reps", "1", "--cell-ms", "1", "--quiet"]));
    assert!(report.contains("\nspeed and scaling targets in this run:\n"), "{report}");
    assert!(!report.to_lowercase().contains("issue"), "{report}");
    // The note follows the targets exactly when a verdict of the run says `not met`.
    let missed = report.lines().any(|l| l.ends_with(": not met") || l.ends_with(": not met)"));
    let note =
        report.lines().filter(|l| l.contains("a target not met: the targets were set on a 2-CPU x86-64")).count();
    assert_eq!(note, usize::from(missed), "{report}");
    if missed {
        let l = report.lines().find(|l| l.contains("a target not met:")).unwrap();
        assert!(l.contains("a finding to report") && l.contains("--json") && l.contains("not a build failure"), "{l}");
    }
}
