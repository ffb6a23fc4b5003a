//! The pieces every answer is made of: sizes, blocks, threads, numbered stacks.
//!
//! Nothing here fails for unreadable memory: a stack or thread record that cannot be read
//! becomes a line saying so, and the rest of the answer stands.

use super::frame::Frame;
use crate::addr_map::AddrMap;
use crate::layout::{Error, History, Tables, Thread};
use crate::memory::Memory;
use crate::text::Quoted;
use mem_trace_format::{Block, LOW40};
use std::collections::HashMap;

/// Stacks and thread records by id; [`Tables`] is one, tests have fakes.
pub trait Records {
    /// The return addresses of stack `id`, innermost first; `None` for id 0 or one with
    /// nothing published under it.
    fn stack(&self, id: u32) -> Result<Option<Vec<u64>>, Error>;
    /// Thread `index`'s record; `None` for index 0 or one not written yet.
    fn thread(&self, index: u32) -> Result<Option<Thread>, Error>;
}

impl<M: Memory + ?Sized> Records for Tables<'_, M> {
    fn stack(&self, id: u32) -> Result<Option<Vec<u64>>, Error> {
        if id == 0 || self.header().stacks.is_null() {
            return Ok(None);
        }
        let count = self.stack_count()?;
        if u64::from(id) > count {
            return Err(Error::Corrupt(format!(
                "stack id {id} is beyond the {count} handed out"
            )));
        }
        Tables::stack(self, id)
    }

    fn thread(&self, index: u32) -> Result<Option<Thread>, Error> {
        if index == 0 || self.header().threads.is_null() {
            return Ok(None);
        }
        let count = self.thread_count()?;
        if u64::from(index) > count {
            return Err(Error::Corrupt(format!(
                "thread index {index} is beyond the {count} handed out"
            )));
        }
        Tables::thread(self, index)
    }
}

/// What the answers need besides the facts: records, and frames for a return address.
pub struct Lookups<'a> {
    records: &'a dyn Records,
    symbolize: &'a mut dyn FnMut(u64) -> Vec<Frame>,
    /// Stacks share return addresses: each is symbolized once.
    frames: AddrMap<Vec<Frame>>,
    /// gdb's thread numbers by kernel thread id (see [`Lookups::with_gdb_threads`]).
    gdb_threads: Option<&'a HashMap<u32, u32>>,
}

impl<'a> Lookups<'a> {
    /// Lookups over `records`; `symbolize` gives a return address's frames, innermost
    /// (inlined) first (see [`frames`](super::frame::frames), and
    /// [`unsymbolized`](super::frame::unsymbolized) for `--raw`).
    pub fn new(records: &'a dyn Records, symbolize: &'a mut dyn FnMut(u64) -> Vec<Frame>) -> Self {
        Lookups {
            records,
            symbolize,
            frames: AddrMap::default(),
            gdb_threads: None,
        }
    }

    /// With gdb's thread numbers by kernel thread id: a thread that gdb lists is named with
    /// its number too (`, gdb thread 3`), the number its `thread` command takes.
    pub fn with_gdb_threads(mut self, threads: &'a HashMap<u32, u32>) -> Self {
        self.gdb_threads = Some(threads);
        self
    }

    fn frames(&mut self, pc: u64) -> &[Frame] {
        let symbolize = &mut self.symbolize;
        self.frames.entry(pc).or_insert_with(|| symbolize(pc))
    }
}

/// An error as the answers quote it: what is wrong, without the decoder's prefix.
pub(super) fn error_text(e: &Error) -> String {
    match e {
        Error::Corrupt(what) => what.clone(),
        other => other.to_string(),
    }
}

/// `1 byte`, `2 bytes`.
pub(super) fn bytes_text(n: u64) -> String {
    plural(n, "byte")
}

/// `1 block`, `0 blocks`: a count and its noun.
pub(super) fn plural(n: impl Into<u64>, word: &str) -> String {
    match n.into() {
        1 => format!("1 {word}"),
        n => format!("{n} {word}s"),
    }
}

