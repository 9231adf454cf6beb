//! The x86-64 bodies of the restartable sequences over the per-CPU caches: each public
//! function of [`super`] is one critical section written in assembly, built by the macros
//! below from a common head (arm `rseq_cs`), an entry (read the CPU id, find that CPU's
//! `PerCpuPages`, give way if it is locked; the fast free's own, which chooses the lists
//! by the frame), a body ending in the commit store, and a common exit (the `__rseq_cs`
//! descriptor and the signed abort handler).
//!
//! Kernel counterpart: the x86 rseq ABI (`RSEQ_SIG` 0x53053053, `struct rseq_cs` in the
//! `__rseq_cs` section) as glibc and librseq's x86 headers use it.
//!
//! Locking: none; the kernel restarts a section preempted, migrated or signalled before its
//! commit, and a section aborts if the lists' lock is held. Invariant: one commit store per
//! section, the last instruction of its restartable range; every cache slot a push writes
//! before it lies at or above the old length and below the cache's bound (`cache_limit <=
//! CACHE_CAP` for order 0, a small cache's `limit <= SMALL_CACHE_CAP` inside its order's
//! slots, the THP cache's `limit <= THP_CACHE_CAP` inside its own), dead until the commit.
//! Every push reads the bound before the word.

use super::{FrameTable, LocalTable, Table};
use crate::pcp::{word, PerCpuPages, SmallCache, CACHE_CAP, NR_PCP_LISTS, SMALL_CACHE_CAP};
use crate::types::Order;
use std::mem::MaybeUninit;

/// The sections can run on this architecture (given rseq and membarrier at run time).
pub(super) const SUPPORTED: bool = true;

/// The head of every critical section: arm `rseq_cs` with this section's descriptor (label
/// 24) and start the restartable range (label 22), after which each section reads the CPU
/// id from `fs:[{rseq} + 4]`.
macro_rules! rseq_arm {
    () => {
        concat!("lea {t}, [rip + 24f]\n", "mov qword ptr fs:[{rseq} + 8], {t}\n", "22:\n",)
    };
}

/// The start of the sections over a table of lists: `rseq_arm!`, read the CPU id, find that
/// CPU's `PerCpuPages` for the zone in `{p}`, and give up (label 25) if the id is out of
/// range or the lists are locked.
macro_rules! rseq_enter {
    () => {
        concat!(
            rseq_arm!(),
            "mov {p:e}, dword ptr fs:[{rseq} + 4]\n",
            "cmp {p}, {ncpu}\n",
            "jae 25f\n",
            "imul {p}, {nz}\n",
            "add {p}, {zone}\n",
            "imul {p}, {p}, {size}\n",
            "add {p}, {base}\n",
            "cmp byte ptr [{p} + {off_lock}], 0\n",
            "jne 25f\n",
        )
    };
}

/// The start of the sections that pop from a CPU's local lists: as `rseq_enter!`, but the
/// `PerCpuPages` comes from `{local}`, a table of one address per CPU (the lists of the
/// CPU's local zone, or a stand-in whose lock is always held), the CPU id stays in
/// `{cpu}`, and the lock is tested with the zone's watermark level (the lists' gate, the
/// byte before the lock) in one load: `{t}` = `gate | lock << 8`, which must lie in
/// `[{level}, 0xff]` (the lock clear, the zone at or above `{level}`), tested as
/// `{t} - {level} <= 0xff - {level}` unsigned. The stand-in's bytes, all 1, read 0x101.
macro_rules! rseq_enter_local {
    () => {
        concat!(
            rseq_arm!(),
            "mov {cpu:e}, dword ptr fs:[{rseq} + 4]\n",
            "cmp {cpu}, {ncpu}\n",
            "jae 25f\n",
            "mov {p}, qword ptr [{local} + {cpu} * 8]\n",
            "movzx {t:e}, word ptr [{p} + {off_gate}]\n",
            "sub {t:e}, {level}\n",
            "cmp {t:e}, 0xff - {level}\n",
            "ja 25f\n",
        )
    };
}

const _: () = assert!(std::mem::offset_of!(PerCpuPages, gate) + 1 == std::mem::offset_of!(PerCpuPages, lock));
const _: () = assert!(std::mem::offset_of!(PerCpuPages, gate) % 2 == 0);

