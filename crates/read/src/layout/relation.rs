//! Where an address is relative to a block: what
//! [`Tables::find_block`](super::Tables::find_block) (in `near`) returns. A leaf: `layout`
//! re-exports these types and `near` fills them in; it imports neither.

use mem_trace_format::Block;

/// How far from a block an address may be and still be reported as "N bytes after/before"
/// it. Overflows and underflows land within a few elements of the block; 4 KiB also covers a
/// misplaced struct-sized stride without attributing arbitrary addresses to an unrelated
/// neighbour.
pub const DEFAULT_MAX_GAP: u64 = 4096;

/// Where an address is relative to a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    /// In the block: `offset` bytes from its start.
    Inside,
    /// `offset` bytes past its end (0: one past the end).
    After,
    /// `offset` bytes before its start.
    Before,
}

/// An address and the block it is in or near.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    /// The address asked about.
    pub address: u64,
    /// The block.
    pub block: Block,
    /// Where the address is relative to it.
    pub relation: Relation,
    /// How far (see [`Relation`]).
    pub offset: u64,
}
