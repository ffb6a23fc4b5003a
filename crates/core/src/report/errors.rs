//! Reports of double and invalid frees, in the shape ASan users know: one line saying what
//! happened, then this free's stack, then the block's free and allocation stacks where known.
//! Written straight to stderr with `write(2)`. By default the program goes on (the bad free is
//! kept from glibc, which would abort); `MEM_TRACE_ON_ERROR=abort` aborts right after the
//! report, so a core is written at the faulty free.

use super::frames::{Printing, StackWriter};
use crate::glibc_heap::NotHeap;
use crate::out::Out;
use crate::state::ThreadState;
use crate::store::freed::{Freed, HISTORY};
use crate::store::{self, stacks};
use crate::{capture, config};
use core::fmt::Write;
use core::sync::atomic::Ordering;
use mem_trace_format::Block;

/// The operation that met a pointer it cannot take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// `free`.
    Free,
    /// `realloc`.
    Realloc,
}

/// Why a pointer cannot be freed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Why {
    /// Inside a live block, not at its start.
    Inside(Block),
    /// On the calling thread's stack.
    Stack,
    /// In a loaded module's code.
    Code,
    /// Not 16-byte aligned, as every block from glibc's `malloc` is.
    Misaligned,
    /// Nowhere glibc's heap has a block: unmapped, outside heap memory, or no chunk there.
    NotHeap(NotHeap),
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Free => "free",
        Op::Realloc => "realloc",
    }
}

/// The right to symbolize, held for a whole report: concurrent reports (threads racing to
/// free one block) then come one after the other, each with its stacks symbolized, instead of
/// all but one with raw addresses and a line blaming `print_trace`.
/// One symbolizer serves the report's stacks, so each module's debug information is read
/// once per report rather than once per stack.
type Right = Result<Printing, u32>;

fn writer(r: &Right) -> StackWriter<'_> {
    match r {
        Ok(p) => p.writer(),
        Err(_) => StackWriter::raw(
            "the symbolizer stayed busy for over a second (other threads' reports, or a print_trace stopped in gdb)",
        ),
    }
}

fn this_call(out: &mut Out, state: &ThreadState, op: Op, w: &mut StackWriter) {
    let mut buf = [0u64; config::MAX_FRAMES];
    let n = capture::capture(&state.capture, &mut buf);
    let _ = writeln!(
        out,
        "mem-trace: this {} (thread {}):",
        op_name(op),
        state.thread.index.get()
    );
    let _ = w.write(out, &buf[..n]);
}

fn recorded_stack(out: &mut Out, id: u32, w: &mut StackWriter) {
    let mut buf = [0; stacks::MAX_STACK_FRAMES];
    let _ = w.write(out, stacks::frames(id, &mut buf).unwrap_or(&[]));
}

fn finish(mut out: Out, w: StackWriter) {
    let _ = w.write_names_hint(&mut out);
    drop(w);
    HISTORY.errors.fetch_add(1, Ordering::Relaxed);
    drop(out);
    if config::ABORT_ON_ERROR.load(Ordering::Relaxed) {
        let mut out = Out::stderr();
        let _ = writeln!(out, "mem-trace: aborting (MEM_TRACE_ON_ERROR=abort)");
        drop(out);
        // SAFETY: abort has no preconditions; it is what the user asked for.
        unsafe { libc::abort() };
    }
}

/// A block freed twice (or handed to `realloc` after being freed).
pub(crate) fn double_free(state: &ThreadState, addr: u64, previous: Option<Freed>, op: Op) {
    let r = Printing::within_a_second();
    let mut w = writer(&r);
    let mut out = Out::stderr();
    let what = match op {
        Op::Free => "double free",
        Op::Realloc => "realloc of a freed block",
    };
    match previous {
        Some(f) => {
            let b = f.block;
            let _ = writeln!(
                out,
                "mem-trace: {what} of {addr:#x}: a {}-byte block [{:#x}, {:#x}) already freed{} by thread {} (#{})",
                b.size,
                b.addr,
                b.addr + b.size,
                if f.by_realloc { " (by realloc)" } else { "" },
                f.free_thread,
                f.free_seq
            );
            this_call(&mut out, state, op, &mut w);
            let _ = writeln!(
                out,
                "mem-trace: freed by thread {} (#{}) here:",
                f.free_thread, f.free_seq
            );
            if f.free_stack == 0 {
                let _ = writeln!(out, "   (no free stack recorded: MEM_TRACE_FREE_STACKS=0?)");
            } else {
                recorded_stack(&mut out, f.free_stack, &mut w);
            }
            let _ = writeln!(
                out,
                "mem-trace: previously allocated by thread {} (#{}) here:",
                b.thread, b.seq
            );
            recorded_stack(&mut out, b.stack, &mut w);
        }
        None => {
            let why = if HISTORY.capacity.load(Ordering::Relaxed) == 0 {
                "MEM_TRACE_FREED=0 keeps no history"
            } else {
                "its history record was overwritten"
            };
            let _ = writeln!(
                out,
                "mem-trace: {what} of {addr:#x}: the block is already freed (held in quarantine; {why})"
            );
            this_call(&mut out, state, op, &mut w);
        }
    }
    finish(out, w);
}

