//! zonal's integration tests, one module per file, in one test binary: each binary links the
//! library and its dependencies again, so a cold `cargo test --workspace --release` builds a
//! few of them rather than one per file.
//!
//! The files that stay test binaries of their own (tests/*.rs beside this directory) need a
//! process of their own: each says why at its top. A test added here shares its process with
//! every other test of this binary, run two at a time on other threads: it must not fork, set
//! environment variables or signal handlers, change process-wide limits others depend on, or
//! count anything process-wide (mappings, RSS, handle ids) that another test would disturb.
//!
//! A file's tests are `<file>::<test>`: `cargo test -p zonal --test suite -- stress:: errors::`
//! runs two files' tests. A name filter matches anywhere in the name, so `model::` also
//! matches `proptest_model::` (add `--skip proptest_model::` for model.rs's alone).
//!
//! proptest keeps the failures it finds beside the binary's directory, in
//! tests/proptest-regressions/<file>.txt (its default for a source tree with a main.rs).

#[path = "../common/mod.rs"]
mod common;

mod arena;
mod c_abi;
mod design_map;
mod dlclose;
mod errors;
mod ffi_abi;
mod fuzz_regressions;
mod header;
mod hold;
mod housekeeping;
mod model;
mod numa_stats;
mod pcp_bulk;
mod proptest_model;
mod racing_free;
mod stress;
mod vcpu;
mod vmstat;
mod zlc;
