//! The machine as zonal sees it: NUMA nodes, the CPUs of each, the memory zonal manages on
//! each, and the distance matrix (Linux: `/sys/devices/system/node`, `numa=fake`).
//!
//! A topology is either read from the real machine ([`Topology::from_sys`]) or given as a
//! *fake* one by a spec string or file ([`Topology::parse`]), so that multi-node behaviour can
//! be tested on a one-node machine. Node ids inside zonal are dense (`0..nr_nodes`); a real
//! node keeps its kernel id in [`NodeInfo::os_node`] for `mbind`.
//!
//! Invariant: `distance[i][i] == LOCAL_DISTANCE`, `distance[i][j] == distance[j][i] >
//! LOCAL_DISTANCE` for `i != j`, and every CPU of the machine belongs to exactly one node.
//!
//! A fake topology may declare *virtual CPUs* beyond the machine's (`vcpus=256` over 2 real
//! ones), to measure how zonal's per-CPU costs grow with CPUs on a small machine: every
//! structure zonal keeps per CPU exists for them, but no thread runs on one by itself (the
//! kernel never reports its id), so only a thread that acts as it reaches its lists
//! (`Zonal::act_as_cpu`, for benches and tests). CPU ids stay below 8192 (`MAX_CPUS`).
//!
//! # Spec grammar
//!
//! Items separated by `,`; an item without `=` continues the value before it (so CPU lists
//! such as `0-3,8` need no quoting). Per-node values are separated by `:`.
//!
//! | key | value | default |
//! |---|---|---|
//! | `nodes` | number of nodes, 1..=1024 | the number of `sizes` or `cpus` entries |
//! | `size` | memory of every node: `256M`, `1G`, `4096K`, bytes | 64M |
//! | `sizes` | per node: `128M:256M` | `size` for each |
//! | `cpus` | per node, Linux cpulist: `0-1:2-3:` (empty: memory-only node; ids below 8192, checked before a range is expanded) | the machine's CPUs (or the `vcpus`) spread over the nodes |
//! | `vcpus` | CPU ids `0..N` in all, `N` at least the machine's CPUs and at most 8192: those from the machine's count on are virtual | the machine's CPUs |
//! | `distance` | rows of the matrix: `10 20:20 10` (entries split by spaces) | 10 local, 20 remote |
//! | `sys` | (no value) read nodes, CPUs and distances from `/sys`; `size` is then the memory zonal manages on each node | |
//! | `tiers` | per node, its memory tier, 0 the fastest: `0:1:2` (at most 15; overrides the ranking by distance that NUMA balancing's tiering computes) | none |
//!
//! In a file, one item per line, `#` starts a comment, and a line without `=` continues the
//! key above it as the next node's entry (one distance row or CPU list per line).

use crate::error::{Error, Result};
use crate::sys;
use crate::types::{CpuId, NodeId, PAGE_SIZE};
use serde::Serialize;

/// Distance of a node to itself (`LOCAL_DISTANCE`).
pub const LOCAL_DISTANCE: u32 = 10;
/// Default distance between two different nodes (`REMOTE_DISTANCE`).
pub const REMOTE_DISTANCE: u32 = 20;
/// Most nodes a topology may have (Linux's `MAX_NUMNODES` with `NODES_SHIFT=10`).
pub const MAX_NUMNODES: usize = 1024;
/// Most CPUs a topology may name (Linux's largest `NR_CPUS`, x86 `MAXSMP`): CPU lists are
/// bounded by it before they are expanded.
pub(crate) const MAX_CPUS: usize = 8192;
/// Per-node memory when a spec gives no size.
pub const DEFAULT_NODE_SIZE: u64 = 64 << 20;
/// The slowest memory tier a spec may give a node (`tiers=`): Linux's abstract distances
/// fall in 16 chunks of 128 below the bound its tiering uses.
pub const MAX_TIER: u8 = 15;

/// The limits of the machine a topology must fit: injected so tests are deterministic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Machine {
    /// CPUs the machine has (ids `0..nr_cpus`).
    pub nr_cpus: usize,
    /// Bytes of memory the machine can back.
    pub mem_total: u64,
}

impl Machine {
    /// The machine this process runs on.
    pub fn current() -> Result<Machine> {
        Ok(Machine { nr_cpus: sys::nr_cpus_configured(), mem_total: sys::mem_total()? })
    }
}

/// One node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeInfo {
    /// Dense id inside zonal.
    #[serde(serialize_with = "ser_node")]
    pub id: NodeId,
    /// The kernel's node id when read from `/sys` (used for `mbind`); `None` on a fake node.
    pub os_node: Option<u16>,
    /// Bytes of memory zonal manages on this node.
    pub mem_bytes: u64,
    /// CPUs of this node; empty for a memory-only node.
    #[serde(serialize_with = "ser_cpus")]
    pub cpus: Vec<CpuId>,
}

fn ser_node<S: serde::Serializer>(n: &NodeId, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u16(n.0)
}

fn ser_cpus<S: serde::Serializer>(c: &[CpuId], s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_seq(c.iter().map(|c| c.0))
}

/// A machine's NUMA layout. Cheap to clone; immutable once built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Topology {
    nodes: Vec<NodeInfo>,
    distance: Vec<Vec<u32>>,
    #[serde(skip)]
    cpu_to_node: Vec<NodeId>,
    /// CPU ids below this are the machine's; those from here to `nr_cpus` are virtual
    /// (declared with `vcpus=`): `nr_cpus` when there are none.
    machine_cpus: usize,
    fake: bool,
    /// Each node's memory tier as the spec gave it (`tiers=`), `None` when it gave none.
    #[serde(skip_serializing_if = "Option::is_none")]
    tiers: Option<Vec<u8>>,
}

