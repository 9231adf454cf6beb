//! The fast paths' key: what every allocation and free of the fast paths reads before it
//! does anything, in one word, so that it costs one load.
//!
//! The order-0 pair is bound by its memory operations, not by a chain of latencies: the
//! machine issues about three a cycle, and each load taken out of the pair's path saves a
//! third of a cycle (a probe that added loads to the loop cost 0.19 ns each). The pair read
//! whether the restartable sequences run (an `Option`'s tag), glibc's offset, and then the
//! NUMA statistics key (the allocation) or `free_check` (the free): three loads of the
//! handle each way, now one.

use crate::sync::{AtomicU64, Ordering};

// The low 32 bits hold glibc's `__rseq_offset` as an `i32`, 0 when the sequences do not
// run (the area lies apart from the thread's control block, so the offset is never 0).
/// The NUMA statistics key's byte (`numa_stats_mode`'s static key: 0 off, else how).
const NUMA_SHIFT: u32 = 32;
/// `free_check`: set when the fast frees claim with a CAS.
const FREE_CHECK_ATOMIC: u64 = 1 << 40;
/// The handle's bit in a thread's policy bits (`mempolicy::policy_bit`), 6 bits: the
/// allocations test it with no load of the handle's id and no call out of line, which made
/// the path save registers for its cold branches.
const POLICY_SHIFT: u32 = 48;

/// The word, read with one relaxed load by the fast paths and written by the tunables'
/// setters, each of which changes its own bits only (a CAS loop), so that two setters
/// racing lose neither change.
pub(super) struct FastKey(AtomicU64);

/// A value of the key, as one fast path read it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Key(u64);

impl Key {
    /// glibc's `__rseq_offset` when the restartable sequences run.
    #[inline(always)]
    pub(super) fn rseq(self) -> Option<isize> {
        let off = self.0 as u32 as i32;
        (off != 0).then_some(off as isize)
    }

    /// The NUMA statistics key (0: off; else the strategy that counts).
    #[inline(always)]
    pub(super) fn numa(self) -> u8 {
        (self.0 >> NUMA_SHIFT) as u8
    }

    /// `free_check`: whether the fast frees claim with a CAS.
    #[inline(always)]
    pub(super) fn free_check_atomic(self) -> bool {
        self.0 & FREE_CHECK_ATOMIC != 0
    }

    /// The index of the handle's bit in a thread's policy bits.
    #[inline(always)]
    pub(super) fn policy_bit(self) -> u32 {
        (self.0 >> POLICY_SHIFT) as u32 & 63
    }
}

impl FastKey {
    /// The key of a handle whose sequences run with glibc's offset `rseq` (`None`: they do
    /// not) and whose bit in threads' policy bits is `policy_bit` (below 64), NUMA
    /// statistics off and `free_check` sequential. An offset that does not fit the key's 32
    /// bits (none does on Linux: the area lies in the static TLS block, beside the thread's
    /// control block) turns the sequences off.
    pub(super) fn new(rseq: Option<isize>, policy_bit: u32) -> FastKey {
        let off = rseq.and_then(|o| i32::try_from(o).ok()).filter(|&o| o != 0).map_or(0, |o| o as u32 as u64);
        FastKey(AtomicU64::new(off | u64::from(policy_bit % 64) << POLICY_SHIFT))
    }

    /// The key now.
    #[inline(always)]
    pub(super) fn load(&self) -> Key {
        Key(self.0.load(Ordering::Relaxed))
    }

    /// Replaces the bits of `mask` with `bits`; returns the key before.
    fn update(&self, mask: u64, bits: u64) -> Key {
        let mut old = self.0.load(Ordering::Relaxed);
        loop {
            let new = (old & !mask) | bits;
            match self.0.compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Key(old),
                Err(now) => old = now,
            }
        }
    }

    /// Sets the NUMA statistics key.
    pub(super) fn set_numa(&self, key: u8) {
        self.update(0xff << NUMA_SHIFT, u64::from(key) << NUMA_SHIFT);
    }

    /// Sets `free_check`; returns what it was.
    pub(super) fn set_free_check_atomic(&self, atomic: bool) -> bool {
        self.update(FREE_CHECK_ATOMIC, if atomic { FREE_CHECK_ATOMIC } else { 0 }).free_check_atomic()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn each_setter_keeps_the_others_bits() {
        for (off, bit) in [(Some(-0x90isize), 0), (Some(0x7fff_fff0), 63), (None, 17)] {
            let k = FastKey::new(off, bit);
            assert_eq!((k.load().rseq(), k.load().policy_bit()), (off, bit));
            k.set_numa(3);
            assert!(!k.set_free_check_atomic(true));
            assert_eq!((k.load().rseq(), k.load().numa(), k.load().free_check_atomic()), (off, 3, true));
            k.set_numa(0);
            assert!(k.set_free_check_atomic(false));
            assert_eq!((k.load().rseq(), k.load().numa(), k.load().free_check_atomic()), (off, 0, false));
            k.set_numa(255);
            assert_eq!((k.load().rseq(), k.load().numa(), k.load().policy_bit()), (off, 255, bit));
        }
    }

    #[test]
    fn offsets_the_key_cannot_hold_turn_the_sequences_off() {
        assert_eq!(FastKey::new(Some(0), 0).load().rseq(), None);
        assert_eq!(FastKey::new(Some(1 << 40), 0).load().rseq(), None);
        assert_eq!(FastKey::new(Some(i32::MIN as isize), 0).load().rseq(), Some(i32::MIN as isize));
    }

    #[test]
    fn racing_setters_lose_no_change() {
        let k = FastKey::new(Some(-8), 5);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..10_000u32 {
                    k.set_numa((i % 4) as u8);
                }
            });
            s.spawn(|| {
                for i in 0..10_000u32 {
                    k.set_free_check_atomic(i % 2 == 0);
                }
            });
        });
        // The last writes were numa 3 (9,999 % 4) and sequential (9,999 is odd).
        assert_eq!((k.load().rseq(), k.load().numa(), k.load().free_check_atomic()), (Some(-8), 3, false));
        assert_eq!(k.load().policy_bit(), 5);
    }
}
