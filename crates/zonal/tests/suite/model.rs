//! Property tests against a model: random sequences of allocations (every order and a few
//! invalid ones, every node and a few invalid ones, every gfp combination, every policy, per
//! call and per thread) and frees (good ones, and double frees, wrong orders, interior
//! frames, misaligned and foreign addresses), on tiny machines of three or four nodes with
//! `MAX_ORDER` 3 and zones that end in partial blocks.
//!
//! The model is the set of live blocks (`addr -> (order, node)`) plus the thread's policy and
//! interleave cursors. After every step: no two live blocks overlap, `check_invariants()`
//! counts exactly the live frames, every node's free frames are `managed - live`, and every
//! error is exactly the one the arguments call for and changes nothing.
//!
//! Without per-CPU lists the allocator is a pure function of the free lists, so the model
//! predicts the node of every allocation (or its failure) from the zonelist, the watermarks
//! (first pass at `low`, second at `min`, `HIGH` halving the mark, `NO_WATERMARKS` ignoring
//! them) and whether a block of the order is free; and it predicts every zone's buddyinfo
//! exactly: with full coalescing the free lists hold the *canonical* decomposition of the
//! free frames (an aligned block is listed iff it is entirely free and its parent is not).
//! With per-CPU lists the test checks the parts that do not depend on what the lists hold.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;
use zonal::topology::Machine;
use zonal::zone::{Watermark, Zone};
use zonal::{Config, CpuId, Error, Gfp, MemPolicy, NodeId, NodeMask, Order, Pfn, Topology, Zonal, PAGE_SIZE};

const MACHINE: Machine = Machine { nr_cpus: 2, mem_total: 1 << 30 };
const MAX_ORDER: u8 = 3;

/// A tiny machine: its spec, its node count and the node of each of its two CPUs.
struct Shape {
    spec: &'static str,
    nodes: u16,
    cpu_node: [u16; 2],
}

const SHAPES: [Shape; 4] = [
    // 16, 32 and 13 frames; node 2 is memory-only and ends in a partial block (13 = 8+4+1).
    Shape { spec: "nodes=3,sizes=64K:128K:52K,cpus=0:1:", nodes: 3, cpu_node: [0, 1] },
    // Both CPUs on node 0, whose nearest node is 2; node 1 (13 frames) is partial.
    Shape {
        spec: "nodes=3,sizes=96K:52K:256K,cpus=0-1::,distance=10 40 20:40 10 30:20 30 10",
        nodes: 3,
        cpu_node: [0, 0],
    },
    // A line of four nodes, CPUs on the ends; 9 and 25 frames are partial.
    Shape {
        spec: "nodes=4,sizes=36K:64K:100K:128K,cpus=0:::1,distance=10 20 30 40:20 10 20 30:30 20 10 20:40 30 20 10",
        nodes: 4,
        cpu_node: [0, 3],
    },
    // Nodes smaller than one largest block: 1 frame and 3 frames (2+1), then 50 (6*8+2).
    Shape { spec: "nodes=3,sizes=4K:12K:200K,cpus=0:1:", nodes: 3, cpu_node: [0, 1] },
];

/// A node as generated: 0..6 is a valid node (mod the node count), 6 is the first id past
/// the topology, 7 is `u16::MAX`.
type RawNode = u8;

fn node_id(raw: RawNode, nodes: u16) -> u16 {
    match raw {
        0..=5 => raw as u16 % nodes,
        6 => nodes,
        _ => u16::MAX,
    }
}

#[derive(Clone, Debug)]
enum Pol {
    Local,
    Preferred(RawNode),
    Bind(Vec<RawNode>),
    Interleave(Vec<RawNode>),
}

impl Pol {
    fn policy(&self, nodes: u16) -> MemPolicy {
        let mask = |v: &Vec<RawNode>| NodeMask::from_nodes(v.iter().map(|&r| NodeId(node_id(r, nodes))));
        match self {
            Pol::Local => MemPolicy::Local,
            Pol::Preferred(r) => MemPolicy::Preferred(NodeId(node_id(*r, nodes))),
            Pol::Bind(v) => MemPolicy::Bind(mask(v)),
            Pol::Interleave(v) => MemPolicy::Interleave(mask(v)),
        }
    }
}

#[derive(Clone, Debug)]
enum How {
    /// `alloc_pages` under the thread's policy.
    Thread,
    /// `alloc_pages_node`.
    Node(RawNode),
    /// `alloc_pages_policy`.
    Policy(Pol),
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        how: How,
        order: u32,
        gfp: u32,
    },
    /// Free a live block.
    Free(usize),
    /// Free a live block, then free it again.
    DoubleFree(usize),
    /// Free a live block with another order.
    WrongOrder(usize, u32),
    /// Free a frame inside a live block of order > 0, with an order chosen from the pick.
    Interior(usize, usize, u32),
    /// Free a live block's address plus 1..4096 bytes.
    Misaligned(usize, usize),
    /// Free an odd frame of some zone with order 1.
    OddFrame(usize),
    /// Free a frame that no live block covers.
    FreeFree(usize),
    /// Free an address zonal does not own (kind chosen from the pick).
    NotOwned(u8),
    SetPolicy(Pol),
    /// Pin the thread to one of the CPUs it may use.
    Pin(usize),
    Drain,
    /// `alloc_pages_bulk_list` (or the array form with some slots already filled) of `n`.
    Bulk {
        n: usize,
        gfp: u32,
        array: bool,
        prefilled: usize,
    },
    /// `free_pages_bulk` of up to `n` live order-0 frames, with a bad entry at a position.
    BulkFree {
        n: usize,
        bad: Option<(usize, u8)>,
    },
}

