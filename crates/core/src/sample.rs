//! Sampling by bytes (`MEM_TRACE_SAMPLE=BYTES`): only some blocks are recorded, each counted
//! for what it stands for (`mem_trace_read::sample::weight`).
//!
//! Each thread counts down the bytes it allocates to its next sample point, drawn from an
//! exponential distribution of mean `BYTES` (a Poisson process over bytes, as tcmalloc,
//! jemalloc and Go do it): a block that reaches the point is sampled, and the next point is
//! drawn after it. An allocation that is not sampled costs a subtraction and a compare. Its
//! free must be told from a sampled block's without the table: [`Filter`] counts sampled live
//! blocks per hash of their address, so that a free whose count is 0 (nearly all of them) goes
//! straight to the real allocator, and only the others look in the table.

use crate::store::header::header;
use core::cell::Cell;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed, Ordering::Release};

/// The mean bytes between samples; 0: every block is recorded.
static MEAN: AtomicU64 = AtomicU64::new(0);
/// `MEM_TRACE_SAMPLE_SEED` plus one (0: none given, seeds come from the clock).
static SEED: AtomicU64 = AtomicU64::new(0);

/// Whether sampling's untouched path is open: sampling is on and the tracer is ready. Set
/// once, when the tracer becomes ready: it never leaves the ready states after that.
///
/// The path itself is the hooks' entries, written in assembly (the preload's `hooks::alloc`),
/// since it is the one most calls take: with this flag set, a `malloc` on a thread not busy
/// in the tracer whose size is below its countdown ([`COUNTDOWN_OFFSET`]) takes the size off
/// and goes to glibc; a `free` whose filter count ([`COUNTS`], [`FILTER_MUL`],
/// [`FILTER_SHIFT`]) is 0 goes to glibc. Neither enters the guard nor records anything.
pub static PASS: AtomicBool = AtomicBool::new(false);

/// Sampling's untouched path for the entries that read the thread's state, in one word: the
/// state's offset from the thread pointer when the path is open and that offset is the same
/// in every thread (`state::learn_static_offset`), else 0, and they look at [`PASS`] and
/// reach the state by the TLS descriptor.
pub static FAST: AtomicU64 = AtomicU64::new(0);

/// Opens the untouched path if sampling is on (the tracer just became ready); `offset` is
/// the state's static offset from the thread pointer, 0 if it has none.
pub(crate) fn open_pass(offset: u64) {
    if on() {
        FAST.store(offset, Release);
        PASS.store(true, Release);
    }
}

/// Turns sampling on (`mean` > 0) before the first allocation is recorded; published in the
/// header for readers.
pub(crate) fn configure(mean: u64, seed: Option<u64>) {
    if mean != 0 {
        // Sampled captures are too far apart to join each other's walks: each names a walk
        // from another outermost frame, and the call tree grew ~60 nodes (16 bytes each)
        // per sampled stack on `deep` (3.7 MB). By their frames they take one record each.
        crate::capture::stop_naming();
    }
    MEAN.store(mean, Relaxed);
    SEED.store(seed.map_or(0, |s| s.wrapping_add(1)), Relaxed);
    header().sample_mean.store(mean, Relaxed);
}

/// The mean bytes between samples; 0 when every block is recorded.
pub(crate) fn mean() -> u64 {
    MEAN.load(Relaxed)
}

/// Whether blocks are sampled rather than all recorded.
#[inline(always)]
pub(crate) fn on() -> bool {
    MEAN.load(Relaxed) != 0
}

/// `(bytes, blocks)` that a recorded block of `size` bytes at `addr` counts for.
#[inline(always)]
pub(crate) fn counted(addr: u64, size: u64) -> (u64, u64) {
    match MEAN.load(Relaxed) {
        0 => (size, 1),
        mean => mem_trace_read::sample::weight(addr, size, mean),
    }
}

/// Bytes until the calling thread's next sample, and its generator.
pub(crate) struct Local {
    /// Bytes left before the next sample point; 0 before the first draw; never negative, so
    /// that the hooks' entries compare a size with it unsigned.
    countdown: Cell<i64>,
    /// xorshift state; 0 until seeded.
    rng: Cell<u64>,
}

/// Where the countdown lies in [`Local`] (see [`PASS`]).
pub(crate) const COUNTDOWN_OFFSET: usize = core::mem::offset_of!(Local, countdown);

impl Local {
    pub(crate) const fn new() -> Self {
        Local {
            countdown: Cell::new(0),
            rng: Cell::new(0),
        }
    }