impl Topology {
    /// Parses a spec string (see the module docs) against the current machine.
    pub fn parse(spec: &str) -> Result<Topology> {
        Self::parse_for(spec, Machine::current()?)
    }

    /// Parses a spec string against the given machine limits.
    pub fn parse_for(spec: &str, machine: Machine) -> Result<Topology> {
        let items = split_items(spec.split(',').map(|s| (s, 0)), ',')?;
        Self::from_items(&items, machine, None)
    }

    /// Reads a topology file (one item per line, see the module docs).
    pub fn from_file(path: &str) -> Result<Topology> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::InvalidConfig(format!("cannot read topology file {path}: {e}")))?;
        Self::parse_file_text(&text, path, Machine::current()?)
    }

    /// Parses the text of a topology file; `name` is used in error messages.
    pub fn parse_file_text(text: &str, name: &str, machine: Machine) -> Result<Topology> {
        let lines = text.lines().enumerate().filter_map(|(i, l)| {
            let l = l.split('#').next().unwrap_or("").trim();
            (!l.is_empty()).then_some((l, i + 1))
        });
        let items = split_items(lines, ':').map_err(|e| prefix(e, name))?;
        Self::from_items(&items, machine, Some(name))
    }

    /// A spec or a file: a path that exists is read as a file, anything else parsed as a spec.
    pub fn from_arg(arg: &str) -> Result<Topology> {
        let path = std::path::Path::new(arg);
        if path.is_file() {
            Self::from_file(arg)
        } else if !arg.contains('=') && arg != "sys" && (arg.contains('/') || path.exists()) {
            // Meant as a file (a path, and no spec item in it): say what is wrong with it.
            Err(Error::InvalidConfig(if path.exists() {
                format!("topology file {arg} is not a regular file")
            } else {
                format!("topology file {arg} does not exist (a topology is a spec such as nodes=2,size=64M, sys, or a file)")
            }))
        } else {
            Self::parse(arg)
        }
    }

    /// The real machine, from `/sys/devices/system/node`, managing `size` bytes on each node.
    pub fn from_sys(size: u64) -> Result<Topology> {
        Self::from_sys_root("/sys/devices/system/node", size, Machine::current()?)
    }

    /// Like [`Topology::from_sys`] with another root (tests point it at a copy).
    pub fn from_sys_root(root: &str, size: u64, machine: Machine) -> Result<Topology> {
        let online = sys::read_file(&format!("{root}/online"))
            .map_err(|e| Error::InvalidConfig(format!("cannot read {root}/online: {e}")))?;
        let os_ids = parse_cpulist(online.trim(), machine.nr_cpus.max(MAX_NUMNODES))
            .map_err(|e| Error::InvalidConfig(format!("{root}/online: {e}")))?;
        if os_ids.is_empty() {
            return Err(Error::InvalidConfig(format!("{root}/online lists no node")));
        }
        let mut nodes = Vec::new();
        let mut rows = Vec::new();
        for (i, &os) in os_ids.iter().enumerate() {
            let dir = format!("{root}/node{os}");
            let cpus = sys::read_file(&format!("{dir}/cpulist")).unwrap_or_default();
            let cpus = parse_cpulist(cpus.trim(), MAX_CPUS)
                .map_err(|e| Error::InvalidConfig(format!("{dir}/cpulist: {e}")))?;
            let meminfo = sys::read_file(&format!("{dir}/meminfo")).unwrap_or_default();
            if let Some(kb) = sys::meminfo_kb(&meminfo, "MemTotal:") {
                if size > kb * 1024 {
                    return Err(Error::InvalidConfig(format!(
                        "node {os}: size {} is larger than its memory ({})",
                        fmt_size(size),
                        fmt_size(kb * 1024)
                    )));
                }
            }
            let dist = sys::read_file(&format!("{dir}/distance"))
                .map_err(|e| Error::InvalidConfig(format!("cannot read {dir}/distance: {e}")))?;
            let all: Vec<u32> = dist.split_whitespace().filter_map(|d| d.parse().ok()).collect();
            // /sys lists a distance for every *possible* node; keep the online ones.
            let row = os_ids.iter().map(|&o| all.get(o as usize).copied().unwrap_or(REMOTE_DISTANCE)).collect();
            rows.push(row);
            nodes.push(NodeInfo {
                id: NodeId(i as u16),
                os_node: Some(os as u16),
                mem_bytes: size,
                cpus: cpus.into_iter().map(CpuId).collect(),
            });
        }
        Self::build(nodes, rows, machine, false, None)
    }

    fn from_items(items: &[Item], machine: Machine, file: Option<&str>) -> Result<Topology> {
        let mut nodes_n: Option<usize> = None;
        let mut size: Option<u64> = None;
        let mut sizes: Option<Vec<u64>> = None;
        let mut cpus: Option<Vec<Vec<u32>>> = None;
        let mut distance: Option<Vec<Vec<u32>>> = None;
        let mut vcpus: Option<usize> = None;
        let mut tiers: Option<Vec<u8>> = None;
        let mut sys_mode = false;
        let at = |it: &Item| match file {
            Some(f) => format!("{f}:{}: ", it.line),
            None => String::new(),
        };
        for it in items {
            let err = |msg: String| Error::InvalidConfig(format!("{}topology `{}`: {msg}", at(it), it.key));
            let seen = |b: bool| if b { Err(err("given twice".into())) } else { Ok(()) };
            match it.key.as_str() {
                "nodes" => {
                    seen(nodes_n.is_some())?;
                    let n: usize =
                        it.value.trim().parse().map_err(|_| err(format!("`{}` is not a number", it.value)))?;
                    if n == 0 || n > MAX_NUMNODES {
                        return Err(err(format!("{n} nodes: must be 1..={MAX_NUMNODES}")));
                    }
                    nodes_n = Some(n);
                }
                "size" => {
                    seen(size.is_some())?;
                    size = Some(parse_size(&it.value).map_err(err)?);
                }
                "sizes" => {
                    seen(sizes.is_some())?;
                    let v =
                        it.value.split(':').map(parse_size).collect::<std::result::Result<Vec<_>, _>>().map_err(err)?;
                    sizes = Some(v);
                }
                "cpus" => {
                    seen(cpus.is_some())?;
                    let v = it
                        .value
                        .split(':')
                        .enumerate()
                        .map(|(n, l)| parse_cpulist(l.trim(), MAX_CPUS).map_err(|e| format!("node {n}: {e}")))
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(err)?;
                    cpus = Some(v);
                }
                "distance" => {
                    seen(distance.is_some())?;
                    let v = it
                        .value
                        .split(':')
                        .enumerate()
                        .map(|(r, row)| {
                            row.split([' ', ',', '\t'])
                                .filter(|s| !s.is_empty())
                                .map(|d| d.parse::<u32>().map_err(|_| format!("row {r}: `{d}` is not a number")))
                                .collect::<std::result::Result<Vec<_>, _>>()
                        })
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(err)?;
                    distance = Some(v);
                }
                "vcpus" => {
                    seen(vcpus.is_some())?;
                    let n: usize =
                        it.value.trim().parse().map_err(|_| err(format!("`{}` is not a number", it.value)))?;
                    if n > MAX_CPUS {
                        return Err(err(format!(
                            "{n} CPUs: CPU ids are below {MAX_CPUS}, so vcpus is at most {MAX_CPUS}"
                        )));
                    }
                    if n < machine.nr_cpus {
                        return Err(err(format!(
                            "{n} CPUs, fewer than this machine's {}: vcpus counts every CPU id, the machine's \
                             included (those from {} on are virtual)",
                            machine.nr_cpus, machine.nr_cpus
                        )));
                    }
                    vcpus = Some(n);
                }
                "tiers" => {
                    seen(tiers.is_some())?;
                    let v = it
                        .value
                        .split(':')
                        .enumerate()
                        .map(|(n, t)| match t.trim().parse::<u8>() {
                            Ok(t) if t <= MAX_TIER => Ok(t),
                            _ => Err(format!("node {n}: `{}` is not a tier from 0 (fastest) to {MAX_TIER}", t.trim())),
                        })
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(err)?;
                    tiers = Some(v);
                }
                "sys" => {
                    if !it.value.is_empty() {
                        return Err(err("takes no value".into()));
                    }
                    sys_mode = true;
                }
                _ => {
                    let keys = "nodes, size, sizes, cpus, vcpus, distance, tiers, sys";
                    let msg = format!("{}topology: unknown key `{}`; valid keys: {keys}", at(it), it.key);
                    return Err(Error::InvalidConfig(msg));
                }
            }
        }
        if sys_mode {
            if nodes_n.is_some() || sizes.is_some() || cpus.is_some() || distance.is_some() || vcpus.is_some() {
                return Err(Error::InvalidConfig(
                    "topology `sys` reads nodes, cpus and distances from /sys: only `size` and `tiers` may go with it"
                        .into(),
                ));
            }
            let t = Self::from_sys_root("/sys/devices/system/node", size.unwrap_or(DEFAULT_NODE_SIZE), machine)?;
            return t.with_tiers(tiers);
        }
        let n = match (nodes_n, &sizes, &cpus) {
            (Some(n), _, _) => n,
            (None, Some(s), _) => s.len(),
            (None, None, Some(c)) => c.len(),
            (None, None, None) => match &distance {
                Some(d) => d.len(),
                None => return Err(Error::InvalidConfig("topology: say how many nodes (`nodes=N`)".into())),
            },
        };
        // Bounded before anything of size `n` (or the `n * n` distance matrix) is built.
        if n == 0 || n > MAX_NUMNODES {
            return Err(Error::InvalidConfig(format!("topology: {n} nodes: must be 1..={MAX_NUMNODES}")));
        }
        let check_len = |what: &str, len: usize| {
            if len != n {
                Err(Error::InvalidConfig(format!("topology `{what}`: {len} entries for {n} nodes")))
            } else {
                Ok(())
            }
        };
        let sizes = match sizes {
            Some(s) => {
                check_len("sizes", s.len())?;
                s
            }
            None => vec![size.unwrap_or(DEFAULT_NODE_SIZE); n],
        };
        let cpus = match cpus {
            Some(c) => {
                check_len("cpus", c.len())?;
                c
            }
            None => spread_cpus(vcpus.unwrap_or(machine.nr_cpus), n),
        };
        let distance = match distance {
            Some(d) => {
                check_len("distance", d.len())?;
                d
            }
            None => (0..n)
                .map(|i| (0..n).map(|j| if i == j { LOCAL_DISTANCE } else { REMOTE_DISTANCE }).collect())
                .collect(),
        };
        let nodes = (0..n)
            .map(|i| NodeInfo {
                id: NodeId(i as u16),
                os_node: None,
                mem_bytes: sizes[i],
                cpus: cpus[i].iter().map(|&c| CpuId(c)).collect(),
            })
            .collect();
        Self::build(nodes, distance, machine, true, vcpus)?.with_tiers(tiers)
    }

    /// Sets the tiers a spec gave, one per node.
    fn with_tiers(mut self, tiers: Option<Vec<u8>>) -> Result<Topology> {
        if let Some(t) = &tiers {
            if t.len() != self.nodes.len() {
                return Err(Error::InvalidConfig(format!(
                    "topology `tiers`: {} entries for {} nodes",
                    t.len(),
                    self.nodes.len()
                )));
            }
        }
        self.tiers = tiers;
        Ok(self)
    }

    /// Checks and builds a topology; `vcpus` (fake topologies only) declares CPU ids up to
    /// it, at least the machine's count (checked by the parser).
    fn build(
        nodes: Vec<NodeInfo>,
        distance: Vec<Vec<u32>>,
        machine: Machine,
        fake: bool,
        vcpus: Option<usize>,
    ) -> Result<Topology> {
        let n = nodes.len();
        let bad = |m: String| Err(Error::InvalidConfig(format!("topology: {m}")));
        // Every row's length before any value: the symmetry test reads row j while at row i
        // (`distance=10 20:` indexed an empty second row; found by the topology fuzz target).
        if let Some((i, row)) = distance.iter().enumerate().find(|(_, row)| row.len() != n) {
            return bad(format!("distance row {i} has {} entries for {n} nodes", row.len()));
        }
        for (i, row) in distance.iter().enumerate() {
            for (j, &d) in row.iter().enumerate() {
                if d == 0 {
                    return bad(format!("distance[{i}][{j}] is 0"));
                }
                if d > 255 {
                    return bad(format!("distance[{i}][{j}] = {d}: distances are at most 255"));
                }
                if i == j && d != LOCAL_DISTANCE {
                    return bad(format!("distance[{i}][{i}] = {d}: a node's distance to itself is {LOCAL_DISTANCE}"));
                }
                if i != j && d <= LOCAL_DISTANCE {
                    return bad(format!("distance[{i}][{j}] = {d}: remote distances must exceed {LOCAL_DISTANCE}"));
                }
                if distance[j][i] != d {
                    return bad(format!(
                        "distance is not symmetric: [{i}][{j}] = {d} but [{j}][{i}] = {}",
                        distance[j][i]
                    ));
                }
            }
        }
        let mut total: u64 = 0;
        for node in &nodes {
            if node.mem_bytes < PAGE_SIZE as u64 || node.mem_bytes % PAGE_SIZE as u64 != 0 {
                return bad(format!("node {}: size {} must be a non-zero multiple of 4K", node.id.0, node.mem_bytes));
            }
            // A zone's free lists index its frames with u32 links.
            if node.mem_bytes / PAGE_SIZE as u64 > crate::buddy::MAX_ZONE_FRAMES as u64 {
                return bad(format!(
                    "node {}: size {} is more than a zone can hold ({} frames of 4K)",
                    node.id.0,
                    fmt_size(node.mem_bytes),
                    crate::buddy::MAX_ZONE_FRAMES
                ));
            }
            if node.mem_bytes > machine.mem_total {
                return bad(format!(
                    "node {}: size {} is larger than the machine's memory ({})",
                    node.id.0,
                    fmt_size(node.mem_bytes),
                    fmt_size(machine.mem_total)
                ));
            }
            total = total.saturating_add(node.mem_bytes);
        }
        if total > machine.mem_total {
            return bad(format!(
                "the nodes need {} in all, more than the machine's memory ({})",
                fmt_size(total),
                fmt_size(machine.mem_total)
            ));
        }
        // Real topologies may list CPUs beyond the configured count (hotplug); fake ones may
        // not, unless they declare them virtual (`vcpus`).
        let nr_cpus = if fake {
            vcpus.unwrap_or(machine.nr_cpus)
        } else {
            nodes.iter().flat_map(|n| n.cpus.iter()).map(|c| c.0 as usize + 1).max().unwrap_or(1).max(machine.nr_cpus)
        };
        let mut cpu_to_node: Vec<Option<NodeId>> = vec![None; nr_cpus];
        for node in &nodes {
            for &c in &node.cpus {
                if c.0 as usize >= nr_cpus {
                    // A typo stays an error: naming more CPUs than the machine has takes a
                    // declaration.
                    return bad(match vcpus {
                        Some(v) => format!(
                            "node {}: cpu {} does not exist (vcpus={v} declares cpus 0-{})",
                            node.id.0,
                            c.0,
                            v - 1
                        ),
                        None => format!(
                            "node {}: cpu {} does not exist (this machine has cpus 0-{}; declare virtual CPUs with \
                             vcpus=N, the CPU ids 0..N in all, N up to {MAX_CPUS})",
                            node.id.0,
                            c.0,
                            nr_cpus - 1
                        ),
                    });
                }
                if let Some(other) = cpu_to_node[c.0 as usize] {
                    return bad(format!("cpu {} is in node {} and node {}", c.0, other.0, node.id.0));
                }
                cpu_to_node[c.0 as usize] = Some(node.id);
            }
        }
        // CPUs no node lists go to the first node with CPUs (or node 0), as Linux gives a CPU
        // without a known node to node 0.
        let fallback = nodes.iter().find(|n| !n.cpus.is_empty()).map_or(NodeId(0), |n| n.id);
        let cpu_to_node = cpu_to_node.into_iter().map(|n| n.unwrap_or(fallback)).collect();
        let machine_cpus = if fake { machine.nr_cpus.min(nr_cpus) } else { nr_cpus };
        Ok(Topology { nodes, distance, cpu_to_node, machine_cpus, fake, tiers: None })
    }

    /// The nodes, by id.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// Number of nodes.
    pub fn nr_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Distance between two nodes (`node_distance`); a node outside the topology is an
    /// [`Error::InvalidNode`], not a panic.
    #[inline]
    pub fn distance(&self, a: NodeId, b: NodeId) -> Result<u32> {
        self.distance
            .get(a.0 as usize)
            .and_then(|row| row.get(b.0 as usize))
            .copied()
            .ok_or_else(|| self.invalid_node(if (a.0 as usize) < self.nodes.len() { b } else { a }))
    }

    fn invalid_node(&self, node: NodeId) -> Error {
        Error::InvalidNode { node, nr_nodes: self.nodes.len() }
    }

    /// Node of a CPU (`cpu_to_node`); CPUs outside the table map to node 0.
    #[inline]
    pub fn cpu_to_node(&self, cpu: CpuId) -> NodeId {
        self.cpu_to_node.get(cpu.0 as usize).copied().unwrap_or(NodeId(0))
    }

    /// Number of CPU ids this topology covers, virtual ones included.
    pub fn nr_cpus(&self) -> usize {
        self.cpu_to_node.len()
    }

    /// Number of CPU ids of the machine: those at or above it (below [`Topology::nr_cpus`])
    /// are virtual, declared with `vcpus=` (equal to `nr_cpus` when there are none).
    pub fn nr_machine_cpus(&self) -> usize {
        self.machine_cpus
    }

    /// Whether `cpu` is a virtual CPU of this topology: declared beyond the machine's
    /// (`vcpus=`), so that no thread runs on it by itself. False for ids outside the
    /// topology.
    #[inline]
    pub fn is_virtual(&self, cpu: CpuId) -> bool {
        (self.machine_cpus..self.nr_cpus()).contains(&(cpu.0 as usize))
    }

    /// Whether this is a fake topology (nodes are ranges of the machine's memory).
    pub fn is_fake(&self) -> bool {
        self.fake
    }

    /// Whether a node has CPUs (`node_state(n, N_CPU)`); a node outside the topology is an
    /// [`Error::InvalidNode`], not a panic.
    pub fn has_cpus(&self, n: NodeId) -> Result<bool> {
        self.nodes.get(n.0 as usize).map(|node| !node.cpus.is_empty()).ok_or_else(|| self.invalid_node(n))
    }

    /// Each node's memory tier as the spec gave it (`tiers=`, 0 the fastest), `None` when it
    /// gave none: NUMA balancing's tiering then ranks the nodes by distance itself.
    pub fn tier_override(&self) -> Option<&[u8]> {
        self.tiers.as_deref()
    }

    /// The topology written back as a spec string that parses to the same topology.
    pub fn to_spec(&self) -> String {
        let sizes: Vec<String> = self.nodes.iter().map(|n| fmt_size(n.mem_bytes)).collect();
        let cpus: Vec<String> = self.nodes.iter().map(|n| fmt_cpulist(&n.cpus)).collect();
        let rows: Vec<String> =
            self.distance.iter().map(|r| r.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")).collect();
        // Before the CPU lists, which name the virtual CPUs.
        let vcpus =
            if self.nr_cpus() > self.machine_cpus { format!("vcpus={},", self.nr_cpus()) } else { String::new() };
        let tiers = match &self.tiers {
            Some(t) => format!(",tiers={}", t.iter().map(u8::to_string).collect::<Vec<_>>().join(":")),
            None => String::new(),
        };
        format!(
            "nodes={},sizes={},{vcpus}cpus={},distance={}{tiers}",
            self.nodes.len(),
            sizes.join(":"),
            cpus.join(":"),
            rows.join(":")
        )
    }

    /// A human-readable description (the `zonal topology` report).
    pub fn describe(&self) -> String {
        let mut s = String::new();
        let kind = if self.fake { "fake" } else { "real" };
        s.push_str(&format!("{} topology, {} node(s), {} cpu(s)", kind, self.nodes.len(), self.nr_cpus()));
        if self.nr_cpus() > self.machine_cpus {
            s.push_str(&format!(
                ", {} of them virtual ({}: no thread runs on them by itself)",
                self.nr_cpus() - self.machine_cpus,
                fmt_cpulist(&(self.machine_cpus..self.nr_cpus()).map(|c| CpuId(c as u32)).collect::<Vec<_>>())
            ));
        }
        s.push('\n');
        for n in &self.nodes {
            let cpus = if n.cpus.is_empty() { "(memory only)".to_string() } else { fmt_cpulist(&n.cpus) };
            s.push_str(&format!("node {} size: {} cpus: {}\n", n.id.0, fmt_size(n.mem_bytes), cpus));
        }
        s.push_str("node distances:\nnode ");
        for n in &self.nodes {
            s.push_str(&format!("{:>4}", n.id.0));
        }
        s.push('\n');
        for (i, row) in self.distance.iter().enumerate() {
            s.push_str(&format!("{i:>4}:"));
            for d in row {
                s.push_str(&format!("{d:>4}"));
            }
            s.push('\n');
        }
        s
    }
}

