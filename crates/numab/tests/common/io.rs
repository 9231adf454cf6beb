//! System-call helpers of the I/O tests.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use zonal::topology::Machine;
use zonal::{Config, Topology, Zonal};
use zonal_numab::{Backend, Balancer, Region};

/// Sets the movers' stop flag when dropped, so that a failed assertion of the main thread
/// ends the scope instead of waiting for them for ever.
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

pub fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is valid for the call.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fresh descriptors that nothing else owns.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// A pattern for I/O number `i`.
pub fn pattern(i: usize, buf: &mut [u8]) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = (i.wrapping_mul(31) ^ k.wrapping_mul(7) ^ (k >> 8)) as u8;
    }
}

pub fn write_all(fd: RawFd, buf: &[u8]) {
    // SAFETY: `buf` is valid for reads of its length.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    assert_eq!(n, buf.len() as isize, "write: {}", std::io::Error::last_os_error());
}

pub fn read_exact(fd: RawFd, buf: &mut [u8]) {
    // SAFETY: `buf` is valid for writes of its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(n, buf.len() as isize, "read: {}", std::io::Error::last_os_error());
}

/// A byte range of the region as a slice, read through the mapping.
///
/// # Safety
/// The range is inside the live region and no thread writes it meanwhile.
pub unsafe fn region_bytes(r: &Region, off: usize, len: usize) -> Vec<u8> {
    // SAFETY: per the caller's contract.
    unsafe { region_bytes_at(r.as_ptr() as usize + off, len) }
}

/// `len` bytes from `addr`, read one at a time through the mapping.
///
/// # Safety
/// The range is inside a live region and no thread writes it meanwhile.
pub unsafe fn region_bytes_at(addr: usize, len: usize) -> Vec<u8> {
    // SAFETY: per the caller's contract.
    (0..len).map(|k| unsafe { std::ptr::read_volatile((addr + k) as *const u8) }).collect()
}

/// A balancer scanning every 2 ms from the start and collapsing as fast as it can, on two
/// nodes with CPU 0 on node 0 and CPU 1 on node 1.
pub fn scanning_balancer(backend: Backend, node_size: &str) -> (Arc<Zonal>, Balancer) {
    let spec = format!("nodes=2,size={node_size},cpus=0:1");
    let t = Topology::parse_for(&spec, Machine { nr_cpus: 2, mem_total: 4 << 30 }).unwrap();
    let z = Arc::new(Zonal::new(Config::new(t)).unwrap());
    let cfg = zonal_numab::Config {
        backend,
        scan_delay_ms: 0,
        scan_period_min_ms: 2,
        scan_period_max_ms: 2,
        scan_size_mb: 8,
        reserve_pages: 128,
        collapse_mb: 1 << 10,
        ..Default::default()
    };
    let b = Balancer::new(z.clone(), cfg).unwrap();
    (z, b)
}
