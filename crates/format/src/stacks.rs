//! The stack store: interned stacks by 24-bit id (docs/LAYOUT.md "Stack store").

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64};

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

/// A record's first word with this bit set names its frames in the call tree instead of
/// holding them: the low 8 bits are the frame count `n`, the next word the id of the node of
/// the innermost frame; the frames are that node's `pc`, its parent's, ... `n` of them.
pub const STACK_IN_TREE: u64 = 1 << 63;

/// log2 of the nodes in one call-tree chunk.
pub const TREE_CHUNK_BITS: u32 = 16;
/// Call-tree directory length (at most 2^24 nodes).
pub const TREE_CHUNKS: usize = 256;

/// The call tree's exported root: node id `i` (from 1) is at `dir[i >> 16] + (i & 0xffff) *
/// 16`. A node is a frame under the node of its caller's frame, so stacks that share their
/// outer frames share their nodes: a stack of 60 frames whose outer 55 are another's costs
/// five nodes, not 60 words.
#[repr(C)]
pub struct CallTree {
    /// Node ids `1..=count` have been handed out; each is written before.
    pub count: AtomicU64,
    /// [`TREE_CHUNK_BITS`].
    pub chunk_bits: u32,
    /// [`TREE_CHUNKS`].
    pub chunks: u32,
    /// Chunks of nodes (`0`: none yet).
    pub dir: [AtomicPtr<TreeNode>; TREE_CHUNKS],
}

/// One frame in the call tree.
#[repr(C)]
pub struct TreeNode {
    /// The return address (or, at a stack's first frame, the pc) of the frame.
    pub pc: u64,
    /// The node of the caller's frame, always a smaller id; 0: the outermost frame.
    pub parent: u32,
    /// The writer's own use (the stack id the walk ending here was interned as).
    pub stack: AtomicU32,
}

/// The stack store's exported root. Stack id `i` is at `dir[i >> 16][i & 0xffff]`, the address
/// of a record: a `u64` frame count `n` then `n` return addresses, innermost first; or, with
/// [`STACK_IN_TREE`] set in the first word, the frames' node in the call tree.
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
        assert_eq!(core::mem::offset_of!(CallTree, dir), 16);
        assert_eq!(core::mem::size_of::<CallTree>(), 16 + 8 * 256);
        assert_eq!(core::mem::size_of::<TreeNode>(), 16);
        assert_eq!(core::mem::offset_of!(TreeNode, parent), 8);
    }
}