fn raw_node() -> impl Strategy<Value = RawNode> {
    prop_oneof![9 => 0u8..6, 1 => 6u8..8]
}

fn pol() -> impl Strategy<Value = Pol> {
    let mask = prop_oneof![9 => proptest::collection::vec(raw_node(), 1..4), 1 => Just(Vec::new())];
    prop_oneof![
        1 => Just(Pol::Local),
        2 => raw_node().prop_map(Pol::Preferred),
        2 => mask.clone().prop_map(Pol::Bind),
        2 => mask.prop_map(Pol::Interleave),
    ]
}

fn order() -> impl Strategy<Value = u32> {
    prop_oneof![
        12 => 0..=MAX_ORDER as u32,
        1 => prop_oneof![Just(MAX_ORDER as u32 + 1), Just(200u32), Just(u32::MAX)],
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let how = prop_oneof![
        2 => Just(How::Thread),
        2 => raw_node().prop_map(How::Node),
        1 => pol().prop_map(How::Policy),
    ];
    prop_oneof![
        10 => (how, order(), 0u32..8).prop_map(|(how, order, gfp)| Op::Alloc { how, order, gfp }),
        6 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::DoubleFree),
        1 => (any::<usize>(), order()).prop_map(|(i, w)| Op::WrongOrder(i, w)),
        1 => (any::<usize>(), any::<usize>(), order()).prop_map(|(i, k, x)| Op::Interior(i, k, x)),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(i, off)| Op::Misaligned(i, off)),
        1 => any::<usize>().prop_map(Op::OddFrame),
        1 => any::<usize>().prop_map(Op::FreeFree),
        1 => (0u8..6).prop_map(Op::NotOwned),
        2 => pol().prop_map(Op::SetPolicy),
        1 => any::<usize>().prop_map(Op::Pin),
        1 => Just(Op::Drain),
        2 => (0usize..12, 0u32..8, any::<bool>(), 0usize..3)
            .prop_map(|(n, gfp, array, prefilled)| Op::Bulk { n, gfp, array, prefilled }),
        2 => (0usize..12, proptest::option::weighted(0.4, (any::<usize>(), 0u8..4)))
            .prop_map(|(n, bad)| Op::BulkFree { n, bad }),
    ]
}

/// The CPUs this thread may run on, and a guard that restores its affinity when dropped.
struct Affinity {
    saved: libc::cpu_set_t,
    cpus: Vec<u32>,
}

impl Affinity {
    fn save() -> Affinity {
        // SAFETY: cpu_set_t is plain data; all-zero is a valid (empty) set.
        let mut saved: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `saved` is a cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut saved) };
        assert_eq!(rc, 0, "sched_getaffinity");
        let cpus = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: c < CPU_SETSIZE, so CPU_ISSET reads within `saved`.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &saved) })
            .map(|c| c as u32)
            .collect();
        Affinity { saved, cpus }
    }
}

impl Drop for Affinity {
    fn drop(&mut self) {
        // SAFETY: `saved` is a valid cpu_set_t of the size passed.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.saved) };
    }
}

/// What a step must leave exactly as it was: every zone's buddyinfo and pcp frames.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    free_blocks: Vec<Vec<usize>>,
    nr_free: Vec<usize>,
    pcp: Vec<usize>,
}

struct Harness {
    z: Zonal,
    shape: &'static Shape,
    pcp: bool,
    base: usize,
    /// Live blocks: address -> (order, node).
    live: BTreeMap<usize, (u8, u16)>,
    thread_policy: MemPolicy,
    /// The thread policy's interleave cursor (`il_prev`), reset by every `set_thread_policy`.
    il_prev: Option<u16>,
    /// The per-call interleave cursor of this thread for this handle.
    call_prev: Option<u16>,
    local: u16,
    aff: Affinity,
}

/// Frames of a zone that no live block covers, by zone-relative index.
fn free_map(z: &Zone, base: usize, live: &BTreeMap<usize, (u8, u16)>) -> Vec<bool> {
    let mut free = vec![true; z.spanned];
    for (&a, &(o, _)) in live {
        let pfn = (a - base) / PAGE_SIZE;
        for p in pfn..pfn + (1 << o) {
            if z.contains(Pfn(p)) {
                free[p - z.start_pfn.0] = false;
            }
        }
    }
    free
}

