//! A region's page table: per virtual page, the frame behind it, its state and the last
//! (node, thread) that took a hint fault on it; and the migration decision that reads it.
//!
//! Kernel counterpart: the PTE (present / `PROT_NONE` for NUMA hints / none) and the page's
//! `_last_cpupid` with `page_cpupid_xchg_last`; `should_numa_migrate_memory`
//! (kernel/sched/fair.c).
//!
//! States and who moves them:
//! - `UNMAPPED -> BUSY -> PRESENT`: the first touch (fault handler) maps a frame.
//! - `PRESENT -> BUSY -> HINT`: the scanner, which makes the page inaccessible in between.
//! - `HINT -> BUSY -> HINT`: the scanner, hiding a whole window in one call across pages
//!   hinted already (the call then covers the window's mapping once, see `scan`).
//! - `HINT -> BUSY -> PRESENT`: the hint fault (fault handler): it maps the page back, or
//!   migrates it and maps the new frame.
//! - `PRESENT -> BUSY -> PRESENT`: `Region::prefault`, a pin, the repair of a mapping taken
//!   away behind the table's back, and collapses.
//!
//! Every move out of `UNMAPPED`, `HINT` and `PRESENT` into `BUSY` is a CAS, so exactly one
//! thread owns a page while it changes; the others see `BUSY` and wait for it to end.
//!
//! Pins (`PageEntry::pins`): a pinned page stays `PRESENT` on its frame (the kernel may hold
//! the frame itself, as io_uring's registered buffers and O_DIRECT do). The pinner raises
//! the count and then waits for `PRESENT`; whoever would hide or move the page claims it and
//! then reads the count. Both sides are sequentially consistent, so either the claimer sees
//! the pin (and puts the page back) or the pinner sees the claim (and waits for it to end,
//! mapping the page again if it was hidden): no pinned page is ever hidden or copied.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Regions registered at once, process-wide (the fault handler's table of them).
pub const MAX_REGIONS: usize = 256;

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
    /// The page was mapped anew since the userfaultfd last registered it (a new mapping is
    /// not registered): the next hide registers it first. Changed only by the page's owner
    /// (`BUSY`).
    pub unregistered: AtomicBool,
    /// Pins held on the page (`Region::pin`): while non-zero the scanner, migrations and
    /// collapses leave it alone.
    pub pins: AtomicU32,
    /// The region's scan sequence (`numa_scan_seq`) when the scanner last hid the page: a
    /// page still hinted two sequences later went a whole scan period untouched
    /// ([`PageEntry::cold`]).
    pub hidden_seq: AtomicU32,
    /// The tiering clock (ms, wrapping) when the scanner last hid the page: a hint fault's
    /// latency is measured from it (Linux keeps it in the page's cpupid field in tiering
    /// mode).
    pub hidden_ms: AtomicU32,
    /// Hidden under mprotect with its entry kept (`PROT_NONE` over a present entry, not
    /// zapped: `fault::Hide::ProtectOnly`), so that mapping another frame over it flushes.
    /// Changed only by the page's owner (`BUSY`).
    pub kept: AtomicBool,
}

impl PageEntry {
    /// Claims the page for a change: `from -> BUSY`. Sequentially consistent, against a
    /// pinner's count (see the module's docs); on x86 the same instruction as Acquire.
    #[inline]
    pub fn claim(&self, from: u8) -> bool {
        self.state.compare_exchange(from, BUSY, Ordering::SeqCst, Ordering::Relaxed).is_ok()
    }

    /// Whether the page is pinned; read by a claimer after its claim.
    #[inline]
    pub fn pinned(&self) -> bool {
        self.pins.load(Ordering::SeqCst) != 0
    }