/// The descriptor and the head of the abort handler every section ends with: the
/// descriptor (`struct rseq_cs`: version, flags, start, length, abort) goes to `__rseq_cs`;
/// the abort handler, in `__rseq_failure` and preceded by glibc's x86-64 signature
/// 0x53053053 as the kernel requires, starts at label 25 (its body and `.popsection` are
/// the caller's).
macro_rules! rseq_abort_head {
    () => {
        concat!(
            ".pushsection __rseq_cs, \"aw\"\n",
            ".balign 32\n",
            "24:\n",
            ".long 0, 0\n",
            ".quad 22b, 23b - 22b, 25f\n",
            ".popsection\n",
            ".pushsection __rseq_failure, \"ax\"\n",
            ".byte 0x0f, 0xb9, 0x3d\n",
            ".long 0x53053053\n",
            "25:\n",
        )
    };
}

/// The end of every critical section: label 23 ends the restartable range (right after
/// the commit store), then the descriptor and the abort handler (`rseq_abort_head!`), which
/// sets `{ok}` to 0; a committed section sets it to 1.
macro_rules! rseq_leave {
    () => {
        concat!(
            "23:\n",
            "mov {ok}, 1\n",
            "jmp 26f\n",
            rseq_abort_head!(),
            "xor {ok:e}, {ok:e}\n",
            "jmp 26f\n",
            ".popsection\n",
            "26:\n",
        )
    };
}

/// As `rseq_leave!`, for the sections that return the CPU: a committed section leaves it in
/// `{cpu}`, the abort handler sets `{cpu}` to `usize::MAX`, and no flag is needed.
macro_rules! rseq_leave_cpu {
    () => {
        concat!("23:\n", rseq_abort_head!(), "mov {cpu}, -1\n", "jmp 23b\n", ".popsection\n",)
    };
}

/// The body of a pop, once `{p}` holds the lists: give way on an empty cache or one whose
/// count of pops is at its guard bit (see [`crate::pcp::word`]), else load the top slot
/// into `{out}` (the slots' address in the scratch register `$s`) and commit the cache word
/// that `$commit` makes of `{t}`: one shorter, for `pop`; one shorter and a pop counted,
/// for `pop_local`.
macro_rules! rseq_pop_body {
    ($commit:literal) => {
        concat!(
            "mov {t}, qword ptr [{p} + {off_len}]\n",
            "movzx {out:e}, {t:x}\n",
            "test {out:e}, {out:e}\n",
            "jz 25f\n",
            "bt {t}, {pops_guard}\n",
            "jc 25f\n",
            $commit,
            "\n",
            "mov {out}, qword ptr [{p} + {out} * 8 + {off_slots} - 8]\n",
            "mov qword ptr [{p} + {off_len}], {t}\n",
        )
    };
}

/// Copies `{n}` (> 0) words from the array at register `$from` to the one at `$to`, with
/// `{zone}` as the index and `{base}` as scratch (both dead once `{p}` is found): the loop
/// of `pop_many` (cache to buffer) and `push_many` (buffer to cache).
macro_rules! rseq_copy {
    ($from:literal, $to:literal) => {
        concat!(
            "xor {zone:e}, {zone:e}\n",
            "27:\n",
            "mov {base}, qword ptr [",
            $from,
            " + {zone} * 8]\n",
            "mov qword ptr [",
            $to,
            " + {zone} * 8], {base}\n",
            "add {zone}, 1\n",
            "cmp {zone}, {n}\n",
            "jb 27b\n",
        )
    };
}

