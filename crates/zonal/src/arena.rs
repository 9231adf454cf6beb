//! The memory zonal hands out: one contiguous reservation of address space, with each node's
//! memory mapped into its own range from one memfd for the whole arena (`MAP_SHARED`, file
//! offset = frame number × 4 KiB).
//!
//! Kernel counterpart: the physical memory map a node's `pgdat` spans. Frame numbers
//! ([`Pfn`]) count from the arena's base, so `addr -> pfn` is one subtraction and a shift.
//! Node ranges start on a boundary of the largest block, so buddies never cross nodes; the
//! gap after a node whose size is not a multiple of that block stays reserved and unmapped.
//!
//! Why one memfd and `MAP_SHARED`: NUMA balancing (seed 004) maps frames into regions of
//! their own and moves a page to another node by mapping another frame at the same address
//! (`MAP_FIXED`), so the memory must be a file that can be mapped piecewise. One file, with
//! each frame at the offset of its number, lets the kernel merge the mappings of consecutive
//! frames into one VMA even across nodes (pages of different files never merge); a real
//! node's range of the file is bound to its node with `mbind`, which records the policy per
//! file offset. [`Arena::fd`] and [`Arena::offset_of`] are what that needs.
//!
//! Fork: every node range is `MADV_DONTFORK` (as DPDK marks its memory), so a child made by
//! `fork()` shares no frame with its parent, and the arena is registered with
//! [`crate::fork`], whose child handler maps `PROT_NONE` over the whole reservation in the
//! child and makes the inherited handle refuse every frame-moving call.
//!
//! On a real topology each node's range is bound to its node with `mbind(MPOL_BIND)` before
//! anything touches it; on a fake topology nodes are ranges of whatever memory the machine
//! gives. The allocator never reads or writes a frame's contents: frame metadata lives in
//! the zones' `mem_map`, outside the frames.

use crate::error::Result;
use crate::fork::Registration;
use crate::sys;
use crate::topology::Topology;
use crate::types::{Order, Pfn, PAGE_SHIFT};
use std::ffi::CString;
use std::os::fd::OwnedFd;

/// How the arena's memory is set up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaOptions {
    /// Fault every frame in at start (`MADV_POPULATE_WRITE`), so no first touch pays a fault.
    pub populate: bool,
    /// Lock the memory (`mlock`), which also populates it.
    pub mlock: bool,
    /// Ask for transparent huge pages (`MADV_HUGEPAGE`; shmem THP must be enabled for memfd).
    pub thp: bool,
}

/// One node's memory.
#[derive(Debug)]
pub struct NodeMemory {
    /// First frame of the node.
    pub start_pfn: Pfn,
    /// Frames of memory the node has.
    pub nr_pages: usize,
}

/// The reservation and every node's memory in it.
#[derive(Debug)]
pub struct Arena {
    base: usize,
    span_pages: usize,
    raw: usize,
    raw_len: usize,
    nodes: Vec<NodeMemory>,
    /// The file behind every frame: frame `pfn` at offset `pfn << PAGE_SHIFT` (the gaps
    /// between nodes are holes that are never mapped or written).
    fd: OwnedFd,
    /// The reservation's place in the fork registry, from just after it is made to just
    /// before it is unmapped.
    fork: Registration,
}

