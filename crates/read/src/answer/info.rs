//! The answer of `info` (`mtrace-info`): is mem-trace loaded, and what its tables hold.

use super::parts::error_text;
use crate::layout::{Error, History, Tables, Totals, SUM_LINE};
use crate::memory::Memory;
use core::sync::atomic::Ordering::Relaxed;
use mem_trace_format::{
    FLAG_ATTACHED, FLAG_FREE_STACKS, FLAG_INITIALISED, FLAG_PROFILER, FLAG_PROFILE_MODE,
};

/// The header's figures, the process-wide counters and the freed-block history's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoFacts {
    /// Where `MEM_TRACE_HEADER` is.
    pub header: u64,
    /// Its layout version.
    pub version: u32,
    /// Its `FLAG_*` bits.
    pub flags: u64,
    /// Live blocks and bytes, stacks, threads.
    pub totals: Totals,
    /// Blocks the tracer could not record.
    pub untracked: u64,
    /// The sequence number of the next event.
    pub next_seq: u64,
    /// `MEM_TRACE_SAMPLE` (0: every block recorded).
    pub sample_mean: u64,
    /// `None` when the process has no history (`header.freed` is 0) or it is unreadable.
    pub history: Option<History>,
    /// Why the history header could not be read.
    pub history_error: Option<String>,
}

impl InfoFacts {
    /// Reads them from the tables whose header is at `header`. Unreadable counters are an
    /// error; an unreadable history is one line of the answer.
    pub fn read<M: Memory + ?Sized>(
        tables: &Tables<'_, M>,
        header: u64,
    ) -> Result<InfoFacts, Error> {
        let h = tables.header();
        // Before the tracer has initialised, its tables are not there yet.
        let totals = if h.shards.is_null() {
            Totals::default()
        } else {
            tables.totals()?
        };
        let (history, history_error) = match tables.history_header() {
            Ok(history) => (history, None),
            Err(e) => (None, Some(error_text(&e))),
        };
        Ok(InfoFacts {
            header,
            version: h.version,
            flags: h.flags.load(Relaxed),
            totals,
            untracked: h.untracked.load(Relaxed),
            next_seq: h.next_seq.load(Relaxed),
            sample_mean: h.sample_mean.load(Relaxed),
            history,
            history_error,
        })
    }
}

/// The answer.
pub fn lines(facts: &InfoFacts) -> Vec<String> {
    let t = &facts.totals;
    let flags: Vec<&str> = [
        (FLAG_INITIALISED, "initialised"),
        (FLAG_PROFILER, "profiler"),
        (FLAG_FREE_STACKS, "free stacks"),
        (FLAG_PROFILE_MODE, "profile mode"),
        (
            FLAG_ATTACHED,
            "attached (blocks from before the attach are unknown)",
        ),
    ]
    .into_iter()
    .filter(|&(bit, _)| facts.flags & bit != 0)
    .map(|(_, name)| name)
    .collect();
    let flags = if flags.is_empty() {
        "none".to_string()
    } else {
        flags.join(", ")
    };
    let mut out = vec![
        format!(
            "mem-trace is loaded: header at {:#x}, layout version {}",
            facts.header, facts.version
        ),
        format!("  live blocks:     {} ({} bytes)", t.blocks, t.bytes),
    ];
    if t.wrapped {
        out.push(format!("  {SUM_LINE}"));
    }
    out.extend([
        format!("  distinct stacks: {}", t.stacks),
        format!("  threads seen:    {}", t.threads),
        format!("  untracked:       {}", facts.untracked),
        format!("  next sequence:   {}", facts.next_seq),
        format!("  flags:           {flags}"),
    ]);
    if facts.sample_mean != 0 {
        out.push(format!(
            "  sampling:        {} (MEM_TRACE_SAMPLE): the live blocks are the samples",
            crate::sample::rate(facts.sample_mean)
        ));
    }
    out.extend(history_lines(facts));
    out
}

/// The freed-block history's figures.
fn history_lines(facts: &InfoFacts) -> Vec<String> {
    if let Some(e) = &facts.history_error {
        return vec![format!("  freed history:   unreadable ({e})")];
    }
    let Some(h) = &facts.history else {
        return vec!["  freed history:   none (header.freed is 0)".to_string()];
    };
    let first = if !h.enabled() {
        "  freed history:   off (MEM_TRACE_FREED=0)".to_string()
    } else {
        // Records are claimed by each freeing thread in runs (one shared atomic per run, not
        // per free), so the count is of records claimed, not frees.
        let kept = if h.wrapped() {
            format!("wrapped: keeps the last {}", h.capacity)
        } else {
            "in runs of up to 8 per thread".to_string()
        };
        format!(
            "  freed history:   {} records, {} claimed by freeing threads ({kept})",
            h.capacity, h.written
        )
    };
    let quarantine = if h.quarantine_limit > 0 {
        format!(
            "{} of {} bytes held",
            h.quarantined_bytes, h.quarantine_limit
        )
    } else {
        "off (MEM_TRACE_QUARANTINE=0)".to_string()
    };
    let stacks = if h.free_stacks() {
        "on"
    } else {
        "off (MEM_TRACE_FREE_STACKS=0)"
    };
    vec![
        first,
        format!("  free stacks:     {stacks}"),
        format!("  quarantine:      {quarantine}"),
        format!("  errors reported: {} (double or invalid frees)", h.errors),
    ]
}
