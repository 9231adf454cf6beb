//! zonal-numab's integration tests, one module per file, in one test binary: each binary
//! links the library and its dependencies again, so a cold `cargo test --workspace --release`
//! builds a few of them rather than one per file. (The header check, include/zonal_numab.h
//! against cbindgen's output, is in crates/zonal/tests/suite/header.rs, the one test binary
//! that links cbindgen.)
//!
//! The files that stay test binaries of their own (tests/*.rs beside this directory) need a
//! process of their own: each says why at its top. A test added here shares its process with
//! every other test of this binary, run two at a time on other threads: it must not fork, set
//! environment variables or signal handlers (the balancer's own SIGSEGV/SIGBUS handler, which
//! every test here installs alike, aside), or count anything process-wide (mappings, RSS)
//! that another test would disturb.
//!
//! A file's tests are `<file>::<test>`: `cargo test -p zonal-numab --test suite -- io::`.

#[path = "../common/mod.rs"]
mod common;

mod io;
mod model;
mod stress;
mod tiering;
mod windows;
