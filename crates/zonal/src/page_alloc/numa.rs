//! NUMA event counting (`zone_statistics`, `numa_stats_mode`; seeds 000, 001, 002): the
//! three strategies, the static key, and the reads that sum every form.
//!
//! Locking: the mode lock serialises changes of the key and strategy; counting itself is
//! per-CPU stores or atomic adds, never a lock.

use super::*;

impl Zonal {
    /// `zone_statistics`: charges `nr` frames allocated from `z` to the NUMA counters. Hit on
    /// `z` when its node is the preferred zone's, else miss on `z` and foreign on the
    /// preferred zone; local or other on `z` by the allocating CPU's node; an interleave hit
    /// when the interleave policy got the node it asked for.
    #[inline(never)]
    pub(super) fn zone_statistics(
        &self,
        cpu: usize,
        ctx: &AllocContext<'_>,
        z: &Zone,
        nr: u64,
        interleave: Option<NodeId>,
    ) {
        // Linux's preferred_zoneref: the first zone of the zonelist the nodemask allows.
        let preferred = match ctx.nodemask {
            None => ctx.zonelist.first().map_or(z, |id| &self.mem.zones[id.0 as usize]),
            Some(m) => {
                ctx.zonelist.iter().map(|id| &self.mem.zones[id.0 as usize]).find(|pz| m.contains(pz.node)).unwrap_or(z)
            }
        };
        self.numa_charge(cpu, z, preferred, nr, interleave);
    }

    /// Charges `nr` frames allocated from `z` for an allocation that preferred `preferred`.
    #[inline(never)]
    pub(super) fn numa_charge(&self, cpu: usize, z: &Zone, preferred: &Zone, nr: u64, interleave: Option<NodeId>) {
        let nz = self.mem.zones.len();
        let strategy = self.numa_strategy();
        let threshold = self.numa.threshold.load(std::sync::atomic::Ordering::Relaxed);
        let count = |zone: &Zone, s: NumaStat, n: u64| {
            let pcpu = &self.numa.zone_stats[cpu * nz + zone.id.0 as usize];
            let shared = &self.numa.shared[zone.id.0 as usize];
            match strategy {
                NumaStrategy::PerCpu => pcpu.add(s, n),
                NumaStrategy::Threshold => pcpu.add_diff(s, n, threshold, shared),
                NumaStrategy::Shared => shared.add(s, n),
            }
        };
        if z.node == preferred.node {
            count(z, NumaStat::NumaHit, nr);
        } else {
            count(z, NumaStat::NumaMiss, nr);
            count(preferred, NumaStat::NumaForeign, nr);
        }
        let local = self.topo.cpu_to_node(CpuId(cpu as u32));
        count(z, if z.node == local { NumaStat::NumaLocal } else { NumaStat::NumaOther }, nr);
        if interleave == Some(z.node) {
            count(z, NumaStat::NumaInterleaveHit, nr);
        }
    }

    /// A reader of the NUMA counters: in `auto` mode the first read turns counting on for good
    /// (seed 001).
    pub(super) fn numa_read_hook(&self) {
        // Already counting: nothing to turn on (reports read every counter of every zone,
        // so this runs often; the mode lock is for the one read that flips the key).
        if self.key.load().numa() != 0 {
            return;
        }
        let mode = self.numa.mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *mode == NumaStatsMode::Auto && self.key.load().numa() == 0 {
            self.set_numa_key(&mode, self.numa_on());
            self.log_line("numa stats: counters read in auto mode, updates enabled".into());
        }
    }

    /// A NUMA counter of one zone, summed over CPUs (`zone_numa_event_state`). A read: in
    /// `auto` mode it turns counting on.
    pub fn numa_stat(&self, zone: ZoneId, s: NumaStat) -> u64 {
        self.numa_read_hook();
        // A zone the allocator does not have counted nothing ([`Zonal::node_numa_stats`]
        // and the reports only ask for real zones).
        if zone.0 as usize >= self.mem.zones.len() {
            return 0;
        }
        let nz = self.mem.zones.len();
        let shared = self.numa.shared.get(zone.0 as usize).map_or(0, |sh| sh.get(s));
        let counted = (0..self.cpus.nr_cpus)
            .map(|c| self.numa.zone_stats[c * nz + zone.0 as usize].get(s))
            .fold(shared, u64::wrapping_add);
        if !matches!(s, NumaStat::NumaHit | NumaStat::NumaLocal) {
            return counted;
        }
        // The fast paths' local hits, counted as `pgalloc` on the CPUs whose local zone this
        // is (`local_zone` is set only where that zone is on the CPU's node).
        let fast_on = self.key.load().numa() == NUMA_ON_PERCPU;
        (0..self.cpus.nr_cpus)
            .filter(|&c| self.cpus.local_zone[c] == zone.0)
            .map(|c| {
                let frozen = self.numa.fast_frozen[c].load(std::sync::atomic::Ordering::Relaxed);
                if fast_on {
                    let base = self.numa.fast_base[c].load(std::sync::atomic::Ordering::Relaxed);
                    let since = counted_since(self.local_first(c), base);
                    frozen.wrapping_add(since)
                } else {
                    frozen
                }
            })
            .fold(counted, u64::wrapping_add)
    }

