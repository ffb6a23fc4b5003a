//! A stack written as numbered frames with function names and `file:line`, from inside the
//! process: for `print_trace` and the error reports.
//!
//! Symbolizing allocates (DWARF is parsed on demand), and this may run while gdb has stopped
//! every other thread anywhere: so its allocations come from the arena's scratch region, which
//! takes no lock (docs/FINDINGS.md, "Calling into a stopped process"). The region serves one
//! user at a time; [`Printing`] is that right. Without it, or without memory, frames are
//! written raw, as `module+offset`, after a line saying why.

use crate::arena::ScratchScope;
use crate::capture::modules::{self, ModuleSet};
use crate::out::Out;
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use mem_trace_read::symbolize::{ModuleRef, SymFrame, Symbolizer};
use mem_trace_read::{deferred, text};

/// Return addresses symbolized in process so far (`MEM_TRACE_STATS=1`'s `symbolized_frames=`):
/// under `mem-trace run` the exit report symbolizes none.
pub(crate) static SYMBOLIZED: AtomicU64 = AtomicU64::new(0);

/// The kernel id of the thread that holds the right to symbolize (the scratch region is
/// single-user); 0 when free.
static PRINTING: AtomicU32 = AtomicU32::new(0);

/// The right to symbolize in process; released on drop.
pub struct Printing {
    /// Taken again by the thread that held it (see [`Printing::begin`]): the outer holder
    /// releases it.
    nested: bool,
}

impl Printing {
    /// Takes the right, or says which thread holds it (never waits). The thread that holds
    /// it may take it again: gdb can stop a `print_trace` at a breakpoint and call another on
    /// the same thread, and a call it abandons never returns to give the right back.
    pub fn begin() -> Result<Printing, u32> {
        // SAFETY: gettid takes no argument and cannot fail.
        let me = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        match PRINTING.compare_exchange(0, me, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => Ok(Printing { nested: false }),
            Err(holder) if holder == me => Ok(Printing { nested: true }),
            Err(holder) => Err(holder),
        }
    }

    /// Takes the right for an error report, waiting while other threads' reports take turns
    /// (several threads freeing one block report at once, ~70 ms each), but no more than
    /// about a second for any one holder: one that keeps it longer is likely stopped (a
    /// `print_trace` gdb stopped), and the caller then says so. Not for `print_trace`, which
    /// must never wait.
    pub fn within_a_second() -> Result<Printing, u32> {
        let mut holder = 0;
        let mut waited = 0;
        while waited < 1000 {
            match Printing::begin() {
                Ok(p) => return Ok(p),
                Err(h) if h != holder => {
                    holder = h;
                    waited = 0;
                }
                Err(_) => waited += 1,
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 1_000_000,
            };
            // SAFETY: sleeps 1 ms; `ts` is a valid duration.
            unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
        }
        Err(holder)
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

/// Writes several stacks in one scratch scope with one symbolizer, so each module's debug
/// information is parsed once per report rather than once per stack (the profiler's reports).
/// Drop it before the [`Printing`] it borrows.
pub struct StackWriter<'p> {
    // Declared before `scope`: the symbolizer's memory is in the scope and must go first.
    sym: Option<Symbolizer>,
    scope: Option<ScratchScope>,
    set: Option<&'static ModuleSet>,
    raw_why: Option<&'static str>,
    /// Frames symbolized so far and how many had no name, for [`StackWriter::write_names_hint`].
    tally: text::NamesTally,
    /// Stacks written as return addresses for `mem-trace run` to symbolize
    /// (`mem_trace_read::deferred`).
    deferred: bool,
    _printing: core::marker::PhantomData<&'p Printing>,
}

impl Printing {
    /// A writer for many stacks (see [`StackWriter`]).
    pub fn writer(&self) -> StackWriter<'_> {
        let set = modules::snapshot();
        let scope = set.and_then(|_| ScratchScope::enter());
        let raw_why = match (set, &scope) {
            (None, _) => Some("no module list yet"),
            (Some(_), None) => Some("cannot reserve memory to symbolize"),
            _ => None,
        };
        let sym = scope.as_ref().map(|_| Symbolizer::new());
        StackWriter {
            sym,
            scope,
            set,
            raw_why,
            tally: text::NamesTally::default(),
            deferred: false,
            _printing: core::marker::PhantomData,
        }
    }
}

impl StackWriter<'static> {
    /// A writer that writes raw frames only, after one `busy` line saying why (no
    /// [`Printing`] could be had).
    pub fn raw(why: &'static str) -> Self {
        StackWriter {
            sym: None,
            scope: None,
            set: modules::snapshot(),
            raw_why: Some(why),
            tally: text::NamesTally::default(),
            deferred: false,
            _printing: core::marker::PhantomData,
        }
    }

    /// A writer that leaves symbolizing to `mem-trace run`: stacks (and folded lines) as
    /// return addresses, in `mem_trace_read::deferred`'s form. It opens no file and parses
    /// no debug information.
    pub fn deferred() -> Self {
        StackWriter {
            sym: None,
            scope: None,
            set: None,
            raw_why: None,
            tally: text::NamesTally::default(),
            deferred: true,
            _printing: core::marker::PhantomData,
        }
    }
}

