//! `single`: one thread, order-0 alloc + free pairs (Jesper Brouer's page_bench01), zonal
//! beside the peers; then pairs of orders 1, 3 and 9 (the pageblock order, a transparent huge
//! page), with zonal's order-9 pair held against the ideal stack.

use super::page_api::{peer_names, IdealStack, ZonalPages, GLIBC, IDEAL};
use super::peers::{page_pairs, pairs};
use super::{fmt_ns, measure, paired_ratio, peers, print_table, verdict, BenchOpts, Record, Subject, Summary};
use serde_json::json;
use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use zonal::{Gfp, Zonal};

/// The orders of the second table.
pub const ORDERS: &[u32] = &[1, 3, 9];

/// The most an order-9 pair of zonal's may cost, in ideal-stack pairs of the same run.
pub const ORDER9_TARGET: f64 = 15.0;

/// The reference every ratio of this experiment is taken against.
pub const REFERENCE: &str = "mimalloc";

/// Every subject of the experiment, before `--only` chooses: zonal on `z` and on `buddy` (its
/// per-CPU lists off), the peers, the kernel.
fn subjects<'a>(z: &'a Zonal, buddy: &'a Zonal) -> Vec<Box<dyn Subject + 'a>> {
    let mut subjects = vec![
        page_pairs(IdealStack),
        page_pairs(ZonalPages { z, label: "zonal pcp", bulk: None }),
        page_pairs(ZonalPages { z: buddy, label: "zonal buddy only", bulk: None }),
    ];
    subjects.extend(crate::peer_subjects!(page_pairs));
    subjects.push(peers::kernel());
    subjects
}

/// The names of [`subjects`], without building an allocator.
pub fn names() -> Vec<String> {
    let mut names = vec![IDEAL.to_string(), "zonal pcp".into(), "zonal buddy only".into()];
    names.extend(peer_names());
    names.push(peers::KERNEL.into());
    names
}

/// Runs the experiment, prints its table and returns its records.
pub fn run(z: &Zonal, opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let buddy = super::buddy_only(opts)?;
    let mut subjects = subjects(z, &buddy);
    subjects.retain(|s| opts.keeps(&s.name()));
    let names: Vec<String> = subjects.iter().map(|s| s.name()).collect();
    if super::only_reference_left(names.iter()) {
        return Ok(Vec::new());
    }
    let times = measure(&mut subjects, opts, "single");
    let reference = super::index_of(&names, REFERENCE).expect("the reference is always kept");
    println!("single: one thread, order-0 alloc + free pairs (page_bench01); {} repetitions", opts.reps);
    let mut rows = Vec::new();
    let mut records = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let s = Summary::of(&times[i]);
        let ratio = paired_ratio(&times[i], &times[reference]);
        rows.push(vec![
            name.clone(),
            fmt_ns(s.median),
            format!("{} – {}", fmt_ns(s.min), fmt_ns(s.max)),
            format!("{ratio:.2}"),
        ]);
        records.push(Record {
            experiment: "single".into(),
            subject: name.clone(),
            params: json!({"threads": 1, "order": 0}),
            ns_per_op: s,
            reference: REFERENCE.into(),
            ratio_to_reference: ratio,
            reps: opts.reps,
            samples: times[i].clone(),
        });
    }
    print_table(&["subject", "ns/pair", "min – max", "× mimalloc"], &rows);
    println!();
    records.extend(run_orders(z, &buddy, opts)?);
    Ok(records)
}

/// One block of `2^order` frames allocated and freed right away by a `GlobalAlloc`, asked
/// for the block's natural alignment (as a buddy block has).
fn global_pairs<'a, A: GlobalAlloc + 'a>(a: A, name: &str, order: u32) -> Box<dyn Subject + 'a> {
    let bytes = zonal::PAGE_SIZE << order;
    let layout = Layout::from_size_align(bytes, bytes).expect("a power of two up to 2 MiB");
    pairs(name, move || {
        // SAFETY: a non-zero size; the block is freed with the layout it was allocated with.
        unsafe {
            let p = a.alloc(layout);
            if !p.is_null() {
                a.dealloc(black_box(p), layout);
            }
        }
    })
}

/// zonal's pair of `order` blocks.
fn zonal_pairs<'a>(z: &'a Zonal, name: &str, order: u32) -> Box<dyn Subject + 'a> {
    pairs(name, move || {
        if let Ok(p) = z.alloc_pages(Gfp::KERNEL, order) {
            let _ = z.free_pages(black_box(p.as_ptr()), order);
        }
    })
}

/// The subjects of the orders table, in [`names`]' order less the kernel (which maps pages,
/// not blocks).
fn order_subjects<'a>(z: &'a Zonal, buddy: &'a Zonal, order: u32) -> Vec<Box<dyn Subject + 'a>> {
    vec![
        // The floor: a pointer pushed and popped, whatever the block's size.
        page_pairs(IdealStack),
        zonal_pairs(z, "zonal pcp", order),
        zonal_pairs(buddy, "zonal buddy only", order),
        global_pairs(snmalloc_rs::SnMalloc, "snmalloc", order),
        global_pairs(tcmalloc_better::TCMalloc, &peers::tcmalloc_name(), order),
        global_pairs(mimalloc::MiMalloc, "mimalloc", order),
        global_pairs(tikv_jemallocator::Jemalloc, "jemalloc", order),
        global_pairs(GlibcAligned, GLIBC, order),
    ]
}

