//! Links the C library (`libzonal.so`) with `-z nodelete` and the SONAME `libzonal.so.0`.
//!
//! Why `nodelete`: the order-0 fast paths run restartable sequences. A section stores a
//! pointer to its descriptor (in this library's read-only data) in the thread's rseq area
//! (`rseq_cs`), and the kernel reads that pointer at the thread's next preemption, signal or
//! migration. zonal does not clear it after a section (a store per section on the fast
//! path), and it could not clear it in other threads anyway: so `dlclose` must never unmap
//! the library, or the kernel would read a dangling descriptor pointer (the thread gets
//! SIGSEGV). `nodelete` makes `dlclose` keep the library mapped, as glibc does for itself.
//!
//! Why a SONAME: without one, a program linked with `-lzonal` records the file name it
//! happened to find, and nothing tells the loader which ABI it needs. `libzonal.so.0` names
//! the append-only C ABI of `include/zonal.h` (0 until a release breaks it), so the library
//! installs as distributions install any other (`libzonal.so.0`, with `libzonal.so` a link
//! to it for `-lzonal`); programs record `NEEDED libzonal.so.0` (tests/suite/c_abi.rs checks
//! both).
//!
//! Why `rustc-link-arg` for the SONAME and not `rustc-cdylib-link-arg`: cargo also passes a
//! package's cdylib link arguments to the cdylibs of the packages that depend on it
//! (rust-lang/cargo#9562), after their own, so `libzonal_numab.so` came out named
//! `libzonal.so.0`. `rustc-link-arg` stays in this package; it reaches the tests' and
//! examples' executables too, where the loader ignores a SONAME. (`nodelete` is meant for
//! `libzonal_numab.so` as well, which carries the same rseq sections.)

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
        println!("cargo:rustc-link-arg=-Wl,-soname,libzonal.so.0");
    }
}
