//! The NUMA balancer's config string (`zonal_numab::Config::parse`): a config or an error,
//! never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let _ = zonal_numab::Config::parse(s);
});