/// A block another thread freed at the same moment, whose free left no record to name (no
/// history, `MEM_TRACE_FREED=0`, and the quarantine no longer holds it).
pub(crate) fn double_free_racing(state: &ThreadState, addr: u64, op: Op) {
    let r = Printing::within_a_second();
    let mut w = writer(&r);
    let mut out = Out::stderr();
    let what = match op {
        Op::Free => "double free",
        Op::Realloc => "realloc of a freed block",
    };
    let _ = writeln!(
        out,
        "mem-trace: {what} of {addr:#x}: another thread freed the block at the same moment (no record of that free is kept)"
    );
    this_call(&mut out, state, op, &mut w);
    finish(out, w);
}

/// A pointer that no allocation returned.
pub(crate) fn invalid_free(state: &ThreadState, addr: u64, why: Why, op: Op) {
    let r = Printing::within_a_second();
    let mut w = writer(&r);
    let mut out = Out::stderr();
    let name = op_name(op);
    let _ = write!(out, "mem-trace: invalid {name} of {addr:#x}: ");
    let _ = match why {
        Why::Inside(b) => writeln!(
            out,
            "it is {} bytes inside a {}-byte block [{:#x}, {:#x}) allocated by {}, not its start",
            addr - b.addr,
            b.size,
            b.addr,
            b.addr + b.size,
            By::allocation(&b)
        ),
        Why::Stack => writeln!(out, "it points into this thread's stack"),
        Why::Code => writeln!(out, "it points into loaded code"),
        Why::Misaligned => writeln!(out, "no block from malloc starts there (misaligned)"),
        Why::NotHeap(NotHeap::Unmapped) => {
            writeln!(out, "no memory is mapped there (a wild pointer)")
        }
        Why::NotHeap(NotHeap::Mapping(m)) => writeln!(
            out,
            "it points {} bytes into {m}, where malloc keeps no blocks",
            addr - m.start
        ),
        Why::NotHeap(NotHeap::NoChunk(m)) => writeln!(
            out,
            "no block from malloc starts there (no heap chunk header before it; {} bytes into {m})",
            addr - m.start
        ),
    };
    this_call(&mut out, state, op, &mut w);
    let (block, relation) = match why {
        Why::Inside(b) => (Some(b), "the block was"),
        _ => match store::nearest_below(addr) {
            Some(b) => {
                let _ = writeln!(
                    out,
                    "mem-trace: {} bytes past the end of the nearest block below, {} bytes [{:#x}, {:#x}) allocated by {}",
                    addr - (b.addr + b.size),
                    b.size,
                    b.addr,
                    b.addr + b.size,
                    By::allocation(&b)
                );
                (Some(b), "that block was")
            }
            None => (None, ""),
        },
    };
    if let Some(b) = block {
        let _ = writeln!(
            out,
            "mem-trace: {relation} allocated by {} here:",
            By::allocation(&b)
        );
        recorded_stack(&mut out, b.stack, &mut w);
    }
    finish(out, w);
}

/// "thread T (#SEQ)": who allocated (or freed) a block and at which event, or only the thread
/// where no sequence number is kept (a tagged block, profile mode).
pub struct By {
    /// The thread's index.
    pub thread: u32,
    /// The event's sequence number; 0: none kept.
    pub seq: u64,
}

impl By {
    /// Who allocated `b`.
    pub fn allocation(b: &Block) -> Self {
        By {
            thread: b.thread,
            seq: b.seq,
        }
    }
}

impl core::fmt::Display for By {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.seq {
            0 => write!(f, "thread {}", self.thread),
            seq => write!(f, "thread {} (#{seq})", self.thread),
        }
    }
}
