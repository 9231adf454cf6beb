//! Re-coalescing a region's mappings: khugepaged's `collapse_huge_page`, at every order
//! from 1 to 9, run by the balancer's thread.
//!
//! A page migrated on its own gets a frame wherever its node's reserve had one, so after a
//! migration wave a region is a mapping per page (the kernel merges neighbouring mappings
//! only when their file offsets, frame numbers here, follow each other). Thousands of
//! mappings cost every `mmap`/`mprotect` of the process (the kernel walks them under the
//! mmap lock), push toward `vm.max_map_count`, and make the scanner's protections split
//! more. Collapsing copies an aligned window of `2^order` pages, all mapped on one node,
//! into one block of consecutive frames of that node and maps the block with one `mmap`:
//! the window's mappings become one. Windows that hold pages of several nodes, or a page
//! without a frame, are tried half by half down to order 1, so what can merge does.
//!
//! A window with a pinned page is never collapsed (its frames may be held by the kernel).
//! A window is left alone while a page of it looks misplaced (its last hint fault came from
//! another node than its frame's): the balancer is about to move it, and a collapse would
//! copy it for nothing.
//!
//! While balancing runs with window migration, a window to collapse first gets a destination
//! block on its node instead (`RegionShared::defer_collapse`): the scanner hides its pages
//! anyway, and each local hint fault then moves its page into its slot, with no shootdown,
//! where hiding the window here costs one per mapping. A window whose block took no page
//! for two visits is collapsed as below.
//!
//! The window's pages are claimed (`PRESENT`/`HINT -> BUSY`) one by one, hidden in one call,
//! copied and mapped; a thread that touches one meanwhile waits in the fault handler, as for
//! a migration. Hinted pages come back mapped (their hint is dropped, as khugepaged's
//! collapse maps the huge page accessible). The work is bounded per pass (`collapse_mb` per
//! second), as khugepaged's `pages_to_scan` bounds its.

use crate::fault::Hide;
use crate::os::{self, PAGE};
use crate::state::Cursor;
use crate::table::{Cpupid, HINT, PRESENT};
use crate::{RegionShared, Shared};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The largest window: 2 MiB (order 9), a scanner run and a chunk migration.
pub(crate) const MAX_ORDER: u32 = 9;

/// What a window's pages allow.
#[derive(Debug, PartialEq, Eq)]
enum Look {
    /// Already one mapping, or nothing to gain: leave it.
    Leave,
    /// Pages of several nodes, an unmapped page, a misplaced page: try the halves.
    Halves,
    /// Every page mapped on this node, in more than one mapping.
    Collapse(u16),
}

/// One pass from `cur`: collapses windows until the next would pass `budget` pages copied,
/// or eight times that of address space was looked at. Returns the pages copied.
pub(crate) fn pass(bal: &Shared, regions: &[Arc<RegionShared>], cur: &mut Cursor, budget: usize) -> usize {
    if regions.is_empty() || budget == 0 {
        return 0;
    }
    let mut copied = 0;
    let mut virt = budget.saturating_mul(8).max(1 << MAX_ORDER);
    if cur.region >= regions.len() {
        *cur = Cursor::default();
    }
    let n = 1usize << MAX_ORDER;
    let first = cur.region;
    loop {
        let r = &regions[cur.region];
        let mut full = false;
        {
            // The scan lock keeps the region from being torn down under the copy.
            let dead = r.scan_lock.lock().unwrap_or_else(|p| p.into_inner());
            let len = r.entries.len();
            while !*dead && cur.page < len && !full && virt > 0 {
                let mut left = budget - copied;
                full = window(bal, r, cur.page, MAX_ORDER, &mut left, budget).is_break();
                copied = budget - left;
                virt = virt.saturating_sub(n);
                if !full {
                    cur.page += n;
                }
            }
            if *dead {
                cur.page = len;
            }
        }
        if full || virt == 0 {
            break;
        }
        cur.page = 0;
        cur.region = (cur.region + 1) % regions.len();
        if cur.region == first {
            break;
        }
    }
    copied
}

/// Collapses the window of `2^order` pages at `c` (aligned), or its halves, taking the pages
/// copied from `left`. Breaks when a window to collapse does not fit what is left of the
/// pass's `budget`: the pass ends before it, so the next one starts there, rather than cut
/// it into smaller blocks that a later pass would copy again. A window larger than the
/// whole budget is cut into halves that fit.
fn window(bal: &Shared, r: &RegionShared, c: usize, order: u32, left: &mut usize, budget: usize) -> ControlFlow<()> {
    let n = 1usize << order;
    let halves = |left: &mut usize| {
        if order > 1 {
            window(bal, r, c, order - 1, left, budget)?;
            window(bal, r, c + n / 2, order - 1, left, budget)?;
        }
        ControlFlow::Continue(())
    };
    if c + n > r.entries.len() {
        return if c < r.entries.len() { halves(left) } else { ControlFlow::Continue(()) };
    }
    match look(bal, r, c, n) {
        Look::Leave => ControlFlow::Continue(()),
        // The window's destination block takes the pages on their local hint faults, which
        // need no shootdown (see `RegionShared::defer_collapse`).
        Look::Collapse(nid) if r.defer_collapse(c / crate::dest::WINDOW, nid) => ControlFlow::Continue(()),
        Look::Collapse(_) if n > budget => halves(left),
        Look::Collapse(_) if n > *left => ControlFlow::Break(()),
        Look::Collapse(nid) => match collapse(bal, r, c, order, nid) {
            Ok(()) => {
                *left -= n;
                ControlFlow::Continue(())
            }
            // No block of this order on the node: smaller ones may still be there.
            Err(Failed::NoBlock) => halves(left),
            Err(Failed::Raced | Failed::Map) => ControlFlow::Continue(()),
        },
        Look::Halves => halves(left),
    }
}

