//! The balancer's settings: the `Config` a balancer starts with (Linux's defaults and the
//! debugfs knobs' names) and the `Tunables` changeable while it runs.

use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8};
use std::sync::Arc;

/// When a migrating page is mapped (`numa_balancing_migrate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MigrateMode {
    /// Copy while the page is inaccessible, then map the new frame (seed 004).
    #[default]
    Delayed,
    /// Map the page accessible, then unmap it again to copy (before seed 004).
    Eager,
}

impl std::str::FromStr for MigrateMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "delayed" => Ok(MigrateMode::Delayed),
            "eager" => Ok(MigrateMode::Eager),
            _ => Err(format!("numa_balancing_migrate: `{s}` is not delayed or eager")),
        }
    }
}

/// How hint faults reach the balancer (`numa_balancing_backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// userfaultfd where the kernel allows it, else mprotect.
    #[default]
    Auto,
    /// `mprotect(PROT_NONE)` to scan, `SIGSEGV` for the fault: works everywhere; a migration
    /// replaces an inaccessible mapping, so it costs one TLB flush delayed and two eager.
    Mprotect,
    /// `MADV_DONTNEED` to scan, userfaultfd MINOR faults delivered as `SIGBUS` in the faulting
    /// thread: the delayed mapping maps the new frame over an empty entry, with no TLB flush.
    Userfaultfd,
    /// The same, with the faults served by a handler thread of the balancer: slower per
    /// fault, but it serves faults taken in the kernel too, so a system call that reads or
    /// writes a region page (a `read(2)` into it) waits for its hint fault instead of getting
    /// `EFAULT`. Needs the privilege kernel-mode userfaultfd asks for
    /// (`vm.unprivileged_userfaultfd` or `CAP_SYS_PTRACE`).
    UserfaultfdThread,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Backend::Auto),
            "mprotect" => Ok(Backend::Mprotect),
            "userfaultfd" | "uffd" => Ok(Backend::Userfaultfd),
            "userfaultfd-thread" | "uffd-thread" => Ok(Backend::UserfaultfdThread),
            _ => Err(format!("numa_balancing_backend: `{s}` is not auto, mprotect, userfaultfd or userfaultfd-thread")),
        }
    }
}