#[derive(Debug)]
struct Item {
    key: String,
    value: String,
    line: usize,
}

/// Groups raw fragments into `key=value` items; a fragment without `=` continues the value
/// of the item before it, joined by `join`.
fn split_items<'a>(frags: impl Iterator<Item = (&'a str, usize)>, join: char) -> Result<Vec<Item>> {
    let mut items: Vec<Item> = Vec::new();
    for (frag, line) in frags {
        let frag = frag.trim();
        if frag.is_empty() && items.is_empty() {
            continue;
        }
        match frag.split_once('=') {
            Some((k, v)) => items.push(Item { key: k.trim().to_string(), value: v.trim().to_string(), line }),
            None if frag == "sys" => items.push(Item { key: "sys".into(), value: String::new(), line }),
            None => match items.last_mut() {
                Some(last) => {
                    last.value.push(join);
                    last.value.push_str(frag);
                }
                None => {
                    return Err(Error::InvalidConfig(format!("topology: `{frag}` is not of the form key=value")));
                }
            },
        }
    }
    Ok(items)
}

fn prefix(e: Error, name: &str) -> Error {
    match e {
        Error::InvalidConfig(m) => Error::InvalidConfig(format!("{name}: {m}")),
        e => e,
    }
}

/// Spreads `nr_cpus` CPUs over `n` nodes in contiguous blocks (more nodes than CPUs leaves
/// some nodes memory-only, evenly spaced).
fn spread_cpus(nr_cpus: usize, n: usize) -> Vec<Vec<u32>> {
    let mut v = vec![Vec::new(); n];
    for c in 0..nr_cpus {
        v[c * n / nr_cpus].push(c as u32);
    }
    v
}

