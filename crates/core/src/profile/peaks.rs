//! Live bytes and their peaks, globally and per thread, and the reset that starts a new phase.
//!
//! The global count is one atomic in the header beside the sequence counter (the same cache
//! line, already owned by the thread that just took a sequence number). A thread's count is
//! split so that the common case costs no atomic read-modify-write: `own_live` is written only
//! by the thread itself (its allocations, and its frees of its own blocks), and other threads
//! add what they free of its blocks to `freed_elsewhere`. Its live bytes are the difference,
//! exact at the moment the thread reads it, since only it changes `own_live`.

use crate::profile::counters::PROFILE;
use crate::state::ThreadState;
use crate::store::header::header;
use crate::store::threads;
use core::sync::atomic::Ordering::Relaxed;
use mem_trace_format::ThreadRecord;

/// The global live bytes became `live` at event `seq`: a new peak if above the last.
#[inline(always)]
pub(crate) fn global(live: u64, seq: u64) {
    if live > header().peak_bytes.load(Relaxed) && (live as i64) > 0 {
        global_peak(live, seq);
    }
}

/// A block of `size` bytes became live in the calling thread; `new` when it is a new
/// allocation.
#[inline(always)]
pub(crate) fn add(state: &ThreadState, size: u64, new: bool) {
    if let Some(t) = state.thread.record() {
        let own = t.own_live.load(Relaxed).wrapping_add(size);
        t.own_live.store(own, Relaxed);
        if new {
            let a = &t.allocated_bytes;
            a.store(a.load(Relaxed).wrapping_add(size), Relaxed);
        }
        let mine = own.wrapping_sub(t.freed_elsewhere.load(Relaxed));
        if mine > t.peak_bytes.load(Relaxed) && (mine as i64) > 0 {
            t.peak_bytes.store(mine, Relaxed);
        }
    }
}

#[cold]
#[inline(never)]
fn global_peak(live: u64, seq: u64) {
    let h = header();
    if h.peak_bytes.fetch_max(live, Relaxed) < live {
        h.peak_seq.store(seq, Relaxed);
    }
}

/// A block of `size` bytes allocated by thread `owner` is no longer live; the calling thread
/// freed it.
#[inline(always)]
pub(crate) fn sub(state: &ThreadState, size: u64, owner: u32) {
    if owner == 0 {
        return;
    }
    match state.thread.record() {
        Some(t) if state.thread.index.get() == owner => {
            t.own_live
                .store(t.own_live.load(Relaxed).wrapping_sub(size), Relaxed);
        }
        _ => {
            if let Some(t) = threads::get(owner) {
                t.freed_elsewhere.fetch_add(size, Relaxed);
            }
        }
    }
}

/// The live bytes of a thread's blocks.
pub fn thread_live(t: &ThreadRecord) -> u64 {
    t.own_live
        .load(Relaxed)
        .wrapping_sub(t.freed_elsewhere.load(Relaxed))
}

/// Start-up: the clock reports measure the program's run from.
pub(crate) fn init() {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the current time into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    PROFILE.started_ns.store(
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
        Relaxed,
    );
}

/// A live count that a racing free has made negative for an instant reads as 0.
fn positive(n: u64) -> u64 {
    if (n as i64) < 0 {
        0
    } else {
        n
    }
}

/// Starts a new phase: every peak becomes what is live now, so the next report's peaks are
/// the new phase's own. Lock-free and allocation-free: callable from gdb with `call`.
pub fn reset() {
    let h = header();
    h.peak_seq.store(h.next_seq.load(Relaxed), Relaxed);
    h.peak_bytes.store(h.live_bytes.load(Relaxed), Relaxed);
    threads::for_each(|t| t.peak_bytes.store(positive(thread_live(t)), Relaxed));
    PROFILE.resets.fetch_add(1, Relaxed);
}
