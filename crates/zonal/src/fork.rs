//! What a handle is in a child made by `fork()`: nothing that can reach a frame.
//!
//! Kernel counterpart: `MADV_DONTFORK` (`VM_DONTCOPY`, which `dup_mmap` skips) and, for the
//! metadata the kernel does not know of, `pthread_atfork`. The arena's node ranges are
//! `MADV_DONTFORK` (`Arena::new`, as DPDK marks its memory), so even a raw `fork()` shares no
//! frame: the child has holes where the frames were. The child still has a copy of every
//! handle's metadata, which names those frames, and a lock a parent thread held at the fork
//! stays held forever in the child. So a child handler, registered once per process, runs
//! in the child of every `fork()` (glibc's `fork`, not `vfork`/`posix_spawn`, which exec at
//! once) and, for every live handle of this registry:
//!
//! - moves the fork generation on first ([`generation`]): every handle built before the
//!   fork now reads as inherited ([`Registration::forked`]), and every frame-moving call
//!   checks that before it takes any lock and returns `Error::Forked`;
//! - maps private `PROT_NONE` memory over the handle's reservation (`MAP_FIXED`), so no
//!   later mapping of the child lands at addresses the metadata names, and a stray access
//!   faults;
//! - points every entry of the table the restartable sequences find a CPU's lists in at a
//!   stand-in whose lock reads as held (`pcp::rseq::ABSENT_STANDIN`), so every section
//!   gives way and the locked paths, which check first, refuse: no instruction on the
//!   sections' paths tests for a fork.
//!
//! The registry is a chain of fixed chunks of slots, the first static, the others leaked
//! (a registry outlives every handle), claimed and freed with a CAS: the handler walks it
//! without a lock and without allocating, as async-signal-safety asks. Plain std atomics:
//! loom does not model `fork`.
//!
//! Invariant: a slot is `LIVE` exactly while its reservation is mapped as a handle's arena
//! (the arena registers after reserving and unregisters before unmapping), and its table,
//! when set, is the handle's live local table (the handle clears it before freeing it).

use crate::error::Result;
use crate::sys;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Forks this process has been made by, counted in the child: a handle built at another
/// generation was inherited.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The fork generation of this process (0 in a process no zonal child handler ran in).
#[inline]
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

const FREE: u8 = 0;
/// Being filled or emptied: the handler leaves it alone (its handle is being built or
/// dropped by a thread the child does not have, so the child cannot reach it).
const BUSY: u8 = 1;
const LIVE: u8 = 2;

/// One live handle's stable parts: its reservation and its local table (heap addresses,
/// which moving the handle leaves in place).
struct Slot {
    state: AtomicU8,
    base: AtomicUsize,
    len: AtomicUsize,
    table: AtomicPtr<usize>,
    table_len: AtomicUsize,
    /// What the handler writes into each entry of `table`.
    fill: AtomicUsize,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            state: AtomicU8::new(FREE),
            base: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            table: AtomicPtr::new(std::ptr::null_mut()),
            table_len: AtomicUsize::new(0),
            fill: AtomicUsize::new(0),
        }
    }
}

const SLOTS: usize = 64;

struct Chunk {
    slots: [Slot; SLOTS],
    next: AtomicPtr<Chunk>,
}

impl Chunk {
    const fn new() -> Chunk {
        Chunk { slots: [const { Slot::new() }; SLOTS], next: AtomicPtr::new(std::ptr::null_mut()) }
    }

    fn next(&self) -> Option<&'static Chunk> {
        // SAFETY: `next` is null or a chunk leaked by `claim` (never freed), written once
        // with Release after it was built.
        unsafe { self.next.load(Ordering::Acquire).as_ref() }
    }
}

static FIRST: Chunk = Chunk::new();

/// The registry's chunks, first to last.
fn chunks() -> impl Iterator<Item = &'static Chunk> {
    std::iter::successors(Some(&FIRST), |c| c.next())
}

/// Claims a free slot (`FREE -> BUSY`), adding a chunk when every one is taken.
fn claim() -> &'static Slot {
    loop {
        for c in chunks() {
            if let Some(s) = c
                .slots
                .iter()
                .find(|s| s.state.compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok())
            {
                return s;
            }
        }
        // Every slot taken: a new chunk at the end (if another thread appended one first,
        // this one goes after it), then the search again.
        let fresh: &'static Chunk = Box::leak(Box::new(Chunk::new()));
        let mut last = chunks().last().unwrap_or(&FIRST);
        while let Err(next) = last.next.compare_exchange(
            std::ptr::null_mut(),
            std::ptr::from_ref(fresh).cast_mut(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: as in `Chunk::next`: a leaked chunk.
            last = unsafe { &*next };
        }
    }
}

/// A handle's place in the registry, held by its arena; frees the slot on drop.
#[derive(Debug)]
pub(crate) struct Registration {
    slot: &'static Slot,
    /// The fork generation the handle was built at.
    generation: u64,
    /// The process that built it.
    creator: u32,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("base", &self.base.load(Ordering::Relaxed)).finish_non_exhaustive()
    }
}

