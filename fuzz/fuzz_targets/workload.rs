//! The `--workload` spec of the report commands (`allocs=N,orders=A-B,policy=P,...`): a
//! workload or an error, never a panic. The parser lives in the command's source; it is
//! compiled in here as it is there.
#![no_main]
#![allow(dead_code)]
use libfuzzer_sys::fuzz_target;

#[path = "../../src/workload.rs"]
mod workload;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(w) = workload::Workload::parse(s) {
        assert!(w.orders.0 <= w.orders.1, "orders in order: {s:?} -> {w:?}");
        assert!(w.free_percent <= 100, "a share: {s:?} -> {w:?}");
    }
});
