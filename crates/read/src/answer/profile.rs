//! The answers of `top` and `peaks` (`mtrace-top`, `mtrace-peaks`): where the memory is, and
//! where it was at the peak, from the profiler's per-stack counters (docs/LAYOUT.md
//! "Profile"). A ranking reads like a
//! heap profiler's, biggest LAST so that it is the line left on the screen after a long list:
//!
//! ```text
//! live: 69338456 bytes in 16496 blocks; peak: 77826048 bytes; phase 1 (no reset)
//! top 2 of 9 stacks by live bytes, biggest last:
//! # 1: 131072 bytes in 1 block
//!     #0 0x5555555552a9 in hold_array_site at /src/profile_sites.c:52
//! # 0: 67108864 bytes in 16384 blocks
//!     #0 0x5555555552c5 in hold_site at /src/profile_sites.c:57
//! ```
//!
//! Counts are the shared record plus every thread's cached deltas; a live process may be
//! caught mid-update (a stack counted twice or not at all for an instant), a core is exact.

use super::error::AnswerError;
pub use super::error::NOT_PROFILER;
use super::parts::{
    plural, stack_lines, sum_by_stack, thread_details, thread_text, Lookups, StackKind,
};
use crate::layout::{checked_sum, Tables, Thread, SUM_LINE};
use crate::memory::Memory;
use crate::profile::Peaks;
use mem_trace_format::{non_negative as positive, Counts};
use std::collections::BTreeMap;

/// What a ranking counts (`--by`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum By {
    /// Bytes in live blocks.
    #[default]
    Live,
    /// Bytes ever allocated, freed or not.
    Allocated,
    /// Live blocks.
    Blocks,
    /// Bytes held at the global peak.
    Peak,
}

impl By {
    /// Every choice, with the word `--by` takes.
    pub const ALL: [(By, &'static str); 4] = [
        (By::Live, "live"),
        (By::Allocated, "allocated"),
        (By::Blocks, "blocks"),
        (By::Peak, "peak"),
    ];

    /// What the answer calls it.
    pub fn title(self) -> &'static str {
        match self {
            By::Live => "live bytes",
            By::Allocated => "bytes ever allocated",
            By::Blocks => "live blocks",
            By::Peak => "bytes at the peak",
        }
    }
}

/// One stack's line of a ranking: what the ranking counts, plus its live bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ranked {
    /// The stack id.
    pub stack: u32,
    /// Bytes counted.
    pub bytes: u64,
    /// Blocks counted.
    pub blocks: u64,
    /// Its live bytes now.
    pub live_bytes: u64,
}

/// Biggest first; ties: more blocks (more bytes under `--by blocks`), then the older stack.
fn sort(ranked: &mut [Ranked], by: By) {
    if by == By::Blocks {
        ranked.sort_by_key(|r| (core::cmp::Reverse((r.blocks, r.bytes)), r.stack));
    } else {
        ranked.sort_by_key(|r| (core::cmp::Reverse((r.bytes, r.blocks)), r.stack));
    }
}

/// Every stack with something to count under `by`, biggest first.
pub fn rank(counts: &BTreeMap<u32, Counts>, by: By) -> Vec<Ranked> {
    let mut out: Vec<Ranked> = counts
        .iter()
        .map(|(&stack, c)| {
            let live = positive(c.live_bytes);
            let (bytes, blocks) = match by {
                By::Live | By::Blocks => (live, positive(c.live_blocks)),
                By::Allocated => (positive(c.total_bytes), positive(c.total_blocks)),
                By::Peak => (positive(c.peak_bytes), positive(c.peak_blocks)),
            };
            Ranked {
                stack,
                bytes,
                blocks,
                live_bytes: live,
            }
        })
        .filter(|r| r.bytes > 0 || r.blocks > 0)
        .collect();
    sort(&mut out, by);
    out
}

/// The global figures every profile answer starts with; [`NOT_PROFILER`] without them.
pub fn require_profiler<M: Memory + ?Sized>(tables: &Tables<'_, M>) -> Result<Peaks, AnswerError> {
    tables.peaks()?.ok_or(AnswerError::NotProfiler)
}

