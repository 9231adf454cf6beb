//! One facade for atomics and locks, so that loom can stand in under `cfg(loom)` and model
//! the protocols built on them (sharded-slab's `sync.rs` does the same).

#[cfg(loom)]
pub use loom::sync::atomic::{
    fence, AtomicBool, AtomicI8, AtomicIsize, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub use std::sync::atomic::{
    fence, AtomicBool, AtomicI8, AtomicIsize, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
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

/// Asks the CPU to bring the line holding `p` into its cache for writing (`prefetchw`) ahead
/// of a store to it: a hint, which never faults and changes nothing a thread can observe.
/// Nothing on targets without one.
#[inline(always)]
pub fn prefetch_write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads and writes nothing and cannot fault, whatever the address;
    // the SSE it needs is part of x86_64's baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks the CPU to bring the line holding `p` into its cache ahead of a load from it
/// (`prefetcht0`): a hint, as [`prefetch_write`].
#[inline(always)]
pub fn prefetch_read<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `prefetch_write`: a prefetch reads and writes nothing and cannot fault.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A cell whose contents a lock elsewhere protects (the per-CPU page lists): loom's
/// `UnsafeCell` under `cfg(loom)`, so the model checks every access against the lock.
#[derive(Debug)]
pub struct LockedCell<T>(#[cfg(loom)] loom::cell::UnsafeCell<T>, #[cfg(not(loom))] std::cell::UnsafeCell<T>);

impl<T> LockedCell<T> {
    /// Wraps a value.
    pub fn new(v: T) -> Self {
        #[cfg(loom)]
        {
            LockedCell(loom::cell::UnsafeCell::new(v))
        }
        #[cfg(not(loom))]
        {
            LockedCell(std::cell::UnsafeCell::new(v))
        }
    }

    /// Runs `f` on the contents.
    ///
    /// # Safety
    /// The caller holds the lock that protects this cell, so no other access runs meanwhile.
    #[inline]
    pub unsafe fn with_mut<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        #[cfg(loom)]
        {
            // SAFETY: exclusive by the caller's lock (see # Safety); loom checks it.
            self.0.with_mut(|p| f(unsafe { &mut *p }))
        }
        #[cfg(not(loom))]
        {
            // SAFETY: exclusive by the caller's lock (see # Safety).
            f(unsafe { &mut *self.0.get() })
        }
    }
}

/// Yields the CPU in a spin loop (loom's yield under `cfg(loom)`, so models terminate).
#[inline]
pub fn spin_wait() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}
