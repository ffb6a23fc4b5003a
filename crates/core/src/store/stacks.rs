//! Interned stacks: one copy of each distinct stack, named by a 24-bit id.
//!
//! A program with millions of live blocks has a few thousand distinct allocation stacks, so a
//! block stores an id and the frames are stored once. Records are appended to 1 MiB segments
//! and never move or die, which is what lets `print_trace` and the gdb reader walk them
//! without any lock. The id → record directory is exported (docs/LAYOUT.md "Stack store").
//!
//! Lookup hashes the whole stack once and probes one of 16 hash-sharded tables under a spin
//! lock; only a stack never seen before takes the append path.
//!
//! A stack the call tree named (`capture::tree`) is stored as a reference to the node of its
//! innermost frame (two words) instead of its frames: its outer frames are shared with every
//! stack that has them. A program whose stacks keep changing deep inside (an evaluator on
//! inputs that never repeat: 2 million distinct stacks of 30-90 frames) stored ~450 bytes of
//! frames per stack, and its first touch of each new page cost it more than the walk.

use crate::arena::{self, Arena};
use crate::sync::SpinLock;
use core::alloc::Layout;
use core::cell::Cell;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use hashbrown::HashTable;
use mem_trace_format::{
    StackStore, MAX_STACK_ID as MAX_ID, STACK_CHUNKS as CHUNKS, STACK_CHUNK_BITS as CHUNK_BITS,
    STACK_IN_TREE,
};

/// The most frames a stack has (`MEM_TRACE_FRAMES` at most), and so the buffer [`frames`]
/// writes a stack named in the call tree into.
pub const MAX_STACK_FRAMES: usize = crate::config::MAX_FRAMES;

/// 256 KiB segments: a typical program has a few thousand distinct stacks of ~20 frames.
const SEGMENT_WORDS: usize = (256 << 10) / 8;
const INTERN_SHARDS: usize = 16;

/// The one stack store.
pub static STACKS: StackStore = StackStore {
    count: AtomicU64::new(0),
    chunk_bits: CHUNK_BITS,
    chunks: CHUNKS as u32,
    dir: [const { AtomicPtr::new(core::ptr::null_mut()) }; CHUNKS],
};

/// Entries of the per-thread intern cache.
pub(crate) const INTERN_CACHE: usize = 256;

/// The interner's per-thread part of `state::ThreadState`: recently interned stacks, so a
/// repeated stack is found without the interner's lock. Entry `hash % N` holds the hash's top
/// 40 bits and the stack id (see [`intern_cached`]).
pub struct Local {
    cache: [Cell<u64>; INTERN_CACHE],
}

impl Local {
    /// An empty cache.
    pub const fn new() -> Self {
        Local {
            cache: [const { Cell::new(0) }; INTERN_CACHE],
        }
    }
}

impl Default for Local {
    fn default() -> Self {
        Self::new()
    }
}

/// Where new records go: the unused tail of the current segment.
struct Segment {
    next: usize,
    words_left: usize,
}

static SEGMENT: SpinLock<Segment> = SpinLock::new(Segment {
    next: 0,
    words_left: 0,
});

type InternTable = HashTable<(u64, u32), Arena>;

static INTERN: [SpinLock<InternTable>; INTERN_SHARDS] =
    [const { SpinLock::new(HashTable::new_in(Arena)) }; INTERN_SHARDS];

