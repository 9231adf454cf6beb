//! The list algorithms of the per-CPU page lists, run under a [`PcpGuard`](super::PcpGuard)
//! on the [`PcpInner`] it protects: take a block (`rmqueue_pcplist`), refill from the buddy
//! lists in a batch (`rmqueue_bulk`), free onto the lists and drain past `high`
//! (`free_to_pcp`, `nr_pcp_high`, `nr_pcp_free`, `free_pcppages_bulk`, `drain`), decay an idle
//! `high` (`decay_high`), size `batch` and `high` from the zone (`zone_batchsize`,
//! `zone_highsize`, `set_high_and_batch`) and check the invariant (`check`).
//!
//! Kernel counterpart: `__rmqueue_pcplist`, `rmqueue_bulk`, `free_unref_page_commit`,
//! `nr_pcp_high`, `nr_pcp_free`, `free_pcppages_bulk`, `drain_pages_zone`, `decay_pcp_high`,
//! `zone_batchsize`, `zone_highsize` (mm/page_alloc.c, Linux 6.7+).
//!
//! Locking: every function here takes `&mut PcpInner`, which only a guard hands out, so the
//! lists' lock is held; those that move blocks to or from the buddy lists take the zone lock
//! inside it, once per batch (lock order: pcp lock, then zone lock). None of them sees the
//! rseq cache: the guard has flushed it into the order-0 list before and refills it after.
//!
//! Invariant (checked by [`check`]): `count == sum(len(lists[o]) << o)`, every block on
//! `lists[o]` has head state `PCP|o`, and `count <= high + batch`.

use super::ZoneListsOf;
use super::{PcpInner, INBOX_CAP, NR_PCP_LISTS, OUTBOX_CAP, PCP_BATCH_SCALE_MAX, PCP_THP_HIGH, PCP_THP_ORDER};
use crate::mem_map::{self, NO_OWNER, PCP, RUN_ORDER};
use crate::sync::Ordering;
use crate::types::{Order, Pfn, PAGE_SIZE};
use crate::zone::{Watermark, Zone};

/// `zone_batchsize`: a quarter of the zone's 1/1024 share capped at 1 MiB, clamped to
/// `2^n - 1` (so batches do not alias in caches), at least 1: 63 for zones of 1 GiB and more.
pub fn zone_batchsize(managed: usize) -> usize {
    let batch = ((managed >> 10).min((1 << 20) / PAGE_SIZE) / 4).max(1);
    let b = batch + batch / 2;
    let pow = 1usize << (usize::BITS - 1 - b.leading_zeros());
    (pow - 1).max(1)
}

/// `zone_highsize`: the zone's low watermark (or `managed / fraction` when the fraction is
/// set) split over the CPUs of the zone's node (all CPUs for a memory-only node), at least
/// four batches.
pub fn zone_highsize(
    low_wmark: usize,
    managed: usize,
    batch: usize,
    node_cpus: usize,
    nr_cpus: usize,
    fraction: u32,
) -> usize {
    let total = if fraction == 0 { low_wmark } else { managed / fraction as usize };
    let split = if node_cpus == 0 { nr_cpus.max(1) } else { node_cpus };
    (total / split).max(batch << 2)
}

/// Takes a block of `order` from the lists, refilling them from the buddy lists first if the
/// list is empty (`__rmqueue_pcplist`). The block's head state is still `PCP|order`: the
/// caller tags it allocated before anyone else can see it. `None` if the zone has no block of
/// the order either.
#[inline]
pub fn rmqueue_pcplist(zone: &Zone, pcp: &mut PcpInner, order: Order) -> Option<Pfn> {
    if order == PCP_THP_ORDER {
        return rmqueue_thp(zone, pcp);
    }
    let o = order.0 as usize;
    pcp.free_factor >>= 1;
    loop {
        if pcp.lists[o].is_empty() && rmqueue_bulk(zone, pcp, order) == 0 {
            return None;
        }
        let pfn = Pfn(pcp.lists[o].pop()?);
        pcp.count -= order.pages();
        pcp.count_min = pcp.count_min.min(pcp.count);
        // A second copy of a frame put on the lists by two racing frees (see `free_check`)
        // no longer carries the tag: drop it.
        if zone.state(pfn).load(Ordering::Relaxed) == mem_map::state(PCP, order) {
            return Some(pfn);
        }
    }
}

/// Moves `nr_pcp_alloc` blocks of `order` from the buddy lists to the pcp list under one
/// acquisition of the zone lock (`rmqueue_bulk`); grows `high` by a batch on the way when
/// `high` is auto-tuned and the zone is above its high watermark (Linux 6.7). Returns the
/// number of blocks moved.
#[cold]
pub fn rmqueue_bulk(zone: &Zone, pcp: &mut PcpInner, order: Order) -> usize {
    if pcp.high_min != pcp.high_max && zone.nr_free() >= zone.watermark(Watermark::High) {
        pcp.high = (pcp.high + pcp.batch).min(pcp.high_max);
    }
    pcp.free_count = 0;
    // nr_pcp_alloc: order 0 takes `batch << alloc_factor` frames, at most what keeps the lists
    // a batch below high, doubling while allocations run without frees; larger orders take
    // max(batch >> order, 2) blocks. zonal also keeps the lists within high + batch once the
    // caller has taken its block, which only binds for tiny batches.
    let want = if order.0 == 0 {
        let scaled = pcp.batch << pcp.alloc_factor;
        let max_nr_alloc = (pcp.high.saturating_sub(pcp.count + pcp.batch)).max(pcp.batch);
        if scaled <= max_nr_alloc && pcp.alloc_factor < PCP_BATCH_SCALE_MAX {
            pcp.alloc_factor += 1;
        }
        scaled.min(max_nr_alloc).max(2)
    } else {
        (pcp.batch >> order.0).max(2)
    };
    let room = 1 + ((pcp.high + pcp.batch).saturating_sub(pcp.count) >> order.0);
    let want = want.min(room);
    // Order 0 takes its inbox first (frames of its own runs that other CPUs freed), then the
    // zone's transfer list, then the buddy, for what the inbox lacked.
    let mine = if order.0 == 0 { take_inbox(zone, pcp, want) } else { 0 };
    if mine >= want.min(pcp.batch).max(1) {
        return mine;
    }
    let (want, room) = (want - mine, room - mine);
    if order.0 == 0 {
        let n = take_transfer(zone, pcp, want);
        if n > 0 {
            return mine + n;
        }
    }
    let list = &mut pcp.lists[order.0 as usize];
    let first = list.len();
    // Order 0 takes whole runs of `RUN_ORDER` when the lists have room for one: a run's state
    // bytes are two lines this CPU alone then writes, where frames split between CPUs would
    // put two CPUs' hot frames on one line (see `mem_map`). A zone without a free run (small,
    // or fragmented) hands out its smallest blocks as before.
    let run = RUN_ORDER.pages();
    let runs = if order.0 == 0 { want.div_ceil(run).min(room / run) } else { 0 };
    let mut l = zone.lock();
    let mut b = l.buddy();
    let runs = if runs > 0 { b.rmqueue_many(RUN_ORDER, runs, list) } else { 0 };
    let n = if runs == 0 { b.rmqueue_many(order, want, list) } else { runs * run };
    drop(l);
    if runs > 0 {
        expand_runs(list, runs);
    }
    // Tagged after the zone lock is dropped: the tags are stores to lines the CPU that freed
    // the frames last wrote, so under the lock they would make every other CPU's refill and
    // drain wait for those misses. Nobody can take these frames meanwhile: they are on no
    // buddy list, and these lists are under our lock; a caller's stray free of one finds
    // `NONE` and is refused.
    for &pfn in &list[first..] {
        zone.state(Pfn(pfn)).store(mem_map::state(PCP, order), Ordering::Relaxed);
    }
    if order.0 == 0 && pcp.routes {
        // These lists own the runs now (last writer wins, a partial run too).
        own_runs(zone, pcp.cpu, &list[first..]);
    }
    pcp.count += n << order.0;
    mine + n
}

