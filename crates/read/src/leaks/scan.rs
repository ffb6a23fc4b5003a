//! The scan itself: roots first, then the worklist of blocks whose level rose.
//!
//! Speed matters (a process holds millions of words, and the profiler's exit report runs it):
//! memory is read in 1 MiB chunks or, for small blocks, up to 1024 blocks per
//! [`Memory::read_spans`]; a word is looked up only when it lies between the lowest block start
//! and the highest block end, by binary search on a copy of the sorted starts. All buffers are
//! allocated once, in [`Scan::new`]; only the worklist grows.

use super::types::{glibc_next_header, Live, Outcome, Root, Total, LOST, POSSIBLY, REACHABLE};
use crate::memory::{Memory, Span};

/// Bytes read at once.
const BUF: usize = 1 << 20;
const PAGE: u64 = 4096;
/// Blocks read in one [`Memory::read_spans`].
const BATCH: usize = 1024;

/// A scan of `blocks` in `mem`: feed it the roots ([`Scan::root`], [`Scan::words`]), then
/// [`Scan::finish`] leaves each block's class in it.
pub struct Scan<'a, M: Memory + ?Sized> {
    mem: &'a M,
    marks: Marks<'a>,
    buf: Vec<u8>,
    /// The spans of one batch of blocks, and each one's (index, level) when it was queued.
    spans: Vec<Span>,
    batch: Vec<(u32, u8)>,
    root_bytes: u64,
    unreadable: u64,
}

/// The blocks, and what marking them needs.
struct Marks<'a> {
    blocks: &'a mut [Live],
    /// The blocks' start addresses (a copy, for a cache-friendly binary search).
    starts: Vec<u64>,
    /// The first block's start, and one past the end of the last block: no value outside
    /// points into one.
    min: u64,
    end: u64,
    /// Blocks whose level rose and whose words are still to scan.
    work: Vec<u32>,
    /// Splitting the lost blocks ([`Scan::cliques`]): pointers mark lost blocks indirect,
    /// all but `leader`, the block the clique started from.
    clique: bool,
    leader: u32,
}

impl<'a, M: Memory + ?Sized> Scan<'a, M> {
    /// A scan of `blocks`, which must be sorted by address, each address once (live blocks do
    /// not overlap), and not reached yet. `None` when out of memory.
    pub fn new(mem: &'a M, blocks: &'a mut [Live]) -> Option<Self> {
        debug_assert!(blocks.windows(2).all(|w| w[0].addr < w[1].addr));
        let mut starts = Vec::new();
        starts.try_reserve_exact(blocks.len()).ok()?;
        starts.extend(blocks.iter().map(|b| b.addr));
        let mut buf = Vec::new();
        buf.try_reserve_exact(BUF).ok()?;
        buf.resize(BUF, 0);
        let mut spans = Vec::new();
        spans.try_reserve_exact(BATCH).ok()?;
        let mut batch = Vec::new();
        batch.try_reserve_exact(BATCH).ok()?;
        let mut work = Vec::new();
        work.try_reserve(1024).ok()?;
        let min = blocks.first().map_or(0, |b| b.addr);
        let end = blocks.last().map_or(0, |b| b.addr.saturating_add(b.size));
        Some(Scan {
            mem,
            marks: Marks {
                blocks,
                starts,
                min,
                end,
                work,
                clique: false,
                leader: 0,
            },
            buf,
            spans,
            batch,
            root_bytes: 0,
            unreadable: 0,
        })
    }

    /// Loose words found at the highest level (a thread's registers).
    pub fn words(&mut self, words: &[u64]) {
        for &w in words {
            self.marks.mark(w, REACHABLE);
        }
    }

    /// Scans a root at the highest level.
    pub fn root(&mut self, r: Root) {
        let (lo, hi) = aligned(r.lo, r.hi);
        if hi <= lo {
            return;
        }
        self.root_bytes += hi - lo;
        if !r.downward {
            self.upward(lo, hi, REACHABLE);
            return;
        }
        // From the top down, a chunk at a time, until the first unreadable page.
        let mut top = hi;
        while top > lo {
            let start = top.saturating_sub(BUF as u64).max(lo);
            if self.range(start, top, REACHABLE) {
                top = start;
                continue;
            }
            // Something below is unmapped: page by page down to it.
            while top > start {
                let page = ((top - 1) & !(PAGE - 1)).max(start);
                if !self.range(page, top, REACHABLE) {
                    return;
                }
                top = page;
            }
        }
    }

    /// Scans the blocks whose level rose until none is left; each block's class is then in
    /// the slice given to [`Scan::new`].
    pub fn finish(mut self) -> Outcome {
        self.drain();
        self.cliques();
        let mut out = Outcome {
            root_bytes: self.root_bytes,
            unreadable: self.unreadable,
            ..Outcome::default()
        };
        for b in self.marks.blocks.iter() {
            let t: &mut Total = match b.level {
                LOST => &mut out.lost,
                POSSIBLY => &mut out.possibly,
                _ => &mut out.reachable,
            };
            t.bytes += b.size;
            t.blocks += 1;
            if b.indirect {
                out.indirect.bytes += b.size;
                out.indirect.blocks += 1;
            }
        }
        out
    }

    /// Splits the definitely lost blocks into directly and indirectly lost, as memcheck
    /// does (see the module documentation): in address order, each lost block not yet
    /// marked indirect leads a clique; every lost block its memory reaches, through any
    /// pointer and transitively, is marked indirect, unless it is the leader itself.
    fn cliques(&mut self) {
        // Lost blocks that cannot be read hide nothing reachable: not counted as unreadable.
        let unreadable = self.unreadable;
        self.marks.clique = true;
        for i in 0..self.marks.blocks.len() {
            let b = self.marks.blocks[i];
            if b.level != LOST || b.indirect {
                continue;
            }
            self.marks.leader = i as u32;
            if self.marks.work.try_reserve(1).is_err() {
                break;
            }
            self.marks.work.push(i as u32);
            self.drain();
        }
        self.marks.clique = false;
        self.unreadable = unreadable;
    }

