//! Building a handle (`free_area_init`, `build_all_zonelists`, `setup_per_zone_wmarks`,
//! `zone_pcp_init`, mm/mm_init.c and mm/page_alloc.c): the arena mapped, every frame freed
//! into its zone's buddy, the watermarks and the per-CPU lists' sizes set, the worker started.
//!
//! Invariant after `Zonal::new`: every frame of every zone is free (`nr_free == managed`).

use super::*;

impl Zonal {
    /// Builds an allocator: maps each node's memory and puts it all on the free lists.
    ///
    /// A handle built here cannot publish itself (its server shares it: see
    /// [`Zonal::shared`]); asked to, by the config key `publish=1` or by `ZONAL_PUBLISH=1`
    /// in the environment, it refuses with an error naming what asked, rather than ignore
    /// either (the two routes agree: [`Zonal::shared`] publishes on either).
    pub fn new(config: Config) -> Result<Zonal> {
        config.validate()?;
        if config.publish {
            return Err(Error::InvalidConfig(
                "config `publish`: a published handle is shared with its server thread; build it with \
                 Zonal::shared (the C ABI's zonal_create does), or call publish on an Arc<Zonal>"
                    .into(),
            ));
        }
        if crate::config::publish_from_env()? {
            return Err(Error::InvalidConfig(
                "ZONAL_PUBLISH=1 asks to publish this handle, but a handle built by Zonal::new cannot publish \
                 (its server shares it): build it with Zonal::shared, which publishes it, or unset ZONAL_PUBLISH"
                    .into(),
            ));
        }
        Zonal::build(config)
    }

