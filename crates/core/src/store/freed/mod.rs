//! The freed-block history: one ring of the newest frees, shared by all threads and exported
//! through `MEM_TRACE_HEADER.freed` (docs/LAYOUT.md "Freed-block history").
//!
//! A record keeps what the live table knew about the block (size, allocating thread, stack and
//! sequence number) plus who freed it and when, so a dangling pointer can be explained after
//! the fact, live or from a core. One ring rather than one per shard: a single-threaded program
//! whose heap sits in a few regions would otherwise get only a few shards' worth of history.
//! A thread claims records [`CLAIM`] at a time with one `fetch_add` (see [`Claim`]) and
//! publishes each like a table slot (`addr` cleared first, stored last). So the ring's order is
//! only roughly the order of the frees: readers order records by their sequence numbers. Two
//! writers can only meet on one record if one of them stalls for half a lap of the ring
//! (`capacity` frees, 65536 by default) in the middle of its four stores; the reader then sees a
//! mixed record. We accept that rather than lock.
//!
//! Rings of at least [`index::MIN_CAPACITY`] records also keep an address [`index`], so that a
//! reader finds the frees of an address without a pass over the whole ring.

pub mod index;
mod ring;

use ring::words;
pub use ring::HISTORY;

use crate::arena;
use core::alloc::Layout;
use core::cell::Cell;
use core::sync::atomic::Ordering;
pub use mem_trace_format::Freed;
use mem_trace_format::{
    pack_seq_id, FreedRecord, FREED_BY_REALLOC as BY_REALLOC,
    FREED_FLAG_FREE_STACKS as FLAG_FREE_STACKS,
};

/// Sets the ring's size (called once, at initialisation, before any free is recorded).
pub fn configure(capacity: u64, free_stacks: bool) {
    HISTORY.capacity.store(capacity, Ordering::Relaxed);
    HISTORY.flags.store(
        if free_stacks { FLAG_FREE_STACKS } else { 0 },
        Ordering::Relaxed,
    );
    index::configure(capacity);
}

fn ring() -> Option<(*mut FreedRecord, u64)> {
    let cap = HISTORY.capacity.load(Ordering::Relaxed);
    if cap == 0 {
        return None;
    }
    let p = HISTORY.records.load(Ordering::Acquire);
    if !p.is_null() {
        return Some((p, cap));
    }
    allocate(cap)
}

#[cold]
#[inline(never)]
fn allocate(cap: u64) -> Option<(*mut FreedRecord, u64)> {
    let layout = Layout::array::<FreedRecord>(cap as usize).ok()?;
    // Before the ring: a thread that sees the ring sees its index.
    index::allocate(cap);
    // Zeroed records are empty; a published ring is never freed.
    let fresh = arena::allocate_zeroed(layout) as *mut FreedRecord;
    if fresh.is_null() {
        HISTORY.capacity.store(0, Ordering::Relaxed);
        return None;
    }
    match HISTORY.records.compare_exchange(
        core::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => Some((fresh, cap)),
        Err(existing) => {
            // SAFETY: ours, from the arena with this layout, never published.
            unsafe { arena::release(fresh.cast(), layout) };
            Some((existing, cap))
        }
    }
}

/// Records a thread claims at once. One shared `fetch_add` per free, and neighbouring records
/// written by different threads, made the history most of what a second thread cost on churn.
pub(crate) const CLAIM: u64 = 8;

/// A thread's claimed, still unwritten records of the ring: `[next, end)`.
pub struct Claim {
    next: Cell<u64>,
    end: Cell<u64>,
}

impl Claim {
    /// No records claimed.
    pub const fn new() -> Self {
        Claim {
            next: Cell::new(0),
            end: Cell::new(0),
        }
    }

    /// The record number of the next record this thread writes, in `ring` of `cap` records;
    /// `indexed`: the ring keeps an [`index`].
    #[inline(always)]
    fn take(&self, ring: *mut FreedRecord, cap: u64, indexed: bool) -> u64 {
        let mut k = self.next.get();
        // Records claimed long ago lie where other threads have written since: a thread that
        // frees rarely claims afresh rather than overwrite newer records.
        let lag = if indexed { index::LAG } else { cap / 2 };
        if k == self.end.get() || HISTORY.written.load(Ordering::Relaxed).wrapping_sub(k) > lag {
            // A small ring (`MEM_TRACE_FREED`) is shared out in smaller runs.
            let n = CLAIM.min(cap / 16).max(1);
            k = HISTORY.written.fetch_add(n, Ordering::Relaxed);
            self.end.set(k + n);
            if indexed {
                index::clear(ring, cap, k, n);
            }
            prefetch_run(ring, cap, k + n, n);
        }
        self.next.set(k + 1);
        k
    }
}

/// Starts loading the `n` records from record number `k`: the run after the one just claimed,
/// which a thread freeing alone claims next. A record is written a ring's lap after its last
/// write, long out of the cache: without this, each free's record stores waited for their
/// lines, and the next locked instruction (the quarantine's lock) waited for them. A plain
/// prefetch is enough: a line no other core holds arrives exclusive, so the store needs no
/// second request.
/// python3's dicts spent 9% of its run on that lock; with this, 1%, and the run 7% less
/// (docs/FINDINGS.md, "Stores that miss, paid at the next locked instruction").
#[inline(always)]
fn prefetch_run(ring: *mut FreedRecord, cap: u64, k: u64, n: u64) {
    let bytes = n as usize * core::mem::size_of::<FreedRecord>();
    // One hint per line the run covers, from its first byte to its last. A run that wraps
    // past the ring's end is hinted past it instead, once a lap: a hint never faults.
    let start = ring.wrapping_add((k % cap) as usize).cast::<u8>();
    for offset in (0..bytes).step_by(64).chain([bytes - 1]) {
        crate::prefetch::line(start.wrapping_add(offset));
    }
}

