//! The `zonal` command end to end: each subcommand's output, and one-line errors with a
//! non-zero exit for bad input.

use std::process::{Command, Output};

fn zonal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zonal")).args(args).output().expect("zonal runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

#[test]
fn topology_default_is_two_fake_nodes() {
    let o = zonal(&["topology"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.starts_with("fake topology, 2 node(s)"), "{s}");
    assert!(s.contains("node 0: 0 1") && s.contains("node 1: 1 0"), "{s}");
}

#[test]
fn topology_json_round_trips_its_spec() {
    let o = zonal(&["--topology", "nodes=3,size=8M,distance=10 20 30:20 10 20:30 20 10", "topology", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["topology"]["nodes"].as_array().unwrap().len(), 3);
    assert_eq!(v["zonelists"][0], serde_json::json!([0, 1, 2]));
    assert_eq!(v["zonelists"][2], serde_json::json!([2, 1, 0]));
    // The printed spec parses back to the same topology.
    let spec = v["spec"].as_str().unwrap();
    let again = zonal(&["--topology", spec, "topology", "--json"]);
    let w: serde_json::Value = serde_json::from_str(&stdout(&again)).unwrap();
    assert_eq!(v["topology"], w["topology"]);
}

#[test]
fn topology_from_a_file() {
    let path = std::env::temp_dir().join(format!("zonal-cli-{}.topo", std::process::id()));
    std::fs::write(&path, "nodes = 2\nsizes = 8M:16M\n").unwrap();
    let o = zonal(&["--topology", path.to_str().unwrap(), "topology"]);
    std::fs::remove_file(&path).unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("node 1 size: 16M"));
}

#[test]
fn buddyinfo_after_a_workload_shows_fragmentation() {
    let fresh = zonal(&["--topology", "nodes=2,size=8M", "buddyinfo"]);
    assert!(fresh.status.success());
    // Two nodes of 8M: two free 4M blocks each and nothing else.
    for l in stdout(&fresh).lines() {
        let counts: Vec<u64> = l.split_whitespace().skip(4).map(|c| c.parse().unwrap()).collect();
        assert_eq!(counts.len(), 11, "{l}");
        assert_eq!(counts[10], 2, "{l}");
        assert_eq!(counts[..10].iter().sum::<u64>(), 0, "{l}");
    }
    let o =
        zonal(&["--topology", "nodes=2,size=8M", "buddyinfo", "--workload", "allocs=500,orders=0-3,policy=interleave"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.starts_with("Node 0, zone   Normal "), "{s}");
    assert!(stderr(&o).contains("500 blocks allocated"), "{}", stderr(&o));
    // Interleave put blocks on both nodes: neither has both 4M blocks left.
    for l in s.lines() {
        let last: u64 = l.split_whitespace().last().unwrap().parse().unwrap();
        assert!(last < 2, "{l}");
    }
}

#[test]
fn zoneinfo_text_and_json() {
    let o = zonal(&["--topology", "nodes=1,size=16M", "zoneinfo", "--workload", "allocs=100,free=0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    // 100 frames allocated; the per-CPU lists hold a few more that the buddy lists do not
    // count (as in Linux), at most high + batch of them.
    let free: u64 = s.lines().find_map(|l| l.strip_prefix("  pages free")).unwrap().trim().parse().unwrap();
    assert!((3996 - 256..=3996).contains(&free), "{s}");
    assert!(s.contains("        managed  4096\n"), "{s}");
    let o = zonal(&["--topology", "nodes=1,size=16M", "zoneinfo", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v[0]["pages_free"], 4096);
    assert!(v[0]["min"].as_u64().unwrap() < v[0]["low"].as_u64().unwrap());
}

#[test]
fn bench_writes_json_records() {
    let path = std::env::temp_dir().join(format!("zonal-bench-{}.json", std::process::id()));
    let o = zonal(&["bench", "single", "--reps", "1", "--cell-ms", "1", "--quiet", "--json", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("× mimalloc"));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let recs = v.as_array().unwrap();
    let subjects: Vec<&str> = recs.iter().map(|r| r["subject"].as_str().unwrap()).collect();
    for want in
        ["zonal pcp", "zonal buddy only", "snmalloc", "mimalloc", "jemalloc", "glibc malloc", "ideal per-thread stack"]
    {
        assert!(subjects.contains(&want), "{want} missing from {subjects:?}");
    }
    let mi = recs.iter().find(|r| r["subject"] == "mimalloc").unwrap();
    assert_eq!(mi["ratio_to_reference"], 1.0);
    assert!(recs.iter().all(|r| r["ns_per_op"]["median"].as_f64().unwrap() > 0.0));
}

#[test]
fn bad_input_is_one_line_and_non_zero() {
    for args in [
        vec!["--topology", "nodes=2,colour=blue", "topology"],
        vec!["--topology", "nodes=2,distance=10 20:30 10", "zoneinfo"],
        vec!["--topology", "nodes=2,cpus=0:4096", "topology"],
        vec!["--topology", "nodes=2,size=100T", "topology"],
        vec!["buddyinfo", "--workload", "orders=0-12"],
        vec!["buddyinfo", "--workload", "policy=bind=7"],
        vec!["bench", "nosuch"],
        vec!["--max-order", "16", "topology"],
        vec!["buddyinfo", "--workload", "allocs=18446744073709551615"],
        vec!["buddyinfo", "--workload", "free=4294967296"],
    ] {
        let o = zonal(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let e = stderr(&o);
        assert!(e.starts_with("zonal: error: "), "{args:?}: {e}");
        assert_eq!(e.lines().count(), 1, "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{e}");
    }
}

#[test]
fn out_of_range_bench_options_are_refused_before_anything_runs() {
    for args in [["bench", "--reps", "0"], ["bench", "--reps", "18446744073709551615"], ["bench", "--cell-ms", "0"]] {
        let o = zonal(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let e = stderr(&o);
        assert!(e.contains("is not in 1..="), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{e}");
        assert!(stdout(&o).is_empty(), "{args:?} measured something");
    }
}

#[test]
fn help_explains_every_command() {
    let o = zonal(&["--help"]);
    let s = stdout(&o);
    for c in ["topology", "zoneinfo", "vmstat", "numastat", "buddyinfo", "bench", "--topology"] {
        assert!(s.contains(c), "{c} missing from --help");
    }
}

#[test]
fn sysctl_lists_sets_and_rejects() {
    let o = zonal(&["sysctl", "-a"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    for name in ["min_free_kbytes", "watermark_scale_factor", "percpu_pagelist_high_fraction", "stat_interval"] {
        assert!(s.contains(&format!("{name} = ")), "{name} missing: {s}");
    }
    let o = zonal(&["sysctl", "watermark_scale_factor=250"]);
    assert_eq!(stdout(&o), "watermark_scale_factor = 250\n");
    let o = zonal(&["sysctl", "watermark_scale_factor=0"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("valid: 1..=3000"), "{}", stderr(&o));
    let o = zonal(&["sysctl", "nosuch"]);
    assert!(stderr(&o).contains("unknown tunable `nosuch`"), "{}", stderr(&o));
    // --set applies before any command; the watermarks move.
    let plain = zonal(&["--topology", "nodes=1,size=64M", "zoneinfo", "--json"]);
    let wide = zonal(&["--topology", "nodes=1,size=64M", "--set", "watermark_scale_factor=1000", "zoneinfo", "--json"]);
    let a: serde_json::Value = serde_json::from_str(&stdout(&plain)).unwrap();
    let b: serde_json::Value = serde_json::from_str(&stdout(&wide)).unwrap();
    assert!(b[0]["low"].as_u64().unwrap() > a[0]["low"].as_u64().unwrap());
}

#[test]
fn sysctl_reads_the_environment() {
    let o = Command::new(env!("CARGO_BIN_EXE_zonal"))
        .args(["sysctl", "percpu_pagelist_high_fraction", "--json"])
        .env("ZONAL_PERCPU_PAGELIST_HIGH_FRACTION", "32")
        .output()
        .unwrap();
    assert_eq!(stdout(&o).trim(), r#"{"percpu_pagelist_high_fraction":32}"#);
    let o = Command::new(env!("CARGO_BIN_EXE_zonal"))
        .args(["sysctl", "-a"])
        .env("ZONAL_WATERMARK_SCALE_FACTOR", "5000")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("ZONAL_WATERMARK_SCALE_FACTOR"), "{}", stderr(&o));
}

#[test]
fn numastat_counts_a_workload_in_strict_mode_and_not_before_a_read_in_auto() {
    let args = ["--topology", "nodes=2,size=8M", "numastat", "--workload", "allocs=100,policy=interleave,free=0"];
    let auto = zonal(&args);
    assert!(auto.status.success(), "{}", stderr(&auto));
    let hits = |o: &Output| -> u64 {
        stdout(o)
            .lines()
            .find(|l| l.starts_with("numa_hit"))
            .unwrap()
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(hits(&auto), 0, "auto mode: nothing counted before the first read");
    let mut strict = vec!["--set", "numa_stats_mode=strict"];
    strict.extend(args);
    let o = zonal(&strict);
    assert_eq!(hits(&o), 100);
    let o = zonal(&["numastat", "--node", "0"]);
    assert!(stdout(&o).starts_with("numa_hit 0\nnuma_miss 0\n"), "{}", stdout(&o));
    let o = zonal(&["numastat", "--node", "5"]);
    assert!(!o.status.success());
    // One node as JSON: the nodeN/numastat names, counted like the table.
    let mut one = vec!["--set", "numa_stats_mode=strict"];
    one.extend(args);
    one.extend(["--node", "1", "--json"]);
    let o = zonal(&one);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["interleave_hit"], 50, "{v}");
    assert_eq!(v.as_object().unwrap().len(), 6);
}

#[test]
fn vmstat_text_json_and_prometheus_after_a_workload() {
    let strict = ["--set", "numa_stats_mode=strict", "vmstat", "--workload", "allocs=500,orders=0-2,free=40"];
    let o = zonal(&strict);
    assert!(o.status.success(), "{}", stderr(&o));
    let items = zonal::report::parse_name_values(&stdout(&o)).expect("name value lines");
    let get = |k: &str| items.iter().find(|(n, _)| n == k).map(|(_, v)| *v).unwrap();
    assert_eq!(items[0].0, "nr_free_pages");
    assert_eq!(get("numa_hit"), 500, "strict counts the workload");
    // pgalloc counts pages, numa_hit allocations: orders 0-2 take 1 to 4 pages each.
    assert!((500..=2000).contains(&get("pgalloc_normal")));
    assert_eq!(get("nr_free_pages") + get("nr_zone_pcp_pages") + get("nr_zone_allocated"), 2 * 16384);
    // auto: the workload runs before the first read, so the NUMA counters stay at zero.
    let auto = zonal(&["vmstat", "--workload", "allocs=500"]);
    let items = zonal::report::parse_name_values(&stdout(&auto)).unwrap();
    assert_eq!(items.iter().find(|(n, _)| n == "numa_hit").map(|(_, v)| *v), Some(0));
    let json = zonal(&["vmstat", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&json)).expect("JSON");
    assert_eq!(v["nr_free_pages"], 2 * 16384);
    let prom = zonal(&["vmstat", "--prometheus", "--workload", "allocs=10"]);
    let samples = zonal::report::parse_prometheus(&stdout(&prom)).expect("exposition");
    assert!(samples.iter().any(|(k, v)| k == "zonal_vmstat_pgalloc_normal" && *v == 10.0), "{samples:?}");
    assert!(samples.iter().any(|(k, _)| k == "zonal_zoneinfo_stat_threshold{node=\"1\",zone=\"Normal\",cpu=\"0\"}"));
    let both = zonal(&["vmstat", "--json", "--prometheus"]);
    assert!(!both.status.success());
}

#[test]
fn zoneinfo_shows_pagesets_and_thresholds() {
    let o = zonal(&["zoneinfo"]);
    let zones = zonal::report::parse_zoneinfo(&stdout(&o));
    assert_eq!(zones.len(), 2);
    for z in &zones {
        assert!(!z.pagesets.is_empty());
        // Two 64 MiB nodes: batch 3 and, on this machine's CPUs, 2 * fls(cpus) as the threshold.
        assert!(z.pagesets.iter().all(|p| p.3 == 3 && p.4 >= 2), "{:?}", z.pagesets);
        assert_eq!(z.get("nr_free_pages"), Some(16384));
    }
}

#[test]
fn bench_only_refuses_a_name_that_matches_no_subject() {
    let o = zonal(&["bench", "bulk", "--only", "nosuch", "--reps", "1", "--cell-ms", "1"]);
    assert!(!o.status.success(), "--only nosuch succeeded: {}", stdout(&o));
    let e = stderr(&o);
    assert!(e.starts_with("zonal: error: --only `nosuch` matches no subject; subjects of bulk: "), "{e}");
    for name in
        ["zonal bulk array", "ideal per-thread stack", "glibc malloc", "mimalloc, the reference, is always measured"]
    {
        assert!(e.contains(name), "`{name}` missing: {e}");
    }
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(stdout(&o).is_empty(), "a header was printed: {}", stdout(&o));
    // A name of single's that bulk lacks; and the reference alone.
    for only in ["kernel", "mimalloc"] {
        let o = zonal(&["bench", "bulk", "--only", only]);
        assert!(!o.status.success(), "--only {only} succeeded");
        assert!(stdout(&o).is_empty());
    }
}

#[test]
fn bench_json_dash_writes_the_records_to_stdout_and_the_report_to_stderr() {
    let o = zonal(&["bench", "cross", "--only", "zonal", "--reps", "1", "--cell-ms", "1", "--quiet", "--json", "-"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!std::path::Path::new("-").exists(), "a file named - was written");
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("stdout is the JSON alone");
    let recs = v.as_array().unwrap();
    let subjects: Vec<&str> = recs.iter().map(|r| r["subject"].as_str().unwrap()).collect();
    assert_eq!(subjects, ["zonal pcp", "mimalloc"]);
    assert!(recs.iter().all(|r| r["process"] == "main"), "{v}");
    let e = stderr(&o);
    assert!(e.contains("cross: one thread allocates") && e.contains("× mimalloc"), "the table is not on stderr: {e}");
    assert!(e.contains("wrote 2 records to stdout"), "{e}");
}

#[test]
fn bench_json_to_a_path_that_cannot_be_written_fails_before_the_run() {
    for (path, want) in [("/missing/dir/x.json", "/missing/dir is not a directory"), ("/", "cannot write it")] {
        let o = zonal(&["bench", "single", "--reps", "1", "--cell-ms", "1", "--json", path]);
        assert!(!o.status.success(), "{path} succeeded");
        let e = stderr(&o);
        assert!(e.starts_with("zonal: error: ") && e.contains(want), "{path}: {e}");
        assert_eq!(e.lines().count(), 1, "{path}: {e}");
        assert!(stdout(&o).is_empty(), "{path}: measured: {}", stdout(&o));
    }
}

/// A fresh path in the temp directory for one test.
fn temp_path(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("zonal-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    let _ = std::fs::remove_file(&p);
    p
}

/// The child's records are marked as its own, and it runs each experiment in lockstep with
/// the main process's run of it (this machine's phases last seconds; the targets compare the
/// two), its tables after the main process's.
#[test]
fn bench_marks_the_records_of_the_tcmalloc_child() {
    let path = temp_path("child.json");
    let o = zonal(&["bench", "single", "cross", "--reps", "1", "--cell-ms", "1", "--json", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let recs = v.as_array().unwrap();
    let of = |process: &str| -> Vec<&str> {
        recs.iter().filter(|r| r["process"] == process).map(|r| r["subject"].as_str().unwrap()).collect()
    };
    let (main, child) = (of("main"), of("tcmalloc-child"));
    // The history's runs alone (two experiments ran) are the third kind of record.
    assert_eq!(main.len() + child.len() + of("alone").len(), recs.len(), "a record without its process: {v}");
    assert!(main.contains(&"zonal pcp") && main.contains(&"mimalloc"), "{main:?}");
    let e = stderr(&o);
    let out = stdout(&o);
    if out.contains("again in a child process") {
        // Its own mimalloc, told apart by the process, and tcmalloc on its per-CPU caches, at
        // order 0 and then at orders 1, 3 and 9; then cross.
        assert_eq!(child, ["tcmalloc (rseq per-CPU)", "mimalloc"].repeat(5));
        let orders: Vec<u64> = recs
            .iter()
            .filter(|r| r["process"] == "tcmalloc-child")
            .filter_map(|r| r["params"]["order"].as_u64())
            .collect();
        assert_eq!(orders, [0, 0, 1, 1, 3, 3, 9, 9, 0, 0]);
        for step in ["experiment 1 of 2, single", "experiment 2 of 2, cross"] {
            assert!(e.contains(&format!("{step}: repetition 1/1, each followed by the tcmalloc child's")), "{e}");
        }
        assert!(!e.contains("(tcmalloc child)"), "the child's own progress is not shown: {e}");
        let tables = ["single again in a child process", "cross: one thread", "cross again in a child process"];
        let at: Vec<usize> = tables.iter().map(|s| out.find(s).unwrap_or_else(|| panic!("{s}: {out}"))).collect();
        assert!(at.is_sorted(), "the child's tables after the main process's of each experiment: {out}");
        // The child's file is the parent's business: one "wrote" line, the parent's.
        assert_eq!(e.matches("wrote ").count(), 1, "{e}");
    } else {
        assert!(child.is_empty(), "{child:?}");
        assert!(e.contains("experiment 1 of 2, single") && e.contains("experiment 2 of 2, cross"), "{e}");
    }
}

#[test]
fn bench_of_several_experiments_runs_each_again_alone_for_the_history_target() {
    let path = temp_path("history.json");
    let args = ["bench", "single", "cross", "--only", "zonal", "--reps", "1", "--cell-ms", "1", "--json"];
    let o = zonal(&[&args[..], &[path.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let alone: Vec<(&str, &str)> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["process"] == "alone")
        .map(|r| (r["experiment"].as_str().unwrap(), r["subject"].as_str().unwrap()))
        .collect();
    for cell in [("single", "zonal pcp"), ("single", "mimalloc"), ("cross", "zonal pcp"), ("cross", "mimalloc")] {
        assert!(alone.contains(&cell), "{cell:?} run alone: {alone:?}");
    }
    let s = stdout(&o);
    for e in ["single", "cross"] {
        let line = s.lines().find(|l| l.starts_with(&format!("    {e}: median of "))).expect("a history line");
        assert!(line.ends_with(": met") || line.ends_with(": not met"), "{line}");
    }
    // The runs alone say which one runs, and nothing else (one "wrote" line, the parent's).
    let e = stderr(&o);
    assert!(e.contains("history: single alone") && e.contains("history: cross alone"), "{e}");
    assert_eq!(e.matches("wrote ").count(), 1, "{e}");
}

#[test]
fn bench_report_defines_its_terms_numbers_its_experiments_and_judges_its_targets() {
    let o = zonal(&["bench", "bulk", "modes", "--only", "zonal", "--reps", "1", "--cell-ms", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    let glossary = s.lines().find(|l| l.starts_with("seed 000-004: ")).expect("the glossary line");
    assert!(glossary.contains("Linux patches") && glossary.contains("prototype-kernel"), "{glossary}");
    // Before the first table.
    assert!(s.find("seed 000-004: ").unwrap() < s.find("bulk: N order-0").unwrap(), "{s}");
    let target = s.lines().find(|l| l.starts_with("target: strict over coarse")).expect("modes' target");
    assert!(target.ends_with(": met)") || target.ends_with(": not met)"), "{target}");
    // Progress, each experiment of the two numbered.
    let e = stderr(&o);
    assert!(e.contains("experiment 1 of 2, bulk: repetition 1/1"), "{e}");
    assert!(e.contains("experiment 2 of 2, modes: repetition 1/1"), "{e}");
}

#[test]
fn bench_plot_writes_a_well_formed_svg_with_every_series() {
    let dir = temp_path("plot");
    let o = zonal(&[
        "bench",
        "bulk",
        "--only",
        "zonal",
        "--reps",
        "1",
        "--cell-ms",
        "1",
        "--quiet",
        "--plot",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let svg_path = dir.join("bulk.svg");
    // The path written is printed, and nothing but bulk ran, so nothing else was written.
    assert!(stderr(&o).contains(&format!("wrote {}", svg_path.display())), "{}", stderr(&o));
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files, ["bulk.svg"]);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<&str> =
        doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).map(str::trim).collect();
    // Every series the table has (--only zonal keeps zonal's three and the reference), with
    // a line each.
    for label in ["zonal bulk array", "zonal bulk list", "zonal single", "mimalloc"] {
        assert!(texts.contains(&label), "legend `{label}` missing from {texts:?}");
    }
    assert!(!texts.contains(&"jemalloc"), "--only dropped jemalloc, the plot has it: {texts:?}");
    let lines = doc.descendants().filter(|n| n.has_tag_name("polyline")).count();
    assert!(lines >= 4, "{lines} polylines");
}

#[test]
fn bench_plot_to_a_directory_that_cannot_be_made_fails_before_the_run() {
    let file = temp_path("plot-file");
    std::fs::write(&file, "").unwrap();
    for (dir, want) in
        [("/nonexistent/dir/x", "cannot create the directory"), (file.to_str().unwrap(), "not a directory")]
    {
        let t = std::time::Instant::now();
        let o = zonal(&["bench", "single", "--reps", "1", "--cell-ms", "1", "--plot", dir]);
        assert!(!o.status.success(), "{dir} succeeded");
        let e = stderr(&o);
        assert!(e.starts_with("zonal: error: --plot ") && e.contains(want), "{dir}: {e}");
        assert_eq!(e.lines().count(), 1, "{dir}: {e}");
        // Before the run: no table, and quickly.
        assert!(stdout(&o).is_empty(), "{dir}: measured: {}", stdout(&o));
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "{dir} took {:?}", t.elapsed());
    }
    assert!(!std::path::Path::new("/nonexistent").exists(), "--plot made a tree of directories");
    std::fs::remove_file(&file).unwrap();
}

/// CPUs this process may run on, as the bench counts them for its thread counts.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The line of `s` that starts with `start`.
fn line_of<'a>(s: &'a str, start: &str) -> &'a str {
    s.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no line starting `{start}`: {s}"))
}

/// Issue 38's mixed traffic: a row per thread count (1, 2), every subject a column, its own
/// target line, and the targets at the end of the report, each judged.
#[test]
fn bench_mixed_prints_its_rows_and_judges_its_targets() {
    let o = zonal(&["bench", "mixed", "--reps", "1", "--cell-ms", "20", "--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    let header = line_of(&s, "mixed: every CPU on one zone; T threads each keeping 4096 order-0 frames");
    assert!(header.contains("× mimalloc"), "{header}");
    // The first column is as wide as its longest label ("2, to itself" where T = 2 ran).
    let columns =
        s.lines().find(|l| l.starts_with("T ") && l.contains("  ideal per-thread stack")).expect("the header");
    for subject in ["zonal pcp one node", "snmalloc", "tcmalloc", "mimalloc", "jemalloc", "glibc malloc"] {
        assert!(columns.contains(subject), "`{subject}` missing: {columns}");
    }
    assert!(line_of(&s, "1 ").contains("(1.00×)"), "mimalloc, the reference, at 1.00×: {s}");
    let end = s.find("targets in this run:").expect("the targets at the end");
    let judged = |l: &str| l.ends_with(": met") || l.ends_with(": not met") || l.ends_with("not measured in this run");
    for t in
        ["  mixed traffic, T = 1, ≤ Google tcmalloc per-CPU: ", "  mixed traffic, one zone, per-thread rate at T = 2"]
    {
        let l = line_of(&s[end..], t);
        assert!(judged(l), "{l}");
    }
    if cpus() >= 2 {
        assert!(line_of(&s, "2 ").contains("M/s"), "{s}");
        let l = line_of(&s, "target: per-thread rate at T = 2 against T = 1 in the mixed pattern");
        assert!(l.ends_with(": met)") || l.ends_with(": not met)"), "{l}");
        // The controls: the ideal stack in the pattern, and zonal and the ideal stack handing
        // to themselves (a row of their own), so that no frame crosses CPUs.
        let controls = line_of(&s, "  controls in the same run: the ideal per-thread stack ");
        assert!(
            controls.contains("; handing to itself, no frame crossing CPUs: ideal per-thread stack "),
            "{controls}"
        );
        assert!(controls.contains(", zonal pcp one node ") && controls.ends_with('%'), "{controls}");
        assert!(line_of(&s, "2, to itself ").contains("M/s"), "{s}");
        let l = line_of(&s[end..], "  mixed traffic, one zone, per-thread rate at T = 2");
        assert!(l.contains(", zonal handing to itself ") && l.contains(", the ideal stack handing to itself "), "{l}");
    }
    if s.contains("mixed again in a child process") {
        // The child's per-CPU tcmalloc is in the table after the main one's, and the
        // comparison at the end is measured.
        let l = line_of(&s[end..], "  mixed traffic, T = 1, ≤ Google tcmalloc per-CPU: ");
        assert!(l.contains("zonal ") && l.contains("× its mimalloc"), "{l}");
        if cpus() >= 2 {
            // tcmalloc per-CPU's own rate at T = 2 beside zonal's and the ideal stack's.
            let l = line_of(&s[end..], "  mixed traffic, one zone, per-thread rate at T = 2");
            assert!(l.contains("; the ideal stack ") && l.contains(", tcmalloc per-CPU "), "{l}");
        }
    }
}

/// The experiments' names: mixed is one, named in the help and in the list an unknown name
/// gets; its subjects are `--only`'s to choose.
#[test]
fn bench_knows_mixed_and_still_refuses_an_unknown_experiment() {
    let o = zonal(&["bench", "nosuch", "--reps", "1"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.starts_with("zonal: error: unknown experiment `nosuch`; experiments: single ("), "{e}");
    assert!(e.contains("; mixed (every CPU on one zone"), "{e}");
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    let help = stdout(&zonal(&["bench", "--help"]));
    assert!(help.contains("mixed (every CPU on one zone"), "{help}");
    let o = zonal(&["bench", "mixed", "--only", "zonal pcp,nosuch", "--reps", "1", "--cell-ms", "1"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("--only `nosuch` matches no subject; subjects of mixed: ideal per-thread stack, zonal pcp one node")
    );
    // A kept subject: zonal's column and mimalloc's, no other peer, no child.
    let o = zonal(&["bench", "mixed", "--only", "zonal", "--reps", "1", "--cell-ms", "1", "--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let columns = line_of(&stdout(&o), "T  ").to_string();
    assert_eq!(
        columns.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect::<Vec<_>>(),
        ["T", "zonal pcp one node", "mimalloc"]
    );
}

/// Issue 38: parallel's one-node T = 2 row again, right after a cross phase on the same
/// handle, with its target judged beside the fresh handle's and the ideal stack as control.
#[test]
fn bench_parallel_measures_the_one_node_row_again_after_cross() {
    if cpus() < 2 {
        return;
    }
    let path = temp_path("after-cross.json");
    let args = ["bench", "parallel", "--only", "zonal pcp one node,ideal", "--reps", "1", "--cell-ms", "1", "--quiet"];
    let o = zonal(&[&args[..], &["--json", path.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    let row = line_of(&s, "2, after cross ");
    assert!(row.contains("M/s") && row.contains(" - "), "only the one-node column: {row}");
    for how in ["fresh handle: ", "right after a cross phase: "] {
        let l = line_of(&s, &format!("target: per-thread rate at T = 2 against T = 1, every CPU on one zone, {how}"));
        assert!(l.ends_with(": met)") || l.ends_with(": not met)"), "{l}");
    }
    assert!(line_of(&s, "  controls in the same run: ").contains("the ideal per-thread stack: "), "{s}");
    let end = s.find("targets in this run:").expect("the targets at the end");
    for t in [", fresh handle: ", " right after a cross phase: "] {
        let l = line_of(&s[end..], &format!("  parallel, one zone, per-thread rate at T = 2{t}"));
        assert!(l.contains("of T = 1 (≥ 90%); the ideal stack "), "{l}");
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let after: Vec<&serde_json::Value> =
        v.as_array().unwrap().iter().filter(|r| r["subject"] == "zonal pcp after cross (one node)").collect();
    assert_eq!(after.len(), 1, "{v}");
    assert_eq!(after[0]["params"]["threads"], 2);
}

/// The history's other order: with cross and parallel in the run, parallel runs again right
/// after cross in a fresh process, and its cells are compared with parallel alone.
#[test]
fn bench_history_runs_parallel_right_after_cross() {
    let path = temp_path("history-order.json");
    let args = ["bench", "parallel", "cross", "--only", "zonal pcp,ideal", "--reps", "1", "--cell-ms", "1", "--json"];
    let o = zonal(&[&args[..], &[path.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let of = |process: &str| -> Vec<&str> {
        v.as_array()
            .unwrap()
            .iter()
            .filter(|r| r["process"] == process)
            .map(|r| r["experiment"].as_str().unwrap())
            .collect()
    };
    assert!(of("after-cross").iter().all(|e| *e == "parallel") && !of("after-cross").is_empty(), "{v}");
    assert!(of("alone").contains(&"parallel") && of("alone").contains(&"cross"), "{v}");
    let s = stdout(&o);
    let l = line_of(&s, "    parallel right after cross (in a fresh process): median of ");
    assert!(l.ends_with(": met") || l.ends_with(": not met"), "{l}");
    let e = stderr(&o);
    assert!(e.contains("history: cross alone, then parallel right after it, in a fresh process"), "{e}");
    assert!(e.contains("history: parallel alone, in a fresh process"), "{e}");
}

/// Issue 38 §4: `bench scale` sweeps 2 to 1024 CPUs (virtual ones) over 1, 2 and 8 nodes,
/// prints a row per topology, the growth of each column and its targets, each judged, and a
/// record per topology and column.
#[test]
fn bench_scale_sweeps_virtual_cpus_and_judges_its_targets() {
    let o = zonal(&["bench", "scale", "--reps", "1", "--quiet", "--json", "-"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (s, v) = (stderr(&o), serde_json::from_str::<serde_json::Value>(&stdout(&o)).expect("stdout is the JSON"));
    line_of(&s, "scale (issue 38 §4): virtual CPUs (vcpus=N)");
    let header = line_of(&s, "cpus  nodes  metadata MiB");
    for column in ["pass ns", "vmstat µs", "zoneinfo µs", "drain µs", "below low ns", "refill ns", "pair ns"] {
        assert!(header.contains(column), "`{column}` missing: {header}");
    }
    for nodes in [1, 2, 8] {
        let row = s.lines().find(|l| l.split_whitespace().take(2).eq(["1024".to_string(), nodes.to_string()]));
        assert!(row.is_some(), "no row of 1024 CPUs on {nodes} nodes: {s}");
    }
    let growth = line_of(&s, "growth from ");
    assert!(growth.contains("the pass and the pair as medians of per-repetition ratios"), "{growth}");
    for target in [
        "metadata at 256 CPUs × 8 nodes of 4G:",
        "a housekeeping pass with nothing to do",
        "order-0 pair, the fast path",
    ] {
        let l = line_of(&s, &format!("  target: {target}"));
        assert!(l.ends_with(": met)") || l.ends_with(": not met)"), "{l}");
    }
    let recs = v.as_array().unwrap();
    assert!(recs.iter().all(|r| r["experiment"] == "scale" && r["process"] == "main"), "{v}");
    let of = |subject: &str| recs.iter().filter(|r| r["subject"] == subject).count();
    // A row per topology of at least the machine's CPUs: 15 on 2 CPUs, the 1024 rows anywhere.
    assert!(of("housekeeping pass") >= 3 && of("order-0 pair") == of("housekeeping pass"), "{v}");
    assert_eq!(of("metadata"), of("housekeeping pass"), "{v}");
    let target = recs.iter().find(|r| r["subject"] == "metadata target").expect("the target's record");
    assert_eq!((target["params"]["cpus"].as_u64(), target["params"]["nodes"].as_u64()), (Some(256), Some(8)));
    assert!(target["ns_per_op"]["median"].as_f64().unwrap() > 8.0, "{target}");
}