    /// Whether a hinted page was hidden two scan sequences before `seq` (the region's now)
    /// or earlier: a whole scan period went by without a touch. Read by the page's owner
    /// (`BUSY`, claimed from `HINT`): a page nobody uses may move along with a neighbour's
    /// migration (`fault`'s `migrate_run`).
    #[inline]
    pub fn cold(&self, seq: u32) -> bool {
        seq.wrapping_sub(self.hidden_seq.load(Ordering::Relaxed)) >= 2
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

/// The hint faults of the threads that share a region, per node: taken by CPUs of the node
/// (`faults_cpu`) and on memory of the node (`faults`), halved at every scan pass over the
/// region. Linux's `numa_group` gathers the tasks that fault on each other's pages; a
/// region's threads are such a group by construction, so the region keeps the counts.
#[derive(Debug)]
pub struct Group {
    cpu: Box<[AtomicU64]>,
    mem: Box<[AtomicU64]>,
}

/// `ACTIVE_NODE_FRACTION`: a node whose CPUs fault three times as often as the source's
/// takes a shared page at once.
const ACTIVE_NODE_FRACTION: u64 = 3;

impl Group {
    /// Counts for `nodes` nodes, all 0.
    pub fn new(nodes: usize) -> Group {
        Group {
            cpu: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            mem: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A hint fault by a CPU of `cpu_nid` on memory of `mem_nid` (`task_numa_fault`).
    pub fn record(&self, cpu_nid: u16, mem_nid: u16) {
        if let Some(c) = self.cpu.get(cpu_nid as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(m) = self.mem.get(mem_nid as usize) {
            m.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Halves every count (`task_numa_placement`'s decay at each scan sequence). A fault
    /// counted between the load and the subtraction stays counted.
    pub fn decay(&self) {
        for a in self.cpu.iter().chain(self.mem.iter()) {
            a.fetch_sub(a.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
        }
    }

    fn get(v: &[AtomicU64], nid: u16) -> u64 {
        v.get(nid as usize).map_or(0, |a| a.load(Ordering::Relaxed))
    }

    /// Whether a shared page on `src` should move to `dst`: `dst`'s CPUs fault more than
    /// `ACTIVE_NODE_FRACTION` times as often as `src`'s, or, with a 3/4 hysteresis, the CPU
    /// faults per memory fault are higher on `dst` (memory spread as CPU use is).
    pub fn favours(&self, src: u16, dst: u16) -> bool {
        let (cpu_src, cpu_dst) = (Self::get(&self.cpu, src), Self::get(&self.cpu, dst));
        let (mem_src, mem_dst) = (Self::get(&self.mem, src), Self::get(&self.mem, dst));
        if cpu_dst > cpu_src.saturating_mul(ACTIVE_NODE_FRACTION) {
            return true;
        }
        (cpu_dst as u128) * (mem_src as u128) * 3 > (cpu_src as u128) * (mem_dst as u128) * 4
    }
}

/// `should_numa_migrate_memory`: records this fault as the page's last and says whether a
/// page on `src` faulted on from `this` should move to `dst` (the faulting CPU's node, not
/// the page's). Early in a region's life (its first scan passes) a page migrates at once
/// when nobody else faulted on it; after that, only on the second fault in a row from `dst`
/// (the two-stage filter against ping-pong). Then a private page (the same thread faulted
/// last) moves; a shared one (another thread, or nobody recorded) moves as its `group`'s
/// faults say, and without a group it moves.
pub fn should_migrate(entry: &PageEntry, this: Cpupid, src: u16, dst: u16, early: bool, group: Option<&Group>) -> bool {
    let last = Cpupid(entry.last.swap(this.0, Ordering::Relaxed));
    if early && (last.is_unset() || last.same_thread(this)) {
        return true;
    }
    if !last.is_unset() && last.nid() != dst {
        return false;
    }
    if !last.is_unset() && last.same_thread(this) {
        return true;
    }
    group.is_none_or(|g| g.favours(src, dst))
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
        assert!(should_migrate(&e, a, 0, 1, false, None));
        assert!(should_migrate(&e, a, 0, 1, false, None), "second fault from node 1");
        assert!(!should_migrate(&e, b, 1, 0, false, None), "last fault came from node 1");
        assert!(should_migrate(&e, b, 1, 0, false, None), "second in a row from node 0");
        assert!(!should_migrate(&e, a, 0, 1, false, None));
    }

    /// Early on, a page another thread faulted on last does not skip the filter.
    #[test]
    fn the_early_phase_skips_the_filter_for_private_pages_only() {
        let e = PageEntry::default();
        let (a, b) = (Cpupid::new(1, 10), Cpupid::new(0, 11));
        assert!(should_migrate(&e, a, 0, 1, true, None));
        assert!(!should_migrate(&e, b, 1, 0, true, None), "shared: the filter applies");
        assert!(should_migrate(&e, b, 1, 0, true, None), "private to b now");
    }

    /// A shared page (another thread faulted last, from the same node) moves as the group's
    /// faults say: to a node whose CPUs fault more than three times as often, or whose CPU
    /// faults per memory fault beat the source's by the 3/4 hysteresis; a private one always.
    #[test]
    fn shared_pages_follow_the_group_faults() {
        let g = Group::new(2);
        let (a, b) = (Cpupid::new(1, 10), Cpupid::new(1, 11));
        let shared = |g: &Group| {
            let e = PageEntry::default();
            e.last.store(a.0, Ordering::Relaxed);
            should_migrate(&e, b, 0, 1, false, Some(g))
        };
        // Node 0's CPUs fault 4 times, node 1's 10 (> 3 × 4 is false: 10 < 12), all on node 0's
        // memory: the hysteresis 10 × 4 × 3 > 4 × 0 × 4 lets it move.
        (0..4).for_each(|_| g.record(0, 0));
        (0..10).for_each(|_| g.record(1, 0));
        assert!(shared(&g));
        // Node 1's memory already takes more faults: 10 × 14 × 3 = 420 against 4 × 30 × 4 = 480
        // keeps it where it is.
        let g2 = Group::new(2);
        (0..4).for_each(|_| g2.record(0, 0));
        (0..10).for_each(|_| g2.record(1, 0));
        g2.mem[1].fetch_add(30, Ordering::Relaxed);
        assert!(!g2.favours(0, 1), "node 1's memory is used out of proportion already");
        // More than three times the CPU faults: moves whatever the memory counts.
        (0..3).for_each(|_| g2.record(1, 1));
        assert!(g2.favours(0, 1), "13 > 3 × 4");
        // A private fault moves whatever the group says.
        let e = PageEntry::default();
        e.last.store(b.0, Ordering::Relaxed);
        let cold = Group::new(2);
        (0..100).for_each(|_| cold.record(0, 0));
        assert!(should_migrate(&e, b, 0, 1, false, Some(&cold)));
        assert!(!shared(&cold), "a shared page stays where the group's CPUs are");
        // Decay halves every count.
        cold.decay();
        assert_eq!(Group::get(&cold.cpu, 0), 50);
        assert_eq!(Group::get(&cold.mem, 0), 50);
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