    /// [`Zonal::new`] without its publishing checks: the body [`Zonal::shared`] builds with
    /// before it publishes.
    pub(crate) fn build(config: Config) -> Result<Zonal> {
        config.validate()?;
        let max_order = Order(config.max_order);
        let topo = config.topology;
        let arena = Arena::new(&topo, max_order, config.arena)?;
        let mut zones = Vec::new();
        let mut node_zones = Vec::new();
        let mut block_zone = vec![NO_ZONE; arena.span_pages() >> max_order.0];
        let nr_cpus = topo.nr_cpus();
        let vm_zone_stat: Arc<ZoneCounters> = Arc::default();
        let map = Arc::new(mem_map::MemMap::new(arena.span_pages()));
        for (nid, mem) in arena.nodes().iter().enumerate() {
            let id = ZoneId(zones.len() as u16);
            let node = NodeId(nid as u16);
            let z = Zone::with_counters(
                id,
                node,
                mem_map::ZoneMap::new(Arc::clone(&map), mem.start_pfn, mem.nr_pages),
                max_order,
                nr_cpus,
                Arc::clone(&vm_zone_stat),
            );
            let first = mem.start_pfn.0 >> max_order.0;
            let last = (mem.start_pfn.0 + mem.nr_pages - 1) >> max_order.0;
            block_zone[first..=last].fill(id.0);
            zones.push(z);
            node_zones.push(vec![id]);
        }
        let zonelists = zonelist::build_zonelists(&topo, &node_zones);
        let zlcs = zonelists
            .iter()
            .map(|l| ZonelistCache::new(l.fallback.iter().map(|z| zones[z.0 as usize].node.0)))
            .collect();
        let lowmem_pages = zones.iter().map(|z| z.managed).sum();
        let min_free = match config.min_free_kbytes {
            Some(kb) => check_min_free_kbytes(kb, lowmem_pages)?,
            None => zone::default_min_free_kbytes(lowmem_pages),
        };
        let zones: Arc<[Zone]> = zones.into();
        for z in zones.iter() {
            z.setup_watermarks(min_free, lowmem_pages, config.watermark_scale_factor);
        }
        let local_zone = (0..nr_cpus)
            .map(|c| {
                let nid = topo.cpu_to_node(CpuId(c as u32));
                zonelists[nid.0 as usize].fallback.first().map_or(NO_ZONE, |z| z.0)
            })
            .collect::<Box<[u16]>>();
        let nz = zones.len();
        let local_is_hit: Box<[bool]> = local_zone
            .iter()
            .enumerate()
            .map(|(c, &z)| node_zones[topo.cpu_to_node(CpuId(c as u32)).0 as usize].iter().any(|id| id.0 == z))
            .collect();
        // The fast paths count their allocations as local hits: a CPU whose first zone is on
        // another node (a memoryless node's) takes the general path, which charges each one.
        let local_zone: Box<[u16]> =
            local_zone.iter().zip(local_is_hit.iter()).map(|(&z, &hit)| if hit { z } else { NO_ZONE }).collect();
        let fraction = config.percpu_pagelist_high_fraction;
        let pcps: Arc<[PerCpuPages]> = (0..nr_cpus)
            .flat_map(|cpu| zones.iter().map(move |z| (cpu, z)))
            .map(|(cpu, z)| {
                let (batch, high_min, high_max) = pcp_sizes(&topo, z, fraction);
                if config.pcp {
                    let mut lists = PerCpuPages::new(cpu as u32, batch, high_min, high_max).watching(z);
                    // A virtual CPU's lists: only a thread acting as it reaches them, never a
                    // section, so their caches stay shut.
                    if topo.is_virtual(CpuId(cpu as u32)) {
                        lists = lists.virtual_cpu();
                    }
                    // The CPU's local lists (the zone on its node, which its fast paths
                    // take), and only they, route frees and own runs: the fast free's
                    // section relies on it (a run its CPU owns lies in its local lists'
                    // span, see `pcp::rseq::push_frame`).
                    if local_zone[cpu] == z.id.0 {
                        lists.routing()
                    } else {
                        lists
                    }
                } else {
                    PerCpuPages::new(cpu as u32, 1, 0, 0)
                }
            })
            .collect();
        // The zones keep their lists' gates (their `above_low` for the allocation sections).
        for z in zones.iter() {
            crate::pcp::ZoneLists::install(z, Arc::clone(&pcps), zones.len());
        }
        // Decide now (and register with membarrier, which can take milliseconds) whether the
        // rseq fast path runs, rather than inside the first allocation.
        let id = NEXT_HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let rseq = if config.pcp && pcp::rseq::enabled() { sys::rseq_offset() } else { None };
        let key = key::FastKey::new(rseq, mempolicy::policy_bit(id));
        let rseq_off = key.load().rseq();
        // `LOCAL_CPUS` entries, whatever the CPU count (the sections bound the id with it).
        let local_pcp: Box<[usize]> = (0..pcp::rseq::LOCAL_CPUS)
            .map(|c| match (local_zone.get(c), rseq_off) {
                (None, _) => std::ptr::from_ref(&pcp::rseq::ABSENT_STANDIN) as usize,
                (Some(&NO_ZONE), _) | (_, None) => std::ptr::from_ref(&pcp::rseq::LOCKED_STANDIN) as usize,
                (Some(&z), _) => std::ptr::from_ref(&pcps[c * nz + z as usize]) as usize,
            })
            .collect();
        let zone_pcp: Box<[usize]> = (0..nz)
            .flat_map(|z| (0..nr_cpus).map(move |c| c * nz + z))
            .map(|i| std::ptr::from_ref(&pcps[i]) as usize)
            .collect();
        // Addresses of the boxes' and the vector's heap buffers, which moving them into the
        // handle leaves in place and which nothing changes after.
        let free_table = pcp::rseq::FrameTable {
            local: local_pcp.as_ptr(),
            nr_cpus,
            remote: zone_pcp.as_ptr(),
            nr_zones: nz,
            block_zone: block_zone.as_ptr(),
            nr_blocks: block_zone.len(),
            block_shift: max_order.0 as u64,
        };
        let nr_zone_stats = nr_cpus * zones.len();
        let stat_interval_ms = Arc::new(std::sync::atomic::AtomicU64::new(stat_interval_ms(config.stat_interval)));
        let pass = Arc::new(std::sync::RwLock::new(()));
        let worker =
            Worker::start(Arc::clone(&zones), Arc::clone(&pcps), Arc::clone(&stat_interval_ms), Arc::clone(&pass));
        let z = Zonal {
            id,
            topo,
            mem: Memory {
                zones,
                node_zones,
                zonelists,
                zlcs,
                zlc_clock: std::sync::OnceLock::new(),
                zlc_epoch_ms: sys::coarse_now_ms(),
                vm_zone_stat,
                block_zone,
                map: mem_map::MapRef::new(map),
                max_order,
                lowmem_pages,
                arena,
            },
            cpus: PerCpuSets {
                nr_cpus,
                pcps,
                events: (0..nr_cpus).map(|_| PerCpuEvents::default()).collect(),
                pcp_enabled: config.pcp,
                local_zone,
                local_pcp,
                zone_pcp,
                free_table,
            },
            key,
            numa: NumaCounting {
                zone_stats: (0..nr_zone_stats).map(|_| PerCpuZoneStat::default()).collect(),
                shared: (0..nz).map(|_| ZoneNumaShared::default()).collect(),
                strategy: std::sync::atomic::AtomicU8::new(0),
                threshold: std::sync::atomic::AtomicU16::new(vmstat::NUMA_STATS_THRESHOLD),
                mode: std::sync::Mutex::new(NumaStatsMode::Auto),
                fast_base: (0..nr_cpus).map(|_| AtomicU64::new(0)).collect(),
                fast_frozen: (0..nr_cpus).map(|_| AtomicU64::new(0)).collect(),
            },
            sources: Sources::default(),
            tunable_sources: Sources::default(),
            tun: Tunables {
                bulk_per_page: std::sync::atomic::AtomicBool::new(false),
                percpu_pagelist_high_fraction: AtomicU32::new(fraction),
                stat_interval_ms,
                min_free_kbytes: AtomicU64::new(min_free),
                watermark_scale_factor: AtomicU64::new(config.watermark_scale_factor as u64),
                zlc_on: std::sync::atomic::AtomicBool::new(true),
                zlc_interval_ms: AtomicU64::new(1000),
                log: std::sync::Mutex::new(TunableLog::new(
                    "vmstat: NUMA stat updates are skipped unless they have been used",
                )),
            },
            worker: Some(worker),
            pass,
            attached: std::sync::Mutex::new(None),
        };
        // The fork registry's child handler points the sections' table at stand-ins.
        let z = z.registered_for_fork();
        mempolicy::register_handle(z.id);
        z.sysctl_from_env()?;
        Ok(z)
    }

