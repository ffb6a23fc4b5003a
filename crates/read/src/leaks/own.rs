//! The program's own anonymous writable memory as roots of a scan from outside, as memcheck
//! scans it and the exit report does (crates/core/src/profile/leaks.rs, `program_mappings`): a
//! pool or an interpreter's heap pages (CPython's object arenas, Ruby's) hold pointers to
//! blocks, and without them those blocks would be "definitely lost".
//!
//! Left out, as there: what is not the program's data. The tracer's memory (its arena's pages,
//! marked in the bitmap the header's `arena` describes, its scratch region and the bitmap's
//! leaves: its tables hold every block's address); glibc's heaps (the program break and other
//! arenas' 64 MiB heaps, which hold live blocks, and `mmap`ed chunks: freed chunks there hold
//! stale pointers, and live blocks are reached as blocks); thread stacks (read from their
//! stack pointers by `roots`); the modules' segments (scanned already); pages never touched.
//! A library older than the arena map describes nothing, and then nothing here is read.

use super::types::{Live, Root};
use crate::memory::{read_plain, read_words, Memory};
use crate::target::Mapping;
use mem_trace_format::{ArenaMap, ARENA_LEAF_BITS, ARENA_LEAVES, ARENA_PAGE_BITS};

const PAGE: u64 = 1 << ARENA_PAGE_BITS;
/// A non-main glibc arena's heap: aligned to, and at most, this size.
const HEAP_MAX: u64 = 64 << 20;

/// The tracer's memory as its arena map describes it.
pub struct Arena {
    /// (leaf index, leaf address) of every leaf the directory has.
    leaves: Vec<(u64, u64)>,
    /// The scratch region, `[lo, hi)`; empty when none.
    scratch: (u64, u64),
}

impl Arena {
    /// The arena map at `at` (the header's `arena`), read; `None` for a null one or one that
    /// cannot be read.
    pub fn read<M: Memory + ?Sized>(mem: &M, at: u64) -> Option<Arena> {
        if at == 0 {
            return None;
        }
        let map: ArenaMap = read_plain(mem, at).ok()?;
        let directory = map.directory as u64;
        let words = read_words(mem, directory, ARENA_LEAVES).ok()?;
        let leaves = (0u64..).zip(words).filter(|&(_, leaf)| leaf != 0).collect();
        let base = map.scratch_base.into_inner();
        let len = map.scratch_len.into_inner();
        Some(Arena {
            leaves,
            scratch: (base, base.saturating_add(len)),
        })
    }

    /// The runs of pages of `[lo, hi)` (page-aligned) that are not the tracer's.
    fn not_ours<M: Memory + ?Sized>(&self, mem: &M, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        const LEAF_BYTES: u64 = (1u64 << ARENA_LEAF_BITS) / 8;
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut push = |a: u64, b: u64| match out.last_mut() {
            Some(last) if last.1 == a => last.1 = b,
            _ => out.push((a, b)),
        };
        let mut at = lo;
        while at < hi {
            // One leaf's worth at most: its bits are read in one go.
            let leaf_index = at >> (ARENA_PAGE_BITS + ARENA_LEAF_BITS);
            let leaf_end = (leaf_index + 1) << (ARENA_PAGE_BITS + ARENA_LEAF_BITS);
            let end = hi.min(leaf_end);
            let bits = self
                .leaves
                .iter()
                .find(|&&(i, _)| i == leaf_index)
                .and_then(|&(_, leaf)| {
                    let first = (at >> ARENA_PAGE_BITS) & ((1 << ARENA_LEAF_BITS) - 1);
                    let last = ((end - 1) >> ARENA_PAGE_BITS) & ((1 << ARENA_LEAF_BITS) - 1);
                    let words = read_words(
                        mem,
                        leaf + first / 64 * 8,
                        (last / 64 - first / 64 + 1) as usize,
                    );
                    words.ok().map(|w| (first / 64 * 64, w))
                });
            let mut page = at;
            while page < end {
                let in_scratch = self.scratch.0 <= page && page < self.scratch.1;
                let in_leaf = self
                    .leaves
                    .iter()
                    .any(|&(_, leaf)| leaf <= page && page < leaf + LEAF_BYTES);
                let marked = bits.as_ref().is_some_and(|(base, words)| {
                    let i = ((page >> ARENA_PAGE_BITS) & ((1 << ARENA_LEAF_BITS) - 1)) - base;
                    words
                        .get((i / 64) as usize)
                        .is_some_and(|w| w & (1 << (i % 64)) != 0)
                });
                if !(in_scratch || in_leaf || marked) {
                    push(page, page + PAGE);
                }
                page += PAGE;
            }
            at = end;
        }
        out
    }
}

