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
//!
//! ## The cap on distinct stacks
//! Records never die, so a program whose distinct stacks keep growing (an evaluator on inputs
//! that never repeat; clang++ grew the tracer by 320 MB for 255k stacks) would grow the store
//! without limit. Full stacks get ids up to the cap (`MEM_TRACE_MAX_STACKS`); past it, a new
//! stack is stored *cut*: its innermost frame then [`CUT_MARKER`], interned like any stack, so
//! there are at most as many as the program has call sites of the allocator. Those get ids up
//! to a second, hard limit ([`hard_limit`]); past that, every new stack is the one bucket
//! stack `[CUT_MARKER]`. A stack stored before the cap is still found by its frames. Ids above
//! the cap are therefore exactly the cut stacks, which is how [`is_cut`] tells them for the
//! price of a comparison. Every check is on the path that stores a new record: a stack found
//! in a table, or named by a capture's cache, never reaches one.

use crate::arena::{self, Arena};
use crate::narrow;
use crate::sync::SpinLock;
use core::alloc::Layout;
use core::cell::Cell;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use hashbrown::HashTable;
use mem_trace_format::{
    StackStore, CUT_MARKER, MAX_STACK_ID as MAX_ID, STACK_CHUNKS as CHUNKS,
    STACK_CHUNK_BITS as CHUNK_BITS, STACK_IN_TREE,
};

/// The most frames a stack has (`MEM_TRACE_FRAMES` at most), and so the buffer [`frames`]
/// writes a stack named in the call tree into.
pub const MAX_STACK_FRAMES: usize = crate::config::MAX_FRAMES;

/// 256 KiB segments: a typical program has a few thousand distinct stacks of ~20 frames.
const SEGMENT_WORDS: usize = (256 << 10) / 8;
const INTERN_SHARDS: usize = 16;
/// Ids for cut stacks beyond the cap, besides a sixteenth of it: a small cap still leaves
/// room for the call sites of a small program.
const CUT_ROOM: u64 = 64;

/// The one stack store.
pub static STACKS: StackStore = StackStore {
    count: AtomicU64::new(0),
    chunk_bits: CHUNK_BITS,
    chunks: CHUNKS as u32,
    dir: [const { AtomicPtr::new(core::ptr::null_mut()) }; CHUNKS],
};

/// The interner writing [`STACKS`]. Uncapped but by the id space until [`configure`]d, which
/// the tracer does before it stores a stack.
static STORE: Interner = Interner::new(&STACKS, MAX_ID);

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

/// `(part of the hash, stack id)`, placed by `narrow::spread` of the part.
type InternTable = HashTable<(u32, u32), Arena>;

/// What storing a new record came to.
enum Stored {
    Id(u32),
    /// The record's limit is reached: store a shorter stack instead.
    Capped,
    /// Out of memory: no stack.
    Failed,
}

/// A stack store and the tables that find its records by their frames. One writes
/// [`STACKS`]; tests make their own, to reach a cap without filling the process's.
pub(crate) struct Interner {
    root: &'static StackStore,
    segment: SpinLock<Segment>,
    tables: [SpinLock<InternTable>; INTERN_SHARDS],
    /// Full stacks get ids `1..=cap`.
    cap: AtomicU64,
    /// Cut stacks get ids below it, the bucket stack this one.
    hard: AtomicU64,
    /// The cap was reached (the note is said once).
    capped: AtomicBool,
    /// `fn()` to call, once, when the cap is first reached; 0 until [`when_capped`] sets it.
    on_cap: AtomicUsize,
}

/// The hard limit on stack ids for a cap of `cap` full stacks: room for cut stacks above it,
/// within the 24-bit id space.
pub(crate) const fn hard_limit(cap: u64) -> u64 {
    let hard = cap + cap / 16 + CUT_ROOM;
    if hard > MAX_ID {
        MAX_ID
    } else {
        hard
    }
}