/// What a ranking needs: the process-wide figures and the ranked stacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopFacts {
    /// Live bytes, the peak, the resets.
    pub peaks: Peaks,
    /// Live blocks, all threads together.
    pub live_blocks: u64,
    /// What the ranking counts.
    pub by: By,
    /// The stacks, biggest first.
    pub ranked: Vec<Ranked>,
    /// `--thread`: its index, and its live bytes and blocks from the live-block table.
    pub thread: Option<u32>,
    /// Live bytes of `thread`.
    pub thread_bytes: u64,
    /// Live blocks of `thread`.
    pub thread_blocks: u64,
    /// The [`inconsistencies`] lines.
    pub inconsistent: Vec<String>,
}

impl TopFacts {
    /// Reads them, ranked `by`; with `thread`, only the live blocks that thread allocated,
    /// from the live-block table (the counters are per stack, not per thread), which knows
    /// live blocks only: `thread` works with [`By::Live`] and [`By::Blocks`].
    pub fn read<M: Memory + ?Sized>(
        tables: &Tables<'_, M>,
        by: By,
        thread: Option<u32>,
    ) -> Result<TopFacts, AnswerError> {
        if thread.is_some() {
            thread_counts_by(by)?;
        }
        let peaks = require_profiler(tables)?;
        let counts = tables.stack_counts()?.unwrap_or_default();
        let (live_blocks, wrapped) = live_blocks(tables, &counts)?;
        let mut inconsistent = inconsistencies(&peaks, &tables.threads()?, &counts);
        inconsistent.extend(wrapped.then(|| SUM_LINE.to_string()));
        inconsistent.extend(estimated_line(tables));
        let Some(index) = thread else {
            return Ok(TopFacts {
                peaks,
                live_blocks,
                by,
                ranked: rank(&counts, by),
                thread: None,
                thread_bytes: 0,
                thread_blocks: 0,
                inconsistent,
            });
        };
        let mut ranked: Vec<Ranked> = thread_live(tables, index)?
            .into_iter()
            .map(|(stack, bytes, blocks)| Ranked {
                stack,
                bytes,
                blocks,
                live_bytes: bytes,
            })
            .collect();
        sort(&mut ranked, by);
        Ok(TopFacts {
            peaks,
            live_blocks,
            by,
            thread_bytes: ranked.iter().fold(0, |n, r| n.saturating_add(r.bytes)),
            thread_blocks: ranked.iter().fold(0, |n, r| n.saturating_add(r.blocks)),
            ranked,
            thread: Some(index),
            inconsistent,
        })
    }
}

/// Live blocks now: the table's count, or under sampling or with tagged blocks the counters'
/// sum; and whether
/// the counts summed past 2^64 or below zero ([`checked_sum`]).
fn live_blocks<M: Memory + ?Sized>(
    tables: &Tables<'_, M>,
    counts: &BTreeMap<u32, Counts>,
) -> Result<(u64, bool), AnswerError> {
    // Tagged blocks are in no shard's count, and counting them means a scan of the heap:
    // the stack counters count every block.
    if tables.sample_mean() == 0 && tables.tag_key() == 0 {
        let totals = tables.totals()?;
        return Ok((totals.blocks, totals.wrapped));
    }
    // A stack's count below zero is flagged on its own line (`inconsistencies`) and counts
    // as zero here.
    Ok(checked_sum(
        counts.values().map(|c| positive(c.live_blocks)),
    ))
}

/// The line that says the numbers are estimates, under sampling.
pub fn estimated_line<M: Memory + ?Sized>(tables: &Tables<'_, M>) -> Option<String> {
    match tables.sample_mean() {
        0 => None,
        mean => Some(format!(
            "estimated from sampled allocations: this process samples {} (MEM_TRACE_SAMPLE)",
            crate::sample::rate(mean)
        )),
    }
}

/// Whether a per-thread ranking can count `by`: the live-block table it reads knows live
/// blocks only, so `--thread` works with [`By::Live`] and [`By::Blocks`].
pub fn thread_counts_by(by: By) -> Result<(), AnswerError> {
    match by {
        By::Live | By::Blocks => Ok(()),
        By::Allocated | By::Peak => Err(AnswerError::Usage(format!(
            "--thread counts the live blocks of the live-block table, which knows nothing of {} \
             per thread: use --by live or --by blocks",
            by.title()
        ))),
    }
}

