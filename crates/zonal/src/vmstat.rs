//! Event counters (`vm_event_item`): per CPU, each CPU's on its own cache lines apart from the
//! per-CPU page lists, summed on read.
//!
//! Kernel counterpart: `count_vm_events`, `all_vm_events` (mm/vmstat.c) and, for the layout,
//! seed 002's split of `per_cpu_pages` from `per_cpu_zonestat`.
//!
//! Accuracy: an update is a relaxed load and store on the CPU's own line, like the kernel's
//! `raw_cpu_add`, without a locked instruction. Two threads that run on the same CPU at once
//! (one preempted mid-update) can lose one of their updates; a single thread, or threads on
//! different CPUs, lose nothing. Readers sum every CPU's slots, so a read is exact once
//! updates stop, up to those rare lost updates.

use crate::sync::{AtomicU64, Ordering};

/// The event counters, in report order, with their stable names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum VmEvent {
    /// Frames allocated from a `Normal` zone (`pgalloc_normal`).
    PgallocNormal,
    /// Frames freed (`pgfree`).
    Pgfree,
    /// Refills of a per-CPU list from the buddy lists.
    PcpRefill,
    /// Drains of per-CPU lists to the buddy lists (on `high`, on demand, on decay).
    PcpDrain,
    /// Calls of the bulk allocator.
    AllocBulk,
    /// Allocations that failed for lack of memory.
    AllocFail,
    /// Allocations that found their per-CPU list busy and took the buddy path.
    PcpTrylockFail,
}

/// Number of [`VmEvent`]s.
pub const NR_VM_EVENTS: usize = 7;

impl VmEvent {
    /// Every event, in report order.
    pub const ALL: [VmEvent; NR_VM_EVENTS] = [
        VmEvent::PgallocNormal,
        VmEvent::Pgfree,
        VmEvent::PcpRefill,
        VmEvent::PcpDrain,
        VmEvent::AllocBulk,
        VmEvent::AllocFail,
        VmEvent::PcpTrylockFail,
    ];

    /// The counter's name in `/proc/vmstat` style.
    pub fn name(self) -> &'static str {
        match self {
            VmEvent::PgallocNormal => "pgalloc_normal",
            VmEvent::Pgfree => "pgfree",
            VmEvent::PcpRefill => "pcp_refill",
            VmEvent::PcpDrain => "pcp_drain",
            VmEvent::AllocBulk => "alloc_bulk",
            VmEvent::AllocFail => "alloc_fail",
            VmEvent::PcpTrylockFail => "pcp_trylock_fail",
        }
    }
}

/// One CPU's event counters, on lines of their own.
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct PerCpuEvents {
    events: [AtomicU64; NR_VM_EVENTS],
}

const _: () = assert!(std::mem::size_of::<PerCpuEvents>() % 128 == 0);

impl PerCpuEvents {
    /// Adds `n` to an event (`__count_vm_events`).
    #[inline]
    pub fn add(&self, ev: VmEvent, n: u64) {
        let c = &self.events[ev as usize];
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// This CPU's count of an event.
    #[inline]
    pub fn get(&self, ev: VmEvent) -> u64 {
        self.events[ev as usize].load(Ordering::Relaxed)
    }
}

/// Sums an event over CPUs (`all_vm_events`).
pub fn sum_events(cpus: &[PerCpuEvents], ev: VmEvent) -> u64 {
    cpus.iter().map(|c| c.get(ev)).fold(0, u64::wrapping_add)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_counts_sum_on_read() {
        let cpus: Vec<PerCpuEvents> = (0..3).map(|_| PerCpuEvents::default()).collect();
        cpus[0].add(VmEvent::Pgfree, 3);
        cpus[2].add(VmEvent::Pgfree, 4);
        cpus[1].add(VmEvent::AllocBulk, 1);
        assert_eq!(sum_events(&cpus, VmEvent::Pgfree), 7);
        assert_eq!(sum_events(&cpus, VmEvent::AllocBulk), 1);
        assert_eq!(VmEvent::ALL.len(), NR_VM_EVENTS);
        for (i, e) in VmEvent::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i);
        }
    }
}
