//! `MEM_TRACE_HEADER`: the one exported static from which a reader outside the process (the
//! gdb commands, live or on a core file) finds every table without calling any code.
//!
//! The byte layout is a contract written down in `docs/LAYOUT.md`; `tests` below pin every
//! offset so that a change here cannot silently drift from the Python reader.

use crate::freed::{FreedHistory, HISTORY};
use crate::stacks::{StackStore, STACKS};
use crate::table::{Shard, SHARDS, SHARD_COUNT};
use crate::threads::{ThreadTable, THREADS};
use core::sync::atomic::AtomicU64;

/// Layout version; bump on any change of meaning or position (docs/LAYOUT.md).
pub const VERSION: u32 = 2;
/// `b"MEMTRACE"`.
pub const MAGIC: [u8; 8] = *b"MEMTRACE";
/// log2 of the region size used to pick a shard (docs/LAYOUT.md, "Shards").
pub const REGION_SHIFT: u32 = 16;

/// Header flag: the tracer has initialised.
pub const FLAG_INITIALISED: u64 = 1;
/// Header flag: built with the `profiler` feature.
pub const FLAG_PROFILER: u64 = 2;
/// Header flag: free stacks are recorded (`MEM_TRACE_FREE_STACKS`).
pub const FLAG_FREE_STACKS: u64 = 4;

/// The exported header. Fields are in `docs/LAYOUT.md` order.
#[repr(C)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_size: u32,
    pub slot_size: u32,
    pub shard_size: u32,
    pub shard_count: u32,
    pub region_shift: u32,
    pub shards: *const Shard,
    pub stacks: *const StackStore,
    pub threads: *const ThreadTable,
    /// The freed-block history.
    pub freed: *const FreedHistory,
    /// Sequence number of the next allocation; also the global allocation counter.
    pub next_seq: AtomicU64,
    pub flags: AtomicU64,
    /// Blocks the tracer could not record.
    pub untracked: AtomicU64,
    pub reserved: [u64; 5],
}

// SAFETY: the raw pointers point at statics that are themselves Sync, and are never written.
unsafe impl Sync for Header {}

/// The header gdb reads. `#[no_mangle]` keeps it in the dynamic symbol table, so it is found
/// even in a stripped `.so`; `#[used]` keeps the linker from dropping it.
#[no_mangle]
#[used]
pub static MEM_TRACE_HEADER: Header = Header {
    magic: MAGIC,
    version: VERSION,
    header_size: core::mem::size_of::<Header>() as u32,
    slot_size: core::mem::size_of::<crate::table::Slot>() as u32,
    shard_size: core::mem::size_of::<Shard>() as u32,
    shard_count: SHARD_COUNT as u32,
    region_shift: REGION_SHIFT,
    shards: &SHARDS as *const Shard,
    stacks: &STACKS,
    threads: &THREADS,
    freed: &HISTORY,
    next_seq: AtomicU64::new(1),
    flags: AtomicU64::new(if cfg!(feature = "profiler") {
        FLAG_PROFILER
    } else {
        0
    }),
    untracked: AtomicU64::new(0),
    reserved: [0; 5],
};

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn header_matches_layout_md() {
        assert_eq!(size_of::<Header>(), 128);
        assert_eq!(offset_of!(Header, version), 8);
        assert_eq!(offset_of!(Header, header_size), 12);
        assert_eq!(offset_of!(Header, slot_size), 16);
        assert_eq!(offset_of!(Header, shard_size), 20);
        assert_eq!(offset_of!(Header, shard_count), 24);
        assert_eq!(offset_of!(Header, region_shift), 28);
        assert_eq!(offset_of!(Header, shards), 32);
        assert_eq!(offset_of!(Header, stacks), 40);
        assert_eq!(offset_of!(Header, threads), 48);
        assert_eq!(offset_of!(Header, freed), 56);
        assert_eq!(offset_of!(Header, next_seq), 64);
        assert_eq!(offset_of!(Header, flags), 72);
        assert_eq!(offset_of!(Header, untracked), 80);
        assert_eq!(MEM_TRACE_HEADER.shard_count, 129);
        assert_eq!(MEM_TRACE_HEADER.slot_size, 24);
        assert_eq!(MEM_TRACE_HEADER.shard_size, 64);
    }
}
