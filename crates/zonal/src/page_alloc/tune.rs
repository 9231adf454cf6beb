//! The run-time tunables of a handle (`/proc/sys/vm/*`): getters and setters that check
//! each value against the tunables table (`crate::tunables`) and keep the old value on a
//! bad one, and the log of changes (the kernel's `pr_info`s), bounded.

use super::*;

/// Lines the tunable log keeps: a program that flips tunables in a loop must not grow the
/// handle without bound, and the last changes are the ones worth reading.
pub const LOG_LINES: usize = 256;

/// The tunable log: a ring of the last [`LOG_LINES`] lines and a count of those dropped.
#[derive(Debug)]
pub(super) struct TunableLog {
    lines: std::collections::VecDeque<String>,
    dropped: u64,
}

impl TunableLog {
    pub(super) fn new(first: &str) -> TunableLog {
        let mut lines = std::collections::VecDeque::with_capacity(LOG_LINES);
        lines.push_back(first.to_string());
        TunableLog { lines, dropped: 0 }
    }

    pub(super) fn push(&mut self, line: String) {
        if self.lines.len() >= LOG_LINES {
            self.lines.pop_front();
            self.dropped += 1;
        }
        self.lines.push_back(line);
    }
}

/// `min_free_kbytes` within the table's bounds and no more than the memory there is.
pub(super) fn check_min_free_kbytes(kb: u64, lowmem_pages: usize) -> Result<u64> {
    crate::tunables::check("min_free_kbytes", kb)?;
    let total_kb = (lowmem_pages as u64) << (PAGE_SHIFT - 10);
    if kb > total_kb {
        return Err(Error::InvalidConfig(format!("min_free_kbytes {kb}: more than the {total_kb} KiB zonal manages")));
    }
    Ok(kb)
}