/// Names `cpu` the owner of the runs of `frames` (one write per run that changes hands;
/// neighbours of one run, which refills and sorted takes bring together, looked up once):
/// frees of their frames on another CPU come back here (see `mem_map::MemMap`'s owners).
#[inline]
fn own_runs(zone: &Zone, cpu: u32, frames: &[usize]) {
    debug_assert!(cpu < u32::from(NO_OWNER));
    let mut last = usize::MAX;
    for &pfn in frames {
        if pfn >> RUN_ORDER.0 != last {
            last = pfn >> RUN_ORDER.0;
            zone.set_run_owner(Pfn(pfn), cpu as u16);
        }
    }
}

/// Refills the order-0 list with up to `want` frames of these lists' inbox (frames of their
/// runs that other CPUs freed, see [`deliver`]), the newest first; returns how many. Sorted
/// as [`take_transfer`] sorts. The frames stay counted as per-CPU pages.
#[inline]
fn take_inbox(zone: &Zone, pcp: &mut PcpInner, want: usize) -> usize {
    match zone.lists(pcp.cpu as usize) {
        Some(me) if pcp.routes && want > 0 && me.inbox().len_hint() > 0 => take_frames(zone, pcp, me.inbox(), want, 1),
        _ => 0,
    }
}

/// Moves up to `want` of the newest frames of `from` (the zone's transfer list, or an
/// inbox) onto the order-0 list, when it holds at least `enough`, highest address first
/// (see [`take_transfer`]), and names these lists the owner of their runs; returns how many.
#[inline]
fn take_frames(zone: &Zone, pcp: &mut PcpInner, from: &crate::zone::Transfer, want: usize, enough: usize) -> usize {
    let mut t = from.lock();
    let n = want.min(t.len());
    if n < enough {
        return 0;
    }
    let at = pcp.lists[0].len();
    t.take_newest(n, &mut pcp.lists[0]);
    drop(t);
    highest_first(&mut pcp.lists[0][at..], &mut pcp.sorting);
    if pcp.routes {
        own_runs(zone, pcp.cpu, &pcp.lists[0][at..]);
    }
    pcp.count += n;
    pcp.transferred -= n as isize;
    n
}

/// Puts `frames` in address order, highest first, with `scratch` (the lists' `sorting`) as
/// room, which it grows to at most `2 * INBOX_CAP` (once per CPU: lists that never take an
/// inbox keep none; reserving it up front for every CPU grew `bench scale`'s metadata at
/// 1024 CPUs 91× from 2 CPUs, not 35×). A take in either order already costs a pass;
/// anything else is radix-sorted ([`radix_highest_first`]). Frames come back in the order
/// the other CPU freed them, which in `bench mixed` is runs of about six: a comparison sort
/// of them was a tenth of the time at T = 2. A take larger than the room, or frames further
/// apart than the radix passes cover, are sorted.
#[inline]
fn highest_first(frames: &mut [usize], scratch: &mut Vec<u64>) {
    if frames.is_sorted_by(|a, b| a >= b) {
        return;
    }
    if frames.is_sorted() {
        frames.reverse();
        return;
    }
    if frames.len() <= INBOX_CAP && scratch.capacity() < 2 * frames.len() {
        scratch.reserve_exact(2 * INBOX_CAP - scratch.len());
    }
    if !radix_highest_first(frames, scratch) {
        frames.sort_unstable_by(|a, b| b.cmp(a));
    }
}

/// The most 8-bit digits [`radix_highest_first`] sorts on: frames up to 2^24 apart (64 GiB).
const RADIX_PASSES: u32 = 3;

/// Sorts `v` highest first by a least-significant-digit radix sort of each frame's distance
/// below the highest, 8 bits a pass, in `scratch` (two halves of `v.len()`, ping-pong), when
/// `scratch` holds `2 * v.len()` without growing and the frames lie within
/// [`RADIX_PASSES`] digits of each other; `false` (and `v` unchanged) otherwise.
fn radix_highest_first(v: &mut [usize], scratch: &mut Vec<u64>) -> bool {
    let n = v.len();
    let (Some(&lo), Some(&hi)) = (v.iter().min(), v.iter().max()) else {
        return true;
    };
    let passes = (usize::BITS - (hi - lo).leading_zeros()).div_ceil(8);
    if scratch.capacity() < 2 * n || passes > RADIX_PASSES {
        return false;
    }
    scratch.clear();
    scratch.extend(v.iter().map(|&p| (hi - p) as u64));
    scratch.resize(2 * n, 0);
    let (a, b) = scratch.split_at_mut(n);
    let (mut src, mut dst) = (a, b);
    for pass in 0..passes {
        let digit = |k: u64| (k >> (8 * pass)) as usize & 0xff;
        let mut at = [0usize; 256];
        for &k in src.iter() {
            at[digit(k)] += 1;
        }
        let mut sum = 0;
        for slot in at.iter_mut() {
            (*slot, sum) = (sum, sum + *slot);
        }
        for &k in src.iter() {
            let d = digit(k);
            dst[at[d]] = k;
            at[d] += 1;
        }
        std::mem::swap(&mut src, &mut dst);
    }
    for (slot, &k) in v.iter_mut().zip(src.iter()) {
        *slot = hi - k as usize;
    }
    true
}

/// Refills the order-0 list with up to `want` frames from the zone's transfer list (the
/// last ones another CPU drained there, the likeliest still in a cache) when it holds at
/// least a batch of them, or `want` if that is less; returns the frames taken, 0 to send the
/// refill to the buddy. The frames kept their `PCP` tag on the transfer list (a copy that
/// lost it to a racing free is dropped by the pop, as on any list), and stay counted as
/// per-CPU pages.
///
/// The frames taken are put in address order, highest first, so that the pops (from the
/// list's end) hand them out upwards. They reach the list in the order the other CPU freed
/// them, which a few laps through two CPUs' lists shuffle (in `bench cross`, a new state
/// line every five allocations), and in that order nearly every allocation here and every
/// free there touched a state line the other CPU had just written. Sorted, neighbours leave
/// together and share their line's trips between the CPUs (`bench cross` 18% faster; see
/// docs/PERFORMANCE.md, the transfer list). `sort_unstable` never allocates.
///
/// These lists take the frames' runs (last writer wins): a CPU that refills from frames
/// another CPU drained becomes their owner, and that CPU's frees of the runs' other frames
/// come here from then on.
#[inline]
fn take_transfer(zone: &Zone, pcp: &mut PcpInner, want: usize) -> usize {
    let enough = want.min(pcp.batch).max(1);
    if want == 0 || zone.transfer().len_hint() < enough {
        return 0;
    }
    take_frames(zone, pcp, zone.transfer(), want, enough)
}

