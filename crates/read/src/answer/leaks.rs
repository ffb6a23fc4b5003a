//! The answer of `leaks` (`mtrace-leaks`): the live blocks in memcheck's classes (definitely
//! lost, possibly lost, still reachable: see [`crate::leaks`]), grouped by the stack that
//! allocated them:
//!
//! ```text
//! scanned 100688 bytes of roots (5 objects' data, 2 thread stacks, 2 register sets), reached 16397 of 16497 live blocks
//! definitely lost: 1 stack, biggest first:
//! definitely lost: 100000 bytes in 100 blocks, allocated from:
//!     #0 0x5555555552a9 in leak_site at tests/fixtures/profile_sites.c:332
//! ...
//! SUMMARY: 100000 bytes definitely lost in 100 blocks (direct: 100000 bytes in 100 blocks, indirect: 0 bytes in 0 blocks); 0 bytes possibly lost in 0 blocks; 67294320 bytes still reachable in 16397 blocks
//! ```
//!
//! Definitely lost groups first, then possibly lost ones, then still reachable ones, each
//! class under a line saying it is biggest first; the classes and their totals are those of
//! the profiler's exit report.
//!
//! Biggest first, where `top` and `peaks` put the biggest last, next to the prompt: three
//! lists follow one another here, then the summary, so no order puts the biggest of each
//! next to the prompt. First, each list opens with the stack that matters most (the biggest
//! definite leak is the first stack of the answer), as memcheck and LeakSanitizer list
//! theirs and as the exit report does.

use super::error::AnswerError;
use super::parts::{plural, stack_lines, sum_by_stack, Lookups, StackKind};
use crate::layout::Tables;
use crate::leaks::{roots, Arena, Class, Live, Outcome, Roots, Scan, Total};
use crate::memory::Memory;
use crate::target::{Mapping, Module, ThreadState};
use core::sync::atomic::Ordering::Relaxed;

/// Blocks of one allocation stack, in one class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// The stack id.
    pub stack: u32,
    /// Their bytes.
    pub bytes: u64,
    /// How many.
    pub blocks: u64,
}

/// The scan's result grouped, and what the roots were.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeakFacts {
    /// Definitely lost, by stack, biggest first.
    pub lost: Vec<Group>,
    /// Possibly lost, by stack.
    pub possibly: Vec<Group>,
    /// Still reachable, by stack.
    pub reachable: Vec<Group>,
    /// Bytes of roots scanned.
    pub root_bytes: u64,
    /// Modules whose data were roots.
    pub objects: usize,
    /// Thread stacks scanned.
    pub stacks: usize,
    /// Threads whose registers were scanned.
    pub register_sets: usize,
    /// The program's own mappings scanned (a pool, an interpreter's heap pages).
    pub program: usize,
    /// Bytes of roots or blocks that could not be read.
    pub unreadable: u64,
    /// Blocks the tracer could not record.
    pub untracked: u64,
    /// Of the definitely lost: the indirectly lost ones.
    pub indirect: Total,
}

/// `blocks` of one class summed per stack, biggest first (ties: more blocks, lower id).
pub fn group_by_stack(blocks: &[Live], class: Class) -> Vec<Group> {
    let of_class = blocks.iter().filter(|b| b.class() == class);
    sum_by_stack(of_class.map(|b| (b.stack, b.size, 1)))
        .into_iter()
        .map(|(stack, bytes, blocks)| Group {
            stack,
            bytes,
            blocks,
        })
        .collect()
}

impl LeakFacts {
    /// The facts of a finished scan of `blocks` from `roots`.
    pub fn from_scan(blocks: &[Live], outcome: &Outcome, roots: &Roots, untracked: u64) -> Self {
        LeakFacts {
            lost: group_by_stack(blocks, Class::Lost),
            possibly: group_by_stack(blocks, Class::Possibly),
            reachable: group_by_stack(blocks, Class::Reachable),
            root_bytes: outcome.root_bytes,
            objects: roots.objects,
            stacks: roots.stacks,
            register_sets: roots.register_sets,
            program: roots.program,
            unreadable: outcome.unreadable,
            untracked,
            indirect: outcome.indirect,
        }
    }

    /// Scans the target whose tables are `tables` (header at `header`), with its `modules`,
    /// `mappings` and `threads` for roots ([`crate::leaks::roots`]).
    pub fn read<M: Memory + ?Sized>(
        tables: &Tables<'_, M>,
        header: u64,
        modules: &[Module],
        mappings: &[Mapping],
        threads: &[ThreadState],
    ) -> Result<LeakFacts, AnswerError> {
        let mut blocks: Vec<Live> = tables
            .blocks()?
            .into_iter()
            .map(|b| Live::new(b.addr, b.size, b.stack))
            .collect();
        blocks.sort_unstable_by_key(|b| b.addr);
        blocks.dedup_by_key(|b| b.addr);
        let mem = tables.memory();
        let arena = Arena::read(mem, tables.header().arena as u64);
        let roots = roots(
            mem,
            header,
            modules,
            mappings,
            threads,
            &blocks,
            arena.as_ref(),
        );
        let n = blocks.len();
        let mut scan = Scan::new(mem, &mut blocks).ok_or(AnswerError::OutOfMemory(n))?;
        scan.words(&roots.words);
        for r in &roots.ranges {
            scan.root(*r);
        }
        let outcome = scan.finish();
        let untracked = tables.header().untracked.load(Relaxed);
        Ok(LeakFacts::from_scan(&blocks, &outcome, &roots, untracked))
    }
}

