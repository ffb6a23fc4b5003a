//! Tagged blocks (docs/LAYOUT.md "Block tags", version 6): small blocks carry their record in
//! the 16 or 32 bytes in front of them instead of a table slot. A 16-byte aligned `q` starts a
//! live tagged block exactly when the word at `q - 16` is `q ^ tag_key`; the word after it
//! packs the size, thread and stack, and with `FLAG_TAG_SEQ` the word at `q - 24` is the
//! block's sequence number.
//!
//! The two reads the contract names, over any [`Memory`]: the tagged block holding an
//! address (a backward scan of at most 64 KiB, stopped at the start of the mapping holding
//! it) and every live tagged block of a set of mappings (a scan in 1 MiB pieces). They are
//! public so that the in-process leak check reads its own tagged blocks the same way.
//!
//! A long tag whose block was freed and is still held by the tracer is rewritten as a freed
//! tag (version 7, "Freed tags"): its check word is the complement of the live one, and the two
//! words before it hold who freed the block and when. [`freed_block_below`] reads it.
//!
//! A short tag has no sequence number: its block's [`Block::seq`] is [`NO_SEQ`], which no
//! table entry holds (the writer's counter starts at 1).

use crate::memory::Memory;
use crate::target::Mapping;
use mem_trace_format::{
    freed_check, tag_check, unpack_freed_tag, unpack_tag, Block, Freed, FLAG_TAG_SEQ, SEQ_TAG_SIZE,
    TAG_MAX_SIZE, TAG_SIZE,
};

/// The `seq` of a block whose tag has none.
pub const NO_SEQ: u64 = 0;

/// How a process tags its blocks, from its header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TagFormat {
    /// `tag_key`: 0 when no block is tagged.
    pub key: u64,
    /// Tags carry the sequence number at `q - 24` (`FLAG_TAG_SEQ`).
    pub seq: bool,
}

impl TagFormat {
    /// The format a header with `key` and `flags` names.
    pub fn new(key: u64, flags: u64) -> TagFormat {
        TagFormat {
            key,
            seq: flags & FLAG_TAG_SEQ != 0,
        }
    }

    /// The block at `q` whose tag's check word matched, its record word `word`; its
    /// sequence number is `before` (the word at `q - 24`) when the tags carry one, else read
    /// from `mem` when `before` was not read with the rest.
    fn block(&self, mem: &(impl Memory + ?Sized), q: u64, word: u64, before: Option<u64>) -> Block {
        let mut b = block_from_tag(q, word);
        if self.seq {
            b.seq = before
                .or_else(|| {
                    let mut w = [0u8; 8];
                    mem.read(q - 24, &mut w).ok().map(|_| u64::from_le_bytes(w))
                })
                .unwrap_or(NO_SEQ);
        }
        b
    }
}

/// Bytes read at once when enumerating tagged blocks.
pub const SCAN_PIECE: u64 = 1 << 20;
/// Bytes read at once when a piece could not be read whole: a core may lack some pages of a
/// mapping, a running process may unmap some meanwhile.
const PAGE: u64 = 4096;

/// Whether `key` is one the tracer makes (`mem_trace_format::tag_key`): its top 16 bits are
/// neither all zero nor all one, so that no check word is a canonical pointer or a small
/// integer. A scribbled key that is not would make every pointer-like word a candidate.
pub fn key_is_valid(key: u64) -> bool {
    !matches!(key >> 48, 0 | 0xffff)
}

/// Whether `block` has no sequence number: found by a short tag rather than in the table.
pub fn is_tagged(block: &Block) -> bool {
    block.seq == NO_SEQ
}

/// One mapping of the target as the tag scans need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// glibc's heap may lie in it: `[heap]` or anonymous writable memory. Only these are
    /// enumerated; every readable mapping bounds the backward scan.
    pub heap: bool,
}

/// The regions of `mappings`: the readable ones, with the heap-like ones marked.
pub fn regions(mappings: &[Mapping]) -> Vec<Region> {
    let mut out: Vec<Region> = mappings
        .iter()
        .filter(|m| m.read && m.start < m.end)
        .map(|m| Region {
            start: m.start,
            end: m.end,
            heap: m.write && (m.name.is_empty() || m.name == "[heap]"),
        })
        .collect();
    out.sort_by_key(|r| r.start);
    out
}

/// The region holding `addr`, if any.
pub fn region_of(regions: &[Region], addr: u64) -> Option<Region> {
    let i = regions.partition_point(|r| r.start <= addr);
    let r = *regions.get(i.checked_sub(1)?)?;
    (addr < r.end).then_some(r)
}

