//! A sequence of API calls against a model: allocations (single, per node, by policy, bulk
//! array and list), frees (single and bulk), frees that must be refused (twice, with the
//! wrong order, an address zonal does not own, inside a block), policies, drains and
//! tunables, on a tiny two-node allocator (max order 3). After every step the handle's
//! `check_invariants` must hold and count exactly the frames the model holds; no block
//! handed out may overlap another one still held.
#![no_main]
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use std::ptr::NonNull;
use zonal::{Config, Gfp, MemPolicy, NodeId, Topology, Zonal, PAGE_SIZE};

const MAX_ORDER: u8 = 3;

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc { order: u8, high: bool },
    AllocNode { node: u8, order: u8, thisnode: bool },
    AllocPolicy { policy: u8, order: u8 },
    BulkArray { n: u8 },
    BulkList { n: u8 },
    Free { i: u16 },
    FreeBulk { n: u8 },
    FreeTwice { i: u16 },
    FreeWrongOrder { i: u16, delta: u8 },
    FreeInside { i: u16, frame: u8 },
    FreeForeign { off: u32 },
    SetPolicy { policy: u8 },
    Drain,
    DrainCpu { cpu: u8 },
    Sysctl { which: u8, value: u16 },
}

const POLICIES: &[&str] = &["local", "preferred=0", "preferred=1", "bind=0", "bind=1", "bind=0-1", "interleave=0-1"];
const TUNABLES: &[&str] = &[
    "min_free_kbytes",
    "watermark_scale_factor",
    "percpu_pagelist_high_fraction",
    "numa_stats_mode",
    "zonelist_cache",
];

struct Model {
    /// Blocks held: address and order.
    held: Vec<(usize, u32)>,
    /// Blocks given back, for frees that must be refused.
    freed: Vec<(usize, u32)>,
}

impl Model {
    fn take(&mut self, p: NonNull<u8>, order: u32) {
        let a = p.as_ptr() as usize;
        let len = PAGE_SIZE << order;
        assert_eq!(a % len, 0, "a block of order {order} is aligned to its size: {a:#x}");
        for &(b, o) in &self.held {
            let blen = PAGE_SIZE << o;
            assert!(a + len <= b || b + blen <= a, "{a:#x}/{order} overlaps {b:#x}/{o}, still held");
        }
        self.freed.retain(|&(b, o)| a + len <= b || b + (PAGE_SIZE << o) <= a);
        self.held.push((a, order));
    }

    fn give(&mut self, i: usize) -> (usize, u32) {
        let b = self.held.swap_remove(i);
        self.freed.push(b);
        b
    }