/// The start of the sections that push a frame (`{pfn}`) onto the lists of its zone for
/// this CPU, from a [`FrameTable`] (`{ft}`): `rseq_arm!`, read the CPU id into `{cpu}`,
/// take the CPU's local lists when the frame lies in their zone's span, else those of the
/// frame's zone from `block_zone` and `remote`, chosen with a branch (not a conditional
/// move) so that, predicted, the lists' address does not wait for the frame's zone, which
/// the local case never loads; then give up (label 25) if the id, the block or the zone is
/// out of range or the lists are locked. The lists end in `{p}`; `{t}` and `rcx` are
/// scratch.
macro_rules! rseq_enter_frame {
    () => {
        concat!(
            rseq_arm!(),
            "mov {cpu:e}, dword ptr fs:[{rseq} + 4]\n",
            "cmp {cpu}, {local_cpus}\n",
            "jae 25f\n",
            "mov {p}, qword ptr [{ft} + {off_local}]\n",
            "mov {p}, qword ptr [{p} + {cpu} * 8]\n",
            // The local lists when `pfn - span_start < span_pages`.
            "mov {t}, {pfn}\n",
            "sub {t}, qword ptr [{p} + {off_span_start}]\n",
            "cmp {t}, qword ptr [{p} + {off_span_pages}]\n",
            "jb 28f\n",
            // Another zone's frame: its block's zone, that zone's lists of this CPU.
            "mov {t}, {pfn}\n",
            "mov ecx, dword ptr [{ft} + {off_block_shift}]\n",
            "shr {t}, cl\n",
            "cmp {t}, qword ptr [{ft} + {off_nr_blocks}]\n",
            "jae 25f\n",
            "mov {p}, qword ptr [{ft} + {off_block_zone}]\n",
            "movzx {t:e}, word ptr [{p} + {t} * 2]\n",
            "cmp {t}, qword ptr [{ft} + {off_nr_zones}]\n",
            "jae 25f\n",
            "imul {t}, qword ptr [{ft} + {off_nr_cpus}]\n",
            "add {t}, {cpu}\n",
            "mov {p}, qword ptr [{ft} + {off_remote}]\n",
            "mov {p}, qword ptr [{p} + {t} * 8]\n",
            "28:\n",
            "cmp byte ptr [{p} + {off_lock}], 0\n",
            "jne 25f\n",
        )
    };
}

/// The start of the order-0 free's section (`push_frame`): `rseq_arm!`, read the CPU id
/// into `{cpu}`, take its local lists, and compare the owner of the frame's run (`{owner}`,
/// read before the section: a hint) with the CPU. Only a CPU's local lists own runs (the
/// lists of the zone on its node, `PcpInner::routes`), so a run this CPU owns lies in the
/// span of these lists, whatever value of the hint was read (`Zone::set_run_owner`): the
/// path a pair takes (the one branch it takes, to label 31) reads neither the span nor the
/// frame's zone, and tests the lock there before the cache's body (two loads fewer than the
/// span's test: 6.1 → 5.8 ns a pair, as before owners). Otherwise, a frame in the local lists' span (another
/// CPU's run, or nobody's) goes to the outbox's body here, which pushes onto the outbox and
/// then moves `{p}` by [`OUTBOX_DELTA`] and joins the cache's commit (label 41), so that the
/// commit, `[{p} + {off_len}]`, stores the outbox's word and stays the last instruction of
/// the range; a frame of another zone goes to that zone's lists' cache (label 29), as
/// before owners. The lock is tested before any field past the lock and the span is read,
/// so that a stand-in (whose other bytes are not a `PerCpuPages`) gives way first. `{rseq}`
/// is dead once the CPU id is read, and the bodies take it for the slot's index.
macro_rules! rseq_enter_frame_owned {
    () => {
        concat!(
            rseq_arm!(),
            "mov {cpu:e}, dword ptr fs:[{rseq} + 4]\n",
            "cmp {cpu}, {local_cpus}\n",
            "jae 25f\n",
            "mov {p}, qword ptr [{ft} + {off_local}]\n",
            "mov {p}, qword ptr [{p} + {cpu} * 8]\n",
            // 16 bits: the CPU id is below `LOCAL_CPUS` here, and `NO_OWNER` is not one.
            "cmp {owner:x}, {cpu:x}\n",
            "je 31f\n",
            // The local lists when `pfn - span_start < span_pages`.
            "mov {t}, {pfn}\n",
            "sub {t}, qword ptr [{p} + {off_span_start}]\n",
            "cmp {t}, qword ptr [{p} + {off_span_pages}]\n",
            "jae 29f\n",
            "cmp byte ptr [{p} + {off_lock}], 0\n",
            "jne 25f\n",
            // Another CPU's run: the outbox, as the cache's body below does the cache.
            "mov rcx, qword ptr [{p} + {off_out_limit}]\n",
            "mov {t}, qword ptr [{p} + {off_out_word}]\n",
            "movzx {rseq}, {t:x}\n",
            "cmp {rseq}, rcx\n",
            "jae 25f\n",
            "test {t}, {t}\n",
            "js 25f\n",
            "mov qword ptr [{p} + {rseq} * 8 + {off_out_slots}], {pfn}\n",
            "mov rcx, {push_frame}\n",
            "add {t}, rcx\n",
            "add {p}, {outbox_delta}\n",
            "jmp 41f\n",
            // Another zone's frame: its block's zone, that zone's lists of this CPU.
            "29:\n",
            "mov {t}, {pfn}\n",
            "mov ecx, dword ptr [{ft} + {off_block_shift}]\n",
            "shr {t}, cl\n",
            "cmp {t}, qword ptr [{ft} + {off_nr_blocks}]\n",
            "jae 25f\n",
            "mov {p}, qword ptr [{ft} + {off_block_zone}]\n",
            "movzx {t:e}, word ptr [{p} + {t} * 2]\n",
            "cmp {t}, qword ptr [{ft} + {off_nr_zones}]\n",
            "jae 25f\n",
            "imul {t}, qword ptr [{ft} + {off_nr_cpus}]\n",
            "add {t}, {cpu}\n",
            "mov {p}, qword ptr [{ft} + {off_remote}]\n",
            "mov {p}, qword ptr [{p} + {t} * 8]\n",
            "31:\n",
            "cmp byte ptr [{p} + {off_lock}], 0\n",
            "jne 25f\n",
        )
    };
}

