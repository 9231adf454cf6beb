//! The C libraries installed as README.md tells C users to: `make install` (the Makefile at
//! the root) into a temporary prefix, the README's C examples built with the flags
//! `pkg-config` gives and run, then `make uninstall`, which must leave the prefix as it was.
//! Also a staged install (`DESTDIR`, as package builds do) and the errors for bad
//! directories.
//!
//! Here and not in a library crate because the Makefile and the README belong to the
//! workspace: it installs both libraries, and the README's examples link each.
//!
//! `make`, `pkg-config`, `cc` and `ldd` are needed: a missing one fails the test with what
//! to install (.ci/run installs them); it never skips.

// The ELF reader of crates/zonal's C ABI tests: SONAME and NEEDED entries without binutils. (A
// path here is relative to this file's directory, tests/suite.)
#[allow(dead_code)]
#[path = "../../crates/zonal/tests/common/elf.rs"]
mod elf;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A directory of this test's own under the system's temporary directory, removed when the
/// test ends (also when it fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("zonal-install-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What to tell the user when a tool the test needs does not run.
fn missing(tool: &str, e: std::io::Error) -> ! {
    panic!(
        "`{tool}` does not run ({e}): the install test needs make, pkg-config, cc and ldd \
         (Debian: apt-get install make pkg-config gcc libc6-dev, ldd is glibc's; .ci/run installs them)"
    )
}

/// Runs `cmd`, failing with its output unless it succeeds; returns its stdout.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap_or_else(|e| panic!("{what}: stdout is not UTF-8: {e}"))
}

fn output(cmd: &mut Command) -> Output {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    cmd.output().unwrap_or_else(|e| missing(&tool, e))
}

/// The target directory this test was built in, from its own path
/// (`<target>/<profile>/deps/install-<hash>`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors().nth(3).expect("<target>/<profile>/deps/<test>").to_path_buf()
}

/// `make -C <root> <args>`, building with the cargo that runs the tests in this test's
/// target directory, where the build is a no-op once the libraries are built. (After a
/// `cargo test` build it is not: dev-dependencies turn on features of zonal's dependencies,
/// so cargo rebuilds the two libraries once, some 30 s.)
fn make(args: &[&str]) -> Command {
    let mut cmd = Command::new("make");
    cmd.arg("-C").arg(ROOT).args(args).arg(format!("CARGO={}", env!("CARGO")));
    cmd.arg(format!("CARGO_TARGET_DIR={}", target_dir().display()));
    // An outer make's flags (say -n) and directories set in the environment (make reads
    // every variable from it) must not change what this one does.
    cmd.env_remove("MAKEFLAGS").env_remove("MFLAGS").env_remove("MAKELEVEL");
    for var in ["PREFIX", "LIBDIR", "INCLUDEDIR", "PKGCONFIGDIR", "DESTDIR"] {
        cmd.env_remove(var).env_remove(var.to_lowercase());
    }
    cmd.env_remove("exec_prefix");
    cmd
}

/// The `version = "..."` of a crate's manifest: what the shared library's file name carries.
fn crate_version(manifest: &str) -> String {
    let text = std::fs::read_to_string(Path::new(ROOT).join(manifest)).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("version = \"").and_then(|v| v.strip_suffix('"')))
        .unwrap_or_else(|| panic!("no version line in {manifest}"))
        .to_string()
}

/// The files (and links) under `dir`, relative to it; directories are not listed.
fn files_under(dir: &Path) -> BTreeSet<String> {
    fn walk(base: &Path, dir: &Path, into: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                walk(base, &path, into);
            } else {
                into.insert(path.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut files = BTreeSet::new();
    walk(dir, dir, &mut files);
    files
}

/// What `make install` puts under the prefix, relative to it, with the default layout
/// (`lib`, `include`, `lib/pkgconfig`) or `libdir` in place of `lib`.
fn expected_files(libdir: &str) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    for (name, manifest) in [("zonal", "crates/zonal/Cargo.toml"), ("zonal_numab", "crates/numab/Cargo.toml")] {
        let version = crate_version(manifest);
        for file in [
            format!("lib{name}.so.{version}"),
            format!("lib{name}.so.0"),
            format!("lib{name}.so"),
            format!("lib{name}.a"),
        ] {
            files.insert(format!("{libdir}/{file}"));
        }
        files.insert(format!("{libdir}/pkgconfig/{name}.pc"));
        files.insert(format!("include/{name}.h"));
    }
    files
}

/// Files of other software that were in the prefix before the install: uninstall must leave
/// them.
const BYSTANDERS: [&str; 3] = ["lib/libother.so.1", "lib/pkgconfig/other.pc", "include/other.h"];

/// The README's fenced blocks of one language, in order.
fn readme_blocks(lang: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(tag)) if tag.trim() == lang => current = Some(String::new()),
            (Some(_), Some("")) => blocks.push(current.take().unwrap()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "README.md: a ```{lang} block is not closed");
    blocks
}

