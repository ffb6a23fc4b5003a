//! The thread table (docs/LAYOUT.md "Thread table").

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64};

/// log2 of the records in one chunk.
pub const THREAD_CHUNK_BITS: u32 = 12;
/// Directory length.
pub const THREAD_CHUNKS: usize = 4096;
/// Thread indexes are 24 bits wide in a slot; 0 means "unknown".
pub const MAX_THREAD_INDEX: u64 = (1 << 24) - 1;
/// Record flag: the thread has exited.
pub const THREAD_EXITED: u32 = 1;

/// One thread (32 bytes).
#[repr(C)]
pub struct ThreadRecord {
    /// Kernel thread id (`gettid`).
    pub tid: AtomicU32,
    /// [`THREAD_EXITED`].
    pub flags: AtomicU32,
    /// The thread's name when it first allocated, NUL-padded.
    pub name: [u8; 16],
    /// Zero.
    pub reserved: u64,
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
        assert_eq!(size_of::<ThreadRecord>(), 32);
        assert_eq!(offset_of!(ThreadRecord, flags), 4);
        assert_eq!(offset_of!(ThreadRecord, name), 8);
        assert_eq!(offset_of!(ThreadTable, dir), 16);
    }
}