impl Default for Claim {
    fn default() -> Self {
        Self::new()
    }
}

/// Remembers a free, in one of the records `claim` (the calling thread's) holds.
pub fn push(claim: &Claim, f: &Freed) {
    let Some((ring, cap)) = ring() else {
        return;
    };
    let indexed = index::ON.load(Ordering::Relaxed);
    let k = claim.take(ring, cap, indexed);
    if indexed {
        // On its chain before it is written: a record the ring shows is on its chain.
        index::insert(k, cap, f.block.addr, f.block.size);
    }
    // SAFETY: the index is reduced modulo the ring's capacity.
    let r = unsafe { &*ring.add((k % cap) as usize) };
    r.addr.store(0, Ordering::Relaxed);
    // The same encoding as a table slot.
    let (size_thread, seq_stack) = f.block.pack();
    r.size_thread.store(size_thread, Ordering::Relaxed);
    r.seq_stack.store(seq_stack, Ordering::Relaxed);
    r.free_seq_stack
        .store(pack_seq_id(f.free_seq, f.free_stack), Ordering::Relaxed);
    r.free_thread.store(f.free_thread, Ordering::Relaxed);
    r.flags
        .store(if f.by_realloc { BY_REALLOC } else { 0 }, Ordering::Relaxed);
    r.addr.store(f.block.addr, Ordering::Release);
}

/// The newest remembered free of a block starting exactly at `addr` (for double-free reports):
/// the one with the highest sequence number, since threads write the ring in claimed runs.
/// Through the index when the ring has one, else by a pass over the whole ring: only called
/// on the rare frees of unknown pointers.
pub(crate) fn newest_at(addr: u64) -> Option<Freed> {
    let cap = HISTORY.capacity.load(Ordering::Relaxed);
    let ring = HISTORY.records.load(Ordering::Acquire);
    if cap == 0 || ring.is_null() {
        return None;
    }
    if let Some(found) = index::newest_at(ring, cap, addr) {
        return found;
    }
    let written = HISTORY.written.load(Ordering::Acquire);
    (0..written.min(cap))
        .filter_map(|slot| {
            // SAFETY: a slot below the capacity; records are never freed.
            let w = words(unsafe { &*ring.add(slot as usize) });
            (w[0] == addr).then(|| Freed::unpack(&w))
        })
        .max_by_key(|f| f.free_seq)
}

/// The newest remembered free of a block containing `addr`, for `print_trace`: a pass over
/// the whole ring (a few tens of milliseconds at the largest history), reading records as
/// the readers do, without a lock; a record rewritten meanwhile is skipped.
pub fn newest_containing(addr: u64) -> Option<Freed> {
    let cap = HISTORY.capacity.load(Ordering::Relaxed);
    let ring = HISTORY.records.load(Ordering::Acquire);
    if cap == 0 || ring.is_null() {
        return None;
    }
    let written = HISTORY.written.load(Ordering::Acquire);
    (0..written.min(cap))
        .filter_map(|slot| {
            // SAFETY: a slot below the capacity; records are never freed.
            let r = unsafe { &*ring.add(slot as usize) };
            let w = words(r);
            let f = Freed::unpack(&w);
            let stable = r.addr.load(Ordering::Acquire) == w[0];
            (w[0] != 0 && stable && f.block.contains(addr)).then_some(f)
        })
        .max_by_key(|f| f.free_seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mem_trace_format::Block;

    #[test]
    fn records_round_trip_newest_first() {
        configure(8, true);
        let mk = |addr, seq| Freed {
            block: Block {
                addr,
                size: 48,
                thread: 2,
                seq,
                stack: 9,
            },
            free_seq: seq + 100,
            free_stack: 11,
            free_thread: 3,
            by_realloc: false,
        };
        let claim = Claim::new();
        push(&claim, &mk(0x1000, 1));
        push(&claim, &mk(0x2000, 2));
        push(&claim, &mk(0x1000, 3));
        assert_eq!(newest_at(0x1000), Some(mk(0x1000, 3)));
        assert_eq!(newest_at(0x2000), Some(mk(0x2000, 2)));
        // Wrap the ring: the oldest records are overwritten.
        for i in 0..8 {
            push(&claim, &mk(0x9000 + i * 16, 10 + i));
        }
        assert_eq!(newest_at(0x2000), None);
        // Two threads' claims: each writes its own run of records, so ring order is not free
        // order; the newest free of an address is still the one with the highest number.
        // (Here: a later record with a lower number, as a run claimed earlier gives.)
        let (a, b) = (Claim::new(), Claim::new());
        push(&a, &mk(0x5000, 20));
        push(&b, &mk(0x5000, 23));
        push(&a, &mk(0x5000, 22));
        assert_eq!(newest_at(0x5000), Some(mk(0x5000, 23)));
    }
}