/// glibc's `aligned_alloc` and `free` as a `GlobalAlloc`.
struct GlibcAligned;

// SAFETY: `aligned_alloc` returns null or a block of `size` bytes aligned as asked (the
// layouts here have power-of-two alignments dividing their sizes), and `free` takes it back.
unsafe impl GlobalAlloc for GlibcAligned {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe { libc::aligned_alloc(l.align(), l.size()).cast() }
    }
    unsafe fn dealloc(&self, p: *mut u8, _: Layout) {
        // SAFETY: `p` came from `aligned_alloc`.
        unsafe { libc::free(p.cast()) }
    }
}

/// The orders table: per order, every subject's pair and its ratio to mimalloc and to the
/// ideal stack; then the order-9 target.
fn run_orders(z: &Zonal, buddy: &Zonal, opts: &BenchOpts) -> Result<Vec<Record>, String> {
    let max = u32::from(opts.config.max_order);
    let orders: Vec<u32> = ORDERS.iter().copied().filter(|&o| o <= max).collect();
    if orders.is_empty() {
        return Ok(Vec::new());
    }
    println!(
        "single, larger blocks: one thread, alloc + free pairs of order {} (order 9 = 2 MiB, the pageblock order); \
         peers asked for the block's size and natural alignment",
        orders.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    );
    let mut rows = Vec::new();
    let mut records = Vec::new();
    let mut order9 = None;
    for &order in &orders {
        let mut subjects = order_subjects(z, buddy, order);
        subjects.retain(|s| opts.keeps(&s.name()));
        let names: Vec<String> = subjects.iter().map(|s| s.name()).collect();
        if super::only_reference_left(names.iter()) {
            return Ok(Vec::new());
        }
        let times = measure(&mut subjects, opts, &format!("single order {order}"));
        let reference = super::index_of(&names, REFERENCE).expect("the reference is always kept");
        let ideal = super::index_of(&names, IDEAL);
        for (i, name) in names.iter().enumerate() {
            let s = Summary::of(&times[i]);
            let ratio = paired_ratio(&times[i], &times[reference]);
            let to_ideal = ideal.map(|k| paired_ratio(&times[i], &times[k]));
            if order == 9 && name == "zonal pcp" {
                order9 = to_ideal;
            }
            rows.push(vec![
                order.to_string(),
                name.clone(),
                fmt_ns(s.median),
                format!("{} – {}", fmt_ns(s.min), fmt_ns(s.max)),
                format!("{ratio:.2}"),
                to_ideal.map_or("-".into(), |r| format!("{r:.1}")),
            ]);
            records.push(Record {
                experiment: "single".into(),
                subject: name.clone(),
                params: json!({"threads": 1, "order": order}),
                ns_per_op: s,
                reference: REFERENCE.into(),
                ratio_to_reference: ratio,
                reps: opts.reps,
                samples: times[i].clone(),
            });
        }
    }
    print_table(&["order", "subject", "ns/pair", "min – max", "× mimalloc", "× ideal"], &rows);
    if let Some(r) = order9 {
        println!(
            "target: zonal pcp's order-9 pair {r:.1} × the ideal stack (≤ {ORDER9_TARGET:.0}): {}",
            verdict(r <= ORDER9_TARGET)
        );
    }
    println!();
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_subjects_names() {
        let z = super::super::tests::small_zonal();
        let buddy = super::super::tests::small_zonal();
        let built: Vec<String> = subjects(&z, &buddy).iter().map(|s| s.name()).collect();
        assert_eq!(built, names());
        let by_order: Vec<String> = order_subjects(&z, &buddy, 3).iter().map(|s| s.name()).collect();
        let without_kernel: Vec<String> = names().into_iter().filter(|n| n != peers::KERNEL).collect();
        assert_eq!(by_order, without_kernel);
    }

    /// Every subject's pair of every order runs and gives its block back (zonal's handle
    /// ends with nothing allocated).
    #[test]
    fn order_pairs_run_and_give_their_blocks_back() {
        let topo = zonal::Topology::parse("nodes=1,size=16M").expect("a valid spec");
        let z = Zonal::new(zonal::Config::new(topo.clone())).expect("an allocator");
        let buddy = Zonal::new(zonal::Config::new(topo).pcp(false)).expect("an allocator");
        for &order in ORDERS {
            for mut s in order_subjects(&z, &buddy, order) {
                s.run(3);
            }
        }
        assert_eq!(z.check_invariants(), Ok(0));
        assert_eq!(buddy.check_invariants(), Ok(0));
        assert!(z.event(zonal::vmstat::VmEvent::Pgfree) >= 3 * (2 + 8 + 512));
    }
}
