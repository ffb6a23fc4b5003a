//! The tables a reader finds from the exported header (docs/LAYOUT.md), and the quarantine.
//!
//! - [`table`]: live blocks by address, in region shards;
//! - [`stacks`]: each distinct stack once, by 24-bit id;
//! - [`threads`]: one record per thread that ever allocated;
//! - [`freed`]: the newest frees, with who freed them;
//! - [`quarantine`]: freed blocks held back from reuse (not exported: only totals are);
//! - [`header`]: the exported root that points at all of them.
//!
//! Every table is allocated from the arena explicitly, published so that a reader without a
//! lock (gdb on a core, `print_trace` while a writer is stopped) sees whole entries, and never
//! freed while a lockless reader may look.

pub mod freed;
pub mod header;
pub mod quarantine;
pub mod stacks;
pub mod table;
pub mod threads;