/// The canonical buddy decomposition of a zone's free frames: counts of free blocks per order.
fn canonical(z: &Zone, free: &[bool]) -> Vec<usize> {
    fn go(z: &Zone, free: &[bool], rel: usize, order: u8, out: &mut Vec<usize>) {
        let n = 1usize << order;
        if rel + n <= z.spanned && free[rel..rel + n].iter().all(|&f| f) {
            out[order as usize] += 1;
        } else if order > 0 && rel < z.spanned {
            go(z, free, rel, order - 1, out);
            go(z, free, rel + n / 2, order - 1, out);
        }
    }
    let mut out = vec![0; MAX_ORDER as usize + 1];
    for rel in (0..z.spanned).step_by(1 << MAX_ORDER) {
        go(z, free, rel, MAX_ORDER, &mut out);
    }
    out
}

/// `__zone_watermark_ok` as zonal documents it: taking a block of `order` must leave more than
/// `mark` free frames, `mark` halved with `HIGH`.
fn above(z: &Zone, order: u8, mark: Watermark, high: bool) -> bool {
    let m = z.watermark(mark);
    let m = if high { m - m / 2 } else { m };
    z.page_state_snapshot(zonal::vmstat::ZoneStatItem::NrFreePages) as isize - ((1isize << order) - 1) > m as isize
}

fn has_block(z: &Zone, order: u8) -> bool {
    z.free_blocks()[order as usize..].iter().any(|&n| n > 0)
}

/// The next node of `mask` after `prev`, wrapping (`next_node_in`).
fn next_in(mask: &NodeMask, prev: Option<u16>) -> u16 {
    let nodes: Vec<u16> = mask.iter().map(|n| n.0).collect();
    *nodes.iter().find(|&&n| prev.is_none_or(|p| n > p)).unwrap_or(&nodes[0])
}

/// The error a policy must be refused with on a topology of `nr` nodes, if any.
fn policy_error(p: &MemPolicy, nr: u16) -> Option<Error> {
    let bad = |n: &NodeId| n.0 >= nr;
    match p {
        MemPolicy::Local => None,
        MemPolicy::Preferred(n) => bad(n).then_some(Error::InvalidNode { node: *n, nr_nodes: nr as usize }),
        MemPolicy::Bind(m) | MemPolicy::Interleave(m) => {
            if m.is_empty() {
                Some(Error::InvalidConfig(String::new()))
            } else {
                m.iter().find(bad).map(|node| Error::InvalidNode { node, nr_nodes: nr as usize })
            }
        }
    }
}

/// Compares errors, any `InvalidConfig` message matching.
fn same_error(got: &Error, want: &Error) -> bool {
    match (got, want) {
        (Error::InvalidConfig(_), Error::InvalidConfig(_)) => true,
        _ => got == want,
    }
}

impl Harness {
    fn new(shape: &'static Shape, min_free_kbytes: Option<u64>, pcp: bool) -> Harness {
        let t = Topology::parse_for(shape.spec, MACHINE).unwrap();
        let mut c = Config::new(t).max_order(MAX_ORDER).pcp(pcp);
        c.min_free_kbytes = min_free_kbytes;
        // No background decay of the per-CPU lists between two reads of one check.
        c.stat_interval = Duration::from_secs(3600);
        let z = Zonal::new(c).unwrap();
        // The model is Linux's walk without the zonelist cache: a stale mark may send an
        // allocation past a zone that has room (by design; zlc.rs beside this file covers the
        // cache).
        z.set_zonelist_cache(false);
        // The arena's base, from any frame's address and number.
        let p = z.alloc_pages_node(NodeId(0), Gfp::THISNODE | Gfp::NO_WATERMARKS, 0).unwrap();
        let base = p.as_ptr() as usize - z.addr_to_pfn(p.as_ptr()).unwrap().0 * PAGE_SIZE;
        z.free_pages(p.as_ptr(), 0).unwrap();
        z.drain_all_pages();
        let aff = Affinity::save();
        let mut h = Harness {
            z,
            shape,
            pcp,
            base,
            live: BTreeMap::new(),
            thread_policy: MemPolicy::Local,
            il_prev: None,
            call_prev: None,
            local: 0,
            aff,
        };
        h.pin(0);
        h
    }

    fn pin(&mut self, pick: usize) {
        let cpu = self.aff.cpus[pick % self.aff.cpus.len()];
        zonal::cpu::set_affinity(cpu).unwrap();
        let nr = self.z.nr_cpus();
        assert_eq!(self.z.current_cpu(), cpu as usize % nr, "pinned to cpu {cpu}");
        self.local = self.shape.cpu_node[cpu as usize % nr];
        assert_eq!(self.z.local_node(), NodeId(self.local));
        assert_eq!(self.z.topology().cpu_to_node(CpuId(cpu % nr as u32)), NodeId(self.local));
    }

    fn nodes(&self) -> u16 {
        self.shape.nodes
    }

    fn zone(&self, node: u16) -> &Zone {
        let ids = self.z.node_zones(NodeId(node)).unwrap();
        assert_eq!(ids.len(), 1, "one zone per node");
        &self.z.zones()[ids[0].0 as usize]
    }