/// The README's C examples: (pkg-config module, source). The one that creates a balancer
/// links `zonal_numab`, the other `zonal`.
fn readme_c_examples() -> Vec<(&'static str, String)> {
    let examples: Vec<_> = readme_blocks("c")
        .into_iter()
        .map(|src| (if src.contains("zonal_numab_create") { "zonal_numab" } else { "zonal" }, src))
        .collect();
    let modules: Vec<_> = examples.iter().map(|(m, _)| *m).collect();
    assert_eq!(modules, ["zonal", "zonal_numab"], "README.md's C examples, by the library they link");
    examples
}

/// The lines of the README's shell block that builds and runs a C program after
/// `make install PREFIX=$HOME/.local` and `export PKG_CONFIG_PATH=...`: the compile and the
/// run, which the test executes as they are written.
fn readme_build_and_run() -> String {
    let block = readme_blocks("sh")
        .into_iter()
        .find(|b| b.contains("pkg-config --cflags --libs zonal"))
        .expect("README.md: a ```sh block that builds app.c with `pkg-config --cflags --libs zonal`");
    let mut lines = block.lines();
    assert_eq!(lines.next(), Some("make install PREFIX=$HOME/.local"), "{block}");
    assert_eq!(lines.next(), Some("export PKG_CONFIG_PATH=$HOME/.local/lib/pkgconfig"), "{block}");
    let rest: Vec<_> = lines.collect();
    assert!(rest.first().is_some_and(|l| l.starts_with("cc app.c ")), "{block}");
    assert_eq!(rest.last(), Some(&"./app"), "{block}");
    rest.join("\n")
}

/// `pkg-config <args>` over the .pc files in `pcdir` only.
fn pkg_config(pcdir: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new("pkg-config");
    cmd.args(args).env("PKG_CONFIG_PATH", pcdir).env_remove("PKG_CONFIG_LIBDIR").env_remove("PKG_CONFIG_SYSROOT_DIR");
    run(&mut cmd, &format!("pkg-config {}", args.join(" "))).trim().to_string()
}

/// Checks what the program printed: README.md says what each line means.
fn check_output(module: &str, stdout: &str) {
    let has = |s: &str| assert!(stdout.contains(s), "the README's {module} example printed no {s:?}:\n{stdout}");
    if module == "zonal" {
        has("a frame of node 1\n");
        has("freed twice: double free: the block at pfn ");
        has("256 frames in one call\n");
        let local = stdout.lines().find_map(|l| l.strip_prefix("8 frames of node ")).unwrap_or("none");
        assert!(["0", "1"].contains(&local), "order 3 from the CPU's node, 0 or 1, not {local}:\n{stdout}");
        // /proc/buddyinfo's layout, one line per zone: orders 0 to max_order=10.
        for node in ["Node 0, zone   Normal", "Node 1, zone   Normal"] {
            let line = stdout.lines().find(|l| l.starts_with(node)).unwrap_or_else(|| panic!("no {node:?}:\n{stdout}"));
            assert_eq!(line.split_whitespace().count(), 4 + 11, "{line}");
        }
    } else {
        has("before the first touch: node -1\n");
        let node = stdout.lines().find_map(|l| l.strip_prefix("after the first touch: node ")).unwrap_or("none");
        assert!(["0", "1"].contains(&node), "the first touch gives a frame of node 0 or 1, not {node}:\n{stdout}");
        has("numa_pages_migrated ");
    }
}

