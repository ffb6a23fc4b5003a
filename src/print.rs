//! `print_trace`: the in-process answer to "where did this block come from", called by gdb.
//!
//! gdb may have stopped every other thread anywhere — inside glibc's allocator, inside one of
//! our hooks holding a shard lock, inside `dlopen` — and with `set scheduler-locking on` none of
//! them will move. So this code never blocks and never allocates from the hooked `malloc` nor
//! glibc's heap (docs/FINDINGS.md, "Calling into a stopped process"):
//! - output goes through a fixed buffer straight to `write(2)`, not stdio (whose lock a stopped
//!   thread may hold);
//! - the table is read with bounded try-locks, falling back to a lockless read;
//! - the module list is the unwinder's immutable snapshot, not `dl_iterate_phdr`;
//! - symbolization allocates from the arena's scratch region, which takes no lock, and maps
//!   files itself (`report::frames`);
//! - a concurrent call from another thread says it is busy and returns instead of waiting;
//!   one on the same thread (gdb stopped the first at a breakpoint, or abandoned it) goes on.

use core::fmt::{self, Write};
use mem_trace_core::format::Freed;
use mem_trace_core::guard;
use mem_trace_core::out::Out;
use mem_trace_core::report::frames::{Busy, Printing};
use mem_trace_core::report::By;
use mem_trace_core::store::table::Access;
use mem_trace_core::store::{stacks, threads};

/// Prints what mem-trace knows about the block containing `addr` to standard error.
pub fn print_trace(addr: usize) {
    let mut out = Out::stderr();
    let printing = match Printing::begin() {
        Ok(printing) => printing,
        Err(holder) => {
            let _ = writeln!(
                out,
                "mem-trace: {}; try again once it returns",
                Busy(holder)
            );
            return;
        }
    };
    // Anything this thread allocates while printing must not be recorded (and cannot be: a
    // hook stopped mid-way on this thread may hold a lock). Restore the previous state after,
    // since gdb may have called us on a thread that is itself inside a hook.
    let was_inside = guard::set_busy(true);
    let _ = answer(addr as u64, was_inside, &printing, &mut out);
    guard::set_busy(was_inside);
}

/// The gap within which a live block near an address is named (`N bytes after it`, `before
/// it`), as the readers' `mtrace-why` names one (`DEFAULT_MAX_GAP` in crates/read).
const NEAR: u64 = 4096;

