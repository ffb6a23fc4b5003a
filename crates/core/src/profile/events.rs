//! The event counter: each allocation and free takes the next sequence
//! number and moves the live byte count in one atomic step.
//!
//! Both words change on every event from every thread. Two `lock xadd`s on them were the
//! profiler's biggest cost on the churn benchmark (each ~3% of the run; perf put a third of
//! `record_with`'s samples on each), so they sit side by side, 16-byte aligned, at the start
//! of the header's second cache line (docs/LAYOUT.md), and one `lock cmpxchg16b` moves both.
//! Every x86_64 processor since 2006 has the instruction; without it (checked once at start)
//! two separate atomics do the same job.

use crate::store::header::header;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Whether the processor has `cmpxchg16b` (set at start-up).
static PAIRED: AtomicBool = AtomicBool::new(false);

/// Notes, once at start-up, whether the paired update can be used.
pub(crate) fn init() {
    PAIRED.store(std::arch::is_x86_feature_detected!("cmpxchg16b"), Relaxed);
}

/// Takes the next sequence number and adds `delta` (wrapping: a free passes the negated
/// size) to the live bytes, atomically together. Returns the sequence number and the live
/// bytes after the change.
#[inline(always)]
pub(crate) fn tick(delta: u64) -> (u64, u64) {
    let h = header();
    // With one thread in the process nothing else writes the pair (a signal handler's
    // allocations in it are nested in the tracer's guard and tick nothing), and readers
    // outside the process never saw the two words change as one anyway: plain loads and
    // stores do. The `lock cmpxchg16b` was ~40% of the time `free` spent on `deep`.
    if crate::sync::one_thread() {
        let seq = h.next_seq.load(Relaxed);
        h.next_seq.store(seq + 1, Relaxed);
        let live = h.live_bytes.load(Relaxed).wrapping_add(delta);
        h.live_bytes.store(live, Relaxed);
        return (seq, live);
    }
    if !PAIRED.load(Relaxed) {
        let seq = h.next_seq.fetch_add(1, Relaxed);
        let live = h.live_bytes.fetch_add(delta, Relaxed).wrapping_add(delta);
        return (seq, live);
    }
    let pair = h.next_seq.as_ptr();
    let mut old = (h.next_seq.load(Relaxed), h.live_bytes.load(Relaxed));
    loop {
        let new = (old.0 + 1, old.1.wrapping_add(delta));
        // SAFETY: `next_seq` and `live_bytes` are adjacent fields of the 16-byte aligned
        // header (offsets 64 and 72, pinned by the format crate's tests), only ever changed
        // atomically, and the processor has the instruction (PAIRED).
        let seen = unsafe { cmpxchg16b(pair, old, new) };
        if seen == old {
            return (old.0, new.1);
        }
        old = seen;
    }
}

/// A sequence number above every event's so far: the "now" of an update that is not an
/// event of its own (a record's change that only compares its stamp with the peak's).
#[inline(always)]
pub(crate) fn now_seq() -> u64 {
    header().next_seq.load(Relaxed)
}

/// `lock cmpxchg16b`: stores `new` at `p` if it holds `old`; returns what it held.
///
/// # Safety
/// `p` is 16-byte aligned, valid for reads and writes of 16 bytes that are only accessed
/// atomically, and the processor supports the instruction.
#[inline(always)]
unsafe fn cmpxchg16b(p: *mut u64, old: (u64, u64), new: (u64, u64)) -> (u64, u64) {
    let (lo, hi);
    // SAFETY: the caller's contract. `rbx` cannot be named as an operand, so the new low
    // word travels in `rsi` and is swapped in and out around the instruction. The address is
    // pinned to `rdi`: as `in(reg)` the compiler once chose `rbx` for it (a `Traced` program
    // built with fat LTO), which the swap then overwrote with the new low word, and the
    // instruction wrote to address 9.
    unsafe {
        core::arch::asm!(
            "xchg rsi, rbx",
            "lock cmpxchg16b xmmword ptr [rdi]",
            "mov rbx, rsi",
            in("rdi") p,
            inout("rsi") new.0 => _,
            in("rcx") new.1,
            inout("rax") old.0 => lo,
            inout("rdx") old.1 => hi,
            options(nostack),
        );
    }
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_add_up_across_threads() {
        init();
        let h = header();
        let before = h.live_bytes.load(Relaxed);
        let seq0 = h.next_seq.load(Relaxed);
        let hs: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..10_000 {
                        tick(8);
                        tick(3u64.wrapping_neg());
                    }
                })
            })
            .collect();
        for t in hs {
            t.join().unwrap();
        }
        // Other tests may tick meanwhile (with balanced deltas or not): at least ours.
        assert!(h.next_seq.load(Relaxed) - seq0 >= 80_000);
        assert!(h.live_bytes.load(Relaxed).wrapping_sub(before) >= 4 * 10_000 * 5);
    }
}