    /// Scans the aligned `[lo, hi)` at level `from` in chunks; a chunk that cannot be read is
    /// read again page by page, and the pages that still cannot are counted.
    fn upward(&mut self, lo: u64, hi: u64, from: u8) {
        // A block lies in one mapping: what its recorded size claims past the end of the one
        // holding its start (a size the program scribbled over) is not read at all, where a
        // page-by-page retry would take hours over a terabyte.
        let hi = match self.mem.extent_holds(lo, hi - lo) {
            Ok(()) => hi,
            Err(extent) => {
                self.unreadable += hi - lo - extent;
                lo + extent
            }
        };
        let mut at = lo;
        while at < hi {
            let end = (at + BUF as u64).min(hi);
            if !self.range(at, end, from) {
                let mut page = at;
                while page < end {
                    let next = ((page + PAGE) & !(PAGE - 1)).min(end);
                    if !self.range(page, next, from) {
                        self.unreadable += next - page;
                    }
                    page = next;
                }
            }
            at = end;
        }
    }

    /// Reads `[lo, hi)` (at most [`BUF`] bytes) and scans it; false if it could not be read.
    fn range(&mut self, lo: u64, hi: u64, from: u8) -> bool {
        let buf = &mut self.buf[..(hi - lo) as usize];
        if self.mem.read(lo, buf).is_err() {
            return false;
        }
        self.marks.scan(buf, from);
        true
    }

    /// Scans the blocks whose level rose, until none is left. Small blocks are read many at
    /// a time, large ones in chunks.
    fn drain(&mut self) {
        while let Some(&top) = self.marks.work.last() {
            let b = self.marks.blocks[top as usize];
            let (lo, hi) = aligned(b.addr, b.addr.saturating_add(b.size));
            if hi.saturating_sub(lo) as usize > BUF / 4 {
                self.marks.work.pop();
                self.upward(lo, hi, b.level);
                continue;
            }
            self.spans.clear();
            self.batch.clear();
            let mut total = 0usize;
            while let Some(&i) = self.marks.work.last() {
                let b = self.marks.blocks[i as usize];
                let (lo, hi) = aligned(b.addr, b.addr.saturating_add(b.size));
                let len = hi.saturating_sub(lo) as usize;
                if self.spans.len() == BATCH || len > BUF / 4 || total + len > BUF {
                    break;
                }
                self.marks.work.pop();
                if len == 0 {
                    continue;
                }
                self.spans.push(Span { addr: lo, len });
                self.batch.push((i, b.level));
                total += len;
            }
            self.read_batch();
        }
    }

    /// Reads and scans the blocks of `spans`; one that cannot be read is skipped (freed and
    /// unmapped meanwhile, or missing from a core) and counted, and the rest read after it.
    fn read_batch(&mut self) {
        let n = self.spans.len();
        let mut first = 0;
        while first < n {
            let want: usize = self.spans[first..n].iter().map(|s| s.len).sum();
            let got = self
                .mem
                .read_spans(&self.spans[first..n], &mut self.buf[..want]);
            let mut off = 0;
            let mut k = first;
            while k < n && off + self.spans[k].len <= got {
                let len = self.spans[k].len;
                self.marks.scan(&self.buf[off..off + len], self.batch[k].1);
                off += len;
                k += 1;
            }
            if k < n && got < want {
                self.unreadable += self.spans[k].len as u64;
                k += 1;
            }
            first = k;
        }
    }
}

impl Marks<'_> {
    /// The words of `bytes` (8-byte aligned memory) found at level `from`.
    fn scan(&mut self, bytes: &[u8], from: u8) {
        for w in bytes.chunks_exact(8) {
            self.mark(u64::from_ne_bytes(w.try_into().expect("8 bytes")), from);
        }
    }

    /// A value found in memory at level `from`: the block it points into rises to the level
    /// the pointer gives (see the module documentation), and is queued if it rose.
    #[inline]
    fn mark(&mut self, p: u64, from: u8) {
        // No block: `end` is 0 and nothing passes.
        if p < self.min || p >= self.end {
            return;
        }
        // The last block starting at or before `p`: blocks do not overlap, so only it can
        // hold `p`; a zero-size block holds its start only.
        let i = self.starts.partition_point(|&a| a <= p) - 1;
        let b = &mut self.blocks[i];
        let end = b.addr.saturating_add(b.size);
        let at_start = p == b.addr;
        if !at_start && p >= end {
            return;
        }
        if self.clique {
            // memcheck's cliques count start and interior pointers alike; and glibc's
            // pointers to chunk headers are in its own data, not in a lost block.
            if b.level == LOST && !b.indirect && i as u32 != self.leader {
                b.indirect = true;
                if self.work.try_reserve(1).is_ok() {
                    self.work.push(i as u32);
                }
            }
            return;
        }
        if !at_start && glibc_next_header(b.size) == Some(p - b.addr) {
            return;
        }
        let level = if at_start { from } else { from.min(POSSIBLY) };
        if level > b.level {
            b.level = level;
            if self.work.try_reserve(1).is_ok() {
                self.work.push(i as u32);
            }
        }
    }
}

/// `[lo, hi)` shrunk to whole aligned words.
fn aligned(lo: u64, hi: u64) -> (u64, u64) {
    (lo.saturating_add(7) & !7, hi & !7)
}

#[cfg(test)]
mod tests;
