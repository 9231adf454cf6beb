//! `mixed`: mixed traffic on one zone (issue 38). Every CPU on one node; T threads, thread `t`
//! bound to CPU `t % nproc`, each keeping a steady population of [`LIVE`] order-0 frames:
//! every step allocates a frame, and once the population is full gives up its oldest, freeing
//! it itself on one step and handing it to the next thread (`t + 1`, through a bounded queue,
//! [`HAND_BATCH`] frames at a time) on the next; every thread frees what its previous
//! thread hands it as it arrives, looking for it every [`HAND_BATCH`] steps. So half the
//! frees are local and half cross CPUs, and frames are not all freed at once, as in a server
//! whose network receive and application run on different CPUs. ns per page (an allocation
//! and, somewhere, its free) per thread, beside the peers, the ideal per-thread stack and the
//! tcmalloc child's per-CPU caches; targets: zonal's figure over mimalloc at most tcmalloc
//! per-CPU's over its own mimalloc (at the end of the report), and the per-thread rate at
//! T = 2 at least 90% of T = 1.
//!
//! The controls of that rate, in the same repetitions: the ideal stack, which shares
//! nothing, in the same pattern (what handing frames across CPUs costs the experiment
//! itself), and zonal and the ideal stack at T = 2 with each thread handing its batches to
//! itself ([`Hand::Own`]: the same steps, queue and batches, and no frame crossing CPUs).

use super::page_api::{peer_names, IdealStack, PageAlloc, ZonalPages, IDEAL};
use super::paired_ratio;
use super::parallel::{figure, on_bound_threads, sweep, table, Cell, ONE_NODE};
use super::{print_table, BenchOpts, Record};
use crossbeam_queue::ArrayQueue;
use serde_json::json;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use zonal::Zonal;

/// The frames each thread keeps allocated.
pub const LIVE: usize = 4096;

/// The bound of the queue into each thread (as `cross`'s).
const QUEUE: usize = 256;

/// The per-thread rate at T = 2 that the target asks for, as a share of T = 1's.
pub const SCALING_TARGET: f64 = 0.90;

/// The reference of the table's ratios (as `single`'s, so the target line at the end of the
/// report compares zonal's ratio to tcmalloc per-CPU's over the child's own mimalloc).
pub const REFERENCE: &str = "mimalloc";

/// The frames one hand-off carries: a thread gathers the frames it gives up for the next
/// thread and passes them together, as a server's receive path hands a batch of buffers (a
/// NAPI poll's budget is 64) rather than one at a time.
pub const HAND_BATCH: usize = 64;

/// One hand-off.
type Batch = [usize; HAND_BATCH];

/// Where a thread hands the frames it does not free itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hand {
    /// To the next thread (`t + 1`), on another CPU: the experiment.
    Next,
    /// To itself, through its own queue: the control in which no frame crosses CPUs.
    Own,
}

/// What the control rows add to a subject's name (and their records' subjects).
pub const TO_ITSELF: &str = ", handing to itself";

/// The frames handed to one thread, and whether the thread that hands them has finished.
struct Inbox {
    queue: ArrayQueue<Batch>,
    sender_done: AtomicBool,
}

impl Inbox {
    fn new() -> Inbox {
        Inbox { queue: ArrayQueue::new(QUEUE / HAND_BATCH), sender_done: AtomicBool::new(false) }
    }

    /// Frees every frame waiting here.
    #[inline]
    fn free_all<A: PageAlloc>(&self, a: &A) {
        while let Some(batch) = self.queue.pop() {
            free_each(a, &batch);
        }
    }

    /// Hands `batch` to this inbox's thread, or frees it here when its queue is full. A thread
    /// never waits for another: where `cross` waits, two threads waiting on each other's
    /// queues measured the scheduler on this shared machine (every subject, the ideal stack
    /// too, at ~2 µs a page, and cells 40 times their length), while with both threads running
    /// the queues stay far from full, each thread handing as many frames as it is handed.
    #[inline]
    fn hand<A: PageAlloc>(&self, batch: Batch, a: &A) {
        if let Err(back) = self.queue.push(batch) {
            free_each(a, &back);
        }
    }
}

