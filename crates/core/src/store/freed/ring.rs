//! The ring itself, as the header exports it, and how a reader copies one of its records:
//! the leaf that the history's writers (`freed`) and its address index (`index`) share.

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use mem_trace_format::{FreedHistory, FreedRecord};

/// The one history.
pub static HISTORY: FreedHistory = FreedHistory {
    record_size: core::mem::size_of::<FreedRecord>() as u32,
    flags: AtomicU32::new(0),
    capacity: AtomicU64::new(0),
    records: AtomicPtr::new(core::ptr::null_mut()),
    written: AtomicU64::new(0),
    quarantine_limit: AtomicU64::new(0),
    quarantined_bytes: AtomicU64::new(0),
    errors: AtomicU64::new(0),
    index: AtomicPtr::new(core::ptr::null_mut()),
};

/// A record's five words, as a reader copies them (`addr` first, with acquire: the other
/// words then belong to it).
pub(super) fn words(r: &FreedRecord) -> [u64; 5] {
    let last = u64::from(r.free_thread.load(Ordering::Relaxed))
        | u64::from(r.flags.load(Ordering::Relaxed)) << 32;
    [
        r.addr.load(Ordering::Acquire),
        r.size_thread.load(Ordering::Relaxed),
        r.seq_stack.load(Ordering::Relaxed),
        r.free_seq_stack.load(Ordering::Relaxed),
        last,
    ]
}
