//! The live protocol from the server's side: any bytes a client of the server's own user
//! sends get a reply that starts `ok\n` or is one `error ...` line, and never a panic.
//! (`sysctl set` requests change the handle's tunables as they would for a client.)
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use zonal::{Config, Topology, Zonal};

fn handle() -> &'static Zonal {
    static Z: OnceLock<Zonal> = OnceLock::new();
    Z.get_or_init(|| Zonal::new(Config::new(Topology::parse("nodes=2,size=4M").unwrap())).unwrap())
}

fuzz_target!(|data: &[u8]| {
    let reply = zonal::live::fuzz_reply_to(handle(), data);
    if !reply.starts_with(b"ok\n") {
        assert!(reply.starts_with(b"error "), "{:?}", String::from_utf8_lossy(&reply));
        assert_eq!(reply.iter().filter(|&&b| b == b'\n').count(), 1, "an error is one line");
        assert!(reply.ends_with(b"\n"));
    }
    // What the server sends, the client reads back without a panic, and as the same verdict.
    let read = zonal::live::fuzz_parse_reply(&reply);
    assert_eq!(read.is_ok(), reply.starts_with(b"ok\n"));
});