impl Zonal {
    /// `stat_interval`: how often the background worker runs.
    pub fn stat_interval(&self) -> Duration {
        Duration::from_millis(self.tun.stat_interval_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Sets `stat_interval`, clamped to the tunable's bounds (1 ms to an hour: a longer
    /// `Duration` is an hour, not its milliseconds cut to 64 bits); the worker takes it from
    /// its next wake-up.
    pub fn set_stat_interval(&self, d: Duration) {
        self.tun.stat_interval_ms.store(stat_interval_ms(d), std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets `percpu_pagelist_high_fraction`: 0 lets `high` tune itself between the low
    /// watermark's share and an eighth of the zone, split over the node's CPUs (Linux 6.7);
    /// N >= 8 fixes `high` at `managed / N` split likewise. Other values are rejected and the
    /// old value kept.
    pub fn set_percpu_pagelist_high_fraction(&self, fraction: u32) -> Result<()> {
        crate::tunables::check("percpu_pagelist_high_fraction", fraction as u64)?;
        self.tun.percpu_pagelist_high_fraction.store(fraction, Ordering::Relaxed);
        self.update_pcp_sizes();
        Ok(())
    }

    /// Current `percpu_pagelist_high_fraction`.
    pub fn percpu_pagelist_high_fraction(&self) -> u32 {
        self.tun.percpu_pagelist_high_fraction.load(Ordering::Relaxed)
    }

    /// Sets `min_free_kbytes` and recomputes the watermarks. Rejects 0 and values that would
    /// reserve more than the memory there is, keeping the old value.
    pub fn set_min_free_kbytes(&self, kb: u64) -> Result<()> {
        check_min_free_kbytes(kb, self.mem.lowmem_pages)?;
        self.tun.min_free_kbytes.store(kb, Ordering::Relaxed);
        self.setup_per_zone_wmarks();
        Ok(())
    }

    /// Sets `watermark_scale_factor` (1..=3000) and recomputes the watermarks.
    pub fn set_watermark_scale_factor(&self, wsf: u32) -> Result<()> {
        crate::tunables::check("watermark_scale_factor", wsf as u64)?;
        self.tun.watermark_scale_factor.store(wsf as u64, Ordering::Relaxed);
        self.setup_per_zone_wmarks();
        Ok(())
    }

    /// Current `min_free_kbytes`.
    pub fn min_free_kbytes(&self) -> u64 {
        self.tun.min_free_kbytes.load(Ordering::Relaxed)
    }

    /// Current `watermark_scale_factor`.
    pub fn watermark_scale_factor(&self) -> u32 {
        self.tun.watermark_scale_factor.load(Ordering::Relaxed) as u32
    }

    pub(super) fn log_line(&self, line: String) {
        self.tun.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(line);
    }

    /// Messages about tunable changes, oldest first (the kernel's `pr_info`s): the last
    /// [`LOG_LINES`] of them; [`Zonal::log_dropped`] counts the older ones.
    pub fn log(&self) -> Vec<String> {
        self.tun.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).lines.iter().cloned().collect()
    }

    /// How many messages left the log to keep it at [`LOG_LINES`] (as the kernel's ring
    /// buffer overwrites its oldest records).
    pub fn log_dropped(&self) -> u64 {
        self.tun.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).dropped
    }

    /// `zonelist_cache`: whether zonelist walks use the caches.
    pub fn zonelist_cache(&self) -> bool {
        self.tun.zlc_on.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns the zonelist caches on or off.
    pub fn set_zonelist_cache(&self, on: bool) {
        if self.tun.zlc_on.swap(on, std::sync::atomic::Ordering::Relaxed) != on {
            self.log_line(format!("zonelist_cache: {}", on as u8));
        }
    }

    /// `zonelist_cache_interval_ms`.
    pub fn zonelist_cache_interval_ms(&self) -> u64 {
        self.tun.zlc_interval_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets `zonelist_cache_interval_ms` (1 ..= 3600000).
    pub fn set_zonelist_cache_interval_ms(&self, ms: u64) -> Result<()> {
        crate::tunables::check("zonelist_cache_interval_ms", ms)?;
        self.tun.zlc_interval_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Drives the zonelist caches' clock by hand (milliseconds in `clock`), for tests of the
    /// zap; once per handle, before any allocation that may set a cache up.
    pub fn set_zonelist_cache_clock(&self, clock: Arc<AtomicU64>) -> Result<()> {
        self.mem
            .zlc_clock
            .set(clock)
            .map_err(|_| Error::InvalidConfig("the zonelist cache clock is already set".into()))
    }

    /// `free_check`: `true` when order-0 frees on the fast path claim with a CAS.
    pub fn free_check_atomic(&self) -> bool {
        self.key.load().free_check_atomic()
    }

    /// Sets `free_check` (see [`crate::tunables::TUNABLES`]).
    pub fn set_free_check_atomic(&self, atomic: bool) {
        if self.key.set_free_check_atomic(atomic) == atomic {
            return;
        }
        self.log_line(format!("free_check: {}", if atomic { "atomic" } else { "sequential" }));
    }

    /// `bulk_accounting`: whether bulk calls account page by page (`true`) or once per call
    /// with the batch count (`false`, the default; seed 002).
    pub fn bulk_accounting_per_page(&self) -> bool {
        self.tun.bulk_per_page.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets `bulk_accounting` (see [`crate::tunables::TUNABLES`]).
    pub fn set_bulk_accounting_per_page(&self, per_page: bool) {
        if self.tun.bulk_per_page.swap(per_page, std::sync::atomic::Ordering::Relaxed) != per_page {
            self.log_line(format!("bulk_accounting: {}", if per_page { "per_page" } else { "batch" }));
        }
    }
}

/// The bounds of the `stat_interval` tunable in ms (`sysctl::TUNABLES`; a unit test keeps them
/// equal).
pub(super) const STAT_INTERVAL_MS: (u64, u64) = (1, 3_600_000);

/// `d` in whole milliseconds, clamped to the `stat_interval` bounds, without truncating casts.
pub(super) fn stat_interval_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).clamp(STAT_INTERVAL_MS.0, STAT_INTERVAL_MS.1)
}
