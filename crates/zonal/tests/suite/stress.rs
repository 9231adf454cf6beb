//! Multi-threaded stress on fake multi-node machines: more threads than CPUs allocate blocks
//! of random orders from random nodes, gfp flags and policies, free their own, hand some to
//! other threads to free (cross-thread frees), use the bulk calls, and in one variant move
//! between CPUs mid-run, while the background worker decays the per-CPU lists every
//! millisecond. Every block handed out goes into a shared live set (inserted after the
//! allocation returns, removed before the free is called) that asserts no two live blocks
//! ever overlap. At checkpoints all threads stop and the allocator must account for exactly
//! the live frames; at the end everything is freed and every zone is back to its initial
//! maximal blocks. Another test races frees of the same blocks from several threads: exactly
//! one free of each block succeeds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;
use zonal::topology::Machine;
use zonal::{Config, Error, Gfp, MemPolicy, NodeId, NodeMask, Order, Topology, Zonal, PAGE_SIZE};

const MACHINE: Machine = Machine { nr_cpus: 2, mem_total: 1 << 30 };
const MAX_ORDER: u8 = 4;
const THREADS: usize = 4;

/// Four nodes, CPUs on the first two, the last two memory-only; 300K (75 frames) and 1000K
/// (250 frames) end in partial blocks of order 4.
const FOUR_NODES: &str = "nodes=4,sizes=1M:1000K:768K:300K,cpus=0:1::";
/// Two nodes, one CPU each.
const TWO_NODES: &str = "nodes=2,sizes=1M:700K,cpus=0:1";

/// The orders the workers of [`stress`] draw from.
const ORDERS: &[u32] = &[0, 1, 2, 3, 4];

fn zonal(spec: &str, pcp: bool) -> Zonal {
    zonal_max(spec, pcp, MAX_ORDER)
}

fn zonal_max(spec: &str, pcp: bool, max_order: u8) -> Zonal {
    let t = Topology::parse_for(spec, MACHINE).unwrap();
    let z = Zonal::new(Config::new(t).max_order(max_order).pcp(pcp)).unwrap();
    // Decay the per-CPU lists concurrently with the workload.
    z.set_stat_interval(Duration::from_millis(1));
    z
}

/// A xorshift generator: deterministic per thread, no dependencies.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Every live block: address -> (order, node). Asserts on insert that the block overlaps
/// no other live block.
struct LiveSet(Mutex<BTreeMap<usize, (u32, u16)>>);

impl LiveSet {
    fn new() -> LiveSet {
        LiveSet(Mutex::new(BTreeMap::new()))
    }

    fn insert(&self, addr: usize, order: u32, node: u16) {
        let len = PAGE_SIZE << order;
        let mut m = self.0.lock().unwrap();
        if let Some((&a, &(o, _))) = m.range(..=addr).next_back() {
            assert!(a + (PAGE_SIZE << o) <= addr, "block {addr:#x} (order {order}) overlaps live block {a:#x}");
        }
        if let Some((&a, _)) = m.range(addr..).next() {
            assert!(addr + len <= a, "block {addr:#x} (order {order}) overlaps live block {a:#x}");
        }
        m.insert(addr, (order, node));
    }

    fn remove(&self, addr: usize, order: u32) {
        let got = self.0.lock().unwrap().remove(&addr);
        assert_eq!(got.map(|(o, _)| o), Some(order), "freeing {addr:#x} that is not live with order {order}");
    }

    /// Live frames per node.
    fn pages_by_node(&self, nodes: usize) -> Vec<usize> {
        let mut v = vec![0; nodes];
        for &(o, n) in self.0.lock().unwrap().values() {
            v[n as usize] += 1 << o;
        }
        v
    }
}

/// A barrier that a panicking thread breaks, so that the others fail instead of waiting
/// forever for it (std's `Barrier` would hang the test).
struct Barrier {
    n: usize,
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
}

