//! The address index over a large history ring (docs/LAYOUT.md "Freed-block index"), exported
//! at `FreedHistory.index`: a freed block joins one chain, that of its level's granule, so a
//! reader asking about an address walks the few chains of the granules around it instead of
//! the whole ring (2.5 GB at `MEM_TRACE_FREED=67108864`, seconds per question in gdb).
//!
//! A chain is a list threaded through a link word per ring record, newest first; a thread
//! writes its record's link, then makes it the chain's head with a compare-and-swap, so a
//! chain is whole at every instant (a reader, or a core taken at any point of a free, never
//! meets a head whose link is not written yet). A link carries its owner's lap of the ring, so
//! a reader stops where a slot was reused. The claims of an indexed ring are cleared when
//! claimed and the record written only after it joined its chain: a record the ring shows is
//! always on its chain. How far a chain's order departs from the claims' (threads join late
//! by their claimed runs) is measured as `disorder`, which tells a reader what a chain cut
//! short may hide (the walk is `mem_trace_read::layout::freed_index`).

use super::ring::{words, HISTORY};
use crate::arena;
use core::convert::Infallible;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use mem_trace_format::{
    pack_link, Freed, FreedIndex, FreedRecord, IndexGeometry, INDEX_GRANULE_SHIFT, INDEX_LEVELS,
    INDEX_LEVEL_SHIFT, INDEX_MULTIPLIER,
};
use mem_trace_read::layout::freed_index::{self, Index, Source, Wanted};

/// Rings of at least this many records are indexed. At the default 65536 records a reader
/// scans the ring in milliseconds, while the index costs every free a locked
/// compare-and-swap on a chain head, often a cache miss too (about 29 ns a free on a churn
/// loop, docs/FINDINGS.md): the free path, the hottest code the tracer has, pays it only where
/// a scan takes a reader a sizeable fraction of a second (1M records: 40 MiB of ring, about
/// 0.15 s for gdb's Python) and more.
pub const MIN_CAPACITY: u64 = 1 << 20;

/// In an indexed ring, a thread's claimed run more than this many claims old is given up
/// for a fresh one (half the ring otherwise): a record joins its chain at most about this
/// late, which bounds `disorder`, the window of the ring a reader may have to scan.
pub const LAG: u64 = 1 << 16;

/// The index's header.
pub static INDEX: FreedIndex = FreedIndex {
    granule_shift: INDEX_GRANULE_SHIFT,
    level_shift: INDEX_LEVEL_SHIFT,
    levels: INDEX_LEVELS,
    head_bits: AtomicU32::new(0),
    multiplier: INDEX_MULTIPLIER,
    heads: AtomicPtr::new(core::ptr::null_mut()),
    links: AtomicPtr::new(core::ptr::null_mut()),
    disorder: AtomicU64::new(0),
    reserved: [0; 2],
};

/// Frees are indexed: the ring is large enough (set by [`configure`]) and the index's arrays
/// could be had (cleared by [`allocate`] otherwise).
pub(super) static ON: AtomicBool = AtomicBool::new(false);

/// Sets the index up for a ring of `capacity` records: a chain head per 4 records (rounded
/// up to a power of two), so that chains of unrelated granules rarely share a head.
pub(super) fn configure(capacity: u64) {
    let on = capacity >= MIN_CAPACITY;
    let heads = (capacity / 4).max(1).next_power_of_two();
    INDEX
        .head_bits
        .store(heads.trailing_zeros(), Ordering::Relaxed);
    ON.store(on, Ordering::Relaxed);
}

/// The published array of `slot`, made first (zeroed) if there is none yet; `None` when out
/// of memory.
fn array(slot: &AtomicPtr<AtomicU64>, len: u64) -> Option<*mut AtomicU64> {
    arena::chunk(slot, usize::try_from(len).ok()?)
}

/// Makes the heads and links for a ring of `capacity` records, before the ring is published
/// (so a thread that sees the ring sees them). Without memory for them the ring goes
/// unindexed: readers then scan it, as they do a small ring.
#[cold]
pub(super) fn allocate(capacity: u64) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let heads = 1u64 << INDEX.head_bits.load(Ordering::Relaxed);
    if array(&INDEX.heads, heads).is_none() || array(&INDEX.links, capacity).is_none() {
        ON.store(false, Ordering::Relaxed);
        return;
    }
    HISTORY.index.store(
        &INDEX as *const FreedIndex as *mut FreedIndex,
        Ordering::Release,
    );
}

