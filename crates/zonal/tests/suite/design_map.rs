//! docs/DESIGN.md's map of the rooms stays current: every source file of the workspace is
//! named there by its path from the workspace root, and every path it names exists.
//!
//! Source files: every `*.rs` under `crates/*/src`, `crates/*/tests`, `crates/*/examples`,
//! `src/` and `fuzz/fuzz_targets`; the build scripts (`crates/*/build.rs`, `build.rs`); the C
//! sources under `tests/` (`*.rs`, `*.c`, `*.cpp`, `*.h`); `include/*.h`; every file in `.ci/`.
//! A new file needs a row in the map: `` | `path` | what it is for | ``.
//!
//! A path named in the document is a word (letters, digits, `_`, `.`, `/`, `-`) that starts
//! with one of the workspace's top-level directories (`crates/`, `src/`, `tests/`, `fuzz/`,
//! `include/`, `docs/`, `topologies/`, `.ci/`), a trailing full stop aside.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level directories whose paths the document may name.
const ROOTS: &[&str] = &["crates/", "src/", "tests/", "fuzz/", "include/", "docs/", "topologies/", ".ci/"];

fn workspace() -> PathBuf {
    // crates/zonal -> the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file under `dir` (recursively) whose name ends with one of `exts` (all files when
/// `exts` is empty), as paths relative to `root` with `/` separators.
fn files_under(root: &Path, dir: &str, exts: &[&str], out: &mut BTreeSet<String>) {
    let Ok(entries) = fs::read_dir(root.join(dir)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = format!("{dir}/{name}");
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            files_under(root, &rel, exts, out);
        } else if kind.is_file() && (exts.is_empty() || exts.iter().any(|e| name.ends_with(e))) {
            out.insert(rel);
        }
    }
}

/// The workspace's packages under `crates/`.
fn crates(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(root.join("crates"))
        .expect("crates/ is readable")
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| format!("crates/{}", e.file_name().to_string_lossy()))
        .collect();
    v.sort();
    v
}

/// Every source file the map must name.
fn sources(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for c in crates(root) {
        for sub in ["src", "tests", "examples"] {
            files_under(root, &format!("{c}/{sub}"), &[".rs"], &mut out);
        }
        if root.join(&c).join("build.rs").is_file() {
            out.insert(format!("{c}/build.rs"));
        }
    }
    if root.join("build.rs").is_file() {
        out.insert("build.rs".into());
    }
    files_under(root, "src", &[".rs"], &mut out);
    files_under(root, "fuzz/fuzz_targets", &[".rs"], &mut out);
    files_under(root, "tests", &[".rs", ".c", ".cpp", ".h"], &mut out);
    files_under(root, "include", &[".h"], &mut out);
    files_under(root, ".ci", &[], &mut out);
    out
}

/// The paths the document names: its words made of path characters that start with one of
/// [`ROOTS`].
fn named_paths(text: &str) -> BTreeSet<String> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-');
    text.split(|c: char| !path_char(c))
        .map(|w| w.trim_end_matches('.'))
        .filter(|w| ROOTS.iter().any(|r| w.starts_with(r)))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_source_file_is_in_the_design_map_and_every_named_path_exists() {
    let root = workspace();
    let text = fs::read_to_string(root.join("docs/DESIGN.md")).expect("docs/DESIGN.md is readable");
    let named = named_paths(&text);
    let sources = sources(&root);
    assert!(sources.contains("crates/zonal/src/lib.rs"), "the walk found no sources under {}", root.display());

    let missing: Vec<&String> = sources.iter().filter(|s| !named.contains(*s)).collect();
    let stale: Vec<&String> = named.iter().filter(|p| !root.join(p).exists()).collect();
    let mut problems = Vec::new();
    for s in &missing {
        problems.push(format!("{s}: a source file docs/DESIGN.md does not name (add a row to its map of the rooms)"));
    }
    for p in &stale {
        problems.push(format!("{p}: named in docs/DESIGN.md, but no such file or directory"));
    }
    assert!(problems.is_empty(), "docs/DESIGN.md's map is out of date:\n  {}", problems.join("\n  "));
}

#[test]
fn paths_are_read_as_whole_words() {
    let named = named_paths("see `crates/zonal/src/lib.rs`. And src/main.rs, not /proc/zoneinfo or mm/page_alloc.c");
    let want: BTreeSet<String> = ["crates/zonal/src/lib.rs", "src/main.rs"].iter().map(|s| s.to_string()).collect();
    assert_eq!(named, want);
}
