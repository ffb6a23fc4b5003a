//! The live-block table: shards of slot arrays (docs/LAYOUT.md "Shards").

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64};

/// log2 of the region size used to pick a shard: a region is 64 KiB.
pub const REGION_SHIFT: u32 = 16;
/// Number of region shards (the shard index is 7 bits of a hash).
pub const REGION_SHARDS: usize = 128;
/// Region shards plus the large-block shard.
pub const SHARD_COUNT: usize = REGION_SHARDS + 1;
/// Index of the shard that holds blocks larger than a region.
pub const LARGE_SHARD: usize = REGION_SHARDS;
/// A slot's `addr` when empty.
pub const SLOT_EMPTY: u64 = 0;
/// A slot's `addr` while its entry moves (readers skip it).
pub const SLOT_MOVING: u64 = 1;

/// The region shard of region number `region` (`addr >> REGION_SHIFT`), with wrapping
/// arithmetic: `((region * 0x9E3779B97F4A7C15) mod 2^64) >> 57`.
#[inline(always)]
pub fn shard_of(region: u64) -> usize {
    (region.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as usize
}

/// One table entry (24 bytes).
#[repr(C)]
pub struct Slot {
    /// [`SLOT_EMPTY`], [`SLOT_MOVING`], or the block's start address (stored last).
    pub addr: AtomicU64,
    /// Size (40 bits) and allocating thread index (24 bits): see `pack_size_thread`.
    pub size_thread: AtomicU64,
    /// Sequence number (40 bits) and stack id (24 bits): see `pack_seq_id`.
    pub seq_stack: AtomicU64,
}

/// Head of a slot array; `capacity` slots follow it, so one pointer load gives a consistent
/// pair of capacity and slots.
#[repr(C)]
pub struct SlotArray {
    /// Slots that follow.
    pub capacity: u64,
    /// Zero.
    pub reserved: u64,
}

/// One shard (64 bytes, one cache line).
#[repr(C, align(64))]
pub struct Shard {
    /// Writer lock word (`0` free); readers ignore it.
    pub lock: AtomicU32,
    /// Zero.
    pub reserved0: u32,
    /// The slot array, null while the shard has never held a block.
    pub array: AtomicPtr<SlotArray>,
    /// Live blocks in this shard.
    pub live: AtomicU64,
    /// Always 0: removal shifts later entries back instead of leaving tombstones.
    pub tombstones: AtomicU64,
    /// Sum of the live blocks' sizes.
    pub live_bytes: AtomicU64,
    /// Zero.
    pub reserved: [u64; 3],
}

impl Shard {
    /// An empty shard.
    pub const fn new() -> Self {
        Self {
            lock: AtomicU32::new(0),
            reserved0: 0,
            array: AtomicPtr::new(core::ptr::null_mut()),
            live: AtomicU64::new(0),
            tombstones: AtomicU64::new(0),
            live_bytes: AtomicU64::new(0),
            reserved: [0; 3],
        }
    }
}

impl Default for Shard {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn shard_and_slot_match_layout_md() {
        assert_eq!(size_of::<Shard>(), 64);
        assert_eq!(offset_of!(Shard, array), 8);
        assert_eq!(offset_of!(Shard, live), 16);
        assert_eq!(offset_of!(Shard, tombstones), 24);
        assert_eq!(offset_of!(Shard, live_bytes), 32);
        assert_eq!(size_of::<Slot>(), 24);
        assert_eq!(offset_of!(Slot, size_thread), 8);
        assert_eq!(offset_of!(Slot, seq_stack), 16);
        assert_eq!(size_of::<SlotArray>(), 16);
        assert_eq!(SHARD_COUNT, 129);
    }

    #[test]
    fn shard_of_is_the_documented_hash() {
        assert_eq!(shard_of(0), 0);
        assert_eq!(shard_of(1), (0x9E37_79B9_7F4A_7C15u64 >> 57) as usize);
        assert!((0..100_000).all(|r| shard_of(r) < REGION_SHARDS));
    }
}
