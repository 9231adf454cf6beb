//! Reading the zone counters and the per-CPU lists' figures (`zone_page_state`,
//! `zone_page_state_snapshot`, `global_zone_page_state`), and the invariant walk.
//!
//! Invariant, per zone and quiescent: `nr_free + pcp + allocated == managed`
//! ([`Zonal::check_invariants`]).

use super::*;

impl Zonal {
    /// One CPU's pcp figures for a zone: (count, high, batch, high_min, high_max).
    pub fn pcp_info(&self, cpu: usize, zone: ZoneId) -> Option<PcpInfo> {
        if cpu >= self.cpus.nr_cpus || zone.0 as usize >= self.mem.zones.len() {
            return None;
        }
        // Lists only, no fence: the count is the lists' (and the locked outbox's) plus the
        // caches', the rseq outbox's and the inbox's lengths as read.
        let pcp = self.pcp(cpu, zone);
        Some(pcp.lock_lists(&self.mem.zones[zone.0 as usize]).with(|p| PcpInfo {
            count: p.held() + pcp.every_cache_frames() + pcp.inbox().len_hint(),
            high: p.high,
            batch: p.batch,
            high_min: p.high_min,
            high_max: p.high_max,
        }))
    }

    /// One CPU's pageset of a zone as `(count, high, batch)`, read without any lock (the
    /// lists' figures as of their last unlock, the rseq cache as it is): what the reports
    /// print, so that a report, even one served to another process, never holds up an
    /// allocation. Exact once allocation stops; [`Zonal::pcp_info`] locks for the truth.
    pub(crate) fn pageset_hint(&self, cpu: usize, zone: ZoneId) -> Option<(usize, usize, usize)> {
        (cpu < self.cpus.nr_cpus && (zone.0 as usize) < self.mem.zones.len())
            .then(|| self.pcp(cpu, zone).pageset_hint())
    }

    /// Free frames of a node in its buddy lists (`NR_FREE_PAGES`: frames on per-CPU lists are
    /// not counted, as in Linux; [`Zonal::nr_pcp_pages`] counts those).
    pub fn nr_free_pages(&self, nid: NodeId) -> Result<usize> {
        let zones = self.node_zones(nid)?;
        let _settled = self.settled();
        Ok(zones.iter().map(|z| self.mem.zones[z.0 as usize].page_state_snapshot(ZoneStatItem::NrFreePages)).sum())
    }

    /// Free frames of a node in its buddy lists, read without any lock (Linux's
    /// `zone_page_state` is the same idea: a read of a shared counter, nothing waited for):
    /// each zone's exact free count as of the last release of its zone lock, one relaxed
    /// load per zone. It allocates nothing, takes no lock and never waits for a housekeeping
    /// pass, so a signal handler may call it (where [`Zonal::nr_free_pages`], which holds off
    /// the passes for an exact sum of the per-CPU diffs, may wait). Behind the truth by the
    /// frees and allocations under a zone lock at the moment of the read; equal to
    /// [`Zonal::nr_free_pages`] once allocation stops.
    pub fn nr_free_pages_approx(&self, nid: NodeId) -> Result<usize> {
        let zones = self.node_zones(nid)?;
        Ok(zones.iter().map(|z| self.mem.zones[z.0 as usize].nr_free_exact()).sum())
    }

    /// A zone counter as folded (`zone_page_state`): what the fast paths read, behind the
    /// truth by at most `nr_cpus * stat_threshold` (and, for the pages on per-CPU lists, the
    /// caches' churn since their last lock).
    pub fn zone_page_state(&self, zone: ZoneId, item: ZoneStatItem) -> Result<usize> {
        Ok(self.zone_item(zone, item)?.page_state(item))
    }

    /// A zone, checked to have the item (a free-block count of an order it has).
    pub(super) fn zone_item(&self, zone: ZoneId, item: ZoneStatItem) -> Result<&Zone> {
        let z = self.zone(zone)?;
        match item {
            ZoneStatItem::NrFreeOrder(o) if o.0 > z.max_order.0 => {
                Err(Error::InvalidOrder { order: o.0 as u32, max_order: z.max_order })
            }
            _ => Ok(z),
        }
    }

