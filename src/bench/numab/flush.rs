//! Counting TLB shootdowns: the `TLB:` row of `/proc/interrupts` (received, every CPU) and
//! the `tlb:tlb_flush` tracepoint with reason `TLB_REMOTE_SEND_IPI` (requested), counted by
//! perf per CPU and per thread, split by whether a scan pass was running.

/// TLB shootdowns received, summed over CPUs, from the text of `/proc/interrupts` (its `TLB:`
/// row; `None` without one, as on machines other than x86).
pub(super) fn parse_tlb_row(text: &str) -> Option<u64> {
    let rest = text.lines().find_map(|l| l.trim_start().strip_prefix("TLB:"))?;
    let counts: Vec<u64> = rest.split_whitespace().map_while(|t| t.parse().ok()).collect();
    (!counts.is_empty()).then(|| counts.iter().sum())
}

pub(super) fn tlb_shootdowns() -> Option<u64> {
    parse_tlb_row(&std::fs::read_to_string("/proc/interrupts").ok()?)
}

/// Flush counts at one instant (or their difference over a span): TLB shootdowns received
/// (`/proc/interrupts`) and remote flushes requested (the `tlb:tlb_flush` tracepoint with
/// reason `TLB_REMOTE_SEND_IPI`), both machine-wide, and of those requested the ones this
/// process's threads requested (`own`); each `None` where it cannot be read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Flushes {
    pub(super) received: Option<u64>,
    pub(super) requested: Option<u64>,
    pub(super) own: Option<u64>,
}

impl Flushes {
    /// `self - earlier`, per count.
    pub(super) fn since(self, earlier: Flushes) -> Flushes {
        let d = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| a.saturating_sub(b));
        Flushes {
            received: d(self.received, earlier.received),
            requested: d(self.requested, earlier.requested),
            own: d(self.own, earlier.own),
        }
    }

    /// `self + other`, per count.
    pub(super) fn plus(self, other: Flushes) -> Flushes {
        let s = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| a + b);
        Flushes {
            received: s(self.received, other.received),
            requested: s(self.requested, other.requested),
            own: s(self.own, other.own),
        }
    }

    /// Nothing yet, every count readable as `zero` says.
    pub(super) fn zero_like(f: Flushes) -> Flushes {
        Flushes { received: f.received.map(|_| 0), requested: f.requested.map(|_| 0), own: f.own.map(|_| 0) }
    }
}

/// Reads the flush counts.
pub(super) struct FlushMeter {
    /// The tracepoint's counters, or why there are none.
    pub(super) requests: Result<TracepointCounter, String>,
}

impl FlushMeter {
    pub(super) fn new() -> FlushMeter {
        FlushMeter { requests: TracepointCounter::open() }
    }

    /// The meter of one run: the machine's counts, and the tracepoint counted on every thread
    /// the process has now (the run's workers, the balancer's threads and this one), so that
    /// the flushes of other processes on the machine can be told from this run's.
    pub(super) fn for_run(&self) -> RunMeter<'_> {
        RunMeter { meter: self, own: self.requests.as_ref().ok().and_then(|t| t.on_threads().ok()) }
    }

    /// What the requested count is, or why it is n/a.
    pub(super) fn note(&self) -> String {
        match &self.requests {
            Ok(t) => format!(
                "tlb:tlb_flush with reason TLB_REMOTE_SEND_IPI ({}) counted on every CPU with perf (req columns)",
                t.reason
            ),
            Err(why) => format!("tlb:tlb_flush (remote flushes requested): n/a, {why}"),
        }
    }
}

/// A [`FlushMeter`] with this run's threads' own requests.
pub(super) struct RunMeter<'a> {
    pub(super) meter: &'a FlushMeter,
    pub(super) own: Option<TracepointCounter>,
}

impl RunMeter<'_> {
    pub(super) fn read(&self) -> Flushes {
        Flushes {
            received: tlb_shootdowns(),
            requested: self.meter.requests.as_ref().ok().map(TracepointCounter::read),
            own: self.own.as_ref().map(TracepointCounter::read),
        }
    }
}

/// `tlb:tlb_flush` events with reason `TLB_REMOTE_SEND_IPI`, counted on every CPU by perf
/// counters on the tracepoint (system-wide, so root or `CAP_PERFMON`, and tracefs mounted
/// for the tracepoint's id), or on given threads of this process.
pub(super) struct TracepointCounter {
    pub(super) counters: Vec<std::fs::File>,
    pub(super) reason: u32,
    pub(super) id: u64,
}