    /// Recomputes every zone's watermarks from `min_free_kbytes` and `watermark_scale_factor`.
    pub(super) fn setup_per_zone_wmarks(&self) {
        let mfk = self.tun.min_free_kbytes.load(Ordering::Relaxed);
        let wsf = self.tun.watermark_scale_factor.load(Ordering::Relaxed) as u32;
        for z in self.mem.zones.iter() {
            z.setup_watermarks(mfk, self.mem.lowmem_pages, wsf);
        }
        // high follows the low watermark when the fraction is 0.
        self.update_pcp_sizes();
    }

    /// Recomputes every pcp's batch and high bounds from the zones and the fraction
    /// (`zone_pcp_update`).
    pub(super) fn update_pcp_sizes(&self) {
        if !self.cpus.pcp_enabled {
            return;
        }
        let fraction = self.tun.percpu_pagelist_high_fraction.load(Ordering::Relaxed);
        for (i, p) in self.cpus.pcps.iter().enumerate() {
            let z = &self.mem.zones[i % self.mem.zones.len()];
            let (batch, high_min, high_max) = pcp_sizes(&self.topo, z, fraction);
            p.lock(z).with(|inner| pcp::set_high_and_batch(z, inner, batch, high_min, high_max));
        }
    }
}

/// (batch, high_min, high_max) of a zone's pcps (`zone_set_pageset_high_and_batch`).
pub(super) fn pcp_sizes(topo: &Topology, z: &Zone, fraction: u32) -> (usize, usize, usize) {
    let batch = pcp::zone_batchsize(z.managed);
    let node_cpus = topo.nodes()[z.node.0 as usize].cpus.len();
    let low = z.watermark(Watermark::Low);
    let size = |f| pcp::zone_highsize(low, z.managed, batch, node_cpus, topo.nr_cpus(), f);
    if fraction != 0 {
        let h = size(fraction);
        (batch, h, h)
    } else {
        let (min, max) = (size(0), size(pcp::MIN_PERCPU_PAGELIST_HIGH_FRACTION));
        (batch, min, max.max(min))
    }
}
