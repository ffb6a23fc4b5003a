//! Per-stack counters: live bytes and blocks, bytes and blocks ever allocated, and both at the
//! global peak (docs/LAYOUT.md "Profile").
//!
//! One 64-byte record per stack id, in chunks of 4096 allocated on first use. Threads do not
//! update them directly: each keeps a small direct-mapped cache of deltas (128 records, by
//! stack id), written with plain stores, and moves a record into the shared one, under that
//! record's spin lock, only when another stack needs its place or the thread exits. Updating
//! the shared records on every call cost two atomic instructions per allocation and free and,
//! with two threads allocating from the same stacks, a cache line moving between cores each
//! time: +14% on the churn benchmark with one thread, +18% with two. Readers add every
//! thread's cache records to the shared ones (docs/LAYOUT.md "Profile"); a reader that does
//! not stop the program may see one record half moved.
//!
//! While the process has one thread (glibc's `__libc_single_threaded`), no other thread can
//! write a shared record, and the thread updates them directly, without lock or cache: a
//! program with more stacks than the cache has entries (the `deep` benchmark's 7,143) moved a
//! record in and out of the cache on almost every call, 9% of its run in `flush`.
//!
//! The at-peak value is kept lazily and exactly (DHAT's t-gmax, without DHAT's copy of every
//! stack on the first free after a new peak, which on a heap that keeps growing would cost a
//! pass over all stacks per free): each record remembers the sequence number of its last
//! update; if that is at or before the peak's, the value about to change is the value it had
//! at the peak, so it is saved first. A record not updated since the peak held its current
//! value then.

use crate::arena;
use crate::store::header::header;
use crate::store::threads;
use crate::sync::RawSpin;
use core::cell::Cell;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering, Ordering::Relaxed};
pub use mem_trace_format::{at_peak, Counts};
use mem_trace_format::{
    Profile, StackCounters, ThreadRecord, COUNTER_CACHE as CACHE, COUNTER_CHUNKS as CHUNKS,
    COUNTER_CHUNK_BITS as CHUNK_BITS,
};

/// The one profile root, exported through the header.
pub static PROFILE: Profile = Profile {
    counter_size: core::mem::size_of::<StackCounters>() as u32,
    chunk_bits: CHUNK_BITS,
    chunks: CHUNKS as u32,
    flags: 0,
    started_ns: AtomicU64::new(0),
    resets: AtomicU64::new(0),
    reports: AtomicU64::new(0),
    reserved: [0; 3],
    dir: [const { AtomicPtr::new(core::ptr::null_mut()) }; CHUNKS],
};

/// The counters of `stack`, allocating their chunk on first use (None: out of memory).
#[inline(always)]
fn record(stack: u32) -> Option<&'static StackCounters> {
    get(stack).or_else(|| new_chunk(stack))
}

#[cold]
#[inline(never)]
fn new_chunk(stack: u32) -> Option<&'static StackCounters> {
    let slot = PROFILE.dir.get((stack >> CHUNK_BITS) as usize)?;
    // Zeroed is a valid, never-updated record.
    arena::chunk(slot, 1 << CHUNK_BITS)?;
    get(stack)
}

/// The counters of `stack` if any were ever kept (no allocation: for readers in process).
#[inline(always)]
pub fn get(stack: u32) -> Option<&'static StackCounters> {
    arena::entry(&PROFILE.dir, stack, CHUNK_BITS)
}

/// The profiler's per-thread part of `state::ThreadState`: the thread's cache of counter
/// deltas (null until its first update), published in its thread record for readers.
pub struct Local {
    cache: Cell<*mut StackCounters>,
    /// Set at thread exit, after the cache was flushed: later updates go to the shared records.
    closed: Cell<bool>,
}

impl Local {
    /// A thread that has counted nothing yet.
    pub const fn new() -> Self {
        Local {
            cache: Cell::new(core::ptr::null_mut()),
            closed: Cell::new(false),
        }
    }
}