/// How far the outbox's word lies from the order-0 cache's: the outbox's body in
/// `push_frame` moves the lists' address by this before the cache's commit, which then
/// stores the outbox's word.
pub(super) const OUTBOX_DELTA: usize =
    std::mem::offset_of!(PerCpuPages, outbox_word) - std::mem::offset_of!(PerCpuPages, cache_word);

const _: () = assert!(crate::pcp::OUTBOX_CAP as u64 <= word::LEN);

/// One critical section: `rseq_enter!`, the body, `rseq_leave!`, with the operands every
/// section shares (the table, `{p}`, `{t}`, the lock's offset) and the body's own
/// (which include `{ok}`, the offsets of the word and the slots it works on, `{off_len}`
/// and `{off_slots}`, and `{off_limit}` for pushes). The table's
/// registers (`{ncpu}`, `{nz}`, `{zone}`, `{base}`) are dead once `{p}` is found, so they
/// are declared clobbered and bodies may use them as scratch.
macro_rules! rseq_section {
    ($table:expr, $zone:expr, [$($body:expr),* $(,)?], $($operands:tt)*) => {
        std::arch::asm!(
            rseq_enter!(),
            $($body,)*
            rseq_leave!(),
            rseq = in(reg) $table.rseq,
            ncpu = inout(reg) $table.nr_cpus => _,
            nz = inout(reg) $table.nr_zones => _,
            zone = inout(reg) $zone => _,
            base = inout(reg) $table.base => _,
            size = const std::mem::size_of::<PerCpuPages>(),
            off_lock = const std::mem::offset_of!(PerCpuPages, lock),
            p = out(reg) _,
            t = out(reg) _,
            $($operands)*
            options(nostack),
        )
    };
}

/// One section that pops from a cache of the current CPU's local-zone lists:
/// `rseq_enter_local!` (with the zone's watermark test at `$level`), the body (the pop,
/// ending in the commit), `rseq_leave_cpu!`, with the operands such sections share (the
/// local table, `{cpu}`, `{out}`, `{p}`, `{t}`, the lists' offsets, the pops' guard and
/// commit) and the body's own.
macro_rules! rseq_local_section {
    ($table:expr, $level:expr, $cpu:ident, $out:ident, [$($body:expr),* $(,)?], $($operands:tt)*) => {
        std::arch::asm!(
            rseq_enter_local!(),
            $($body,)*
            rseq_leave_cpu!(),
            rseq = in(reg) $table.rseq,
            ncpu = const super::LOCAL_CPUS,
            local = inout(reg) $table.local => _,
            pops_guard = const word::POPS_GUARD,
            pop_local = const word::POP_LOCAL,
            level = const $level,
            off_gate = const std::mem::offset_of!(PerCpuPages, gate),
            off_slots = const std::mem::offset_of!(PerCpuPages, cache),
            cpu = out(reg) $cpu,
            p = out(reg) _,
            t = out(reg) _,
            out = out(reg) $out,
            $($operands)*
            options(nostack),
        )
    };
}