impl StackWriter<'_> {
    /// Numbered frames with names and `file:line`, as [`Printing::write_stack`] writes them.
    pub fn write(&mut self, out: &mut Out, frames: &[u64]) -> fmt::Result {
        self.write_with_folded(out, frames, None)
    }

    /// As [`write`](Self::write), and when `folded` is given, the same frames as one line of
    /// folded stacks with its value (`text::write_folded`): symbolized once for both.
    pub fn write_with_folded(
        &mut self,
        out: &mut Out,
        frames: &[u64],
        folded: Option<(&mut Out, u64)>,
    ) -> fmt::Result {
        if frames.is_empty() {
            if let Some((f, value)) = folded {
                text::write_folded(f, core::iter::empty(), value)?;
            }
            return writeln!(out, "   (no stack recorded)");
        }
        if self.deferred {
            if let Some((f, value)) = folded {
                deferred::write_folded_stack(f, frames, value)?;
            }
            return deferred::write_stack(out, frames);
        }
        match (self.set, &mut self.sym) {
            (Some(set), Some(sym)) => {
                write_symbolized_with(out, frames, set, sym, folded, &mut self.tally)
            }
            (set, _) => {
                if let Some((f, value)) = folded {
                    let raw = frames.iter().map(|&ra| folded_frame(ra, None, set));
                    text::write_folded(f, raw, value)?;
                }
                // Say why once per report, not once per stack.
                match self.raw_why.take() {
                    Some(why) => write_raw(out, frames, set, why),
                    None => write_raw_frames(out, frames, set),
                }
            }
        }
    }
}

impl StackWriter<'_> {
    /// One line saying how to get names, when most frames written so far had none (see
    /// `text::NamesTally`); raw frames written for want of memory or of the right to
    /// symbolize are not counted, since their line already says why.
    pub fn write_names_hint(&self, out: &mut Out) -> fmt::Result {
        if self.deferred {
            return deferred::write_hint(out);
        }
        self.tally.write_hint(out)
    }
}

impl Drop for StackWriter<'_> {
    fn drop(&mut self) {
        drop(self.sym.take());
        drop(self.scope.take());
    }
}

/// What a caller says when the thread `.0` holds the right to symbolize ([`Printing::begin`]).
pub struct Busy(pub u32);

impl fmt::Display for Busy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "busy: print_trace is running in thread {}, or gdb stopped it there",
            self.0
        )
    }
}

impl Drop for Printing {
    fn drop(&mut self) {
        if !self.nested {
            PRINTING.store(0, Ordering::Release);
        }
    }
}

/// Writes a stack for an error report from a running thread. Falls back to raw addresses if
/// a `print_trace` is running at the same moment.
pub fn write_stack(out: &mut Out, frames: &[u64]) -> fmt::Result {
    if frames.is_empty() {
        return writeln!(out, "   (no stack recorded)");
    }
    match Printing::begin() {
        Ok(p) => p.write_stack(out, frames),
        Err(holder) => {
            writeln!(out, "mem-trace: {}; raw addresses follow", Busy(holder))?;
            write_raw_frames(out, frames, modules::snapshot())
        }
    }
}

fn write_symbolized(out: &mut Out, frames: &[u64], set: &ModuleSet) -> fmt::Result {
    let mut tally = text::NamesTally::default();
    write_symbolized_with(out, frames, set, &mut Symbolizer::new(), None, &mut tally)?;
    tally.write_hint(out)
}

fn write_symbolized_with(
    out: &mut Out,
    frames: &[u64],
    set: &ModuleSet,
    sym: &mut Symbolizer,
    folded: Option<(&mut Out, u64)>,
    tally: &mut text::NamesTally,
) -> fmt::Result {
    let mut found: Vec<SymFrame> = Vec::new();
    // Each return address with what symbolizing it gave (several frames for inlined code;
    // none when nothing names it), kept for the folded line, which is written outermost first.
    let mut all: Vec<(u64, Option<SymFrame>)> = Vec::new();
    for &ra in frames {
        if text::is_cut_marker(ra) {
            all.push((ra, None));
            continue;
        }
        // Return addresses point after the call; the call itself is one byte earlier.
        let probe = ra.saturating_sub(1);
        found.clear();
        SYMBOLIZED.fetch_add(1, Ordering::Relaxed);
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
        tally.note(ok, module.map(|m| &m.name[..]));
        if ok {
            all.extend(found.drain(..).map(|f| (ra, Some(f))));
        } else {
            all.push((ra, None));
        }
    }
    for (n, (ra, f)) in all.iter().enumerate() {
        match f {
            Some(f) => text::write_frame(out, n, *ra, f)?,
            None if text::is_cut_marker(*ra) => text::write_cut(out)?,
            None => raw_frame(out, n, *ra, set)?,
        }
    }
    match folded {
        Some((f, value)) => {
            let named = all
                .iter()
                .map(|(ra, sym)| folded_frame(*ra, sym.as_ref(), Some(set)));
            text::write_folded(f, named, value)
        }
        None => Ok(()),
    }
}

/// A frame for `text::write_folded`, with the module holding `ra` when there is one.
fn folded_frame<'a>(
    ra: u64,
    symbol: Option<&'a SymFrame>,
    set: Option<&'a ModuleSet>,
) -> text::FoldedFrame<'a> {
    let module = set
        .and_then(|s| s.find(ra.saturating_sub(1)))
        .map(|m| (&m.name[..], m.bias));
    text::FoldedFrame { ra, symbol, module }
}

fn write_raw(out: &mut Out, frames: &[u64], set: Option<&ModuleSet>, why: &str) -> fmt::Result {
    writeln!(out, "mem-trace: {why}; raw addresses follow")?;
    write_raw_frames(out, frames, set)
}

fn write_raw_frames(out: &mut Out, frames: &[u64], set: Option<&ModuleSet>) -> fmt::Result {
    for (n, &ra) in frames.iter().enumerate() {
        match set {
            _ if text::is_cut_marker(ra) => text::write_cut(out)?,
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
        .map(|m| (&m.name[..], m.bias));
    text::write_raw_frame(out, n, ra, module)
}