fn total(groups: &[Group]) -> (u64, u64) {
    (
        groups.iter().map(|g| g.bytes).sum(),
        groups.iter().map(|g| g.blocks).sum(),
    )
}

/// The groups of one class under a line giving their number and order: the first `limit`
/// (`None`: all), then one line for the rest. Nothing for a class without groups.
fn group_lines(
    class: Class,
    groups: &[Group],
    limit: Option<usize>,
    lookups: &mut Lookups<'_>,
    max_frames: Option<usize>,
) -> Vec<String> {
    let kind = class.name();
    let shown = &groups[..limit.unwrap_or(groups.len()).min(groups.len())];
    let mut out = Vec::new();
    if !groups.is_empty() {
        out.push(format!(
            "{kind}: {}, biggest first:",
            plural(groups.len() as u64, "stack")
        ));
    }
    for g in shown {
        out.push(format!(
            "{kind}: {} in {}, allocated from:",
            plural(g.bytes, "byte"),
            plural(g.blocks, "block")
        ));
        out.extend(stack_lines(
            lookups,
            g.stack,
            max_frames,
            StackKind::Allocation,
            None,
        ));
    }
    if shown.len() < groups.len() {
        let (bytes, blocks) = total(&groups[shown.len()..]);
        out.push(format!(
            "({kind}: {} with {} in {}; -n 0 shows all)",
            plural((groups.len() - shown.len()) as u64, "more stack"),
            plural(bytes, "byte"),
            plural(blocks, "block")
        ));
    }
    out
}

/// Definitely lost (`bytes` in `blocks`) split as memcheck splits it, of which `indirect`
/// is indirectly lost: `direct: B bytes in N blocks, indirect: B bytes in N blocks`.
pub fn split(bytes: u64, blocks: u64, indirect: Total) -> String {
    format!(
        "direct: {} in {}, indirect: {} in {}",
        plural(bytes.saturating_sub(indirect.bytes), "byte"),
        plural(blocks.saturating_sub(indirect.blocks), "block"),
        plural(indirect.bytes, "byte"),
        plural(indirect.blocks, "block")
    )
}

/// The answer: roots, definitely lost groups, possibly lost groups, still reachable groups
/// (unless `reachable` is off), the summary; `limit` groups of each class (`None`: all), at
/// most `max_frames` frames per stack (`None`: all).
pub fn lines(
    facts: &LeakFacts,
    lookups: &mut Lookups<'_>,
    limit: Option<usize>,
    max_frames: Option<usize>,
    reachable: bool,
) -> Vec<String> {
    let (lost_bytes, lost_blocks) = total(&facts.lost);
    let (maybe_bytes, maybe_blocks) = total(&facts.possibly);
    let (kept_bytes, kept_blocks) = total(&facts.reachable);
    // The program's own mappings only where there are some: most programs map none.
    let program = match facts.program {
        0 => String::new(),
        n => format!(", {}", plural(n as u64, "program mapping")),
    };
    let roots = format!(
        "{}' data{program}, {}, {}",
        plural(facts.objects as u64, "object"),
        plural(facts.stacks as u64, "thread stack"),
        plural(facts.register_sets as u64, "register set")
    );
    let mut first = format!(
        "scanned {} of roots ({roots}), reached {} of {}",
        plural(facts.root_bytes, "byte"),
        kept_blocks + maybe_blocks,
        plural(kept_blocks + maybe_blocks + lost_blocks, "live block")
    );
    if maybe_blocks > 0 {
        first += &format!(" ({maybe_blocks} only through interior pointers)");
    }
    let mut out = vec![first];
    if facts.unreadable > 0 {
        out.push(format!(
            "({} of roots or blocks could not be read and were not scanned: blocks they point \
             to may be reported lost)",
            plural(facts.unreadable, "byte")
        ));
    }
    if facts.lost.is_empty() {
        out.push("no block is definitely lost".to_string());
    }
    out.extend(group_lines(
        Class::Lost,
        &facts.lost,
        limit,
        lookups,
        max_frames,
    ));
    out.extend(group_lines(
        Class::Possibly,
        &facts.possibly,
        limit,
        lookups,
        max_frames,
    ));
    if reachable {
        out.extend(group_lines(
            Class::Reachable,
            &facts.reachable,
            limit,
            lookups,
            max_frames,
        ));
    }
    out.push(format!(
        "SUMMARY: {} definitely lost in {} ({}); {} possibly lost in {}; {} still reachable in {}",
        plural(lost_bytes, "byte"),
        plural(lost_blocks, "block"),
        split(lost_bytes, lost_blocks, facts.indirect),
        plural(maybe_bytes, "byte"),
        plural(maybe_blocks, "block"),
        plural(kept_bytes, "byte"),
        plural(kept_blocks, "block")
    ));
    if facts.untracked > 0 {
        out.push(format!(
            "({} could not be tracked and are not counted)",
            plural(facts.untracked, "block")
        ));
    }
    out
}
