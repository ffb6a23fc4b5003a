//! The tables a reader finds from the exported header (docs/LAYOUT.md), and the quarantine.
//!
//! - [`table`]: live blocks by address, in region shards;
//! - [`stacks`]: each distinct stack once, by 24-bit id;
//! - [`threads`]: one record per thread that ever allocated;
//! - [`freed`]: the newest frees, with who freed them;
//! - [`tags`]: in profile mode, small blocks' records in front of them instead of in the table;
//! - [`quarantine`]: freed blocks held back from reuse (not exported: only totals are);
//! - [`header`]: the exported root that points at all of them, and [`initial`], its value.
//!
//! Every table is allocated from the arena explicitly, published so that a reader without a
//! lock (gdb on a core, `print_trace` while a writer is stopped) sees whole entries, and never
//! freed while a lockless reader may look.

pub mod freed;
pub mod header;
pub mod initial;
pub mod quarantine;
pub mod stacks;
pub mod table;
pub mod tags;
pub mod threads;

/// The live block that holds `addr`: a table block, else a tagged one (blocks never overlap,
/// so at most one of them holds it). The table's access says whether it was read without its
/// lock.
pub fn block_containing(addr: u64) -> (Option<mem_trace_format::Block>, table::Access) {
    match table::find_containing(addr) {
        (None, access) => (tags::find_containing(addr), access),
        found => found,
    }
}

/// The live block that starts nearest below `addr`, among the table's blocks at most one
/// region away and the tagged blocks at most `TAG_MAX_SIZE` bytes down.
pub fn nearest_below(addr: u64) -> Option<mem_trace_format::Block> {
    match (table::nearest_below(addr), tags::nearest_at_or_below(addr)) {
        (Some(a), Some(b)) => Some(if a.addr >= b.addr { a } else { b }),
        (a, b) => a.or(b),
    }
}