/// Hash of a stack: a multiply-rotate mix, strong enough for table placement and cheap
/// enough for the allocation path (≈1 ns per frame).
pub(crate) fn hash(frames: &[u64]) -> u64 {
    let mut h = frames.len() as u64;
    for &f in frames {
        h = (h.rotate_left(5) ^ f).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    h ^ (h >> 29)
}

/// The frames of stack `id`, if published: the record's own, or written into `buf` from the
/// call tree. Lock-free: records and nodes never move.
pub fn frames(id: u32, buf: &mut [u64; MAX_STACK_FRAMES]) -> Option<&[u64]> {
    let rec = record(id)?;
    // SAFETY: a published record is a length word followed by that many frames, or a tagged
    // length and a node id; never freed.
    unsafe {
        let head = *(rec as *const u64);
        if head & STACK_IN_TREE == 0 {
            return Some(core::slice::from_raw_parts(
                (rec as *const u64).add(1),
                head as usize,
            ));
        }
        let n = (head as usize & 0xff).min(MAX_STACK_FRAMES);
        let node = *(rec as *const u64).add(1) as u32;
        let written = crate::capture::tree_frames(node, &mut buf[..n]);
        Some(&buf[..written])
    }
}

/// Whether stack `id` is `frames_in`, without copying it.
fn same(id: u32, frames_in: &[u64]) -> bool {
    let mut buf = [0u64; MAX_STACK_FRAMES];
    frames(id, &mut buf) == Some(frames_in)
}

/// The address of stack `id`'s record, if published.
fn record(id: u32) -> Option<u64> {
    if id == 0 || u64::from(id) > STACKS.count.load(Ordering::Acquire) {
        return None;
    }
    let chunk = STACKS.dir[(id >> CHUNK_BITS) as usize].load(Ordering::Acquire);
    if chunk.is_null() {
        return None;
    }
    // SAFETY: a chunk holds 2^CHUNK_BITS entries; the index is masked into range.
    let rec =
        unsafe { &*chunk.add((id & ((1 << CHUNK_BITS) - 1)) as usize) }.load(Ordering::Acquire);
    (rec != 0).then_some(rec)
}

/// [`intern`] through the thread's cache of recent stacks: a hit costs the hash and one
/// comparison with the stored record, no lock. Programs allocate from a few hot stacks.
/// `node`: the call-tree node naming exactly these frames (0: none), which a new record
/// refers to instead of copying them.
#[inline]
pub(crate) fn intern_cached(local: &Local, frames_in: &[u64], node: u32) -> u32 {
    intern_with_cache(&local.cache, frames_in, node)
}

#[inline(always)]
fn intern_with_cache(cache: &[Cell<u64>], frames_in: &[u64], node: u32) -> u32 {
    if frames_in.is_empty() {
        return 0;
    }
    let h = hash(frames_in);
    let slot = &cache[(h as usize) % cache.len()];
    let tag = h >> 24 << 24;
    let e = slot.get();
    if e & !0xff_ffff == tag {
        let id = (e & 0xff_ffff) as u32;
        if same(id, frames_in) {
            return id;
        }
    }
    let id = intern_hashed(h, frames_in, node);
    if id != 0 {
        slot.set(tag | u64::from(id));
    }
    id
}

/// Returns the id of `frames`, storing them if this stack is new. 0 for an empty stack, or
/// when ids or memory have run out (the block is still recorded, without a stack).
pub fn intern(frames_in: &[u64]) -> u32 {
    if frames_in.is_empty() {
        return 0;
    }
    intern_hashed(hash(frames_in), frames_in, 0)
}

fn intern_hashed(h: u64, frames_in: &[u64], node: u32) -> u32 {
    // The shard from bits the table itself does not use: hashbrown places entries by the low
    // bits and tells them apart in a group by the top 7. Sharding by the top 4 left 3 bits
    // to tell entries apart, so a probe compared ~1 in 8 entries of its group in full.
    let mut table = INTERN[(h >> 48) as usize % INTERN_SHARDS].lock();
    if let Some(&(_, id)) = table.find(h, |&(eh, id)| eh == h && same(id, frames_in)) {
        return id;
    }
    locked_intern(&mut table, h, frames_in, node)
}

/// Stores a new stack with its intern shard locked. Out of line and named so that tests can
/// stop a thread here, holding the lock, and check that `print_trace` still answers.
#[inline(never)]
pub(crate) fn locked_intern(table: &mut InternTable, h: u64, frames_in: &[u64], node: u32) -> u32 {
    let id = STACKS.count.load(Ordering::Relaxed) + 1;
    if id > MAX_ID {
        return 0;
    }
    // Room first: `insert_unique` aborts the program when it cannot grow the table.
    if table.try_reserve(1, |&(eh, _)| eh).is_err() {
        return 0;
    }
    let rec = match node {
        0 => append(frames_in.len() as u64, frames_in),
        node => append(STACK_IN_TREE | frames_in.len() as u64, &[u64::from(node)]),
    };
    let Some(rec) = rec else {
        return 0;
    };
    let Some(id) = publish(rec) else {
        return 0;
    };
    table.insert_unique(h, (h, id), |&(eh, _)| eh);
    id
}

/// Copies a record, `head` then `words_in`, into the current segment; returns its address.
fn append(head: u64, words_in: &[u64]) -> Option<u64> {
    let words = words_in.len() + 1;
    let mut seg = SEGMENT.lock();
    if seg.words_left < words {
        let n = SEGMENT_WORDS.max(words);
        // Never freed: records are permanent.
        let p = arena::allocate(Layout::array::<u64>(n).ok()?);
        if p.is_null() {
            return None;
        }
        seg.next = p as usize;
        seg.words_left = n;
    }
    let rec = seg.next as *mut u64;
    // SAFETY: `words` words from `rec` are inside the segment and unused.
    unsafe {
        rec.write(head);
        core::ptr::copy_nonoverlapping(words_in.as_ptr(), rec.add(1), words_in.len());
    }
    seg.next += words * 8;
    seg.words_left -= words;
    Some(rec as u64)
}

/// Hands out the next id for a finished record: the record is complete before its directory
/// entry is stored (release), and the entry before the count moves past it.
fn publish(rec: u64) -> Option<u32> {
    // Ids are handed out under the segment lock so that `count` only ever covers ids whose
    // entries are written or about to be.
    let _seg = SEGMENT.lock();
    let id = STACKS.count.load(Ordering::Relaxed) + 1;
    if id > MAX_ID {
        return None;
    }
    let slot = &STACKS.dir[(id >> CHUNK_BITS) as usize];
    let mut chunk = slot.load(Ordering::Acquire);
    if chunk.is_null() {
        let layout = Layout::array::<AtomicU64>(1 << CHUNK_BITS).ok()?;
        // Zeroed means "not published"; chunks are never freed.
        chunk = arena::allocate_zeroed(layout) as *mut AtomicU64;
        if chunk.is_null() {
            return None;
        }
        slot.store(chunk, Ordering::Release);
    }
    // SAFETY: index masked into the chunk.
    unsafe { &*chunk.add((id & ((1 << CHUNK_BITS) - 1)) as usize) }.store(rec, Ordering::Release);
    STACKS.count.store(id, Ordering::Release);
    Some(id as u32)
}

/// Number of distinct stacks stored.
pub(crate) fn count() -> u64 {
    STACKS.count.load(Ordering::Relaxed)
}

/// Locks everything (fork prepare handler).
pub(crate) fn lock_all() {
    for t in &INTERN {
        t.raw().lock();
    }
    SEGMENT.raw().lock();
}

/// Unlocks everything (fork parent and child handlers).
pub(crate) fn unlock_all() {
    SEGMENT.raw().unlock();
    for t in &INTERN {
        t.raw().unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_stack_same_id() {
        let a = [0x1000u64, 0x2000, 0x3000];
        let b = [0x1000u64, 0x2000, 0x3001];
        let ia = intern(&a);
        let ib = intern(&b);
        assert_ne!(ia, 0);
        assert_ne!(ia, ib);
        assert_eq!(intern(&a), ia);
        let mut buf = [0; MAX_STACK_FRAMES];
        assert_eq!(frames(ia, &mut buf), Some(&a[..]));
        assert_eq!(frames(ib, &mut buf), Some(&b[..]));
        assert_eq!(intern(&[]), 0);
        assert_eq!(frames(0, &mut buf), None);
    }

    #[test]
    fn cache_hits_and_misses_agree_with_the_interner() {
        let cache: [Cell<u64>; 4] = Default::default();
        let a = [0xcafe_0000u64, 1, 2];
        let b = [0xcafe_0000u64, 1, 3];
        let ia = intern_with_cache(&cache, &a, 0);
        assert_eq!(intern_with_cache(&cache, &a, 0), ia);
        assert_eq!(intern(&a), ia);
        let ib = intern_with_cache(&cache, &b, 0);
        assert_ne!(ia, ib);
        assert_eq!(intern_with_cache(&cache, &a, 0), ia);
        assert_eq!(intern_with_cache(&cache, &[], 0), 0);
    }

    #[test]
    fn many_stacks_across_threads() {
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                std::thread::spawn(move || {
                    (0..2000u64)
                        .map(|i| {
                            let s = [0xdead_0000 + i, t, 7];
                            (s, intern(&s))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in hs {
            for (s, id) in h.join().unwrap() {
                assert_eq!(frames(id, &mut [0; MAX_STACK_FRAMES]), Some(&s[..]));
                assert_eq!(intern(&s), id);
            }
        }
    }
}