/// `a 48-byte block [a, b)`.
pub(super) fn block_text(b: &Block) -> String {
    let size = if b.size == LOW40 {
        format!("a block of at least {} bytes", b.size)
    } else {
        format!("a {}-byte block", b.size)
    };
    format!("{size} [{:#x}, {:#x})", b.addr, b.addr.wrapping_add(b.size))
}

/// `thread 2`, or `an unknown thread` for index 0.
pub(super) fn thread_text(index: u32) -> String {
    if index == 0 {
        "an unknown thread".to_string()
    } else {
        format!("thread {index}")
    }
}

/// `, tid 4242 "prog"` and `, exited` (or `, gdb thread 3` for a live thread gdb lists),
/// when the thread record is readable.
pub(super) fn thread_details(lookups: &Lookups<'_>, index: u32) -> String {
    let thread = match lookups.records.thread(index) {
        Err(e) => return format!(" (thread record unreadable: {})", error_text(&e)),
        Ok(None) => return String::new(),
        Ok(Some(t)) => t,
    };
    let mut text = format!(", tid {}", thread.tid);
    if !thread.name.is_empty() {
        text += &format!(" {}", Quoted(&thread.name));
    }
    if thread.exited {
        text += ", exited";
    } else if let Some(n) = lookups.gdb_threads.and_then(|t| t.get(&thread.tid)) {
        text += &format!(", gdb thread {n}");
    }
    text
}

/// Which stack of a block a line shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StackKind {
    Allocation,
    Free,
}

impl StackKind {
    fn name(self) -> &'static str {
        match self {
            StackKind::Allocation => "allocation",
            StackKind::Free => "free",
        }
    }
}

/// The frame limit as every command spells it (`mem-trace` and gdb's alike), named in the
/// line that says a stack was cut, so that the line tells how to see more.
pub const FRAMES_OPTION: &str = "--frames";

/// The numbered stack `stack_id`, at most `max_frames` frames (inlined ones count), or one
/// line saying why not. `history` tells a free stack that was never recorded
/// (`MEM_TRACE_FREE_STACKS=0`) from one that is just missing.
pub(super) fn stack_lines(
    lookups: &mut Lookups<'_>,
    stack_id: u32,
    max_frames: Option<usize>,
    kind: StackKind,
    history: Option<&History>,
) -> Vec<String> {
    let name = kind.name();
    if stack_id == 0 {
        return vec![match kind {
            StackKind::Free if history.is_some_and(|h| !h.free_stacks()) => {
                "    (no free stack was recorded: MEM_TRACE_FREE_STACKS=0)".to_string()
            }
            StackKind::Free => "    (no free stack recorded)".to_string(),
            StackKind::Allocation => format!("    (no {name} stack was recorded)"),
        }];
    }
    let pcs = match lookups.records.stack(stack_id) {
        Err(e) => {
            return vec![format!(
                "    ({name} stack {stack_id} unreadable: {})",
                error_text(&e)
            )]
        }
        Ok(None) => {
            return vec![format!(
                "    ({name} stack {stack_id} is not published yet)"
            )]
        }
        Ok(Some(pcs)) => pcs,
    };
    let mut frames: Vec<Frame> = Vec::new();
    let mut cut = false;
    for pc in pcs {
        if crate::text::is_cut_marker(pc) {
            cut = true;
            break;
        }
        frames.extend_from_slice(lookups.frames(pc));
    }
    let keys: Vec<String> = frames.iter().map(Frame::describe).collect();
    let mut lines = Vec::new();
    let mut shown = 0;
    for step in recursion_plan(&keys) {
        match step {
            Step::Recursion(r) => lines.push(recursion_line(&r, &keys)),
            Step::Frame(_) if max_frames.is_some_and(|max| shown >= max) => {
                lines.push(format!(
                    "    ... ({FRAMES_OPTION} {})",
                    max_frames.unwrap_or(0)
                ));
                return lines;
            }
            Step::Frame(k) => {
                lines.push(format!("    #{k} {}", keys[k]));
                shown += 1;
            }
        }
    }
    if cut {
        lines.push(format!("    {}", crate::text::CUT_TEXT));
    }
    if lines.is_empty() {
        lines.push(format!("    (empty {name} stack)"));
    }
    lines
}

