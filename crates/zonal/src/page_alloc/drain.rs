//! Draining and housekeeping (`drain_local_pages`, `drain_all_pages`, `decay_pcp_high`,
//! `vmstat_update`/`refresh_cpu_vm_stats`): per-CPU lists returned to the buddy, and the
//! worker that decays idle lists and folds counters, skipping what has nothing to do.
//!
//! Locking: a pcp lock, then the zone lock; reports and folds take the lists' lock without
//! touching the rseq cache, so they never fence a CPU.

use super::*;

impl Zonal {
    /// Returns one CPU's lists, for every zone, to the buddy lists (`drain_local_pages` of that
    /// CPU). Returns the frames moved.
    pub fn drain_cpu_pages(&self, cpu: usize) -> usize {
        // Every drain, decay and fold does nothing in a forked child (a lock a parent's
        // thread held at the fork stays held there; `Zonal::check_not_forked`).
        if self.inherited() {
            return 0;
        }
        let _settled = self.settled();
        self.drain_cpu(cpu)
    }

    /// [`Zonal::drain_cpu_pages`] under [`Zonal::settled`]. Lists that look empty (their
    /// hint, read without the lock) are skipped. A housekeeping pass would make that hint
    /// lie: its holder moves the caches' frames into the lists and writes the lists' count
    /// only as it unlocks, so lists with frames in their cache alone would read empty
    /// meanwhile, and a drain of a quiescent handle would leave those frames behind.
    fn drain_cpu(&self, cpu: usize) -> usize {
        if cpu >= self.cpus.nr_cpus || !self.cpus.pcp_enabled {
            return 0;
        }
        let mut n = 0;
        for z in self.mem.zones.iter() {
            let pcp = self.pcp(cpu, z.id);
            if !pcp.looks_empty() {
                n += pcp.lock(z).with(|p| pcp::drain(z, p));
            }
        }
        if n > 0 {
            self.count_event(self.current_cpu(), VmEvent::PcpDrain, 1);
        }
        n
    }

    /// Returns every CPU's lists, and every zone's transfer list, to the buddy lists
    /// (`drain_all_pages`). Returns the frames moved.
    pub fn drain_all_pages(&self) -> usize {
        if self.inherited() {
            return 0;
        }
        // Under `settled`, as `drain_cpu_pages`: the allocation's slow path, which drains,
        // may then wait for a housekeeping pass, as Linux's waits for its drain work.
        let _settled = self.settled();
        let lists: usize = (0..self.cpus.nr_cpus).map(|c| self.drain_cpu(c)).sum();
        lists + self.drain_transfer_lists()
    }

    /// Returns every zone's transfer list to the buddy lists, each under this CPU's lists
    /// of the zone (whose report takes the frames off `nr_zone_pcp_pages`).
    fn drain_transfer_lists(&self) -> usize {
        if !self.cpus.pcp_enabled {
            return 0;
        }
        let cpu = self.current_cpu();
        self.mem.zones.iter().map(|z| self.pcp(cpu, z.id).lock(z).with(|p| pcp::drain_transfer(z, p))).sum()
    }

    /// Runs one `decay_pcp_high` pass over every CPU's lists (the background worker does this
    /// every `stat_interval`). Returns the frames drained.
    pub fn decay_pcp_high(&self) -> usize {
        if self.inherited() {
            return 0;
        }
        let _pass = self.pass();
        sweep(&self.mem.zones, &self.cpus.pcps, true, false)
    }

    /// `vm.stat_refresh`: folds every CPU's zone-counter diffs now (the worker does it every
    /// `stat_interval`), so the folded counters equal the snapshots once allocation stops.
    pub fn refresh_vm_stats(&self) {
        if self.inherited() {
            return;
        }
        let _pass = self.pass();
        sweep(&self.mem.zones, &self.cpus.pcps, false, true);
    }

    /// One pass of the background worker (`vmstat_update`), now: every CPU's lists that a
    /// decay would change decayed and every count folded, in one sweep ([`Zonal::decay_pcp_high`] and
    /// [`Zonal::refresh_vm_stats`] together). Returns the frames drained.
    pub fn vmstat_update(&self) -> usize {
        if self.inherited() {
            return 0;
        }
        let _pass = self.pass();
        sweep(&self.mem.zones, &self.cpus.pcps, true, true)
    }