    /// Turns counting on or off or changes how it counts (`static_branch_enable/disable`),
    /// with the mode lock held. The per-CPU strategy's fast-path hits are counts of
    /// `local_first` since the strategy began counting: start a new base when it begins,
    /// and keep what it counted when it stops.
    pub(super) fn set_numa_key(&self, _mode: &std::sync::MutexGuard<'_, NumaStatsMode>, key: u8) {
        use std::sync::atomic::Ordering::Relaxed;
        let old = self.key.load().numa();
        if old == key {
            return;
        }
        for c in 0..self.cpus.nr_cpus {
            let now = self.local_first(c);
            if old == NUMA_ON_PERCPU {
                let since = counted_since(now, self.numa.fast_base[c].load(Relaxed));
                self.numa.fast_frozen[c].fetch_add(since, Relaxed);
            }
            if key == NUMA_ON_PERCPU {
                self.numa.fast_base[c].store(now, Relaxed);
            }
        }
        self.key.set_numa(key);
    }

    /// How NUMA events are counted now.
    #[inline]
    pub fn numa_strategy(&self) -> NumaStrategy {
        let i = self.numa.strategy.load(std::sync::atomic::Ordering::Relaxed) as usize;
        NumaStrategy::ALL[i.min(NumaStrategy::ALL.len() - 1)]
    }

    /// Switches how NUMA events are counted; counts so far stay (readers add both forms).
    pub fn set_numa_strategy(&self, s: NumaStrategy) {
        let mode = self.numa.mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let i = NumaStrategy::ALL.iter().position(|&x| x == s).unwrap_or(0) as u8;
        if self.numa.strategy.swap(i, std::sync::atomic::Ordering::Relaxed) == i {
            return;
        }
        if self.key.load().numa() != 0 {
            self.set_numa_key(&mode, self.numa_on());
        }
        drop(mode);
        self.log_line(format!("numa stats counted by {}", s.name()));
    }

    /// `numa_stat_threshold` (seed 000's strategy).
    pub fn numa_stat_threshold(&self) -> u16 {
        self.numa.threshold.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets `numa_stat_threshold`, 1..=65533 (the diff is a u16 and must hold threshold + 1).
    pub fn set_numa_stat_threshold(&self, t: u64) -> Result<()> {
        if !(1..=vmstat::NUMA_STATS_THRESHOLD as u64).contains(&t) {
            return Err(Error::InvalidConfig(format!(
                "numa_stat_threshold {t}: valid: 1..={}",
                vmstat::NUMA_STATS_THRESHOLD
            )));
        }
        self.numa.threshold.store(t as u16, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Every NUMA counter of a node, in [`NumaStat::ALL`] order (`nodeN/numastat`).
    pub fn node_numa_stats(&self, nid: NodeId) -> Result<[u64; vmstat::NR_NUMA_STATS]> {
        let zones = self.node_zones(nid)?;
        let mut out = [0u64; vmstat::NR_NUMA_STATS];
        for (i, s) in NumaStat::ALL.iter().enumerate() {
            out[i] = zones.iter().map(|z| self.numa_stat(*z, *s)).sum();
        }
        Ok(out)
    }

    /// The current `numa_stats_mode`.
    pub fn numa_stats_mode(&self) -> NumaStatsMode {
        *self.numa.mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether allocations count NUMA events now (the static key).
    pub fn numa_stats_counting(&self) -> bool {
        self.key.load().numa() != 0
    }

    /// The value of `numa_key` that turns counting on with the current strategy.
    pub(super) fn numa_on(&self) -> u8 {
        match self.numa_strategy() {
            NumaStrategy::PerCpu => NUMA_ON_PERCPU,
            NumaStrategy::Threshold => NUMA_ON_THRESHOLD,
            NumaStrategy::Shared => NUMA_ON_SHARED,
        }
    }

    /// Sets `numa_stats_mode` as seed 001 does: `strict` turns counting on, `coarse` turns it
    /// off and zeroes the counters ("users can't tell the difference between the dead state
    /// and when allocator activity is quiet"), `auto` keeps the current state until the next
    /// read. An invalid value is rejected, naming the valid ones, and the old mode stays.
    /// Each change is logged ([`Zonal::log`]).
    pub fn set_numa_stats_mode(&self, value: &str) -> Result<()> {
        let new = NumaStatsMode::parse(value).map_err(|e| {
            self.log_line(format!("Ignoring {e}"));
            Error::InvalidConfig(e)
        })?;
        let mut mode = self.numa.mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = *mode;
        if old == new {
            return Ok(());
        }
        match new {
            NumaStatsMode::Strict => self.set_numa_key(&mode, self.numa_on()),
            NumaStatsMode::Coarse => {
                // The zeroing is plain stores from this CPU: an update already past the key
                // on another CPU can write its old value back, so a counter may read a few
                // events above zero after the switch. Nothing is counted after that.
                self.set_numa_key(&mode, 0);
                for s in self.numa.zone_stats.iter() {
                    s.zero();
                }
                for f in self.numa.fast_frozen.iter() {
                    f.store(0, std::sync::atomic::Ordering::Relaxed);
                }
                for s in self.numa.shared.iter() {
                    s.zero();
                }
            }
            NumaStatsMode::Auto => {}
        }
        *mode = new;
        drop(mode);
        self.log_line(format!("numa stats changes from {} mode to {} mode", old.name(), new.name()));
        Ok(())
    }
}

/// Events counted since a base: `now - base`, or 0 when a lost per-CPU update (two threads
/// interleaving on one CPU's counter) left the counter below the base taken meanwhile.
pub(super) fn counted_since(now: u64, base: u64) -> u64 {
    let d = now.wrapping_sub(base);
    if d > u64::MAX / 2 {
        0
    } else {
        d
    }
}
