//! `zonal_create`'s config string (`Config::parse`, `key=value;...`) and its validation:
//! a config or an error for every input, never a panic. Nothing is built: a config may ask
//! for any amount of memory, and building is the API-sequence target's business.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(c) = zonal::Config::parse(s) {
        let _ = c.validate();
    }
    let _ = zonal::MemPolicy::parse(s, 4);
    let _ = zonal::NodeMask::parse(s);
});