    fn snapshot(&self) -> Snapshot {
        let ns = 0..self.nodes();
        Snapshot {
            free_blocks: self.z.zones().iter().map(|z| z.free_blocks()).collect(),
            nr_free: ns.clone().map(|n| self.z.nr_free_pages(NodeId(n)).unwrap()).collect(),
            pcp: ns.map(|n| self.z.nr_pcp_pages(NodeId(n)).unwrap()).collect(),
        }
    }

    fn pfn(&self, addr: usize) -> Pfn {
        Pfn((addr - self.base) / PAGE_SIZE)
    }

    fn addr(&self, pfn: usize) -> *mut u8 {
        (self.base + pfn * PAGE_SIZE) as *mut u8
    }

    fn pick(&self, i: usize) -> Option<(usize, u8, u16)> {
        if self.live.is_empty() {
            return None;
        }
        let (&a, &(o, n)) = self.live.iter().nth(i % self.live.len())?;
        Some((a, o, n))
    }

    /// Everything that must hold after every step.
    fn check(&self) -> Result<(), TestCaseError> {
        let mut end = 0usize;
        for (&a, &(o, _)) in &self.live {
            prop_assert!(a >= end, "block {:#x} overlaps the block before it", a);
            end = a + (PAGE_SIZE << o);
        }
        let pages: usize = self.live.values().map(|&(o, _)| 1usize << o).sum();
        prop_assert_eq!(self.z.check_invariants(), Ok(pages));
        for n in 0..self.nodes() {
            let zone = self.zone(n);
            let live: usize = self.live.values().filter(|&&(_, ln)| ln == n).map(|&(o, _)| 1usize << o).sum();
            let free = self.z.nr_free_pages(NodeId(n)).unwrap();
            let pcp = self.z.nr_pcp_pages(NodeId(n)).unwrap();
            prop_assert_eq!(free + pcp, zone.managed - live, "node {}: free {} + pcp {}", n, free, pcp);
            if !self.pcp {
                prop_assert_eq!(pcp, 0);
                let want = canonical(zone, &free_map(zone, self.base, &self.live));
                prop_assert_eq!(zone.free_blocks(), want, "node {} buddyinfo", n);
            }
        }
        Ok(())
    }

    /// The preferred node and node mask an allocation resolves to, advancing the interleave
    /// cursor it uses (the arguments are valid).
    fn resolve(&mut self, how: &How) -> (u16, Option<NodeMask>) {
        let bind = |local: u16, m: &NodeMask, z: &Zonal| -> u16 {
            if m.contains(NodeId(local)) {
                return local;
            }
            // The nearest node of the mask, in the local node's fallback order.
            let fallback = &z.zonelists(NodeId(local)).unwrap().fallback;
            fallback.iter().map(|id| z.zones()[id.0 as usize].node.0).find(|&n| m.contains(NodeId(n))).unwrap()
        };
        match how {
            How::Node(raw) => (node_id(*raw, self.nodes()), None),
            How::Thread => match self.thread_policy.clone() {
                MemPolicy::Local => (self.local, None),
                MemPolicy::Preferred(n) => (n.0, None),
                MemPolicy::Bind(m) => (bind(self.local, &m, &self.z), Some(m)),
                MemPolicy::Interleave(m) => {
                    let n = next_in(&m, self.il_prev);
                    self.il_prev = Some(n);
                    (n, None)
                }
            },
            How::Policy(p) => match p.policy(self.nodes()) {
                MemPolicy::Local => (self.local, None),
                MemPolicy::Preferred(n) => (n.0, None),
                MemPolicy::Bind(m) => (bind(self.local, &m, &self.z), Some(m)),
                MemPolicy::Interleave(m) => {
                    let n = next_in(&m, self.call_prev);
                    self.call_prev = Some(n);
                    (n, None)
                }
            },
        }
    }

