//! Event counters (`enum vm_event_item`): allocations, frees, refills, drains, fences and
//! the zonelist cache's work, counted per CPU on lines of their own ([`PerCpuEvents`]) and
//! summed on read ([`sum_events`]).
//!
//! Kernel counterpart: `enum vm_event_item`, `struct vm_event_state`, `__count_vm_events`,
//! `all_vm_events` (mm/vmstat.c, include/linux/vm_event_item.h).
//!
//! Locking: none. An update is a relaxed load and store on the CPU's own line, like the
//! kernel's `raw_cpu_add`, without a locked instruction. Two threads that run on the same CPU
//! at once (one preempted mid-update) can lose one of their updates; a single thread, or
//! threads on different CPUs, lose nothing.
//!
//! Invariant: `VmEvent::ALL[i] as usize == i`, the index into every CPU's slots (generated
//! by `counters!`); a read is exact once updates stop, up to those rare lost updates.

use crate::sync::{AtomicU64, Ordering};

counters! {
    /// The event counters, in report order, with their stable names.
    pub enum VmEvent;
    /// Number of [`VmEvent`]s.
    pub const NR_VM_EVENTS;
    /// Every event, in report order.
    const ALL;
    /// The counter's name in `/proc/vmstat` style.
    fn name;
    {
        /// Frames allocated from a `Normal` zone (`pgalloc_normal`).
        PgallocNormal => ["pgalloc_normal"],
        /// Frames freed (`pgfree`).
        Pgfree => ["pgfree"],
        /// Refills of a per-CPU list from the buddy lists.
        PcpRefill => ["pcp_refill"],
        /// Drains of per-CPU lists to the buddy lists (on `high`, on demand, on decay).
        PcpDrain => ["pcp_drain"],
        /// Calls of the bulk allocator.
        AllocBulk => ["alloc_bulk"],
        /// Allocations that failed for lack of memory.
        AllocFail => ["alloc_fail"],
        /// Allocations that found their per-CPU list busy and took the buddy path.
        PcpTrylockFail => ["pcp_trylock_fail"],
        /// `membarrier` calls a pcp lock holder made to restart another CPU's rseq sections
        /// (zonal's own: the cost of touching a remote cache, one IPI each).
        PcpFence => ["pcp_fence"],
        /// Order-0 frames freed on a CPU whose lists do not own the frame's run, handed to
        /// the owner's inbox (zonal's own: run ownership's traffic between the CPUs of a
        /// zone; counted by the inboxes that take them).
        PcpRouted => ["pcp_routed"],
        /// Zones a zonelist walk skipped because the zonelist cache had them full.
        ZlcSkipped => ["zlc_zones_skipped"],
        /// Zones the zonelist cache marked full.
        ZlcFullMarks => ["zlc_full_marks"],
        /// Zaps of a zonelist cache's bitmap.
        ZlcZaps => ["zlc_zaps"],
    }
}

/// One CPU's event counters, on lines of their own.
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct PerCpuEvents {
    events: [AtomicU64; NR_VM_EVENTS],
    /// Frames the order-0 fast paths took from this CPU's local zone: part of
    /// `pgalloc_normal`, and the NUMA hits and locals of those allocations.
    local_first: AtomicU64,
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
        let v = self.events[ev as usize].load(Ordering::Relaxed);
        match ev {
            VmEvent::PgallocNormal => v.wrapping_add(self.local_first()),
            _ => v,
        }
    }

    /// Adds `n` frames taken by the fast paths from this CPU's local zone.
    #[inline]
    pub fn add_local_first(&self, n: u64) {
        let c = &self.local_first;
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Frames taken by the fast paths from this CPU's local zone so far.
    #[inline]
    pub fn local_first(&self) -> u64 {
        self.local_first.load(Ordering::Relaxed)
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