    /// Runs a housekeeping pass (decay or fold) to the exclusion of the snapshot readers.
    pub(super) fn pass(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.pass.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds off every housekeeping pass, the background worker's included, while the guard
    /// lives. A pass moves frames and counts between the places a snapshot adds up (a CPU's
    /// diff into the zone's counter, the caches' churn into the diff, idle lists into the
    /// buddy lists), each move under its lock but in two steps that a lock-free reader can
    /// see half done: without this a quiescent handle's `nr_free_pages` could read a diff
    /// already taken and a counter not yet added to, and a drain could skip lists whose
    /// frames a decay had moved out of their cache for a moment. The exact readers (the
    /// snapshots, `nr_pcp_pages`, the reports, [`Zonal::check_invariants`]) and the drains
    /// hold it. No allocation's fast or locked path takes it (the slow path's drain does,
    /// and may wait for a pass), so it holds none of them up. Not re-entrant: take it once,
    /// at the outer call.
    pub(crate) fn settled(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.pass.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A test hook: runs `f` while this thread holds every lock of the handle that an
    /// allocation, a free, a drain or a report may wait for, taken in the allocator's lock
    /// order: the housekeeping pass (for writing, as a pass holds it; [`Zonal::settled`]'s
    /// readers wait), every CPU's lists of every zone (pcp before zone; `lock_lists`, which
    /// neither flushes nor fences a cache: the lock byte is what the sections test), then
    /// every zone lock, then every zone's transfer list and every CPU's inbox (each taken only
    /// under a pcp lock, and never nested with the zone lock or with one another elsewhere,
    /// so taking them here cannot deadlock).
    /// Released in reverse order after `f` returns (or unwinds).
    ///
    /// For tests that prove a path takes no zonal lock (a signal handler's): run the path
    /// from another thread inside `f`, and have `f` wait for it with a bound. Anything in `f`
    /// on this thread that needs one of the locks waits forever: the restartable sequences
    /// give way (their lists read as locked), and the locked paths block.
    #[doc(hidden)]
    pub fn hold_every_lock<R>(&self, f: impl FnOnce() -> R) -> R {
        let pass = self.pass();
        let zones = &self.mem.zones;
        let pcps: Vec<_> = (0..self.cpus.nr_cpus)
            .flat_map(|c| zones.iter().map(move |z| (c, z)))
            .map(|(c, z)| self.pcp(c, z.id).lock_lists(z))
            .collect();
        let locked: Vec<_> = zones.iter().map(|z| z.lock()).collect();
        let transfers: Vec<_> = zones.iter().map(|z| z.transfer().lock()).collect();
        let inboxes: Vec<_> = self.cpus.pcps.iter().map(|p| p.inbox().lock()).collect();
        let r = f();
        drop(inboxes);
        drop(transfers);
        drop(locked);
        drop(pcps);
        drop(pass);
        r
    }
}

/// One housekeeping sweep (`refresh_cpu_vm_stats`, whose `do_pagesets` runs
/// `decay_pcp_high` in the same loop): with `decay`, each CPU's lists that a decay would
/// change are decayed; with `fold`, those with counts to fold (cache churn, a
/// `nr_zone_pcp_pages` diff) are locked lists-only (which never fences: folding touches no
/// cache) and folded, then each zone's free-page diffs, a decay's among them, and a zone
/// under pressure gets its normal threshold back once its free frames are at or above `high`
/// (where kswapd would go back to sleep). Returns the frames decays drained.
///
/// Both tests are lock-free hints from the lists' last unlock, so on an idle handle the
/// sweep takes no pcp lock and fences no CPU, however many CPUs there are: it reads the
/// lists' first two lines, their inbox's and their zone diffs' (a CPU whose sections run
/// there reads its caches' words too), and each zone's fold reads the diffs of the CPUs that
/// took its lock since the last, not of every CPU. Lists are a few KiB apart, a stride
/// hardware prefetchers do not follow, so the sweep prefetches the lists a few ahead; past
/// ~2 MiB of those lines (1024 CPUs on 8 nodes: `bench scale`) they outgrow the caches.
pub(super) fn sweep(zones: &[Zone], pcps: &[PerCpuPages], decay: bool, fold: bool) -> usize {
    /// How many lists ahead the sweep prefetches: enough misses in flight to cover a
    /// memory access's latency at a list's test of a few ns.
    const AHEAD: usize = 4;
    let nz = zones.len();
    let mut drained = 0;
    // The list `AHEAD` places on, as (CPU, zone), counted along without a division.
    let (mut ahead_cpu, mut ahead_zone) = (AHEAD / nz, AHEAD % nz);
    // In memory order, a CPU's lists of every zone at a time (`pcps` is
    // `[cpu * nr_zones + zone]`), each beside its zone.
    for (cpu, lists) in pcps.chunks(nz).enumerate() {
        for (z, p) in zones.iter().zip(lists) {
            if let Some(q) = pcps.get(ahead_cpu * nz + ahead_zone) {
                // By index: `q.cpu()` would wait for the line being prefetched.
                q.prefetch_idle_test();
                zones[ahead_zone].prefetch_diffs(ahead_cpu);
            }
            ahead_zone += 1;
            if ahead_zone == nz {
                (ahead_cpu, ahead_zone) = (ahead_cpu + 1, 0);
            }
            debug_assert_eq!(p.cpu(), cpu);
            if decay && p.needs_decay() {
                drained += p.lock(z).with(|inner| pcp::decay_high(z, inner));
            }
            if fold && (p.unsettled() != 0 || z.diff(cpu, ZoneStatItem::NrPcpPages) != 0) {
                p.lock_lists(z).fold_diff();
            }
        }
    }
    if fold {
        for z in zones {
            z.lock().fold_diffs();
            // The exact count, as the slow path reads it to set the pressure.
            if z.under_pressure() && z.nr_free_exact() >= z.watermark(Watermark::High) {
                z.set_pressure(false);
            }
        }
    }
    drained
}

/// The background worker (`vmstat_update`): every interval, decays idle pcps' `high` and
/// folds the zone counters. Stopped and joined when the handle drops.
pub(super) struct Worker {
    stop: Arc<(std::sync::Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    pub(super) fn start(
        zones: Arc<[Zone]>,
        pcps: Arc<[PerCpuPages]>,
        interval_ms: Arc<std::sync::atomic::AtomicU64>,
        pass: Arc<std::sync::RwLock<()>>,
    ) -> Worker {
        let stop = Arc::new((std::sync::Mutex::new(false), Condvar::new()));
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("zonal-vmstat".into())
            .spawn(move || {
                let (m, cv) = &*s;
                let mut stopped = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                while !*stopped {
                    let interval = Duration::from_millis(interval_ms.load(std::sync::atomic::Ordering::Relaxed));
                    let (g, timeout) =
                        cv.wait_timeout(stopped, interval).unwrap_or_else(std::sync::PoisonError::into_inner);
                    stopped = g;
                    if !*stopped && timeout.timed_out() {
                        let _pass = pass.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                        sweep(&zones, &pcps, true, true);
                    }
                }
            })
            .ok();
        Worker { stop, thread }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let (m, cv) = &*self.stop;
        *m.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
