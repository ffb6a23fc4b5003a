//! The profiler's counters (docs/LAYOUT.md "Profile"): per interned stack, what its blocks
//! hold now, what it ever allocated, and what it held at the global peak.

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering::Relaxed};

/// log2 of the counter records in one chunk.
pub const COUNTER_CHUNK_BITS: u32 = 12;
/// Directory length: covers every 24-bit stack id.
pub const COUNTER_CHUNKS: usize = 4096;

/// Records in a thread's cache of counter deltas (`ThreadRecord::counters`).
pub const COUNTER_CACHE: usize = 128;

/// The counters of one stack id (64 bytes, one cache line), in the shared directory; or, in a
/// thread's cache, what that thread has added to them and not yet moved to the shared record
/// (every field then a wrapping delta). A stack's true counts are its shared record plus the
/// cache records of every thread that name it (`stack`).
///
/// The value at the global peak is kept lazily and exactly: an update first checks whether the
/// record last changed at or before the peak (`last_seq <= header.peak_seq`); if so, the value
/// it is about to change is the value it had at the peak, and is copied into `peak_*`. A
/// reader does the same check: a record not changed since the peak held `live_*` at the peak.
#[repr(C)]
pub struct StackCounters {
    /// Bytes in this stack's live blocks.
    pub live_bytes: AtomicU64,
    /// This stack's live blocks.
    pub live_blocks: AtomicU64,
    /// Bytes ever allocated from this stack.
    pub total_bytes: AtomicU64,
    /// Blocks ever allocated from this stack.
    pub total_blocks: AtomicU64,
    /// `live_bytes` at the global peak, valid when `last_seq > header.peak_seq`.
    pub peak_bytes: AtomicU64,
    /// `live_blocks` at the global peak, on the same condition.
    pub peak_blocks: AtomicU64,
    /// Sequence number of the last update (`0`: never updated).
    pub last_seq: AtomicU64,
    /// Writer lock of a shared record; readers ignore it. Zero in a cache record.
    pub lock: AtomicU32,
    /// In a cache record: the stack id plus one (`0`: empty). Zero in a shared record.
    pub stack: AtomicU32,
}

/// The profiler's exported root (at `header.profile`).
#[repr(C)]
pub struct Profile {
    /// `size_of::<StackCounters>()`.
    pub counter_size: u32,
    /// [`COUNTER_CHUNK_BITS`].
    pub chunk_bits: u32,
    /// [`COUNTER_CHUNKS`].
    pub chunks: u32,
    /// Zero.
    pub flags: u32,
    /// `CLOCK_MONOTONIC` at start, in nanoseconds (reports say how long the program ran).
    pub started_ns: AtomicU64,
    /// How many times the peaks were reset (`mem_trace_reset_peaks`): the phase number.
    pub resets: AtomicU64,
    /// Reports written so far (periodic, on signal, at exit).
    pub reports: AtomicU64,
    /// Zero.
    pub reserved: [u64; 3],
    /// Chunk `k` holds the counters of stack ids `k << 12 ..`; null until one is counted.
    pub dir: [AtomicPtr<StackCounters>; COUNTER_CHUNKS],
}

/// What a record (shared or cached) held at the global peak: `(bytes, blocks)`. A record not
/// changed since the peak held its live values then; one changed since saved them.
pub fn at_peak(c: &StackCounters, peak_seq: u64) -> (u64, u64) {
    if c.last_seq.load(Relaxed) <= peak_seq {
        (c.live_bytes.load(Relaxed), c.live_blocks.load(Relaxed))
    } else {
        (c.peak_bytes.load(Relaxed), c.peak_blocks.load(Relaxed))
    }
}

/// A count summed with wrapping arithmetic, read as signed and clamped at 0: a reader that does
/// not stop the writer (or a sum of deltas caught mid-move) may see it negative for an instant.
pub fn non_negative(n: u64) -> u64 {
    if (n as i64) < 0 {
        0
    } else {
        n
    }
}

/// A stack's counts as readers sum them: its shared record plus every thread's cache record
/// for it, with wrapping arithmetic (a cache record's deltas may be negative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Bytes in live blocks.
    pub live_bytes: u64,
    /// Live blocks.
    pub live_blocks: u64,
    /// Bytes ever allocated.
    pub total_bytes: u64,
    /// Blocks ever allocated.
    pub total_blocks: u64,
    /// Bytes live at the global peak.
    pub peak_bytes: u64,
    /// Blocks live at the global peak.
    pub peak_blocks: u64,
}

impl Counts {
    /// Adds one record, given the header's `peak_seq`.
    pub fn add(&mut self, c: &StackCounters, peak_seq: u64) {
        let (pb, pn) = at_peak(c, peak_seq);
        self.live_bytes = self.live_bytes.wrapping_add(c.live_bytes.load(Relaxed));
        self.live_blocks = self.live_blocks.wrapping_add(c.live_blocks.load(Relaxed));
        self.total_bytes = self.total_bytes.wrapping_add(c.total_bytes.load(Relaxed));
        self.total_blocks = self.total_blocks.wrapping_add(c.total_blocks.load(Relaxed));
        self.peak_bytes = self.peak_bytes.wrapping_add(pb);
        self.peak_blocks = self.peak_blocks.wrapping_add(pn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn profile_matches_layout_md() {
        assert_eq!(size_of::<StackCounters>(), 64);
        assert_eq!(offset_of!(StackCounters, live_blocks), 8);
        assert_eq!(offset_of!(StackCounters, total_bytes), 16);
        assert_eq!(offset_of!(StackCounters, total_blocks), 24);
        assert_eq!(offset_of!(StackCounters, peak_bytes), 32);
        assert_eq!(offset_of!(StackCounters, peak_blocks), 40);
        assert_eq!(offset_of!(StackCounters, last_seq), 48);
        assert_eq!(offset_of!(StackCounters, lock), 56);
        assert_eq!(offset_of!(StackCounters, stack), 60);
        assert_eq!(offset_of!(Profile, started_ns), 16);
        assert_eq!(offset_of!(Profile, resets), 24);
        assert_eq!(offset_of!(Profile, reports), 32);
        assert_eq!(offset_of!(Profile, dir), 64);
        assert_eq!(size_of::<Profile>(), 64 + 8 * 4096);
    }
}