/// The live blocks thread `index` allocated, summed per stack as `(stack, bytes, blocks)`,
/// biggest first, from the live-block table (the counters are per stack, not per thread).
pub fn thread_live<M: Memory + ?Sized>(
    tables: &Tables<'_, M>,
    index: u32,
) -> Result<Vec<(u32, u64, u64)>, AnswerError> {
    let count = tables.thread_count()?;
    if index == 0 || u64::from(index) > count {
        return Err(AnswerError::Usage(format!(
            "no thread {index}: the tracer has seen threads 1..{count} (mtrace-peaks lists them)"
        )));
    }
    let blocks = tables.blocks()?;
    let mine = blocks.iter().filter(|b| b.thread == index);
    Ok(sum_by_stack(mine.map(|b| {
        let (bytes, count) = tables.counted(b);
        (b.stack, bytes, count)
    })))
}

/// What no consistent tables hold, one line each: global or per-thread live bytes above
/// their peak (a count that went below zero reads as a number near 2^64, above any peak), and
/// stacks whose counters sum below zero or to more live than ever allocated (sums that
/// wrapped). A core is exact, so there they mean corrupt tables; a running process may also
/// be caught between two of its updates.
pub fn inconsistencies(
    peaks: &Peaks,
    threads: &[(u32, Thread)],
    counts: &BTreeMap<u32, Counts>,
) -> Vec<String> {
    let mut out = Vec::new();
    if peaks.live_bytes > peaks.peak_bytes {
        out.push(format!(
            "inconsistent tables: live bytes {} above the peak {}",
            peaks.live_bytes, peaks.peak_bytes
        ));
    }
    for (index, t) in threads {
        if t.live_bytes > t.peak_bytes {
            out.push(format!(
                "inconsistent tables: {} live bytes {} above its peak {}",
                thread_text(*index),
                t.live_bytes,
                t.peak_bytes
            ));
        }
    }
    let negative = |n: u64| (n as i64) < 0;
    let wrong: Vec<u32> = counts
        .iter()
        .filter(|(_, c)| {
            [
                c.live_bytes,
                c.live_blocks,
                c.total_bytes,
                c.total_blocks,
                c.peak_bytes,
                c.peak_blocks,
            ]
            .into_iter()
            .any(negative)
                || c.live_bytes > c.total_bytes
                || c.live_blocks > c.total_blocks
        })
        .map(|(&stack, _)| stack)
        .collect();
    if let Some(first) = wrong.first() {
        out.push(format!(
            "inconsistent tables: the counters of {} sum below zero or to more live than ever \
             allocated (stack {first} first)",
            plural(wrong.len() as u64, "stack")
        ));
    }
    out
}

/// `phase 1 (no reset)`: the phase is one more than the resets so far.
fn phase_text(resets: u64) -> String {
    let what = if resets == 0 {
        "no reset".to_string()
    } else {
        plural(resets, "reset")
    };
    format!("phase {} ({what})", resets + 1)
}

/// `# 0: 67108864 bytes in 16384 blocks` and what the ranking adds.
fn entry_line(k: usize, r: &Ranked, by: By) -> String {
    let mut text = format!(
        "# {k}: {} in {}",
        plural(r.bytes, "byte"),
        plural(r.blocks, "block")
    );
    match by {
        By::Allocated => text += &format!(" allocated ({} live)", plural(r.live_bytes, "byte")),
        By::Peak => text += &format!(" at the peak ({} live now)", plural(r.live_bytes, "byte")),
        By::Live | By::Blocks => {}
    }
    text
}

/// The title and the top `n` entries, each with its stack, biggest (`# 0`) last.
fn ranking_lines(
    ranked: &[Ranked],
    by: By,
    n: usize,
    lookups: &mut Lookups<'_>,
    max_frames: Option<usize>,
    what: &str,
) -> Vec<String> {
    let top = &ranked[..n.min(ranked.len())];
    if top.is_empty() {
        return vec![format!("no stack has {}{what}", by.title())];
    }
    let mut out = vec![format!(
        "top {} of {} by {}{what}, biggest last:",
        top.len(),
        plural(ranked.len() as u64, "stack"),
        by.title()
    )];
    for (k, r) in top.iter().enumerate().rev() {
        out.push(entry_line(k, r, by));
        out.extend(stack_lines(
            lookups,
            r.stack,
            max_frames,
            StackKind::Allocation,
            None,
        ));
    }
    out
}