    /// Whether an allocation of `size` bytes is left unrecorded (sampling on). `order` gives
    /// the thread's index in the thread table, for a reproducible seed.
    #[inline(always)]
    pub(crate) fn skip(&self, size: u64, order: impl FnOnce() -> u32) -> bool {
        let left = self
            .countdown
            .get()
            .saturating_sub(size.min(i64::MAX as u64) as i64);
        if left > 0 {
            self.countdown.set(left);
            return true;
        }
        self.reached(size, order())
    }

    /// The countdown reached a sample point (or was never drawn): the block is sampled,
    /// and the next point drawn after it.
    #[cold]
    #[inline(never)]
    fn reached(&self, size: u64, order: u32) -> bool {
        if self.rng.get() == 0 {
            self.rng.set(seed(order));
            self.countdown.set(self.draw());
            // The process starts here: this block is measured against the first point.
            let left = self
                .countdown
                .get()
                .saturating_sub(size.min(i64::MAX as u64) as i64);
            if left > 0 {
                self.countdown.set(left);
                return true;
            }
        }
        self.countdown.set(self.draw());
        false
    }

    /// The next gap between sample points: exponential with mean MEAN, at least 1 byte.
    fn draw(&self) -> i64 {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        // Uniform in (0, 1]: never ln(0).
        let u = ((x >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let gap = -(MEAN.load(Relaxed) as f64) * mem_trace_read::exp::ln(u);
        (gap.min(i64::MAX as f64 / 2.0) as i64).max(1)
    }
}

/// A thread's first generator state: from `MEM_TRACE_SAMPLE_SEED` and the thread's order of
/// first allocation (`order`), so that the same seed gives a program the same samples; else
/// from the clock.
fn seed(order: u32) -> u64 {
    let base = match SEED.load(Relaxed) {
        0 => {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: writes the current time into `ts`.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
            (ts.tv_sec as u64).wrapping_mul(1_000_000_007) ^ ts.tv_nsec as u64
        }
        s => s,
    };
    splitmix(base ^ u64::from(order).wrapping_mul(0xA076_1D64_78BD_642F)).max(1)
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Sampled live blocks counted per hash of their address. A count stuck at 255 stays there
/// (its blocks are then always looked up), so a count never drops below the blocks it has.
pub(crate) struct Filter;

const FILTER_BITS: u32 = 16;
/// The filter's counts, one byte per hash of an address (see [`PASS`]).
pub static COUNTS: [AtomicU8; 1 << FILTER_BITS] = [const { AtomicU8::new(0) }; 1 << FILTER_BITS];
/// An address's count is `COUNTS[(addr * FILTER_MUL) >> FILTER_SHIFT]`.
pub const FILTER_MUL: u64 = 0x9E37_79B9_7F4A_7C15;
/// See [`FILTER_MUL`].
pub const FILTER_SHIFT: u32 = 64 - FILTER_BITS;

#[inline(always)]
fn slot(addr: u64) -> &'static AtomicU8 {
    &COUNTS[(addr.wrapping_mul(FILTER_MUL) >> FILTER_SHIFT) as usize]
}

impl Filter {
    /// A sampled block at `addr` became live.
    pub(crate) fn add(addr: u64) {
        let c = slot(addr);
        let _ = c.fetch_update(Relaxed, Relaxed, |n| (n < u8::MAX).then(|| n + 1));
    }

    /// The sampled block at `addr` left the table.
    pub(crate) fn remove(addr: u64) {
        let c = slot(addr);
        let _ = c.fetch_update(Relaxed, Relaxed, |n| (n > 0 && n < u8::MAX).then(|| n - 1));
    }

    /// Whether `addr` may be a sampled live block (false: surely not).
    #[inline(always)]
    pub(crate) fn may_hold(addr: u64) -> bool {
        slot(addr).load(Relaxed) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_average_the_mean() {
        MEAN.store(1000, Relaxed);
        let l = Local::new();
        l.rng.set(12345);
        let n = 20_000;
        let total: i64 = (0..n).map(|_| l.draw()).sum();
        let mean = total as f64 / n as f64;
        assert!((950.0..1050.0).contains(&mean), "{mean}");
        MEAN.store(0, Relaxed);
    }

    #[test]
    fn the_filter_counts_and_saturates() {
        let a = 0x7000_1230u64;
        assert!(!Filter::may_hold(a));
        Filter::add(a);
        Filter::add(a);
        Filter::remove(a);
        assert!(Filter::may_hold(a));
        Filter::remove(a);
        assert!(!Filter::may_hold(a));
        for _ in 0..300 {
            Filter::add(a);
        }
        for _ in 0..300 {
            Filter::remove(a);
        }
        assert!(Filter::may_hold(a), "a saturated count stays");
    }
}