/// The block a tag at `q - 16` whose second word is `word` describes.
pub fn block_from_tag(q: u64, word: u64) -> Block {
    let (size, thread, stack) = unpack_tag(word);
    Block {
        addr: q,
        size,
        thread,
        seq: NO_SEQ,
        stack,
    }
}

/// Little-endian words of `bytes`.
fn words(bytes: &[u8]) -> impl DoubleEndedIterator<Item = u64> + ExactSizeIterator + '_ {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunks")))
}

/// The bytes `[lo, hi)` that can be read, as `(start, bytes)`: the whole range in one read,
/// else (a piece missing) the longest readable run that ends at `hi`, found a page at a time.
fn read_down(mem: &(impl Memory + ?Sized), lo: u64, hi: u64) -> (u64, Vec<u8>) {
    let mut buf = vec![0u8; (hi - lo) as usize];
    if mem.read(lo, &mut buf).is_ok() {
        return (lo, buf);
    }
    let mut start = hi;
    while start > lo {
        let from = ((start - 1) & !(PAGE - 1)).max(lo);
        let at = (from - lo) as usize;
        let end = (start - lo) as usize;
        if mem.read(from, &mut buf[at..end]).is_err() {
            break;
        }
        start = from;
    }
    let cut = (start - lo) as usize;
    buf.drain(..cut);
    (start, buf)
}

/// The words of the tags (`tag_bytes` each, 16 or 32) of every candidate block start `q` at
/// or below `addr` and no more than 64 KiB below it, whose tag lies at or above `floor`, as
/// `(start, words)`: read down from the top as far as memory can be read, so that pair `k`
/// (words `2k`, `2k + 1`) is the check word and record of `q = start + 16 (k + 1)`. `None`
/// when no tag is within reach.
fn tag_words_below(
    mem: &(impl Memory + ?Sized),
    addr: u64,
    floor: u64,
    tag_bytes: u64,
) -> Option<(u64, Vec<u64>)> {
    let top = addr & !15;
    // A block of TAG_MAX_SIZE - 1 bytes at q ends at q + 0xfffe: its last byte rounds down
    // to q + 0xfff0.
    let lowest = top
        .saturating_sub(TAG_MAX_SIZE - TAG_SIZE)
        .max(floor.saturating_add(tag_bytes));
    if top < lowest {
        return None;
    }
    let (start, bytes) = read_down(mem, lowest - tag_bytes, top);
    Some((start, words(&bytes).collect()))
}

/// The nearest live tagged block starting at or below `addr` and no more than 64 KiB below
/// it, whose tag lies at or above `floor` (the start of the mapping holding `addr`; 0 when
/// not known, and then the reads end where memory does). It holds `addr` when
/// `block.contains(addr)`; otherwise no tagged block does. `None`: no tag within reach.
pub fn tagged_block_below(
    mem: &(impl Memory + ?Sized),
    tags: TagFormat,
    addr: u64,
    floor: u64,
) -> Option<Block> {
    let key = tags.key;
    if key == 0 {
        return None;
    }
    let (start, pairs) = tag_words_below(mem, addr, floor, TAG_SIZE)?;
    pairs
        .chunks_exact(2)
        .enumerate()
        .rev()
        .find_map(|(k, pair)| {
            let q = start + TAG_SIZE * (k as u64 + 1);
            let before = (2 * k).checked_sub(1).map(|i| pairs[i]);
            (pair[0] == tag_check(q, key)).then(|| tags.block(mem, q, pair[1], before))
        })
}

/// The nearest live tagged block starting above `addr` and at most `max_gap` bytes after it,
/// whose tag lies below `ceiling` (the end of the mapping holding `addr`).
pub fn tagged_block_above(
    mem: &(impl Memory + ?Sized),
    tags: TagFormat,
    addr: u64,
    max_gap: u64,
    ceiling: u64,
) -> Option<Block> {
    let key = tags.key;
    if key == 0 || max_gap == 0 {
        return None;
    }
    // The first candidate q above addr has its tag at (addr & !15); q is at most addr + gap.
    let lo = addr & !15;
    let hi = addr
        .saturating_add(max_gap)
        .min(ceiling.saturating_sub(TAG_SIZE))
        & !15;
    if hi <= lo {
        return None;
    }
    let mut buf = vec![0u8; (hi - lo) as usize];
    mem.read(lo, &mut buf).ok()?;
    let pairs: Vec<u64> = words(&buf).collect();
    pairs.chunks_exact(2).enumerate().find_map(|(k, pair)| {
        let q = lo + TAG_SIZE * (k as u64 + 1);
        let before = (2 * k).checked_sub(1).map(|i| pairs[i]);
        (q > addr && pair[0] == tag_check(q, key)).then(|| tags.block(mem, q, pair[1], before))
    })
}

