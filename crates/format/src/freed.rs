//! The freed-block history (docs/LAYOUT.md "Freed-block history") and its address index
//! ("Freed-block index").

use crate::packing::LOW40;
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
    /// The address index over the ring; null when the ring has none (small rings).
    pub index: AtomicPtr<FreedIndex>,
}

/// The address index's header (64 bytes, at [`FreedHistory::index`]).
#[repr(C)]
pub struct FreedIndex {
    /// Level 0's granule is `1 << granule_shift` bytes ([`INDEX_GRANULE_SHIFT`]).
    pub granule_shift: u32,
    /// Each level's granule is `1 << level_shift` times the one below ([`INDEX_LEVEL_SHIFT`]).
    pub level_shift: u32,
    /// Levels `0..levels` ([`INDEX_LEVELS`]).
    pub levels: u32,
    /// The chain heads are `1 << head_bits` words.
    pub head_bits: AtomicU32,
    /// The bucket hash's multiplier ([`INDEX_MULTIPLIER`]).
    pub multiplier: u64,
    /// Chain heads: a record number plus one, `0` for an empty chain.
    pub heads: AtomicPtr<AtomicU64>,
    /// One link word per ring record, at the record's index: see [`pack_link`].
    pub links: AtomicPtr<AtomicU64>,
    /// How far behind the claims a record was when it joined its chain, at most (see
    /// docs/LAYOUT.md): the window of the ring a reader scans past a chain cut short.
    pub disorder: AtomicU64,
    /// Zero.
    pub reserved: [u64; 2],
}

/// Level 0's granule: 64 bytes.
pub const INDEX_GRANULE_SHIFT: u32 = 6;
/// Each level's granule is 4 times the one below.
pub const INDEX_LEVEL_SHIFT: u32 = 2;
/// Levels 0..18: the last one's granule, 2^40 bytes, holds the largest size a record keeps.
pub const INDEX_LEVELS: u32 = 18;
/// The bucket hash's multiplier (the shard hash's).
pub const INDEX_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;
/// Bits of a link word that hold the next record number plus one.
const NEXT_BITS: u32 = 40;
/// Mask of a link word's lap (the owner's `k / capacity`, modulo 2^24).
const LAP_MASK: u64 = (1 << (64 - NEXT_BITS)) - 1;

/// The index's arithmetic (docs/LAYOUT.md "Freed-block index"), from its header's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexGeometry {
    /// [`FreedIndex::granule_shift`].
    pub granule_shift: u32,
    /// [`FreedIndex::level_shift`].
    pub level_shift: u32,
    /// [`FreedIndex::levels`].
    pub levels: u32,
    /// [`FreedIndex::head_bits`].
    pub head_bits: u32,
    /// [`FreedIndex::multiplier`].
    pub multiplier: u64,
}

impl IndexGeometry {
    /// The writer's geometry for `1 << head_bits` chain heads.
    pub const fn new(head_bits: u32) -> Self {
        IndexGeometry {
            granule_shift: INDEX_GRANULE_SHIFT,
            level_shift: INDEX_LEVEL_SHIFT,
            levels: INDEX_LEVELS,
            head_bits,
            multiplier: INDEX_MULTIPLIER,
        }
    }

    /// Whether a reader can use these values: 1 to 32 levels (the level is 5 bits of the
    /// hashed key), every level's granule shift below 64 and the last one's granule at least
    /// the largest recorded size (`2^40 - 1`), 4 to 32 head bits (a line of 8 heads at least
    /// twice).
    pub fn valid(&self) -> bool {
        let last = u64::from(self.granule_shift)
            + u64::from(self.level_shift) * u64::from(self.levels.saturating_sub(1));
        (1..=32).contains(&self.levels)
            && self.level_shift >= 1
            && (u64::from(LOW40.ilog2()) + 1..64).contains(&last)
            && (4..=32).contains(&self.head_bits)
    }

    /// The granule shift of `level`.
    #[inline(always)]
    pub fn shift(&self, level: u32) -> u32 {
        self.granule_shift + self.level_shift * level
    }

    /// The level a block of `size` bytes (as recorded: saturated at `2^40 - 1`) is indexed at:
    /// the smallest whose granule is at least `size`.
    #[inline(always)]
    pub fn level(&self, size: u64) -> u32 {
        let size = size.min(LOW40);
        if size <= 1 << self.granule_shift {
            return 0;
        }
        // `size <= 2^bits`.
        let bits = 64 - (size - 1).leading_zeros();
        (bits - self.granule_shift).div_ceil(self.level_shift)
    }

    /// The chain head of granule `granule` of `level`: eight neighbouring granules share a
    /// line of heads, whose place is hashed:
    /// `((((granule >> 3) * 32 + level) * multiplier mod 2^64) >> (67 - head_bits)) * 8 + granule % 8`.
    #[inline(always)]
    pub fn bucket(&self, level: u32, granule: u64) -> u64 {
        let line = (((granule >> 3) << 5) | u64::from(level)).wrapping_mul(self.multiplier)
            >> (64 - (self.head_bits - 3));
        (line << 3) | (granule & 7)
    }
}