    /// A zone counter with every CPU's unfolded part added (`zone_page_state_snapshot`):
    /// exact once allocation stops.
    pub fn zone_page_state_snapshot(&self, zone: ZoneId, item: ZoneStatItem) -> Result<usize> {
        let z = self.zone_item(zone, item)?;
        let _settled = self.settled();
        Ok(self.snapshot(z, item))
    }

    /// [`Zonal::zone_page_state_snapshot`] for a caller that holds [`Zonal::settled`].
    pub(crate) fn snapshot(&self, z: &Zone, item: ZoneStatItem) -> usize {
        let v = z.page_state_snapshot(item);
        if item != ZoneStatItem::NrPcpPages {
            return v;
        }
        let churn: isize = (0..self.cpus.nr_cpus).map(|c| self.pcp(c, z.id).unsettled()).sum();
        (v as isize + churn).max(0) as usize + self.thp_on_lists(z.id)
    }

    /// Frames on the CPUs' THP lists of a zone, which its `nr_zone_pcp_pages` counter leaves
    /// out (see `PerCpuPages::thp_pages`): the readers of that counter add them.
    pub(crate) fn thp_on_lists(&self, zone: ZoneId) -> usize {
        (0..self.cpus.nr_cpus).map(|c| self.pcp(c, zone).thp_pages()).sum()
    }

    /// Frames handed out from a zone (`managed - free - on per-CPU lists`, from snapshots).
    pub fn zone_allocated_pages(&self, zone: ZoneId) -> Result<usize> {
        let z = self.zone(zone)?;
        let _settled = self.settled();
        Ok(self.allocated(z))
    }

    /// [`Zonal::zone_allocated_pages`] for a caller that holds [`Zonal::settled`].
    pub(crate) fn allocated(&self, z: &Zone) -> usize {
        let free = self.snapshot(z, ZoneStatItem::NrFreePages);
        z.managed.saturating_sub(free + self.snapshot(z, ZoneStatItem::NrPcpPages))
    }

    /// A zone counter over every zone as folded (`global_zone_page_state`).
    pub fn global_page_state(&self, item: ZoneStatItem) -> usize {
        let thp = if item == ZoneStatItem::NrPcpPages {
            self.mem.zones.iter().map(|z| self.thp_on_lists(z.id)).sum()
        } else {
            0
        };
        self.mem.vm_zone_stat.get(item) + thp
    }

    /// A zone counter over every zone, exact once allocation stops.
    pub fn global_page_state_snapshot(&self, item: ZoneStatItem) -> usize {
        let _settled = self.settled();
        self.global_snapshot(item)
    }

    /// [`Zonal::global_page_state_snapshot`] for a caller that holds [`Zonal::settled`].
    pub(crate) fn global_snapshot(&self, item: ZoneStatItem) -> usize {
        self.mem.zones.iter().filter(|z| self.zone_item(z.id, item).is_ok()).map(|z| self.snapshot(z, item)).sum()
    }

    /// `stat_threshold` of a zone as CPU `cpu` applies it (`vm stats threshold`), and whether
    /// it is the pressure threshold.
    pub fn zone_stat_threshold(&self, zone: ZoneId, cpu: usize) -> Result<(usize, bool)> {
        let z = self.zone(zone)?;
        Ok((z.stat_threshold(cpu), z.under_pressure()))
    }

    /// `percpu_drift_mark` of a zone (0: the drift never decides a watermark check).
    pub fn zone_percpu_drift_mark(&self, zone: ZoneId) -> Result<usize> {
        Ok(self.zone(zone)?.percpu_drift_mark())
    }

