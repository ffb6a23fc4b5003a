//! The stack store: interned stacks by 24-bit id (docs/LAYOUT.md "Stack store").

use core::sync::atomic::{AtomicPtr, AtomicU64};

/// log2 of the entries in one directory chunk.
pub const STACK_CHUNK_BITS: u32 = 16;
/// Directory length.
pub const STACK_CHUNKS: usize = 256;
/// Ids are 24 bits wide in a slot; id 0 means "no stack".
pub const MAX_STACK_ID: u64 = (1 << 24) - 1;
/// A stack's last frame equal to this means the stack was cut: the cap on distinct stacks
/// (`MEM_TRACE_MAX_STACKS`) was reached, and only the frames before it are the stack's.
/// It lies in the kernel's half of the address space, above every user-space address
/// (`0x7fff_ffff_ffff` at most), so no return address of a traced program equals it.
pub const CUT_MARKER: u64 = 0xffff_ffff_ffff_fffe;

/// The stack store's exported root. Stack id `i` is at `dir[i >> 16][i & 0xffff]`, the address
/// of a record: a `u64` frame count `n` then `n` return addresses, innermost first.
#[repr(C)]
pub struct StackStore {
    /// Ids `1..=count` have been handed out.
    pub count: AtomicU64,
    /// [`STACK_CHUNK_BITS`].
    pub chunk_bits: u32,
    /// [`STACK_CHUNKS`].
    pub chunks: u32,
    /// Chunks of record addresses (`0`: not published yet).
    pub dir: [AtomicPtr<AtomicU64>; STACK_CHUNKS],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_matches_layout_md() {
        assert_eq!(core::mem::offset_of!(StackStore, dir), 16);
        assert_eq!(core::mem::size_of::<StackStore>(), 16 + 8 * 256);
    }
}