/// One section that pushes a frame onto its zone's lists for this CPU: `rseq_enter_frame!`,
/// the body (ending in the commit), `rseq_leave_cpu!`, with the operands every such section
/// shares (the frame table, `{pfn}`, `{cpu}`, `{p}`, `{t}`, `rcx`, the tables' and the lists'
/// offsets, `{push_frame}`) and the body's own. `{ft}` is dead once the lists are found, so
/// bodies may use it as scratch.
macro_rules! rseq_frame_section {
    ($rseq:expr, $table:expr, $pfn:expr, $cpu:ident, [$($body:expr),* $(,)?], $($operands:tt)*) => {
        std::arch::asm!(
            rseq_enter_frame!(),
            $($body,)*
            rseq_leave_cpu!(),
            push_frame = const word::PUSH_FRAME,
            rseq = in(reg) $rseq,
            ft = inout(reg) $table => _,
            pfn = in(reg) $pfn,
            local_cpus = const super::LOCAL_CPUS,
            off_local = const std::mem::offset_of!(FrameTable, local),
            off_nr_cpus = const std::mem::offset_of!(FrameTable, nr_cpus),
            off_remote = const std::mem::offset_of!(FrameTable, remote),
            off_nr_zones = const std::mem::offset_of!(FrameTable, nr_zones),
            off_block_zone = const std::mem::offset_of!(FrameTable, block_zone),
            off_nr_blocks = const std::mem::offset_of!(FrameTable, nr_blocks),
            off_block_shift = const std::mem::offset_of!(FrameTable, block_shift),
            off_span_start = const std::mem::offset_of!(PerCpuPages, span_start),
            off_span_pages = const std::mem::offset_of!(PerCpuPages, span_pages),
            off_lock = const std::mem::offset_of!(PerCpuPages, lock),
            off_slots = const std::mem::offset_of!(PerCpuPages, cache),
            cpu = out(reg) $cpu,
            p = out(reg) _,
            t = out(reg) _,
            out("rcx") _,
            $($operands)*
            options(nostack),
        )
    };
}

/// The x86-64 body of [`super::pop`].
///
/// # Safety
/// As [`super::pop`].
#[inline]
pub(super) unsafe fn pop(t: &Table, zone: usize) -> Option<usize> {
    let ok: usize;
    let out: usize;
    // SAFETY: `t.rseq` places this thread's registered rseq area (at `fs:` plus it);
    // `t.base` points to `nr_cpus * nr_zones` live `PerCpuPages` (the handle outlives the
    // call), and the section only indexes it with a CPU id checked against `nr_cpus`. It
    // reads the cache only while the lock is free and the kernel guarantees that it runs
    // uninterrupted on that CPU up to the commit, so no other thread touches that cache
    // meanwhile (lockers on other CPUs fence it first).
    unsafe {
        rseq_section!(
            t,
            zone,
            [rseq_pop_body!("sub {t}, 1")],
            off_len = const std::mem::offset_of!(PerCpuPages, cache_word),
            off_slots = const std::mem::offset_of!(PerCpuPages, cache),
            out = out(reg) out,
            pops_guard = const word::POPS_GUARD,
            ok = out(reg) ok,
        );
    }
    (ok != 0).then_some(out)
}

/// The x86-64 body of [`super::pop_local`].
///
/// # Safety
/// As [`super::pop_local`].
#[inline]
pub(super) unsafe fn pop_local(t: &LocalTable) -> Option<(usize, usize)> {
    let out: usize;
    let cpu: usize;
    // SAFETY: `t.rseq` places this thread's registered rseq area (at `fs:` plus it);
    // `t.local` holds `LOCAL_CPUS` addresses, each of live `PerCpuPages` or of a stand-in
    // (128 bytes, gate and lock set), and the section only indexes it with a CPU id checked
    // against `LOCAL_CPUS`, and reads past the gate and lock only when the lock is clear
    // (so not in a stand-in). Otherwise as in `pop`.
    unsafe {
        rseq_local_section!(
            t,
            crate::zone::ABOVE_LOW_ORDER0,
            cpu,
            out,
            [rseq_pop_body!("add {t}, {pop_local}")],
            off_len = const std::mem::offset_of!(PerCpuPages, cache_word),
        );
    }
    (cpu != usize::MAX).then_some((out, cpu))
}