/// Hash of a stack: a multiply-rotate mix, strong enough for table placement. Four lanes,
/// each its own chain over every fourth frame, combined at the end: a stack the call tree has
/// not named is hashed on every capture (every one on `deep_new`, whose stacks never repeat),
/// and one chain of 64 multiplies waited ~5 cycles a frame; the lanes run side by side.
pub(crate) fn hash(frames: &[u64]) -> u64 {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let step = |h: u64, f: u64| (h.rotate_left(5) ^ f).wrapping_mul(K);
    let mut lanes = [
        frames.len() as u64,
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
    ];
    let mut quads = frames.chunks_exact(4);
    for q in &mut quads {
        for (l, &f) in lanes.iter_mut().zip(q) {
            *l = step(*l, f);
        }
    }
    for (l, &f) in lanes.iter_mut().zip(quads.remainder()) {
        *l = step(*l, f);
    }
    let h =
        (lanes[0] ^ lanes[1].rotate_left(16) ^ lanes[2].rotate_left(32) ^ lanes[3].rotate_left(48))
            .wrapping_mul(K);
    h ^ (h >> 29)
}

/// Sets the cap on distinct full stacks (`MEM_TRACE_MAX_STACKS`, 1..=2^24 - 1), before the
/// first stack is stored.
pub(crate) fn configure(max_stacks: u64) {
    STORE.set_cap(max_stacks);
}

/// The cap on distinct full stacks.
pub(crate) fn cap() -> u64 {
    STORE.cap.load(Ordering::Relaxed)
}

/// Registers what to do, once, when the cap is first reached. Called with no lock of the
/// store held, on the thread that reached it.
pub(crate) fn when_capped(f: fn()) {
    STORE.on_cap.store(f as usize, Ordering::Relaxed);
}

/// Whether `id` names a cut stack: one stored past the cap.
#[inline(always)]
pub(crate) fn is_cut(id: u32) -> bool {
    u64::from(id) > STORE.cap.load(Ordering::Relaxed)
}

/// The frames of stack `id`, if published: the record's own, or written into `buf` from the
/// call tree. Lock-free: records and nodes never move.
pub fn frames(id: u32, buf: &mut [u64; MAX_STACK_FRAMES]) -> Option<&[u64]> {
    frames_of(&STACKS, id, buf)
}

/// Whether stack `id` of the store at `root` is `frames_in`.
///
/// Compared in place, the record's frames or the tree's nodes one by one: a buffer to copy
/// them into would be 1 KiB zeroed on every check (every capture of a new stack).
#[inline(always)]
fn same(root: &'static StackStore, id: u32, frames_in: &[u64]) -> bool {
    match record_of(root, id) {
        Some(Record::Frames(frames)) => frames == frames_in,
        Some(Record::Tree { n, node }) => {
            n == frames_in.len()
                && crate::capture::tree_path(node)
                    .take(n)
                    .eq(frames_in.iter().copied())
        }
        None => false,
    }
}

/// A published record: its own frames, or `n` frames named by a call-tree node.
enum Record {
    Frames(&'static [u64]),
    Tree { n: usize, node: u32 },
}

/// Stack `id`'s record in the store at `root`, if published.
#[inline(always)]
fn record_of(root: &'static StackStore, id: u32) -> Option<Record> {
    if id == 0 || u64::from(id) > root.count.load(Ordering::Acquire) {
        return None;
    }
    let chunk = root.dir[(id >> CHUNK_BITS) as usize].load(Ordering::Acquire);
    if chunk.is_null() {
        return None;
    }
    // SAFETY: a chunk holds 2^CHUNK_BITS entries; the index is masked into range.
    let rec =
        unsafe { &*chunk.add((id & ((1 << CHUNK_BITS) - 1)) as usize) }.load(Ordering::Acquire);
    if rec == 0 {
        return None;
    }
    let rec = rec as *const u64;
    // SAFETY: a published record is a length word followed by that many frames, or a tagged
    // length and a node id; never freed.
    unsafe {
        let head = *rec;
        Some(match head & STACK_IN_TREE {
            0 => Record::Frames(core::slice::from_raw_parts(rec.add(1), head as usize)),
            _ => Record::Tree {
                n: (head as usize & 0xff).min(MAX_STACK_FRAMES),
                node: *rec.add(1) as u32,
            },
        })
    }
}

/// The frames of stack `id` in the store at `root`, if published.
#[inline(always)]
fn frames_of<'a>(
    root: &'static StackStore,
    id: u32,
    buf: &'a mut [u64; MAX_STACK_FRAMES],
) -> Option<&'a [u64]> {
    match record_of(root, id)? {
        Record::Frames(frames) => Some(frames),
        Record::Tree { n, node } => {
            let mut written = 0;
            for (o, pc) in buf[..n].iter_mut().zip(crate::capture::tree_path(node)) {
                *o = pc;
                written += 1;
            }
            Some(&buf[..written])
        }
    }
}