/// Moves the first `nr` frames of the order-0 list onto the zone's transfer list, as many as
/// it has room for, when the zone is at or above its high watermark (below it, freed frames
/// go back to the buddy, where they can merge); returns how many moved. They keep their tag.
#[inline]
fn give_transfer(zone: &Zone, pcp: &mut PcpInner, nr: usize) -> usize {
    let n = give_transfer_frames(zone, &pcp.lists[0][..nr]);
    pcp.transferred += n as isize;
    n
}

/// [`give_transfer`] of a prefix of `frames`: returns how long a prefix the transfer list
/// took (the caller accounts them: they stay per-CPU pages).
#[inline]
fn give_transfer_frames(zone: &Zone, frames: &[usize]) -> usize {
    if frames.is_empty() || zone.nr_free() < zone.watermark(Watermark::High) {
        return 0;
    }
    let cap = zone.watermark(Watermark::Low);
    if zone.transfer().len_hint() >= cap {
        return 0;
    }
    let mut t = zone.transfer().lock();
    let n = frames.len().min(cap.saturating_sub(t.len()));
    t.extend(frames[..n].iter().copied());
    n
}

/// Whether an order-0 frame freed on these lists' CPU belongs to another CPU's run (its
/// owner's lists, which a delivery reaches, exist): it goes to the outbox, and from there
/// to the owner's inbox, so that the state lines each CPU writes stay its own. A frame of a
/// run nobody owns is taken here: these lists own its run from now on.
#[inline(always)]
fn foreign(zone: &Zone, pcp: &PcpInner, pfn: Pfn) -> bool {
    zone.run_owner(pfn) != pcp.cpu as u16 && foreign_owner(zone, pcp, pfn)
}

/// [`foreign`] for a frame whose run these lists do not own.
#[cold]
#[inline(never)]
fn foreign_owner(zone: &Zone, pcp: &PcpInner, pfn: Pfn) -> bool {
    let owner = zone.run_owner(pfn);
    if owner == NO_OWNER {
        zone.set_run_owner(pfn, pcp.cpu as u16);
        return false;
    }
    zone.lists(owner as usize).is_some()
}

/// Hands the locked outbox's frames (order-0 frames freed here of runs other CPUs own) to
/// their owners, grouped by owner, each group under one acquisition of the owner's inbox
/// lock, as much as the inbox has room for ([`PerCpuPages::inbox_cap`]); what does not fit
/// goes to the zone's transfer list (at or above the high watermark, as a drain past `high`
/// does) or to the buddy (claimed first, as [`free_pcppages_bulk`] claims). A frame whose
/// run is these lists' own by now (or nobody's) joins the order-0 list, drained past `high`
/// as a free is. The frames keep their tag and stay per-CPU pages except those the buddy takes.
/// Returns the frames freed to the buddy.
///
/// Locking: these lists' lock, then one inbox lock at a time, then the transfer list's or
/// the zone lock, never two of them at once.
pub(crate) fn deliver(zone: &Zone, pcp: &mut PcpInner) -> usize {
    if pcp.outbox.is_empty() {
        return 0;
    }
    let me = pcp.cpu as u16;
    // Each frame's owner read once (a refill elsewhere may change it meanwhile: the sort
    // needs fixed keys), as `owner << 48 | pfn`.
    let mut keys = std::mem::take(&mut pcp.sorting);
    keys.clear();
    keys.extend(pcp.outbox.drain(..).map(|pfn| u64::from(zone.run_owner(Pfn(pfn))) << 48 | pfn as u64));
    // Grouped by owner: with one owner (two CPUs a zone, or a pair of threads handing to
    // each other) they are one group already, and the taker puts them in address order.
    if keys.iter().any(|&k| k >> 48 != keys[0] >> 48) {
        keys.sort_unstable();
    }
    let pfn_of = |k: u64| (k & ((1 << 48) - 1)) as usize;
    let mut kept = false;
    // The overflow collects in the (now empty) outbox.
    for group in keys.chunk_by(|a, b| a >> 48 == b >> 48) {
        let owner = (group[0] >> 48) as u16;
        match zone.lists(owner as usize).filter(|_| owner != me && owner != NO_OWNER) {
            Some(l) => {
                let mut t = l.inbox().lock();
                let k = group.len().min(l.inbox_cap().saturating_sub(t.len()));
                t.extend(group[..k].iter().map(|&key| pfn_of(key)));
                drop(t);
                pcp.transferred += k as isize;
                pcp.outbox.extend(group[k..].iter().map(|&key| pfn_of(key)));
            }
            None => {
                for &key in group {
                    if owner == NO_OWNER {
                        zone.set_run_owner(Pfn(pfn_of(key)), me);
                    }
                    pcp.lists[0].push(pfn_of(key));
                }
                pcp.count += group.len();
                kept = true;
            }
        }
    }
    pcp.sorting = keys;
    let mut freed = 0;
    if !pcp.outbox.is_empty() {
        let moved = give_transfer_frames(zone, &pcp.outbox);
        pcp.transferred += moved as isize;
        freed = free_listed(zone, &pcp.outbox[moved..]);
        pcp.outbox.clear();
    }
    if kept {
        freed += drain_past_high(zone, pcp);
    }
    freed
}

/// Returns order-0 frames off a per-CPU list (tagged `PCP`, no longer on any list) to the
/// buddy under one acquisition of the zone lock, each claimed first as
/// [`free_pcppages_bulk`] claims (a copy two racing frees left is dropped); returns how many
/// there were.
fn free_listed(zone: &Zone, frames: &[usize]) -> usize {
    if frames.is_empty() {
        return 0;
    }
    let claimed: Vec<usize> =
        frames.iter().copied().filter(|&pfn| mem_map::claim_listed(zone, Pfn(pfn), Order(0))).collect();
    let mut l = zone.lock();
    let mut b = l.buddy();
    for &pfn in &claimed {
        b.free_one(Pfn(pfn), Order(0));
    }
    frames.len()
}

/// Returns the locked outbox to the buddy (part of a drain); returns the frames freed.
fn drain_outbox(zone: &Zone, pcp: &mut PcpInner) -> usize {
    let n = free_listed(zone, &pcp.outbox);
    pcp.outbox.clear();
    n
}

/// Returns these lists' inbox to the buddy (a drain, or a decay: frames other CPUs handed
/// back that no refill took); `pcp` is the inbox's lists, locked, whose report takes the
/// frames off `nr_zone_pcp_pages`. Returns the frames freed.
fn drain_inbox(zone: &Zone, pcp: &mut PcpInner) -> usize {
    let Some(me) = zone.lists(pcp.cpu as usize).filter(|l| l.inbox().len_hint() > 0) else { return 0 };
    let frames = me.inbox().lock().take_all();
    pcp.transferred -= frames.len() as isize;
    free_listed(zone, &frames)
}

/// Checks CPU `cpu`'s inbox of `zone`: every frame on it a frame of the zone tagged `PCP` at
/// order 0, at most [`INBOX_CAP`] of them. Returns its frames (none for lists the zone does
/// not know).
pub fn check_inbox(zone: &Zone, cpu: usize) -> Result<usize, String> {
    let Some(l) = zone.lists(cpu) else { return Ok(0) };
    let t = l.inbox().lock();
    if t.len() > INBOX_CAP {
        return Err(format!("zone {}: cpu {cpu}'s inbox holds {} frames, above {INBOX_CAP}", zone.id.0, t.len()));
    }
    for pfn in t.frames() {
        let s = if zone.contains(Pfn(pfn)) { zone.state(Pfn(pfn)).load(Ordering::Relaxed) } else { 0 };
        if s != mem_map::state(PCP, Order(0)) {
            return Err(format!("zone {}: frame {pfn:#x} in cpu {cpu}'s inbox has state {s:#x}", zone.id.0));
        }
    }
    Ok(t.len())
}