/// Builds and runs one README example against the installed library, as the README says:
/// its own build-and-run lines with the prefix's pkg-config files, shared with an rpath;
/// then linked statically (`-l:lib<name>.a` in place of `-l<name>`, with `--static`).
fn build_and_run_example(prefix: &Path, module: &str, src: &str, work: &Path) {
    let pcdir = prefix.join("lib/pkgconfig");
    let app = work.join("app.c");
    std::fs::write(&app, src).unwrap();

    // Warnings are errors in the README's examples (the README's own line sets no flags).
    let cflags = pkg_config(&pcdir, &["--cflags", module]);
    let mut cc = Command::new("cc");
    cc.args(["-Wall", "-Wextra", "-Werror", "-c", "-o", "/dev/null"]).arg(&app).args(cflags.split_whitespace());
    run(&mut cc, &format!("compiling the README's {module} example with -Wall -Wextra -Werror"));

    // The README's lines, for zonal_numab with its module name.
    let script = readme_build_and_run()
        .replace("pkg-config --cflags --libs zonal", &format!("pkg-config --cflags --libs {module}"))
        .replace("pkg-config --variable=libdir zonal", &format!("pkg-config --variable=libdir {module}"));
    let mut sh = Command::new("sh");
    sh.args(["-eu", "-c", &script]).current_dir(work).env("PKG_CONFIG_PATH", &pcdir);
    // The rpath alone must find the library (cargo's test runner sets a search path of its
    // own, which holds target/release).
    sh.env_remove("LD_LIBRARY_PATH").env_remove("PKG_CONFIG_LIBDIR").env_remove("PKG_CONFIG_SYSROOT_DIR");
    let stdout = run(&mut sh, &format!("the README's build-and-run lines for its {module} example"));
    check_output(module, &stdout);

    // The program asks for the SONAME, and the loader finds it in the prefix.
    let exe = work.join("app");
    let soname = format!("lib{module}.so.0");
    let needed = elf::needed(&exe).unwrap();
    assert!(needed.contains(&soname), "the {module} example needs {needed:?}, not {soname}");
    // One of the two libraries, never both (zonal_numab carries zonal's ABI).
    assert_eq!(needed.iter().filter(|n| n.starts_with("libzonal")).count(), 1, "{needed:?}");
    let ldd = run(Command::new("ldd").arg(&exe).env_remove("LD_LIBRARY_PATH"), "ldd app");
    let found = format!("{soname} => {}", prefix.join("lib").join(&soname).display());
    assert!(ldd.contains(&found), "the loader should take {found}:\n{ldd}");

    // Statically: the archive and its Libs.private.
    let flags = pkg_config(&pcdir, &["--static", "--cflags", "--libs", module]);
    let shared = format!("-l{module}");
    assert!(flags.split_whitespace().any(|f| f == shared), "{flags}");
    let static_exe = work.join("app-static");
    let mut cc = Command::new("cc");
    cc.arg(&app).arg("-o").arg(&static_exe);
    cc.args(flags.split_whitespace().map(|f| if f == shared { format!("-l:lib{module}.a") } else { f.to_string() }));
    run(&mut cc, &format!("linking the README's {module} example with lib{module}.a"));
    let needed = elf::needed(&static_exe).unwrap();
    assert!(!needed.iter().any(|n| n.starts_with("libzonal")), "linked statically, yet it needs {needed:?}");
    let stdout = run(Command::new(&static_exe).env_remove("LD_LIBRARY_PATH"), &format!("the static {module} example"));
    check_output(module, &stdout);
}

