//! Newtypes for the units of the page allocator, one per kernel concept.
//!
//! A *frame* is one base page (4 KiB); a *block* is 2^order frames aligned to its own size.
//! Keeping each unit in its own type makes the buddy arithmetic read like mm/page_alloc.c
//! (`Pfn::buddy` is `__find_buddy_pfn`) and stops a node id from being passed as a CPU.

use std::fmt;

/// Highest order kept on the pcp lists counted in `count` (`PAGE_ALLOC_COSTLY_ORDER`).
pub const PCP_MAX_ORDER: u8 = 3;
/// The order of the one list above the costly orders (`NR_PCP_THP`, Linux 5.13+):
/// `pageblock_order`, the order of a transparent huge page (2 MiB of 4 KiB frames).
pub const PCP_THP_ORDER: Order = Order(9);

/// Size of a frame in bytes (`PAGE_SIZE`).
pub const PAGE_SIZE: usize = 4096;
/// log2 of [`PAGE_SIZE`] (`PAGE_SHIFT`).
pub const PAGE_SHIFT: u32 = 12;
/// Highest order any configuration may ask for: orders are kept in 4 bits of a frame's state.
pub const MAX_ORDER_LIMIT: u8 = 15;
/// Linux's default `MAX_ORDER` (renamed `MAX_PAGE_ORDER` in 6.8): blocks of up to 4 MiB.
pub const DEFAULT_MAX_ORDER: u8 = 10;

/// A page frame number: the index of a frame in zonal's frame space.
///
/// zonal numbers frames from 0 at the start of its arena, so `Pfn(0)` is the arena's first
/// frame, and node ranges are aligned to the largest block.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Pfn(pub usize);

impl Pfn {
    /// The buddy of the block of `order` that starts at `self` (`__find_buddy_pfn`).
    #[inline]
    pub fn buddy(self, order: Order) -> Pfn {
        Pfn(self.0 ^ (1usize << order.0))
    }

    /// Whether `self` is aligned to a block of `order`.
    #[inline]
    pub fn is_aligned(self, order: Order) -> bool {
        self.0 & ((1usize << order.0) - 1) == 0
    }

    /// The start of the block of `order` that contains `self`.
    #[inline]
    pub fn align_down(self, order: Order) -> Pfn {
        Pfn(self.0 & !((1usize << order.0) - 1))
    }
}

impl fmt::Display for Pfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pfn {:#x}", self.0)
    }
}

/// A block order: the block holds 2^order frames. At most [`MAX_ORDER_LIMIT`], so `pages`
/// and `bytes` never overflow: public code builds one with [`Order::new`], which refuses
/// anything larger; the field is the crate's, whose constructors are all bounded (by a
/// handle's `max_order` or the limit).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Order(pub(crate) u8);

impl Order {
    /// Order 0: one frame.
    pub const ZERO: Order = Order(0);

    /// The order `order`, or `None` above [`MAX_ORDER_LIMIT`].
    #[inline]
    pub const fn new(order: u8) -> Option<Order> {
        if order <= MAX_ORDER_LIMIT {
            Some(Order(order))
        } else {
            None
        }
    }

    /// The exponent.
    #[inline]
    pub const fn get(self) -> u8 {
        self.0
    }

    /// Number of frames in a block of this order.
    #[inline]
    pub fn pages(self) -> usize {
        1usize << self.0
    }

    /// Number of bytes in a block of this order.
    #[inline]
    pub fn bytes(self) -> usize {
        PAGE_SIZE << self.0
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "order {}", self.0)
    }
}

/// A NUMA node id.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct NodeId(pub u16);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.0)
    }
}

/// A zone's index in the allocator's zone table (all zones of all nodes, by node).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct ZoneId(pub u16);

/// A CPU number as the operating system numbers them.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct CpuId(pub u32);

impl fmt::Display for CpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cpu {}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buddy_flips_the_order_bit() {
        assert_eq!(Pfn(0).buddy(Order(0)), Pfn(1));
        assert_eq!(Pfn(1).buddy(Order(0)), Pfn(0));
        assert_eq!(Pfn(8).buddy(Order(3)), Pfn(0));
        assert_eq!(Pfn(16).buddy(Order(3)), Pfn(24));
    }

    #[test]
    fn alignment() {
        assert!(Pfn(16).is_aligned(Order(4)));
        assert!(!Pfn(24).is_aligned(Order(4)));
        assert_eq!(Pfn(27).align_down(Order(3)), Pfn(24));
        assert_eq!(Order(10).bytes(), 4 << 20);
    }

    #[test]
    fn orders_above_the_limit_cannot_be_built() {
        assert_eq!(Order::new(MAX_ORDER_LIMIT).map(Order::get), Some(MAX_ORDER_LIMIT));
        assert_eq!(Order::new(MAX_ORDER_LIMIT + 1), None);
        assert_eq!(Order::new(64), None);
        assert_eq!(Order::new(u8::MAX), None);
        // The largest order there can be still fits.
        assert_eq!(Order::new(MAX_ORDER_LIMIT).unwrap().bytes(), PAGE_SIZE << MAX_ORDER_LIMIT);
    }
}
