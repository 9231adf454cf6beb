//! Acting as a CPU ([`Zonal::act_as_cpu`]): allocations and frees that resolve their CPU as a
//! given id instead of the one the thread runs on, for benches and tests. A topology's virtual
//! CPUs (`vcpus=`, [`crate::Topology::is_virtual`]) have lists no thread reaches by running
//! there; this is how one does, so that 256 CPUs' lists can be filled, drained and measured
//! on a machine of 2.
//!
//! Kernel counterpart: none (Linux runs code on a CPU by running a thread there); the paths
//! are `rmqueue_pcplist` and `free_unref_page` of the CPU named.
//!
//! Locking: every call takes the locked per-CPU path of the CPU it names (its lists'
//! try-lock, the zone lock under it), never a restartable sequence: a section runs on the
//! CPU the kernel reports, which is not the CPU named. A real CPU may be named too; a holder
//! of its lists fences its sections first, as any remote holder does.
//!
//! Why a value rather than a thread-local switch that `alloc_pages` and `free_pages` would
//! read: the order-0 allocation already reads a per-thread word (the policy bits) and could
//! be diverted through it at no cost, but the free's fast path reads nothing per thread
//! (only the kernel's rseq area), so a switch would have cost every free a load and a branch,
//! or left frees on the CPU the thread runs on. Calls through an [`ActingCpu`] cost the fast
//! paths nothing.

use super::*;

/// A thread's calls acting as one CPU of the handle (see [`Zonal::act_as_cpu`]): its
/// allocations and frees take that CPU's lists, on the locked path. Cheap to make; any
/// number may exist, for any CPUs, at once.
#[derive(Clone, Copy)]
pub struct ActingCpu<'a> {
    z: &'a Zonal,
    cpu: usize,
}

impl std::fmt::Debug for ActingCpu<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActingCpu").field("handle", &self.z.id).field("cpu", &self.cpu).finish()
    }
}

impl Zonal {
    /// Calls that act as CPU `cpu` (below [`Zonal::nr_cpus`], virtual or real): their
    /// allocations and frees resolve the CPU as that id, so that the frames come from and go
    /// to its per-CPU lists, and its counters count them, on the locked per-CPU path
    /// (never a restartable sequence). For benches and tests, which reach a topology's
    /// virtual CPUs this way (`vcpus=`): no thread runs on one by itself. An id the topology
    /// does not have is [`Error::InvalidCpu`].
    pub fn act_as_cpu(&self, cpu: usize) -> Result<ActingCpu<'_>> {
        if cpu >= self.cpus.nr_cpus {
            return Err(Error::InvalidCpu {
                cpu: CpuId(u32::try_from(cpu).unwrap_or(u32::MAX)),
                nr_cpus: self.cpus.nr_cpus,
            });
        }
        Ok(ActingCpu { z: self, cpu })
    }
}

impl ActingCpu<'_> {
    /// The CPU these calls act as.
    pub fn cpu(&self) -> CpuId {
        CpuId(self.cpu as u32)
    }

    /// [`Zonal::alloc_pages`] as this CPU: under this thread's policy for the handle, with
    /// this CPU's node as the local one; the block from this CPU's lists (refilled from the
    /// zone) for the orders they keep.
    pub fn alloc_pages(&self, gfp: Gfp, order: u32) -> Result<NonNull<u8>> {
        let (z, cpu) = (self.z, self.cpu);
        z.check_forked()?;
        let order = z.check_order(order)?;
        let local = z.topo.cpu_to_node(CpuId(cpu as u32));
        if mempolicy::thread_has_policy(z.id) {
            return mempolicy::with_thread_policy(z.id, local, |r| z.alloc_acting(cpu, gfp, order, r));
        }
        if pcp::pcp_allowed(order) {
            if let Some(p) = z.alloc_pcp_fast(cpu, order) {
                return Ok(p);
            }
        }
        z.alloc_acting(cpu, gfp, order, Resolved::Node(local))
    }

    /// [`Zonal::alloc_pages_node`] as this CPU.
    pub fn alloc_pages_node(&self, nid: NodeId, gfp: Gfp, order: u32) -> Result<NonNull<u8>> {
        let z = self.z;
        z.check_forked()?;
        let order = z.check_order(order)?;
        z.check_node(nid)?;
        z.alloc_acting(self.cpu, gfp, order, Resolved::Node(nid))
    }

    /// [`Zonal::free_pages`] as this CPU: the same checks and errors (a failure changes
    /// nothing), and the block goes to this CPU's lists (a frame of a run another CPU owns on
    /// toward that CPU, through this CPU's outbox) or to the buddy.
    pub fn free_pages(&self, addr: *mut u8, order: u32) -> Result<()> {
        self.z.free_locked_on(addr, order, || self.cpu)
    }

    /// [`Zonal::drain_cpu_pages`] of this CPU.
    pub fn drain(&self) -> usize {
        self.z.drain_cpu_pages(self.cpu)
    }
}

impl Zonal {
    /// [`Zonal::alloc_resolved`] for a thread acting as `cpu`: the walk and the slow path with
    /// no pop from a rseq cache (which would be the cache of the CPU the thread runs on).
    fn alloc_acting(&self, cpu: usize, gfp: Gfp, order: Order, r: Resolved<'_>) -> Result<NonNull<u8>> {
        let (_, mut ctx) = self.context(cpu, gfp, &r);
        ctx.rseq = None;
        self.alloc_in(&ctx, order, r)
    }
}