    fn alloc(&mut self, how: How, order: u32, gfp: Gfp) -> Result<(), TestCaseError> {
        let nodes = self.nodes();
        let bad_order = (order > MAX_ORDER as u32)
            .then_some(Error::InvalidOrder { order, max_order: Order::new(MAX_ORDER).unwrap() });
        let bad_place = match &how {
            How::Thread => None,
            How::Node(raw) => {
                let n = node_id(*raw, nodes);
                (n >= nodes).then_some(Error::InvalidNode { node: NodeId(n), nr_nodes: nodes as usize })
            }
            How::Policy(p) => policy_error(&p.policy(nodes), nodes),
        };
        let call = |z: &Zonal| match &how {
            How::Thread => z.alloc_pages(gfp, order),
            How::Node(raw) => z.alloc_pages_node(NodeId(node_id(*raw, nodes)), gfp, order),
            How::Policy(p) => z.alloc_pages_policy(gfp, order, &p.policy(nodes)),
        };
        if bad_order.is_some() || bad_place.is_some() {
            // Either error may win when both arguments are bad: the API does not rank them.
            let before = self.snapshot();
            let r = call(&self.z);
            let matches = |want: &Option<Error>| matches!((&r, want), (Err(e), Some(w)) if same_error(e, w));
            prop_assert!(
                matches(&bad_order) || matches(&bad_place),
                "{:?} order {}: got {:?}, want {:?} or {:?}",
                how,
                order,
                r,
                bad_order,
                bad_place
            );
            prop_assert_eq!(self.snapshot(), before, "a refused allocation changed something");
            return Ok(());
        }
        let order8 = order as u8;
        let (preferred, mask) = self.resolve(&how);
        let zl = self.z.zonelists(NodeId(preferred)).unwrap();
        let list = if gfp.contains(Gfp::THISNODE) { &zl.nofallback } else { &zl.fallback };
        let allowed: Vec<u16> = list
            .iter()
            .map(|id| self.z.zones()[id.0 as usize].node.0)
            .filter(|&n| mask.as_ref().is_none_or(|m| m.contains(NodeId(n))))
            .collect();
        let high = gfp.contains(Gfp::HIGH);
        // Where the buddy-only allocator must put it: the first allowed zone above `low` with a
        // block of the order, else the first above `min`, else (NO_WATERMARKS) any with one.
        let pick = |mark: Option<Watermark>| {
            allowed.iter().copied().find(|&n| {
                let z = self.zone(n);
                has_block(z, order8) && mark.is_none_or(|m| above(z, order8, m, high))
            })
        };
        let first_pass = pick(Some(Watermark::Low));
        let predicted = first_pass.or_else(|| pick(Some(Watermark::Min))).or_else(|| {
            if gfp.contains(Gfp::NO_WATERMARKS) {
                pick(None)
            } else {
                None
            }
        });
        // With per-CPU lists, the first allowed zone still wins when it is above `low` with a
        // block of the order in its buddy lists (the lists refill from there).
        let first_wins = allowed
            .first()
            .copied()
            .filter(|&n| has_block(self.zone(n), order8) && above(self.zone(n), order8, Watermark::Low, high));
        let before = self.snapshot();
        match call(&self.z) {
            Ok(p) => {
                let addr = p.as_ptr() as usize;
                let pfn = self.pfn(addr);
                prop_assert_eq!(self.z.addr_to_pfn(p.as_ptr()), Ok(pfn));
                prop_assert!(pfn.is_aligned(Order::new(order8).unwrap()), "{:?} not aligned to order {}", pfn, order);
                let node = self.z.page_to_nid(p.as_ptr()).unwrap().0;
                prop_assert!(allowed.contains(&node), "{:?}: node {} outside {:?}", how, node, allowed);
                if gfp.contains(Gfp::THISNODE) {
                    prop_assert_eq!(node, preferred, "THISNODE left the preferred node");
                }
                if let Some(m) = &mask {
                    prop_assert!(m.contains(NodeId(node)), "bind mask {:?} but node {}", m, node);
                }
                if self.pcp {
                    if let Some(f) = first_wins {
                        prop_assert_eq!(node, f, "{:?} {:?}: the preferred zone could serve it", how, gfp);
                    }
                } else {
                    prop_assert_eq!(Some(node), predicted, "{:?} {:?} order {}", how, gfp, order);
                }
                prop_assert!(self.live.insert(addr, (order8, node)).is_none(), "{:#x} handed out twice", addr);
            }
            Err(Error::OutOfMemory { order: o }) => {
                prop_assert_eq!(o, Order::new(order8).unwrap());
                prop_assert_eq!(first_wins, None, "{:?} {:?}: OOM with the first zone able to serve", how, gfp);
                if self.pcp {
                    // The slow path drained every list before giving up; after that no allowed
                    // zone may have a block of the order above the last mark it tried.
                    for n in 0..nodes {
                        prop_assert_eq!(self.z.nr_pcp_pages(NodeId(n)).unwrap(), 0, "node {} lists not drained", n);
                    }
                    for &n in &allowed {
                        let z = self.zone(n);
                        if gfp.contains(Gfp::NO_WATERMARKS) {
                            prop_assert!(!has_block(z, order8), "node {} has a block of order {}", n, order);
                        } else {
                            prop_assert!(
                                !has_block(z, order8) || !above(z, order8, Watermark::Min, high),
                                "node {} could serve order {} above min",
                                n,
                                order
                            );
                        }
                    }
                } else {
                    prop_assert_eq!(predicted, None, "{:?} {:?} order {}: OOM", how, gfp, order);
                    prop_assert_eq!(self.snapshot(), before, "a failed allocation changed something");
                }
            }
            Err(e) => prop_assert!(false, "{:?}: unexpected {:?}", how, e),
        }
        Ok(())
    }

