//! One answer from an opened [`Target`], as every reader gives it: the tables opened, return
//! addresses symbolized over the target's modules (or left raw), and what the reading learned
//! on the side (a hint when most frames have no names, the events a running process made
//! meanwhile). The `mem-trace` command prints an [`Answered`]; gdb's commands, through the
//! reader module loaded into gdb, print the same lines, so the two cannot drift apart.

use super::error::AnswerError;
use super::{frame, Frame, Lookups};
use crate::layout::Tables;
use crate::memory::{read_plain, Memory};
use crate::target::{Symbols, Target};
use crate::text::NamesTally;
use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::OsStrExt as _;

/// How the frames of an answer are shown, and what else the reader knows.
#[derive(Clone, Debug, Default)]
pub struct Asked {
    /// Return addresses as they are, not symbolized (`-r`/`--raw`).
    pub raw: bool,
    /// gdb's number of each thread it lists, by kernel thread id: an answer that names a
    /// thread adds `, gdb thread N`. Empty outside gdb.
    pub gdb_threads: HashMap<u32, u32>,
    /// The process was held stopped for what the answer is made of, and let go before the
    /// rest (the leak scan's symbolizing): what it did after is no part of the answer, and
    /// not reported.
    pub stopped: bool,
}

/// An answer's lines, and what the reading noticed.
#[derive(Clone, Debug, Default)]
pub struct Answered {
    /// The answer.
    pub lines: Vec<String>,
    /// Lines advising debug information, when most frames had no name (empty otherwise).
    pub hint: String,
    /// Allocations and frees a running process made while it was read, when any.
    pub ran_on: Option<u64>,
}

impl Answered {
    /// The note a running process's answer carries when it changed during the read.
    pub fn ran_on_note(&self, target: &Target) -> Option<String> {
        self.ran_on.map(|n| {
            format!(
                "mem-trace: note: {} ran on while it was read: {n} allocations and frees happened during the read",
                target.name()
            )
        })
    }
}

/// Opens `target`'s tables and gives `read` them with lookups as `asked` says; an error is
/// one line naming the target.
pub fn ask<'t>(
    target: &'t Target,
    asked: &Asked,
    read: impl FnOnce(
        &Tables<'t, dyn Memory + 't>,
        &mut Lookups<'_>,
    ) -> Result<Vec<String>, AnswerError>,
) -> Result<Answered, String> {
    let tables = target
        .tables()
        .map_err(|e| format!("{}: {e}", target.name()))?;
    let mut symbols = Symbols::new(target);
    // Counted once per return address, however many stacks show it.
    let mut tally = NamesTally::default();
    let mut seen = HashSet::new();
    let mut symbolize = |pc: u64| -> Vec<Frame> {
        if asked.raw {
            return frame::unsymbolized(pc);
        }
        let frames = frame::target_frames(&mut symbols, pc);
        if !seen.insert(pc) {
            return frames;
        }
        let named = frames
            .iter()
            .any(|f| f.function.is_some() || f.file.is_some() || f.module.is_some());
        let module = symbols.module_of(pc.wrapping_sub(1));
        tally.note(named, module.map(|m| m.path.as_os_str().as_bytes()));
        frames
    };
    let before = events(target);
    let lines = {
        let mut lookups =
            Lookups::new(&tables, &mut symbolize).with_gdb_threads(&asked.gdb_threads);
        read(&tables, &mut lookups).map_err(|e| match e {
            // What the user asked for is wrong, whatever the target.
            AnswerError::Usage(what) => what,
            e => format!("{}: {e}", target.name()),
        })?
    };
    let after = events(target);
    let mut hint = String::new();
    let _ = tally.write_hint(&mut hint);
    let ran_on = match (target.is_live() && !asked.stopped, before, after) {
        (true, Some(before), Some(after)) if after != before => Some(after.wrapping_sub(before)),
        _ => None,
    };
    Ok(Answered {
        lines,
        hint,
        ran_on,
    })
}

/// The target's event counter (`next_seq`), when readable.
fn events(target: &Target) -> Option<u64> {
    let at = target.header() + core::mem::offset_of!(mem_trace_format::Header, next_seq) as u64;
    read_plain::<u64>(target.memory(), at).ok()
}
