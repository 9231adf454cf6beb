//! The arena's memory options (`populate`, `mlock`, `thp`): each handle allocates and frees,
//! and `/proc/self/smaps` shows what the option did to the node's mapping, or the build
//! failed with a clear `Error::Os` naming the call the machine refused.

use zonal::topology::Machine;
use zonal::{Config, Error, Gfp, Topology, Zonal, PAGE_SIZE};

const SIZE: usize = 16 << 20;

fn config(options: &str) -> Config {
    let t = Topology::parse_for("nodes=1,size=16M", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    let mut c = Config::parse(&format!("topology=nodes=1,size=16M;{options}")).unwrap();
    c.topology = t;
    c
}

/// Allocates and frees a few blocks, and returns the smaps entry of the mapping that holds
/// them: its `Rss`/`Locked` in KiB and its `VmFlags`.
fn exercise(z: &Zonal) -> (u64, u64, Vec<String>) {
    let blocks: Vec<_> = (0..4).map(|o| z.alloc_pages(Gfp::KERNEL, o).unwrap()).collect();
    let addr = blocks[0].as_ptr() as usize;
    // Touch each block: zonal hands out memory that is readable and writable.
    for (o, b) in blocks.iter().enumerate() {
        // SAFETY: the block is ours, (PAGE_SIZE << o) bytes, until it is freed below.
        unsafe { std::ptr::write_bytes(b.as_ptr(), 0x5a, PAGE_SIZE << o) };
    }
    for (o, b) in blocks.into_iter().enumerate() {
        z.free_pages(b.as_ptr(), o as u32).unwrap();
    }
    assert_eq!(z.check_invariants(), Ok(0));
    smaps_entry(addr)
}

fn smaps_entry(addr: usize) -> (u64, u64, Vec<String>) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let (mut rss, mut locked, mut flags) = (None, None, None);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-').filter(|(lo, _)| lo.chars().all(|c| c.is_ascii_hexdigit())) {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if !inside {
            continue;
        }
        let kb = |l: &str| l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok());
        if line.starts_with("Rss:") {
            rss = kb(line);
        } else if line.starts_with("Locked:") {
            locked = kb(line);
        } else if let Some(f) = line.strip_prefix("VmFlags:") {
            flags = Some(f.split_whitespace().map(String::from).collect());
        }
    }
    (rss.expect("the arena's mapping is in smaps"), locked.unwrap_or(0), flags.unwrap_or_default())
}

#[test]
fn populate_maps_every_frame_at_build() {
    match Zonal::new(config("populate=1")) {
        Ok(z) => {
            let (rss, _, _) = exercise(&z);
            assert_eq!(rss, (SIZE / 1024) as u64, "a populated node is resident in full");
        }
        Err(e) => panic!("populate is best effort and never fails the build: {e}"),
    }
    // Without it only what was touched is resident.
    let z = Zonal::new(config("populate=0")).unwrap();
    let (rss, _, _) = exercise(&z);
    assert!(rss < (SIZE / 1024) as u64, "{rss} KiB resident without populate");
}

#[test]
fn thp_marks_the_range_for_huge_pages() {
    match Zonal::new(config("thp=1")) {
        Ok(z) => {
            let (_, _, flags) = exercise(&z);
            assert!(flags.iter().any(|f| f == "hg"), "MADV_HUGEPAGE shows as `hg`: {flags:?}");
        }
        // A kernel without THP refuses the advice: the build says which call failed.
        Err(e) => assert!(matches!(e, Error::Os { call: "madvise", .. }), "{e}"),
    }
    let z = Zonal::new(config("thp=0")).unwrap();
    let (_, _, flags) = exercise(&z);
    assert!(!flags.iter().any(|f| f == "hg"), "{flags:?}");
}

