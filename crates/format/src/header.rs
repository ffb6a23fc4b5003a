//! The header: the one exported static (`MEM_TRACE_HEADER`) from which a reader finds every
//! table (docs/LAYOUT.md "Header").

use crate::freed::FreedHistory;
use crate::profile::Profile;
use crate::stacks::{CallTree, StackStore};
use crate::table::Shard;
use crate::threads::ThreadTable;
use core::sync::atomic::AtomicU64;

/// Layout version; bumped on any change of a field's meaning or position. Readers refuse
/// versions they do not know, naming both.
pub const VERSION: u32 = 7;
/// `b"MEMTRACE"`, the header's first eight bytes.
pub const MAGIC: [u8; 8] = *b"MEMTRACE";

/// Header flag: the tracer has initialised.
pub const FLAG_INITIALISED: u64 = 1;
/// Header flag: built with the `profiler` feature.
pub const FLAG_PROFILER: u64 = 2;
/// Header flag: free stacks are recorded (`MEM_TRACE_FREE_STACKS`).
pub const FLAG_FREE_STACKS: u64 = 4;
/// Header flag: started in profile mode (`MEM_TRACE_MODE=profile`): the freed-block features
/// are off unless a variable of their own turned one back on.
pub const FLAG_PROFILE_MODE: u64 = 8;
/// The tracer was started in a running process by `mem-trace attach`, not preloaded: blocks
/// allocated before the attach are unknown to the tables.
pub const FLAG_ATTACHED: u64 = 16;
/// With `tag_key` not 0: tags are [`SEQ_TAG_SIZE`](crate::SEQ_TAG_SIZE) bytes and carry the
/// block's sequence number (debug mode, whose history needs it); without: [`TAG_SIZE`](crate::TAG_SIZE)
/// bytes, no sequence number. A reader that ignores the flag still reads every tag right,
/// only without its sequence number.
pub const FLAG_TAG_SEQ: u64 = 32;

/// The header (160 bytes, 16-byte aligned). Fields are in `docs/LAYOUT.md` order.
#[repr(C, align(16))]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`VERSION`].
    pub version: u32,
    /// `size_of::<Header>()`.
    pub header_size: u32,
    /// `size_of::<Slot>()`.
    pub slot_size: u32,
    /// `size_of::<Shard>()`.
    pub shard_size: u32,
    /// Region shards + 1; the last shard holds large blocks.
    pub shard_count: u32,
    /// log2 of the region size that picks a block's shard.
    pub region_shift: u32,
    /// The shard array.
    pub shards: *const Shard,
    /// The stack store.
    pub stacks: *const StackStore,
    /// The thread table.
    pub threads: *const ThreadTable,
    /// The freed-block history.
    pub freed: *const FreedHistory,
    /// Sequence number of the next allocation or free (one counter orders every event).
    pub next_seq: AtomicU64,
    /// Bytes in live blocks, all threads together (profiler builds only; `0` otherwise).
    /// Beside `next_seq`, 16-byte aligned: a profiler build moves both with one
    /// `cmpxchg16b`, so counting bytes costs no second atomic instruction per event.
    pub live_bytes: AtomicU64,
    /// `FLAG_*` bits.
    pub flags: AtomicU64,
    /// Blocks the tracer could not record.
    pub untracked: AtomicU64,
    /// The profiler's per-stack counters; null unless built with `profiler`.
    pub profile: *const Profile,
    /// The highest `live_bytes` since start or the last reset.
    pub peak_bytes: AtomicU64,
    /// Sequence number of the event that set `peak_bytes` (or of the reset): a stack's
    /// counters changed after it keep their value at the peak (see `StackCounters`).
    pub peak_seq: AtomicU64,
    /// The call tree, which stack records may name their frames in (version 4).
    pub tree: *const CallTree,
    /// `MEM_TRACE_SAMPLE`: the mean bytes between two sampled allocations, 0 when every block
    /// is recorded (version 5). A sampled block's counts are scaled by [`crate::weight`].
    pub sample_mean: AtomicU64,
    /// The key of block tags (version 6, see `tag`): 0 when no block is tagged and every
    /// live block is in the table.
    pub tag_key: AtomicU64,
    /// With [`FLAG_ATTACHED`]: the sequence number of the first event after the last
    /// `mem-trace attach`; every block allocated before it is unknown to the tables. 0 before
    /// the first attach and in every preloaded process (version 6).
    pub attached_at: AtomicU64,
    /// Where the tracer's own memory is, for a leak scan from outside that reads the
    /// program's own mappings ([`crate::ArenaMap`]); null from a library older than it
    /// (the word was reserved, 0, before), and then those mappings are not read.
    pub arena: *const crate::ArenaMap,
}

// SAFETY: the raw pointers are addresses of statics that are themselves Sync, and are never
// written after initialisation; the rest are atomics and plain integers.
unsafe impl Sync for Header {}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn header_matches_layout_md() {
        assert_eq!(size_of::<Header>(), 160);
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
        assert_eq!(offset_of!(Header, live_bytes), 72);
        assert_eq!(offset_of!(Header, flags), 80);
        assert_eq!(offset_of!(Header, untracked), 88);
        assert_eq!(offset_of!(Header, profile), 96);
        assert_eq!(offset_of!(Header, peak_bytes), 104);
        assert_eq!(offset_of!(Header, peak_seq), 112);
        assert_eq!(offset_of!(Header, tree), 120);
        assert_eq!(offset_of!(Header, sample_mean), 128);
        assert_eq!(offset_of!(Header, tag_key), 136);
        assert_eq!(offset_of!(Header, attached_at), 144);
        assert_eq!(offset_of!(Header, arena), 152);
    }
}
