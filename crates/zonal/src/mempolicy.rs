//! Memory policies: which node an allocation prefers and which nodes it may use.
//!
//! Kernel counterpart: mm/mempolicy.c (`MPOL_DEFAULT`, `MPOL_PREFERRED`, `MPOL_BIND`,
//! `MPOL_INTERLEAVE`, `policy_node`, `policy_nodemask`, `interleave_nodes`).
//!
//! A policy is set per thread (per allocator handle: [`crate::Zonal::set_thread_policy`]) or
//! given per call. The interleave cursor is per thread, as Linux keeps `il_prev` in the task.
//! Thread policies live in a thread-local list keyed by the handle's id, so handles never see
//! each other's policies and a thread without a policy pays one empty-list check.

use crate::error::{Error, Result};
use crate::types::NodeId;
use std::cell::RefCell;
use std::fmt;

/// A set of nodes (`nodemask_t`).
#[derive(Clone, PartialEq, Eq, Default, Hash)]
pub struct NodeMask {
    bits: Vec<u64>,
}

impl NodeMask {
    /// The empty mask.
    pub fn new() -> NodeMask {
        NodeMask::default()
    }

    /// A mask of the given nodes.
    pub fn from_nodes(nodes: impl IntoIterator<Item = NodeId>) -> NodeMask {
        let mut m = NodeMask::new();
        for n in nodes {
            m.set(n);
        }
        m
    }

    /// Adds a node.
    pub fn set(&mut self, n: NodeId) {
        let w = n.0 as usize / 64;
        if self.bits.len() <= w {
            self.bits.resize(w + 1, 0);
        }
        self.bits[w] |= 1 << (n.0 % 64);
    }

    /// Whether a node is in the mask.
    #[inline]
    pub fn contains(&self, n: NodeId) -> bool {
        self.bits.get(n.0 as usize / 64).is_some_and(|w| w & (1 << (n.0 % 64)) != 0)
    }

    /// The nodes in the mask, in order.
    pub fn iter(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.bits
            .iter()
            .enumerate()
            .flat_map(|(w, &b)| (0..64).filter(move |i| b & (1 << i) != 0).map(move |i| NodeId((w * 64 + i) as u16)))
    }

    /// Whether the mask is empty.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&w| w == 0)
    }

    /// The first node in the mask after `n`, wrapping around (`next_node_in`).
    pub fn next_after(&self, n: Option<NodeId>) -> Option<NodeId> {
        let start = n.map_or(0, |n| n.0 as usize + 1);
        self.iter().find(|x| x.0 as usize >= start).or_else(|| self.iter().next())
    }

    /// Parses a node list in cpulist syntax (`0-2,5`).
    /// Bounded by `parse_cpulist`: ids below `MAX_NUMNODES`, and at most that many, checked
    /// before a range is expanded.
    pub fn parse(s: &str) -> Result<NodeMask> {
        let ids = crate::topology::parse_cpulist(s, crate::topology::MAX_NUMNODES)
            .map_err(|e| Error::InvalidConfig(format!("nodemask `{s}`: {e}")))?;
        Ok(NodeMask::from_nodes(ids.into_iter().map(|i| NodeId(i as u16))))
    }
}

impl fmt::Debug for NodeMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter().map(|n| n.0)).finish()
    }
}

impl fmt::Display for NodeMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cpus: Vec<crate::types::CpuId> = self.iter().map(|n| crate::types::CpuId(n.0 as u32)).collect();
        f.write_str(&crate::topology::fmt_cpulist(&cpus))
    }
}

/// A memory policy.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum MemPolicy {
    /// Allocate on the node of the CPU the thread runs on, falling back by distance.
    #[default]
    Local,
    /// Prefer one node, falling back by distance from it.
    Preferred(NodeId),
    /// Only these nodes, nearest to the local node first.
    Bind(NodeMask),
    /// Round-robin over these nodes, one allocation at a time, per thread.
    Interleave(NodeMask),
}

impl MemPolicy {
    /// Checks the policy against a topology of `nr_nodes` nodes.
    pub fn validate(&self, nr_nodes: usize) -> Result<()> {
        let check = |n: NodeId| {
            if (n.0 as usize) < nr_nodes {
                Ok(())
            } else {
                Err(Error::InvalidNode { node: n, nr_nodes })
            }
        };
        match self {
            MemPolicy::Local => Ok(()),
            MemPolicy::Preferred(n) => check(*n),
            MemPolicy::Bind(m) | MemPolicy::Interleave(m) => {
                if m.is_empty() {
                    return Err(Error::InvalidConfig("mempolicy: empty nodemask".into()));
                }
                m.iter().try_for_each(check)
            }
        }
    }