    fn frames(&self) -> usize {
        self.held.iter().map(|&(_, o)| 1usize << o).sum()
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let topo = Topology::parse("nodes=2,size=4M").unwrap();
    let z = Zonal::new(Config::new(topo).max_order(MAX_ORDER)).unwrap();
    let mut m = Model { held: Vec::new(), freed: Vec::new() };
    let order = |o: u8| u32::from(o % (MAX_ORDER + 2)); // one past the maximum: refused
    for op in ops.iter().take(256) {
        match *op {
            Op::Alloc { order: o, high } => {
                let gfp = if high { Gfp::HIGH } else { Gfp::empty() };
                match z.alloc_pages(gfp, order(o)) {
                    Ok(p) => m.take(p, order(o)),
                    Err(_) => {}
                }
                if order(o) > u32::from(MAX_ORDER) {
                    assert!(z.alloc_pages(Gfp::empty(), order(o)).is_err(), "an order above the maximum");
                }
            }
            Op::AllocNode { node, order: o, thisnode } => {
                let gfp = if thisnode { Gfp::THISNODE } else { Gfp::empty() };
                let r = z.alloc_pages_node(NodeId(u16::from(node % 3)), gfp, order(o));
                if node % 3 == 2 {
                    assert!(r.is_err(), "an unknown node is refused");
                }
                if let Ok(p) = r {
                    m.take(p, order(o));
                }
            }
            Op::AllocPolicy { policy, order: o } => {
                let pol = MemPolicy::parse(POLICIES[policy as usize % POLICIES.len()], 2).unwrap();
                if let Ok(p) = z.alloc_pages_policy(Gfp::empty(), order(o), &pol) {
                    m.take(p, order(o));
                }
            }
            Op::BulkArray { n } => {
                let mut a = vec![None; usize::from(n % 65)];
                let done = z.alloc_pages_bulk_array(Gfp::empty(), &mut a);
                assert_eq!(done, a.iter().filter(|p| p.is_some()).count(), "the count is the slots filled");
                for p in a.into_iter().flatten() {
                    m.take(p, 0);
                }
            }
            Op::BulkList { n } => {
                let mut l = Vec::new();
                let done = z.alloc_pages_bulk_list(Gfp::empty(), usize::from(n % 65), &mut l);
                assert_eq!(done, l.len());
                for p in l {
                    m.take(p, 0);
                }
            }
            Op::Free { i } => {
                if !m.held.is_empty() {
                    let (a, o) = m.give(usize::from(i) % m.held.len());
                    z.free_pages(a as *mut u8, o).unwrap_or_else(|e| panic!("free {a:#x}/{o}: {e}"));
                }
            }
            Op::FreeBulk { n } => {
                let pages: Vec<usize> = {
                    let mut v = Vec::new();
                    let mut i = 0;
                    while i < m.held.len() && v.len() < usize::from(n % 65) {
                        if m.held[i].1 == 0 {
                            v.push(m.give(i).0);
                        } else {
                            i += 1;
                        }
                    }
                    v
                };
                let ptrs: Vec<*mut u8> = pages.iter().map(|&a| a as *mut u8).collect();
                assert_eq!(z.free_pages_bulk(&ptrs).map_err(|(d, e)| format!("{d}: {e}")), Ok(pages.len()));
            }
            Op::FreeTwice { i } => {
                if !m.freed.is_empty() {
                    let (a, o) = m.freed[usize::from(i) % m.freed.len()];
                    assert!(z.free_pages(a as *mut u8, o).is_err(), "a second free of {a:#x}/{o} is refused");
                }
            }
            Op::FreeWrongOrder { i, delta } => {
                if !m.held.is_empty() {
                    let (a, o) = m.held[usize::from(i) % m.held.len()];
                    let wrong = (o + 1 + u32::from(delta) % u32::from(MAX_ORDER + 1)) % (u32::from(MAX_ORDER) + 2);
                    if wrong != o {
                        assert!(z.free_pages(a as *mut u8, wrong).is_err(), "{a:#x}/{o} freed as order {wrong}");
                    }
                }
            }
            Op::FreeInside { i, frame } => {
                if let Some(&(a, o)) = m.held.get(usize::from(i) % m.held.len().max(1)) {
                    let k = usize::from(frame) % (1 << o);
                    if k != 0 {
                        let inner = a + k * PAGE_SIZE;
                        assert!(z.free_pages(inner as *mut u8, 0).is_err(), "a frame inside {a:#x}/{o} freed alone");
                    }
                }
            }
            Op::FreeForeign { off } => {
                let mine = Box::new([0u8; 64]);
                let addr = (&*mine as *const [u8; 64] as usize).wrapping_add(off as usize);
                // Refused unless it happens to be a block the model holds (then it is not
                // foreign, and freeing it would be a real free).
                if !m.held.iter().any(|&(b, o)| addr >= b && addr < b + (PAGE_SIZE << o)) {
                    assert!(z.free_pages(addr as *mut u8, 0).is_err(), "an address zonal does not own: {addr:#x}");
                }
                assert!(z.free_pages(std::ptr::null_mut(), 0).is_err(), "NULL");
            }
            Op::SetPolicy { policy } => {
                let pol = MemPolicy::parse(POLICIES[policy as usize % POLICIES.len()], 2).unwrap();
                z.set_thread_policy(pol).unwrap();
            }
            Op::Drain => {
                z.drain_all_pages();
            }
            Op::DrainCpu { cpu } => {
                z.drain_cpu_pages(usize::from(cpu % 3));
            }
            Op::Sysctl { which, value } => {
                let name = TUNABLES[which as usize % TUNABLES.len()];
                let _ = z.sysctl_set(name, &value.to_string());
            }
        }
        let allocated = z.check_invariants().unwrap_or_else(|e| panic!("after {op:?}: {e}"));
        assert_eq!(allocated, m.frames(), "after {op:?}: the handle counts what the model holds");
    }
    while let Some(&(a, o)) = m.held.last() {
        m.give(m.held.len() - 1);
        z.free_pages(a as *mut u8, o).unwrap();
    }
    assert_eq!(z.check_invariants().unwrap(), 0);
    let _ = z.set_thread_policy(MemPolicy::parse("local", 2).unwrap());
});