    /// Where the buddy-only bulk allocator puts each of `n` frames: one single-frame
    /// allocation under the thread policy after another, until the first failure. Order 0
    /// needs only the free counts, which the prediction updates as it goes.
    fn predict_bulk(&mut self, n: usize, gfp: Gfp) -> Vec<u16> {
        let mut free: Vec<usize> = (0..self.nodes())
            .map(|n| self.zone(n).page_state_snapshot(zonal::vmstat::ZoneStatItem::NrFreePages))
            .collect();
        let high = gfp.contains(Gfp::HIGH);
        let mut out = Vec::new();
        for _ in 0..n {
            let (preferred, mask) = self.resolve(&How::Thread);
            let zl = self.z.zonelists(NodeId(preferred)).unwrap();
            let list = if gfp.contains(Gfp::THISNODE) { &zl.nofallback } else { &zl.fallback };
            let allowed: Vec<u16> = list
                .iter()
                .map(|id| self.z.zones()[id.0 as usize].node.0)
                .filter(|&n| mask.as_ref().is_none_or(|m| m.contains(NodeId(n))))
                .collect();
            let pick = |mark: Option<Watermark>| {
                allowed.iter().copied().find(|&n| {
                    let m = mark.map_or(0, |w| self.zone(n).watermark(w));
                    let m = if high { m - m / 2 } else { m };
                    free[n as usize] > 0 && (mark.is_none() || free[n as usize] > m)
                })
            };
            let got = pick(Some(Watermark::Low)).or_else(|| pick(Some(Watermark::Min))).or_else(|| {
                if gfp.contains(Gfp::NO_WATERMARKS) {
                    pick(None)
                } else {
                    None
                }
            });
            match got {
                Some(node) => {
                    free[node as usize] -= 1;
                    out.push(node);
                }
                None => break,
            }
        }
        out
    }

    fn bulk(&mut self, n: usize, gfp: Gfp, array: bool, prefilled: usize) -> Result<(), TestCaseError> {
        let prefilled = if array { prefilled.min(n.div_ceil(2)) } else { 0 };
        let want = n - prefilled;
        // Placement constraints that hold for every frame whatever path it takes.
        let (thisnode, mask) = match &self.thread_policy {
            MemPolicy::Interleave(_) => (None, None),
            MemPolicy::Bind(m) => {
                let m = m.clone();
                (Some(self.resolve(&How::Thread).0), Some(m))
            }
            _ => (Some(self.resolve(&How::Thread).0), None),
        };
        let predicted = if self.pcp || want == 0 { None } else { Some(self.predict_bulk(want, gfp)) };
        let got: Vec<usize> = if array {
            let dummy = std::ptr::NonNull::<u8>::dangling();
            let mut slots: Vec<Option<std::ptr::NonNull<u8>>> = vec![None; n];
            for s in slots.iter_mut().step_by(2).take(prefilled) {
                *s = Some(dummy);
            }
            let filled = self.z.alloc_pages_bulk_array(gfp, &mut slots);
            prop_assert_eq!(filled, slots.iter().filter(|s| s.is_some()).count());
            prop_assert_eq!(slots.iter().filter(|s| **s == Some(dummy)).count(), prefilled, "filled slots kept");
            // The filled slots are the first empty ones, in order.
            let empty_before: Vec<usize> = (0..n).filter(|i| !(i % 2 == 0 && i / 2 < prefilled)).collect();
            let new: Vec<usize> =
                slots.iter().enumerate().filter(|(_, s)| s.is_some_and(|p| p != dummy)).map(|(i, _)| i).collect();
            prop_assert_eq!(&new[..], &empty_before[..new.len()]);
            slots.into_iter().flatten().filter(|&p| p != dummy).map(|p| p.as_ptr() as usize).collect()
        } else {
            let mut list = Vec::new();
            let k = self.z.alloc_pages_bulk_list(gfp, n, &mut list);
            prop_assert_eq!(k, list.len());
            list.into_iter().map(|p| p.as_ptr() as usize).collect()
        };
        prop_assert!(got.len() <= want);
        let nodes: Vec<u16> = got.iter().map(|&a| self.z.page_to_nid(a as *const u8).unwrap().0).collect();
        if let Some(p) = predicted {
            prop_assert_eq!(&nodes, &p, "bulk of {} {:?}", want, gfp);
        }
        for (&a, &node) in got.iter().zip(&nodes) {
            if gfp.contains(Gfp::THISNODE) {
                if let Some(t) = thisnode {
                    prop_assert_eq!(node, t, "THISNODE bulk frame on another node");
                }
            }
            if let Some(m) = &mask {
                prop_assert!(m.contains(NodeId(node)), "bind {:?} but node {}", m, node);
            }
            prop_assert!(self.live.insert(a, (0, node)).is_none(), "{:#x} handed out twice", a);
        }
        if self.pcp {
            // The bulk path may take the interleave cursor once per call or once per frame:
            // start it afresh rather than model which.
            self.z.set_thread_policy(self.thread_policy.clone()).unwrap();
            self.il_prev = None;
        }
        Ok(())
    }

