//! A region's page table: per virtual page, the frame behind it, its state and the last
//! (node, thread) that took a hint fault on it; and the migration decision that reads it.
//!
//! Kernel counterpart: the PTE (present / `PROT_NONE` for NUMA hints / none) and the page's
//! `_last_cpupid` with `page_cpupid_xchg_last`; `should_numa_migrate_memory`
//! (kernel/sched/fair.c).
//!
//! States and who moves them:
//! - `UNMAPPED -> BUSY -> PRESENT`: the first touch (fault handler) maps a frame.
//! - `PRESENT -> HINT`: the scanner, before it makes the page inaccessible.
//! - `HINT -> BUSY -> PRESENT`: the hint fault (fault handler): it maps the page back, or
//!   migrates it and maps the new frame.
//! - `PRESENT -> BUSY -> PRESENT`: `Region::prefault` and migrations outside a fault.
//!
//! Every move out of `UNMAPPED`, `HINT` and `PRESENT` into `BUSY` is a CAS, so exactly one
//! thread owns a page while it changes; the others see `BUSY` and wait for it to end.

use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};

/// No frame behind the page; it is inaccessible.
pub const UNMAPPED: u8 = 0;
/// A frame is mapped read-write.
pub const PRESENT: u8 = 1;
/// A frame is mapped inaccessible by the scanner: the next access is a hint fault.
pub const HINT: u8 = 2;
/// One thread is changing the page; everyone else waits.
pub const BUSY: u8 = 3;

/// One virtual page.
#[derive(Debug, Default)]
pub struct PageEntry {
    /// Arena address of the frame behind the page, 0 when none.
    pub frame: AtomicUsize,
    /// One of the states above.
    pub state: AtomicU8,
    /// The last hint fault's [`Cpupid`], 0 when unset (`_last_cpupid`).
    pub last: AtomicU32,
}

impl PageEntry {
    /// Claims the page for a change: `from -> BUSY`.
    #[inline]
    pub fn claim(&self, from: u8) -> bool {
        self.state.compare_exchange(from, BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Ends a change: `BUSY -> to`, publishing the frame written before it.
    #[inline]
    pub fn release(&self, to: u8) {
        self.state.store(to, Ordering::Release);
    }
}

/// The node and thread of a hint fault, packed as Linux packs cpu and pid: node + 1 in the
/// top 10 bits (0: unset), the low 22 bits of the thread id below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpupid(pub u32);

impl Cpupid {
    const TID_BITS: u32 = 22;
    const TID_MASK: u32 = (1 << Self::TID_BITS) - 1;

    /// Packs a node and a thread id.
    pub fn new(nid: u16, tid: u32) -> Cpupid {
        Cpupid(((nid as u32 + 1) & 0x3ff) << Self::TID_BITS | (tid & Self::TID_MASK))
    }

    /// Whether nothing was recorded (`cpupid_pid_unset`).
    pub fn is_unset(self) -> bool {
        self.0 >> Self::TID_BITS == 0
    }

    /// The node (`cpupid_to_nid`); meaningless when unset.
    pub fn nid(self) -> u16 {
        ((self.0 >> Self::TID_BITS) as u16).wrapping_sub(1)
    }

    /// Whether both come from one thread (`cpupid_match_pid`).
    pub fn same_thread(self, other: Cpupid) -> bool {
        (self.0 & Self::TID_MASK) == (other.0 & Self::TID_MASK)
    }
}

/// `should_numa_migrate_memory`: records this fault as the page's last and says whether a
/// page faulted on from `this` should move to `dst` (the faulting CPU's node, not the
/// page's). Early in a region's life (its first scan passes) a page migrates at once when
/// nobody else faulted on it; after that, only on the second fault in a row from `dst` (the
/// two-stage filter against ping-pong). A page faulted on by several threads migrates like a
/// private one: zonal has no NUMA groups to weigh shared faults with.
pub fn should_migrate(entry: &PageEntry, this: Cpupid, dst: u16, early: bool) -> bool {
    let last = Cpupid(entry.last.swap(this.0, Ordering::Relaxed));
    if early && (last.is_unset() || last.same_thread(this)) {
        return true;
    }
    if !last.is_unset() && last.nid() != dst {
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpupid_packs_and_compares() {
        let c = Cpupid::new(3, 0x7abcdef);
        assert!(!c.is_unset());
        assert_eq!(c.nid(), 3);
        assert!(c.same_thread(Cpupid::new(0, 0x3abcdef)), "22 bits of the thread id");
        assert!(!c.same_thread(Cpupid::new(3, 5)));
        assert!(Cpupid(0).is_unset());
    }

    /// The two-stage filter: past the early phase a page moves to a node only on the
    /// second fault in a row from that node.
    #[test]
    fn a_page_moves_on_the_second_fault_in_a_row_from_the_destination() {
        let e = PageEntry::default();
        let (a, b) = (Cpupid::new(1, 10), Cpupid::new(0, 11));
        // Unset: as Linux, the first fault passes the filter.
        assert!(should_migrate(&e, a, 1, false));
        assert!(should_migrate(&e, a, 1, false), "second fault from node 1");
        assert!(!should_migrate(&e, b, 0, false), "last fault came from node 1");
        assert!(should_migrate(&e, b, 0, false), "second in a row from node 0");
        assert!(!should_migrate(&e, a, 1, false));
    }

    /// Early on, a page another thread faulted on last does not skip the filter.
    #[test]
    fn the_early_phase_skips_the_filter_for_private_pages_only() {
        let e = PageEntry::default();
        let (a, b) = (Cpupid::new(1, 10), Cpupid::new(0, 11));
        assert!(should_migrate(&e, a, 1, true));
        assert!(!should_migrate(&e, b, 0, true), "shared: the filter applies");
        assert!(should_migrate(&e, b, 0, true), "private to b now");
    }

    #[test]
    fn only_one_claim_wins() {
        let e = PageEntry::default();
        assert!(e.claim(UNMAPPED));
        assert!(!e.claim(UNMAPPED));
        assert!(!e.claim(HINT));
        e.release(HINT);
        assert!(e.claim(HINT));
    }
}
