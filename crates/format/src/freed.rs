//! The freed-block history (docs/LAYOUT.md "Freed-block history").

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64};

/// Record flag: freed by `realloc`.
pub const FREED_BY_REALLOC: u32 = 1;
/// History flag: free stacks are recorded.
pub const FREED_FLAG_FREE_STACKS: u32 = 1;

/// One free (40 bytes).
#[repr(C)]
pub struct FreedRecord {
    /// Block start; `0`: empty, or being rewritten (stored last).
    pub addr: AtomicU64,
    /// As in a slot: size and allocating thread.
    pub size_thread: AtomicU64,
    /// As in a slot: allocation sequence number and stack id.
    pub seq_stack: AtomicU64,
    /// Sequence number of the free and the free stack id.
    pub free_seq_stack: AtomicU64,
    /// Thread index of the freeing thread.
    pub free_thread: AtomicU32,
    /// [`FREED_BY_REALLOC`].
    pub flags: AtomicU32,
}

/// The history header (64 bytes).
#[repr(C)]
pub struct FreedHistory {
    /// `size_of::<FreedRecord>()`.
    pub record_size: u32,
    /// [`FREED_FLAG_FREE_STACKS`].
    pub flags: AtomicU32,
    /// Records in the ring; 0: history disabled.
    pub capacity: AtomicU64,
    /// The ring, null until the first free.
    pub records: AtomicPtr<FreedRecord>,
    /// Records ever claimed; record `k` is at index `k % capacity`.
    pub written: AtomicU64,
    /// Bytes of freed blocks held back from reuse (`MEM_TRACE_QUARANTINE`).
    pub quarantine_limit: AtomicU64,
    /// Bytes held back now, all threads together (updated in steps).
    pub quarantined_bytes: AtomicU64,
    /// Double and invalid frees reported so far.
    pub errors: AtomicU64,
    /// Zero.
    pub reserved: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn history_matches_layout_md() {
        assert_eq!(size_of::<FreedRecord>(), 40);
        assert_eq!(offset_of!(FreedRecord, free_thread), 32);
        assert_eq!(size_of::<FreedHistory>(), 64);
        assert_eq!(offset_of!(FreedHistory, written), 24);
        assert_eq!(offset_of!(FreedHistory, errors), 48);
    }
}
