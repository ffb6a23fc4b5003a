//! The answer of `history ADDR` (`mtrace-history`): every remembered allocation and free
//! touching an address, newest first:
//!
//! ```text
//! 0x55555555b601: 3 events, newest first
//! #40 allocation of a 32-byte block [0x55555555a2c0, 0x55555555a2e0) by thread 1 (live), tid 4242 "prog"
//!     #0 0x5555555551c9 in make_node at /src/prog.c:35
//! #25 free of a 48-byte block [0x55555555a2c0, 0x55555555a2f0) by thread 1, tid 4242 "prog"
//!     #0 0x5555555551f3 in release_node at /src/prog.c:40
//! #20 allocation of a 48-byte block [0x55555555a2c0, 0x55555555a2f0) by thread 1 (freed at #25), tid 4242 "prog"
//!     #0 0x5555555551c9 in make_node at /src/prog.c:35
//! ```
//!
//! `#N` is the event's sequence number: allocations and frees share one counter, so the
//! numbers order everything the process did. Frees older than the ring's capacity
//! (`MEM_TRACE_FREED`) are gone, and the answer says so when that happened.

use super::parts::{
    block_text, history_or_none, stack_lines, thread_details, thread_text, Lookups, StackKind,
};
use crate::layout::{Error, Event, EventKind, History, Tables};
use crate::memory::Memory;

/// What the tables remember about one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryFacts {
    /// The address asked about.
    pub address: u64,
    /// Allocations and frees touching it, newest first.
    pub events: Vec<Event>,
    /// The history's header, `None` when there is none or it is unreadable.
    pub history: Option<History>,
}

impl HistoryFacts {
    /// Reads them.
    pub fn read<M: Memory + ?Sized>(
        tables: &Tables<'_, M>,
        address: u64,
    ) -> Result<HistoryFacts, Error> {
        Ok(HistoryFacts {
            address,
            events: tables.history_events(address)?,
            history: history_or_none(tables),
        })
    }
}

/// `#5678 free of a 48-byte block [a, b) by thread 2, tid ...`.
fn event_line(lookups: &Lookups<'_>, e: &Event) -> String {
    let (what, state) = match (e.kind, &e.freed) {
        (EventKind::Free, Some(f)) if f.by_realloc => ("free (by realloc)", String::new()),
        (EventKind::Free, _) => ("free", String::new()),
        (EventKind::Allocation, None) => ("allocation", " (live)".to_string()),
        (EventKind::Allocation, Some(f)) => ("allocation", format!(" (freed at #{})", f.free_seq)),
    };
    // A live tagged block has no event number.
    let number = match e.seq {
        crate::layout::tags::NO_SEQ => String::new(),
        seq => format!("#{seq} "),
    };
    format!(
        "{number}{what} of {} by {}{state}",
        block_text(&e.block),
        thread_text(e.thread)
    ) + &thread_details(lookups, e.thread)
}

/// What the history cannot know, when that matters: none kept, off, or wrapped.
fn bound_line(history: Option<&History>) -> Option<String> {
    match history {
        None => Some("(this process keeps no freed-block history)".to_string()),
        Some(h) if !h.enabled() => {
            Some("(the freed-block history is off: MEM_TRACE_FREED=0)".to_string())
        }
        Some(h) if h.wrapped() => Some(format!(
            "(history keeps the last {} frees; older events are gone)",
            h.capacity
        )),
        Some(_) => None,
    }
}

/// The events, each with its stack (at most `max_frames` frames; `None`: all) unless
/// `stacks` is off, then the history's bound.
pub fn lines(
    facts: &HistoryFacts,
    lookups: &mut Lookups<'_>,
    max_frames: Option<usize>,
    stacks: bool,
) -> Vec<String> {
    let bound = bound_line(facts.history.as_ref());
    let mut out = Vec::new();
    if facts.events.is_empty() {
        out.push(format!(
            "no remembered allocation or free touches {:#x}",
            facts.address
        ));
    } else {
        let n = facts.events.len();
        let count = if n == 1 {
            "1 event".to_string()
        } else {
            format!("{n} events")
        };
        out.push(format!("{:#x}: {count}, newest first", facts.address));
        for e in &facts.events {
            out.push(event_line(lookups, e));
            if stacks {
                let kind = match e.kind {
                    EventKind::Allocation => StackKind::Allocation,
                    EventKind::Free => StackKind::Free,
                };
                out.extend(stack_lines(
                    lookups,
                    e.stack,
                    max_frames,
                    kind,
                    facts.history.as_ref(),
                ));
            }
        }
    }
    out.extend(bound);
    out
}
