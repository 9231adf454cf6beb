//! A real C program (tests/c/numab_test.c) compiled with the system `cc` against
//! include/zonal.h and include/zonal_numab.h, linked once against libzonal_numab.so (found
//! through its SONAME) and once against libzonal_numab.a, and run; include/zonal_numab.h
//! compiled as C89; the SONAME itself.
//!
//! A test binary of its own, not a module of tests/suite: numab_test.c checks that a page
//! moves right after an access from CPU 1, which fails when other threads keep that CPU busy
//! (see `SERIAL` below); alone in its binary, no other test's threads run beside it.

// The ELF reader of crates/zonal's tests (SONAME and NEEDED entries, no binutils needed).
#[path = "../../zonal/tests/common/elf.rs"]
mod elf;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The SONAME build.rs gives libzonal_numab.so.
const SONAME: &str = "libzonal_numab.so.0";

/// The tests of this file run one at a time: numab_test.c checks that a page moved right
/// after an access from CPU 1, which can fail when another process keeps that CPU busy
/// (seen with a busy loop pinned there), so the compiles of the other tests wait for it.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The link `make install` makes (README.md), made here in target/release: the loader looks
/// for the SONAME, so `libzonal_numab.so.0` is a link to `libzonal_numab.so` beside it.
fn soname_link(libdir: &Path) {
    let link = libdir.join(SONAME);
    match std::os::unix::fs::symlink("libzonal_numab.so", &link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => panic!("ln -s libzonal_numab.so {}: {e}", link.display()),
    }
    assert_eq!(
        std::fs::canonicalize(&link).unwrap(),
        std::fs::canonicalize(libdir.join("libzonal_numab.so")).unwrap(),
        "{} is not a link to libzonal_numab.so",
        link.display()
    );
}

/// Builds the crate's cdylib and staticlib in this test's target directory and profile
/// (cargo does not guarantee they are fresh for an integration test); returns their dir.
/// The whole workspace's libraries, as `cargo test --workspace` resolves their features, so
/// that this build finds them fresh instead of recompiling zonal (see zonal's `build_libs`).
fn build_libs() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>");
    let profile = profile_dir.file_name().expect("profile").to_string_lossy().into_owned();
    let target = profile_dir.parent().expect("<target>").to_path_buf();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--workspace", "--lib"]).env("CARGO_TARGET_DIR", &target);
    if profile == "release" {
        cmd.arg("--release");
    }
    assert!(cmd.status().expect("cargo runs").success(), "cargo build of libzonal_numab failed");
    let dir = target.join(&profile);
    assert!(dir.join("libzonal_numab.so").exists() && dir.join("libzonal_numab.a").exists(), "libraries in {dir:?}");
    dir
}

fn compile_and_run(libdir: &Path, statically: bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!(
        "zonal-numab-c-test-{}-{}",
        std::process::id(),
        if statically { "static" } else { "shared" }
    ));
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(root.join("include"))
        .arg(root.join("tests/c/numab_test.c"))
        .arg("-o")
        .arg(&out);
    if statically {
        cc.arg(libdir.join("libzonal_numab.a"));
        cc.args(["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"]);
    } else {
        soname_link(libdir);
        cc.arg("-L").arg(libdir).arg("-lzonal_numab").arg(format!("-Wl,-rpath,{}", libdir.display()));
    }
    assert!(cc.status().expect("the system C compiler `cc` runs").success(), "compiling numab_test.c failed");
    if !statically {
        let needed = elf::needed(&out).unwrap();
        assert!(needed.iter().any(|n| n == SONAME), "the C test needs {needed:?}, not {SONAME}");
    }
    let run = Command::new(&out).output().expect("the C test runs");
    let _ = std::fs::remove_file(&out);
    assert!(
        run.status.success(),
        "C test failed ({}):\n{}{}",
        if statically { "static" } else { "shared" },
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(String::from_utf8_lossy(&run.stdout).contains("checks passed"));
}

#[test]
fn c_program_against_shared_and_static_libraries() {
    let _serial = serial();
    let dir = build_libs();
    compile_and_run(&dir, false);
    compile_and_run(&dir, true);
}

/// libzonal_numab.so carries the SONAME libzonal_numab.so.0 (build.rs; zonal's own build.rs
/// link argument applies to libzonal.so only), read by the ELF reader and by `readelf -d`
/// where binutils is installed.
#[test]
fn the_shared_library_has_a_soname() {
    let _serial = serial();
    let so = build_libs().join("libzonal_numab.so");
    assert_eq!(elf::soname(&so).unwrap().as_deref(), Some(SONAME), "{}", so.display());
    if let Some(by_readelf) = elf::readelf_soname(&so) {
        assert_eq!(by_readelf.as_deref(), Some(SONAME), "readelf -d {}", so.display());
    }
}

/// include/zonal_numab.h, included first (it includes zonal.h), compiles as C89 with
/// -pedantic: cbindgen's C++ guards used `//` comments.
#[test]
fn the_header_is_c89() {
    let _serial = serial();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let obj = std::env::temp_dir().join(format!("zonal-numab-c89-{}.o", std::process::id()));
    let out = Command::new("cc")
        .args(["-std=c89", "-pedantic", "-Wall", "-Wextra", "-Werror", "-DZONAL_TEST_NUMAB_FIRST", "-c"])
        .arg("-I")
        .arg(root.join("include"))
        .arg(root.join("tests/c/header_c89.c"))
        .arg("-o")
        .arg(&obj)
        .output()
        .expect("the system C compiler `cc` runs");
    let _ = std::fs::remove_file(&obj);
    assert!(out.status.success(), "C89 compile of zonal_numab.h failed:\n{}", String::from_utf8_lossy(&out.stderr));
}