/// Returns the zone's transfer list to the buddy (part of `drain_all_pages`), each frame
/// claimed first as [`free_pcppages_bulk`] claims, so that a copy left by racing frees is
/// freed once; `pcp` is the calling CPU's lists of the zone, locked, whose report takes the
/// frames off `nr_zone_pcp_pages`. Returns the frames freed.
pub fn drain_transfer(zone: &Zone, pcp: &mut PcpInner) -> usize {
    if zone.transfer().len_hint() == 0 {
        return 0;
    }
    let frames = zone.transfer().lock().take_all();
    pcp.transferred -= frames.len() as isize;
    free_listed(zone, &frames)
}

/// Checks the zone's transfer list: every frame on it tagged `PCP` at order 0. Returns its
/// frames.
pub fn check_transfer(zone: &Zone) -> Result<usize, String> {
    let t = zone.transfer().lock();
    for pfn in t.frames() {
        let s = zone.state(Pfn(pfn)).load(Ordering::Relaxed);
        if s != mem_map::state(PCP, Order(0)) {
            return Err(format!("zone {}: frame {pfn:#x} on the transfer list has state {s:#x}", zone.id.0));
        }
    }
    Ok(t.len())
}

/// [`rmqueue_pcplist`] for the THP list: refilled with `max(batch >> order, 2)` blocks
/// (Linux's count for every order above 0), at most [`PCP_THP_HIGH`].
#[inline]
fn rmqueue_thp(zone: &Zone, pcp: &mut PcpInner) -> Option<Pfn> {
    loop {
        if pcp.thp.is_empty() {
            let want = (pcp.batch >> PCP_THP_ORDER.0).clamp(2, PCP_THP_HIGH);
            let mut l = zone.lock();
            let n = l.buddy().rmqueue_many(PCP_THP_ORDER, want, &mut pcp.thp);
            drop(l);
            if n == 0 {
                return None;
            }
            // After the zone lock, as `rmqueue_bulk` tags.
            for &pfn in &pcp.thp {
                zone.state(Pfn(pfn)).store(mem_map::state(PCP, PCP_THP_ORDER), Ordering::Relaxed);
            }
        }
        let pfn = Pfn(pcp.thp.pop()?);
        pcp.thp_min = pcp.thp_min.min(pcp.thp.len());
        // A copy left by two racing frees (see `rmqueue_pcplist`) has lost its tag.
        if zone.state(pfn).load(Ordering::Relaxed) == mem_map::state(PCP, PCP_THP_ORDER) {
            return Some(pfn);
        }
    }
}

/// Replaces the last `runs` entries of `list`, heads of runs of `RUN_ORDER`, with every frame
/// of those runs, each run's frames in order. In place: run `i` is written from the back, over
/// slots at or after its own head, which it reads first, and after every head before it.
fn expand_runs(list: &mut Vec<usize>, runs: usize) {
    let run = RUN_ORDER.pages();
    let first = list.len() - runs;
    list.resize(first + runs * run, 0);
    for i in (0..runs).rev() {
        let head = list[first + i];
        let frames = &mut list[first + i * run..first + (i + 1) * run];
        for (frame, slot) in (head..).zip(frames) {
            *slot = frame;
        }
    }
}

/// Puts a claimed block (head state `NONE`) on the lists and drains to the buddy when the
/// lists reach `high` (`free_unref_page_commit`). Returns the frames drained. Inlined into
/// its two callers (the general free's, per order and for the THP list), as the compiler did
/// before the fill of the small orders' caches grew the general free.
#[inline(always)]
pub fn free_to_pcp(zone: &Zone, pcp: &mut PcpInner, pfn: Pfn, order: Order) -> usize {
    zone.state(pfn).store(mem_map::state(PCP, order), Ordering::Relaxed);
    if order == PCP_THP_ORDER {
        return free_thp(zone, pcp, pfn);
    }
    if order.0 == 0 && pcp.routes && foreign(zone, pcp, pfn) {
        // Toward its owner, a batch at a time (the guard delivers a full outbox on unlock).
        pcp.outbox.push(pfn.0);
        return 0;
    }
    pcp.lists[order.0 as usize].push(pfn.0);
    pcp.count += order.pages();
    pcp.free_count += order.pages();
    pcp.alloc_factor >>= 1;
    drain_past_high(zone, pcp)
}

/// The end of a free onto the lists: when they reach `high` (tuned first, `nr_pcp_high`),
/// drains `nr_pcp_free` frames, at least what brings them back within `high + batch`.
/// Returns the frames drained.
#[inline]
fn drain_past_high(zone: &Zone, pcp: &mut PcpInner) -> usize {
    let high = nr_pcp_high(zone, pcp);
    if pcp.count >= high {
        // At least what brings the lists back within high + batch (a large block, or a high
        // that just shrank, can overshoot by more than one drain).
        let n = nr_pcp_free(pcp).max(pcp.count.saturating_sub(high + pcp.batch));
        return free_pcppages(zone, pcp, n, true);
    }
    0
}

/// [`free_to_pcp`] for the THP list, its state already stored: at most [`PCP_THP_HIGH`] blocks
/// stay, and none while memory is short (below the high watermark, where `nr_pcp_high`
/// shrinks `high`). Returns the frames drained.
#[inline]
fn free_thp(zone: &Zone, pcp: &mut PcpInner, pfn: Pfn) -> usize {
    pcp.thp.push(pfn.0);
    let keep = if zone.nr_free() >= zone.watermark(Watermark::High) { PCP_THP_HIGH } else { 0 };
    if pcp.thp.len() > keep {
        return free_thp_bulk(zone, pcp, pcp.thp.len() - keep);
    }
    0
}

/// `nr_pcp_high`: the current `high`, tuned first. Shrinks toward `high_min` while the zone is
/// below its high watermark (memory is short: keep less on pcp lists); grows by a batch under
/// sustained frees (`free_count` past `batch + high_min / 2` since the last refill).
#[inline]
fn nr_pcp_high(zone: &Zone, pcp: &mut PcpInner) -> usize {
    if pcp.high_min != pcp.high_max {
        if zone.nr_free() < zone.watermark(Watermark::High) {
            pcp.high = pcp.high.saturating_sub(pcp.batch << pcp.free_factor).max(pcp.high_min);
        } else if pcp.free_count >= pcp.batch + pcp.high_min / 2 {
            pcp.high = (pcp.high + pcp.batch).min(pcp.high_max);
        }
    }
    pcp.high
}

/// `nr_pcp_free`: how many frames to drain, `batch << free_factor` clamped to
/// `[batch, high - batch]`, raising `free_factor` while the scaled batch is below the cap.
#[inline]
fn nr_pcp_free(pcp: &mut PcpInner) -> usize {
    let (high, batch) = (pcp.high, pcp.batch);
    if high < batch {
        return 1;
    }
    let max_nr_free = high - batch;
    let scaled = batch << pcp.free_factor;
    if scaled < max_nr_free && pcp.free_factor < PCP_BATCH_SCALE_MAX {
        pcp.free_factor += 1;
    }
    scaled.clamp(batch, max_nr_free.max(batch))
}

