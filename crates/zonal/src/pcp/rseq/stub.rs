//! The restartable sequences where there are none: other architectures than x86-64, and
//! loom builds (loom cannot model a section the kernel restarts). [`SUPPORTED`] is false, so
//! [`super::enabled`] is false and the allocator never calls these; should it, each gives
//! way at once as an interrupted section would (nothing popped, nothing pushed), and the
//! caller takes the locked path.
//!
//! Kernel counterpart: none (architectures without rseq support in zonal). Locking and
//! invariant: nothing is touched.

use super::{FrameTable, LocalTable, Table};
use crate::types::Order;
use std::mem::MaybeUninit;

/// No critical sections on this target.
pub(super) const SUPPORTED: bool = false;

/// [`super::pop`] without sections: gives way.
///
/// # Safety
/// As [`super::pop`].
#[inline]
pub(super) unsafe fn pop(t: &Table, zone: usize) -> Option<usize> {
    let _ = (t, zone);
    None
}

/// [`super::push_frame`] without sections: gives way.
///
/// # Safety
/// As [`super::push_frame`].
#[inline]
pub(super) unsafe fn push_frame(rseq: isize, t: &FrameTable, pfn: usize, owner: u16) -> usize {
    let _ = (rseq, t, pfn, owner);
    usize::MAX
}

/// [`super::pop_local`] without sections: gives way.
///
/// # Safety
/// As [`super::pop_local`].
#[inline]
pub(super) unsafe fn pop_local(t: &LocalTable) -> Option<(usize, usize)> {
    let _ = t;
    None
}

/// [`super::pop_many`] without sections: gives way.
///
/// # Safety
/// As [`super::pop_many`].
#[inline]
pub(super) unsafe fn pop_many<'a>(t: &Table, zone: usize, out: &'a mut [MaybeUninit<usize>]) -> &'a [usize] {
    let _ = (t, zone, out);
    &[]
}

/// [`super::push_many`] without sections: gives way.
///
/// # Safety
/// As [`super::push_many`].
#[inline]
pub(super) unsafe fn push_many<const OUTBOX: bool>(t: &Table, zone: usize, pfns: &[usize]) -> usize {
    let _ = (t, zone, pfns);
    0
}

/// [`super::pop_small_local`] without sections: gives way.
///
/// # Safety
/// As [`super::pop_small_local`].
#[inline]
pub(super) unsafe fn pop_small_local<const LEVEL: u8>(t: &LocalTable, order: Order) -> Option<(usize, usize)> {
    let _ = (t, order);
    None
}

/// [`super::push_small_frame`] without sections: gives way.
///
/// # Safety
/// As [`super::push_small_frame`].
#[inline]
pub(super) unsafe fn push_small_frame(rseq: isize, t: &FrameTable, pfn: usize, order: Order) -> usize {
    let _ = (rseq, t, pfn, order);
    usize::MAX
}
