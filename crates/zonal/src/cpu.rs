//! The machine's CPUs as zonal sees them: how many are online, binding the calling thread to
//! one (benchmarks and tests pin their threads, as page_bench does), and whether the order-0
//! restartable-sequence fast path runs in this process. A thin public face of the OS layer.

use crate::error::Result;

/// CPUs online now (`sysconf(_SC_NPROCESSORS_ONLN)`), at least 1.
pub fn nr_cpus_online() -> usize {
    crate::sys::nr_cpus_online()
}

/// Binds the calling thread to one CPU (`sched_setaffinity`).
pub fn set_affinity(cpu: u32) -> Result<()> {
    crate::sys::set_affinity(cpu)
}

/// Lets the calling thread run on every CPU again.
pub fn allow_all_cpus() -> Result<()> {
    crate::sys::allow_all_cpus()
}

/// The CPU the calling thread runs on at the moment of the call, when the kernel can say
/// (the thread may move at any instant after).
pub fn current_cpu() -> Option<u32> {
    crate::sys::current_cpu_known()
}

/// Whether glibc registered its rseq area for this process's threads (glibc 2.35+, unless
/// `GLIBC_TUNABLES=glibc.pthread.rseq=0`): zonal then reads the CPU from it.
pub fn glibc_rseq_registered() -> bool {
    crate::sys::rseq_offset().is_some()
}

/// Whether the order-0 restartable-sequence fast path runs in this process (x86-64, glibc's
/// rseq area, `membarrier` with rseq fences, and `ZONAL_NO_RSEQ` unset).
pub fn rseq_fast_path() -> bool {
    crate::pcp::rseq::enabled()
}

/// Whether the kernel lets this process fence rseq critical sections on a CPU
/// (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)`, Linux 5.10+), registering for it on
/// the first call.
pub fn membarrier_rseq() -> bool {
    crate::sys::membarrier_rseq_registered()
}