/// Frees every frame of `frames`.
#[inline]
fn free_each<A: PageAlloc>(a: &A, frames: &[usize]) {
    frames.iter().for_each(|&p| a.free(p as *mut u8));
}

/// `n` steps on each of `threads` threads ([`on_bound_threads`]), each after filling its
/// population of [`LIVE`] frames (not timed), handing as `hand` says; returns (mean ns per
/// page per thread, total pages per µs: the sum of the threads' rates). A subject that runs
/// out (the ideal stack, whose addresses move to the thread that frees them, should one
/// thread outrun the other) skips the step's allocation, which is then not counted as a page.
pub fn cell<A: PageAlloc>(a: &A, threads: usize, n: u64, hand: Hand) -> (f64, f64) {
    let inboxes: Vec<Inbox> = (0..threads).map(|_| Inbox::new()).collect();
    let (per_thread, _) = on_bound_threads(threads, |t, start| {
        let to = match hand {
            Hand::Next => (t + 1) % threads,
            Hand::Own => t,
        };
        let (own, next) = (&inboxes[t], &inboxes[to]);
        let mut live: VecDeque<usize> = VecDeque::with_capacity(LIVE);
        let (mut out, mut outgoing): (Batch, usize) = ([0; HAND_BATCH], 0);
        while live.len() < LIVE {
            let p = a.alloc();
            if p.is_null() {
                break;
            }
            live.push_back(p as usize);
        }
        start.wait();
        let began = Instant::now();
        let mut pages = 0u64;
        for i in 0..n {
            // A batch arrives every `2 × HAND_BATCH` steps of the previous thread: looking
            // for one every `HAND_BATCH` steps keeps up without polling its line each step.
            if i % HAND_BATCH as u64 == 0 {
                own.free_all(a);
            }
            if live.len() >= LIVE {
                let old = live.pop_front().expect("the population is full");
                if i % 2 == 0 {
                    a.free(old as *mut u8);
                } else {
                    out[outgoing] = old;
                    outgoing += 1;
                    if outgoing == HAND_BATCH {
                        next.hand(out, a);
                        outgoing = 0;
                    }
                }
            }
            let p = a.alloc();
            if !p.is_null() {
                live.push_back(p as usize);
                pages += 1;
            }
        }
        let ns = began.elapsed().as_nanos() as f64 / pages.max(1) as f64;
        // Not timed: the population goes back, and what the previous thread still hands is
        // freed until it has handed everything (its pushes come before its flag).
        next.sender_done.store(true, Ordering::Release);
        free_each(a, &out[..outgoing]);
        free_each(a, live.make_contiguous());
        loop {
            let done = own.sender_done.load(Ordering::Acquire);
            own.free_all(a);
            if done {
                break;
            }
            // Untimed, and the neighbour may wait for a CPU others hold: give this one up.
            std::thread::yield_now();
        }
        ns
    });
    let mean = per_thread.iter().sum::<f64>() / threads as f64;
    (mean, per_thread.iter().map(|ns| 1000.0 / ns).sum())
}

fn subject<'a, A: PageAlloc + 'a>(a: A) -> (String, Cell<'a>) {
    (a.name(), Box::new(move |t, n| cell(&a, t, n, Hand::Next)))
}

/// [`subject`] handing to itself ([`Hand::Own`]), named as the subject it controls.
fn to_itself<'a, A: PageAlloc + 'a>(a: A) -> (String, Cell<'a>) {
    (a.name(), Box::new(move |t, n| cell(&a, t, n, Hand::Own)))
}

/// Every subject of the experiment (name, cell), before `--only` chooses: the ideal stack,
/// zonal on `shared` (every CPU on one node) and the peers.
fn subjects(shared: &Zonal) -> Vec<(String, Cell<'_>)> {
    let mut subjects = vec![subject(IdealStack), subject(ZonalPages { z: shared, label: ONE_NODE, bulk: None })];
    subjects.extend(crate::peer_subjects!(subject));
    subjects
}

