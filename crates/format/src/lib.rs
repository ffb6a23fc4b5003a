//! # The mem-trace memory layout, as types
//!
//! `docs/LAYOUT.md` is a contract between the tracer inside a process (the writer) and every
//! reader outside it: the gdb commands in Python, and Rust readers of another process or of a
//! core file. This crate is that contract's one Rust definition: `#[repr(C)]` types whose field
//! order and sizes are the documented byte layout, the constants, and the bit packing of the
//! words that hold several fields. The writer instantiates these types as statics; a reader
//! copies their bytes out of another address space and views them as the same types.
//!
//! No logic beyond packing and the contract's arithmetic (the shard hash, the freed-block
//! index's levels and heads) lives here, and nothing allocates (`no_std`): what the writer does
//! with the tables, and how a reader finds a block, are the business of the crates that use it.
//! Pointers are addresses in the traced process; a reader never dereferences them, it reads
//! the memory they name through its own memory source.
//!
//! Every offset is pinned by a test below, against the tables of `docs/LAYOUT.md`.

#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod arena;
mod block;
mod freed;
mod header;
mod packing;
mod profile;
mod stacks;
mod table;
mod tag;
mod threads;

pub use arena::{ArenaMap, ARENA_LEAF_BITS, ARENA_LEAVES, ARENA_PAGE_BITS};
pub use block::{Block, Freed};
pub use freed::{
    link_next, pack_link, FreedHistory, FreedIndex, FreedRecord, IndexGeometry, FREED_BY_REALLOC,
    FREED_FLAG_FREE_STACKS, INDEX_GRANULE_SHIFT, INDEX_LEVELS, INDEX_LEVEL_SHIFT, INDEX_MULTIPLIER,
};
pub use header::{
    Header, FLAG_ATTACHED, FLAG_FREE_STACKS, FLAG_INITIALISED, FLAG_PROFILER, FLAG_PROFILE_MODE,
    FLAG_TAG_SEQ, MAGIC, VERSION,
};
pub use packing::{
    pack_seq_id, pack_size_thread, unpack_seq_id, unpack_size_thread, LOW40, SIZE_BITS,
};
pub use profile::{
    at_peak, non_negative, Counts, Profile, StackCounters, COUNTER_CACHE, COUNTER_CHUNKS,
    COUNTER_CHUNK_BITS,
};
pub use stacks::{
    CallTree, StackStore, TreeNode, CUT_MARKER, MAX_STACK_ID, STACK_CHUNKS, STACK_CHUNK_BITS,
    STACK_IN_TREE, TREE_CHUNKS, TREE_CHUNK_BITS,
};
pub use table::{
    shard_of, Shard, Slot, SlotArray, LARGE_SHARD, REGION_SHARDS, REGION_SHIFT, SHARD_COUNT,
    SLOT_EMPTY, SLOT_MOVING,
};
pub use tag::{
    freed_check, pack_freed_tag, pack_tag, tag_check, tag_key, unpack_freed_tag, unpack_tag,
    SEQ_TAG_SIZE, TAG_MAX_SIZE, TAG_SIZE,
};
pub use threads::{
    ThreadRecord, ThreadTable, MAX_THREAD_INDEX, THREAD_CHUNKS, THREAD_CHUNK_BITS, THREAD_EXITED,
};

/// Types whose every bit pattern is a valid value: integers, atomics, raw pointers and arrays
/// of them. A reader may fill one from bytes copied out of another address space.
///
/// # Safety
/// Implement only for `#[repr(C)]` types made solely of such fields, with no padding that the
/// type's invariants depend on.
pub unsafe trait Plain: Sized {}

// SAFETY: each of these is a `#[repr(C)]` struct of integers, atomics of integers, atomic or
// raw pointers and arrays of those; any bytes make a valid value.
unsafe impl Plain for Header {}
// SAFETY: as above.
unsafe impl Plain for ArenaMap {}
// SAFETY: as above.
unsafe impl Plain for Shard {}
// SAFETY: as above.
unsafe impl Plain for Slot {}
// SAFETY: as above.
unsafe impl Plain for SlotArray {}
// SAFETY: as above.
unsafe impl Plain for StackStore {}
// SAFETY: as above.
unsafe impl Plain for ThreadTable {}
// SAFETY: as above.
unsafe impl Plain for ThreadRecord {}
// SAFETY: as above.
unsafe impl Plain for FreedHistory {}
// SAFETY: as above.
unsafe impl Plain for FreedRecord {}
// SAFETY: as above.
unsafe impl Plain for FreedIndex {}
// SAFETY: as above.
unsafe impl Plain for Profile {}
// SAFETY: as above.
unsafe impl Plain for StackCounters {}
// SAFETY: an integer.
unsafe impl Plain for u64 {}
