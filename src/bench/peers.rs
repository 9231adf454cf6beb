//! The subjects of `single`: every [`PageAlloc`] (zonal, the peers of `page_api`, the ideal
//! per-thread stack) as alloc + free pairs, plus the kernel as a page allocator (mmap, touch,
//! munmap), which has no place in the multi-threaded experiments.

use super::page_api::{Global, PageAlloc};
use super::{time_loop, Subject};
use std::hint::black_box;
use std::time::Duration;

/// A subject made of a name and a closure that performs one pair.
pub struct Pairs<F: FnMut()> {
    pub name: String,
    pub pair: F,
}

impl<F: FnMut()> Subject for Pairs<F> {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn run(&mut self, n: u64) -> Duration {
        time_loop(n, &mut self.pair)
    }
}

/// Boxes a pair closure as a subject.
pub fn pairs<'a>(name: &str, pair: impl FnMut() + 'a) -> Box<dyn Subject + 'a> {
    Box::new(Pairs { name: name.to_string(), pair })
}

/// One page allocated and freed right away, as a subject.
pub fn page_pairs<'a, A: PageAlloc + 'a>(a: A) -> Box<dyn Subject + 'a> {
    let name = a.name();
    pairs(&name, move || {
        let p = a.alloc();
        if !p.is_null() {
            a.free(black_box(p));
        }
    })
}

extern "C" {
    // tcmalloc's C entry point behind `MallocExtension::PerCpuCachesActive()`.
    fn MallocExtension_Internal_GetPerCpuCachesActive() -> bool;
}

/// Whether tcmalloc runs on its rseq per-CPU caches (it sets them up on first use).
pub fn tcmalloc_per_cpu() -> bool {
    let t = Global(tcmalloc_better::TCMalloc, String::new());
    // One allocation and free initialise tcmalloc.
    let p = t.alloc();
    if !p.is_null() {
        t.free(p);
    }
    // SAFETY: a query without arguments.
    unsafe { MallocExtension_Internal_GetPerCpuCachesActive() }
}

/// tcmalloc's subject name, saying which caches it uses.
pub fn tcmalloc_name() -> String {
    if tcmalloc_per_cpu() {
        "tcmalloc (rseq per-CPU)".into()
    } else {
        "tcmalloc (per-thread)".into()
    }
}

/// The kernel's subject name.
pub const KERNEL: &str = "kernel mmap+touch+munmap";

/// The kernel as page allocator: `mmap` a page, touch it (the fault allocates the frame),
/// `munmap` it (which frees the frame and flushes the TLB entry).
pub fn kernel() -> Box<dyn Subject> {
    pairs(KERNEL, || {
        // SAFETY: a fresh private anonymous mapping; written once, then unmapped; no reference
        // outlives the unmap.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p != libc::MAP_FAILED {
                std::ptr::write_volatile(p.cast::<u8>(), 1);
                libc::munmap(p, 4096);
            }
        }
    })
}
