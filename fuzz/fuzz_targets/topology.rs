//! The topology spec (`--topology SPEC`, `topology=` in a config string) and the topology
//! file, on a fixed machine so that a finding reproduces anywhere. Every input is a
//! topology or an error, never a panic, and the size and CPU parsers it uses agree.
#![no_main]
use libfuzzer_sys::fuzz_target;
use zonal::topology::{parse_cpulist, parse_size, Machine};
use zonal::Topology;

const MACHINE: Machine = Machine { nr_cpus: 4, mem_total: 16 << 30 };

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(t) = Topology::parse_for(s, MACHINE) {
        assert!(t.nr_nodes() > 0, "a topology has a node: {s:?}");
    }
    let _ = Topology::parse_file_text(s, "fuzz", MACHINE);
    let _ = parse_size(s);
    if let Ok(ids) = parse_cpulist(s, 64) {
        assert!(ids.len() <= 64 && ids.iter().all(|&i| i < 64), "bounded: {s:?} -> {ids:?}");
    }
});