    fn bulk_free(&mut self, n: usize, bad: Option<(usize, u8)>) -> Result<(), TestCaseError> {
        let zeros: Vec<usize> = self.live.iter().filter(|(_, &(o, _))| o == 0).map(|(&a, _)| a).take(n).collect();
        let mut ptrs: Vec<*mut u8> = zeros.iter().map(|&a| a as *mut u8).collect();
        let mut on_stack = 0u64;
        let bad = bad.and_then(|(pos, kind)| {
            let pos = pos % (ptrs.len() + 1);
            let (addr, e) = match kind {
                0 => {
                    let a = &mut on_stack as *mut u64 as usize;
                    (a, Error::NotOwned { addr: a })
                }
                // A frame given twice: the second copy is the bad one.
                1 if pos > 0 => (ptrs[pos - 1] as usize, Error::DoubleFree { pfn: self.pfn(ptrs[pos - 1] as usize) }),
                2 if !ptrs.is_empty() => {
                    let a = ptrs[pos % ptrs.len()] as usize + 8;
                    (a, Error::Misaligned { addr: a, order: Order::new(0).unwrap() })
                }
                _ => {
                    let (&a, &(o, _)) = self.live.iter().find(|(_, &(o, _))| o > 0)?;
                    let q = self.pfn(a).0 + (1 << o) - 1;
                    (
                        self.addr(q) as usize,
                        Error::InteriorFrame { pfn: Pfn(q), block: self.pfn(a), order: Order::new(o).unwrap() },
                    )
                }
            };
            ptrs.insert(pos, addr as *mut u8);
            Some((pos, e))
        });
        let r = self.z.free_pages_bulk(&ptrs);
        match bad {
            None => prop_assert_eq!(r, Ok(zeros.len())),
            Some(want) => prop_assert_eq!(r, Err(want), "bulk free of {:?}", ptrs),
        }
        // Every good entry is freed either way.
        for a in zeros {
            self.live.remove(&a);
        }
        Ok(())
    }

    /// A free that must be refused with `want` and change nothing.
    fn refused(&self, addr: *mut u8, order: u32, want: Error) -> Result<(), TestCaseError> {
        let before = self.snapshot();
        let r = self.z.free_pages(addr, order);
        prop_assert_eq!(r, Err(want));
        prop_assert_eq!(self.snapshot(), before, "a refused free changed something");
        Ok(())
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Alloc { how, order, gfp } => self.alloc(how, order, Gfp::from_bits_truncate(gfp))?,
            Op::Free(i) => {
                if let Some((a, o, _)) = self.pick(i) {
                    prop_assert_eq!(self.z.free_pages(a as *mut u8, o as u32), Ok(()));
                    self.live.remove(&a);
                }
            }
            Op::DoubleFree(i) => {
                if let Some((a, o, _)) = self.pick(i) {
                    prop_assert_eq!(self.z.free_pages(a as *mut u8, o as u32), Ok(()));
                    self.live.remove(&a);
                    self.check()?;
                    self.refused(a as *mut u8, o as u32, Error::DoubleFree { pfn: self.pfn(a) })?;
                }
            }
            Op::WrongOrder(i, w) => {
                if let Some((a, o, _)) = self.pick(i) {
                    if w != o as u32 {
                        let pfn = self.pfn(a);
                        let want = if w > MAX_ORDER as u32 {
                            Error::InvalidOrder { order: w, max_order: Order::new(MAX_ORDER).unwrap() }
                        } else if !pfn.is_aligned(Order::new(w as u8).unwrap()) {
                            Error::Misaligned { addr: a, order: Order::new(w as u8).unwrap() }
                        } else {
                            Error::OrderMismatch {
                                pfn,
                                allocated: Order::new(o).unwrap(),
                                freed: Order::new(w as u8).unwrap(),
                            }
                        };
                        self.refused(a as *mut u8, w, want)?;
                    }
                }
            }
            Op::Interior(i, k, x) => {
                if let Some((a, o, _)) = self.pick(i) {
                    if o > 0 {
                        let block = self.pfn(a);
                        let q = Pfn(block.0 + 1 + k % ((1 << o) - 1));
                        let addr = self.addr(q.0);
                        let want = if x > MAX_ORDER as u32 {
                            Error::InvalidOrder { order: x, max_order: Order::new(MAX_ORDER).unwrap() }
                        } else if !q.is_aligned(Order::new(x as u8).unwrap()) {
                            Error::Misaligned { addr: addr as usize, order: Order::new(x as u8).unwrap() }
                        } else {
                            Error::InteriorFrame { pfn: q, block, order: Order::new(o).unwrap() }
                        };
                        self.refused(addr, x, want)?;
                    }
                }
            }
            Op::Misaligned(i, off) => {
                if let Some((a, o, _)) = self.pick(i) {
                    let addr = a + 1 + off % (PAGE_SIZE - 1);
                    self.refused(addr as *mut u8, o as u32, Error::Misaligned { addr, order: Order::new(o).unwrap() })?;
                }
            }
            Op::OddFrame(k) => {
                let z = self.zone((k % self.nodes() as usize) as u16);
                if z.spanned < 2 {
                    // The frame after a one-frame zone lies in the gap before the next block.
                    let addr = self.addr(z.start_pfn.0 + 1);
                    self.refused(addr, 1, Error::NotOwned { addr: addr as usize })?;
                } else {
                    let rel = ((k / self.nodes() as usize) % (z.spanned / 2)) * 2 + 1;
                    let addr = self.addr(z.start_pfn.0 + rel);
                    self.refused(addr, 1, Error::Misaligned { addr: addr as usize, order: Order::new(1).unwrap() })?;
                }
            }
            Op::FreeFree(k) => {
                let z = self.zone((k % self.nodes() as usize) as u16);
                let free: Vec<usize> = free_map(z, self.base, &self.live)
                    .iter()
                    .enumerate()
                    .filter(|(_, &f)| f)
                    .map(|(i, _)| z.start_pfn.0 + i)
                    .collect();
                if !free.is_empty() {
                    let pfn = free[(k / self.nodes() as usize) % free.len()];
                    self.refused(self.addr(pfn), 0, Error::DoubleFree { pfn: Pfn(pfn) })?;
                }
            }
            Op::NotOwned(kind) => {
                let mut on_stack = [0u8; 64];
                let heap = Box::new([0u8; 64]);
                let last = self.zone(self.nodes() - 1);
                let block = 1usize << MAX_ORDER;
                let end_pfn = (last.start_pfn.0 + last.spanned).div_ceil(block) * block;
                // A frame in the gap after a zone that ends in a partial block, if any.
                let gap = (0..self.nodes())
                    .map(|n| self.zone(n))
                    .find(|z| z.spanned % block != 0)
                    .map(|z| z.start_pfn.0 + z.spanned);
                let addr = match kind {
                    0 => on_stack.as_mut_ptr() as usize,
                    1 => 0,
                    2 => self.base - PAGE_SIZE,
                    3 => self.base + end_pfn * PAGE_SIZE,
                    4 => self.base + gap.unwrap_or(end_pfn) * PAGE_SIZE,
                    _ => heap.as_ptr() as usize,
                };
                self.refused(addr as *mut u8, 0, Error::NotOwned { addr })?;
                prop_assert_eq!(self.z.page_to_nid(addr as *const u8), Err(Error::NotOwned { addr }));
            }
            Op::SetPolicy(p) => {
                let policy = p.policy(self.nodes());
                let r = self.z.set_thread_policy(policy.clone());
                match policy_error(&policy, self.nodes()) {
                    Some(want) => {
                        prop_assert!(matches!(&r, Err(e) if same_error(e, &want)), "{:?}: {:?}", p, r);
                    }
                    None => {
                        prop_assert_eq!(r, Ok(()));
                        self.thread_policy = policy;
                        self.il_prev = None;
                    }
                }
                prop_assert_eq!(self.z.thread_policy(), self.thread_policy.clone());
            }
            Op::Pin(pick) => self.pin(pick),
            Op::Bulk { n, gfp, array, prefilled } => self.bulk(n, Gfp::from_bits_truncate(gfp), array, prefilled)?,
            Op::BulkFree { n, bad } => self.bulk_free(n, bad)?,
            Op::Drain => {
                let pcp: usize = (0..self.nodes()).map(|n| self.z.nr_pcp_pages(NodeId(n)).unwrap()).sum();
                prop_assert_eq!(self.z.drain_all_pages(), pcp);
                for n in 0..self.nodes() {
                    prop_assert_eq!(self.z.nr_pcp_pages(NodeId(n)).unwrap(), 0);
                }
            }
        }
        self.check()
    }
}