/// [`intern`] through the thread's cache of recent stacks: a hit costs the hash and one
/// comparison with the stored record, no lock. Programs allocate from a few hot stacks.
/// `node`: the call-tree node naming exactly these frames (0: none), which a new record
/// refers to instead of copying them.
#[inline]
pub(crate) fn intern_cached(local: &Local, frames_in: &[u64], node: u32) -> u32 {
    // Through `STACKS` at its fixed address: `STORE.root` would load the root's address
    // first, on every hit.
    cached(
        &local.cache,
        frames_in,
        |id, f| same(&STACKS, id, f),
        |h, f| STORE.intern_hashed(h, f, node),
    )
}

/// The id of `frames_in` from `cache` when an entry names it (`same` compares a stored
/// stack with it), else from `miss` with the stack's hash, noted in the cache.
#[inline(always)]
fn cached(
    cache: &[Cell<u64>],
    frames_in: &[u64],
    same: impl Fn(u32, &[u64]) -> bool,
    miss: impl FnOnce(u64, &[u64]) -> u32,
) -> u32 {
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
    let id = miss(h, frames_in);
    if id != 0 {
        slot.set(tag | u64::from(id));
    }
    id
}

/// Returns the id of `frames`, storing them if this stack is new. 0 for an empty stack, or
/// when ids or memory have run out (the block is still recorded, without a stack). Past the
/// cap, a new stack's id names it cut (see the module documentation).
pub fn intern(frames_in: &[u64]) -> u32 {
    STORE.intern(frames_in)
}

impl Interner {
    const fn new(root: &'static StackStore, cap: u64) -> Self {
        Interner {
            root,
            segment: SpinLock::new(Segment {
                next: 0,
                words_left: 0,
            }),
            tables: [const { SpinLock::new(HashTable::new_in(Arena)) }; INTERN_SHARDS],
            cap: AtomicU64::new(cap),
            hard: AtomicU64::new(hard_limit(cap)),
            capped: AtomicBool::new(false),
            on_cap: AtomicUsize::new(0),
        }
    }

    fn set_cap(&self, cap: u64) {
        let cap = cap.clamp(1, MAX_ID);
        self.cap.store(cap, Ordering::Relaxed);
        self.hard.store(hard_limit(cap), Ordering::Relaxed);
    }