/// Breaks its barrier when dropped during a panic.
struct BreakOnPanic<'a>(&'a Barrier);

impl Drop for BreakOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).2 = true;
            self.0.cv.notify_all();
        }
    }
}

impl Barrier {
    fn new(n: usize) -> Barrier {
        Barrier { n, state: Mutex::new((0, 0, false)), cv: Condvar::new() }
    }

    /// Waits for all `n` threads; true in exactly one of them (the last to arrive).
    fn wait(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        assert!(!s.2, "another thread panicked");
        s.0 += 1;
        if s.0 == self.n {
            s.0 = 0;
            s.1 += 1;
            self.cv.notify_all();
            return true;
        }
        let generation = s.1;
        while s.1 == generation && !s.2 {
            s = self.cv.wait(s).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        assert!(!s.2, "another thread panicked");
        false
    }
}

fn managed(z: &Zonal, n: usize) -> usize {
    z.node_zones(NodeId(n as u16)).unwrap().iter().map(|id| z.zones()[id.0 as usize].managed).sum()
}

/// With every thread stopped: empty the per-CPU lists (so the decaying worker has nothing
/// to move), then the allocator must account for exactly the live frames, node by node.
fn checkpoint(z: &Zonal, live: &LiveSet) {
    z.drain_all_pages();
    let by_node = live.pages_by_node(z.topology().nr_nodes());
    assert_eq!(z.check_invariants(), Ok(by_node.iter().sum::<usize>()));
    for (n, &pages) in by_node.iter().enumerate() {
        assert_eq!(z.nr_pcp_pages(NodeId(n as u16)), Ok(0));
        assert_eq!(z.nr_free_pages(NodeId(n as u16)), Ok(managed(z, n) - pages), "node {n}");
    }
}

/// The CPUs this process may run on (`0..nproc` on the CI machines).
fn allowed_cpus() -> Vec<u32> {
    // SAFETY: cpu_set_t is plain data; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0);
    // SAFETY: c < CPU_SETSIZE, so CPU_ISSET reads within `set`.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).map(|c| c as u32).collect()
}

fn random_mask(rng: &mut Rng, nodes: usize) -> NodeMask {
    let mut m = NodeMask::from_nodes([NodeId(rng.below(nodes) as u16)]);
    for n in 0..nodes {
        if rng.below(3) == 0 {
            m.set(NodeId(n as u16));
        }
    }
    m
}

fn random_policy(rng: &mut Rng, nodes: usize) -> MemPolicy {
    match rng.below(4) {
        0 => MemPolicy::Local,
        1 => MemPolicy::Preferred(NodeId(rng.below(nodes) as u16)),
        2 => MemPolicy::Bind(random_mask(rng, nodes)),
        _ => MemPolicy::Interleave(random_mask(rng, nodes)),
    }
}

fn random_gfp(rng: &mut Rng) -> Gfp {
    // Mostly plain allocations; now and then reserves, this node only, or no watermarks.
    match rng.below(8) {
        0 => Gfp::THISNODE,
        1 => Gfp::HIGH,
        2 => Gfp::THISNODE | Gfp::NO_WATERMARKS,
        3 => Gfp::HIGH | Gfp::THISNODE,
        _ => Gfp::KERNEL,
    }
}

struct Run {
    iters: usize,
    checkpoint_every: usize,
    move_cpus: bool,
    /// The orders allocations draw from.
    orders: &'static [u32],
}

/// One worker thread's loop. Returns the blocks it still holds.
fn worker(
    t: usize,
    z: &Zonal,
    live: &LiveSet,
    mailbox: &Mutex<Vec<(usize, u32)>>,
    barrier: &Barrier,
    run: &Run,
) -> Vec<(usize, u32)> {
    let _guard = BreakOnPanic(barrier);
    let nodes = z.topology().nr_nodes();
    let cpus = allowed_cpus();
    let mut rng = Rng::new(t as u64 + 1);
    let mut mine: Vec<(usize, u32)> = Vec::new();
    let mut policy = random_policy(&mut rng, nodes);
    z.set_thread_policy(policy.clone()).unwrap();
    for i in 0..run.iters {
        if i % run.checkpoint_every == 0 {
            // Every thread reaches the same iteration numbers, so all meet here; one checks.
            if barrier.wait() {
                checkpoint(z, live);
            }
            barrier.wait();
        }
        if run.move_cpus && rng.below(64) == 0 {
            zonal::cpu::set_affinity(cpus[rng.below(cpus.len())]).unwrap();
        }
        // Hold a bounded number of blocks so that memory neither fills for good nor stays empty.
        let choice = if mine.len() > 40 { 6 + rng.below(10) } else { rng.below(16) };
        match choice {
            0..=5 => {
                let order = run.orders[rng.below(run.orders.len())];
                let gfp = random_gfp(&mut rng);
                let (r, thisnode, mask) = match rng.below(3) {
                    0 => {
                        let mask = match &policy {
                            MemPolicy::Bind(m) => Some(m.clone()),
                            _ => None,
                        };
                        (z.alloc_pages(gfp, order), None, mask)
                    }
                    1 => {
                        let n = NodeId(rng.below(nodes) as u16);
                        (z.alloc_pages_node(n, gfp, order), gfp.contains(Gfp::THISNODE).then_some(n), None)
                    }
                    _ => {
                        let p = random_policy(&mut rng, nodes);
                        let mask = match &p {
                            MemPolicy::Bind(m) => Some(m.clone()),
                            _ => None,
                        };
                        (z.alloc_pages_policy(gfp, order, &p), None, mask)
                    }
                };
                match r {
                    Ok(p) => {
                        let node = z.page_to_nid(p.as_ptr()).unwrap();
                        let addr = p.as_ptr() as usize;
                        assert!(z.addr_to_pfn(p.as_ptr()).unwrap().is_aligned(Order::new(order as u8).unwrap()));
                        if let Some(n) = thisnode {
                            assert_eq!(node, n, "THISNODE allocation on another node");
                        }
                        if let Some(m) = mask {
                            assert!(m.contains(node), "bind {m:?} but {node}");
                        }
                        live.insert(addr, order, node.0);
                        mine.push((addr, order));
                    }
                    Err(Error::OutOfMemory { order: o }) => assert_eq!(o, Order::new(order as u8).unwrap()),
                    Err(e) => panic!("thread {t}: unexpected {e:?}"),
                }
            }
            6..=8 => {
                if !mine.is_empty() {
                    let (a, o) = mine.swap_remove(rng.below(mine.len()));
                    live.remove(a, o);
                    assert_eq!(z.free_pages(a as *mut u8, o), Ok(()));
                }
            }
            9..=10 => {
                if let Some(b) = mine.pop() {
                    mailbox.lock().unwrap().push(b);
                }
            }
            11..=12 => {
                let got = mailbox.lock().unwrap().pop();
                if let Some((a, o)) = got {
                    live.remove(a, o);
                    assert_eq!(z.free_pages(a as *mut u8, o), Ok(()), "cross-thread free of {a:#x}");
                }
            }
            13 => {
                let mut list = Vec::new();
                let n = 1 + rng.below(16);
                let got = z.alloc_pages_bulk_list(Gfp::KERNEL, n, &mut list);
                assert_eq!(got, list.len());
                assert!(got <= n);
                for p in list {
                    let node = z.page_to_nid(p.as_ptr()).unwrap();
                    live.insert(p.as_ptr() as usize, 0, node.0);
                    mine.push((p.as_ptr() as usize, 0));
                }
            }
            14 => {
                let zeros: Vec<usize> = mine.iter().filter(|b| b.1 == 0).map(|b| b.0).take(rng.below(16)).collect();
                mine.retain(|b| !zeros.contains(&b.0));
                for &a in &zeros {
                    live.remove(a, 0);
                }
                let ptrs: Vec<*mut u8> = zeros.iter().map(|&a| a as *mut u8).collect();
                assert_eq!(z.free_pages_bulk(&ptrs), Ok(ptrs.len()));
            }
            _ => {
                policy = random_policy(&mut rng, nodes);
                z.set_thread_policy(policy.clone()).unwrap();
            }
        }
    }
    mine
}

fn stress(spec: &str, pcp: bool, move_cpus: bool) {
    stress_orders(spec, pcp, move_cpus, MAX_ORDER, ORDERS);
}

fn stress_orders(spec: &str, pcp: bool, move_cpus: bool, max_order: u8, orders: &'static [u32]) {
    let z = zonal_max(spec, pcp, max_order);
    // Count NUMA events too, so that their path runs concurrently with everything else.
    z.set_numa_stats_mode("strict").unwrap();
    let initial = z.buddyinfo();
    let live = LiveSet::new();
    let mailbox = Mutex::new(Vec::new());
    let barrier = Barrier::new(THREADS);
    let run = Run { iters: 120_000, checkpoint_every: 10_000, move_cpus, orders };
    let left: Vec<(usize, u32)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (z, live, mailbox, barrier, run) = (&z, &live, &mailbox, &barrier, &run);
                s.spawn(move || worker(t, z, live, mailbox, barrier, run))
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    checkpoint(&z, &live);
    // Free the rest from this thread: blocks allocated by the workers and the mailbox's.
    let mailbox = mailbox.into_inner().unwrap();
    assert!(!left.is_empty() || !mailbox.is_empty(), "the run should end with blocks still live");
    for (a, o) in left.into_iter().chain(mailbox) {
        live.remove(a, o);
        assert_eq!(z.free_pages(a as *mut u8, o), Ok(()));
    }
    assert!(live.0.lock().unwrap().is_empty());
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
    for n in 0..z.topology().nr_nodes() {
        assert_eq!(z.nr_free_pages(NodeId(n as u16)), Ok(managed(&z, n)), "node {n}");
    }
    assert_eq!(z.buddyinfo(), initial, "every zone is back to its maximal blocks");
}

#[test]
fn cross_thread_frees_four_nodes_pcp() {
    stress(FOUR_NODES, true, false);
}

#[test]
fn cross_thread_frees_four_nodes_buddy_only() {
    stress(FOUR_NODES, false, false);
}

#[test]
fn cross_thread_frees_two_nodes_pcp() {
    stress(TWO_NODES, true, false);
}

/// Pageblock-order blocks on the per-CPU THP list, beside the small orders, allocated and
/// freed across threads and CPUs on zones that hold few of them (so the list is refilled,
/// drained past its bound, drained below the high watermark and by the slow path).
#[test]
fn thp_blocks_cross_threads_and_cpus_pcp() {
    stress_orders("nodes=2,sizes=12M:10M,cpus=0:1", true, true, 10, &[0, 0, 1, 3, 9, 9]);
}

/// One zone that both CPUs share (issue 38): an order-0 frame freed on the CPU that does
/// not own its run goes to that CPU's outbox, then to its owner's inbox (past it, to the
/// transfer list or the buddy), and the owner's refills take it back, while threads move
/// between CPUs, bulk calls free runs of mixed owners and the worker decays every
/// millisecond (delivering outboxes, returning inboxes). Zones small enough that refills take
/// partial runs too, so runs change owners all the time.
#[test]
fn cross_cpu_frees_on_one_shared_zone_pcp() {
    stress_orders("nodes=1,size=2M", true, true, 10, &[0, 0, 0, 1, 3]);
    stress_orders("nodes=1,size=64M", true, true, 10, &[0, 0, 0, 0, 2]);
}

#[test]
fn threads_moving_between_cpus_pcp() {
    stress(FOUR_NODES, true, true);
}

#[test]
fn threads_moving_between_cpus_buddy_only() {
    stress(TWO_NODES, false, true);
}

/// Rounds of: this thread allocates a set of blocks; then the racers, released together by a
/// barrier, all free every block of the set. The first three free with the right order: exactly
/// one of them succeeds per block, the others get `DoubleFree`. The fourth frees an interior
/// frame of each block of order > 0 (and the head with a wrong order for order 0): it never
/// succeeds, whether it comes before or after the real free.
fn racing_frees(spec: &str, pcp: bool) {
    const RACERS: usize = 4;
    const ROUNDS: usize = 1000;
    const BLOCKS: usize = 12;
    let z = zonal(spec, pcp);
    // Racing frees of one frame are a data race in the caller; the CAS claim arbitrates them.
    z.sysctl_set("free_check", "atomic").unwrap();
    let initial = z.buddyinfo();
    let nodes = z.topology().nr_nodes();
    let round: Mutex<Vec<(usize, u32)>> = Mutex::new(Vec::new());
    let wins: Vec<AtomicUsize> = (0..BLOCKS).map(|_| AtomicUsize::new(0)).collect();
    let barrier = Barrier::new(RACERS + 1);
    let cpus = allowed_cpus();
    std::thread::scope(|s| {
        for r in 0..RACERS {
            let (z, round, wins, barrier, cpus) = (&z, &round, &wins, &barrier, &cpus);
            s.spawn(move || {
                let _guard = BreakOnPanic(barrier);
                let mut rng = Rng::new(100 + r as u64);
                for _ in 0..ROUNDS {
                    barrier.wait();
                    let blocks = round.lock().unwrap().clone();
                    // Each racer in its own order, so that the races differ block by block.
                    let mut idx: Vec<usize> = (0..blocks.len()).collect();
                    for i in (1..idx.len()).rev() {
                        idx.swap(i, rng.below(i + 1));
                    }
                    if rng.below(8) == 0 {
                        zonal::cpu::set_affinity(cpus[rng.below(cpus.len())]).unwrap();
                    }
                    for i in idx {
                        let (a, o) = blocks[i];
                        let pfn = z.addr_to_pfn(a as *const u8).unwrap();
                        if r < RACERS - 1 {
                            match z.free_pages(a as *mut u8, o) {
                                Ok(()) => {
                                    wins[i].fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => assert_eq!(e, Error::DoubleFree { pfn }, "racer {r}"),
                            }
                        } else if o > 0 {
                            let q = pfn.0 + 1 + rng.below((1 << o) - 1);
                            let qa = a + (q - pfn.0) * PAGE_SIZE;
                            let e = z.free_pages(qa as *mut u8, 0).unwrap_err();
                            let interior = Error::InteriorFrame {
                                pfn: zonal::Pfn(q),
                                block: pfn,
                                order: Order::new(o as u8).unwrap(),
                            };
                            assert!(e == interior || e == Error::DoubleFree { pfn: zonal::Pfn(q) }, "{e:?}");
                        } else {
                            let e = z.free_pages(a as *mut u8, 1).unwrap_err();
                            let ok = matches!(e, Error::Misaligned { .. })
                                || e == Error::OrderMismatch {
                                    pfn,
                                    allocated: Order::new(0).unwrap(),
                                    freed: Order::new(1).unwrap(),
                                }
                                || e == Error::DoubleFree { pfn };
                            assert!(ok, "{e:?}");
                        }
                    }
                    barrier.wait();
                }
            });
        }
        let _guard = BreakOnPanic(&barrier);
        let mut rng = Rng::new(7);
        for _ in 0..ROUNDS {
            let mut blocks = Vec::new();
            while blocks.len() < BLOCKS {
                let order = rng.below(MAX_ORDER as usize + 1) as u32;
                let n = NodeId(rng.below(nodes) as u16);
                if let Ok(p) = z.alloc_pages_node(n, Gfp::KERNEL, order) {
                    blocks.push((p.as_ptr() as usize, order));
                }
            }
            let pages: usize = blocks.iter().map(|b| 1usize << b.1).sum();
            z.drain_all_pages();
            assert_eq!(z.check_invariants(), Ok(pages));
            *round.lock().unwrap() = blocks;
            for w in &wins {
                w.store(0, Ordering::Relaxed);
            }
            barrier.wait();
            // The racers free everything here.
            barrier.wait();
            for (i, w) in wins.iter().enumerate() {
                assert_eq!(w.load(Ordering::Relaxed), 1, "block {i}: one free must succeed, and only one");
            }
            z.drain_all_pages();
            assert_eq!(z.check_invariants(), Ok(0));
        }
    });
    assert_eq!(z.buddyinfo(), initial);
    for n in 0..nodes {
        assert_eq!(z.nr_free_pages(NodeId(n as u16)), Ok(managed(&z, n)));
    }
}

#[test]
fn racing_double_frees_exactly_one_wins_pcp() {
    racing_frees(FOUR_NODES, true);
}

#[test]
fn racing_double_frees_exactly_one_wins_buddy_only() {
    racing_frees(TWO_NODES, false);
}

/// Once allocation stops the snapshots are exact, folds or not. A fold moves a CPU's diff into
/// the zone's counter in two steps (the diff taken, then added), each under the zone lock; a
/// reader that takes no allocator lock must never see the diff gone and the counter not yet
/// moved. Each round leaves unfolded diffs on the CPUs (a few frames allocated from each),
/// then one thread folds them while this one reads the snapshots without pause.
#[test]
fn snapshots_stay_exact_while_the_counters_fold() {
    const ROUNDS: usize = 3000;
    let z = zonal(TWO_NODES, false);
    let node = NodeId(0);
    let zone = z.node_zones(node).unwrap()[0];
    let managed = managed(&z, 0);
    let cpus = allowed_cpus();
    let barrier = Barrier::new(2);
    let folded = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let (z, barrier, folded) = (&z, &barrier, &folded);
        s.spawn(move || {
            let _guard = BreakOnPanic(barrier);
            for _ in 0..ROUNDS {
                barrier.wait();
                z.refresh_vm_stats();
                folded.store(true, Ordering::Release);
                barrier.wait();
            }
        });
        let _guard = BreakOnPanic(barrier);
        let mut rng = Rng::new(7);
        for round in 0..ROUNDS {
            // Diffs of different sizes and signs on each CPU: allocations on one, frees of
            // some of them on another.
            let mut held = Vec::new();
            for &cpu in &cpus {
                zonal::cpu::set_affinity(cpu).unwrap();
                for _ in 0..1 + rng.below(6) {
                    held.push(z.alloc_pages_node(node, Gfp::THISNODE, 0).unwrap());
                }
                if held.len() > 2 && rng.below(2) == 0 {
                    z.free_pages(held.pop().unwrap().as_ptr(), 0).unwrap();
                }
            }
            let want = managed - held.len();
            folded.store(false, Ordering::Relaxed);
            barrier.wait();
            let mut reads = 0;
            loop {
                let done = folded.load(Ordering::Acquire);
                assert_eq!(z.nr_free_pages(node), Ok(want), "round {round}, read {reads}");
                let zone_free = z.zone_page_state_snapshot(zone, zonal::ZoneStatItem::NrFreePages);
                assert_eq!(zone_free, Ok(want), "round {round}, read {reads}");
                reads += 1;
                if done {
                    break;
                }
            }
            barrier.wait();
            for p in held {
                z.free_pages(p.as_ptr(), 0).unwrap();
            }
        }
    });
    z.drain_all_pages();
    assert_eq!(z.check_invariants(), Ok(0));
}