impl Default for Local {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `f` on the calling thread's cache record for `stack` (or, without a cache, on the
/// shared record, locked; or, while the process has one thread, on the shared record
/// directly), after saving its at-peak value if this is its first change since the peak;
/// then stamps it with `seq`.
#[inline(always)]
fn update(
    local: &Local,
    thread: Option<&ThreadRecord>,
    stack: u32,
    seq: u64,
    f: impl FnOnce(&StackCounters),
) {
    let cache = local.cache.get();
    // A thread that has a cache keeps it: its records may hold deltas (a forked child of a
    // threaded parent, which keeps the parent's flag anyway).
    if cache.is_null() && crate::sync::one_thread() {
        if let Some(c) = record(stack) {
            apply(c, seq, f);
        }
        return;
    }
    if cache.is_null() {
        return update_uncached(local, thread, stack, seq, f);
    }
    // SAFETY: the cache holds COUNTER_CACHE records and is this thread's alone to write.
    let e = unsafe { &*cache.add(stack as usize % CACHE) };
    if e.stack.load(Relaxed) != stack.wrapping_add(1) {
        evict(e, stack, seq);
    }
    apply(e, seq, f);
}

/// The at-peak rule (module documentation), then `f`, then the stamp.
#[inline(always)]
fn apply(c: &StackCounters, seq: u64, f: impl FnOnce(&StackCounters)) {
    if c.last_seq.load(Relaxed) <= header().peak_seq.load(Relaxed) {
        c.peak_bytes.store(c.live_bytes.load(Relaxed), Relaxed);
        c.peak_blocks.store(c.live_blocks.load(Relaxed), Relaxed);
    }
    f(c);
    c.last_seq.store(seq, Relaxed);
}

#[cold]
#[inline(never)]
fn update_uncached(
    local: &Local,
    thread: Option<&ThreadRecord>,
    stack: u32,
    seq: u64,
    f: impl FnOnce(&StackCounters),
) {
    if let (false, Some(t)) = (local.closed.get(), thread) {
        let cache = caches::take();
        if !cache.is_null() {
            local.cache.set(cache);
            t.counters.store(cache, Ordering::Release);
            return update(local, thread, stack, seq, f);
        }
    }
    let Some(c) = record(stack) else {
        return;
    };
    let lock = RawSpin::of(&c.lock);
    lock.lock();
    apply(c, seq, f);
    lock.unlock();
}

/// Makes `e` the cache record of `stack`, moving what it held for another stack into that
/// stack's shared record.
#[cold]
#[inline(never)]
fn evict(e: &StackCounters, stack: u32, seq: u64) {
    flush(e, seq);
    e.stack.store(stack.wrapping_add(1), Relaxed);
}

/// Moves a cache record into its stack's shared record and empties it. Both sides follow the
/// at-peak rule, so the shared record's value at the peak gains the part of the delta that
/// had happened by the peak.
fn flush(e: &StackCounters, seq: u64) {
    let id = e.stack.load(Relaxed);
    if id != 0 {
        if let Some(c) = record(id - 1) {
            let lock = RawSpin::of(&c.lock);
            lock.lock();
            let peak_seq = header().peak_seq.load(Relaxed);
            let (pb, pn) = at_peak(e, peak_seq);
            apply(c, seq, |c| {
                bump(&c.peak_bytes, pb);
                bump(&c.peak_blocks, pn);
                bump(&c.live_bytes, e.live_bytes.load(Relaxed));
                bump(&c.live_blocks, e.live_blocks.load(Relaxed));
                bump(&c.total_bytes, e.total_bytes.load(Relaxed));
                bump(&c.total_blocks, e.total_blocks.load(Relaxed));
            });
            lock.unlock();
        }
    }
    e.stack.store(0, Relaxed);
    for w in [
        &e.live_bytes,
        &e.live_blocks,
        &e.total_bytes,
        &e.total_blocks,
        &e.peak_bytes,
        &e.peak_blocks,
        &e.last_seq,
    ] {
        w.store(0, Relaxed);
    }
}

/// At thread exit: moves the whole cache into the shared records, unpublishes it and gives it
/// to the next thread; later updates of this thread go to the shared records directly.
pub(crate) fn thread_exiting(local: &Local, thread: Option<&ThreadRecord>) {
    local.closed.set(true);
    let cache = local.cache.replace(core::ptr::null_mut());
    if cache.is_null() {
        return;
    }
    let seq = super::events::now_seq();
    for i in 0..CACHE {
        // SAFETY: this thread's cache, COUNTER_CACHE records.
        flush(unsafe { &*cache.add(i) }, seq);
    }
    if let Some(t) = thread {
        t.counters.store(core::ptr::null_mut(), Ordering::Release);
    }
    caches::give(cache);
}

/// Thread caches no thread uses, for reuse (a program that starts a thread per request would
/// otherwise leave one behind per thread).
mod caches {
    use super::{StackCounters, CACHE};
    use crate::arena;
    use crate::sync::SpinLock;
    use core::alloc::Layout;

    /// A stack of free caches, linked through their first word.
    static FREE: SpinLock<usize> = SpinLock::new(0);

    fn layout() -> Layout {
        Layout::array::<StackCounters>(CACHE).expect("a small constant layout")
    }

    /// A zeroed cache, or null when out of memory.
    pub(super) fn take() -> *mut StackCounters {
        let mut head = FREE.lock();
        if *head != 0 {
            let cache = *head as *mut u64;
            // SAFETY: a cache given back below, its first word the link; zeroed again here.
            unsafe {
                *head = *cache as usize;
                cache.write(0);
            }
            return cache.cast();
        }
        drop(head);
        arena::allocate_zeroed(layout()).cast()
    }

