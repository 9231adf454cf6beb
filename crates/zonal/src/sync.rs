//! One facade for atomics and locks, so that loom can stand in under `cfg(loom)` and model
//! the protocols built on them (sharded-slab's `sync.rs` does the same).

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
#[cfg(loom)]
pub use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub use std::sync::{Mutex, MutexGuard};

/// Takes a lock, ignoring poisoning: zonal never panics while holding one of its locks, and a
/// panic elsewhere must not make the allocator unusable.
#[inline]
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(loom)]
    {
        m.lock().unwrap()
    }
    #[cfg(not(loom))]
    {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