/// The program's own mappings among `mappings` as roots (see the module documentation).
/// `blocks` are the live blocks by address; `stacks` the threads' stack pointers and the
/// ranges already scanned as stacks; `modules` the modules' ranges.
pub fn program_roots<M: Memory + ?Sized>(
    mem: &M,
    arena: &Arena,
    mappings: &[Mapping],
    blocks: &[Live],
    stacks: &[Root],
    sps: &[u64],
    modules: &[(u64, u64)],
) -> Vec<Root> {
    let mut out = Vec::new();
    for m in mappings {
        let anonymous = m.name.is_empty() || m.name.starts_with("[anon:");
        if !m.read || !m.write || m.exec || !anonymous || m.end <= m.start {
            continue;
        }
        let (lo, hi) = (m.start, m.end);
        if sps.iter().any(|&sp| lo <= sp && sp < hi)
            || stacks.iter().any(|r| r.lo < hi && lo < r.hi)
        {
            continue;
        }
        let mut at = lo;
        // glibc's `mmap`ed chunks, one after the other where the kernel merged their mappings.
        while let Some(size) = mmapped_chunk(mem, at, hi) {
            at += size;
        }
        if at >= hi || glibc_heap(mem, at, hi) || holds_a_block(blocks, at, hi) {
            continue;
        }
        // The modules' segments may share a mapping with the program's, where the kernel
        // merged neighbours: only they are left out.
        let mut cuts: Vec<(u64, u64)> = modules
            .iter()
            .filter(|&&(a, b)| a < hi && at < b)
            .map(|&(a, b)| (a.max(at), b.min(hi)))
            .collect();
        cuts.sort_unstable();
        let mut pieces = Vec::new();
        for (a, b) in cuts {
            if at < a {
                pieces.push((at, a));
            }
            at = at.max(b);
        }
        if at < hi {
            pieces.push((at, hi));
        }
        for (a, b) in pieces {
            for (p, q) in arena.not_ours(mem, a & !(PAGE - 1), b.next_multiple_of(PAGE)) {
                for (r, s) in mem.resident(p.max(a), q.min(b)) {
                    out.push(Root::range(r, s));
                }
            }
        }
    }
    out
}

/// The size of the glibc `mmap`ed chunk at `at` (page-aligned, its header's size word with
/// `IS_MMAPPED` set and within `[at, hi)`), if one starts there. (The exit report asks the
/// same of its own memory.)
pub fn mmapped_chunk<M: Memory + ?Sized>(mem: &M, at: u64, hi: u64) -> Option<u64> {
    let head = read_words(mem, at, 2).ok()?;
    let (prev, size) = (head[0], head[1]);
    let bytes = size & !7;
    (size & 2 != 0 && prev == 0 && bytes >= PAGE && bytes % PAGE == 0 && bytes <= hi - at)
        .then_some(bytes)
}

/// Whether a glibc heap of a non-main arena starts at a 64 MiB-aligned address in `[lo, hi)`:
/// its `heap_info` (arena, previous heap, size, protected size) is there.
pub fn glibc_heap<M: Memory + ?Sized>(mem: &M, lo: u64, hi: u64) -> bool {
    let mut a = lo.next_multiple_of(HEAP_MAX);
    while a < hi {
        if let Ok(info) = read_words(mem, a, 4) {
            let (arena, size, protected) = (info[0], info[2], info[3]);
            if arena != 0
                && (PAGE..=HEAP_MAX).contains(&size)
                && (size..=HEAP_MAX).contains(&protected)
            {
                return true;
            }
        }
        a += HEAP_MAX;
    }
    false
}

/// Whether a live block starts in `[lo, hi)` (`blocks` sorted by address).
fn holds_a_block(blocks: &[Live], lo: u64, hi: u64) -> bool {
    let i = blocks.partition_point(|b| b.addr < lo);
    blocks.get(i).is_some_and(|b| b.addr < hi)
}
