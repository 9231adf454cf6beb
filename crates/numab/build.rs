//! Links the C library (`libzonal_numab.so`, which carries zonal and its rseq sections) with
//! `-z nodelete` and the SONAME `libzonal_numab.so.0`, as crates/zonal/build.rs does for
//! `libzonal.so` (which says why a SONAME; tests/c_abi.rs checks it).
//!
//! Why: the order-0 fast paths run restartable sequences. A section stores a pointer to its
//! descriptor (in this library's read-only data) in the thread's rseq area (`rseq_cs`), and
//! the kernel reads that pointer at the thread's next preemption, signal or migration. zonal
//! does not clear it after a section (a store per section on the fast path), and it could
//! not clear it in other threads anyway: so `dlclose` must never unmap the library, or the
//! kernel would read a dangling descriptor pointer (the thread gets SIGSEGV). `nodelete`
//! makes `dlclose` keep the library mapped, as glibc does for itself.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libzonal_numab.so.0");
    }
}