impl Registration {
    /// Registers a reservation of `len` bytes at `base`, installing the child handler the
    /// first time in the process.
    pub(crate) fn new(base: usize, len: usize) -> Result<Registration> {
        static INSTALLED: OnceLock<Result<()>> = OnceLock::new();
        INSTALLED.get_or_init(|| sys::atfork_child(in_child)).clone()?;
        let slot = claim();
        slot.base.store(base, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        slot.table.store(std::ptr::null_mut(), Ordering::Relaxed);
        // Release: the handler that sees `LIVE` sees the range.
        slot.state.store(LIVE, Ordering::Release);
        Ok(Registration { slot, generation: generation(), creator: std::process::id() })
    }

    /// Names the handle's local table (`len` entries at `table`), whose every entry the
    /// child handler sets to `fill`. `table` must stay valid for writes until
    /// [`Registration::clear_table`] (see `Zonal::drop`).
    pub(crate) fn set_table(&self, table: *mut usize, len: usize, fill: usize) {
        self.slot.fill.store(fill, Ordering::Relaxed);
        self.slot.table_len.store(len, Ordering::Relaxed);
        // Release: a handler that sees the table sees its length and fill.
        self.slot.table.store(table, Ordering::Release);
    }

    /// Forgets the table, before the handle frees it.
    pub(crate) fn clear_table(&self) {
        self.slot.table.store(std::ptr::null_mut(), Ordering::SeqCst);
    }

    /// Whether this process is a child (by `fork()`) of the one that built the handle.
    #[inline]
    pub(crate) fn forked(&self) -> bool {
        generation() != self.generation
    }

    /// The process that built the handle.
    pub(crate) fn creator(&self) -> u32 {
        self.creator
    }

    /// Takes the slot out of the registry (`LIVE -> BUSY`), before the reservation is
    /// unmapped: from here on no child handler maps over the range, which this process may
    /// reuse for anything. Idempotent; the slot is freed on drop.
    pub(crate) fn retire(&self) {
        let _ = self.slot.state.compare_exchange(LIVE, BUSY, Ordering::SeqCst, Ordering::Relaxed);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.retire();
        self.slot.table.store(std::ptr::null_mut(), Ordering::Relaxed);
        self.slot.len.store(0, Ordering::Relaxed);
        self.slot.state.store(FREE, Ordering::Release);
    }
}

/// The child handler (see the module's text). Async-signal-safe: atomics, `mmap`, stores.
unsafe extern "C" fn in_child() {
    // First, so that a signal handler running zonal code in the middle of this already
    // finds every inherited handle refusing.
    GENERATION.fetch_add(1, Ordering::SeqCst);
    for slot in chunks().flat_map(|c| c.slots.iter()) {
        if slot.state.load(Ordering::Acquire) != LIVE {
            continue;
        }
        let (base, len) = (slot.base.load(Ordering::Relaxed), slot.len.load(Ordering::Relaxed));
        // SAFETY: a `LIVE` slot's range is an inherited handle's reservation (the module's
        // invariant), whose node ranges the child did not inherit (MADV_DONTFORK) and whose
        // gaps were never mapped: nothing of the child uses it. A refusal leaves holes; the
        // handle refuses every call all the same.
        let _ = unsafe { sys::map_none_fixed(base, len) };
        let table = slot.table.load(Ordering::Acquire);
        if table.is_null() {
            continue;
        }
        let fill = slot.fill.load(Ordering::Relaxed);
        for i in 0..slot.table_len.load(Ordering::Relaxed) {
            // SAFETY: a set table is the handle's live local table of `table_len` aligned
            // words (the module's invariant), written through the pointer the handle gave
            // from its exclusive borrow; it is only ever read by the rseq sections, through
            // raw pointers, and the child has one thread, so this store races with nothing.
            unsafe { AtomicUsize::from_ptr(table.add(i)) }.store(fill, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_the_registry_grows() {
        // More registrations than a chunk holds, all at once: a second chunk is added.
        let regs: Vec<_> = (0..SLOTS + 3).map(|i| Registration::new(0x1000 * (i + 1), 0x1000).unwrap()).collect();
        assert!(FIRST.next().is_some(), "a second chunk");
        let live = |r: &Registration| r.slot.state.load(Ordering::Relaxed) == LIVE;
        assert!(regs.iter().all(live));
        drop(regs);
        let again = Registration::new(0x7000, 0x1000).unwrap();
        assert!(live(&again));
        assert!(!again.forked(), "built in this process");
        assert_eq!(again.creator(), std::process::id());
        // Freed slots are taken again (a racing test may have taken the very first one).
        assert!(chunks().flat_map(|c| c.slots.iter()).take(SLOTS + 3).any(|s| std::ptr::eq(s, again.slot)));
        again.retire();
        assert!(!live(&again), "retired before its range is unmapped");
    }
}
