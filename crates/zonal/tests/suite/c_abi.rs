//! Real C programs against include/zonal.h, built with the system compilers: tests/c/zonal_test.c
//! linked once against libzonal.so (found by the loader through its SONAME, as after
//! README.md's `make install`) and once against libzonal.a, and run; the header compiled as
//! C89 and used from C++; and the SONAME itself.

// The ELF reader sits with the shared helpers (tests/common/elf.rs); crates/numab/tests/c_abi.rs
// includes it too. A path here is relative to this file's directory, tests/suite.
#[path = "../common/elf.rs"]
mod elf;

use crate::common::build_libs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The SONAME build.rs gives libzonal.so.
const SONAME: &str = "libzonal.so.0";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("zonal-{name}-{}", std::process::id()))
}

/// The link `make install` makes (README.md), made here in target/release: the loader looks
/// for the SONAME, so `libzonal.so.0` is a link to `libzonal.so` beside it.
fn soname_link(libdir: &Path) {
    let link = libdir.join(SONAME);
    match std::os::unix::fs::symlink("libzonal.so", &link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => panic!("ln -s libzonal.so {}: {e}", link.display()),
    }
    assert_eq!(
        std::fs::canonicalize(&link).unwrap(),
        std::fs::canonicalize(libdir.join("libzonal.so")).unwrap(),
        "{} is not a link to libzonal.so",
        link.display()
    );
}

/// Runs a compiler command, failing with its output.
fn compile(mut cmd: Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: the compiler does not run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a built program, failing with its output; returns its standard output.
fn run(exe: &Path, what: &str) -> String {
    let run = Command::new(exe).output().unwrap_or_else(|e| panic!("{what} does not run: {e}"));
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(run.status.success(), "{what} failed:\n{stdout}{}", String::from_utf8_lossy(&run.stderr));
    stdout
}

fn compile_and_run(libdir: &Path, statically: bool) {
    let out = temp_path(if statically { "c-test-static" } else { "c-test-shared" });
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join("tests/c/zonal_test.c"))
        .arg("-o")
        .arg(&out);
    if statically {
        cc.arg(libdir.join("libzonal.a"));
        // What `--print native-static-libs` lists for a Rust staticlib on Linux.
        cc.args(["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"]);
    } else {
        soname_link(libdir);
        cc.arg("-L").arg(libdir).arg("-lzonal").arg(format!("-Wl,-rpath,{}", libdir.display()));
    }
    compile(cc, "compiling tests/c/zonal_test.c");
    if !statically {
        // The program records the SONAME, not the file it was linked against.
        let needed = elf::needed(&out).unwrap();
        assert!(needed.iter().any(|n| n == SONAME), "the C test needs {needed:?}, not {SONAME}");
    }
    let stdout = run(&out, if statically { "the C test (static)" } else { "the C test (shared)" });
    let _ = std::fs::remove_file(&out);
    assert!(stdout.contains("checks passed"), "{stdout}");
}

#[test]
fn c_program_against_shared_and_static_libraries() {
    let dir = build_libs();
    compile_and_run(&dir, false);
    compile_and_run(&dir, true);
}

/// libzonal.so carries the SONAME libzonal.so.0 (build.rs), read from its dynamic section by
/// the test's own ELF reader and, where binutils is installed, by `readelf -d` as well.
#[test]
fn the_shared_library_has_a_soname() {
    let so = build_libs().join("libzonal.so");
    assert_eq!(elf::soname(&so).unwrap().as_deref(), Some(SONAME), "{}", so.display());
    if let Some(by_readelf) = elf::readelf_soname(&so) {
        assert_eq!(by_readelf.as_deref(), Some(SONAME), "readelf -d {}", so.display());
    }
}

/// The headers compile as C89 with -pedantic (cbindgen's C++ guards used `//` comments),
/// zonal.h including zonal_numab.h; and zonal.h works from C++: declarations inside
/// `extern "C"`, so a C++ program links against libzonal.so and runs.
#[test]
fn the_header_is_c89_and_cxx() {
    let obj = temp_path("c89.o");
    let mut cc = Command::new("cc");
    cc.args(["-std=c89", "-pedantic", "-Wall", "-Wextra", "-Werror", "-c"])
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join("tests/c/header_c89.c"))
        .arg("-o")
        .arg(&obj);
    compile(cc, "compiling tests/c/header_c89.c as C89");
    let _ = std::fs::remove_file(&obj);

    let dir = build_libs();
    soname_link(&dir);
    let exe = temp_path("cxx-test");
    let mut cxx = Command::new("c++");
    cxx.args(["-std=c++11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join("tests/c/header_cxx.cpp"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&dir)
        .arg("-lzonal")
        .arg(format!("-Wl,-rpath,{}", dir.display()));
    compile(cxx, "compiling tests/c/header_cxx.cpp");
    let stdout = run(&exe, "the C++ test");
    let _ = std::fs::remove_file(&exe);
    assert!(stdout.contains("zonal.h from C++: ok"), "{stdout}");
}