impl Arena {
    /// Maps the memory of every node of `topo`, node ranges aligned to blocks of `max_order`.
    pub fn new(topo: &Topology, max_order: Order, opts: ArenaOptions) -> Result<Arena> {
        let block_pages = max_order.pages();
        let mut starts = Vec::with_capacity(topo.nr_nodes());
        let mut span_pages = 0usize;
        for n in topo.nodes() {
            starts.push(span_pages);
            let pages = (n.mem_bytes as usize) >> PAGE_SHIFT;
            span_pages += pages.div_ceil(block_pages) * block_pages;
        }
        let (base, raw, raw_len) = sys::reserve(span_pages << PAGE_SHIFT, max_order.bytes())?;
        let fork = match Registration::new(raw, raw_len) {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: the reservation was just made and nothing uses it.
                unsafe { sys::unmap(raw, raw_len) };
                return Err(e);
            }
        };
        let name = CString::new("zonal-arena").expect("no NUL in a literal");
        // A failure below unmaps the reservation (`Arena`'s drop) and closes the file.
        let fd = match sys::memfd(&name, span_pages << PAGE_SHIFT) {
            Ok(fd) => fd,
            Err(e) => {
                // Out of the fork registry before the range is given back.
                drop(fork);
                // SAFETY: the reservation was just made and nothing uses it.
                unsafe { sys::unmap(raw, raw_len) };
                return Err(e);
            }
        };
        let mut arena = Arena { base, span_pages, raw, raw_len, nodes: Vec::new(), fd, fork };
        for (n, &start) in topo.nodes().iter().zip(&starts) {
            let len = n.mem_bytes as usize;
            let addr = base + (start << PAGE_SHIFT);
            // SAFETY: addr..addr+len lies inside the reservation made above, which nothing
            // else uses; the arena is not yet shared, so no reference points into it.
            unsafe { sys::map_shared_fixed(addr, len, &arena.fd, start << PAGE_SHIFT, false)? };
            // Before anything is handed out: a fork from here on leaves the range behind.
            sys::madvise_dontfork(addr, len)?;
            if let (false, Some(os)) = (topo.is_fake(), n.os_node) {
                sys::mbind_node(addr, len, os)?;
            }
            if opts.thp {
                sys::madvise_hugepage(addr, len)?;
            }
            if opts.populate {
                // SAFETY: the node's range was just mapped from a fresh memfd (zeros), and the
                // arena has handed nothing out yet.
                unsafe { sys::populate(addr, len) };
            }
            if opts.mlock {
                sys::mlock(addr, len)?;
            }
            arena.nodes.push(NodeMemory { start_pfn: Pfn(start), nr_pages: len >> PAGE_SHIFT });
        }
        Ok(arena)
    }

    /// The memfd behind every frame (see [`Arena::offset_of`]).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Offset in [`Arena::fd`] of a frame.
    #[inline]
    pub fn offset_of(&self, pfn: Pfn) -> usize {
        pfn.0 << PAGE_SHIFT
    }

    /// The nodes' memory, by node id.
    pub fn nodes(&self) -> &[NodeMemory] {
        &self.nodes
    }

    /// Frames the arena spans, gaps included.
    pub fn span_pages(&self) -> usize {
        self.span_pages
    }

    /// Address of a frame.
    #[inline]
    pub fn pfn_to_addr(&self, pfn: Pfn) -> usize {
        self.base + (pfn.0 << PAGE_SHIFT)
    }

    /// Frame of an address, if the address lies in the arena's span (gaps included; the
    /// caller checks that a zone owns it). The address need not be frame-aligned.
    #[inline]
    pub fn addr_to_pfn(&self, addr: usize) -> Option<Pfn> {
        let off = addr.wrapping_sub(self.base);
        if off < self.span_pages << PAGE_SHIFT {
            Some(Pfn(off >> PAGE_SHIFT))
        } else {
            None
        }
    }

    /// Start of the arena.
    #[inline(always)]
    pub fn base(&self) -> usize {
        self.base
    }

    /// The arena's place in the fork registry: whether this process is a forked child of
    /// the one that built it, and the handle's table for the child handler.
    #[inline]
    pub(crate) fn fork(&self) -> &Registration {
        &self.fork
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // Out of the fork registry first: once unmapped, the range may become anything's.
        self.fork.retire();
        // SAFETY: the reservation is ours; the allocator that owned the arena is being dropped,
        // so no frame is handed out through it any more (callers' pointers dangle, as with any
        // allocator that is torn down).
        unsafe { sys::unmap(self.raw, self.raw_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Machine;

    #[test]
    fn nodes_are_aligned_and_mapped() {
        let m = Machine { nr_cpus: 2, mem_total: 1 << 30 };
        let t = Topology::parse_for("nodes=2,sizes=6M:4M", m).unwrap();
        let a = Arena::new(&t, Order(10), ArenaOptions { populate: true, ..Default::default() }).unwrap();
        assert_eq!(a.nodes()[0].start_pfn, Pfn(0));
        // 6M rounds up to two 4M blocks, so node 1 starts at 8M.
        assert_eq!(a.nodes()[1].start_pfn, Pfn(2048));
        assert_eq!(a.base() % Order(10).bytes(), 0);
        assert_eq!(a.addr_to_pfn(a.pfn_to_addr(Pfn(2050)) + 17), Some(Pfn(2050)));
        assert_eq!(a.addr_to_pfn(a.base() - 1), None);
        assert_eq!(a.addr_to_pfn(a.base() + (3 << 22)), None);
        assert_eq!(a.offset_of(Pfn(2049)), 2049 << PAGE_SHIFT);
        // One file: a frame read through its offset is the frame.
        let p = a.pfn_to_addr(Pfn(2049)) as *mut u64;
        // SAFETY: frame 2049 lies in node 1's mapped range and nothing else uses this arena.
        unsafe { p.write(0x5eed) };
        let mut buf = [0u8; 8];
        let off = a.offset_of(Pfn(2049)) as libc::off_t;
        // SAFETY: `buf` is valid for 8 bytes; the descriptor is the arena's open memfd.
        let n = unsafe { libc::pread(std::os::fd::AsRawFd::as_raw_fd(a.fd()), buf.as_mut_ptr().cast(), 8, off) };
        assert_eq!(n, 8);
        assert_eq!(u64::from_ne_bytes(buf), 0x5eed);
    }
}