/// The first 64 bytes of `struct perf_event_attr` (`PERF_ATTR_SIZE_VER0`): all a counting
/// tracepoint event needs; the kernel takes the rest as zero.
#[repr(C)]
#[derive(Default)]
pub(super) struct PerfEventAttr {
    pub(super) type_: u32,
    pub(super) size: u32,
    pub(super) config: u64,
    pub(super) sample_period: u64,
    pub(super) sample_type: u64,
    pub(super) read_format: u64,
    pub(super) flags: u64,
    pub(super) wakeup_events: u32,
    pub(super) bp_type: u32,
    pub(super) config1: u64,
}

pub(super) const PERF_TYPE_TRACEPOINT: u32 = 2;
pub(super) const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// `_IOW('$', 6, char *)`.
pub(super) const PERF_EVENT_IOC_SET_FILTER: u64 = 0x4008_2406;

impl TracepointCounter {
    const TRACEFS: [&'static str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

    pub(super) fn open() -> Result<TracepointCounter, String> {
        if !cfg!(target_arch = "x86_64") {
            return Err("the tracepoint is x86's".into());
        }
        let dir = Self::TRACEFS
            .iter()
            .map(|t| format!("{t}/events/tlb/tlb_flush"))
            .find(|d| std::path::Path::new(d).exists())
            .ok_or("tracefs is not mounted here (/sys/kernel/tracing; as root: mount -t tracefs nodev /sys/kernel/tracing)")?;
        let id: u64 = std::fs::read_to_string(format!("{dir}/id"))
            .map_err(|e| format!("cannot read {dir}/id: {e}"))?
            .trim()
            .parse()
            .map_err(|_| format!("{dir}/id is not a number"))?;
        let format = std::fs::read_to_string(format!("{dir}/format")).unwrap_or_default();
        let reason = remote_ipi_reason(&format).unwrap_or(4);
        let counters = (0..zonal::cpu::nr_cpus_online())
            .map(|cpu| Self::counter(id, reason, -1, cpu as i32))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TracepointCounter { counters, reason, id })
    }

    /// The same events requested by the threads this process has now, each counted on its
    /// thread (the tracepoint fires in the context of the thread that sends the flush).
    pub(super) fn on_threads(&self) -> Result<TracepointCounter, String> {
        let tids: Vec<i32> = std::fs::read_dir("/proc/self/task")
            .map_err(|e| format!("/proc/self/task: {e}"))?
            .filter_map(|d| d.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        let counters =
            tids.iter().map(|&t| Self::counter(self.id, self.reason, t, -1)).collect::<Result<Vec<_>, _>>()?;
        Ok(TracepointCounter { counters, reason: self.reason, id: self.id })
    }

    /// One counter of the tracepoint filtered on `reason`: on `cpu` for every task (`pid`
    /// -1), or on thread `pid` wherever it runs (`cpu` -1).
    pub(super) fn counter(id: u64, reason: u32, pid: i32, cpu: i32) -> Result<std::fs::File, String> {
        let filter = std::ffi::CString::new(format!("reason == {reason}")).expect("no NUL in the filter");
        let attr = PerfEventAttr {
            type_: PERF_TYPE_TRACEPOINT,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            config: id,
            sample_period: 1,
            ..Default::default()
        };
        // SAFETY: perf_event_open reads `size` bytes of a valid, initialised attr that
        // outlives the call; pid -1 with a CPU counts every task on that CPU, a thread id
        // with CPU -1 that thread on every CPU.
        let fd = unsafe {
            libc::syscall(libc::SYS_perf_event_open, &attr as *const PerfEventAttr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)
        };
        if fd < 0 {
            return Err(format!("perf_event_open on the tracepoint: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by perf_event_open and nothing else owns it.
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
        // SAFETY: the ioctl reads a NUL-terminated string that outlives the call, from a
        // perf event fd this function owns.
        let r = unsafe {
            libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&file), PERF_EVENT_IOC_SET_FILTER as _, filter.as_ptr())
        };
        if r != 0 {
            return Err(format!("setting the filter `reason == {reason}`: {}", std::io::Error::last_os_error()));
        }
        Ok(file)
    }

    /// Events so far, summed over CPUs.
    pub(super) fn read(&self) -> u64 {
        use std::io::Read;
        self.counters
            .iter()
            .map(|mut f| {
                let mut b = [0u8; 8];
                f.read_exact(&mut b).map_or(0, |()| u64::from_ne_bytes(b))
            })
            .sum()
    }
}

/// The value of `TLB_REMOTE_SEND_IPI` in a `tlb_flush` format file, from its print format's
/// `{ 4, "remote ipi send" }`.
pub(super) fn remote_ipi_reason(format: &str) -> Option<u32> {
    // Its case differs between kernels ("remote IPI send" on 6.18).
    let format = format.to_ascii_lowercase();
    let at = format.find("\"remote ipi send\"")?;
    let open = format[..at].rfind('{')?;
    format[open + 1..at].trim().trim_end_matches(',').trim().parse().ok()
}
