//! The freed-block history's header and the events it remembers at an address, as
//! [`Tables::history_header`](super::Tables::history_header) and
//! [`Tables::history_events`](super::Tables::history_events) (in `history`) return them. A
//! leaf: `layout` re-exports these types and `history` fills them in; it imports neither.

use mem_trace_format::{Block, Freed, FREED_FLAG_FREE_STACKS};

/// The history's header (docs/LAYOUT.md "Freed-block history").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct History {
    /// Where it is.
    pub address: u64,
    /// Its flags (bit 0: free stacks are recorded).
    pub flags: u32,
    /// Records in the ring; 0: the history is off.
    pub capacity: u64,
    /// The ring (0 until the first free).
    pub records: u64,
    /// Records ever claimed.
    pub written: u64,
    /// `MEM_TRACE_QUARANTINE`, in bytes.
    pub quarantine_limit: u64,
    /// Bytes held back from reuse now.
    pub quarantined_bytes: u64,
    /// Double and invalid frees reported so far.
    pub errors: u64,
    /// The address index over the ring (0: none; readers then scan the ring).
    pub index: u64,
}

impl History {
    /// The history keeps frees (`MEM_TRACE_FREED` is not 0).
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Free stacks are recorded (`MEM_TRACE_FREE_STACKS`).
    pub fn free_stacks(&self) -> bool {
        self.flags & FREED_FLAG_FREE_STACKS != 0
    }

    /// How many records the ring holds now.
    pub fn held(&self) -> u64 {
        self.written.min(self.capacity)
    }

    /// Older frees have been overwritten: the ring only knows the last `capacity`.
    pub fn wrapped(&self) -> bool {
        self.written > self.capacity
    }
}

/// What an event of the history is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A block was allocated.
    Allocation,
    /// A block was freed.
    Free,
}

/// One remembered allocation or free. `seq`, `thread` and `stack` are the event's own;
/// `freed` is the history record it comes from (`None` for the allocation of a live block):
/// an allocation with a record is one whose block was freed later, at its `free_seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Allocation or free.
    pub kind: EventKind,
    /// Its sequence number.
    pub seq: u64,
    /// The thread that did it.
    pub thread: u32,
    /// Its stack id.
    pub stack: u32,
    /// The block, as it was while live.
    pub block: Block,
    /// The record of the block's free, if it was freed.
    pub freed: Option<Freed>,
}
