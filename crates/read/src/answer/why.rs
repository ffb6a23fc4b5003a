//! The answer of `why ADDR` (`mtrace-why`): which heap block holds an address, who allocated
//! it, who freed it. It reads like
//! AddressSanitizer's:
//!
//! ```text
//! 0x55555555a2c5 is 37 bytes inside a 100-byte block [0x55555555a2a0, 0x55555555a304) allocated by thread 1 (#1234), tid 4242 "prog"
//!     #0 0x55555555516d in make_buffer at /src/prog.c:12
//!     #1 0x5555555551a0 in main at /src/prog.c:30
//! ```
//!
//! and for a dangling pointer, from the freed-block history, `... freed by thread 1 (#7)`,
//! the free stack, then `previously allocated by thread 1 (#6)` and its stack.
//!
//! Which answer wins: a live block containing the address (the memory was reused: the
//! history is then only mentioned), else the newest freed block containing it, else a live
//! block nearby ("N bytes after ...").

use super::parts::{
    block_text, bytes_text, error_text, history_or_none, stack_lines, thread_details, thread_text,
    Lookups, StackKind,
};
use crate::layout::{Error, History, Match, Relation, Tables};
use crate::memory::Memory;
use core::sync::atomic::Ordering::Relaxed;
use mem_trace_format::Freed;

/// What the tables say about one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WhyFacts {
    /// The address asked about.
    pub address: u64,
    /// The live block containing it, else the nearest one within the gap.
    pub found: Option<Match>,
    /// Remembered freed blocks containing it, newest free first.
    pub freed: Vec<Freed>,
    /// Why the freed-block history could not be read (then `freed` is empty).
    pub freed_error: Option<String>,
    /// The history's header, `None` when there is none or it is unreadable.
    pub history: Option<History>,
    /// Blocks the tracer could not record (`header.untracked`).
    pub untracked: u64,
    /// `MEM_TRACE_SAMPLE` (0: every block is recorded).
    pub sample_mean: u64,
    /// In a process `mem-trace attach` loaded the tracer into: the first event after the
    /// last attach (`header.attached_at`); blocks from before it are unknown.
    pub attached_at: Option<u64>,
    /// The process kept no record of frees (profile mode): an address in no live block may
    /// be in a freed one, which nothing remembers.
    pub no_frees_kept: bool,
}

impl WhyFacts {
    /// Reads them, naming a live block up to `max_gap` bytes away. An unreadable live table
    /// is an error; the history only adds to the answer, so when it cannot be read the answer
    /// stands, with a line saying why.
    pub fn read<M: Memory + ?Sized>(
        tables: &Tables<'_, M>,
        address: u64,
        max_gap: u64,
    ) -> Result<WhyFacts, Error> {
        let found = tables.find_block(address, max_gap)?;
        let (freed, freed_error) = match tables.freed_blocks_containing(address) {
            Ok(freed) => (freed, None),
            Err(e) => (Vec::new(), Some(error_text(&e))),
        };
        let history = history_or_none(tables);
        Ok(WhyFacts {
            address,
            found,
            freed,
            freed_error,
            // Profile mode writes nothing to the history, which may still be mapped.
            no_frees_kept: history.as_ref().is_none_or(|h| h.written == 0)
                && tables.header().flags.load(Relaxed) & mem_trace_format::FLAG_PROFILE_MODE != 0,
            history,
            untracked: tables.header().untracked.load(Relaxed),
            sample_mean: tables.sample_mean(),
            attached_at: attached_at(tables.header()),
        })
    }
}

/// `header.attached_at` when the tracer was attached (`FLAG_ATTACHED`).
fn attached_at(h: &mem_trace_format::Header) -> Option<u64> {
    (h.flags.load(Relaxed) & mem_trace_format::FLAG_ATTACHED != 0)
        .then(|| h.attached_at.load(Relaxed))
}

/// The line for an address the tables do not know, in an attached process.
pub fn attached_line(seq: u64) -> String {
    format!(
        "(mem-trace was attached to this process at event #{seq}: blocks allocated before \
         that are unknown to it; it may be one of them)"
    )
}

/// The line for an address in no live block of a process that kept no record of frees: it
/// may be a dangling pointer, which only debug mode can answer.
pub const NO_FREES_KEPT: &str = "this process kept no record of frees (profile mode): the \
     address may be a dangling pointer; run with --mode debug to have frees answered";

/// The answer for an address in no sampled block of a process that samples.
pub fn not_sampled(address: u64, mean: u64) -> String {
    format!(
        "{address:#x} is in no sampled block: not sampled, this process samples {} \
         (MEM_TRACE_SAMPLE)",
        crate::sample::rate(mean)
    )
}

/// The first line of a live-block answer, without the thread details.
fn describe_match(m: &Match) -> String {
    let b = &m.block;
    let offset = bytes_text(m.offset);
    let place = match m.relation {
        Relation::Inside if m.offset == 0 => "at the start of ".to_string(),
        Relation::Inside => format!("{offset} inside "),
        Relation::After => format!("{offset} after "),
        Relation::Before => format!("{offset} before "),
    };
    format!(
        "{:#x} is {place}{} allocated by {}{}",
        m.address,
        block_text(b),
        thread_text(b.thread),
        seq_text(b.seq)
    )
}

