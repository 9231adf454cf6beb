//! One page-allocation interface over zonal and the peers, for the experiments that drive
//! allocation from several threads or in batches (`parallel`, `bulk`, `cross`). Experiments
//! are generic over it, so each subject's loop is compiled for that subject alone: no dynamic
//! call sits between the loop and the allocator.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::RefCell;
use std::ptr::NonNull;
use zonal::{Gfp, Zonal};

/// The peers of the multi-threaded and batched experiments, each built into a subject by
/// the experiment's own generic `subject` function: `peer_subjects!(subject)`.
#[macro_export]
macro_rules! peer_subjects {
    ($subject:ident) => {
        [
            $subject($crate::bench::page_api::Global(snmalloc_rs::SnMalloc, "snmalloc".into())),
            // Named after the caches it runs on in this process.
            $subject($crate::bench::page_api::Global(tcmalloc_better::TCMalloc, $crate::bench::peers::tcmalloc_name())),
            $subject($crate::bench::page_api::Global(mimalloc::MiMalloc, "mimalloc".into())),
            $subject($crate::bench::page_api::Global(tikv_jemallocator::Jemalloc, "jemalloc".into())),
            $subject($crate::bench::page_api::Glibc),
        ]
    };
}

/// The names `peer_subjects!` gives its subjects in this process, in its order (tcmalloc's
/// says which caches it runs on here): what `--only` is checked against before a run.
pub fn peer_names() -> Vec<String> {
    vec!["snmalloc".into(), super::peers::tcmalloc_name(), "mimalloc".into(), "jemalloc".into(), GLIBC.into()]
}

/// glibc's subject name.
pub const GLIBC: &str = "glibc malloc";

/// The ideal stack's subject name.
pub const IDEAL: &str = "ideal per-thread stack";

/// The block every peer allocates: one page, page-aligned.
pub const PAGE: Layout = match Layout::from_size_align(4096, 4096) {
    Ok(l) => l,
    Err(_) => panic!("4096/4096 is a valid layout"),
};

/// Allocates and frees single 4 KiB pages; safe to call from any thread.
pub trait PageAlloc: Sync {
    /// Name in tables and JSON.
    fn name(&self) -> String;
    /// One page, or null when out of memory.
    fn alloc(&self) -> *mut u8;
    /// Frees a page from `alloc` (of this subject, maybe from another thread).
    fn free(&self, p: *mut u8);
    /// Allocates up to `n` pages and frees them all (`bench bulk`'s round): by default `n`
    /// single allocations into `scratch`, then `n` frees; subjects with bulk calls make one
    /// call each way, holding the pages in the container their bulk call fills, as a caller
    /// of the bulk API does (page_bench04_bulk allocates into its array and frees from it).
    #[inline]
    fn alloc_free_many(&self, n: usize, scratch: &mut Scratch) {
        singles_then_frees(self, n, &mut scratch.ptrs);
    }
}

/// The containers a round of [`PageAlloc::alloc_free_many`] holds its pages in, owned by the
/// caller and kept from round to round (as page_bench04_bulk's array is on its stack).
#[derive(Default)]
pub struct Scratch {
    /// Pages as raw pointers (single allocations; the list form's free).
    pub ptrs: Vec<*mut u8>,
    /// The array form's slots.
    pub slots: Vec<Option<NonNull<u8>>>,
    /// The list form's list.
    pub list: Vec<NonNull<u8>>,
}

/// `n` single allocations into `ptrs`, then a free of each.
#[inline]
fn singles_then_frees<A: PageAlloc + ?Sized>(a: &A, n: usize, ptrs: &mut Vec<*mut u8>) {
    ptrs.clear();
    alloc_each(a, n, ptrs);
    std::hint::black_box(&*ptrs).iter().for_each(|&p| a.free(p));
}

/// `n` single allocations into `out`, stopping at the first failure; returns how many.
#[inline]
fn alloc_each<A: PageAlloc + ?Sized>(a: &A, n: usize, out: &mut Vec<*mut u8>) -> usize {
    let before = out.len();
    for _ in 0..n {
        let p = a.alloc();
        if p.is_null() {
            break;
        }
        out.push(p);
    }
    out.len() - before
}

/// A `GlobalAlloc` used as a value, with its name.
pub struct Global<A>(pub A, pub String);

impl<A: GlobalAlloc + Sync> PageAlloc for Global<A> {
    fn name(&self) -> String {
        self.1.clone()
    }
    #[inline]
    fn alloc(&self) -> *mut u8 {
        // SAFETY: PAGE has non-zero size.
        unsafe { self.0.alloc(PAGE) }
    }
    #[inline]
    fn free(&self, p: *mut u8) {
        // SAFETY: `p` came from `alloc` of the same allocator with the same layout.
        unsafe { self.0.dealloc(p, PAGE) }
    }
}