fn run(shape: usize, min_free_kbytes: Option<u64>, pcp: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut h = Harness::new(&SHAPES[shape], min_free_kbytes, pcp);
    // Right after construction every zone is its canonical decomposition: maximal blocks.
    let initial = h.z.buddyinfo();
    for n in 0..h.nodes() {
        let z = h.zone(n);
        prop_assert_eq!(z.free_blocks(), canonical(z, &vec![true; z.spanned]), "node {} at start", n);
        prop_assert_eq!(h.z.nr_free_pages(NodeId(n)), Ok(z.managed));
    }
    h.check()?;
    for op in ops {
        h.step(op)?;
    }
    let live: Vec<(usize, u8)> = h.live.iter().map(|(&a, &(o, _))| (a, o)).collect();
    for (a, o) in live {
        prop_assert_eq!(h.z.free_pages(a as *mut u8, o as u32), Ok(()));
        h.live.remove(&a);
    }
    h.z.drain_all_pages();
    prop_assert_eq!(h.z.check_invariants(), Ok(0));
    for n in 0..h.nodes() {
        prop_assert_eq!(h.z.nr_free_pages(NodeId(n)), Ok(h.zone(n).managed));
    }
    prop_assert_eq!(h.z.buddyinfo(), initial, "freeing everything restores the maximal blocks");
    Ok(())
}

fn min_free() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![Just(None), Just(Some(4)), Just(Some(16)), Just(Some(48))]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Buddy only: every placement, failure and buddyinfo predicted exactly.
    #[test]
    fn buddy_only_matches_the_model(
        shape in 0..SHAPES.len(),
        mfk in min_free(),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run(shape, mfk, false, ops)?;
    }

    /// With per-CPU lists (and the rseq front cache where the kernel offers it).
    #[test]
    fn with_pcp_keeps_the_model(
        shape in 0..SHAPES.len(),
        mfk in min_free(),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run(shape, mfk, true, ops)?;
    }
}