/// The controls handing to itself: the ideal stack and zonal on `shared`.
fn controls(shared: &Zonal) -> Vec<(String, Cell<'_>)> {
    vec![to_itself(IdealStack), to_itself(ZonalPages { z: shared, label: ONE_NODE, bulk: None })]
}

/// The names of [`subjects`], without building an allocator.
pub fn names() -> Vec<String> {
    let mut names = vec![IDEAL.to_string(), ONE_NODE.into()];
    names.extend(peer_names());
    names
}

/// The thread counts: 1, 2 and nproc, those the machine has CPUs for.
pub fn thread_counts(nproc: usize) -> Vec<usize> {
    let mut ts: Vec<usize> = [1, 2, nproc].into_iter().filter(|&t| t <= nproc.max(1)).collect();
    ts.dedup();
    ts
}

/// The one-node handle's size: the run's memory, or more when the populations, the queues and
/// the lists of every CPU would not fit in a quarter of it.
pub fn one_node_bytes(total: u64, nproc: usize) -> u64 {
    const MIB4: u64 = 4 << 20;
    let need = 4 * (nproc * (LIVE + QUEUE)) as u64 * zonal::PAGE_SIZE as u64;
    total.max(need.div_ceil(MIB4) * MIB4)
}

/// Runs the experiment, prints its table and returns its records.
pub fn run(z: &Zonal, opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let nproc = zonal::cpu::nr_cpus_online().max(1);
    let total: u64 = z.topology().nodes().iter().map(|n| n.mem_bytes).sum();
    let shared = super::one_node(opts, one_node_bytes(total, nproc))?;
    let mut subjects = subjects(&shared);
    subjects.retain(|(n, _)| opts.keeps(n));
    if super::only_reference_left(subjects.iter().map(|(n, _)| n)) {
        return Ok(Vec::new());
    }
    let names: Vec<String> = subjects.iter().map(|(n, _)| n.clone()).collect();
    let ts = thread_counts(nproc);
    let two = ts.iter().position(|&t| t == 2);
    // The controls handing to itself, each measured at T = 2 right after the subject it
    // controls, in the same repetition: (the subject's column, cell, ns, rates).
    let mut own: Vec<(usize, Cell<'_>, Vec<f64>, Vec<f64>)> = controls(&shared)
        .into_iter()
        .filter_map(|(n, c)| Some((super::index_of(&names, &n)?, c, Vec::new(), Vec::new())))
        .filter(|_| two.is_some())
        .collect();
    let cells: Vec<&Cell<'_>> = subjects.iter().map(|(_, c)| c).collect();
    let sw = sweep(&cells, &ts, opts, "mixed", 20_000, |s, n| {
        for (_, cell, times, rates) in own.iter_mut().filter(|o| o.0 == s) {
            let (ns, rate) = cell(2, n);
            times.push(ns);
            rates.push(rate);
        }
    });
    println!(
        "mixed: every CPU on one zone; T threads each keeping {LIVE} order-0 frames, freeing half its oldest \
         itself and handing half to the next thread to free, {HAND_BATCH} at a time; {} repetitions; ns per page per thread (× {REFERENCE}), \
         total Mpages/s",
        opts.reps
    );
    let reference = super::index_of(&names, REFERENCE).expect("the reference is always kept");
    let params = |t: usize| json!({"threads": t, "order": 0, "live_per_thread": LIVE});
    let kind = ("mixed", "total_mpages_per_s");
    let (mut rows, mut records) = table(kind, &names, &ts, &sw, opts, |_| reference, params);
    if let (Some(ti), false) = (two, own.is_empty()) {
        // The controls' row, beside the reference's T = 2 cells of the same repetitions.
        let mut row = vec!["2, to itself".to_string()];
        row.extend((0..names.len()).map(|_| "-".to_string()));
        for (s, _, times, rates) in &own {
            let name = format!("{}{TO_ITSELF}", names[*s]);
            let reference = (&names[reference][..], &sw.times[ti][reference][..]);
            let (text, record) = figure(kind, &name, (times, rates), reference, params(2), opts);
            row[s + 1] = text;
            records.push(record);
        }
        rows.push(row);
    }
    let mut header = vec!["T".to_string()];
    header.extend(names.iter().cloned());
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    print_table(&h, &rows);
    if two.is_some() && !own.is_empty() {
        println!(
            "2, to itself: the same pattern at T = 2 with each thread handing its batches to itself (its own queue), \
             so that no frame crosses CPUs, in each repetition"
        );
    }
    // The target (issue 38): T = 2 against T = 1 in this pattern, with its controls: the ideal
    // stack, which shares nothing (what handing frames across CPUs costs the experiment on
    // this machine), and the rows handing to themselves (what the pattern costs without it).
    if let Some(two) = two {
        let scaling = |name: &str| super::index_of(&names, name).map(|i| sw.scaling(two, i));
        if let Some(one) = scaling(ONE_NODE) {
            println!(
                "target: per-thread rate at T = 2 against T = 1 in the mixed pattern, every CPU on one zone: {:.0}% \
                 (≥ {:.0}%: {})",
                one * 100.0,
                SCALING_TARGET * 100.0,
                super::verdict(one >= SCALING_TARGET)
            );
            let mut c: Vec<String> =
                scaling(IDEAL).map(|r| format!("the ideal per-thread stack {:.0}%", r * 100.0)).into_iter().collect();
            let itself: Vec<String> = own
                .iter()
                .map(|(s, _, times, _)| format!("{} {:.0}%", names[*s], 100.0 * paired_ratio(&sw.times[0][*s], times)))
                .collect();
            if !itself.is_empty() {
                c.push(format!("handing to itself, no frame crossing CPUs: {}", itself.join(", ")));
            }
            if !c.is_empty() {
                println!("  controls in the same run: {}", c.join("; "));
            }
        }
    }
    println!();
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_subjects_names() {
        let shared = super::super::tests::small_zonal();
        let built: Vec<String> = subjects(&shared).into_iter().map(|(n, _)| n).collect();
        assert_eq!(built, names());
    }

    #[test]
    fn thread_counts_are_one_two_and_nproc() {
        assert_eq!(thread_counts(1), [1]);
        assert_eq!(thread_counts(2), [1, 2]);
        assert_eq!(thread_counts(8), [1, 2, 8]);
    }

    #[test]
    fn the_one_node_handle_holds_every_population() {
        assert_eq!(one_node_bytes(128 << 20, 2), 136 << 20);
        assert_eq!(one_node_bytes(1 << 30, 2), 1 << 30);
        assert_eq!(one_node_bytes(128 << 20, 64) % (4 << 20), 0);
    }

    /// Every frame the cell allocates comes back, whichever thread frees it, at every thread
    /// count and handing either way (the population, the frames in the queues, those handed after a thread's last step).
    #[test]
    fn the_cell_gives_every_frame_back() {
        let topo = zonal::Topology::parse("nodes=1,size=256M").expect("a valid spec");
        let z = Zonal::new(zonal::Config::new(topo)).expect("an allocator");
        let a = ZonalPages { z: &z, label: ONE_NODE, bulk: None };
        for (threads, hand) in [1, 2, 3].into_iter().flat_map(|t| [(t, Hand::Next), (t, Hand::Own)]) {
            let (ns, rate) = cell(&a, threads, 3 * LIVE as u64, hand);
            assert!(ns > 0.0 && rate > 0.0, "{threads} threads, {hand:?}: {ns} ns, {rate} pages/µs");
        }
        let _ = zonal::cpu::allow_all_cpus();
        assert_eq!(z.check_invariants(), Ok(0));
        let (ns, _) = cell(&IdealStack, 2, 3 * LIVE as u64, Hand::Next);
        assert!(ns > 0.0);
    }
}