/// The answer of `top`: the `n` biggest stacks, at most `max_frames` frames each (`None`:
/// all).
pub fn top_lines(
    facts: &TopFacts,
    lookups: &mut Lookups<'_>,
    n: usize,
    max_frames: Option<usize>,
) -> Vec<String> {
    let p = &facts.peaks;
    let mut out = vec![format!(
        "live: {} in {}; peak: {}; {}",
        plural(p.live_bytes, "byte"),
        plural(facts.live_blocks, "block"),
        plural(p.peak_bytes, "byte"),
        phase_text(p.resets)
    )];
    out.extend(facts.inconsistent.iter().cloned());
    let mut what = String::new();
    if let Some(t) = facts.thread {
        out.push(format!(
            "{}{}: {} in {} (from the live-block table)",
            thread_text(t),
            thread_details(lookups, t),
            plural(facts.thread_bytes, "byte"),
            plural(facts.thread_blocks, "live block")
        ));
        what = format!(" allocated by {}", thread_text(t));
    }
    out.extend(ranking_lines(
        &facts.ranked,
        facts.by,
        n,
        lookups,
        max_frames,
        &what,
    ));
    out
}

/// The global and per-thread peaks, and the stacks ranked by bytes at the peak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeaksFacts {
    /// Live bytes, the peak, the resets.
    pub peaks: Peaks,
    /// Live blocks, all threads together.
    pub live_blocks: u64,
    /// Every thread record, by index (exited threads keep theirs).
    pub threads: Vec<(u32, Thread)>,
    /// The stacks by bytes at the peak, biggest first.
    pub ranked: Vec<Ranked>,
    /// The [`inconsistencies`] lines.
    pub inconsistent: Vec<String>,
}

impl PeaksFacts {
    /// Reads them.
    pub fn read<M: Memory + ?Sized>(tables: &Tables<'_, M>) -> Result<PeaksFacts, AnswerError> {
        let peaks = require_profiler(tables)?;
        let threads = tables.threads()?;
        let counts = tables.stack_counts()?.unwrap_or_default();
        let (live_blocks, wrapped) = live_blocks(tables, &counts)?;
        let mut inconsistent = inconsistencies(&peaks, &threads, &counts);
        inconsistent.extend(wrapped.then(|| SUM_LINE.to_string()));
        inconsistent.extend(estimated_line(tables));
        Ok(PeaksFacts {
            peaks,
            live_blocks,
            inconsistent,
            threads,
            ranked: rank(&counts, By::Peak),
        })
    }
}

/// `  thread 2, tid 4243 "worker", exited: live 0 bytes, peak ..., allocated ...`.
fn thread_line(lookups: &Lookups<'_>, index: u32, t: &Thread) -> String {
    format!(
        "  {}{}: live {}, peak {}, allocated {}",
        thread_text(index),
        thread_details(lookups, index),
        plural(t.live_bytes, "byte"),
        plural(t.peak_bytes, "byte"),
        plural(t.allocated_bytes, "byte")
    )
}

/// The answer of `peaks`: the figures, every thread's, and the `n` stacks that held the most
/// at the peak, at most `max_frames` frames each (`None`: all).
pub fn peaks_lines(
    facts: &PeaksFacts,
    lookups: &mut Lookups<'_>,
    n: usize,
    max_frames: Option<usize>,
) -> Vec<String> {
    let p = &facts.peaks;
    let since = if p.resets == 0 {
        "since the start"
    } else {
        "since the last reset"
    };
    let mut out = vec![
        format!(
            "live now: {} in {}",
            plural(p.live_bytes, "byte"),
            plural(facts.live_blocks, "block")
        ),
        format!(
            "peak: {} (at event #{}, {since})",
            plural(p.peak_bytes, "byte"),
            p.peak_seq
        ),
        phase_text(p.resets),
    ];
    out.extend(facts.inconsistent.iter().cloned());
    out.push(format!("threads: {}", facts.threads.len()));
    out.extend(
        facts
            .threads
            .iter()
            .map(|(i, t)| thread_line(lookups, *i, t)),
    );
    out.extend(ranking_lines(
        &facts.ranked,
        By::Peak,
        n,
        lookups,
        max_frames,
        "",
    ));
    out
}