/// Parses a size: bytes, or a number with K, M, G or T (binary units, optional `iB`/`B`).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let upper = t.to_ascii_uppercase();
    let body = upper.trim_end_matches("IB").trim_end_matches('B');
    let (num, shift) = match body.chars().last() {
        Some('K') => (&body[..body.len() - 1], 10),
        Some('M') => (&body[..body.len() - 1], 20),
        Some('G') => (&body[..body.len() - 1], 30),
        Some('T') => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("`{t}` is not a size (e.g. 256M, 1G)"))?;
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("`{t}` is too large"))
}

/// Formats a byte count in the largest binary unit that divides it.
pub fn fmt_size(b: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if b >= 1 << shift && b % (1 << shift) == 0 {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

/// Parses a Linux cpulist (`0-3,8,10-11`); every id must be below `limit`, and the list may
/// hold at most `limit` ids: both are checked before a range is expanded, so a list such as
/// `0-4294967295` (or a range repeated many times) is an error, not an allocation.
pub fn parse_cpulist(s: &str, limit: usize) -> std::result::Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let a: u32 = a.trim().parse().map_err(|_| format!("`{part}` is not a cpu or range"))?;
        let b: u32 = b.trim().parse().map_err(|_| format!("`{part}` is not a cpu or range"))?;
        if b < a {
            return Err(format!("range `{part}` runs backwards"));
        }
        if b as usize >= limit {
            return Err(format!("{b} is out of range: ids must be below {limit}"));
        }
        if out.len() + (b - a) as usize + 1 > limit {
            return Err(format!("more than {limit} ids"));
        }
        out.extend(a..=b);
    }
    Ok(out)
}

