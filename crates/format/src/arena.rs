//! The tracer's own memory, described for readers outside the process (docs/LAYOUT.md
//! "Arena"). A leak scan reads the program's own anonymous mappings as roots, as memcheck
//! does (a pool or an interpreter's heap pages hold pointers to blocks), and must leave out
//! the tracer's: its tables hold every block's address, and as roots they would make every
//! block reachable. The tracer's arena marks its pages in a two-level bitmap; its scratch
//! region (for `print_trace`'s symbolizing) is one reservation beside it.

use core::sync::atomic::AtomicU64;

/// Bits of a page offset: the bitmap has one bit per 4 KiB page.
pub const ARENA_PAGE_BITS: u32 = 12;
/// Pages per leaf of the bitmap, as a power of two (a leaf covers 16 GiB).
pub const ARENA_LEAF_BITS: u32 = 22;
/// Leaves in the directory: the 48-bit address space.
pub const ARENA_LEAVES: usize = 1 << (48 - ARENA_PAGE_BITS - ARENA_LEAF_BITS);

/// Where the tracer's memory is: the header's `arena` points at one.
#[repr(C)]
pub struct ArenaMap {
    /// The bitmap's directory: [`ARENA_LEAVES`] words, each the address of a leaf or 0. Page
    /// `p` (its address >> [`ARENA_PAGE_BITS`]) is the arena's when bit `i % 64` of word
    /// `i / 64` of leaf `p >> ARENA_LEAF_BITS` is set, `i` being `p`'s low
    /// [`ARENA_LEAF_BITS`] bits. The leaves are the tracer's memory too.
    pub directory: *const u64,
    /// The scratch region's start, 0 while there is none.
    pub scratch_base: AtomicU64,
    /// Its length in bytes.
    pub scratch_len: AtomicU64,
    /// Reserved, 0.
    pub reserved: u64,
}

// SAFETY: `directory` is the address of a static, never written; the rest are atomics and a
// plain integer.
unsafe impl Sync for ArenaMap {}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn arena_map_matches_layout_md() {
        assert_eq!(size_of::<ArenaMap>(), 32);
        assert_eq!(offset_of!(ArenaMap, scratch_base), 8);
        assert_eq!(offset_of!(ArenaMap, scratch_len), 16);
        assert_eq!(ARENA_LEAVES, 16384);
    }
}
