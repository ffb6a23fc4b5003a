//! Live bytes and their peaks, globally and per thread, and the reset that starts a new phase.
//!
//! The global count is one atomic in the header beside the sequence counter (the same cache
//! line, already owned by the thread that just took a sequence number). A thread's count is
//! split so that the common case costs no atomic read-modify-write: `own_live` is written only
//! by the thread itself (its allocations, and its frees of its own blocks), and other threads
//! add what they free of its blocks to `freed_elsewhere`. Its live bytes are the difference,
//! exact at the moment the thread reads it, since only it changes `own_live`.

use crate::profile::counters::PROFILE;
use crate::profile::events;
use crate::store::header::header;
use crate::store::threads;
use core::sync::atomic::Ordering::Relaxed;

/// The global live bytes became `live` at event `seq`: a new peak if above the last.
#[inline(always)]
pub(crate) fn global(live: u64, seq: u64) {
    if live > header().peak_bytes.load(Relaxed) && (live as i64) > 0 {
        global_peak(live, seq);
    }
}

/// A block of `size` bytes became live in the calling thread (its part `thread`); `new` when it is a new
/// allocation.
#[inline(always)]
pub(crate) fn add(thread: &threads::Local, size: u64, new: bool) {
    if let Some(t) = thread.record() {
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
        if crate::config::STATS.load(Relaxed) {
            let mapped = crate::arena::MAPPED.load(Relaxed);
            crate::arena::MAPPED_AT_PEAK.store(mapped, Relaxed);
        }
    }
}

/// A block of `size` bytes allocated by thread `owner` is no longer live; the calling thread
/// freed it (its part `thread`).
#[inline(always)]
pub(crate) fn sub(thread: &threads::Local, size: u64, owner: u32) {
    if owner == 0 {
        return;
    }
    match thread.record() {
        Some(t) if thread.index.get() == owner => {
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

/// Start-up: the clock reports measure the program's run from.
pub(crate) fn init() {
    PROFILE
        .started_ns
        .store(crate::clock::monotonic_ns(), Relaxed);
}

/// Starts a new phase: every peak becomes what is live now, so the next report's peaks are
/// the new phase's own. Lock-free and allocation-free: callable from gdb with `call`.
pub fn reset() {
    let h = header();
    h.peak_seq.store(events::now_seq(), Relaxed);
    h.peak_bytes.store(h.live_bytes.load(Relaxed), Relaxed);
    threads::for_each(|t| t.peak_bytes.store(t.live_bytes(), Relaxed));
    PROFILE.resets.fetch_add(1, Relaxed);
}