    /// Takes back a flushed (all-zero) cache.
    pub(super) fn give(cache: *mut StackCounters) {
        let mut head = FREE.lock();
        // SAFETY: the cache is no longer anyone's; its first word becomes the link.
        unsafe { (cache as *mut u64).write(*head as u64) };
        *head = cache as usize;
    }
}

#[inline(always)]
fn bump(word: &AtomicU64, by: u64) {
    // Under the record's lock: a plain load and store, no atomic read-modify-write.
    word.store(word.load(Relaxed).wrapping_add(by), Relaxed);
}

/// A block of `size` bytes became live on `stack`, in the thread whose parts are `local` and
/// `thread`; `new` when it is a new allocation (not a block put back after a failed
/// `realloc`).
#[inline(always)]
pub(crate) fn add(
    local: &Local,
    thread: &threads::Local,
    stack: u32,
    (size, blocks): (u64, u64),
    seq: u64,
    new: bool,
) {
    update(local, thread.record(), stack, seq, |c| {
        bump(&c.live_bytes, size);
        bump(&c.live_blocks, blocks);
        if new {
            bump(&c.total_bytes, size);
            bump(&c.total_blocks, blocks);
        }
    });
}

/// A block of `size` bytes from `stack` is no longer live.
#[inline(always)]
pub(crate) fn sub(
    local: &Local,
    thread: &threads::Local,
    stack: u32,
    (size, blocks): (u64, u64),
    seq: u64,
) {
    update(local, thread.record(), stack, seq, |c| {
        bump(&c.live_bytes, size.wrapping_neg());
        bump(&c.live_blocks, blocks.wrapping_neg());
    });
}

/// Calls `f(stack, record)` on every thread's cache records in use (readers in process).
pub fn for_each_cached(mut f: impl FnMut(u32, &StackCounters)) {
    crate::store::threads::for_each(|t| {
        let cache = t.counters.load(Ordering::Acquire);
        if cache.is_null() {
            return;
        }
        for i in 0..CACHE {
            // SAFETY: a published cache has CACHE records and is never unmapped.
            let e = unsafe { &*cache.add(i) };
            let id = e.stack.load(Relaxed);
            if id != 0 {
                f(id - 1, e);
            }
        }
    });
}

/// The counts of one stack (shared record plus cached deltas).
pub fn counts(stack: u32) -> Counts {
    let peak_seq = header().peak_seq.load(Relaxed);
    let mut n = Counts::default();
    if let Some(c) = get(stack) {
        n.add(c, peak_seq);
    }
    for_each_cached(|id, e| {
        if id == stack {
            n.add(e, peak_seq);
        }
    });
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread's two parts the counters take, for the test's life (a cache may outlive it).
    struct Parts {
        profile: Local,
        thread: threads::Local,
    }

    #[test]
    fn live_total_and_at_peak() {
        let h = header();
        let st: &'static Parts = Box::leak(Box::new(Parts {
            profile: Local::new(),
            thread: threads::Local::new(),
        }));
        // Stack ids far above what other tests intern, so counts are this test's alone.
        let s = 0x00ab_c001;
        add(&st.profile, &st.thread, s, (100, 1), 10, true);
        add(&st.profile, &st.thread, s, (50, 1), 11, true);
        sub(&st.profile, &st.thread, s, (100, 1), 12);
        let n = counts(s);
        assert_eq!((n.live_bytes, n.live_blocks), (50, 1));
        assert_eq!((n.total_bytes, n.total_blocks), (150, 2));
        // A peak at seq 11: the stack held 150 bytes in 2 blocks then.
        let old = h.peak_seq.swap(11, Relaxed);
        let t = 0x00ab_c002;
        add(&st.profile, &st.thread, t, (100, 1), 10, true);
        add(&st.profile, &st.thread, t, (50, 1), 11, true);
        assert_eq!((counts(t).peak_bytes, counts(t).peak_blocks), (150, 2));
        sub(&st.profile, &st.thread, t, (100, 1), 12);
        assert_eq!(counts(t).peak_bytes, 150);
        add(&st.profile, &st.thread, t, (7, 1), 13, false);
        // Evicts t's cache record into the shared one (same cache index), after the peak.
        let u = t + CACHE as u32;
        add(&st.profile, &st.thread, u, (1, 1), 14, true);
        let n = counts(t);
        assert_eq!((n.peak_bytes, n.peak_blocks), (150, 2));
        assert_eq!((n.live_bytes, n.live_blocks, n.total_bytes), (57, 2, 150));
        assert_eq!(counts(u).live_bytes, 1);
        h.peak_seq.store(old, Relaxed);
    }
}