/// glibc's `posix_memalign` and `free`.
pub struct Glibc;

impl PageAlloc for Glibc {
    fn name(&self) -> String {
        GLIBC.into()
    }
    #[inline]
    fn alloc(&self) -> *mut u8 {
        let mut p: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: 4096 is a power-of-two multiple of sizeof(void*).
        if unsafe { libc::posix_memalign(&mut p, 4096, 4096) } == 0 {
            p.cast()
        } else {
            std::ptr::null_mut()
        }
    }
    #[inline]
    fn free(&self, p: *mut u8) {
        // SAFETY: `p` came from posix_memalign.
        unsafe { libc::free(p.cast()) }
    }
}

/// zonal's order-0 path (per-CPU lists unless the handle has them off), with its bulk calls
/// when `bulk` is set (array form when `array` is set, else the list form).
pub struct ZonalPages<'a> {
    pub z: &'a Zonal,
    pub label: &'static str,
    pub bulk: Option<BulkForm>,
}

/// The two forms of the bulk API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkForm {
    Array,
    List,
}

impl PageAlloc for ZonalPages<'_> {
    fn name(&self) -> String {
        self.label.to_string()
    }
    #[inline]
    fn alloc(&self) -> *mut u8 {
        self.z.alloc_pages(Gfp::KERNEL, 0).map_or(std::ptr::null_mut(), |p| p.as_ptr())
    }
    #[inline]
    fn free(&self, p: *mut u8) {
        let _ = self.z.free_pages(p, 0);
    }
    #[inline]
    fn alloc_free_many(&self, n: usize, scratch: &mut Scratch) {
        match self.bulk {
            None => singles_then_frees(self, n, &mut scratch.ptrs),
            // The array form: the empty slots filled, then the array freed as it is (its
            // emptied slots made empty again for the next call, as the kernel's bench does).
            Some(BulkForm::Array) => {
                if scratch.slots.len() < n {
                    scratch.slots.resize(n, None);
                }
                let slots = &mut scratch.slots[..n];
                self.z.alloc_pages_bulk_array(Gfp::KERNEL, slots);
                let _ = self.z.free_pages_bulk(std::hint::black_box(&*slots));
                // Emptied as cheaply as the length allows, so that the loop costs the round
                // as little as it can at every N: `fill` of a length known only at run time
                // is a call to memset, which made the one-slot round 1.29–1.40 times the
                // single pair's in a probe (0.99–1.18 emptied slot by slot), while slot by
                // slot made the 128-slot round 5% slower than memset's wide stores.
                if n <= 16 {
                    for s in slots.iter_mut() {
                        *s = None;
                        // Keeps the loop a loop (not turned back into the memset call).
                        std::hint::black_box(());
                    }
                } else {
                    slots.fill(None);
                }
            }
            // The list form: the list filled, then freed as raw pointers. (Freed as the list
            // of `NonNull`s it is, the one-page round measured 33 ns against 24, with the same
            // one-frame path inside; 128 pages were 5% faster. Not understood yet.)
            Some(BulkForm::List) => {
                let (list, ptrs) = (&mut scratch.list, &mut scratch.ptrs);
                list.clear();
                self.z.alloc_pages_bulk_list(Gfp::KERNEL, n, list);
                ptrs.clear();
                ptrs.extend(list.iter().map(|p| p.as_ptr()));
                let _ = self.z.free_pages_bulk(std::hint::black_box(&ptrs[..]));
            }
        }
    }
}

/// The floor: a per-thread stack of page addresses (no memory behind them is touched).
pub struct IdealStack;

/// The addresses each thread's ideal stack starts with: room for `mixed`'s population of
/// 4,096 frames per thread and for the frames its neighbour has not handed back yet (the
/// other experiments use the top few).
const IDEAL_ADDRESSES: usize = 16_384;

thread_local! {
    static STACK: RefCell<Vec<usize>> =
        RefCell::new((0..IDEAL_ADDRESSES).map(|i| 0x1000_0000 + i * 4096).collect());
}

impl PageAlloc for IdealStack {
    fn name(&self) -> String {
        IDEAL.into()
    }
    #[inline]
    fn alloc(&self) -> *mut u8 {
        STACK.with(|s| s.borrow_mut().pop()).map_or(std::ptr::null_mut(), |p| p as *mut u8)
    }
    #[inline]
    fn free(&self, p: *mut u8) {
        STACK.with(|s| s.borrow_mut().push(p as usize));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_of<A: PageAlloc>(a: A) -> String {
        a.name()
    }

    #[test]
    fn peer_names_are_the_names_of_the_peer_subjects() {
        assert_eq!(crate::peer_subjects!(name_of).to_vec(), peer_names());
    }
}
