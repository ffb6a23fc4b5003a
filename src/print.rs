//! `print_trace`: the in-process answer to "where did this block come from", called by gdb.
//!
//! gdb may have stopped every other thread anywhere — inside glibc's allocator, inside one of
//! our hooks holding a shard lock, inside `dlopen` — and with `set scheduler-locking on` none of
//! them will move. So this code never blocks and never allocates from the hooked `malloc` nor
//! glibc's heap (DESIGN.md, fact 3):
//! - output goes through a fixed buffer straight to `write(2)`, not stdio (whose lock a stopped
//!   thread may hold);
//! - the table is read with bounded try-locks, falling back to a lockless read;
//! - the module list is the unwinder's immutable snapshot, not `dl_iterate_phdr`;
//! - symbolization allocates from the scratch region (see `arena`), which takes no lock, and
//!   maps files itself;
//! - a second concurrent call says it is busy and returns instead of waiting.

use crate::arena::ScratchScope;
use crate::modules::{self, ModuleSet};
use crate::symbolize::{ModuleRef, SymFrame, Symbolizer};
use crate::table::{self, Access};
use crate::{guard, stacks, threads};
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, Ordering};

/// A small output buffer written to a file descriptor with `write(2)`, flushed when full and on
/// drop. Formatting into it never allocates.
pub struct Out {
    fd: i32,
    len: usize,
    buf: [u8; 2048],
}

impl Out {
    /// A buffer for standard error.
    pub fn stderr() -> Self {
        Out {
            fd: 2,
            len: 0,
            buf: [0; 2048],
        }
    }

    fn flush(&mut self) {
        let mut done = 0;
        while done < self.len {
            // SAFETY: writes initialised bytes of our own buffer.
            let n =
                unsafe { libc::write(self.fd, self.buf[done..].as_ptr().cast(), self.len - done) };
            if n <= 0 {
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                break;
            }
            done += n as usize;
        }
        self.len = 0;
    }
}

impl Write for Out {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for chunk in s.as_bytes().chunks(self.buf.len()) {
            if self.len + chunk.len() > self.buf.len() {
                self.flush();
            }
            self.buf[self.len..self.len + chunk.len()].copy_from_slice(chunk);
            self.len += chunk.len();
        }
        Ok(())
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        self.flush();
    }
}

static PRINTING: AtomicBool = AtomicBool::new(false);

/// Prints what mem-trace knows about the block containing `addr` to standard error.
pub fn print_trace(addr: usize) {
    let mut out = Out::stderr();
    if PRINTING.swap(true, Ordering::Acquire) {
        let _ = writeln!(
            out,
            "mem-trace: busy: print_trace is already running in another thread; try again"
        );
        return;
    }
    // Anything this thread allocates while printing must not be recorded (and cannot be: a
    // hook stopped mid-way on this thread may hold a lock). Restore the previous state after,
    // since gdb may have called us on a thread that is itself inside a hook.
    let was_inside = guard::set_busy(true);
    let _ = answer(addr as u64, was_inside, &mut out);
    guard::set_busy(was_inside);
    PRINTING.store(false, Ordering::Release);
}

fn answer(a: u64, was_inside: bool, out: &mut Out) -> fmt::Result {
    let (found, access) = table::find_containing(a);
    let Some(b) = found else {
        return writeln!(
            out,
            "mem-trace: {a:#x} is not inside any block tracked by mem-trace"
        );
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
    writeln!(out, "Seq: {}", b.seq)?;
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
    let Some(frames) = stacks::frames(b.stack) else {
        return writeln!(out, "mem-trace: no stack was recorded for this block");
    };
    stack_lines(out, frames)
}

/// Numbered frames with names and `file:line`; raw `module+offset` when symbolizing is not
/// possible right now. The caller holds [`PRINTING`] (the scratch region is single-user).
fn stack_lines(out: &mut Out, frames: &[u64]) -> fmt::Result {
    let Some(set) = modules::snapshot() else {
        return print_raw(out, frames, None, "no module list yet");
    };
    let Some(scratch) = ScratchScope::enter() else {
        return print_raw(out, frames, Some(set), "cannot reserve memory to symbolize");
    };
    let r = print_symbolized(out, frames, set);
    drop(scratch);
    r
}

/// Writes a stack for an error report from a running thread (see `report`). Falls back to raw
/// addresses if a `print_trace` is running at the same moment.
pub fn write_stack(out: &mut Out, frames: &[u64]) -> fmt::Result {
    if frames.is_empty() {
        return writeln!(out, "   (no stack recorded)");
    }
    if PRINTING.swap(true, Ordering::Acquire) {
        return print_raw(out, frames, modules::snapshot(), "print_trace is running");
    }
    let r = stack_lines(out, frames);
    PRINTING.store(false, Ordering::Release);
    r
}

fn print_symbolized(out: &mut Out, frames: &[u64], set: &ModuleSet) -> fmt::Result {
    let mut sym = Symbolizer::new();
    let mut found: Vec<SymFrame> = Vec::new();
    let mut n = 0;
    for &ra in frames {
        // Return addresses point after the call; the call itself is one byte earlier.
        let probe = ra.saturating_sub(1);
        found.clear();
        let module = set.find(probe);
        let ok = module.is_some_and(|m| {
            let mref = ModuleRef {
                path: &m.path,
                bias: m.bias,
                start: m.start,
                end: m.end,
            };
            sym.symbolize(&mref, probe, &mut found).is_ok() && !found.is_empty()
        });
        if !ok {
            raw_frame(out, n, ra, set)?;
            n += 1;
            continue;
        }
        for f in &found {
            match &f.function {
                Some(name) => write!(out, "{n:4}: {name}")?,
                None => write!(out, "{n:4}: {ra:#x}")?,
            }
            if f.inlined {
                write!(out, " (inlined)")?;
            }
            writeln!(out)?;
            if let Some(file) = &f.file {
                match (f.line, f.column) {
                    (0, _) => writeln!(out, "             at {file}")?,
                    (l, 0) => writeln!(out, "             at {file}:{l}")?,
                    (l, c) => writeln!(out, "             at {file}:{l}:{c}")?,
                }
            }
            n += 1;
        }
    }
    Ok(())
}

fn print_raw(out: &mut Out, frames: &[u64], set: Option<&ModuleSet>, why: &str) -> fmt::Result {
    writeln!(out, "mem-trace: busy: {why}; raw addresses follow")?;
    for (n, &ra) in frames.iter().enumerate() {
        match set {
            Some(set) => raw_frame(out, n, ra, set)?,
            None => writeln!(out, "{n:4}: {ra:#x}")?,
        }
    }
    Ok(())
}

fn raw_frame(out: &mut Out, n: usize, ra: u64, set: &ModuleSet) -> fmt::Result {
    match set.find(ra.saturating_sub(1)) {
        Some(m) => {
            // No allocation here: this path runs when memory for symbolizing was unavailable.
            let base = m.path.rsplit(|&c| c == b'/').next().unwrap_or(&m.path);
            let base = core::str::from_utf8(base).unwrap_or("?");
            writeln!(out, "{n:4}: {ra:#x} ({base}+{:#x})", ra - m.bias)
        }
        None => writeln!(out, "{n:4}: {ra:#x}"),
    }
}
