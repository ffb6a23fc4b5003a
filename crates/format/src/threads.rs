//! The thread table (docs/LAYOUT.md "Thread table").

use crate::profile::StackCounters;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering::Relaxed};

/// log2 of the records in one chunk.
pub const THREAD_CHUNK_BITS: u32 = 12;
/// Directory length.
pub const THREAD_CHUNKS: usize = 4096;
/// Thread indexes are 24 bits wide in a slot; 0 means "unknown".
pub const MAX_THREAD_INDEX: u64 = (1 << 24) - 1;
/// Record flag: the thread has exited.
pub const THREAD_EXITED: u32 = 1;

/// One thread (64 bytes). The last five words are the profiler's (zero in other builds).
#[repr(C)]
pub struct ThreadRecord {
    /// Kernel thread id (`gettid`).
    pub tid: AtomicU32,
    /// [`THREAD_EXITED`].
    pub flags: AtomicU32,
    /// The thread's name when it first allocated, NUL-padded.
    pub name: [u8; 16],
    /// The thread's cache of per-stack counter deltas (profiler builds): [`crate::COUNTER_CACHE`]
    /// records; null when it has none (never had one, or exited and flushed it).
    pub counters: AtomicPtr<StackCounters>,
    /// Bytes of blocks this thread allocated and has not freed itself. Written only by the
    /// thread, so it costs no atomic read-modify-write.
    pub own_live: AtomicU64,
    /// Bytes of this thread's blocks that other threads freed. The thread's live bytes are
    /// `own_live - freed_elsewhere` (wrapping).
    pub freed_elsewhere: AtomicU64,
    /// The highest live bytes of this thread since start or the last reset.
    pub peak_bytes: AtomicU64,
    /// Bytes this thread ever allocated.
    pub allocated_bytes: AtomicU64,
}

impl ThreadRecord {
    /// The live bytes of the thread's blocks, `own_live - freed_elsewhere` (docs/LAYOUT.md
    /// "Thread table"). A reader racing a free may see the difference negative for an
    /// instant: that reads as 0.
    pub fn live_bytes(&self) -> u64 {
        crate::non_negative(
            self.own_live
                .load(Relaxed)
                .wrapping_sub(self.freed_elsewhere.load(Relaxed)),
        )
    }
}

/// The thread table's exported root: index `i` is record `i & 4095` of chunk `i >> 12`.
#[repr(C)]
pub struct ThreadTable {
    /// Indexes `1..=count` have been handed out.
    pub count: AtomicU64,
    /// [`THREAD_CHUNK_BITS`].
    pub chunk_bits: u32,
    /// [`THREAD_CHUNKS`].
    pub chunks: u32,
    /// Chunks of records.
    pub dir: [AtomicPtr<ThreadRecord>; THREAD_CHUNKS],
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn records_match_layout_md() {
        assert_eq!(size_of::<ThreadRecord>(), 64);
        assert_eq!(offset_of!(ThreadRecord, counters), 24);
        assert_eq!(offset_of!(ThreadRecord, own_live), 32);
        assert_eq!(offset_of!(ThreadRecord, freed_elsewhere), 40);
        assert_eq!(offset_of!(ThreadRecord, peak_bytes), 48);
        assert_eq!(offset_of!(ThreadRecord, allocated_bytes), 56);
        assert_eq!(offset_of!(ThreadRecord, flags), 4);
        assert_eq!(offset_of!(ThreadRecord, name), 8);
        assert_eq!(offset_of!(ThreadTable, dir), 16);
    }

    #[test]
    fn live_bytes_are_the_difference_and_never_negative() {
        let r = ThreadRecord {
            tid: AtomicU32::new(1),
            flags: AtomicU32::new(0),
            name: [0; 16],
            counters: AtomicPtr::new(core::ptr::null_mut()),
            own_live: AtomicU64::new(100),
            freed_elsewhere: AtomicU64::new(30),
            peak_bytes: AtomicU64::new(0),
            allocated_bytes: AtomicU64::new(0),
        };
        assert_eq!(r.live_bytes(), 70);
        r.freed_elsewhere.store(130, Relaxed);
        assert_eq!(r.live_bytes(), 0);
    }
}