/// Returns at least `nr` frames (or all there are) from the lists to the buddy lists under
/// one acquisition of the zone lock, oldest blocks first, lowest order first
/// (`free_pcppages_bulk`). Returns the frames freed.
///
/// The blocks are claimed before the zone lock is taken, so that the lock is held for the
/// buddy's work alone (see `rmqueue_bulk` for why a per-frame store under it costs every
/// other CPU of the zone).
pub fn free_pcppages_bulk(zone: &Zone, pcp: &mut PcpInner, nr: usize) -> usize {
    free_pcppages(zone, pcp, nr, false)
}

/// [`free_pcppages_bulk`], whose order-0 frames first go to the zone's transfer list when
/// `transfer` (a drain past `high`, where another CPU's refill may want them soon; an
/// explicit drain or a decay returns memory to the buddy).
fn free_pcppages(zone: &Zone, pcp: &mut PcpInner, nr: usize, transfer: bool) -> usize {
    // Order 0 first offers its frames to the zone's transfer list: those it takes skip the
    // claim and the buddy.
    let moved = if transfer { give_transfer(zone, pcp, nr.min(pcp.lists[0].len())) } else { 0 };
    let mut freed = 0;
    // Per order, how many blocks leave the front of its list and how many of those, moved
    // to the front (after the frames moved to the transfer list), were claimed.
    let mut taken = [(0usize, 0usize); NR_PCP_LISTS];
    for (o, (list, t)) in pcp.lists.iter_mut().zip(&mut taken).enumerate() {
        if freed >= nr {
            break;
        }
        let pages = 1usize << o;
        let take = (nr - freed).div_ceil(pages).min(list.len());
        let skip = if o == 0 { moved } else { 0 };
        let mut kept = skip;
        for i in skip..take {
            // A claim exactly one copy wins: two racing frees under `free_check =
            // sequential` can leave copies of a frame on two CPUs' lists, and a pop on
            // another CPU takes no zone lock. A copy that loses (the first copy already
            // left with the tag) is dropped; `free_one` refuses a block already free.
            let pfn = list[i];
            if mem_map::claim_listed(zone, Pfn(pfn), Order(o as u8)) {
                list[kept] = pfn;
                kept += 1;
            }
        }
        *t = (take, kept);
        freed += take * pages;
    }
    if taken[0].1 > moved || taken[1..].iter().any(|&(_, kept)| kept > 0) {
        free_claimed_blocks(zone, pcp, &taken, moved);
    }
    for (list, &(take, _)) in pcp.lists.iter_mut().zip(&taken) {
        list.drain(..take);
    }
    pcp.count -= freed;
    pcp.count_min = pcp.count_min.min(pcp.count);
    freed
}

/// The buddy's part of [`free_pcppages_bulk`]: frees the claimed blocks, `list[skip..kept]`
/// of each order (`skip`: the order-0 frames moved to the transfer list), under one
/// acquisition of the zone lock.
fn free_claimed_blocks(zone: &Zone, pcp: &PcpInner, taken: &[(usize, usize); NR_PCP_LISTS], moved: usize) {
    let mut l = zone.lock();
    let mut b = l.buddy();
    for (o, (list, &(_, kept))) in pcp.lists.iter().zip(taken).enumerate() {
        let skip = if o == 0 { moved } else { 0 };
        for &pfn in &list[skip..kept] {
            b.free_one(Pfn(pfn), Order(o as u8));
        }
    }
}

/// Returns the `nr` oldest blocks of the THP list to the buddy lists under one acquisition of
/// the zone lock, claimed first as [`free_pcppages_bulk`] claims. Returns the frames freed.
#[cold]
fn free_thp_bulk(zone: &Zone, pcp: &mut PcpInner, nr: usize) -> usize {
    let nr = nr.min(pcp.thp.len());
    if nr == 0 {
        return 0;
    }
    // Claimed in place, the winners moved to the front, as `free_pcppages_bulk` does: no
    // buffer to allocate on a free path.
    let mut kept = 0;
    for i in 0..nr {
        let pfn = pcp.thp[i];
        if mem_map::claim_listed(zone, Pfn(pfn), PCP_THP_ORDER) {
            pcp.thp[kept] = pfn;
            kept += 1;
        }
    }
    let mut l = zone.lock();
    let mut b = l.buddy();
    for &pfn in &pcp.thp[..kept] {
        b.free_one(Pfn(pfn), PCP_THP_ORDER);
    }
    drop(l);
    pcp.thp.drain(..nr);
    pcp.thp_min = pcp.thp_min.min(pcp.thp.len());
    nr << PCP_THP_ORDER.0
}

/// Returns everything on the lists to the buddy (`drain_pages_zone`), the outbox's and the
/// inbox's frames too (so that a drain of every CPU leaves nothing on any of them).
pub fn drain(zone: &Zone, pcp: &mut PcpInner) -> usize {
    let thp = free_thp_bulk(zone, pcp, pcp.thp.len()) + drain_outbox(zone, pcp) + drain_inbox(zone, pcp);
    let n = pcp.count;
    if n == 0 {
        return thp;
    }
    thp + free_pcppages_bulk(zone, pcp, n)
}

/// `decay_pcp_high`: lowers an auto-tuned `high` of lists that have sat idle, to
/// `max(count - (batch << PCP_BATCH_SCALE_MAX), high - min(count_min, high / 5), high_min)`,
/// and drains what is above it; returns the THP list's blocks that sat idle through the whole
/// interval to the buddy. Returns the frames drained.
///
/// The outbox goes to its owners ([`deliver`]), and the inbox, which no refill took since
/// the last unlock, to the buddy.
pub fn decay_high(zone: &Zone, pcp: &mut PcpInner) -> usize {
    let mut drained = free_thp_bulk(zone, pcp, pcp.thp_min) + deliver(zone, pcp) + drain_inbox(zone, pcp);
    pcp.thp_min = pcp.thp.len();
    if pcp.high_min != pcp.high_max {
        pcp.high = decayed_high(pcp, pcp.count);
        if pcp.count > pcp.high {
            let n = pcp.count - pcp.high;
            drained += free_pcppages_bulk(zone, pcp, n);
        }
    }
    pcp.count_min = pcp.count;
    drained
}

/// The `high` a decay sets for lists holding `count` frames (auto-tuned `high` only).
fn decayed_high(pcp: &PcpInner, count: usize) -> usize {
    let by_count = count.saturating_sub(pcp.batch << PCP_BATCH_SCALE_MAX);
    let by_idle = pcp.high - pcp.count_min.min(pcp.high / 5);
    by_count.max(by_idle).max(pcp.high_min)
}

/// Whether [`decay_high`] on these lists, with `cache` blocks flushed into them first, would
/// change nothing: no new `high`, nothing to drain, `count_min` already the count. Computed
/// at every unlock so that the worker can skip idle lists without locking them.
pub fn decay_is_noop(pcp: &PcpInner, cache: usize) -> bool {
    let count = pcp.count + cache;
    pcp.thp.is_empty()
        && pcp.outbox.is_empty()
        && pcp.count_min == count
        && (pcp.high_min == pcp.high_max || (decayed_high(pcp, count) == pcp.high && count <= pcp.high))
}

/// Sets `batch`, `high_min` and `high_max` (a change of tunables or of the zone's size);
/// `high` is clamped into the new bounds and the lists drained down to it.
pub fn set_high_and_batch(zone: &Zone, pcp: &mut PcpInner, batch: usize, high_min: usize, high_max: usize) {
    pcp.batch = batch;
    pcp.high_min = high_min;
    pcp.high_max = high_max;
    pcp.high = pcp.high.clamp(high_min, high_max);
    if pcp.count >= pcp.high {
        let n = pcp.count - pcp.high;
        free_pcppages_bulk(zone, pcp, n.max(1));
    }
}