    #[cfg(test)]
    fn frames<'a>(&self, id: u32, buf: &'a mut [u64; MAX_STACK_FRAMES]) -> Option<&'a [u64]> {
        frames_of(self.root, id, buf)
    }

    #[cfg(test)]
    fn intern_with_cache(&self, cache: &[Cell<u64>], frames_in: &[u64]) -> u32 {
        cached(
            cache,
            frames_in,
            |id, f| same(self.root, id, f),
            |h, f| self.intern_hashed(h, f, 0),
        )
    }

    fn intern(&self, frames_in: &[u64]) -> u32 {
        if frames_in.is_empty() {
            return 0;
        }
        self.intern_hashed(hash(frames_in), frames_in, 0)
    }

    fn intern_hashed(&self, h: u64, frames_in: &[u64], node: u32) -> u32 {
        let cap = self.cap.load(Ordering::Relaxed);
        match self.find_or_store(h, frames_in, cap, node) {
            Stored::Id(id) => id,
            Stored::Failed => 0,
            Stored::Capped => self.cut(frames_in),
        }
    }

    /// The id of `frames_in` (hashed `h`), stored if new and the store's count is below
    /// `limit` (as a reference to call-tree `node` when not 0).
    fn find_or_store(&self, h: u64, frames_in: &[u64], limit: u64, node: u32) -> Stored {
        // The shard from bits the table itself does not use: hashbrown places entries by the
        // low bits and tells them apart in a group by the top 7. Sharding by the top 4 left 3
        // bits to tell entries apart, so a probe compared ~1 in 8 entries of its group in
        // full.
        let mut table = self.tables[(h >> 48) as usize % INTERN_SHARDS].lock();
        let p = narrow::part(h);
        let found = table.find(narrow::spread(p), |&(ep, id)| {
            ep == p && same(self.root, id, frames_in)
        });
        if let Some(&(_, id)) = found {
            return Stored::Id(id);
        }
        self.locked_intern(&mut table, h, frames_in, limit, node)
    }

    /// Stores a new stack with its intern shard locked. Out of line and named so that tests
    /// can stop a thread here, holding the lock, and check that `print_trace` still answers.
    #[inline(never)]
    fn locked_intern(
        &self,
        table: &mut InternTable,
        h: u64,
        frames_in: &[u64],
        limit: u64,
        node: u32,
    ) -> Stored {
        // Room first: `insert_unique` aborts the program when it cannot grow the table.
        if table.try_reserve(1, |&(ep, _)| narrow::spread(ep)).is_err() {
            return Stored::Failed;
        }
        let stored = self.store(frames_in, limit, node);
        if let Stored::Id(id) = stored {
            let p = narrow::part(h);
            table.insert_unique(narrow::spread(p), (p, id), |&(ep, _)| narrow::spread(ep));
        }
        stored
    }

    /// A new stack past the cap: stored cut, or as the bucket past the hard limit. Says once
    /// that the cap was reached (no lock is held here).
    #[cold]
    #[inline(never)]
    fn cut(&self, frames_in: &[u64]) -> u32 {
        if !self.capped.swap(true, Ordering::Relaxed) {
            let f = self.on_cap.load(Ordering::Relaxed);
            if f != 0 {
                // SAFETY: only `when_capped` stores it, from a `fn()`.
                let f: fn() = unsafe { core::mem::transmute::<usize, fn()>(f) };
                f();
            }
        }
        let hard = self.hard.load(Ordering::Relaxed);
        let cut = [frames_in[0], CUT_MARKER];
        match self.find_or_store(hash(&cut), &cut, hard - 1, 0) {
            Stored::Id(id) => return id,
            Stored::Failed => return 0,
            Stored::Capped => {}
        }
        let bucket = [CUT_MARKER];
        match self.find_or_store(hash(&bucket), &bucket, hard, 0) {
            Stored::Id(id) => id,
            Stored::Capped | Stored::Failed => 0,
        }
    }

    /// Appends a record and publishes its id, if the count is below `limit` (at most
    /// [`MAX_ID`]). The record is complete before its directory entry is stored (release),
    /// and the entry before the count moves past it. Under the segment lock throughout, so
    /// that `count` only ever covers ids whose entries are written or about to be, and no
    /// two threads both take the last id below a limit.
    fn store(&self, frames_in: &[u64], limit: u64, node: u32) -> Stored {
        let mut seg = self.segment.lock();
        let id = self.root.count.load(Ordering::Relaxed) + 1;
        if id > limit.min(MAX_ID) {
            return Stored::Capped;
        }
        // The chunk first: a record appended for an id that cannot be published would be
        // lost words.
        let Some(chunk) = self.chunk_for(id) else {
            return Stored::Failed;
        };
        let rec = match node {
            0 => append(&mut seg, frames_in.len() as u64, frames_in),
            node => append(
                &mut seg,
                STACK_IN_TREE | frames_in.len() as u64,
                &[u64::from(node)],
            ),
        };
        let Some(rec) = rec else {
            return Stored::Failed;
        };
        // SAFETY: index masked into the chunk.
        unsafe { &*chunk.add((id & ((1 << CHUNK_BITS) - 1)) as usize) }
            .store(rec, Ordering::Release);
        self.root.count.store(id, Ordering::Release);
        Stored::Id(id as u32)
    }

    /// The directory chunk of `id`, made if it is the chunk's first.
    fn chunk_for(&self, id: u64) -> Option<*mut AtomicU64> {
        let slot = &self.root.dir[(id >> CHUNK_BITS) as usize];
        let chunk = slot.load(Ordering::Acquire);
        if !chunk.is_null() {
            return Some(chunk);
        }
        let layout = Layout::array::<AtomicU64>(1 << CHUNK_BITS).ok()?;
        // Zeroed means "not published"; chunks are never freed.
        let chunk = arena::allocate_zeroed(layout) as *mut AtomicU64;
        if chunk.is_null() {
            return None;
        }
        slot.store(chunk, Ordering::Release);
        Some(chunk)
    }

    fn lock_all(&self) {
        for t in &self.tables {
            t.raw().lock();
        }
        self.segment.raw().lock();
    }

    fn unlock_all(&self) {
        self.segment.raw().unlock();
        for t in &self.tables {
            t.raw().unlock();
        }
    }
}

