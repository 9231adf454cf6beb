//! Tunables set by name and value (`zonal sysctl`, `sysctl set` requests, `ZONAL_<NAME>`):
//! the input is `name\0value`. A refused value keeps the old one; an accepted one reads
//! back; neither panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use zonal::{Config, Topology, Zonal};

fn handle() -> &'static Zonal {
    static Z: OnceLock<Zonal> = OnceLock::new();
    Z.get_or_init(|| Zonal::new(Config::new(Topology::parse("nodes=2,size=4M").unwrap())).unwrap())
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let (name, value) = s.split_once('\0').unwrap_or((s, ""));
    let z = handle();
    let before = z.sysctl_all();
    match z.sysctl_set(name, value) {
        Ok(()) => {
            z.sysctl_get(name).expect("a tunable just set reads back");
        }
        Err(_) => assert_eq!(z.sysctl_all(), before, "a refused {name:?}={value:?} changed nothing"),
    }
    let _ = z.sysctl_get(name);
});