/// A recursion repeats the same frames (one function, or up to this many calling each other
/// in turn): shown once, with at least [`RECURSION_SHOWN`] of its frames, then one line for
/// the rest when that hides at least [`RECURSION_MIN_HIDDEN`].
const RECURSION_PERIOD: usize = 4;
const RECURSION_SHOWN: usize = 3;
const RECURSION_MIN_HIDDEN: usize = 3;

/// A step of [`recursion_plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// The frame of this index.
    Frame(usize),
    /// Frames left out of a recursion.
    Recursion(Recursion),
}

/// `hidden` frames left out, repeating the `period` frames from index `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recursion {
    hidden: usize,
    first: usize,
    period: usize,
}

/// The frames to show, by index, with a [`Recursion`] in place of each long repetition of the
/// same frames (`keys`: what tells frames apart, their descriptions). The frames after a
/// recursion keep their numbers, as in gdb's backtrace.
pub(super) fn recursion_plan(keys: &[String]) -> Vec<Step> {
    let mut plan = Vec::new();
    let (mut i, n) = (0, keys.len());
    while i < n {
        let (mut end, mut period) = (i, 0);
        for p in 1..=RECURSION_PERIOD {
            let mut e = i + p;
            while e < n && keys[e] == keys[e - p] {
                e += 1;
            }
            // The smallest period that reaches furthest, repeated at least twice.
            if e <= n && e - i >= 2 * p && e > end {
                (end, period) = (e, p);
            }
        }
        let shown = RECURSION_SHOWN.max(period);
        if period > 0 && end - i >= shown + RECURSION_MIN_HIDDEN {
            plan.extend((i..i + shown).map(Step::Frame));
            plan.push(Step::Recursion(Recursion {
                hidden: end - i - shown,
                first: i,
                period,
            }));
            i = end;
            continue;
        }
        plan.push(Step::Frame(i));
        i += 1;
    }
    plan
}

/// `... 39 more frames of the same recursion (fib at fib.c:12)`, from the frames'
/// descriptions.
fn recursion_line(r: &Recursion, keys: &[String]) -> String {
    let repeated: Vec<&str> = keys[r.first..r.first + r.period]
        .iter()
        .map(|k| k.split_once(" in ").map_or(k.as_str(), |(_, rest)| rest))
        .collect();
    format!(
        "    ... {} more frames of the same recursion ({})",
        r.hidden,
        repeated.join(", ")
    )
}

/// Blocks, as `(stack, size)`, summed per stack: `(stack, bytes, blocks)`, biggest first
/// (ties: more blocks, then the older stack).
pub(super) fn sum_by_stack(blocks: impl Iterator<Item = (u32, u64, u64)>) -> Vec<(u32, u64, u64)> {
    let mut sums: HashMap<u32, (u64, u64)> = HashMap::new();
    for (stack, size, count) in blocks {
        let s = sums.entry(stack).or_default();
        // Saturating: sizes and sample weights come from the target, which may have scribbled.
        s.0 = s.0.saturating_add(size);
        s.1 = s.1.saturating_add(count);
    }
    let mut out: Vec<(u32, u64, u64)> = sums.into_iter().map(|(k, (n, c))| (k, n, c)).collect();
    out.sort_by_key(|&(stack, bytes, blocks)| (core::cmp::Reverse((bytes, blocks)), stack));
    out
}

/// The history header, or `None` when it is absent or unreadable: it only decorates the
/// answers (a free stack that was never recorded, a ring that wrapped).
pub(super) fn history_or_none<M: Memory + ?Sized>(tables: &Tables<'_, M>) -> Option<History> {
    tables.history_header().ok().flatten()
}