/// Copies a record, `head` then `words_in`, into the current segment; returns its address.
fn append(seg: &mut Segment, head: u64, words_in: &[u64]) -> Option<u64> {
    let words = words_in.len() + 1;
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

/// Number of distinct stacks stored.
pub(crate) fn count() -> u64 {
    STACKS.count.load(Ordering::Relaxed)
}

/// Locks everything (fork prepare handler).
pub(crate) fn lock_all() {
    STORE.lock_all();
}

/// Unlocks everything (fork parent and child handlers).
pub(crate) fn unlock_all() {
    STORE.unlock_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_tells_order_length_and_each_frame_apart() {
        let base: std::vec::Vec<u64> = (0..64).map(|i| 0x5555_0000_1000 + i * 0x37).collect();
        let h = hash(&base);
        let mut seen = std::collections::HashSet::new();
        seen.insert(h);
        // Any one frame changed by one, two frames swapped within a lane and across lanes,
        // one frame fewer: each a different hash.
        for i in 0..base.len() {
            let mut v = base.clone();
            v[i] += 1;
            assert!(seen.insert(hash(&v)), "frame {i} changed");
        }
        for (i, j) in [(0, 4), (0, 1), (3, 62), (10, 11)] {
            let mut v = base.clone();
            v.swap(i, j);
            assert!(seen.insert(hash(&v)), "frames {i} and {j} swapped");
        }
        for n in [0, 1, 3, 4, 5, 63] {
            assert!(seen.insert(hash(&base[..n])), "{n} frames");
        }
        // Frames of zero are frames too: a stack of n zeros differs from one of n + 4.
        assert_ne!(hash(&[0; 4]), hash(&[0; 8]));
        assert_eq!(hash(&base), h);
    }

    #[test]
    fn same_stack_same_id() {
        let a = [0x1000u64, 0x2000, 0x3000];
        let b = [0x1000u64, 0x2000, 0x3001];
        let ia = intern(&a);
        let ib = intern(&b);
        assert_ne!(ia, 0);
        assert_ne!(ia, ib);
        assert_eq!(intern(&a), ia);
        assert_eq!(frames(ia, &mut [0; MAX_STACK_FRAMES]), Some(&a[..]));
        assert_eq!(frames(ib, &mut [0; MAX_STACK_FRAMES]), Some(&b[..]));
        assert_eq!(intern(&[]), 0);
        assert_eq!(frames(0, &mut [0; MAX_STACK_FRAMES]), None);
    }

    #[test]
    fn cache_hits_and_misses_agree_with_the_interner() {
        let cache: [Cell<u64>; 4] = Default::default();
        let a = [0xcafe_0000u64, 1, 2];
        let b = [0xcafe_0000u64, 1, 3];
        let ia = STORE.intern_with_cache(&cache, &a);
        assert_eq!(STORE.intern_with_cache(&cache, &a), ia);
        assert_eq!(intern(&a), ia);
        let ib = STORE.intern_with_cache(&cache, &b);
        assert_ne!(ia, ib);
        assert_eq!(STORE.intern_with_cache(&cache, &a), ia);
        assert_eq!(STORE.intern_with_cache(&cache, &[]), 0);
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

    /// A store of its own, not the process's, so that a test reaches its cap at once and
    /// leaves the process's stacks alone.
    fn private(cap: u64) -> &'static Interner {
        let root = Box::leak(Box::new(StackStore {
            count: AtomicU64::new(0),
            chunk_bits: CHUNK_BITS,
            chunks: CHUNKS as u32,
            dir: [const { AtomicPtr::new(core::ptr::null_mut()) }; CHUNKS],
        }));
        Box::leak(Box::new(Interner::new(root, cap)))
    }

    static NOTED: AtomicU64 = AtomicU64::new(0);

    fn noted() {
        NOTED.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn past_the_cap_new_stacks_are_cut_and_known_ones_still_found() {
        let s = private(10);
        s.on_cap.store(noted as fn() as usize, Ordering::Relaxed);
        let hard = hard_limit(10);
        assert_eq!(hard, 10 + 64);
        let full: Vec<[u64; 3]> = (0..10).map(|i| [0x1000 + i, 0x2000, 0x3000]).collect();
        let ids: Vec<u32> = full.iter().map(|f| s.intern(f)).collect();
        assert_eq!(ids, (1..=10).collect::<Vec<u32>>());
        assert_eq!(NOTED.load(Ordering::Relaxed), 0);
        // Past the cap: the innermost frame, then the marker; the same for every stack
        // through the same call site.
        let late = s.intern(&[0x1003, 0x2000, 0x9999]);
        assert_eq!(late, 11);
        assert_eq!(
            s.frames(late, &mut [0; MAX_STACK_FRAMES]),
            Some(&[0x1003, CUT_MARKER][..])
        );
        assert_eq!(s.intern(&[0x1003, 0x7777, 0x8888, 0x9999]), late);
        assert_eq!(NOTED.load(Ordering::Relaxed), 1);
        // Stacks stored before the cap keep their ids, through a cache too.
        for (f, &id) in full.iter().zip(&ids) {
            assert_eq!(s.intern(f), id);
            assert_eq!(s.frames(id, &mut [0; MAX_STACK_FRAMES]), Some(&f[..]));
        }
        let cache: [Cell<u64>; 4] = Default::default();
        assert_eq!(s.intern_with_cache(&cache, &full[4]), ids[4]);
        assert_eq!(s.intern_with_cache(&cache, &[0x1003, 5, 6]), late);
        assert_eq!(s.intern_with_cache(&cache, &[0x1003, 5, 6]), late);
        // Cut stacks up to the hard limit, less the bucket's id.
        let mut site = 0x5000u64;
        while s.root.count.load(Ordering::Relaxed) < hard - 1 {
            let id = s.intern(&[site, 0x2000, 0x3000]);
            assert_eq!(
                s.frames(id, &mut [0; MAX_STACK_FRAMES]),
                Some(&[site, CUT_MARKER][..])
            );
            site += 1;
        }
        // Past it, one bucket for every new stack, without a frame.
        let bucket = s.intern(&[site, 1, 2]);
        assert_eq!(u64::from(bucket), hard);
        assert_eq!(
            s.frames(bucket, &mut [0; MAX_STACK_FRAMES]),
            Some(&[CUT_MARKER][..])
        );
        assert_eq!(s.intern(&[site + 1, 1, 2]), bucket);
        assert_eq!(s.intern(&[CUT_MARKER]), bucket);
        // Everything stored before is still found.
        assert_eq!(s.intern(&[0x1003, 0x4444]), late);
        assert_eq!(s.intern(&[0x5000, 9, 9]), 12);
        assert_eq!(s.intern(&full[9]), ids[9]);
        assert_eq!(s.root.count.load(Ordering::Relaxed), hard);
        assert_eq!(NOTED.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn ids_stay_within_the_limits_across_threads() {
        let s = private(100);
        let hard = hard_limit(100);
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                std::thread::spawn(move || {
                    (0..1000u64)
                        .map(|i| {
                            let f = [0x10_0000 + (i % 300), t, i];
                            (f, s.intern(&f))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in hs {
            for (f, id) in h.join().unwrap() {
                assert!(id != 0 && u64::from(id) <= hard, "{id}");
                let mut buf = [0; MAX_STACK_FRAMES];
                let got = s.frames(id, &mut buf).unwrap();
                match u64::from(id) {
                    i if i <= 100 => assert_eq!(got, &f[..]),
                    i if i < hard => assert_eq!(got, &[f[0], CUT_MARKER][..]),
                    _ => assert_eq!(got, &[CUT_MARKER][..]),
                }
            }
        }
        assert_eq!(s.root.count.load(Ordering::Relaxed), hard);
    }

    #[test]
    fn caps_are_kept_within_the_id_space() {
        assert_eq!(hard_limit(1), 65);
        assert_eq!(hard_limit(1 << 20), (1 << 20) + (1 << 16) + 64);
        assert_eq!(hard_limit(MAX_ID), MAX_ID);
        let s = private(5);
        s.set_cap(0);
        assert_eq!(s.cap.load(Ordering::Relaxed), 1);
        s.set_cap(u64::MAX);
        assert_eq!(s.cap.load(Ordering::Relaxed), MAX_ID);
        assert_eq!(s.hard.load(Ordering::Relaxed), MAX_ID);
        // The process's store: no stack of these tests reaches its default cap.
        assert!(!is_cut(intern(&[0xbeef, 1])));
    }
}
