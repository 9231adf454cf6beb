//! A real C program (tests/c/numab_test.c) compiled with the system `cc` against
//! include/zonal.h and include/zonal_numab.h, linked once against libzonal_numab.so and once
//! against libzonal_numab.a, and run.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the crate's cdylib and staticlib in this test's target directory and profile
/// (cargo does not guarantee they are fresh for an integration test); returns their dir.
fn build_libs() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>");
    let profile = profile_dir.file_name().expect("profile").to_string_lossy().into_owned();
    let target = profile_dir.parent().expect("<target>").to_path_buf();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", "zonal-numab", "--lib"]).env("CARGO_TARGET_DIR", &target);
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
        cc.arg("-L").arg(libdir).arg("-lzonal_numab").arg(format!("-Wl,-rpath,{}", libdir.display()));
    }
    assert!(cc.status().expect("the system C compiler `cc` runs").success(), "compiling numab_test.c failed");
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
    let dir = build_libs();
    compile_and_run(&dir, false);
    compile_and_run(&dir, true);
}
