//! A real C program (tests/c/zonal_test.c) compiled with the system `cc` against
//! include/zonal.h, linked once against libzonal.so and once against libzonal.a, and run.

mod common;

use common::build_libs;
use std::path::Path;
use std::process::Command;

fn compile_and_run(libdir: &Path, statically: bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!(
        "zonal-c-test-{}-{}",
        std::process::id(),
        if statically { "static" } else { "shared" }
    ));
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(root.join("include"))
        .arg(root.join("tests/c/zonal_test.c"))
        .arg("-o")
        .arg(&out);
    if statically {
        cc.arg(libdir.join("libzonal.a"));
        // What `--print native-static-libs` lists for a Rust staticlib on Linux.
        cc.args(["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"]);
    } else {
        cc.arg("-L").arg(libdir).arg("-lzonal").arg(format!("-Wl,-rpath,{}", libdir.display()));
    }
    let st = cc.status().expect("the system C compiler `cc` runs");
    assert!(st.success(), "compiling tests/c/zonal_test.c failed");
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