    /// Frames on every CPU's lists for a node's zones (their caches, outboxes and inboxes
    /// too) and on their transfer lists, read without their locks (each list as of its last
    /// unlock, each rseq cache as it is) but with the housekeeping pass held off
    /// (`Zonal::settled`): exact once allocation stops.
    pub fn nr_pcp_pages(&self, nid: NodeId) -> Result<usize> {
        let zones = self.node_zones(nid)?;
        let _settled = self.settled();
        let lists: usize = (0..self.cpus.nr_cpus)
            .flat_map(|c| zones.iter().map(move |z| (c, *z)))
            .map(|(c, z)| self.pcp(c, z).pageset_hint().0)
            .sum();
        Ok(lists + zones.iter().map(|z| self.mem.zones[z.0 as usize].transfer().len_hint()).sum::<usize>())
    }

    /// Free blocks of one order on a node, over its zones.
    pub fn nr_free_blocks(&self, nid: NodeId, order: u32) -> Result<usize> {
        let order = self.check_order(order)?;
        Ok(self.node_zones(nid)?.iter().map(|z| self.mem.zones[z.0 as usize].free_blocks()[order.0 as usize]).sum())
    }

    /// Checks every zone's and every per-CPU list's invariants: `free + pcp + allocated ==
    /// managed` per zone, pcp counts match their lists and stay within `high + batch`, and no
    /// frame is in two places. Returns the allocated frames. Call while no other thread
    /// allocates or frees.
    pub fn check_invariants(&self) -> std::result::Result<usize, String> {
        let _settled = self.settled();
        let mut allocated = 0;
        for z in self.mem.zones.iter() {
            let mut on_pcp = 0;
            for c in 0..self.cpus.nr_cpus {
                // Lists only, no fence: the caller keeps every section out, so the cache can
                // be read as it stands.
                let pcp = self.pcp(c, z.id);
                on_pcp += pcp::check_inbox(z, c)?;
                on_pcp += pcp.lock_lists(z).with(|p| -> std::result::Result<usize, String> {
                    let cached = pcp.check_cache(z)?;
                    let outbox = pcp.check_outbox(z)?;
                    if p.count + cached > p.high + p.batch {
                        return Err(format!(
                            "zone {}: cpu {c} holds {} + {cached} cached above high {} + batch {}",
                            z.id.0, p.count, p.high, p.batch
                        ));
                    }
                    let thp = pcp.check_thp_cache(z, p.list_len(PCP_THP_ORDER))?;
                    Ok(pcp::check(z, p)? + cached + outbox + thp)
                })?;
            }
            on_pcp += pcp::check_transfer(z)?;
            // Only a CPU's local lists own runs, and only runs wholly in their zone: the fast
            // free's section trusts a run its CPU owns to lie in its local lists' zone (see
            // `pcp::rseq::push_frame`).
            let mut run = z.start_pfn.0 >> mem_map::RUN_ORDER.0 << mem_map::RUN_ORDER.0;
            while run < z.start_pfn.0 + z.spanned {
                let pfn = Pfn(run.max(z.start_pfn.0));
                let owner = z.run_owner(pfn);
                if owner != mem_map::NO_OWNER
                    && (!z.holds_run(pfn) || self.cpus.local_zone.get(owner as usize) != Some(&z.id.0))
                {
                    return Err(format!(
                        "zone {}: the run at frame {run} is owned by cpu {owner}, whose local zone does not hold it",
                        z.id.0
                    ));
                }
                run += 1 << mem_map::RUN_ORDER.0;
            }
            let counted = self.snapshot(z, ZoneStatItem::NrPcpPages);
            if counted != on_pcp {
                return Err(format!("zone {}: nr_zone_pcp_pages {counted} but the lists hold {on_pcp}", z.id.0));
            }
            allocated += z.check_invariants(on_pcp)?;
        }
        Ok(allocated)
    }
}

/// One CPU's pcp figures for one zone (the `pagesets` of `/proc/zoneinfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PcpInfo {
    /// Frames on the lists.
    pub count: usize,
    /// Drain threshold.
    pub high: usize,
    /// Refill and drain unit.
    pub batch: usize,
    /// Lower bound of `high`.
    pub high_min: usize,
    /// Upper bound of `high`.
    pub high_max: usize,
}