/// ` (#1234)`: the event number of an allocation; nothing for a tagged block, which has
/// none (docs/LAYOUT.md "Block tags").
pub(crate) fn seq_text(seq: u64) -> String {
    if seq == crate::layout::tags::NO_SEQ {
        String::new()
    } else {
        format!(" (#{seq})")
    }
}

/// The first line for an address in a freed block, without the thread details.
fn describe_freed(address: u64, record: &Freed) -> String {
    let offset = address.wrapping_sub(record.block.addr);
    let place = if offset == 0 {
        "at the start of".to_string()
    } else {
        format!("{} inside", bytes_text(offset))
    };
    let verb = if record.by_realloc {
        "freed (by realloc)"
    } else {
        "freed"
    };
    format!(
        "{address:#x} is {place} {} {verb} by {} (#{})",
        block_text(&record.block),
        thread_text(record.free_thread),
        record.free_seq
    )
}

fn older_line(count: usize) -> String {
    format!("    (older freed blocks covered this address too: {count}; see mtrace-history)")
}

/// ASan's shape: freed by (free stack), previously allocated by (allocation stack).
fn freed_lines(
    facts: &WhyFacts,
    lookups: &mut Lookups<'_>,
    max_frames: Option<usize>,
) -> Vec<String> {
    let newest = &facts.freed[0];
    let mut out =
        vec![describe_freed(facts.address, newest) + &thread_details(lookups, newest.free_thread)];
    out.extend(stack_lines(
        lookups,
        newest.free_stack,
        max_frames,
        StackKind::Free,
        facts.history.as_ref(),
    ));
    let a = &newest.block;
    out.push(
        format!(
            "previously allocated by {} (#{})",
            thread_text(a.thread),
            a.seq
        ) + &thread_details(lookups, a.thread),
    );
    out.extend(allocation_stack(lookups, a.stack, max_frames));
    if facts.freed.len() > 1 {
        out.push(older_line(facts.freed.len() - 1));
    }
    out
}

fn allocation_stack(lookups: &mut Lookups<'_>, stack: u32, max: Option<usize>) -> Vec<String> {
    stack_lines(lookups, stack, max, StackKind::Allocation, None)
}

/// The lines of the answer: live block, else freed block, else a nearby live block; at most
/// `max_frames` frames per stack (`None`: all).
pub fn lines(
    facts: &WhyFacts,
    lookups: &mut Lookups<'_>,
    max_frames: Option<usize>,
) -> Vec<String> {
    let tail: Vec<String> = facts
        .freed_error
        .iter()
        .map(|e| format!("    (freed-block history unreadable: {e})"))
        .collect();
    if let Some(m) = facts.found.filter(|m| m.relation == Relation::Inside) {
        let mut out = vec![describe_match(&m) + &thread_details(lookups, m.block.thread)];
        out.extend(allocation_stack(lookups, m.block.stack, max_frames));
        // The live block reuses memory freed before: one line, details in mtrace-history.
        if !facts.freed.is_empty() {
            out.push(older_line(facts.freed.len()));
        }
        return [out, tail].concat();
    }
    if !facts.freed.is_empty() {
        // A freed block that contains the address beats a merely nearby live one: the
        // pointer is dangling, not overflowing its neighbour.
        return freed_lines(facts, lookups, max_frames);
    }
    if facts.sample_mean != 0 {
        // Most blocks go unrecorded: a nearby sampled block says nothing of this address.
        return [vec![not_sampled(facts.address, facts.sample_mean)], tail].concat();
    }
    let Some(m) = facts.found else {
        let mut out = vec![format!(
            "{:#x} is not inside any block tracked by mem-trace",
            facts.address
        )];
        if facts.untracked > 0 {
            out.push(format!(
                "({} blocks could not be tracked; it may be one of them)",
                facts.untracked
            ));
        }
        out.extend(facts.attached_at.map(attached_line));
        if facts.no_frees_kept {
            out.push(format!("({NO_FREES_KEPT})"));
        }
        return [out, tail].concat();
    };
    let mut out = vec![describe_match(&m) + &thread_details(lookups, m.block.thread)];
    // Glibc packs small blocks 16 bytes apart, so a pointer to a block freed too long ago for
    // the history is "N bytes before/after" a live neighbour.
    out.push(if facts.no_frees_kept {
        format!("    (not inside any live block, and {NO_FREES_KEPT})")
    } else {
        "    (not inside any live block nor any remembered freed block: an overflow, \
         or a pointer to an untracked or long-freed block)"
            .to_string()
    });
    out.extend(
        facts
            .attached_at
            .map(|seq| format!("    {}", attached_line(seq))),
    );
    out.extend(allocation_stack(lookups, m.block.stack, max_frames));
    [out, tail].concat()
}