/// The x86-64 body of [`super::push_frame`]: the lists are the CPU's local ones when the
/// frame lies in their zone's span, else those of the frame's zone from `block_zone` and
/// `remote`, chosen with a branch (not a conditional move) so that, predicted, the lists'
/// address does not wait for the frame's zone, which the local case never loads; on the
/// local lists, a frame of another CPU's run (`owner`) goes to the outbox.
///
/// # Safety
/// As [`super::push_frame`].
#[inline]
pub(super) unsafe fn push_frame(rseq: isize, t: &FrameTable, pfn: usize, owner: u16) -> usize {
    let cpu: usize;
    // SAFETY: `rseq` places this thread's registered rseq area (at `fs:` plus it);
    // `t.local` holds `LOCAL_CPUS` addresses (of live `PerCpuPages` or of a stand-in, whose
    // span lies past every frame, or holds every frame and whose lock is set, for the CPU
    // ids from `nr_cpus` on), indexed only with a CPU id checked against `LOCAL_CPUS`;
    // `t.block_zone` is indexed only below `nr_blocks`, and `t.remote` (`zone * nr_cpus +
    // cpu`) only with a zone checked against `nr_zones`. The lists pushed onto are the
    // frame's zone's: the local ones when the frame lies in their zone's span (no other
    // zone's overlaps it), else its block's zone's. A stand-in's lock is tested before the
    // outbox's fields are read, so they are a `PerCpuPages`'s. The slot written before the
    // commit lies below the bound read (`cache_limit <= CACHE_CAP`, or the outbox's
    // `outbox_limit <= OUTBOX_CAP`), inside the cache's or the outbox's slots, and is dead
    // until the commit, which stores the word of the same one (the outbox's body moves `{p}`
    // by `OUTBOX_DELTA`, the distance between the two words).
    unsafe {
        std::arch::asm!(
            rseq_enter_frame_owned!(),
            // Give way on a full cache or a count of pushes at its guard bit, else write
            // `{pfn}` to the slot at the length and commit the word one longer, a push
            // counted. The bound before the word (see `push_small_frame`).
            "mov rcx, qword ptr [{p} + {off_limit}]",
            "mov {t}, qword ptr [{p} + {off_len}]",
            "movzx {rseq}, {t:x}",
            "cmp {rseq}, rcx",
            "jae 25f",
            "test {t}, {t}",
            "js 25f",
            "mov qword ptr [{p} + {rseq} * 8 + {off_slots}], {pfn}",
            // What the commit adds (`word::PUSH_FRAME`) does not fit an add's immediate: a
            // move's, into `rcx`, now dead; a load from memory would take one of the pair's
            // memory operations, which bound it.
            "mov rcx, {push_frame}",
            "add {t}, rcx",
            // The commit, the outbox's too (its body moved `{p}` by `OUTBOX_DELTA`).
            "41:",
            "mov qword ptr [{p} + {off_len}], {t}",
            rseq_leave_cpu!(),
            push_frame = const word::PUSH_FRAME,
            // Dead once the CPU id is read: the slot's index reuses it, so that the section
            // needs no callee-saved register (a push and a pop on every free when the
            // owner's operand took the last caller-saved one: 6.1 → 6.4 ns a pair).
            rseq = inout(reg) rseq => _,
            ft = in(reg) t,
            pfn = in(reg) pfn,
            owner = in(reg) owner,
            local_cpus = const super::LOCAL_CPUS,
            outbox_delta = const OUTBOX_DELTA,
            off_local = const std::mem::offset_of!(FrameTable, local),
            off_nr_cpus = const std::mem::offset_of!(FrameTable, nr_cpus),
            off_remote = const std::mem::offset_of!(FrameTable, remote),
            off_nr_zones = const std::mem::offset_of!(FrameTable, nr_zones),
            off_block_zone = const std::mem::offset_of!(FrameTable, block_zone),
            off_nr_blocks = const std::mem::offset_of!(FrameTable, nr_blocks),
            off_block_shift = const std::mem::offset_of!(FrameTable, block_shift),
            off_span_start = const std::mem::offset_of!(PerCpuPages, span_start),
            off_span_pages = const std::mem::offset_of!(PerCpuPages, span_pages),
            off_lock = const std::mem::offset_of!(PerCpuPages, lock),
            off_slots = const std::mem::offset_of!(PerCpuPages, cache),
            off_len = const std::mem::offset_of!(PerCpuPages, cache_word),
            off_limit = const std::mem::offset_of!(PerCpuPages, cache_limit),
            off_out_word = const std::mem::offset_of!(PerCpuPages, outbox_word),
            off_out_limit = const std::mem::offset_of!(PerCpuPages, outbox_limit),
            off_out_slots = const std::mem::offset_of!(PerCpuPages, outbox),
            cpu = out(reg) cpu,
            p = out(reg) _,
            t = out(reg) _,
            out("rcx") _,
            options(nostack),
        );
    }
    cpu
}

