//! Property tests: random sequences of allocations (all orders, nodes, gfp flags, policies,
//! bulk calls) and frees (good and bad) on tiny configurations, checked after every step
//! against a simple model: no two live blocks overlap, every frame is free, on a per-CPU list
//! or allocated exactly once, the free counts agree, each error is the expected one and
//! changes nothing; at the end, freeing everything returns each zone to maximal blocks.

use proptest::prelude::*;
use std::collections::BTreeMap;
use zonal::topology::Machine;
use zonal::{Config, Error, Gfp, MemPolicy, NodeId, NodeMask, Topology, Zonal};

const M: Machine = Machine { nr_cpus: 2, mem_total: 1 << 30 };
const NODES: u16 = 3;
const MAX_ORDER: u8 = 3;

#[derive(Clone, Debug)]
enum Place {
    Thread,
    Node(u16),
    Policy(Pol),
}

#[derive(Clone, Debug)]
enum Pol {
    Local,
    Preferred(u16),
    Bind(Vec<u16>),
    Interleave(Vec<u16>),
}

impl Pol {
    fn policy(&self) -> MemPolicy {
        let mask = |v: &Vec<u16>| NodeMask::from_nodes(v.iter().map(|&n| NodeId(n)));
        match self {
            Pol::Local => MemPolicy::Local,
            Pol::Preferred(n) => MemPolicy::Preferred(NodeId(*n)),
            Pol::Bind(v) => MemPolicy::Bind(mask(v)),
            Pol::Interleave(v) => MemPolicy::Interleave(mask(v)),
        }
    }
    fn valid(&self) -> bool {
        match self {
            Pol::Local => true,
            Pol::Preferred(n) => *n < NODES,
            Pol::Bind(v) | Pol::Interleave(v) => !v.is_empty() && v.iter().all(|&n| n < NODES),
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        order: u8,
        gfp: u32,
        place: Place,
    },
    Free(usize),
    DoubleFree(usize),
    WrongOrder(usize, u8),
    Interior(usize),
    NotOwned,
    SetPolicy(Pol),
    Bulk(usize, bool),
    BulkFree(usize),
    Drain,
    /// Hold a live block (`Zonal::hold`): plain frees of it are then refused.
    Hold(usize),
    /// Free a held block through its holder (`Zonal::free_held`).
    FreeHeld(usize),
}

fn pol() -> impl Strategy<Value = Pol> {
    let nodes = proptest::collection::vec(0u16..NODES + 1, 0..3);
    prop_oneof![
        Just(Pol::Local),
        (0u16..NODES + 1).prop_map(Pol::Preferred),
        nodes.clone().prop_map(Pol::Bind),
        nodes.prop_map(Pol::Interleave),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let place =
        prop_oneof![Just(Place::Thread), (0u16..NODES + 1).prop_map(Place::Node), pol().prop_map(Place::Policy)];
    prop_oneof![
        6 => (0u8..MAX_ORDER + 2, 0u32..8, place).prop_map(|(order, gfp, place)| Op::Alloc { order, gfp, place }),
        5 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::DoubleFree),
        1 => (any::<usize>(), 0u8..MAX_ORDER + 1).prop_map(|(i, o)| Op::WrongOrder(i, o)),
        1 => any::<usize>().prop_map(Op::Interior),
        1 => Just(Op::NotOwned),
        1 => pol().prop_map(Op::SetPolicy),
        1 => (0usize..12, any::<bool>()).prop_map(|(n, a)| Op::Bulk(n, a)),
        1 => (0usize..12).prop_map(Op::BulkFree),
        1 => Just(Op::Drain),
        1 => any::<usize>().prop_map(Op::Hold),
        1 => any::<usize>().prop_map(Op::FreeHeld),
    ]
}

struct Live {
    blocks: BTreeMap<usize, (u8, u16)>,
    /// The blocks of `blocks` this test holds.
    held: std::collections::BTreeSet<usize>,
}

fn zonal(pcp: bool) -> Zonal {
    // 16, 32 and 13 frames: node 2 ends in a partial block.
    let t = Topology::parse_for("nodes=3,sizes=64K:128K:52K,cpus=0:1:", M).unwrap();
    let mut c = Config::new(t).max_order(MAX_ORDER).pcp(pcp);
    c.min_free_kbytes = Some(8);
    // No background decay between the reads `check` compares (it moves frames from the
    // per-CPU lists to the buddy at any moment).
    c.stat_interval = std::time::Duration::from_secs(3600);
    Zonal::new(c).unwrap()
}

fn managed(z: &Zonal, n: u16) -> usize {
    z.node_zones(NodeId(n)).unwrap().iter().map(|id| z.zones()[id.0 as usize].managed).sum()
}

fn check(z: &Zonal, live: &Live) -> Result<(), TestCaseError> {
    // No overlap: blocks sorted by address must not run into each other.
    let mut end = 0usize;
    for (&a, &(o, _)) in &live.blocks {
        prop_assert!(a >= end, "block at {a:#x} overlaps the one before");
        end = a + (4096 << o);
    }
    let pages: usize = live.blocks.values().map(|(o, _)| 1usize << o).sum();
    prop_assert_eq!(z.check_invariants(), Ok(pages));
    for n in 0..NODES {
        let on_node: usize = live.blocks.values().filter(|(_, nn)| *nn == n).map(|(o, _)| 1usize << o).sum();
        let free = z.nr_free_pages(NodeId(n)).unwrap() + z.nr_pcp_pages(NodeId(n)).unwrap();
        prop_assert_eq!(free, managed(z, n) - on_node, "node {}", n);
    }
    Ok(())
}

fn pick(live: &Live, i: usize) -> Option<(usize, u8, u16)> {
    if live.blocks.is_empty() {
        return None;
    }
    let (&a, &(o, n)) = live.blocks.iter().nth(i % live.blocks.len())?;
    Some((a, o, n))
}

fn run(ops: Vec<Op>, pcp: bool) -> Result<(), TestCaseError> {
    let z = zonal(pcp);
    let initial = z.buddyinfo();
    let mut live = Live { blocks: BTreeMap::new(), held: Default::default() };
    let mut thread_pol = Pol::Local;
    for op in ops {
        match op {
            Op::Alloc { order, gfp, place } => {
                let g = Gfp::from_bits_truncate(gfp);
                let (r, allowed): (_, Vec<u16>) = match &place {
                    Place::Thread => {
                        let allowed = match &thread_pol {
                            Pol::Bind(v) => v.clone(),
                            _ => (0..NODES).collect(),
                        };
                        (z.alloc_pages(g, order as u32), allowed)
                    }
                    Place::Node(n) => {
                        let allowed = if g.contains(Gfp::THISNODE) { vec![*n] } else { (0..NODES).collect() };
                        (z.alloc_pages_node(NodeId(*n), g, order as u32), allowed)
                    }
                    Place::Policy(p) => {
                        let allowed = match p {
                            Pol::Bind(v) => v.clone(),
                            _ => (0..NODES).collect(),
                        };
                        (z.alloc_pages_policy(g, order as u32, &p.policy()), allowed)
                    }
                };
                let bad_node =
                    matches!(place, Place::Node(n) if n >= NODES) || matches!(&place, Place::Policy(p) if !p.valid());
                match r {
                    Ok(p) => {
                        prop_assert!(order <= MAX_ORDER && !bad_node);
                        let addr = p.as_ptr() as usize;
                        let pfn = z.addr_to_pfn(p.as_ptr()).unwrap();
                        prop_assert!(pfn.is_aligned(zonal::Order::new(order).unwrap()));
                        let nid = z.page_to_nid(p.as_ptr()).unwrap().0;
                        prop_assert!(allowed.contains(&nid), "node {nid} outside {allowed:?}");
                        if g.contains(Gfp::THISNODE) && !matches!(place, Place::Thread | Place::Policy(_)) {
                            prop_assert!(matches!(place, Place::Node(n) if n == nid));
                        }
                        live.blocks.insert(addr, (order, nid));
                    }
                    Err(Error::InvalidOrder { .. }) => prop_assert!(order > MAX_ORDER),
                    Err(Error::InvalidNode { .. }) => prop_assert!(bad_node && order <= MAX_ORDER),
                    Err(Error::InvalidConfig(_)) => prop_assert!(bad_node),
                    Err(Error::OutOfMemory { .. }) => {
                        prop_assert!(order <= MAX_ORDER && !bad_node);
                        if g.contains(Gfp::NO_WATERMARKS) && (!g.contains(Gfp::THISNODE) || allowed.len() == 1) {
                            // The slow path drained every CPU's lists: no allowed zone may
                            // have a block of the order left.
                            for &n in &allowed {
                                for o in order..=MAX_ORDER {
                                    prop_assert_eq!(z.nr_free_blocks(NodeId(n), o as u32).unwrap(), 0);
                                }
                            }
                        }
                    }
                    Err(e) => prop_assert!(false, "unexpected {e:?}"),
                }
            }
            Op::Free(i) => {
                if let Some((a, o, _)) = pick(&live, i) {
                    let r = z.free_pages(a as *mut u8, o as u32);
                    if live.held.contains(&a) {
                        // Refused, and nothing changed (`check` below).
                        prop_assert!(matches!(r, Err(Error::Held { .. })), "{r:?}");
                    } else {
                        prop_assert_eq!(r, Ok(()));
                        live.blocks.remove(&a);
                    }
                }
            }
            Op::Hold(i) => {
                if let Some((a, o, _)) = pick(&live, i) {
                    let r = z.hold(a as *mut u8, o as u32);
                    if live.held.insert(a) {
                        prop_assert_eq!(r, Ok(()));
                    } else {
                        prop_assert!(matches!(r, Err(Error::Held { .. })), "{r:?}");
                    }
                }
            }
            Op::FreeHeld(i) => {
                if let Some((a, o, _)) = pick(&live, i) {
                    // SAFETY: this test holds the blocks in `live.held`, and frees each once.
                    let r = unsafe { z.free_held(a as *mut u8, o as u32) };
                    if live.held.remove(&a) {
                        prop_assert_eq!(r, Ok(()));
                        live.blocks.remove(&a);
                        // SAFETY: as above; a second free of the hold is refused.
                        let again = unsafe { z.free_held(a as *mut u8, o as u32) };
                        prop_assert!(matches!(again, Err(Error::DoubleFree { .. })), "{again:?}");
                    } else {
                        prop_assert!(matches!(r, Err(Error::NotHeld { .. })), "{r:?}");
                    }
                }
            }
            Op::DoubleFree(i) => {
                if let Some((a, o, _)) = pick(&live, i).filter(|(a, _, _)| !live.held.contains(a)) {
                    prop_assert_eq!(z.free_pages(a as *mut u8, o as u32), Ok(()));
                    live.blocks.remove(&a);
                    let r = z.free_pages(a as *mut u8, o as u32);
                    prop_assert!(matches!(r, Err(Error::DoubleFree { .. })), "{r:?}");
                }
            }
            Op::WrongOrder(i, w) => {
                if let Some((a, o, _)) = pick(&live, i) {
                    if w != o {
                        let r = z.free_pages(a as *mut u8, w as u32);
                        let aligned = z.addr_to_pfn(a as *const u8).unwrap().is_aligned(zonal::Order::new(w).unwrap());
                        if aligned && live.held.contains(&a) {
                            prop_assert!(matches!(r, Err(Error::Held { .. })), "{r:?}");
                        } else if aligned {
                            prop_assert!(matches!(r, Err(Error::OrderMismatch { .. })), "{r:?}");
                        } else {
                            prop_assert!(matches!(r, Err(Error::Misaligned { .. })), "{r:?}");
                        }
                    }
                }
            }
            Op::Interior(i) => {
                if let Some((a, o, _)) = pick(&live, i) {
                    if o > 0 {
                        let r = z.free_pages((a + 4096) as *mut u8, 0);
                        prop_assert!(matches!(r, Err(Error::InteriorFrame { .. })), "{r:?}");
                    }
                    let r = z.free_pages((a + 1) as *mut u8, 0);
                    prop_assert!(matches!(r, Err(Error::Misaligned { .. })), "{r:?}");
                }
            }
            Op::NotOwned => {
                let mut x = 0u64;
                let r = z.free_pages(&mut x as *mut u64 as *mut u8, 0);
                prop_assert!(matches!(r, Err(Error::NotOwned { .. })), "{r:?}");
            }
            Op::SetPolicy(p) => {
                let r = z.set_thread_policy(p.policy());
                prop_assert_eq!(r.is_ok(), p.valid(), "{:?}", r);
                if p.valid() {
                    thread_pol = p;
                }
            }
            Op::Bulk(n, array) => {
                let got: Vec<usize> = if array {
                    let mut arr = vec![None; n];
                    let filled = z.alloc_pages_bulk_array(Gfp::KERNEL, &mut arr);
                    prop_assert_eq!(filled, arr.iter().filter(|s| s.is_some()).count());
                    arr.into_iter().flatten().map(|p| p.as_ptr() as usize).collect()
                } else {
                    let mut list = Vec::new();
                    let k = z.alloc_pages_bulk_list(Gfp::KERNEL, n, &mut list);
                    prop_assert_eq!(k, list.len());
                    list.into_iter().map(|p| p.as_ptr() as usize).collect()
                };
                prop_assert!(got.len() <= n);
                for a in got {
                    let nid = z.page_to_nid(a as *const u8).unwrap().0;
                    if let Pol::Bind(v) = &thread_pol {
                        prop_assert!(v.contains(&nid));
                    }
                    prop_assert!(live.blocks.insert(a, (0, nid)).is_none(), "frame handed out twice");
                }
            }
            Op::BulkFree(n) => {
                let zeros: Vec<usize> = live
                    .blocks
                    .iter()
                    .filter(|(a, (o, _))| *o == 0 && !live.held.contains(a))
                    .map(|(a, _)| *a)
                    .take(n)
                    .collect();
                let ptrs: Vec<*mut u8> = zeros.iter().map(|&a| a as *mut u8).collect();
                prop_assert_eq!(z.free_pages_bulk(&ptrs), Ok(ptrs.len()));
                for a in zeros {
                    live.blocks.remove(&a);
                }
            }
            Op::Drain => {
                z.drain_all_pages();
                for n in 0..NODES {
                    prop_assert_eq!(z.nr_pcp_pages(NodeId(n)).unwrap(), 0);
                }
            }
        }
        check(&z, &live)?;
    }
    for (&a, &(o, _)) in &live.blocks {
        if live.held.contains(&a) {
            // SAFETY: this test holds the block.
            prop_assert_eq!(unsafe { z.free_held(a as *mut u8, o as u32) }, Ok(()));
        } else {
            prop_assert_eq!(z.free_pages(a as *mut u8, o as u32), Ok(()));
        }
    }
    z.drain_all_pages();
    prop_assert_eq!(z.check_invariants(), Ok(0));
    prop_assert_eq!(z.buddyinfo(), initial, "freeing everything restores maximal blocks");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_with_pcp(ops in proptest::collection::vec(op(), 1..200)) {
        run(ops, true)?;
    }

    #[test]
    fn random_sequences_buddy_only(ops in proptest::collection::vec(op(), 1..200)) {
        run(ops, false)?;
    }
}