/// `mlock` locks the node's memory, or fails the build with `Error::Os { call: "mlock" }`
/// where `RLIMIT_MEMLOCK` is too small: checked with the soft limit lowered to 0, which only a
/// process with `CAP_IPC_LOCK` (root) can lock past.
#[test]
fn mlock_locks_the_range_or_says_why_not() {
    let check = |r: zonal::Result<Zonal>| match r {
        Ok(z) => {
            let (rss, locked, flags) = exercise(&z);
            assert!(flags.iter().any(|f| f == "lo"), "a locked range shows as `lo`: {flags:?}");
            assert_eq!(locked, rss);
            assert_eq!(locked, (SIZE / 1024) as u64, "mlock makes the whole node resident");
            true
        }
        Err(e) => {
            assert!(
                matches!(e, Error::Os { call: "mlock", errno } if errno == libc::ENOMEM || errno == libc::EPERM || errno == libc::EAGAIN),
                "{e}"
            );
            assert!(e.to_string().contains("mlock"), "the message names the call: {e}");
            false
        }
    };
    let locked = check(Zonal::new(config("mlock=1")));
    let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit write and read one rlimit struct of ours; lowering the soft
    // limit is always permitted, and it is restored below (no other test in this binary locks).
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut old), 0);
        let low = libc::rlimit { rlim_cur: 0, rlim_max: old.rlim_max };
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &low), 0);
    }
    // SAFETY: geteuid has no preconditions.
    let privileged = unsafe { libc::geteuid() } == 0;
    let under_zero = check(Zonal::new(config("mlock=1")));
    // SAFETY: as above.
    unsafe { assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &old), 0) };
    if !privileged {
        assert!(!under_zero, "mlock of 16 MiB succeeded under RLIMIT_MEMLOCK 0 without privilege");
    }
    eprintln!("mlock: {} at the usual limit, {} at 0 (root: {privileged})", locked, under_zero);
}

/// `frame_file` and `frame_offset`: a frame mapped from the file at its offset elsewhere is
/// the same memory, across nodes (one file for the whole arena); addresses zonal does not
/// own, including the gap after a node, are refused.
#[test]
fn a_frame_maps_elsewhere_through_the_arena_file() {
    let t = Topology::parse_for("nodes=2,sizes=6M:4M", Machine { nr_cpus: 2, mem_total: 1 << 30 }).unwrap();
    let z = Zonal::new(Config::new(t)).unwrap();
    for nid in 0..2 {
        let p = z.alloc_pages_node(zonal::NodeId(nid), Gfp::THISNODE, 0).unwrap();
        let off = z.frame_offset(p.as_ptr()).unwrap();
        assert_eq!(z.frame_offset(p.as_ptr().wrapping_add(4095)).unwrap(), off);
        // SAFETY: a fresh shared mapping at an address the kernel picks; the frame is ours.
        let alias = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&z.frame_file()),
                off as libc::off_t,
            )
        };
        assert_ne!(alias, libc::MAP_FAILED);
        // SAFETY: both addresses map the frame, which is ours until it is freed below.
        unsafe {
            p.as_ptr().cast::<u64>().write_volatile(0xabc0 + nid as u64);
            assert_eq!(alias.cast::<u64>().read_volatile(), 0xabc0 + nid as u64);
            alias.cast::<u64>().add(1).write_volatile(7);
            assert_eq!(p.as_ptr().cast::<u64>().add(1).read_volatile(), 7);
            libc::munmap(alias, PAGE_SIZE);
        }
        z.free_pages(p.as_ptr(), 0).unwrap();
    }
    let first = z.alloc_pages_node(zonal::NodeId(0), Gfp::THISNODE, 0).unwrap();
    // Node 0 has 6 MiB in an 8 MiB slot (order-10 blocks): 7 MiB past its start is the gap.
    let base = first.as_ptr() as usize - z.frame_offset(first.as_ptr()).unwrap() as usize;
    assert!(matches!(z.frame_offset((base + (7 << 20)) as *const u8), Err(Error::NotOwned { .. })));
    assert!(matches!(z.frame_offset(std::ptr::null()), Err(Error::NotOwned { .. })));
    z.free_pages(first.as_ptr(), 0).unwrap();
    assert_eq!(z.check_invariants(), Ok(0));
}