/// Reads a window without claiming anything.
fn look(bal: &Shared, r: &RegionShared, c: usize, n: usize) -> Look {
    let z = &bal.z;
    let mut node = None;
    let mut one_run = true;
    let mut prev = 0;
    for (j, e) in r.entries[c..c + n].iter().enumerate() {
        let f = e.frame.load(Ordering::Relaxed);
        let s = e.state.load(Ordering::Relaxed);
        if f == 0 || (s != PRESENT && s != HINT) || e.pinned() {
            return Look::Halves;
        }
        let Ok(nid) = z.page_to_nid(f as *const u8).map(|n| n.0) else { return Look::Halves };
        if *node.get_or_insert(nid) != nid {
            return Look::Halves;
        }
        let last = Cpupid(e.last.load(Ordering::Relaxed));
        if !last.is_unset() && last.nid() != nid {
            return Look::Halves;
        }
        one_run &= j == 0 || f == prev + PAGE;
        prev = f;
    }
    match node {
        Some(nid) if !one_run => Look::Collapse(nid),
        _ => Look::Leave,
    }
}

enum Failed {
    /// The node has no free block of the order (or no room above its high watermark).
    NoBlock,
    /// A page changed under the look (a fault or a migration claimed it first).
    Raced,
    /// The window could not be hidden or mapped (out of mappings); it is mapped as before.
    Map,
}

/// Copies the window of `2^order` pages at `c` into one block of node `nid` and maps it.
fn collapse(bal: &Shared, r: &RegionShared, c: usize, order: u32, nid: u16) -> Result<(), Failed> {
    let n = 1usize << order;
    let z = &bal.z;
    let st = &bal.stats;
    if !bal.has_room_for(nid, n) {
        return Err(Failed::NoBlock);
    }
    // Held and split, so that each frame can be freed on its own later (a page of the
    // window may migrate alone).
    let block = bal.alloc_held(nid, order).ok_or(Failed::NoBlock)?;
    let free_block = || {
        for k in 0..n {
            // The block's frames are held and mapped nowhere.
            bal.free_frame(block as usize + k * PAGE);
        }
    };
    let entries = &r.entries[c..c + n];
    // Claim every page, remembering what it was; a page claimed by someone else first ends
    // the attempt and puts back what was claimed.
    let mut was = [0u8; 1 << MAX_ORDER];
    for (k, e) in entries.iter().enumerate() {
        let s = e.state.load(Ordering::Relaxed);
        if !((s == PRESENT || s == HINT) && e.claim(s)) {
            for (e, &s) in entries[..k].iter().zip(&was) {
                e.release(s);
            }
            free_block();
            return Err(Failed::Raced);
        }
        was[k] = s;
    }
    // The look read without claims: check again, now that nothing can change (a pin, read
    // after the claim, ends the attempt: see `table`).
    let frames_ok = entries
        .iter()
        .all(|e| !e.pinned() && z.page_to_nid(e.frame.load(Ordering::Relaxed) as *const u8).is_ok_and(|x| x.0 == nid));
    if !frames_ok {
        for (e, &s) in entries.iter().zip(&was) {
            e.release(s);
        }
        free_block();
        return Err(Failed::Raced);
    }
    let addr = r.start + c * PAGE;
    // SAFETY: the window's pages are this region's, mapped and claimed by this thread.
    if unsafe { r.hide_new(addr, n * PAGE, Hide::ProtectFirst) }.is_err() {
        r.remap_old(c, n);
        st.collapse_fail.fetch_add(1, Ordering::Relaxed);
        free_block();
        return Err(Failed::Map);
    }
    for (k, e) in entries.iter().enumerate() {
        let old = e.frame.load(Ordering::Relaxed);
        // SAFETY: both frames are allocated and mapped read-write in the arena; the window's
        // pages are inaccessible and claimed, so nobody writes the old frames meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(old as *const u8, block.wrapping_add(k * PAGE), PAGE) };
    }
    let mapped = z.frame_offset(block).ok().and_then(|off| {
        // SAFETY: the window is this region's and claimed; the block's frames are ours.
        unsafe { os::map_frame(addr, n * PAGE, z.frame_file(), off, false) }.ok()
    });
    if mapped.is_none() {
        st.map_fail.fetch_add(1, Ordering::Relaxed);
        st.collapse_fail.fetch_add(1, Ordering::Relaxed);
        r.remap_old(c, n);
        free_block();
        return Err(Failed::Map);
    }
    r.mapped_anew(addr, n * PAGE);
    for (k, e) in entries.iter().enumerate() {
        let old = e.frame.swap(block as usize + k * PAGE, Ordering::Relaxed);
        // SAFETY: the old frame is mapped nowhere now but the arena, and ours alone.
        unsafe { bal.to_free.push(old) };
    }
    st.collapsed.fetch_add(1, Ordering::Relaxed);
    st.collapsed_pages.fetch_add(n as u64, Ordering::Relaxed);
    for e in entries {
        e.release(PRESENT);
    }
    Ok(())
}