/// The block freed and still held by the tracer (its freed tag) nearest at or below `addr`
/// and no more than 64 KiB below it, whose tag lies at or above `floor` (as for
/// [`tagged_block_below`]): it holds `addr` when `freed.block.contains(addr)`; otherwise no
/// held freed block does (a held block's memory is no other block's). Only long tags are
/// ever freed.
pub fn freed_block_below(
    mem: &(impl Memory + ?Sized),
    tags: TagFormat,
    addr: u64,
    floor: u64,
) -> Option<Freed> {
    let key = tags.key;
    if key == 0 || !tags.seq {
        return None;
    }
    let (start, w) = tag_words_below(mem, addr, floor, SEQ_TAG_SIZE)?;
    // Pair k (words 2k, 2k + 1) is the check and record of q = start + 16 (k + 1); the two
    // words before it complete a long tag.
    (1..w.len() / 2).rev().find_map(|k| {
        let q = start + TAG_SIZE * (k as u64 + 1);
        (w[2 * k] == freed_check(q, key)).then(|| {
            let tag = [w[2 * k - 2], w[2 * k - 1], w[2 * k], w[2 * k + 1]];
            unpack_freed_tag(q, tag)
        })
    })
}

/// What an enumeration read: bytes scanned and bytes it could not read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scanned {
    /// Bytes read and searched.
    pub bytes: u64,
    /// Bytes of the regions that could not be read (a core lacking pages, memory a running
    /// process unmapped meanwhile).
    pub unreadable: u64,
}

/// Calls `found` with every live tagged block starting in `[start, end)` (its tag in the same
/// range), in address order, reading [`SCAN_PIECE`] bytes at a time.
pub fn for_each_tagged_in(
    mem: &(impl Memory + ?Sized),
    tags: TagFormat,
    start: u64,
    end: u64,
    found: &mut impl FnMut(Block),
) -> Scanned {
    let mut scanned = Scanned::default();
    if tags.key == 0 {
        return scanned;
    }
    let start = (start + 15) & !15;
    let end = end & !15;
    // A tag in the range's last 16 bytes is of a block that would start past it.
    let found = &mut |b: Block| {
        if b.addr < end {
            found(b)
        }
    };
    let mut buf = vec![0u8; SCAN_PIECE.min(end.saturating_sub(start)) as usize];
    let mut at = start;
    while at < end {
        let n = SCAN_PIECE.min(end - at);
        let piece = &mut buf[..n as usize];
        if mem.read(at, piece).is_ok() {
            scan_piece(mem, at, piece, tags, found);
            scanned.bytes += n;
        } else {
            // Page by page, skipping what is missing.
            let mut p = at;
            while p < at + n {
                let next = ((p & !(PAGE - 1)) + PAGE).min(at + n);
                let part = &mut buf[..(next - p) as usize];
                if mem.read(p, part).is_ok() {
                    scan_piece(mem, p, part, tags, found);
                    scanned.bytes += next - p;
                } else {
                    scanned.unreadable += next - p;
                }
                p = next;
            }
        }
        at += n;
    }
    scanned
}

/// The tagged blocks whose tags lie in `bytes`, read at `at` (16-byte aligned) from `mem`.
fn scan_piece(
    mem: &(impl Memory + ?Sized),
    at: u64,
    bytes: &[u8],
    tags: TagFormat,
    found: &mut impl FnMut(Block),
) {
    let mut w = words(bytes);
    let mut q = at + TAG_SIZE;
    let mut before = None;
    while let (Some(check), Some(word)) = (w.next(), w.next()) {
        if check == tag_check(q, tags.key) {
            found(tags.block(mem, q, word, before));
        }
        before = Some(word);
        q += TAG_SIZE;
    }
}

/// Calls `found` with every live tagged block of the heap regions of `regions`.
pub fn for_each_tagged(
    mem: &(impl Memory + ?Sized),
    tags: TagFormat,
    regions: &[Region],
    found: &mut impl FnMut(Block),
) -> Scanned {
    let mut total = Scanned::default();
    for r in regions.iter().filter(|r| r.heap) {
        let s = for_each_tagged_in(mem, tags, r.start, r.end, found);
        total.bytes += s.bytes;
        total.unreadable += s.unreadable;
    }
    total
}

/// This process's regions, from `/proc/self/maps`: what the in-process leak check scans.
pub fn this_process_regions() -> Vec<Region> {
    crate::target::process_mappings(std::process::id() as i32)
        .map(|m| regions(&m))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
