//! Zonelists: for each node, every zone in the order an allocation from that node tries them,
//! nearest node first.
//!
//! Kernel counterpart: `build_zonelists`, `find_next_best_node` (mm/page_alloc.c). The local
//! node comes first; each next node is the unused one that minimises
//! `(distance + (n < node) + PENALTY_FOR_NODE_WITH_CPUS if n has CPUs) * MAX_NUMNODES +
//! node_load[n]`, and the first node of each new distance group gets `node_load[n] += 1`
//! (`node_load` is shared across the nodes' builds), which spreads ties round-robin: two
//! nodes at the same distance from several others are not all sent to the same one first.
//! The penalty puts memory-only nodes before nodes with CPUs at equal distance. Inside a node
//! zones go highest first. A second, "no fallback" list holds only the local node's zones
//! (`ZONELIST_NOFALLBACK`, used by `__GFP_THISNODE`).
//!
//! Built once when the allocator is built; immutable after, so read without locks.
//! Invariant: each fallback list holds every zone exactly once, the local node's first.

use crate::topology::Topology;
use crate::types::{NodeId, ZoneId};

/// `PENALTY_FOR_NODE_WITH_CPUS` in mm/page_alloc.c.
const PENALTY_FOR_NODE_WITH_CPUS: u64 = 1;

/// The two zonelists of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Zonelists {
    /// Every zone, nearest node first (`ZONELIST_FALLBACK`).
    pub fallback: Vec<ZoneId>,
    /// The local node's zones only (`ZONELIST_NOFALLBACK`).
    pub nofallback: Vec<ZoneId>,
}

/// The order in which an allocation from each node visits the nodes.
pub fn node_orders(topo: &Topology) -> Vec<Vec<NodeId>> {
    let n = topo.nr_nodes();
    // node_load persists across nodes, as in build_all_zonelists.
    let mut node_load = vec![0u64; n];
    (0..n)
        .map(|local| {
            let local = NodeId(local as u16);
            let mut used = vec![false; n];
            let mut order = Vec::with_capacity(n);
            let mut prev_distance = None;
            while let Some(next) = find_next_best_node(topo, local, &mut used, &node_load) {
                // The first node of each distance group (not the local node) takes load.
                // Both ids come from 0..nr_nodes; a miss (impossible) would only end a group.
                let d = topo.distance(local, next).unwrap_or(u32::MAX);
                if next != local && prev_distance != Some(d) {
                    node_load[next.0 as usize] += 1;
                }
                prev_distance = Some(d);
                order.push(next);
            }
            order
        })
        .collect()
}

/// The nearest unused node from `node`, marking it used (`find_next_best_node`).
fn find_next_best_node(topo: &Topology, node: NodeId, used: &mut [bool], node_load: &[u64]) -> Option<NodeId> {
    let n = topo.nr_nodes() as u64;
    // Use the local node if we haven't already.
    if !used[node.0 as usize] {
        used[node.0 as usize] = true;
        return Some(node);
    }
    let mut best: Option<(u64, usize)> = None;
    for i in 0..topo.nr_nodes() {
        if used[i] {
            continue;
        }
        let cand = NodeId(i as u16);
        // `node` and `cand` are below nr_nodes; an impossible miss ranks the node last.
        let mut val = topo.distance(node, cand).map_or(u64::from(u32::MAX), u64::from);
        // Penalise nodes numbered below the local one, so ties go to higher ids.
        val += (i < node.0 as usize) as u64;
        if topo.has_cpus(cand).unwrap_or(true) {
            val += PENALTY_FOR_NODE_WITH_CPUS;
        }
        // Slight preference for less loaded nodes.
        val = val * n + node_load[i];
        if best.is_none_or(|(b, _)| val < b) {
            best = Some((val, i));
        }
    }
    let (_, i) = best?;
    used[i] = true;
    Some(NodeId(i as u16))
}

/// Builds every node's zonelists from the node orders and each node's zones (highest first).
pub fn build_zonelists(topo: &Topology, zones_of_node: &[Vec<ZoneId>]) -> Vec<Zonelists> {
    node_orders(topo)
        .into_iter()
        .enumerate()
        .map(|(local, order)| Zonelists {
            fallback: order.iter().flat_map(|n| zones_of_node[n.0 as usize].iter().rev().copied()).collect(),
            nofallback: zones_of_node[local].iter().rev().copied().collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Machine;

    const M: Machine = Machine { nr_cpus: 4, mem_total: 1 << 34 };

    fn orders(spec: &str) -> Vec<Vec<u16>> {
        let t = Topology::parse_for(spec, M).unwrap();
        node_orders(&t).into_iter().map(|o| o.into_iter().map(|n| n.0).collect()).collect()
    }

    #[test]
    fn nearest_first() {
        let o = orders("nodes=4,size=4M,cpus=0:1:2:3,distance=10 20 30 40:20 10 20 30:30 20 10 20:40 30 20 10");
        assert_eq!(o[0], vec![0, 1, 2, 3]);
        assert_eq!(o[3], vec![3, 2, 1, 0]);
        assert_eq!(o[1][0], 1);
        assert_eq!(o[1][3], 3);
    }

    #[test]
    fn memory_only_nodes_come_before_cpu_nodes_at_equal_distance() {
        // Node 1 has CPUs, node 2 is memory-only, both at distance 20 from node 0.
        let o = orders("nodes=3,size=4M,cpus=0-1:2-3:,distance=10 20 20:20 10 20:20 20 10");
        assert_eq!(o[0], vec![0, 2, 1]);
    }

    #[test]
    fn ties_spread_round_robin() {
        // Four nodes all at distance 20 with CPUs: node_load spreads each node's first
        // fallback, so not every node falls back to the same one first.
        let o = orders("nodes=4,size=4M,cpus=0:1:2:3");
        let firsts: Vec<u16> = o.iter().map(|l| l[1]).collect();
        let mut distinct = firsts.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 1, "every node falls back to the same node first: {firsts:?}");
        for (i, l) in o.iter().enumerate() {
            let mut s = l.clone();
            s.sort_unstable();
            assert_eq!(s, vec![0, 1, 2, 3], "node {i}'s list is not a permutation");
            assert_eq!(l[0], i as u16);
        }
    }

    #[test]
    fn lower_ids_lose_ties() {
        // Node 1's two neighbours at equal distance: the higher id goes first.
        let o = orders("nodes=3,size=4M,cpus=0:1:2");
        assert_eq!(o[1][1], 2);
    }

    #[test]
    fn zonelists_hold_every_zone_once() {
        let t = Topology::parse_for("nodes=3,size=4M", M).unwrap();
        let zones: Vec<Vec<ZoneId>> = (0..3).map(|i| vec![ZoneId(i)]).collect();
        let zl = build_zonelists(&t, &zones);
        for (i, z) in zl.iter().enumerate() {
            assert_eq!(z.fallback.len(), 3);
            assert_eq!(z.fallback[0], ZoneId(i as u16));
            assert_eq!(z.nofallback, vec![ZoneId(i as u16)]);
        }
    }
}