/// Formats CPUs as a cpulist (`0-3,8`).
pub fn fmt_cpulist(cpus: &[CpuId]) -> String {
    let mut ids: Vec<u32> = cpus.iter().map(|c| c.0).collect();
    ids.sort_unstable();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { ids[i].to_string() } else { format!("{}-{}", ids[i], ids[j]) });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: Machine = Machine { nr_cpus: 4, mem_total: 8 << 30 };

    fn err(spec: &str) -> String {
        match Topology::parse_for(spec, M) {
            Err(Error::InvalidConfig(m)) => m,
            other => panic!("{spec}: expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn simple_spec_spreads_cpus() {
        let t = Topology::parse_for("nodes=4,size=256M", M).unwrap();
        assert_eq!(t.nr_nodes(), 4);
        assert!(t.nodes().iter().all(|n| n.mem_bytes == 256 << 20 && n.cpus.len() == 1));
        assert_eq!(t.distance(NodeId(0), NodeId(3)), Ok(REMOTE_DISTANCE));
        assert_eq!(t.cpu_to_node(CpuId(3)), NodeId(3));
        assert!(t.is_fake());
    }

    #[test]
    fn more_nodes_than_cpus_leaves_memory_only_nodes() {
        let t = Topology::parse_for("nodes=8,size=4M", M).unwrap();
        let with_cpus: Vec<u16> = t.nodes().iter().filter(|n| !n.cpus.is_empty()).map(|n| n.id.0).collect();
        assert_eq!(with_cpus, vec![0, 2, 4, 6]);
    }

    #[test]
    fn full_spec_with_cpu_lists_and_matrix() {
        let t = Topology::parse_for("nodes=3,sizes=16M:32M:1G,cpus=0-1,3::2,distance=10 20 30:20 10 25:30 25 10", M)
            .unwrap();
        assert_eq!(t.nodes()[0].cpus, vec![CpuId(0), CpuId(1), CpuId(3)]);
        assert!(t.nodes()[1].cpus.is_empty());
        assert_eq!(t.nodes()[2].mem_bytes, 1 << 30);
        assert_eq!(t.distance(NodeId(2), NodeId(1)), Ok(25));
        assert_eq!(t.cpu_to_node(CpuId(2)), NodeId(2));
        // Round trip.
        assert_eq!(Topology::parse_for(&t.to_spec(), M).unwrap(), t);
    }

    #[test]
    fn nodes_count_follows_sizes() {
        let t = Topology::parse_for("sizes=4M:8M", M).unwrap();
        assert_eq!(t.nr_nodes(), 2);
    }

    #[test]
    fn file_form_with_continuation_lines() {
        let text = "# two nodes\nnodes = 2\nsize = 8M\ndistance = 10 21\n 21 10\ncpus = 0-1\n2-3\n";
        let t = Topology::parse_file_text(text, "t.topo", M).unwrap();
        assert_eq!(t.distance(NodeId(0), NodeId(1)), Ok(21));
        assert_eq!(t.nodes()[1].cpus, vec![CpuId(2), CpuId(3)]);
    }

    #[test]
    fn file_errors_name_the_line() {
        let e = Topology::parse_file_text("nodes=2\nsize=4M\ncolour=blue\n", "t.topo", M).unwrap_err();
        assert!(e.to_string().starts_with("t.topo:3:"), "{e}");
    }

    #[test]
    fn rejects() {
        assert!(err("nodes=2,colour=blue").contains("unknown key `colour`"));
        assert!(err("nodes=2,distance=10 20:30 10").contains("not symmetric"));
        assert!(err("nodes=2,distance=10 0:0 10").contains("is 0"));
        assert!(err("nodes=2,distance=10 10:10 10").contains("must exceed"));
        assert!(err("nodes=2,distance=12 20:20 10").contains("to itself"));
        assert!(err("nodes=2,distance=10 20").contains("1 entries for 2 nodes"));
        assert!(err("nodes=2,size=16G").contains("larger than the machine"));
        assert!(err("nodes=3,size=3G").contains("in all"));
        assert!(err("nodes=2,cpus=0:7").contains("cpu 7 does not exist"));
        assert!(err("nodes=2,cpus=0:0").contains("is in node 0 and node 1"));
        assert!(err("nodes=2,cpus=0-1").contains("1 entries for 2 nodes"));
        assert!(err("nodes=0").contains("must be 1"));
        assert!(err("nodes=two").contains("not a number"));
        assert!(err("nodes=2,size=12q").contains("not a size"));
        assert!(err("nodes=2,size=6000").contains("multiple of 4K"));
        assert!(err("nodes=2,nodes=3").contains("given twice"));
        assert!(err("size=4M").contains("how many nodes"));
        assert!(err("nodes=2,cpus=3-1:").contains("backwards"));
        assert!(err("sys,nodes=2").contains("only `size`"));
    }

    /// `tiers=` gives each node its memory tier: kept, written back by `to_spec`, and every
    /// bad value refused with the node and the bounds named.
    #[test]
    fn tiers_are_given_per_node_and_checked() {
        let t = Topology::parse_for("nodes=3,size=4M,cpus=0-1::,tiers=0:2:1", M).unwrap();
        assert_eq!(t.tier_override(), Some(&[0u8, 2, 1][..]));
        assert_eq!(Topology::parse_for(&t.to_spec(), M).unwrap(), t, "{}", t.to_spec());
        let plain = Topology::parse_for("nodes=2,size=4M", M).unwrap();
        assert_eq!(plain.tier_override(), None);
        assert!(!plain.to_spec().contains("tiers"));
        assert!(err("nodes=2,tiers=0").contains("1 entries for 2 nodes"), "{}", err("nodes=2,tiers=0"));
        assert!(err("nodes=2,tiers=0:16").contains("node 1: `16` is not a tier from 0 (fastest) to 15"));
        assert!(err("nodes=2,tiers=0:slow").contains("node 1: `slow` is not a tier"));
        assert!(err("nodes=2,tiers=0:1,tiers=0:1").contains("given twice"));
    }

    /// A user's range or count is bounded before it is expanded: these used to allocate
    /// gigabytes (`cpus=0-4294967295` was 16 GB of CPU ids, then SIGKILL).
    #[test]
    fn huge_ranges_and_counts_are_refused_before_allocating() {
        assert!(
            err("nodes=1,cpus=0-4294967295").contains("ids must be below 8192"),
            "{}",
            err("nodes=1,cpus=0-4294967295")
        );
        assert!(err("nodes=1,cpus=4294967295").contains("ids must be below 8192"));
        let repeated = vec!["0-8191"; 64].join(",");
        assert!(err(&format!("nodes=1,cpus={repeated}")).contains("more than 8192 ids"));
        // Node counts from the number of entries: refused before the n * n matrix exists.
        let sizes = vec!["4K"; 100_000].join(":");
        assert!(err(&format!("sizes={sizes}")).contains("100000 nodes: must be 1..=1024"));
        let cpus = vec![""; 5000].join(":");
        assert!(err(&format!("cpus={cpus}")).contains("5000 nodes: must be 1..=1024"));
        let rows = vec!["10"; 2000].join(":");
        assert!(err(&format!("distance={rows}")).contains("2000 nodes: must be 1..=1024"));
        assert!(err("nodes=99999999999999999999").contains("not a number"));
        assert!(err("nodes=1,size=99999999999T").contains("too large"));
        assert_eq!(parse_cpulist("0-2,1", 3), Err("more than 3 ids".into()));
        // A zone's frames are u32 indices: a 16T node is refused, 16T - 4K is not.
        let big = Machine { nr_cpus: 4, mem_total: u64::MAX };
        let e = Topology::parse_for("nodes=1,size=16T", big).unwrap_err().to_string();
        assert!(e.contains("more than a zone can hold (4294967295 frames of 4K)"), "{e}");
        assert!(Topology::parse_for(&format!("nodes=1,size={}", (16u64 << 40) - 4096), big).is_ok());
        // Node masks (mempolicy `bind=`/`interleave=`, `zonal_set_policy`) share the parser.
        let mask = |s: &str| crate::mempolicy::NodeMask::parse(s).unwrap_err().to_string();
        assert!(mask("0-4294967295").contains("ids must be below 1024"));
        assert!(mask(&vec!["0-1023"; 64].join(",")).contains("more than 1024 ids"));
        // The C ABI's config string goes through the same topology parser.
        let config = |s: &str| crate::Config::parse(s).unwrap_err().to_string();
        assert!(config("topology=nodes=1,size=4M,cpus=0-4294967295").contains("ids must be below 8192"));
    }

    /// Virtual CPUs: accepted with their declaration (spread as the machine's are, or listed
    /// per node), refused without it (a typo stays an error, which says how to declare
    /// them), bounded by the ids' limit, and written back by `to_spec` and `describe`.
    #[test]
    fn virtual_cpus_need_their_declaration() {
        let t = Topology::parse_for("nodes=8,size=4M,vcpus=256", M).unwrap();
        assert_eq!((t.nr_cpus(), t.nr_machine_cpus()), (256, 4));
        assert!(t.nodes().iter().all(|n| n.cpus.len() == 32), "spread as the default spread does");
        assert_eq!(
            (t.cpu_to_node(CpuId(31)), t.cpu_to_node(CpuId(32)), t.cpu_to_node(CpuId(255))),
            (NodeId(0), NodeId(1), NodeId(7))
        );
        assert!(!t.is_virtual(CpuId(3)) && t.is_virtual(CpuId(4)) && t.is_virtual(CpuId(255)));
        assert!(!t.is_virtual(CpuId(256)), "outside the topology");
        assert_eq!(Topology::parse_for(&t.to_spec(), M).unwrap(), t);
        assert!(t.to_spec().contains(",vcpus=256,cpus=0-31:32-63:"), "{}", t.to_spec());
        let d = t.describe();
        assert!(d.starts_with("fake topology, 8 node(s), 256 cpu(s), 252 of them virtual (4-255:"), "{d}");
        // Listed per node, with memory-only nodes (CXL expanders) and the bound at 8192 ids.
        let t = Topology::parse_for("nodes=3,size=4M,vcpus=8192,cpus=0-4095:4096-8191:", M).unwrap();
        assert_eq!((t.nr_cpus(), t.has_cpus(NodeId(2))), (8192, Ok(false)));
        assert_eq!(Topology::parse_for(&t.to_spec(), M).unwrap(), t);
        // CPUs no node lists go to the first node with CPUs, as the machine's do.
        let t = Topology::parse_for("nodes=2,size=4M,vcpus=16,cpus=0-3:8", M).unwrap();
        assert_eq!((t.cpu_to_node(CpuId(12)), t.cpu_to_node(CpuId(8))), (NodeId(0), NodeId(1)));
        assert_eq!(Topology::parse_for(&t.to_spec(), M).unwrap(), t);
        // As many as the machine has: none virtual, and the spec says nothing of them.
        let t = Topology::parse_for("nodes=2,size=4M,vcpus=4", M).unwrap();
        assert_eq!((t.nr_cpus(), t.is_virtual(CpuId(3))), (4, false));
        assert!(!t.to_spec().contains("vcpus"));
        assert_eq!(t, Topology::parse_for("nodes=2,size=4M", M).unwrap());
        // Without the declaration, or past it: an error that says how to declare them.
        let e = err("nodes=2,cpus=0:7");
        assert!(
            e.contains("cpu 7 does not exist (this machine has cpus 0-3; declare virtual CPUs with vcpus=N"),
            "{e}"
        );
        assert!(e.contains("N up to 8192"), "{e}");
        assert!(err("nodes=2,vcpus=8,cpus=0:8").contains("cpu 8 does not exist (vcpus=8 declares cpus 0-7)"));
        assert!(err("nodes=1,vcpus=8193").contains("vcpus is at most 8192"), "{}", err("nodes=1,vcpus=8193"));
        assert!(err("nodes=1,vcpus=2").contains("fewer than this machine's 4"));
        assert!(err("nodes=1,vcpus=many").contains("not a number"));
        assert!(err("nodes=1,vcpus=8,vcpus=9").contains("given twice"));
        assert!(err("nodes=1,vcpus=8,cpus=0-8192").contains("ids must be below 8192"));
        assert!(err("sys,vcpus=8").contains("only `size`"));
        // The C ABI's config string goes through the same parser.
        let c = crate::Config::parse("topology=nodes=2,size=4M,vcpus=64").unwrap();
        assert!(c.topology.nr_cpus() == 64 && c.topology.is_virtual(CpuId(63)));
    }

    #[test]
    fn sizes_and_cpulists() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(fmt_size(3 << 20), "3M");
        assert_eq!(parse_cpulist("0-2,5", 8).unwrap(), vec![0, 1, 2, 5]);
        assert_eq!(fmt_cpulist(&[CpuId(0), CpuId(1), CpuId(2), CpuId(5)]), "0-2,5");
    }

    #[test]
    fn reads_a_sys_tree() {
        let dir = std::env::temp_dir().join(format!("zonal-sys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (n, cpus, dist) in [(0, "0-1", "10 21 21"), (2, "2-3", "21 21 10")] {
            let d = dir.join(format!("node{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), format!("{cpus}\n")).unwrap();
            std::fs::write(d.join("distance"), format!("{dist}\n")).unwrap();
            std::fs::write(d.join("meminfo"), format!("Node {n} MemTotal:       4194304 kB\n")).unwrap();
        }
        std::fs::write(dir.join("online"), "0,2\n").unwrap();
        let root = dir.to_str().unwrap();
        let t = Topology::from_sys_root(root, 16 << 20, M).unwrap();
        assert_eq!(t.nr_nodes(), 2);
        assert_eq!(t.nodes()[1].os_node, Some(2));
        assert_eq!(t.distance(NodeId(0), NodeId(1)), Ok(21));
        assert_eq!(t.cpu_to_node(CpuId(3)), NodeId(1));
        assert!(!t.is_fake());
        let e = Topology::from_sys_root(root, 8 << 30, M).unwrap_err();
        assert!(e.to_string().contains("larger than its memory"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_this_machine() {
        // Every Linux machine has at least node 0 under /sys (or no NUMA support at all).
        if std::path::Path::new("/sys/devices/system/node/online").exists() {
            let t = Topology::from_sys(4 << 20).unwrap();
            assert!(t.nr_nodes() >= 1);
            assert_eq!(t.distance(NodeId(0), NodeId(0)), Ok(LOCAL_DISTANCE));
        }
    }

    #[test]
    fn bad_node_ids_are_errors_not_panics() {
        let t = Topology::parse_for("nodes=2,size=8M", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
        let bad = |node| Error::InvalidNode { node: NodeId(node), nr_nodes: 2 };
        assert_eq!(t.distance(NodeId(2), NodeId(0)), Err(bad(2)));
        assert_eq!(t.distance(NodeId(0), NodeId(7)), Err(bad(7)));
        assert_eq!(t.distance(NodeId(u16::MAX), NodeId(u16::MAX)), Err(bad(u16::MAX)));
        assert_eq!(t.has_cpus(NodeId(2)), Err(bad(2)));
        assert_eq!(t.has_cpus(NodeId(1)), Ok(true));
    }
}
