//! A thread's batch of deferred frees (see `deferred`): its part of `state::ThreadState`, a
//! leaf, so that the state holds it without importing the frees that fill it.

use core::cell::Cell;

/// Frees a batch holds.
pub(crate) const BATCH: usize = 32;

/// A thread's batch: the addresses of the blocks freed since its last one, their tags freed.
pub struct Local {
    /// Frees of tagged blocks since this thread's last allocation (saturating).
    pub(super) run: Cell<u32>,
    /// Blocks in the batch.
    pub(super) n: Cell<u32>,
    pub(super) blocks: [Cell<u64>; BATCH],
}

impl Local {
    /// An empty batch.
    pub const fn new() -> Self {
        Local {
            run: Cell::new(0),
            n: Cell::new(0),
            blocks: [const { Cell::new(0) }; BATCH],
        }
    }

    /// Takes the batch's blocks, leaving it empty.
    pub(super) fn take(&self) -> impl Iterator<Item = u64> + '_ {
        let n = self.n.replace(0) as usize;
        self.blocks[..n].iter().map(Cell::get)
    }
}

impl Default for Local {
    fn default() -> Self {
        Self::new()
    }
}