/// Checks the pcp invariants of one CPU's lists for `zone`; returns the frames on them, the
/// THP list's included.
pub fn check(zone: &Zone, pcp: &PcpInner) -> Result<usize, String> {
    for &pfn in &pcp.thp {
        let s = zone.state(Pfn(pfn)).load(Ordering::Relaxed);
        if s != mem_map::state(PCP, PCP_THP_ORDER) {
            return Err(format!("zone {}: pcp block {pfn:#x} on the THP list has state {s:#x}", zone.id.0));
        }
    }
    if pcp.thp.len() > PCP_THP_HIGH {
        return Err(format!("zone {}: {} blocks on the THP list, above {PCP_THP_HIGH}", zone.id.0, pcp.thp.len()));
    }
    if pcp.outbox.len() >= OUTBOX_CAP {
        return Err(format!(
            "zone {}: {} frames in the locked outbox, {OUTBOX_CAP} or more",
            zone.id.0,
            pcp.outbox.len()
        ));
    }
    for &pfn in &pcp.outbox {
        let s = zone.state(Pfn(pfn)).load(Ordering::Relaxed);
        if s != mem_map::state(PCP, Order(0)) {
            return Err(format!("zone {}: pcp frame {pfn:#x} in the outbox has state {s:#x}", zone.id.0));
        }
    }
    let mut pages = 0;
    for (o, list) in pcp.lists.iter().enumerate() {
        for &pfn in list {
            let s = zone.state(Pfn(pfn)).load(Ordering::Relaxed);
            if s != mem_map::state(PCP, Order(o as u8)) {
                return Err(format!("zone {}: pcp block {pfn:#x} on list {o} has state {s:#x}", zone.id.0));
            }
        }
        pages += list.len() << o;
    }
    if pages != pcp.count {
        return Err(format!("zone {}: pcp count {} but the lists hold {pages} frames", zone.id.0, pcp.count));
    }
    if pcp.count > pcp.high + pcp.batch {
        return Err(format!(
            "zone {}: pcp count {} above high {} + batch {}",
            zone.id.0, pcp.count, pcp.high, pcp.batch
        ));
    }
    Ok(pcp.held())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::pcp::{PcpGuard, PerCpuPages};
    use crate::types::{NodeId, ZoneId};
    use crate::vmstat::ZoneStatItem;

    #[test]
    fn batch_and_high_follow_linux() {
        // 1 GiB and above: 63.
        assert_eq!(zone_batchsize(1 << 18), 63);
        assert_eq!(zone_batchsize(1 << 22), 63);
        // 64 MiB: min(16, 256) / 4 = 4, 4 + 2 = 6 -> 4 - 1 = 3.
        assert_eq!(zone_batchsize(1 << 14), 3);
        // Tiny zones still get a batch of 1.
        assert_eq!(zone_batchsize(16), 1);
        assert_eq!(zone_highsize(1000, 1 << 20, 63, 4, 8, 0), 252);
        assert_eq!(zone_highsize(1000, 1 << 20, 63, 4, 8, 8), (1 << 17) / 4);
        assert_eq!(zone_highsize(1000, 1 << 20, 63, 0, 8, 0), 252);
        assert_eq!(zone_highsize(10, 1 << 20, 63, 1, 8, 0), 252);
    }

    fn zone() -> Zone {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 256, Order(3));
        z.setup_watermarks(128, 256, 10);
        z
    }

    #[test]
    fn refill_alloc_free_drain() {
        let z = zone();
        let pcp = PerCpuPages::new(0, 2, 8, 8);
        let mut g = pcp.try_lock(&z).unwrap();
        assert!(pcp.try_lock(&z).is_none(), "the lock excludes a second taker");
        let p = g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap();
        // Refilled max(batch, 2) = 2 blocks, took one.
        g.with(|i| assert_eq!((i.count, i.list_len(Order(0))), (1, 1)));
        assert_eq!(z.page_state_snapshot(ZoneStatItem::NrFreePages), 254);
        g.with(|i| check(&z, i)).unwrap();
        let mut blocks = vec![p];
        for _ in 0..10 {
            blocks.push(g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap());
        }
        for &b in &blocks {
            g.with(|i| free_to_pcp(&z, i, b, Order(0)));
            g.with(|i| {
                assert!(i.count < i.high, "count {} high {}", i.count, i.high);
                check(&z, i).unwrap();
            });
        }
        // The drains past high went to the transfer list; an explicit drain and the
        // transfer list's bring every frame back.
        let drained = g.with(|i| drain(&z, i) + drain_transfer(&z, i));
        assert!(drained > 0);
        g.with(|i| assert_eq!(i.count, 0));
        assert_eq!(z.page_state_snapshot(ZoneStatItem::NrFreePages), 256);
        drop(g);
        assert_eq!(z.check_invariants(0), Ok(0));
        assert!(pcp.try_lock(&z).is_some(), "dropping the guard unlocks");
    }

    /// Frames one CPU frees past its `high` go to the zone's transfer list, not the buddy,
    /// up to the low watermark's worth; another CPU's refill takes them back from there,
    /// newest first, without the buddy; they stay tagged and counted as per-CPU pages
    /// throughout; below the high watermark drains go to the buddy again.
    #[test]
    fn drains_past_high_cross_cpus_through_the_transfer_list() {
        let snapshot = |z: &Zone, item| z.page_state_snapshot(item);
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 4096, Order(10));
        // min 32, low 441, high 850.
        z.setup_watermarks(128, 4096, 1000);
        let low = z.watermark(Watermark::Low);
        let cpus: Vec<PerCpuPages> = (0..2).map(|c| PerCpuPages::new(c, 7, 64, 64)).collect();
        let pop = |g: &mut PcpGuard<'_>| g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap();
        let mut g0 = cpus[0].lock(&z);
        let taken: Vec<Pfn> = (0..600).map(|_| pop(&mut g0)).collect();
        let free = snapshot(&z, ZoneStatItem::NrFreePages);

        let mut g1 = cpus[1].lock(&z);
        let mut drained = 0;
        for &p in &taken {
            drained += g1.with(|i| free_to_pcp(&z, i, p, Order(0)));
        }
        assert!(drained > low, "{drained} frames drained, more than the transfer list takes");
        assert_eq!(z.transfer().len_hint(), low, "the transfer list fills up to the low watermark");
        assert_eq!(snapshot(&z, ZoneStatItem::NrFreePages), free + drained - low, "the rest went to the buddy");
        assert_eq!(check_transfer(&z), Ok(low), "still tagged per-cpu");
        let (c0, c1) = (g0.with(|i| i.count), g1.with(|i| i.count));
        assert_eq!(snapshot(&z, ZoneStatItem::NrPcpPages), c0 + c1 + low, "and counted as per-cpu pages");

        // CPU 0 empties its lists; its next refill takes the transfer list's newest frames and
        // hands them out in address order, lowest first.
        let mut again: Vec<Pfn> = (0..c0).map(|_| pop(&mut g0)).collect();
        let free = snapshot(&z, ZoneStatItem::NrFreePages);
        let listed = z.transfer().lock().frames().collect::<Vec<_>>();
        let first = pop(&mut g0);
        assert_eq!(snapshot(&z, ZoneStatItem::NrFreePages), free, "the buddy was not touched");
        let refilled = g0.with(|i| i.count) + 1;
        let mut newest = listed[listed.len() - refilled..].to_vec();
        newest.sort_unstable();
        assert!(newest.windows(2).any(|w| w[0] + 1 != w[1]), "a test of the order needs a gap: {newest:?}");
        let out: Vec<Pfn> = std::iter::once(first).chain((1..refilled).map(|_| pop(&mut g0))).collect();
        assert_eq!(out.iter().map(|p| p.0).collect::<Vec<_>>(), newest, "the newest {refilled} frames, upwards");
        again.extend(out);
        assert_eq!(z.transfer().len_hint(), low - refilled);
        let (c0, c1) = (g0.with(|i| i.count), g1.with(|i| i.count));
        assert_eq!(snapshot(&z, ZoneStatItem::NrPcpPages), c0 + c1 + low - refilled);

        // Everything back: the explicit drains go to the buddy, the transfer list's too.
        for p in again {
            g0.with(|i| free_to_pcp(&z, i, p, Order(0)));
        }
        g0.with(|i| drain(&z, i));
        g1.with(|i| drain(&z, i) + drain_transfer(&z, i));
        drop((g0, g1));
        assert_eq!(z.transfer().len_hint(), 0);
        assert_eq!(snapshot(&z, ZoneStatItem::NrPcpPages), 0);
        assert_eq!(z.check_invariants(0), Ok(0));

        // Below the high watermark (1536 of 2048 frames) drains go to the buddy.
        let short = Zone::new(ZoneId(1), NodeId(0), Pfn(0), 2048, Order(10));
        short.setup_watermarks(4096, 2048, 10);
        let mut g0 = cpus[0].lock(&short);
        let taken: Vec<Pfn> = (0..1800).map(|_| g0.with(|i| rmqueue_pcplist(&short, i, Order(0))).unwrap()).collect();
        let mut g1 = cpus[1].lock(&short);
        // A third of them back: the zone stays below its high watermark throughout.
        let drained: usize = taken[..600].iter().map(|&p| g1.with(|i| free_to_pcp(&short, i, p, Order(0)))).sum();
        assert!(drained > 0 && short.nr_free() < short.watermark(Watermark::High));
        assert_eq!(short.transfer().len_hint(), 0);
        for &p in &taken[600..] {
            g0.with(|i| free_to_pcp(&short, i, p, Order(0)));
        }
        g0.with(|i| drain(&short, i) + drain_transfer(&short, i));
        g1.with(|i| drain(&short, i));
        drop((g0, g1));
        assert_eq!(short.check_invariants(0), Ok(0));
    }

    /// Order-0 refills take whole aligned runs: two CPUs sharing a zone never hold frames
    /// whose state bytes share a line (or the line beside it), however their allocations
    /// interleave, so neither CPU's fast path writes a line the other writes; and a zone too
    /// small for a run still refills.
    #[test]
    fn refills_give_each_cpu_whole_runs() {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 4096, Order(10));
        z.setup_watermarks(128, 4096, 10);
        let cpus: Vec<PerCpuPages> = (0..2).map(|c| PerCpuPages::new(c, 7, 226, 226)).collect();
        let mut held = vec![Vec::new(); 2];
        for round in 0..700 {
            for (c, pcp) in cpus.iter().enumerate() {
                // CPU 1 allocates in bursts, so the two refill at different moments.
                if c == 1 && round % 3 == 0 {
                    continue;
                }
                let mut g = pcp.lock(&z);
                held[c].push(g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap().0);
                g.with(|i| check(&z, i)).unwrap();
            }
        }
        let pairs = |c: usize| -> std::collections::BTreeSet<usize> {
            let listed = cpus[c].lock(&z).with(|i| i.lists[0].clone());
            held[c].iter().chain(&listed).map(|&p| p / RUN_ORDER.pages()).collect()
        };
        let (a, b) = (pairs(0), pairs(1));
        assert!(a.len() > 3 && b.len() > 3, "several refills each: {a:?} {b:?}");
        assert!(a.is_disjoint(&b), "CPU 0 runs {a:?}, CPU 1 runs {b:?}");

        // 96 frames: no run of 128 fits, the smallest blocks serve.
        let small = Zone::new(ZoneId(1), NodeId(0), Pfn(0), 96, Order(10));
        small.setup_watermarks(8, 96, 10);
        let pcp = PerCpuPages::new(0, 7, 226, 226);
        assert!(pcp.lock(&small).with(|i| rmqueue_pcplist(&small, i, Order(0))).is_some());
    }

    /// The THP list (`NR_PCP_THP`): refilled with two blocks, never above its bound, counted
    /// apart from `count` (so small-order `high` never drains it), emptied while the zone is
    /// below its high watermark, and returned to the buddy by a decay once idle.
    #[test]
    fn thp_list_keeps_its_own_bound_and_returns_idle_blocks() {
        let thp = PCP_THP_ORDER;
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 4096, Order(10));
        z.setup_watermarks(128, 4096, 10);
        let free = || z.page_state_snapshot(ZoneStatItem::NrFreePages);
        let pcp = PerCpuPages::new(0, 63, 226, 226);
        let mut g = pcp.lock(&z);
        let first = g.with(|i| rmqueue_pcplist(&z, i, thp)).unwrap();
        assert!(first.is_aligned(thp));
        g.with(|i| assert_eq!((i.list_len(thp), i.count, i.pages()), (1, 0, 512), "max(63 >> 9, 2) = 2 taken"));
        assert_eq!(free(), 4096 - 1024);
        let mut blocks = vec![first];
        blocks.extend((0..3).map(|_| g.with(|i| rmqueue_pcplist(&z, i, thp)).unwrap()));
        g.with(|i| check(&z, i)).unwrap();
        let mut drained = 0;
        for &b in &blocks {
            drained += g.with(|i| free_to_pcp(&z, i, b, thp));
            g.with(|i| check(&z, i)).unwrap();
        }
        g.with(|i| assert_eq!(i.list_len(thp), PCP_THP_HIGH));
        assert_eq!(drained, 2 << thp.0, "four blocks came back to a list that keeps two");
        assert_eq!(free(), 4096 - 1024);
        // Small orders never drain it: their `high` counts their own frames.
        let p = g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap();
        g.with(|i| free_to_pcp(&z, i, p, Order(0)));
        g.with(|i| assert_eq!(i.list_len(thp), PCP_THP_HIGH));
        // Blocks touched since the last decay stay through it; idle through a whole one, they go.
        g.with(|i| decay_high(&z, i));
        g.with(|i| assert_eq!(i.list_len(thp), PCP_THP_HIGH));
        g.with(|i| assert!(!decay_is_noop(i, 0), "idle blocks are work for the next decay"));
        g.with(|i| decay_high(&z, i));
        g.with(|i| assert_eq!(i.list_len(thp), 0));
        g.with(|i| drain(&z, i));
        drop(g);
        assert_eq!(z.check_invariants(0), Ok(0));

        // Below the high watermark (1024 + 2 * 256 frames of 2048), no block stays.
        let short = Zone::new(ZoneId(1), NodeId(0), Pfn(0), 2048, Order(10));
        short.setup_watermarks(4096, 2048, 10);
        let pcp = PerCpuPages::new(0, 63, 226, 226);
        let mut g = pcp.lock(&short);
        let b = g.with(|i| rmqueue_pcplist(&short, i, thp)).unwrap();
        assert_eq!(g.with(|i| free_to_pcp(&short, i, b, thp)), 1024);
        g.with(|i| assert_eq!(i.pages(), 0));
        drop(g);
        assert_eq!(short.check_invariants(0), Ok(0));
    }

    #[test]
    fn expand_runs_writes_each_run_in_order_in_place() {
        let run = RUN_ORDER.pages();
        let mut list = vec![7, 3 * run, 0, 9 * run];
        expand_runs(&mut list, 3);
        let want: Vec<usize> = [7].into_iter().chain(3 * run..4 * run).chain(0..run).chain(9 * run..10 * run).collect();
        assert_eq!(list, want);
    }

    #[test]
    fn high_grows_under_sustained_frees_and_decays_when_idle() {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 4096, Order(3));
        z.setup_watermarks(128, 4096, 10);
        let pcp = PerCpuPages::new(0, 4, 16, 256);
        let mut g = pcp.lock(&z);
        let blocks: Vec<Pfn> = (0..200).map(|_| g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap()).collect();
        let grown_by_refills = g.with(|i| i.high);
        assert!(grown_by_refills > 16, "refills from a zone above high grow high");
        for b in blocks {
            g.with(|i| free_to_pcp(&z, i, b, Order(0)));
        }
        let high = g.with(|i| i.high);
        assert!(high <= 256);
        // Idle: each decay lowers high toward high_min and drains above it.
        for _ in 0..40 {
            g.with(|i| decay_high(&z, i));
        }
        g.with(|i| {
            assert_eq!(i.high, 16);
            assert!(i.count <= 16);
            check(&z, i).unwrap();
        });
    }

    #[test]
    fn refills_double_under_sustained_allocation_and_shrink_on_free() {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 4096, Order(3));
        z.setup_watermarks(128, 4096, 10);
        let pcp = PerCpuPages::new(0, 4, 512, 512);
        let mut g = pcp.lock(&z);
        let mut sizes = Vec::new();
        let mut taken = Vec::new();
        for _ in 0..4 {
            // Empty the order-0 list, then one more allocation refills it.
            while g.with(|i| i.list_len(Order(0))) > 0 {
                taken.push(g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap());
            }
            let before = z.page_state_snapshot(ZoneStatItem::NrFreePages);
            taken.push(g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap());
            sizes.push(before - z.page_state_snapshot(ZoneStatItem::NrFreePages));
        }
        assert_eq!(sizes, vec![4, 8, 16, 32], "batch << alloc_factor, doubling");
        g.with(|i| free_to_pcp(&z, i, taken.pop().unwrap(), Order(0)));
        assert_eq!(g.with(|i| i.alloc_factor), 2, "a free halves alloc_factor");
        for p in taken {
            g.with(|i| free_to_pcp(&z, i, p, Order(0)));
        }
        g.with(|i| drain(&z, i));
        drop(g);
        assert_eq!(z.check_invariants(0), Ok(0));
    }

    /// The worker's hint: after decays have settled, `decay_is_noop` holds and one more
    /// decay changes nothing; right after activity it does not hold.
    #[test]
    fn decay_hint_says_when_a_decay_changes_nothing() {
        let z = Zone::new(ZoneId(0), NodeId(0), Pfn(0), 4096, Order(3));
        z.setup_watermarks(128, 4096, 10);
        let pcp = PerCpuPages::new(0, 4, 16, 256);
        let mut g = pcp.lock(&z);
        let blocks: Vec<Pfn> = (0..200).map(|_| g.with(|i| rmqueue_pcplist(&z, i, Order(0))).unwrap()).collect();
        for b in blocks {
            g.with(|i| free_to_pcp(&z, i, b, Order(0)));
        }
        drop(g);
        assert!(pcp.needs_decay(), "activity leaves work for the decay");
        let mut rounds = 0;
        while pcp.needs_decay() {
            pcp.lock(&z).with(|i| decay_high(&z, i));
            rounds += 1;
            assert!(rounds < 100, "the decay never settles");
        }
        let state = |g: &mut PcpGuard<'_>| g.with(|i| (i.high, i.count, i.count_min));
        let mut g = pcp.lock(&z);
        let before = state(&mut g);
        assert!(before.1 > 0, "frames stay on the lists");
        assert_eq!(g.with(|i| decay_high(&z, i)), 0);
        assert_eq!(state(&mut g), before, "a decay the hint skips changes nothing");
        g.with(|i| check(&z, i)).unwrap();
    }

    #[test]
    fn fixed_high_does_not_tune() {
        let z = zone();
        let pcp = PerCpuPages::new(0, 2, 8, 8);
        let mut g = pcp.lock(&z);
        let b: Vec<Pfn> = (0..30).map(|_| g.with(|i| rmqueue_pcplist(&z, i, Order(1))).unwrap()).collect();
        for p in b {
            g.with(|i| free_to_pcp(&z, i, p, Order(1)));
        }
        g.with(|i| decay_high(&z, i));
        g.with(|i| assert_eq!(i.high, 8));
    }

    proptest::proptest! {
        /// `highest_first` orders any frames highest first, by a pass, a radix sort or a
        /// comparison sort, and grows its room only as far as a whole inbox needs: inboxes
        /// of ascending runs (what deliveries make), frames in no order, and frames too far
        /// apart for the radix.
        #[test]
        fn highest_first_orders_any_frames_within_its_room(
            runs in proptest::collection::vec(proptest::collection::vec(0usize..1 << 20, 0..80), 0..40),
            shuffled in proptest::collection::vec(0usize..1 << 20, 0..300),
            far in proptest::collection::vec(0usize..1 << 40, 0..100),
        ) {
            let ascending: Vec<usize> = runs.iter().flatten().copied().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
            let in_runs = runs.into_iter().flat_map(|mut r| { r.sort(); r }).collect::<Vec<usize>>();
            for mut v in [in_runs, shuffled, far, ascending] {
                let mut scratch: Vec<u64> = Vec::new();
                let mut want = v.clone();
                want.sort_unstable_by(|a, b| b.cmp(a));
                highest_first(&mut v, &mut scratch);
                proptest::prop_assert_eq!(&v, &want);
                proptest::prop_assert!(scratch.capacity() <= 2 * INBOX_CAP);
            }
        }
    }

    /// An inbox takes as many frames as its lists' `high`, within its two bounds.
    #[test]
    fn the_inbox_bound_follows_high() {
        use crate::pcp::{INBOX_CAP, INBOX_MIN};
        assert_eq!(PerCpuPages::new(0, 2, 8, 8).inbox_cap(), INBOX_MIN);
        assert_eq!(PerCpuPages::new(0, 63, 600, 600).inbox_cap(), 600);
        assert_eq!(PerCpuPages::new(0, 63, 5000, 5000).inbox_cap(), INBOX_CAP);
    }

    #[test]
    fn the_radix_sort_leaves_what_it_cannot_do_unchanged() {
        let mut scratch: Vec<u64> = Vec::with_capacity(2 * INBOX_CAP);
        let mut near = vec![5usize, (1 << 24) + 4, 9, 1 << 24];
        assert!(radix_highest_first(&mut near, &mut scratch), "three digits apart");
        assert_eq!(near, [(1 << 24) + 4, 1 << 24, 9, 5]);
        let mut far = vec![5usize, 1 << 24 | 1 << 25, 9];
        assert!(!radix_highest_first(&mut far, &mut scratch), "four digits apart");
        assert_eq!(far, [5, 1 << 24 | 1 << 25, 9]);
        let mut long = [1usize, 0].repeat(INBOX_CAP / 2 + 1);
        assert!(!radix_highest_first(&mut long, &mut scratch), "more than the room");
        assert_eq!(scratch.capacity(), 2 * INBOX_CAP);
    }
}