#[test]
fn install_build_the_readme_examples_and_uninstall() {
    let prefix = TempDir::new("prefix");
    let work = TempDir::new("work");
    let prefix_str = prefix.0.to_str().expect("the temporary directory's path is UTF-8");
    for file in BYSTANDERS {
        let path = prefix.0.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "not zonal's\n").unwrap();
    }
    let bystanders: BTreeSet<String> = BYSTANDERS.iter().map(|s| s.to_string()).collect();

    run(&mut make(&["install", &format!("PREFIX={prefix_str}")]), "make install");

    let installed: BTreeSet<String> = files_under(&prefix.0).difference(&bystanders).cloned().collect();
    assert_eq!(installed, expected_files("lib"), "what make install put in {prefix_str}");

    let lib = prefix.0.join("lib");
    for (name, manifest) in [("zonal", "crates/zonal/Cargo.toml"), ("zonal_numab", "crates/numab/Cargo.toml")] {
        let version = crate_version(manifest);
        let file = format!("lib{name}.so.{version}");
        // The links name the file; the file's SONAME is the link the loader looks for.
        for link in [format!("lib{name}.so.0"), format!("lib{name}.so")] {
            assert_eq!(std::fs::read_link(lib.join(&link)).unwrap(), Path::new(&file), "{link}");
        }
        assert_eq!(elf::soname(&lib.join(&file)).unwrap(), Some(format!("lib{name}.so.0")), "{file}");
        let built = target_dir().join("release").join(format!("lib{name}.a"));
        assert_eq!(
            std::fs::read(lib.join(format!("lib{name}.a"))).unwrap(),
            std::fs::read(&built).unwrap(),
            "lib{name}.a"
        );
        let header = format!("include/{name}.h");
        assert_eq!(
            std::fs::read(prefix.0.join(&header)).unwrap(),
            std::fs::read(Path::new(ROOT).join(&header)).unwrap(),
            "{header}"
        );

        let pcdir = lib.join("pkgconfig");
        assert_eq!(pkg_config(&pcdir, &["--modversion", name]), version);
        assert_eq!(pkg_config(&pcdir, &["--variable=libdir", name]), lib.display().to_string());
        assert_eq!(
            pkg_config(&pcdir, &["--cflags", "--libs", name]),
            format!("-I{prefix_str}/include -L{prefix_str}/lib -l{name}")
        );
        // What `--print native-static-libs` gives for a Rust staticlib on Linux (Makefile).
        assert!(
            pkg_config(&pcdir, &["--static", "--libs", name]).ends_with("-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"),
            "{name}.pc's Libs.private"
        );
    }

    for (module, src) in readme_c_examples() {
        build_and_run_example(&prefix.0, module, &src, &work.0);
    }

    run(&mut make(&["uninstall", &format!("PREFIX={prefix_str}")]), "make uninstall");
    assert_eq!(files_under(&prefix.0), bystanders, "what make uninstall left in {prefix_str}");
}

/// `DESTDIR` stages the install (the files land under it, the .pc files name the prefix
/// without it), and `LIBDIR` moves the libraries and, with them, the .pc files.
#[test]
fn a_staged_install_names_the_prefix_and_uninstalls_cleanly() {
    let stage = TempDir::new("stage");
    let destdir = format!("DESTDIR={}", stage.0.to_str().unwrap());
    let vars = ["PREFIX=/opt/zonal", "LIBDIR=/opt/zonal/lib64", &destdir];
    run(&mut make(&[&["install"], &vars[..]].concat()), "make install DESTDIR=...");

    let under_prefix: BTreeSet<String> = expected_files("lib64").iter().map(|f| format!("opt/zonal/{f}")).collect();
    assert_eq!(files_under(&stage.0), under_prefix, "what a staged install wrote under DESTDIR");

    let pcdir = stage.0.join("opt/zonal/lib64/pkgconfig");
    for name in ["zonal", "zonal_numab"] {
        let pc = std::fs::read_to_string(pcdir.join(format!("{name}.pc"))).unwrap();
        assert!(pc.starts_with("prefix=/opt/zonal\nlibdir=${prefix}/lib64\nincludedir=${prefix}/include\n"), "{pc}");
        assert!(!pc.contains(stage.0.to_str().unwrap()), "the staging directory leaked into {name}.pc:\n{pc}");
        // One library per program: zonal_numab carries zonal's ABI, so it must not pull -lzonal.
        assert!(!pc.contains("Requires"), "{pc}");
        assert_eq!(pkg_config(&pcdir, &["--libs", name]), format!("-L/opt/zonal/lib64 -l{name}"));
    }

    run(&mut make(&[&["uninstall"], &vars[..]].concat()), "make uninstall DESTDIR=...");
    assert_eq!(files_under(&stage.0), BTreeSet::new(), "what a staged uninstall left under DESTDIR");
}

/// A prefix that is empty or relative would install into / or write .pc files compilers
/// cannot follow: refused with the variable named, before anything is built or written.
#[test]
fn bad_directories_are_refused_by_name() {
    for (args, named) in [
        (["install", "PREFIX="], "PREFIX must be an absolute directory, not ''"),
        (["install", "PREFIX=relative/dir"], "PREFIX must be an absolute directory, not 'relative/dir'"),
        (["uninstall", "INCLUDEDIR=inc"], "INCLUDEDIR must be an absolute directory, not 'inc'"),
    ] {
        let out = output(&mut make(&args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "make {args:?} should fail:\n{}", String::from_utf8_lossy(&out.stdout));
        assert!(stderr.contains(named), "make {args:?}: {stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("cargo"), "make {args:?} built before refusing");
    }
    // make runs in the root, where a relative directory would have gone.
    assert!(!Path::new(ROOT).join("relative").exists() && !Path::new(ROOT).join("inc").exists());
}
