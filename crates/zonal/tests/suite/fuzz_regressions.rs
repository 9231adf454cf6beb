//! Every input a fuzz target (`fuzz/`, run by `.ci/hardening`) found to fail, as a test of
//! the stable build: each must now give a clear error, never a panic. The inputs are also in
//! the targets' checked-in corpora, so the fuzzers start from them.

use zonal::topology::Machine;
use zonal::Topology;

const MACHINE: Machine = Machine { nr_cpus: 4, mem_total: 16 << 30 };

/// `fuzz/corpus/topology/regression-distance-short-row`: a distance matrix whose second row
/// is empty indexed it while checking the first row's symmetry.
#[test]
fn a_distance_matrix_with_a_short_row_is_an_error() {
    for spec in ["distance=10 20:", "nodes=2,distance=10 20:", "nodes=3,distance=10 20 20:20 10:20 20 10"] {
        let e = Topology::parse_for(spec, MACHINE).unwrap_err().to_string();
        assert!(e.contains("distance row 1 has"), "{spec}: {e}");
    }
    let e = Topology::parse_file_text("nodes=2\ndistance=10 20\n", "t.topo", MACHINE).unwrap_err().to_string();
    assert!(e.contains("distance"), "{e}");
}
