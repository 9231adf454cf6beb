//! The peers zonal is measured against, each as a [`Subject`] doing 4 KiB, 4 KiB-aligned
//! alloc + free pairs through its real fast path: glibc malloc, mimalloc and jemalloc (as
//! values, never as this program's global allocator), the kernel as a page allocator (mmap,
//! touch, munmap), and an ideal per-thread stack of pre-allocated pages, the floor.

use super::{time_loop, Subject};
use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::time::Duration;

/// The block every peer allocates: one page, page-aligned.
pub const PAGE: Layout = match Layout::from_size_align(4096, 4096) {
    Ok(l) => l,
    Err(_) => panic!("4096/4096 is a valid layout"),
};

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

/// A `GlobalAlloc` used as a value: one alloc + dealloc of [`PAGE`].
#[inline(always)]
fn global_pair<A: GlobalAlloc>(a: &A) {
    // SAFETY: PAGE has non-zero size; the pointer is freed with the same allocator and
    // layout right away, and only if the allocation succeeded.
    unsafe {
        let p = a.alloc(PAGE);
        if !p.is_null() {
            a.dealloc(black_box(p), PAGE);
        }
    }
}

/// snmalloc, through `snmalloc-rs`'s `GlobalAlloc` value.
pub fn snmalloc() -> Box<dyn Subject> {
    pairs("snmalloc", || global_pair(&snmalloc_rs::SnMalloc))
}

/// Google's tcmalloc, through `tcmalloc-better`'s `GlobalAlloc` value; named after the cache
/// it runs on (rseq per-CPU caches, or per-thread caches when glibc holds the rseq area).
pub fn tcmalloc() -> Box<dyn Subject> {
    pairs(&tcmalloc_name(), || global_pair(&tcmalloc_better::TCMalloc))
}

extern "C" {
    // tcmalloc's C entry point behind `MallocExtension::PerCpuCachesActive()`.
    fn MallocExtension_Internal_GetPerCpuCachesActive() -> bool;
}

/// Whether tcmalloc runs on its rseq per-CPU caches (it sets them up on first use).
pub fn tcmalloc_per_cpu() -> bool {
    // SAFETY: one allocation and free to initialise tcmalloc, then a query without arguments.
    unsafe {
        global_pair(&tcmalloc_better::TCMalloc);
        MallocExtension_Internal_GetPerCpuCachesActive()
    }
}

/// tcmalloc's subject name, saying which caches it uses.
pub fn tcmalloc_name() -> String {
    if tcmalloc_per_cpu() {
        "tcmalloc (rseq per-CPU)".into()
    } else {
        "tcmalloc (per-thread)".into()
    }
}

/// glibc's `posix_memalign` + `free`.
pub fn glibc() -> Box<dyn Subject> {
    pairs("glibc malloc", || {
        let mut p: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: 4096 is a power-of-two multiple of sizeof(void*); `p` is freed right after
        // and only when the call succeeded.
        unsafe {
            if libc::posix_memalign(&mut p, 4096, 4096) == 0 {
                libc::free(black_box(p));
            }
        }
    })
}

/// mimalloc, through its `GlobalAlloc` value (its aligned path for 4 KiB alignment).
pub fn mimalloc() -> Box<dyn Subject> {
    pairs("mimalloc", || global_pair(&mimalloc::MiMalloc))
}

/// jemalloc, through `tikv-jemallocator`'s `GlobalAlloc` value.
pub fn jemalloc() -> Box<dyn Subject> {
    pairs("jemalloc", || global_pair(&tikv_jemallocator::Jemalloc))
}

/// The kernel as page allocator: `mmap` a page, touch it (the fault allocates the frame),
/// `munmap` it (which frees the frame and flushes the TLB entry).
pub fn kernel() -> Box<dyn Subject> {
    pairs("kernel mmap+touch+munmap", || {
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

/// The floor: a per-thread stack of pre-allocated page addresses (in a thread-local, as a
/// real per-thread cache is); a pair is one pop and one push, the least any page allocator
/// must do.
pub fn ideal_stack() -> Box<dyn Subject> {
    thread_local! {
        static STACK: std::cell::RefCell<Vec<usize>> =
            std::cell::RefCell::new((0..1024).map(|i| 0x1000_0000 + i * 4096).collect());
    }
    pairs("ideal per-thread stack", || {
        let p = STACK.with(|s| s.borrow_mut().pop());
        if let Some(p) = black_box(p) {
            STACK.with(|s| s.borrow_mut().push(p));
        }
    })
}
