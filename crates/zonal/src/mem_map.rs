//! zonal's `mem_map`: one entry per frame, outside the frames, holding the frame's state tag.
//!
//! Kernel counterpart: `struct page` and the `mem_map`/`vmemmap` array of them. Linux gives
//! every frame a 64-byte `struct page`, so two CPUs working on neighbouring frames never
//! write the same cache line. zonal's entries are 64 bytes for the same reason: with one
//! byte per frame, 64 neighbouring frames shared a line, and two CPUs of one node whose
//! lists held neighbouring frames (a refill hands each CPU the next frames of the buddy)
//! wrote the same line on every allocation and free. On one zone shared by two CPUs that
//! halved the per-thread rate (`zonal bench parallel --topology nodes=1,size=128M`).
//!
//! Cost: 64 bytes per 4 KiB frame (1/64 of the memory, as Linux spends), allocated zeroed
//! (`NONE` is 0), so the OS backs only the pages of the map that are written: the heads of
//! free blocks and the frames handed out.
//!
//! Locking: the state is an atomic; see [`crate::buddy`] for its protocol.

use crate::sync::AtomicU8;

/// One frame's entry. The state is the only field today; the rest of the line is room for
/// what later layers keep per frame (NUMA balancing's last CPU and node), as `struct page`
/// keeps `_last_cpupid`.
#[repr(C, align(64))]
pub(crate) struct PageEntry {
    state: AtomicU8,
}

const _: () = assert!(std::mem::size_of::<PageEntry>() == 64);

/// The entries of one zone's frames, indexed from the zone's first frame.
pub(crate) struct MemMap {
    entries: Box<[PageEntry]>,
}

impl MemMap {
    /// `n` entries, every state `NONE` (0).
    pub(crate) fn new(n: usize) -> MemMap {
        #[cfg(not(loom))]
        {
            if n == 0 {
                return MemMap { entries: Box::new([]) };
            }
            let layout = std::alloc::Layout::array::<PageEntry>(n).expect("a zone's map fits in the address space");
            // SAFETY: the layout has a non-zero size (n > 0). The allocator returns zeroed
            // memory (for large maps, fresh anonymous pages the OS backs on first write).
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut PageEntry;
            if ptr.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            // SAFETY: `ptr` is an allocation of the global allocator with the layout of `n`
            // `PageEntry`s, so a `Box<[PageEntry]>` of it frees it with that layout; all-zero
            // bytes are a valid `PageEntry` (one `AtomicU8` of 0, the rest padding).
            let entries = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n)) };
            MemMap { entries }
        }
        #[cfg(loom)]
        {
            MemMap { entries: (0..n).map(|_| PageEntry { state: AtomicU8::new(0) }).collect() }
        }
    }

    /// The state of the frame at zone-relative index `idx`.
    #[inline(always)]
    pub(crate) fn state(&self, idx: usize) -> &AtomicU8 {
        &self.entries[idx].state
    }

    /// Entries in the map.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Every state, in frame order (invariant walks).
    pub(crate) fn states(&self) -> impl Iterator<Item = &AtomicU8> + '_ {
        self.entries.iter().map(|e| &e.state)
    }
}