/// The x86-64 body of [`super::pop_many`].
///
/// # Safety
/// As [`super::pop_many`].
#[inline]
pub(super) unsafe fn pop_many<'a>(t: &Table, zone: usize, out: &'a mut [MaybeUninit<usize>]) -> &'a [usize] {
    if out.is_empty() {
        return &[];
    }
    let ok: usize;
    let n: usize;
    // SAFETY: as in `pop`. The section copies `n <= len` slots below the cache's
    // length into `out` (at most `out.len()` of them) and commits the shorter length
    // with one store; an interrupted section commits nothing, and the caller ignores
    // what it wrote into `out`.
    unsafe {
        rseq_section!(
            t,
            zone,
            [
                "mov {t}, qword ptr [{p} + {off_len}]",
                // n = min(len, max), with the length from the word's low bits
                "movzx {nz}, {t:x}",
                "mov {n}, {max}",
                "cmp {nz}, {n}",
                "cmovb {n}, {nz}",
                "test {n}, {n}",
                "jz 25f",
                // the word n shorter (no borrow: n <= len), its counts kept
                "sub {t}, {n}",
                // nz = &slots[new len]; copy slots[new len + i] to out[i], i in zone.
                "sub {nz}, {n}",
                "shl {nz}, 3",
                "lea {nz}, [{nz} + {p} + {off_slots}]",
                rseq_copy!("{nz}", "{out}"),
                "mov qword ptr [{p} + {off_len}], {t}",
            ],
            off_len = const std::mem::offset_of!(PerCpuPages, cache_word),
            off_slots = const std::mem::offset_of!(PerCpuPages, cache),
            out = in(reg) out.as_mut_ptr(),
            max = in(reg) out.len(),
            n = out(reg) n,
            ok = out(reg) ok,
        );
    }
    let n = if ok != 0 { n } else { 0 };
    // SAFETY: a committed section wrote `out[0..n]` (`n <= out.len()`) before its
    // commit; an interrupted one counts as 0.
    unsafe { std::slice::from_raw_parts(out.as_ptr().cast::<usize>(), n) }
}

/// The x86-64 body of [`super::push_many`] (`OUTBOX`: onto the outbox, its word, bound and
/// slots in place of the cache's).
///
/// # Safety
/// As [`super::push_many`].
#[inline]
pub(super) unsafe fn push_many<const OUTBOX: bool>(t: &Table, zone: usize, pfns: &[usize]) -> usize {
    if pfns.is_empty() {
        return 0;
    }
    let ok: usize;
    let n: usize;
    // SAFETY: as in `pop`; the section writes `n <= limit - len` slots at and above
    // the cache's (or the outbox's) length, inside its slots (`limit <= CACHE_CAP`, the
    // outbox's `<= OUTBOX_CAP`) and dead until the commit, then commits the new length with
    // one store.
    unsafe {
        rseq_section!(
            t,
            zone,
            [
                // n = min(limit - len, count), with the length from the word's low bits;
                // the bound read before the word (see `push_small_frame`)
                "mov {n}, qword ptr [{p} + {off_limit}]",
                "mov {t}, qword ptr [{p} + {off_len}]",
                "movzx {nz}, {t:x}",
                "sub {n}, {nz}",
                "jbe 25f",
                "cmp {n}, {count}",
                "cmova {n}, {count}",
                // nz = &slots[len]; copy src[i] to it, i in zone.
                "shl {nz}, 3",
                "lea {nz}, [{nz} + {p} + {off_slots}]",
                rseq_copy!("{src}", "{nz}"),
                "add {t}, {n}",
                "mov qword ptr [{p} + {off_len}], {t}",
            ],
            src = in(reg) pfns.as_ptr(),
            count = in(reg) pfns.len(),
            off_len = const if OUTBOX {
                std::mem::offset_of!(PerCpuPages, outbox_word)
            } else {
                std::mem::offset_of!(PerCpuPages, cache_word)
            },
            off_slots = const if OUTBOX {
                std::mem::offset_of!(PerCpuPages, outbox)
            } else {
                std::mem::offset_of!(PerCpuPages, cache)
            },
            off_limit = const if OUTBOX {
                std::mem::offset_of!(PerCpuPages, outbox_limit)
            } else {
                std::mem::offset_of!(PerCpuPages, cache_limit)
            },
            n = out(reg) n,
            ok = out(reg) ok,
        );
    }
    if ok != 0 {
        n
    } else {
        0
    }
}

/// Where the cache of `order` (1 to 3, or the pageblock order's, the fourth, which follows
/// theirs) lies from its `PerCpuPages`: the offset of its word (its bound follows, 8 bytes
/// on), and the index of its first slot among the slots at `cache`. Registers, not
/// constants: the order is the caller's.
#[inline(always)]
fn small_offsets(order: Order) -> (usize, usize) {
    let i = (order.0 as usize - 1).min(NR_PCP_LISTS - 1);
    (std::mem::offset_of!(PerCpuPages, small) + i * std::mem::size_of::<SmallCache>(), CACHE_CAP + i * SMALL_CACHE_CAP)
}

