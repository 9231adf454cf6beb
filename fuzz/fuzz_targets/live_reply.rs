//! The live protocol from the client's side: any reply bytes a server (or something posing
//! as one) sends are read as a body or an error, never a panic; and the socket names a
//! reader finds in its directory are parsed or skipped.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = zonal::live::fuzz_parse_reply(data);
    if let Ok(name) = std::str::from_utf8(data) {
        if let Some((pid, handle)) = zonal::live::fuzz_parse_socket_name(name) {
            assert!(pid > 0, "{name:?}");
            assert!(name.ends_with(".sock") && name.starts_with(|c: char| c.is_ascii_digit()), "{name:?}");
            let _ = handle;
        }
    }
});
