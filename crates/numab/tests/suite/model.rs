//! A region against a model: random sequences of writes and reads from either node's CPU,
//! scan passes, collapse passes of any budget and housekeeping, on the mprotect and
//! userfaultfd backends and both mapping orders. After every step each page holds what the
//! model says, has a frame exactly when it was touched, the counters keep their order
//! (`numa_pte_updates >= numa_hint_faults`), a collapse copies at most its budget; at the
//! end every frame is back with zonal.

use crate::common;

use common::{driven_balancer, on_cpu};
use proptest::prelude::*;
use std::sync::Arc;
use zonal::topology::Machine;
use zonal::{Config, MemPolicy, Topology, Zonal};
use zonal_numab::{Backend, MigrateMode, PAGE};

const PAGES: usize = 48;

#[derive(Clone, Debug)]
enum Op {
    Write { page: usize, cpu: u32, val: u64 },
    Read { page: usize, cpu: u32 },
    Scan,
    Collapse { budget: usize },
    Housekeep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..PAGES, 0..2u32, any::<u64>()).prop_map(|(page, cpu, val)| Op::Write { page, cpu, val }),
        4 => (0..PAGES, 0..2u32).prop_map(|(page, cpu)| Op::Read { page, cpu }),
        2 => Just(Op::Scan),
        2 => prop_oneof![Just(1usize), Just(2), Just(8), Just(16), Just(64), Just(usize::MAX)]
            .prop_map(|budget| Op::Collapse { budget }),
        1 => Just(Op::Housekeep),
    ]
}

fn backend_available(b: Backend) -> bool {
    match b {
        Backend::Userfaultfd => zonal_numab::userfaultfd_available().is_ok(),
        _ => true,
    }
}

fn run(backend: Backend, mode: MigrateMode, ops: &[Op]) -> Result<(), TestCaseError> {
    let t = Topology::parse_for("nodes=2,size=16M,cpus=0:1", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    let z = Arc::new(Zonal::new(Config::new(t)).unwrap());
    let b = driven_balancer(&z, backend, mode, 64);
    let r = b.region(PAGES * PAGE, MemPolicy::Local).unwrap();
    let p = r.as_ptr() as usize;
    let word = move |i: usize| (p + i * PAGE) as *mut u64;
    let mut model: Vec<Option<u64>> = vec![None; PAGES];
    for op in ops {
        match *op {
            Op::Write { page, cpu, val } => {
                // SAFETY: a page of the region; the access faults it in or back as needed.
                on_cpu(cpu, || unsafe { word(page).write_volatile(val) });
                model[page] = Some(val);
            }
            Op::Read { page, cpu } => {
                // SAFETY: as above.
                let got = on_cpu(cpu, || unsafe { word(page).read_volatile() });
                // A page read first reads zeros, as anonymous memory does.
                prop_assert_eq!(got, model[page].unwrap_or(0), "page {}", page);
                model[page].get_or_insert(0);
            }
            Op::Scan => {
                b.scan_now();
            }
            Op::Collapse { budget } => {
                let copied = b.collapse_now(budget);
                prop_assert!(copied <= budget, "{} pages copied for a budget of {}", copied, budget);
            }
            Op::Housekeep => b.housekeep(),
        }
        for (i, m) in model.iter().enumerate() {
            let nid = r.page_to_nid(word(i).cast()).unwrap();
            prop_assert_eq!(nid.is_some(), m.is_some(), "page {} has a frame exactly when touched", i);
        }
        let touched = model.iter().filter(|m| m.is_some()).count();
        prop_assert_eq!(r.node_pages().iter().sum::<usize>(), touched);
        let s = b.stats();
        prop_assert!(s.numa_pte_updates >= s.numa_hint_faults, "{:?}", s);
        prop_assert_eq!(s.collapse_fail, 0);
    }
    for (i, m) in model.iter().enumerate() {
        // SAFETY: as above.
        let got = on_cpu(0, || unsafe { word(i).read_volatile() });
        prop_assert_eq!(got, m.unwrap_or(0), "page {} at the end", i);
    }
    drop(r);
    drop(b);
    prop_assert_eq!(z.check_invariants(), Ok(0));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_region_holds_what_its_model_holds(
        ops in prop::collection::vec(op(), 1..60),
        uffd in any::<bool>(),
        eager in any::<bool>(),
    ) {
        let backend = if uffd && backend_available(Backend::Userfaultfd) { Backend::Userfaultfd } else { Backend::Mprotect };
        let mode = if eager { MigrateMode::Eager } else { MigrateMode::Delayed };
        run(backend, mode, &ops)?;
    }
}