/// The link word of record `k` in a ring of `capacity` records whose chain goes on to record
/// `next_plus_one - 1` (`0`: the chain ends): the owner's lap `k / capacity` (modulo 2^24) in
/// the high 24 bits, so a reader tells a link rewritten by a later record in the same slot.
#[inline(always)]
pub fn pack_link(k: u64, capacity: u64, next_plus_one: u64) -> u64 {
    ((k / capacity) & LAP_MASK) << NEXT_BITS | (next_plus_one & LOW40)
}

/// A link word's next record number plus one (`0`: the chain ends), if the word is record
/// `k`'s; `None` when the slot now holds another record's link.
#[inline(always)]
pub fn link_next(word: u64, k: u64, capacity: u64) -> Option<u64> {
    (word >> NEXT_BITS == (k / capacity) & LAP_MASK).then_some(word & LOW40)
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
        assert_eq!(offset_of!(FreedHistory, index), 56);
    }

    #[test]
    fn index_matches_layout_md() {
        assert_eq!(size_of::<FreedIndex>(), 64);
        assert_eq!(offset_of!(FreedIndex, level_shift), 4);
        assert_eq!(offset_of!(FreedIndex, levels), 8);
        assert_eq!(offset_of!(FreedIndex, head_bits), 12);
        assert_eq!(offset_of!(FreedIndex, multiplier), 16);
        assert_eq!(offset_of!(FreedIndex, heads), 24);
        assert_eq!(offset_of!(FreedIndex, links), 32);
        assert_eq!(offset_of!(FreedIndex, disorder), 40);
        assert!(IndexGeometry::new(20).valid());
    }

    #[test]
    fn a_block_is_indexed_at_the_smallest_level_that_holds_it() {
        let g = IndexGeometry::new(20);
        assert_eq!((g.level(0), g.level(1), g.level(64)), (0, 0, 0));
        assert_eq!((g.level(65), g.level(256), g.level(257)), (1, 1, 2));
        assert_eq!(g.shift(1), 8);
        for level in 0..INDEX_LEVELS {
            let granule = 1u64 << g.shift(level);
            assert_eq!(g.level(granule), level, "exactly the granule");
            if level + 1 < INDEX_LEVELS {
                assert_eq!(g.level(granule + 1), level + 1, "one byte more");
            }
        }
        assert_eq!(g.level(LOW40), INDEX_LEVELS - 1);
        assert_eq!(
            g.level(u64::MAX),
            INDEX_LEVELS - 1,
            "sizes saturate as recorded"
        );
        assert_eq!(g.shift(INDEX_LEVELS - 1), 40);
    }

    #[test]
    fn buckets_are_the_documented_hash() {
        let g = IndexGeometry::new(20);
        assert_eq!(g.bucket(0, 0), 0);
        assert_eq!(
            g.bucket(3, 1),
            ((3u64.wrapping_mul(INDEX_MULTIPLIER)) >> 47) * 8 + 1
        );
        assert_eq!(
            g.bucket(3, 8 * 5 + 6),
            (((5 * 32 + 3) as u64).wrapping_mul(INDEX_MULTIPLIER) >> 47) * 8 + 6
        );
        assert_eq!(
            g.bucket(2, 16) + 7,
            g.bucket(2, 23),
            "eight granules, one line"
        );
        assert!((0..10_000).all(|q| g.bucket(q as u32 % 18, q) < 1 << 20));
    }

    #[test]
    fn links_name_their_owner() {
        let cap = 3 << 20;
        let w = pack_link(5 * cap + 7, cap, 42);
        assert_eq!(link_next(w, 5 * cap + 7, cap), Some(42));
        assert_eq!(
            link_next(w, 4 * cap + 7, cap),
            None,
            "an older record of the slot"
        );
        assert_eq!(
            link_next(w, 6 * cap + 7, cap),
            None,
            "a later one not written yet"
        );
        assert_eq!(link_next(pack_link(7, cap, 0), 7, cap), Some(0));
        let far = (1u64 << 40) - 2;
        assert_eq!(link_next(pack_link(far, cap, far), far, cap), Some(far));
    }

    #[test]
    fn geometries_a_reader_cannot_use_are_refused() {
        let ok = IndexGeometry::new(20);
        for bad in [
            IndexGeometry { levels: 0, ..ok },
            IndexGeometry { levels: 17, ..ok },
            IndexGeometry {
                level_shift: 0,
                ..ok
            },
            IndexGeometry {
                granule_shift: 40,
                ..ok
            },
            IndexGeometry { head_bits: 3, ..ok },
            IndexGeometry {
                head_bits: 33,
                ..ok
            },
        ] {
            assert!(!bad.valid(), "{bad:?}");
        }
    }
}