    /// Parses `local`, `preferred=N`, `bind=LIST`, `interleave=LIST` (LIST in cpulist syntax);
    /// `interleave` alone means every node of a topology of `nr_nodes`.
    pub fn parse(s: &str, nr_nodes: usize) -> Result<MemPolicy> {
        let (name, arg) = match s.split_once('=') {
            Some((n, a)) => (n.trim(), Some(a.trim())),
            None => (s.trim(), None),
        };
        let all = || NodeMask::from_nodes((0..nr_nodes).map(|n| NodeId(n as u16)));
        let p = match (name, arg) {
            ("local" | "default", None) => MemPolicy::Local,
            ("preferred", Some(a)) => MemPolicy::Preferred(NodeId(
                a.parse().map_err(|_| Error::InvalidConfig(format!("mempolicy `{s}`: `{a}` is not a node")))?,
            )),
            ("bind", Some(a)) if !a.is_empty() => MemPolicy::Bind(NodeMask::parse(a)?),
            ("interleave", Some(a)) => MemPolicy::Interleave(NodeMask::parse(a)?),
            ("interleave", None) => MemPolicy::Interleave(all()),
            // As set_mempolicy(MPOL_BIND) with no nodes: refused, not read as "all".
            ("bind", None) | ("bind", Some("")) => {
                return Err(Error::InvalidConfig(format!(
                    "mempolicy `{s}`: bind needs the nodes to bind to, e.g. bind=0 or bind=0-1"
                )))
            }
            _ => {
                return Err(Error::InvalidConfig(format!(
                    "mempolicy `{s}`: expected local, preferred=N, bind=NODES or interleave[=NODES]"
                )))
            }
        };
        p.validate(nr_nodes)?;
        Ok(p)
    }
}

/// A thread's policy for one allocator handle, with its interleave cursor (`il_prev`).
#[derive(Debug)]
struct ThreadPolicy {
    handle: u64,
    policy: MemPolicy,
    il_prev: Option<NodeId>,
}

thread_local! {
    static THREAD_POLICIES: RefCell<Vec<ThreadPolicy>> = const { RefCell::new(Vec::new()) };
    /// Bit `handle % 64` is set while this thread has a policy for a handle of that residue:
    /// a const-initialised `Cell` without a destructor, so the fast path's check is one
    /// thread-local load, a mask and a branch, and a policy on one handle leaves the fast
    /// path of every other handle (of another residue) alone. The bits follow the list:
    /// set and clear recompute them, and a handle dropped on another thread is pruned
    /// from this thread's list by the next slow check that finds its bit stale.
    static POLICY_BITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// `DROPS` when this thread last pruned its list of dropped handles' policies.
    static PRUNED_AT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The ids of the live handles: a dropped handle's policies in other threads' lists are
/// pruned against it. Written on handle creation and drop, read only by a prune.
static LIVE: std::sync::Mutex<std::collections::BTreeSet<u64>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());
/// Handles dropped so far: a thread prunes its list only when this moved since its last
/// prune, so a bit shared with a live handle costs one atomic load per slow check.
static DROPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[inline(always)]
fn bit(handle: u64) -> u64 {
    1 << policy_bit(handle)
}

/// The bits of the handles in a thread's list.
fn bits_of(p: &[ThreadPolicy]) -> u64 {
    p.iter().fold(0, |b, t| b | bit(t.handle))
}

/// Whether this thread may have a policy for handle `handle` (one thread-local load and a
/// bit test): false means it has none, true sends the caller to the policy list.
#[inline(always)]
pub(crate) fn thread_has_policy(handle: u64) -> bool {
    thread_has_policy_bit(policy_bit(handle))
}

/// [`thread_has_policy`] for a caller that holds the handle's bit index (`handle % 64`,
/// [`policy_bit`]), as the fast paths do in their key (see `page_alloc::key`), which spares
/// them the handle's id.
#[inline(always)]
pub(crate) fn thread_has_policy_bit(index: u32) -> bool {
    POLICY_BITS.with(|h| h.get()) >> (index % 64) & 1 != 0
}

/// The index of `handle`'s bit in a thread's policy bits.
pub(crate) fn policy_bit(handle: u64) -> u32 {
    (handle % 64) as u32
}

/// Records a new handle as live (see [`forget_handle`]).
pub(crate) fn register_handle(handle: u64) {
    LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(handle);
}