const _: () = assert!(std::mem::offset_of!(SmallCache, limit) == std::mem::offset_of!(SmallCache, word) + 8);

/// The x86-64 body of [`super::pop_small_local`]: the gate asked for `LEVEL`.
///
/// # Safety
/// As [`super::pop_small_local`].
#[inline]
pub(super) unsafe fn pop_small_local<const LEVEL: u8>(t: &LocalTable, order: Order) -> Option<(usize, usize)> {
    let (coff, first) = small_offsets(order);
    let out: usize;
    let cpu: usize;
    // SAFETY: as in `pop_local`: `t.local` holds `LOCAL_CPUS` addresses of live
    // `PerCpuPages` or of a stand-in, indexed only with a CPU id checked against
    // `LOCAL_CPUS`, and read past the gate and lock only when the lock is clear (so not in
    // a stand-in). The cache's length (in the word at `coff`, with `order` 1 to 3 inside
    // `small`, or the THP cache's just after) never exceeds its slots (`SMALL_CACHE_CAP`,
    // `THP_CACHE_CAP`), so the slot read lies inside the order's (from index `first` at
    // `cache`). The kernel runs the section uninterrupted on that CPU up to the commit or
    // restarts it at the abort handler.
    unsafe {
        rseq_local_section!(
            t,
            LEVEL,
            cpu,
            out,
            [
                // Give way on an empty cache or a count of pops at its guard bit, else load
                // the top slot and commit the word one shorter, a pop counted.
                "mov {t}, qword ptr [{p} + {coff}]",
                "movzx {out:e}, {t:x}",
                "test {out:e}, {out:e}",
                "jz 25f",
                "bt {t}, {pops_guard}",
                "jc 25f",
                "add {t}, {pop_local}",
                "add {out}, {first}",
                "mov {out}, qword ptr [{p} + {out} * 8 + {off_slots} - 8]",
                "mov qword ptr [{p} + {coff}], {t}",
            ],
            coff = in(reg) coff,
            first = in(reg) first,
        );
    }
    (cpu != usize::MAX).then_some((out, cpu))
}

/// The x86-64 body of [`super::push_small_frame`]: the lists as `push_frame` finds them
/// (`rseq_enter_frame!`), then a push onto the cache of `order`.
///
/// # Safety
/// As [`super::push_small_frame`].
#[inline]
pub(super) unsafe fn push_small_frame(rseq: isize, t: &FrameTable, pfn: usize, order: Order) -> usize {
    let (coff, first) = small_offsets(order);
    let cpu: usize;
    // SAFETY: as in `push_frame` for the lists found; the slot written lies at the order's
    // cache length, below its bound (`limit <= SMALL_CACHE_CAP`, the THP cache's `<=
    // THP_CACHE_CAP`), inside the order's slots (from index `first`), and is dead until the
    // commit.
    unsafe {
        rseq_frame_section!(
            rseq,
            t,
            pfn,
            cpu,
            [
                // Give way on a full cache or a count of pushes at its guard bit (the word's
                // sign), else write `{pfn}` to the slot at the length and commit the word one
                // longer, a push counted. The bound is read before the word: a holder that
                // found every cache closed (empty, bound 0) skips the fence and may open one,
                // storing the word before the bound; a section that read the old word and
                // then the new bound would commit over the holder's fill. In this order (x86
                // keeps loads in order, as it keeps the holder's stores), a section that sees
                // the new bound sees the new word.
                "mov {ft}, qword ptr [{p} + {coff} + 8]",
                "mov {t}, qword ptr [{p} + {coff}]",
                "movzx ecx, {t:x}",
                "cmp rcx, {ft}",
                "jae 25f",
                "test {t}, {t}",
                "js 25f",
                "add {first}, rcx",
                "mov qword ptr [{p} + {first} * 8 + {off_slots}], {pfn}",
                // What the commit adds (`word::PUSH_FRAME`) does not fit an add's
                // immediate: a move's, into `rcx`, now dead; a load from memory would
                // take one of the pair's memory operations, which bound it.
                "mov rcx, {push_frame}",
                "add {t}, rcx",
                "mov qword ptr [{p} + {coff}], {t}",
            ],
            coff = in(reg) coff,
            first = inout(reg) first => _,
        );
    }
    cpu
}
