//! The C ABI (`zonal::ffi`, `include/zonal.h`) driven from Rust exactly as a C caller drives
//! it: a handle from `zonal_create` with a config string, raw `*mut c_void` blocks, arrays
//! of pointers and `char` buffers the caller owns, errors as negated errnos and
//! `zonal_last_error`, NULL and foreign pointers, `zonal_destroy`.
//!
//! tests/c/zonal_test.c does the same from a real C program; this file exists so that the
//! boundary runs under AddressSanitizer (`.ci/hardening`): every buffer, array and string
//! the caller hands over is a heap allocation of exactly the size the header's contract
//! names, so a write or read one element past it (a report's NUL, a bulk call's last slot,
//! a config string's terminator) is an ASan report, not silent. A C program cannot be used
//! for that: it would need gcc's libasan, and two ASan runtimes (gcc's and Rust's, whose
//! `libzonal` is instrumented with rustc's) in one process are not supported.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::{null, null_mut};
use zonal::ffi::*;
use zonal::Zonal;

/// A handle from `zonal_create`, destroyed when dropped (as a C caller's cleanup path).
struct Handle(*mut Zonal);

impl Handle {
    fn new(config: &str) -> Handle {
        match create(config) {
            Ok(z) => Handle(z),
            Err(rc) => panic!("zonal_create({config:?}) = {rc}: {}", last_error()),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: a handle from zonal_create, destroyed once, with no call on it running.
        unsafe { zonal_destroy(self.0) };
    }
}

/// `zonal_create` with the config as a heap string of exactly its bytes and the NUL.
fn create(config: &str) -> Result<*mut Zonal, c_int> {
    let c = CString::new(config).unwrap();
    let mut z: *mut Zonal = null_mut();
    // SAFETY: `c` is NUL-terminated; `z` is storage for one pointer.
    let rc = unsafe { zonal_create(c.as_ptr(), &mut z) };
    if rc == 0 {
        assert!(!z.is_null());
        Ok(z)
    } else {
        assert!(z.is_null(), "a failed create wrote *out");
        Err(rc)
    }
}

/// A C string argument.
fn cs(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// Reads a snprintf-style text the way a careful C caller does: measure with NULL/0, then
/// read into a heap buffer of exactly length + 1, which must come back NUL-terminated and
/// of the measured length.
fn read_text(f: impl Fn(*mut c_char, usize) -> c_int) -> String {
    let len = f(null_mut(), 0);
    assert!(len >= 0, "measuring failed: {len}");
    let len = len as usize;
    let mut buf = vec![0x55 as c_char; len + 1].into_boxed_slice();
    assert_eq!(f(buf.as_mut_ptr(), buf.len()), len as c_int);
    assert_eq!(buf[len], 0, "not NUL-terminated at its length");
    // SAFETY: NUL-terminated within `buf`, checked above.
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().to_owned();
    assert_eq!(s.len(), len, "a NUL inside the text");
    s
}

fn last_error() -> String {
    // SAFETY: `buf` is NULL with 0 or valid for its length (read_text's contract).
    read_text(|buf, len| unsafe { zonal_last_error(buf, len) })
}

fn nr_free(z: *const Zonal, nid: c_int) -> u64 {
    let mut n = u64::MAX;
    // SAFETY: a live handle and storage for one u64.
    assert_eq!(unsafe { zonal_nr_free_pages(z, nid, &mut n) }, 0);
    n
}

fn alloc(z: *const Zonal, gfp: u32, order: u32) -> *mut c_void {
    let mut p = null_mut();
    // SAFETY: a live handle and storage for one pointer.
    let rc = unsafe { zonal_alloc_pages(z, gfp, order, &mut p) };
    assert_eq!(rc, 0, "zonal_alloc_pages order {order}: {}", last_error());
    p
}

fn free(z: *const Zonal, p: *mut c_void, order: u32) -> c_int {
    // SAFETY: a live handle; the address is checked, never dereferenced.
    unsafe { zonal_free_pages(z, p, order) }
}

/// Every refused config: a negated errno, a message naming the problem, `*out` untouched.
#[test]
fn create_refuses_bad_configs_and_writes_nothing() {
    for (config, want) in [
        ("topology=nodes=2,size=8M;colour=red", "colour"),
        ("max_order=10", "`topology=` is required"),
        ("topology=nodes=2,distance=10 20:30 10", "symmetric"),
        ("topology=nodes=1,size=4M;max_order=16", "max_order"),
        ("topology=nodes=1,size=4M;stat_interval=0", "stat_interval"),
        ("topology=nodes=1,size=4M;pcp=maybe", "pcp"),
        ("topology", "key=value"),
    ] {
        assert_eq!(create(config), Err(-libc::EINVAL), "{config}");
        let msg = last_error();
        assert!(msg.contains(want), "{config}: {msg}");
    }
    // A sentinel in *out shows it is not written on failure.
    let sentinel = std::ptr::NonNull::<Zonal>::dangling().as_ptr();
    let mut z = sentinel;
    // SAFETY: NULL config is allowed and refused; `z` is storage for one pointer.
    assert_eq!(unsafe { zonal_create(null(), &mut z) }, -libc::EINVAL);
    assert_eq!(z, sentinel);
    assert!(last_error().contains("null string"), "{}", last_error());
    // Not UTF-8: refused, not read past its NUL.
    let bytes: Box<[u8]> = Box::new(*b"topology=nodes=1,size=4M;\xff=1\0");
    // SAFETY: a NUL-terminated string; `z` is storage for one pointer.
    assert_eq!(unsafe { zonal_create(bytes.as_ptr().cast(), &mut z) }, -libc::EINVAL);
    assert_eq!(z, sentinel);
    assert!(last_error().contains("UTF-8"), "{}", last_error());
    let c = cs("topology=nodes=1,size=4M");
    // SAFETY: a NULL out pointer is allowed and refused.
    assert_eq!(unsafe { zonal_create(c.as_ptr(), null_mut()) }, -libc::EINVAL);
    assert!(last_error().contains("null out"), "{}", last_error());
}

/// Allocations on each node, the memory written end to end, and every bad free the header
/// lists refused with its own errno, leaving the free counts as they were.
#[test]
fn alloc_free_and_every_refused_free() {
    let h = Handle::new("topology=nodes=2,size=8M;max_order=10;stat_interval=3600000");
    let z = h.0.cast_const();
    // SAFETY: a live handle.
    assert!(unsafe { zonal_drain_all_pages(z) } >= 0);
    let (free0, free1) = (nr_free(z, 0), nr_free(z, 1));
    assert_eq!((free0, free1), (2048, 2048), "8 MiB per node, all free on the buddy lists");

    let mut on = [null_mut(); 2];
    for (nid, slot) in on.iter_mut().enumerate() {
        // SAFETY: a live handle and storage for one pointer.
        let rc = unsafe { zonal_alloc_pages_node(z, nid as c_int, ZONAL_GFP_THISNODE, 0, slot) };
        assert_eq!(rc, 0, "node {nid}: {}", last_error());
        // SAFETY: a live handle; the address is only looked up.
        assert_eq!(unsafe { zonal_page_to_nid(z, *slot) }, nid as c_int);
        assert_eq!(*slot as usize % 4096, 0);
    }
    let big = alloc(z, ZONAL_GFP_KERNEL, 3);
    assert_eq!(big as usize % (8 * 4096), 0, "a block is aligned to its size");
    // The caller owns the memory: all of it can be written and read back.
    // SAFETY: blocks of 1, 1 and 8 frames zonal handed out and nothing else uses.
    unsafe {
        std::ptr::write_bytes(on[0].cast::<u8>(), 0xab, 4096);
        std::ptr::write_bytes(on[1].cast::<u8>(), 0xcd, 4096);
        std::ptr::write_bytes(big.cast::<u8>(), 0x11, 8 * 4096);
        assert_eq!(*on[0].cast::<u8>().add(4095), 0xab);
        assert_eq!(*on[1].cast::<u8>(), 0xcd);
        assert_eq!(*big.cast::<u8>().add(8 * 4096 - 1), 0x11);
    }

    // Refused allocations: *out untouched.
    let mut q = null_mut();
    // SAFETY: each call below gets a live handle, and storage for one pointer or NULL, as
    // the header allows.
    unsafe {
        assert_eq!(zonal_alloc_pages(z, 0x80, 0, &mut q), -libc::EINVAL);
        assert!(last_error().contains("gfp"), "{}", last_error());
        assert_eq!(zonal_alloc_pages(z, 0, 11, &mut q), -libc::EDOM);
        assert_eq!(zonal_alloc_pages(z, 0, 0, null_mut()), -libc::EINVAL);
        assert_eq!(zonal_alloc_pages_node(z, 2, 0, 0, &mut q), -libc::ENODEV);
        assert!(last_error().contains("invalid node 2:"), "{}", last_error());
        assert_eq!(zonal_alloc_pages_node(z, c_int::MIN, 0, 0, &mut q), -libc::ENODEV);
        assert!(last_error().contains(&format!("invalid node {}:", c_int::MIN)), "{}", last_error());
        assert_eq!(zonal_alloc_pages_node(z, 0, 0, 0, null_mut()), -libc::EINVAL);
    }
    assert!(q.is_null());

    // Refused frees, each with its errno and message; none changes a count (the buddy
    // lists' counts: the worker that would decay the per-CPU lists is idle for an hour).
    let counts = (nr_free(z, 0), nr_free(z, 1));
    let on_stack = 0u64;
    let on_heap = Box::new([0u8; 8192]);
    let page_in_heap = ((on_heap.as_ptr() as usize + 4095) & !4095) as *mut c_void;
    let refused: [(*mut c_void, u32, c_int); 8] = [
        (null_mut(), 0, -libc::EFAULT),
        (&on_stack as *const u64 as *mut c_void, 0, -libc::EFAULT),
        (page_in_heap, 0, -libc::EFAULT),
        ((usize::MAX & !4095) as *mut c_void, 0, -libc::EFAULT),
        (on[0].cast::<u8>().wrapping_add(1).cast(), 0, -libc::EINVAL),
        (big, 2, -libc::ERANGE),
        (big.cast::<u8>().wrapping_add(4096).cast(), 0, -libc::ENOTBLK),
        (big, 11, -libc::EDOM),
    ];
    for (addr, order, errno) in refused {
        assert_eq!(free(z, addr, order), errno, "free({addr:p}, {order})");
        assert!(!last_error().is_empty());
        assert_eq!((nr_free(z, 0), nr_free(z, 1)), counts, "free({addr:p}, {order})");
    }
    assert_eq!(free(z, on[0], 0), 0);
    assert_eq!(free(z, on[0], 0), -libc::EALREADY);
    assert!(last_error().contains("double free"), "{}", last_error());
    assert_eq!(free(z, on[1], 0), 0);
    assert_eq!(free(z, big, 3), 0);
    assert_eq!(free(z, big, 3), -libc::EALREADY);

    // The last error is errno-like: a later success leaves it.
    let before = last_error();
    let p = alloc(z, 0, 0);
    assert_eq!(free(z, p, 0), 0);
    assert_eq!(last_error(), before);

    // SAFETY: a live handle.
    assert!(unsafe { zonal_drain_all_pages(z) } >= 0);
    assert_eq!((nr_free(z, 0), nr_free(z, 1)), (free0, free1), "every frame back");
    let mut blocks = 0;
    // SAFETY: a live handle and storage for one u64.
    unsafe {
        assert_eq!(zonal_nr_free_blocks(z, 0, 10, &mut blocks), 0);
        assert_eq!(blocks, 2, "8 MiB is two blocks of 4 MiB, merged again");
        assert_eq!(zonal_nr_free_blocks(z, 0, 11, &mut blocks), -libc::EDOM);
        assert_eq!(zonal_nr_free_blocks(z, -2, 0, &mut blocks), -libc::ENODEV);
        assert_eq!(zonal_nr_free_blocks(z, 0, 0, null_mut()), -libc::EINVAL);
    }
    assert_eq!(blocks, 2);
}

/// Every call that takes a handle refuses NULL with -EINVAL and writes nothing; destroying
/// NULL is a no-op.
#[test]
fn a_null_handle_is_refused_by_every_call() {
    let name = cs("watermark_scale_factor");
    let value = cs("20");
    let mut p = null_mut();
    let mut n = 7u64;
    let mut buf = vec![0x55 as c_char; 16].into_boxed_slice();
    let mut slots = vec![null_mut::<c_void>(); 4].into_boxed_slice();
    let mut bad = 99usize;
    let z = null::<Zonal>();
    let einval = -libc::EINVAL;
    // SAFETY: NULL handles are allowed and refused; every other argument is valid storage.
    unsafe {
        assert_eq!(zonal_alloc_pages(z, 0, 0, &mut p), einval);
        assert_eq!(zonal_alloc_pages_node(z, 0, 0, 0, &mut p), einval);
        assert_eq!(zonal_free_pages(z, null_mut(), 0), einval);
        assert_eq!(zonal_page_to_nid(z, null()), einval);
        assert_eq!(zonal_set_policy(z, cs("local").as_ptr()), einval);
        assert_eq!(zonal_nr_free_pages(z, 0, &mut n), einval);
        assert_eq!(zonal_nr_free_blocks(z, 0, 0, &mut n), einval);
        assert_eq!(zonal_vmstat(z, cs("pgfree").as_ptr(), &mut n), einval);
        assert_eq!(zonal_refresh_vm_stats(z), einval);
        assert_eq!(zonal_report(z, ZONAL_REPORT_VMSTAT, buf.as_mut_ptr(), buf.len()), einval);
        assert_eq!(zonal_alloc_pages_bulk_array(z, 0, slots.as_mut_ptr(), slots.len()), einval);
        assert_eq!(zonal_alloc_pages_bulk_list(z, 0, slots.len(), slots.as_mut_ptr()), einval);
        assert_eq!(zonal_free_pages_bulk(z, slots.as_ptr(), slots.len(), &mut bad), einval);
        assert_eq!(zonal_drain_all_pages(z), einval);
        assert_eq!(zonal_sysctl_get(z, name.as_ptr(), buf.as_mut_ptr(), buf.len()), einval);
        assert_eq!(zonal_sysctl_set(z, name.as_ptr(), value.as_ptr()), einval);
        assert_eq!(zonal_publish(z, buf.as_mut_ptr(), buf.len()), einval);
        assert_eq!(zonal_unpublish(z), einval);
        zonal_destroy(null_mut());
    }
    assert!(last_error().contains("null zonal handle"), "{}", last_error());
    assert!(p.is_null() && n == 7 && bad == 99);
    assert!(buf.iter().all(|&c| c == 0x55), "a refused call wrote the buffer");
    assert!(slots.iter().all(|s| s.is_null()));
}

/// The bulk calls write exactly the slots they are given: the array form fills only NULL
/// slots, the list form clears and fills from the front and sets the rest to NULL when
/// memory runs short; a bulk free frees every good entry past a bad one and names the bad
/// one's index.
#[test]
fn bulk_calls_stay_inside_the_callers_arrays() {
    let h = Handle::new("topology=nodes=2,size=8M");
    let z = h.0.cast_const();
    // SAFETY: a live handle.
    assert!(unsafe { zonal_drain_all_pages(z) } >= 0);
    let start = nr_free(z, 0) + nr_free(z, 1);

    // Array form: 64 slots, one kept.
    let kept = alloc(z, 0, 0);
    let mut arr = vec![null_mut::<c_void>(); 64].into_boxed_slice();
    arr[5] = kept;
    // SAFETY: a live handle; `arr` holds 64 pointers.
    assert_eq!(unsafe { zonal_alloc_pages_bulk_array(z, 0, arr.as_mut_ptr(), arr.len()) }, 64);
    assert_eq!(arr[5], kept, "a non-NULL slot is left as it was");
    let mut seen: Vec<usize> = arr.iter().map(|&p| p as usize).collect();
    assert!(seen.iter().all(|&p| p != 0 && p % 4096 == 0));
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 64, "64 distinct frames");
    // A full array: nothing to fill, the count of non-NULL slots returns.
    // SAFETY: as above.
    assert_eq!(unsafe { zonal_alloc_pages_bulk_array(z, 0, arr.as_mut_ptr(), arr.len()) }, 64);
    // SAFETY: a live handle; NULL with 0 is allowed, NULL with a length is refused.
    unsafe {
        assert_eq!(zonal_alloc_pages_bulk_array(z, 0, null_mut(), 0), 0);
        assert_eq!(zonal_alloc_pages_bulk_array(z, 0, null_mut(), 1), -libc::EINVAL);
        assert_eq!(zonal_alloc_pages_bulk_array(z, 0x80, arr.as_mut_ptr(), arr.len()), -libc::EINVAL);
    }
    let mut bad = 99usize;
    // SAFETY: a live handle; `arr` holds 64 readable pointers.
    assert_eq!(unsafe { zonal_free_pages_bulk(z, arr.as_ptr(), arr.len(), &mut bad) }, 0);
    assert_eq!(bad, 99, "not written on success");

    // List form into a caller's array holding garbage: it is cleared and filled.
    let mut list = vec![std::ptr::NonNull::<c_void>::dangling().as_ptr(); 32].into_boxed_slice();
    // SAFETY: a live handle; `list` holds 32 writable pointers.
    assert_eq!(unsafe { zonal_alloc_pages_bulk_list(z, 0, list.len(), list.as_mut_ptr()) }, 32);
    assert!(list.iter().all(|&p| !p.is_null() && p as usize % 4096 == 0));
    // One bad entry in the middle: every other one is freed, its index reported.
    let saved = list[7];
    let on_heap = Box::new(0u64);
    list[7] = (&*on_heap as *const u64).cast_mut().cast();
    // SAFETY: a live handle; `list` holds 32 readable pointers; `bad` is writable.
    assert_eq!(unsafe { zonal_free_pages_bulk(z, list.as_ptr(), list.len(), &mut bad) }, -libc::EFAULT);
    assert_eq!(bad, 7);
    // The same list again: the freed entries are double frees now, the first one reported.
    list[7] = saved;
    // SAFETY: as above.
    assert_eq!(unsafe { zonal_free_pages_bulk(z, list.as_ptr(), list.len(), &mut bad) }, -libc::EALREADY);
    assert_eq!(bad, 0);
    // ... and the one good entry, `saved`, was freed by that call all the same.
    assert_eq!(free(z, saved, 0), -libc::EALREADY);
    // SAFETY: a live handle; NULL with 0 is allowed, NULL with a length is refused and
    // `bad` is not written.
    unsafe {
        assert_eq!(zonal_alloc_pages_bulk_list(z, 0, 0, null_mut()), 0);
        assert_eq!(zonal_alloc_pages_bulk_list(z, 0, 1, null_mut()), -libc::EINVAL);
        assert_eq!(zonal_free_pages_bulk(z, null(), 0, &mut bad), 0);
        bad = 99;
        assert_eq!(zonal_free_pages_bulk(z, null(), 3, &mut bad), -libc::EINVAL);
        assert_eq!(bad, 99);
    }

    // Short of memory: more asked than the allocator has. The first n slots are frames, the
    // rest NULL, every one of them written (the array was all garbage).
    let ask = 5000usize;
    let mut many = vec![std::ptr::NonNull::<c_void>::dangling().as_ptr(); ask].into_boxed_slice();
    // SAFETY: a live handle; `many` holds `ask` writable pointers.
    let n = unsafe { zonal_alloc_pages_bulk_list(z, 0, ask, many.as_mut_ptr()) };
    assert!(n > 0 && (n as usize) < ask, "{n} of {ask}");
    let n = n as usize;
    assert!(many[..n].iter().all(|p| !p.is_null()));
    assert!(many[n..].iter().all(|p| p.is_null()), "slots past the count are NULL");
    // SAFETY: a live handle; the first n entries of `many` are readable.
    assert_eq!(unsafe { zonal_free_pages_bulk(z, many.as_ptr(), n, null_mut()) }, 0);

    assert_eq!(free(z, kept, 0), -libc::EALREADY, "kept was in the array freed above");
    // SAFETY: a live handle.
    assert!(unsafe { zonal_drain_all_pages(z) } >= 0);
    assert_eq!(nr_free(z, 0) + nr_free(z, 1), start, "every frame back");
}

/// Reports, tunables and the last error are written like snprintf into buffers of exactly
/// the size given: the full length returned, the text cut to len - 1 bytes and always
/// NUL-terminated, nothing written past len, nothing at all for NULL/0.
#[test]
fn text_results_never_write_past_the_callers_buffer() {
    let h = Handle::new("topology=nodes=2,size=8M");
    let z = h.0.cast_const();
    let p = alloc(z, 0, 0);
    assert_eq!(free(z, p, 0), 0);
    let reports = [
        (ZONAL_REPORT_ZONEINFO, "Node 0, zone   Normal"),
        (ZONAL_REPORT_BUDDYINFO, "Node 0, zone   Normal"),
        (ZONAL_REPORT_ZONES_JSON, "["),
        (ZONAL_REPORT_NUMASTAT, ""),
        (ZONAL_REPORT_VMSTAT, "nr_free_pages "),
        (ZONAL_REPORT_VMSTAT_JSON, "{"),
        (ZONAL_REPORT_PROMETHEUS, "# "),
    ];
    for (report, head) in reports {
        // SAFETY: a live handle; buffers as read_text passes them.
        let text = read_text(|buf, len| unsafe { zonal_report(z, report, buf, len) });
        assert!(text.starts_with(head), "report {report}: {text:.80}");
        // Cut short at every small size, and one byte short of the whole.
        for len in [1usize, 2, 7, text.len()] {
            let mut buf = vec![0x55 as c_char; len].into_boxed_slice();
            // SAFETY: `buf` is valid for `len` bytes.
            let rc = unsafe { zonal_report(z, report, buf.as_mut_ptr(), len) };
            assert_eq!(rc as usize, text.len(), "report {report} into {len}");
            assert_eq!(buf[len - 1], 0, "report {report} into {len}: not NUL-terminated");
            // SAFETY: NUL-terminated within `buf`.
            let got = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes();
            assert_eq!(got, &text.as_bytes()[..len - 1], "report {report} into {len}");
        }
    }
    let mut buf = vec![0x55 as c_char; 8].into_boxed_slice();
    // SAFETY: a live handle; `buf` is valid for 8 bytes.
    assert_eq!(unsafe { zonal_report(z, 42, buf.as_mut_ptr(), buf.len()) }, -libc::EINVAL);
    assert!(buf.iter().all(|&c| c == 0x55), "a refused report wrote the buffer");
    assert!(last_error().contains("unknown report 42"), "{}", last_error());

    // Tunables.
    let get = |name: &str| {
        let name = cs(name);
        // SAFETY: a live handle; `name` is NUL-terminated; buffers as read_text passes them.
        read_text(|buf, len| unsafe { zonal_sysctl_get(z, name.as_ptr(), buf, len) })
    };
    let set = |name: &str, value: &str| {
        let (name, value) = (cs(name), cs(value));
        // SAFETY: a live handle and NUL-terminated strings.
        unsafe { zonal_sysctl_set(z, name.as_ptr(), value.as_ptr()) }
    };
    assert_eq!(set("watermark_scale_factor", "300"), 0);
    assert_eq!(get("watermark_scale_factor"), "300");
    assert_eq!(set("watermark_scale_factor", "0"), -libc::EINVAL);
    assert!(last_error().contains("1..=3000"), "{}", last_error());
    assert_eq!(get("watermark_scale_factor"), "300", "a refused value keeps the old one");
    assert_eq!(set("numa_stats_mode", "Strict"), 0);
    assert_eq!(get("numa_stats_mode"), "strict");
    assert_eq!(set("nosuch", "1"), -libc::EINVAL);
    let name = cs("nosuch");
    // SAFETY: a live handle; NULL strings are allowed and refused.
    unsafe {
        assert_eq!(zonal_sysctl_get(z, name.as_ptr(), null_mut(), 0), -libc::EINVAL);
        assert_eq!(zonal_sysctl_get(z, null(), null_mut(), 0), -libc::EINVAL);
        assert_eq!(zonal_sysctl_set(z, name.as_ptr(), null()), -libc::EINVAL);
        assert_eq!(zonal_sysctl_set(z, null(), name.as_ptr()), -libc::EINVAL);
    }

    // Counters by name.
    let mut n = 0u64;
    // SAFETY: a live handle, NUL-terminated names, storage for one u64 or NULL.
    unsafe {
        assert_eq!(zonal_vmstat(z, cs("pgfree").as_ptr(), &mut n), 0);
        assert!(n >= 1, "pgfree {n}");
        assert_eq!(zonal_refresh_vm_stats(z), 0);
        assert_eq!(zonal_vmstat(z, cs("nr_free_pages").as_ptr(), &mut n), 0);
        assert!(n > 0);
        n = 7;
        assert_eq!(zonal_vmstat(z, cs("nr_nothing").as_ptr(), &mut n), -libc::EINVAL);
        assert_eq!(n, 7);
        assert_eq!(zonal_vmstat(z, cs("pgfree").as_ptr(), null_mut()), -libc::EINVAL);
    }

    // The last error, cut short like the rest.
    assert_eq!(set("nosuch", "1"), -libc::EINVAL);
    let msg = last_error();
    assert!(msg.contains("nosuch"), "{msg}");
    let mut tiny = vec![0x55 as c_char; 5].into_boxed_slice();
    // SAFETY: `tiny` is valid for 5 bytes.
    assert_eq!(unsafe { zonal_last_error(tiny.as_mut_ptr(), tiny.len()) } as usize, msg.len());
    // SAFETY: NUL-terminated within `tiny`.
    assert_eq!(unsafe { CStr::from_ptr(tiny.as_ptr()) }.to_bytes(), &msg.as_bytes()[..4]);
    assert_eq!(zonal_abi_version(), ZONAL_ABI_VERSION);
}

/// Policies by C string, each thread's own.
#[test]
fn policies_by_c_string() {
    let h = Handle::new("topology=nodes=2,size=8M");
    let z = h.0.cast_const();
    let set = |p: &str| {
        let p = cs(p);
        // SAFETY: a live handle and a NUL-terminated string.
        unsafe { zonal_set_policy(z, p.as_ptr()) }
    };
    let nid = |p: *mut c_void| {
        // SAFETY: a live handle; the address is only looked up.
        unsafe { zonal_page_to_nid(z, p) }
    };
    assert_eq!(set("interleave"), 0);
    let (a, b) = (alloc(z, 0, 0), alloc(z, 0, 0));
    assert_ne!(nid(a), nid(b), "interleave alternates the nodes");
    assert_eq!((free(z, a, 0), free(z, b, 0)), (0, 0));
    assert_eq!(set("bind=1"), 0);
    for _ in 0..4 {
        let p = alloc(z, 0, 1);
        assert_eq!(nid(p), 1);
        assert_eq!(free(z, p, 1), 0);
    }
    assert_eq!(set("bogus"), -libc::EINVAL);
    assert_eq!(set("preferred=9"), -libc::ENODEV);
    // SAFETY: a live handle; NULL is allowed and refused.
    assert_eq!(unsafe { zonal_set_policy(z, null()) }, -libc::EINVAL);
    let p = alloc(z, 0, 0);
    assert_eq!(nid(p), 1, "refused policies left bind=1 in place");
    assert_eq!(free(z, p, 0), 0);
    // Another thread has the default policy, local; here every CPU is on node 1.
    let h2 = Handle::new("topology=nodes=2,size=8M,cpus=:0");
    let z2 = h2.0 as usize;
    std::thread::spawn(move || {
        let z2 = z2 as *const Zonal;
        let p = alloc(z2, ZONAL_GFP_THISNODE, 0);
        // SAFETY: a live handle (h2 outlives this thread); the address is only looked up.
        assert_eq!(unsafe { zonal_page_to_nid(z2, p) }, 1);
        let mut q = null_mut();
        // SAFETY: as above, and storage for one pointer.
        let rc = unsafe { zonal_alloc_pages_node(z2, ZONAL_NUMA_NO_NODE, ZONAL_GFP_THISNODE, 3, &mut q) };
        assert_eq!(rc, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { zonal_page_to_nid(z2, q) }, 1, "ZONAL_NUMA_NO_NODE is this CPU's node, 1");
        assert_eq!((free(z2, p, 0), free(z2, q, 3)), (0, 0));
    })
    .join()
    .unwrap();
    assert_eq!(set("local"), 0);
}

/// One handle used from several threads at once, as a C program shares a `zonal_t *`, then
/// destroyed once: no block is handed to two threads (each stamps its blocks and finds its
/// stamps intact when it frees them), and every frame comes back.
#[test]
fn a_handle_shared_by_threads_then_destroyed() {
    let h = Handle::new("topology=nodes=2,size=16M");
    let z = h.0 as usize;
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            std::thread::spawn(move || {
                let z = z as *const Zonal;
                // Every frame of a block holds its owner's stamp: the thread and the step.
                let stamp = |p: *mut c_void, o: u32, i: u32| {
                    for f in 0..1usize << o {
                        // SAFETY: frame f of a block of 2^o frames this thread holds.
                        unsafe { p.cast::<u8>().add(f * 4096).cast::<[u32; 2]>().write([t, i]) };
                    }
                };
                let check_stamp = |p: *mut c_void, o: u32, i: u32| {
                    for f in 0..1usize << o {
                        // SAFETY: as above; written by `stamp` when the block came.
                        let got = unsafe { p.cast::<u8>().add(f * 4096).cast::<[u32; 2]>().read() };
                        assert_eq!(got, [t, i], "thread {t}: frame {f} of its block {p:p} was overwritten");
                    }
                };
                let mut held: Vec<(*mut c_void, u32, u32)> = Vec::new();
                for i in 0..3000u32 {
                    // At most 64 blocks of at most 8 frames per thread: 2048 of 8192 frames.
                    if held.len() == 64 || (i % 3 == 2 && !held.is_empty()) {
                        let (p, o, at) = held.swap_remove((i as usize * 7) % held.len());
                        check_stamp(p, o, at);
                        assert_eq!(free(z, p, o), 0);
                    } else {
                        let order = (i + t) % 4;
                        let p = alloc(z, 0, order);
                        stamp(p, order, i);
                        held.push((p, order, i));
                    }
                    if i % 500 == 0 {
                        let mut slots = vec![null_mut::<c_void>(); 16].into_boxed_slice();
                        // SAFETY: a live handle; `slots` holds 16 pointers.
                        let n = unsafe { zonal_alloc_pages_bulk_array(z, 0, slots.as_mut_ptr(), slots.len()) };
                        assert_eq!(n, 16);
                        for &p in slots.iter() {
                            stamp(p, 0, u32::MAX);
                        }
                        for &p in slots.iter() {
                            check_stamp(p, 0, u32::MAX);
                        }
                        // SAFETY: as above.
                        assert_eq!(unsafe { zonal_free_pages_bulk(z, slots.as_ptr(), slots.len(), null_mut()) }, 0);
                    }
                }
                for (p, o, at) in held {
                    check_stamp(p, o, at);
                    assert_eq!(free(z, p, o), 0);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let z = h.0.cast_const();
    // SAFETY: a live handle.
    assert!(unsafe { zonal_drain_all_pages(z) } >= 0);
    assert_eq!(nr_free(z, 0) + nr_free(z, 1), 8192, "16 MiB per node, every frame back");
    drop(h);
}
