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
use mem_trace_core::guard;
use mem_trace_core::out::Out;
use mem_trace_core::report::frames::{Busy, Printing};
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

fn answer(a: u64, was_inside: bool, printing: &Printing, out: &mut Out) -> fmt::Result {
    let (found, access) = mem_trace_core::store::block_containing(a);
    let Some(b) = found else {
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
        writeln!(
            out,
            "mem-trace: {a:#x} is not inside any block tracked by mem-trace"
        )?;
        let h = mem_trace_core::store::header::header();
        let relaxed = core::sync::atomic::Ordering::Relaxed;
        if h.flags.load(relaxed) & mem_trace_core::format::FLAG_PROFILE_MODE != 0 {
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
    let mut buf = [0; stacks::MAX_STACK_FRAMES];
    let Some(frames) = stacks::frames(b.stack, &mut buf) else {
        return writeln!(out, "mem-trace: no stack was recorded for this block");
    };
    printing.write_stack(out, frames)
}