fn answer(a: u64, was_inside: bool, printing: &Printing, out: &mut Out) -> fmt::Result {
    let (found, access) = mem_trace_core::store::block_containing(a);
    let Some(b) = found else {
        // As `mtrace-why` answers: a remembered freed block holding the address, else a
        // sampling note, else the live block it follows.
        if let Some(f) = mem_trace_core::store::freed::newest_containing(a) {
            return freed(a, &f, printing, out);
        }
        let mean = mem_trace_core::store::header::header()
            .sample_mean
            .load(core::sync::atomic::Ordering::Relaxed);
        if mean != 0 {
            return writeln!(
                out,
                "mem-trace: {a:#x} is in no sampled block: not sampled, this process samples {} \
                 (MEM_TRACE_SAMPLE)",
                mem_trace_core::format_rate(mean)
            );
        }
        let h = mem_trace_core::store::header::header();
        let relaxed = core::sync::atomic::Ordering::Relaxed;
        let no_frees_kept = h.flags.load(relaxed) & mem_trace_core::format::FLAG_PROFILE_MODE != 0;
        // The nearest live block ending below or starting above within the gap; between two
        // as near, the one below ("after" it: overflows are more common than underflows).
        let below = mem_trace_core::store::nearest_below(a)
            .filter(|b| b.addr + b.size <= a && a - (b.addr + b.size) <= NEAR)
            .map(|b| (a - (b.addr + b.size), "after", b));
        let above = lowest_above(a).map(|b| (b.addr - a, "before", b));
        let near = match (below, above) {
            (Some(b), Some(c)) => Some(if c.0 < b.0 { c } else { b }),
            (b, c) => b.or(c),
        };
        if let Some((distance, relation, b)) = near {
            writeln!(
                out,
                "mem-trace: {a:#x} is {distance} bytes {relation} a {}-byte block [{:#x}, {:#x}) allocated by {}",
                b.size,
                b.addr,
                b.addr + b.size,
                By::allocation(&b)
            )?;
            // As the readers say it (crates/read answer::why).
            writeln!(
                out,
                "mem-trace: (not inside any live block{})",
                match no_frees_kept {
                    true =>
                        ", and this process kept no record of frees (profile mode): the \
                             address may be a dangling pointer; run with --mode debug to have \
                             frees answered",
                    false =>
                        " nor any remembered freed block: an overflow, or a pointer to an \
                              untracked or long-freed block",
                }
            )?;
            return stack(printing, out, b.stack, "");
        }
        writeln!(
            out,
            "mem-trace: {a:#x} is not inside any block tracked by mem-trace"
        )?;
        if no_frees_kept {
            // As the readers say it (crates/read answer::why::NO_FREES_KEPT).
            writeln!(
                out,
                "mem-trace: (this process kept no record of frees (profile mode): the address \
                 may be a dangling pointer; run with --mode debug to have frees answered)"
            )?;
        }
        if h.flags.load(relaxed) & mem_trace_core::format::FLAG_ATTACHED != 0 {
            // As the readers say it (crates/read answer::why::attached_line).
            writeln!(
                out,
                "mem-trace: (mem-trace was attached to this process at event #{}: blocks \
                 allocated before that are unknown to it; it may be one of them)",
                h.attached_at.load(relaxed)
            )?;
        }
        return Ok(());
    };
    // SAFETY: getpid has no preconditions.
    writeln!(out, "PID: {}", unsafe { libc::getpid() })?;
    if a != b.addr {
        writeln!(
            out,
            "Block: {:#x} ({a:#x} is {} bytes inside it)",
            b.addr,
            a - b.addr
        )?;
    }
    writeln!(out, "Len: {}", b.size)?;
    match threads::tid_of(b.thread) {
        0 => writeln!(out, "Thread: {}", b.thread)?,
        tid => writeln!(out, "Thread: {} (tid {tid})", b.thread)?,
    }
    // A tagged block (profile mode) has no sequence number: nothing rather than a wrong one.
    if b.seq != 0 {
        writeln!(out, "Seq: {}", b.seq)?;
    }
    if access == Access::Lockless {
        let who = if was_inside {
            "this thread was stopped inside mem-trace"
        } else {
            "another thread holds it"
        };
        writeln!(
            out,
            "mem-trace: note: table busy ({who}); read without its lock"
        )?;
    }
    stack(printing, out, b.stack, "")
}

/// The live block starting lowest in `(a, a + NEAR]`: walked down from the highest one there,
/// a block at a time (at most a few hundred in a page's worth of small blocks).
fn lowest_above(a: u64) -> Option<mem_trace_core::format::Block> {
    let mut lowest = None;
    let mut under = a.saturating_add(NEAR);
    while let Some(b) = mem_trace_core::store::nearest_below(under).filter(|b| b.addr > a) {
        lowest = Some(b);
        under = b.addr - 1;
    }
    lowest
}

/// The answer for an address inside a block the program freed, as `mtrace-why` gives it: the
/// free and its stack, then the allocation and its.
fn freed(a: u64, f: &Freed, printing: &Printing, out: &mut Out) -> fmt::Result {
    let b = &f.block;
    writeln!(
        out,
        "mem-trace: {a:#x} is {} bytes inside a {}-byte block [{:#x}, {:#x}) freed{} by {}",
        a - b.addr,
        b.size,
        b.addr,
        b.addr + b.size,
        if f.by_realloc { " (by realloc)" } else { "" },
        By {
            thread: f.free_thread,
            seq: f.free_seq,
        }
    )?;
    stack(printing, out, f.free_stack, "free ")?;
    writeln!(
        out,
        "mem-trace: previously allocated by {}:",
        By::allocation(b)
    )?;
    stack(printing, out, b.stack, "")
}

/// Writes the stack `id`; a line saying none was recorded (of `kind`: "free ") for 0.
fn stack(printing: &Printing, out: &mut Out, id: u32, kind: &str) -> fmt::Result {
    let mut buf = [0; stacks::MAX_STACK_FRAMES];
    match stacks::frames(id, &mut buf).filter(|_| id != 0) {
        Some(frames) => printing.write_stack(out, frames),
        None => writeln!(out, "mem-trace: no {kind}stack was recorded for this block"),
    }
}
