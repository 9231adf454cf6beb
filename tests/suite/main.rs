//! The `zonal` command's tests and the workspace's own checks, one module per file, in one
//! test binary: each binary links its dependencies again, so a cold
//! `cargo test --workspace --release` builds one here rather than one per file.
//!
//! A test here shares its process with every other test of this binary, run two at a time on
//! other threads: it must not fork, set environment variables or signal handlers, or count
//! anything process-wide that another test would disturb; what needs a process of its own
//! runs in a child (`Command`), as `live::child_publisher` and `live::child_raw_client` do,
//! named by their full test names.
//!
//! A file's tests are `<file>::<test>`: `cargo test --test suite -- cli_edges::`.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod cli_edges;
mod import_graph;
mod install;
mod live;
