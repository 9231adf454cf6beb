//! Helpers the integration tests share (the suite binary includes this module as `common`,
//! tests/suite/main.rs, and its files use what they need).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `f` on a thread pinned to `cpu` (so the allocating CPU, and its node, are known).
pub fn on_cpu<R: Send>(cpu: u32, f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| {
        s.spawn(|| {
            zonal::cpu::set_affinity(cpu).unwrap();
            f()
        })
        .join()
        .unwrap()
    })
}

/// The target directory and profile this test was built in, from its own path
/// (`<target>/<profile>/deps/<test>-<hash>`).
fn target_and_profile() -> (PathBuf, String) {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>");
    let profile = profile_dir.file_name().expect("profile name").to_string_lossy().into_owned();
    (profile_dir.parent().expect("<target>").to_path_buf(), profile)
}

/// Builds the cdylib and staticlib of the crate (cargo does not guarantee they are fresh for
/// an integration test) and returns their directory.
///
/// The workspace's libraries, as `cargo test --workspace` resolves them: with `-p zonal`
/// alone the derive macros' dependencies had other features (those of the command's
/// macros), so this build recompiled zonal and the next `cargo test` recompiled it back.
/// Built as the tests were, it finds everything fresh and only links the files into place.
pub fn build_libs() -> PathBuf {
    let (target, profile) = target_and_profile();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--workspace", "--lib"]).env("CARGO_TARGET_DIR", &target);
    if profile == "release" {
        cmd.arg("--release");
    }
    assert!(cmd.status().expect("cargo runs").success(), "cargo build of libzonal failed");
    let dir = target.join(&profile);
    assert!(dir.join("libzonal.so").exists() && dir.join("libzonal.a").exists(), "libraries in {dir:?}");
    dir
}
