//! `dlclose` of libzonal.so after the rseq fast path ran must be safe: a section leaves a
//! pointer to its descriptor (in the library) in the thread's rseq area, which the kernel
//! reads at every preemption. The library is linked `-z nodelete` (crates/zonal/build.rs),
//! so `dlclose` keeps it mapped. A C program dlopens it, allocates and frees order-0 frames,
//! destroys the handle, dlcloses, then is preempted many times and must exit 0.

use crate::common;

use std::process::Command;

const PROGRAM: &str = r#"
#include <dlfcn.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

typedef int (*create_fn)(const char *, void **);
typedef void (*destroy_fn)(void *);
typedef int (*alloc_fn)(const void *, uint32_t, uint32_t, void **);
typedef int (*free_fn)(const void *, void *, uint32_t);

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
    create_fn create = (create_fn)dlsym(lib, "zonal_create");
    destroy_fn destroy = (destroy_fn)dlsym(lib, "zonal_destroy");
    alloc_fn alloc = (alloc_fn)dlsym(lib, "zonal_alloc_pages");
    free_fn release = (free_fn)dlsym(lib, "zonal_free_pages");
    if (!create || !destroy || !alloc || !release) return 4;
    void *z = NULL;
    if (create("topology=nodes=1,size=8M", &z) != 0) return 5;
    for (int round = 0; round < 1000; round++) {
        void *p[16];
        for (int i = 0; i < 16; i++) if (alloc(z, 0, 0, &p[i]) != 0) return 6;
        for (int i = 0; i < 16; i++) if (release(z, p[i], 0) != 0) return 7;
    }
    destroy(z);
    if (dlclose(lib) != 0) return 8;
    /* Be preempted and rescheduled many times: with a dangling rseq_cs the kernel would
       fault on it (SIGSEGV) at the first one. */
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    volatile unsigned long spin = 0;
    do {
        for (int i = 0; i < 100000; i++) spin++;
        sched_yield();
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 300000000L);
    return 0;
}
"#;

#[test]
fn dlclose_after_the_rseq_path_ran_is_safe() {
    let so = common::build_libs().join("libzonal.so");
    // The flag itself, when binutils' readelf is there to show it.
    if let Ok(out) = Command::new("readelf").arg("-d").arg(&so).output() {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.lines().any(|l| l.contains("FLAGS_1") && l.contains("NODELETE")),
            "libzonal.so is not marked NODELETE:\n{text}"
        );
    }
    let dir = std::env::temp_dir().join(format!("zonal-dlclose-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("dlclose.c");
    let exe = dir.join("dlclose");
    std::fs::write(&src, PROGRAM).unwrap();
    let st = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .expect("the system C compiler `cc` runs");
    assert!(st.success(), "compiling the dlclose program failed");
    let run = Command::new(&exe).arg(&so).output().expect("the program runs");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        run.status.success(),
        "the program failed after dlclose ({:?}):\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
}