/// Empties the records of a run just claimed, `[k, k + n)`: until its thread writes one, a
/// slot must not show the free of a lap ago, which has left its chain's reach.
#[inline]
pub(super) fn clear(ring: *mut FreedRecord, capacity: u64, k: u64, n: u64) {
    let mut slot = k % capacity;
    for _ in 0..n {
        // SAFETY: the slot stays below the ring's capacity; records are never freed.
        unsafe { &*ring.add(slot as usize) }
            .addr
            .store(0, Ordering::Relaxed);
        slot += 1;
        if slot == capacity {
            slot = 0;
        }
    }
}

/// Puts record `k`, a block of `size` bytes at `addr`, on its chain. Called before the record
/// is written.
#[inline(always)]
pub(super) fn insert(k: u64, capacity: u64, addr: u64, size: u64) {
    let heads = INDEX.heads.load(Ordering::Relaxed);
    if heads.is_null() {
        return;
    }
    let links = INDEX.links.load(Ordering::Relaxed);
    let g = IndexGeometry::new(INDEX.head_bits.load(Ordering::Relaxed));
    let level = g.level(size);
    let bucket = g.bucket(level, addr >> g.shift(level));
    // SAFETY: a bucket is below `1 << head_bits`, the heads' length, and the slot is reduced
    // modulo the capacity, the links' length; both arrays are published before the ring and
    // never freed.
    let (head, link) = unsafe {
        (
            &*heads.add(bucket as usize),
            &*links.add((k % capacity) as usize),
        )
    };
    let mut next = head.load(Ordering::Relaxed);
    loop {
        // The link first: a reader that finds `k` at the head finds its link written.
        link.store(pack_link(k, capacity, next), Ordering::Relaxed);
        match head.compare_exchange_weak(next, k + 1, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => break,
            Err(now) => next = now,
        }
    }
    // Every record already on the chain was claimed before this load: the chain's order is
    // at most `behind` claims from theirs, here.
    let behind = HISTORY.written.load(Ordering::Relaxed).wrapping_sub(k);
    if behind > INDEX.disorder.load(Ordering::Relaxed) {
        INDEX.disorder.fetch_max(behind, Ordering::Relaxed);
    }
}

/// The walk's reads in the tracer's own memory.
struct Own {
    heads: *const AtomicU64,
    links: *const AtomicU64,
    ring: *const FreedRecord,
}

impl Source for Own {
    type Error = Infallible;

    fn head(&mut self, bucket: u64) -> Result<u64, Infallible> {
        // SAFETY: the walk asks only for buckets below `1 << head_bits`, the heads' length.
        Ok(unsafe { &*self.heads.add(bucket as usize) }.load(Ordering::Acquire))
    }

    fn link(&mut self, slot: u64) -> Result<u64, Infallible> {
        // SAFETY: the walk asks only for slots below the capacity, the links' length.
        Ok(unsafe { &*self.links.add(slot as usize) }.load(Ordering::Relaxed))
    }

    fn record(&mut self, slot: u64) -> Result<[u64; 5], Infallible> {
        // SAFETY: as for links: a slot of the ring, whose records are never freed.
        Ok(words(unsafe { &*self.ring.add(slot as usize) }))
    }

    fn written(&mut self) -> Result<u64, Infallible> {
        Ok(HISTORY.written.load(Ordering::Acquire))
    }
}

/// The remembered free of a block starting at `addr` with the highest sequence number, found
/// through the index; `None` when the ring is not indexed (the caller scans) or holds none.
/// `Some(None)`: indexed, and none.
pub(super) fn newest_at(
    ring: *const FreedRecord,
    capacity: u64,
    addr: u64,
) -> Option<Option<Freed>> {
    let heads = INDEX.heads.load(Ordering::Acquire);
    if !ON.load(Ordering::Relaxed) || heads.is_null() {
        return None;
    }
    let index = Index {
        geometry: IndexGeometry::new(INDEX.head_bits.load(Ordering::Relaxed)),
        capacity,
        written: HISTORY.written.load(Ordering::Acquire),
        disorder: INDEX.disorder.load(Ordering::Relaxed),
    };
    let mut source = Own {
        heads,
        links: INDEX.links.load(Ordering::Acquire),
        ring,
    };
    let mut newest: Option<Freed> = None;
    // The tracer's own index is never corrupt but for a writer stopped for a lap of the ring:
    // what the walk found by then is the answer.
    let _ = freed_index::walk(&mut source, &index, Wanted::StartingAt(addr), |_, words| {
        let f = Freed::unpack(&words);
        if newest.is_none_or(|n| f.free_seq > n.free_seq) {
            newest = Some(f);
        }
    });
    Some(newest)
}
