//! A stack written as numbered frames with function names and `file:line`, from inside the
//! process: for `print_trace` and the error reports.
//!
//! Symbolizing allocates (DWARF is parsed on demand), and this may run while gdb has stopped
//! every other thread anywhere: so its allocations come from the arena's scratch region, which
//! takes no lock (docs/FINDINGS.md, "Calling into a stopped process"). The region serves one
//! user at a time; [`Printing`] is that right. Without it, or without memory, frames are
//! written raw, as `module+offset`, after a `busy` line saying why.

use crate::arena::ScratchScope;
use crate::capture::modules::{self, ModuleSet};
use crate::out::Out;
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, Ordering};
use mem_trace_read::symbolize::{ModuleRef, SymFrame, Symbolizer};
use mem_trace_read::text;

/// Held while one thread symbolizes (the scratch region is single-user).
static PRINTING: AtomicBool = AtomicBool::new(false);

/// The right to symbolize in process; released on drop.
pub struct Printing(());

impl Printing {
    /// Takes the right, or `None` while another thread holds it (never waits).
    pub fn begin() -> Option<Printing> {
        (!PRINTING.swap(true, Ordering::Acquire)).then_some(Printing(()))
    }

    /// Numbered frames with names and `file:line`; raw `module+offset` when symbolizing is
    /// not possible right now.
    pub fn write_stack(&self, out: &mut Out, frames: &[u64]) -> fmt::Result {
        let Some(set) = modules::snapshot() else {
            return write_raw(out, frames, None, "no module list yet");
        };
        let Some(scratch) = ScratchScope::enter() else {
            return write_raw(out, frames, Some(set), "cannot reserve memory to symbolize");
        };
        let r = write_symbolized(out, frames, set);
        drop(scratch);
        r
    }
}

impl Drop for Printing {
    fn drop(&mut self) {
        PRINTING.store(false, Ordering::Release);
    }
}

/// Writes a stack for an error report from a running thread. Falls back to raw addresses if
/// a `print_trace` is running at the same moment.
pub fn write_stack(out: &mut Out, frames: &[u64]) -> fmt::Result {
    if frames.is_empty() {
        return writeln!(out, "   (no stack recorded)");
    }
    match Printing::begin() {
        Some(p) => p.write_stack(out, frames),
        None => write_raw(out, frames, modules::snapshot(), "print_trace is running"),
    }
}

fn write_symbolized(out: &mut Out, frames: &[u64], set: &ModuleSet) -> fmt::Result {
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
            text::write_frame(out, n, ra, f)?;
            n += 1;
        }
    }
    Ok(())
}

fn write_raw(out: &mut Out, frames: &[u64], set: Option<&ModuleSet>, why: &str) -> fmt::Result {
    writeln!(out, "mem-trace: busy: {why}; raw addresses follow")?;
    for (n, &ra) in frames.iter().enumerate() {
        match set {
            Some(set) => raw_frame(out, n, ra, set)?,
            None => text::write_raw_frame(out, n, ra, None)?,
        }
    }
    Ok(())
}

fn raw_frame(out: &mut Out, n: usize, ra: u64, set: &ModuleSet) -> fmt::Result {
    // No allocation here: this path runs when memory for symbolizing was unavailable.
    let module = set
        .find(ra.saturating_sub(1))
        .map(|m| (&m.path[..], m.bias));
    text::write_raw_frame(out, n, ra, module)
}