/// The balancer's settings, Linux's defaults.
#[derive(Clone, Debug)]
pub struct Config {
    /// `kernel.numa_balancing` bit 0 (`NUMA_BALANCING_NORMAL`): pages move to the node of
    /// the CPUs that use them.
    pub enabled: bool,
    /// `kernel.numa_balancing` bit 1 (`NUMA_BALANCING_MEMORY_TIERING`, Linux 5.18): pages on
    /// lower memory tiers (see `tier`) are promoted to the faulting CPU's top-tier node when
    /// hot, and top-tier nodes short of room demote their coldest pages (with
    /// `demotion_enabled`). Alone (`numa_balancing=2`), the scanner hides only lower-tier pages.
    pub tiering: bool,
    /// `kernel.numa_balancing_hot_threshold_ms` (1000): a lower-tier page whose hint fault
    /// came sooner than this after the scan that hid it is hot. The balancer adjusts the
    /// threshold it uses, per node, so that candidates come at the promotion rate limit.
    pub hot_threshold_ms: u64,
    /// `kernel.numa_balancing_promote_rate_limit_MBps` (65536): most MiB promoted to a node
    /// per second; past it, candidates wait for the next second.
    pub promote_rate_limit_mbps: u64,
    /// `/sys/kernel/mm/numa/demotion_enabled` (false, as Linux): a top-tier node below its
    /// promotion watermark moves its coldest region pages to the next tier down.
    pub demotion_enabled: bool,
    /// Whether the balancer's thread demotes (Linux's kswapd), on its own schedule (true).
    /// Off, only [`crate::Balancer::demote_now`] does, from the caller's thread, while the
    /// scanner still ages the top tier: for a program that drives its own reclaim, and for
    /// tests whose figures must not race a pass they did not start.
    pub kswapd: bool,
    /// The tiering clock in ms, for tests and simulations: when set, hint-fault latencies and
    /// the rate limit's windows read it instead of the monotonic clock.
    pub tier_clock: Option<Arc<AtomicU64>>,
    /// Delayed or eager mapping.
    pub mode: MigrateMode,
    /// Wait before the first scan of a new region (`scan_delay_ms`, 1000).
    pub scan_delay_ms: u64,
    /// Fastest scan period (`scan_period_min_ms`, 1000).
    pub scan_period_min_ms: u64,
    /// Slowest scan period (`scan_period_max_ms`, 60000).
    pub scan_period_max_ms: u64,
    /// Mapped memory marked per scan pass (`scan_size_mb`, 256).
    pub scan_size_mb: u64,
    /// Frames kept ready per node for the fault handler.
    pub reserve_pages: usize,
    /// How hint faults are taken.
    pub backend: Backend,
    /// Mappings the process may have before the balancer stops adding to them (no new scan,
    /// no migration: both split mappings), `None` for three quarters of `vm.max_map_count`.
    pub vma_budget: Option<usize>,
    /// Move a whole aligned 2 MiB chunk (order 9) in one migration when a hint fault finds
    /// every page of it hinted on the same node: one copy loop and one mapping for 512
    /// pages, and the chunk's mappings merged into one.
    pub chunk_migration: bool,
    /// Most MiB a second the balancer's thread copies to collapse fragmented windows of a
    /// region into one block and one mapping each (see the `collapse` module; 0: never).
    pub collapse_mb: u64,
    /// A page migrating alone takes frame k of a 2 MiB block its aligned window keeps on
    /// the destination node (k its place in the window), and its neighbours nobody touched
    /// for a scan period come along into theirs: a window's pages migrated one by one, in
    /// any order, map consecutive frames and stay one mapping, so that hiding them stays one
    /// TLB shootdown (see the `dest` module). Off: any frame of the node's reserve, a
    /// mapping per page until a collapse.
    pub window_migration: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            enabled: true,
            tiering: false,
            hot_threshold_ms: 1000,
            promote_rate_limit_mbps: 65536,
            demotion_enabled: false,
            kswapd: true,
            tier_clock: None,
            mode: MigrateMode::Delayed,
            scan_delay_ms: 1000,
            scan_period_min_ms: 1000,
            scan_period_max_ms: 60_000,
            scan_size_mb: 256,
            reserve_pages: 256,
            backend: Backend::Auto,
            vma_budget: None,
            chunk_migration: true,
            collapse_mb: 64,
            window_migration: true,
        }
    }
}

impl Config {
    /// Parses `key=value` items separated by `;` over the defaults: `numa_balancing` (0 to
    /// 3: bit 0 normal balancing, bit 1 memory tiering), `numa_balancing_hot_threshold_ms`,
    /// `numa_balancing_promote_rate_limit_MBps`, `demotion_enabled` (0 or 1), `mode`
    /// (delayed or eager), `backend` (auto, mprotect, userfaultfd),
    /// `scan_delay_ms`, `scan_period_min_ms`, `scan_period_max_ms`, `scan_size_mb`,
    /// `reserve_pages`, `vma_budget`, `chunk_migration` (0 or not), `collapse_mb`,
    /// `window_migration` (0 or not). An empty string is the defaults.
    pub fn parse(s: &str) -> Result<Config> {
        let mut c = Config::default();
        for item in s.split(';').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| Error::InvalidConfig(format!("numab config: `{item}` is not key=value")))?;
            let num = |v: &str| -> Result<u64> {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| Error::InvalidConfig(format!("numab config: {k}: `{v}` is not a number")))
            };
            match k.trim() {
                "numa_balancing" => {
                    let bits = crate::tunable::parse("numa_balancing", v)?;
                    (c.enabled, c.tiering) = (bits & 1 != 0, bits & 2 != 0);
                }
                "numa_balancing_hot_threshold_ms" | "hot_threshold_ms" => {
                    c.hot_threshold_ms = crate::tunable::parse("numa_balancing_hot_threshold_ms", v)?
                }
                "numa_balancing_promote_rate_limit_MBps" | "promote_rate_limit_MBps" => {
                    c.promote_rate_limit_mbps = crate::tunable::parse("numa_balancing_promote_rate_limit_MBps", v)?
                }
                "demotion_enabled" => c.demotion_enabled = crate::tunable::parse("demotion_enabled", v)? != 0,
                "mode" | "numa_balancing_migrate" => c.mode = v.trim().parse().map_err(Error::InvalidConfig)?,
                "backend" | "numa_balancing_backend" => c.backend = v.trim().parse().map_err(Error::InvalidConfig)?,
                "scan_delay_ms" => c.scan_delay_ms = num(v)?,
                "scan_period_min_ms" => c.scan_period_min_ms = num(v)?.max(1),
                "scan_period_max_ms" => c.scan_period_max_ms = num(v)?.max(1),
                "scan_size_mb" => c.scan_size_mb = num(v)?.clamp(1, 1 << 20),
                "reserve_pages" => c.reserve_pages = num(v)?.clamp(1, 1 << 20) as usize,
                "vma_budget" => c.vma_budget = Some(num(v)? as usize),
                "chunk_migration" => c.chunk_migration = num(v)? != 0,
                "collapse_mb" => c.collapse_mb = num(v)?.min(1 << 20),
                "window_migration" => c.window_migration = num(v)? != 0,
                other => {
                    return Err(Error::InvalidConfig(format!(
                        "numab config: unknown key `{other}` (numa_balancing, numa_balancing_hot_threshold_ms, \
                         numa_balancing_promote_rate_limit_MBps, demotion_enabled, mode, backend, scan_delay_ms, \
                         scan_period_min_ms, scan_period_max_ms, scan_size_mb, reserve_pages, vma_budget, \
                         chunk_migration, collapse_mb, window_migration)"
                    )))
                }
            }
        }
        if c.scan_period_min_ms > c.scan_period_max_ms {
            return Err(Error::InvalidConfig(format!(
                "numab config: scan_period_min_ms {} is above scan_period_max_ms {}",
                c.scan_period_min_ms, c.scan_period_max_ms
            )));
        }
        Ok(c)
    }
}