/// Drops this thread's policies of handles that no longer exist, if any handle was dropped
/// since the last prune; called when `handle`'s bit is set but the list has no entry for it.
#[cold]
fn prune_dropped(p: &mut Vec<ThreadPolicy>) {
    let drops = DROPS.load(std::sync::atomic::Ordering::Acquire);
    if PRUNED_AT.with(|c| c.get()) == drops {
        return;
    }
    PRUNED_AT.with(|c| c.set(drops));
    {
        let live = LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        p.retain(|t| live.contains(&t.handle));
    }
    POLICY_BITS.with(|h| h.set(bits_of(p)));
}

/// Sets (or with `Local`, clears) this thread's policy for handle `handle`.
pub(crate) fn set_thread_policy(handle: u64, policy: MemPolicy) {
    THREAD_POLICIES.with(|p| {
        let mut p = p.borrow_mut();
        p.retain(|t| t.handle != handle);
        if policy != MemPolicy::Local {
            p.push(ThreadPolicy { handle, policy, il_prev: None });
        }
        POLICY_BITS.with(|h| h.set(bits_of(&p)));
    });
}

/// This thread's policy for handle `handle`.
pub(crate) fn thread_policy(handle: u64) -> MemPolicy {
    THREAD_POLICIES
        .with(|p| p.borrow().iter().find(|t| t.handle == handle).map_or(MemPolicy::Local, |t| t.policy.clone()))
}

/// Forgets a handle that is going away: its entries in this thread's lists now, and in
/// other threads' lists at their next slow check that finds the handle's bit stale (the
/// handle leaves the live set and `DROPS` moves). Ids are never reused, so until then the
/// entries are inert but for the bit they hold.
pub(crate) fn forget_handle(handle: u64) {
    LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&handle);
    DROPS.fetch_add(1, std::sync::atomic::Ordering::Release);
    let _ = THREAD_POLICIES.try_with(|p| {
        let mut p = p.borrow_mut();
        p.retain(|t| t.handle != handle);
        let _ = POLICY_BITS.try_with(|h| h.set(bits_of(&p)));
    });
    let _ = CALL_CURSORS.try_with(|c| c.borrow_mut().retain(|(h, _)| *h != handle));
}

/// What a policy resolves to for one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolved<'a> {
    /// Use `node`'s zonelist, any zone.
    Node(NodeId),
    /// Use `node`'s zonelist, zones of `mask` only.
    Masked(NodeId, &'a NodeMask),
    /// Interleave chose `node` (counted as an interleave hit if the block lands there).
    Interleave(NodeId),
}

/// Advances an interleave cursor: the next node of `mask` after `prev` (`interleave_nodes`).
pub(crate) fn interleave_next(mask: &NodeMask, prev: &mut Option<NodeId>) -> NodeId {
    let n = mask.next_after(*prev).expect("validated interleave masks are not empty");
    *prev = Some(n);
    n
}

/// Runs `f` with this thread's policy for `handle` (no clone on the path), advancing the
/// thread's interleave cursor when the policy interleaves.
#[inline]
pub(crate) fn with_thread_policy<R>(handle: u64, local: NodeId, f: impl FnOnce(Resolved<'_>) -> R) -> R {
    if !thread_has_policy(handle) {
        return f(Resolved::Node(local));
    }
    THREAD_POLICIES.with(|p| {
        let mut p = p.borrow_mut();
        match p.iter_mut().find(|t| t.handle == handle) {
            None => {
                // The bit is another handle's: a live one of the same residue, or a dropped
                // one this thread still lists.
                prune_dropped(&mut p);
                drop(p);
                f(Resolved::Node(local))
            }
            Some(t) => {
                let ThreadPolicy { policy, il_prev, .. } = t;
                match policy {
                    MemPolicy::Interleave(mask) => {
                        let n = interleave_next(mask, il_prev);
                        f(Resolved::Interleave(n))
                    }
                    other => f(resolve(other, local)),
                }
            }
        }
    })
}

/// The next node of a per-call interleave, from this thread's cursor for `handle` (kept
/// beside the thread policy, which it does not change).
pub(crate) fn interleave_call(handle: u64, mask: &NodeMask) -> NodeId {
    CALL_CURSORS.with(|c| {
        let mut c = c.borrow_mut();
        let slot = match c.iter().position(|(h, _)| *h == handle) {
            Some(i) => i,
            None => {
                c.push((handle, None));
                c.len() - 1
            }
        };
        interleave_next(mask, &mut c[slot].1)
    })
}

thread_local! {
    static CALL_CURSORS: RefCell<Vec<(u64, Option<NodeId>)>> = const { RefCell::new(Vec::new()) };
}

/// Resolves a non-interleave policy against the local node.
pub(crate) fn resolve(policy: &MemPolicy, local: NodeId) -> Resolved<'_> {
    match policy {
        MemPolicy::Local => Resolved::Node(local),
        MemPolicy::Preferred(n) => Resolved::Node(*n),
        MemPolicy::Bind(m) => Resolved::Masked(local, m),
        MemPolicy::Interleave(m) => {
            // A per-call interleave has no thread cursor: callers use `interleave_next` on
            // a cursor of their own; resolving one directly picks the first node.
            Resolved::Interleave(m.next_after(None).unwrap_or(local))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        let m = NodeMask::parse("0,2-3,70").unwrap();
        assert!(m.contains(NodeId(2)) && m.contains(NodeId(70)) && !m.contains(NodeId(1)));
        assert_eq!(m.iter().map(|n| n.0).collect::<Vec<_>>(), vec![0, 2, 3, 70]);
        assert_eq!(m.next_after(Some(NodeId(3))), Some(NodeId(70)));
        assert_eq!(m.next_after(Some(NodeId(70))), Some(NodeId(0)));
        assert_eq!(m.to_string(), "0,2-3,70");
    }

    #[test]
    fn interleave_round_robin() {
        let m = NodeMask::parse("1,3").unwrap();
        let mut prev = None;
        let seq: Vec<u16> = (0..5).map(|_| interleave_next(&m, &mut prev).0).collect();
        assert_eq!(seq, vec![1, 3, 1, 3, 1]);
    }

    #[test]
    fn parse_and_validate() {
        assert_eq!(MemPolicy::parse("local", 2).unwrap(), MemPolicy::Local);
        assert_eq!(MemPolicy::parse("preferred=1", 2).unwrap(), MemPolicy::Preferred(NodeId(1)));
        assert_eq!(MemPolicy::parse("interleave", 3).unwrap(), MemPolicy::Interleave(NodeMask::parse("0-2").unwrap()));
        assert!(matches!(MemPolicy::parse("preferred=2", 2), Err(Error::InvalidNode { .. })));
        assert!(matches!(MemPolicy::parse("bind=0,5", 2), Err(Error::InvalidNode { .. })));
        assert!(matches!(MemPolicy::parse("bind=", 2), Err(Error::InvalidConfig(_))));
        assert!(matches!(MemPolicy::parse("random", 2), Err(Error::InvalidConfig(_))));
    }

    #[test]
    fn thread_policies_are_per_handle() {
        set_thread_policy(7, MemPolicy::Preferred(NodeId(1)));
        assert_eq!(thread_policy(7), MemPolicy::Preferred(NodeId(1)));
        assert_eq!(thread_policy(8), MemPolicy::Local);
        set_thread_policy(7, MemPolicy::Local);
        assert_eq!(thread_policy(7), MemPolicy::Local);
        set_thread_policy(9, MemPolicy::Interleave(NodeMask::parse("0-1").unwrap()));
        let a = with_thread_policy(9, NodeId(0), |r| format!("{r:?}"));
        assert_eq!(a, "Interleave(NodeId(0))");
        let b = with_thread_policy(9, NodeId(0), |r| format!("{r:?}"));
        assert_eq!(b, "Interleave(NodeId(1))");
        forget_handle(9);
        assert_eq!(thread_policy(9), MemPolicy::Local);
    }

    /// A policy on one handle leaves the check of another handle off, and a handle dropped
    /// on another thread stops costing this thread's handle of the same residue the slow
    /// check once a slow check found its bit stale.
    #[test]
    fn the_policy_bits_are_per_handle_and_pruned_after_a_drop() {
        // Ids far above any real handle's, of one residue (64 apart) and of another.
        let (a, b, c) = (1 << 40, (1 << 40) + 64, (1 << 40) + 1);
        for h in [a, b, c] {
            register_handle(h);
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                set_thread_policy(a, MemPolicy::Preferred(NodeId(1)));
                assert!(thread_has_policy(a));
                assert!(thread_has_policy_bit(policy_bit(a)));
                assert!(!thread_has_policy(c), "another residue's check is untouched");
                assert!(!thread_has_policy_bit(policy_bit(c)));
                assert!(thread_has_policy(b), "the same residue shares the bit");
                // B's slow check finds no entry of its own and A still live: nothing pruned.
                assert_eq!(with_thread_policy(b, NodeId(0), |r| format!("{r:?}")), "Node(NodeId(0))");
                assert!(thread_has_policy(b));
                std::thread::scope(|s2| {
                    s2.spawn(|| forget_handle(a));
                });
                // A was dropped on another thread: B's next slow check prunes it.
                assert_eq!(with_thread_policy(b, NodeId(0), |r| format!("{r:?}")), "Node(NodeId(0))");
                assert!(!thread_has_policy(b));
                assert_eq!(thread_policy(a), MemPolicy::Local);
            });
        });
        forget_handle(b);
        forget_handle(c);
    }
}