/// The settings, changeable at run time.
pub(crate) struct Tunables {
    pub(crate) enabled: AtomicBool,
    pub(crate) tiering: AtomicBool,
    pub(crate) hot_threshold_ms: AtomicU64,
    pub(crate) promote_rate_limit_mbps: AtomicU64,
    pub(crate) demotion_enabled: AtomicBool,
    pub(crate) mode: AtomicU8,
    pub(crate) scan_delay_ms: AtomicU64,
    pub(crate) scan_period_min_ms: AtomicU64,
    pub(crate) scan_period_max_ms: AtomicU64,
    pub(crate) scan_size_mb: AtomicU64,
    pub(crate) collapse_mb: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_every_key_and_refuses_the_rest() {
        let c = Config::parse(
            "numa_balancing=0; mode=eager;backend=mprotect;scan_delay_ms=5;scan_period_min_ms=10;\
             scan_period_max_ms=20;scan_size_mb=4;reserve_pages=8;vma_budget=100",
        )
        .unwrap();
        assert!(!c.enabled);
        assert_eq!((c.mode, c.backend), (MigrateMode::Eager, Backend::Mprotect));
        assert_eq!((c.scan_delay_ms, c.scan_period_min_ms, c.scan_period_max_ms), (5, 10, 20));
        assert_eq!((c.scan_size_mb, c.reserve_pages, c.vma_budget), (4, 8, Some(100)));
        assert_eq!(Config::parse("").unwrap().scan_size_mb, 256);
        let t = Config::parse(
            "numa_balancing=2;numa_balancing_hot_threshold_ms=50;numa_balancing_promote_rate_limit_MBps=8;\
             demotion_enabled=1",
        )
        .unwrap();
        assert!(!t.enabled && t.tiering && t.demotion_enabled);
        assert_eq!((t.hot_threshold_ms, t.promote_rate_limit_mbps), (50, 8));
        let both = Config::parse("numa_balancing=3").unwrap();
        assert!(both.enabled && both.tiering);
        for bad in [
            "mode=sideways",
            "numa_balancing=4",
            "numa_balancing_hot_threshold_ms=-1",
            "numa_balancing_promote_rate_limit_MBps=lots",
            "demotion_enabled=yes",
            "colour=red",
            "scan_size_mb=lots",
            "novalue",
            "scan_period_min_ms=9;scan_period_max_ms=3",
        ] {
            assert!(matches!(Config::parse(bad), Err(Error::InvalidConfig(_))), "{bad}");
        }
    }
}
