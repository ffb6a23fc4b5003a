//! The freed-block history as the answers need it: its header, checked (`mtrace-info`, and
//! what a missing free stack means), and every remembered event at an address
//! (`mtrace-history`).

use super::{Error, Tables};
use crate::memory::{read_plain, Memory};
use core::sync::atomic::Ordering::Relaxed;
use mem_trace_format::{Block, Freed, FreedHistory, FreedRecord, FREED_FLAG_FREE_STACKS, LOW40};

/// `MEM_TRACE_FREED` accepts at most 2^26 records (crates/core/src/config.rs).
const MAX_HISTORY_CAPACITY: u64 = 1 << 26;
/// Sequence numbers are 40 bits: more frees than that cannot have been written.
const MAX_WRITTEN: u64 = LOW40 + 1;

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

impl<M: Memory + ?Sized> Tables<'_, M> {
    /// The history's header, checked against the contract; `None` when the process has none
    /// (`header.freed` is 0).
    pub fn history_header(&self) -> Result<Option<History>, Error> {
        let address = self.header().freed as u64;
        if address == 0 {
            return Ok(None);
        }
        let h: FreedHistory = read_plain(self.memory(), address)?;
        let size = core::mem::size_of::<FreedRecord>() as u32;
        let what = "the freed-block history header";
        if h.record_size != size {
            return Err(Error::Corrupt(format!(
                "{what} at {address:#x}: record_size is {}, the layout says {size}",
                h.record_size
            )));
        }
        let capacity = h.capacity.load(Relaxed);
        if capacity > MAX_HISTORY_CAPACITY {
            return Err(Error::Corrupt(format!(
                "{what} at {address:#x}: capacity {capacity} is absurd"
            )));
        }
        let written = h.written.load(Relaxed);
        if written > MAX_WRITTEN {
            return Err(Error::Corrupt(format!(
                "{what} at {address:#x}: {written} records written is absurd"
            )));
        }
        Ok(Some(History {
            address,
            flags: h.flags.load(Relaxed),
            capacity,
            records: h.records.load(Relaxed) as u64,
            written,
            quarantine_limit: h.quarantine_limit.load(Relaxed),
            quarantined_bytes: h.quarantined_bytes.load(Relaxed),
            errors: h.errors.load(Relaxed),
            index: h.index.load(Relaxed) as u64,
        }))
    }

    /// Remembered freed blocks containing `addr`, newest free first: the history's, and the
    /// block's own freed tag while the tracer holds it (its free may not have reached the
    /// history yet, or may have left it); none when the process keeps no history.
    pub fn freed_blocks_containing(&self, addr: u64) -> Result<Vec<Freed>, Error> {
        let mut found = match self.history_header()? {
            Some(h) if h.held() > 0 && h.records != 0 => self.frees_containing(addr)?,
            _ => Vec::new(),
        };
        if let Some(f) = self.freed_tag_containing(addr) {
            let same = |r: &Freed| r.block.addr == f.block.addr && r.free_seq == f.free_seq;
            if !found.iter().any(same) {
                found.push(f);
                found.sort_by_key(|r| core::cmp::Reverse(r.free_seq));
            }
        }
        Ok(found)
    }

    /// Every remembered event touching `addr`, newest first: the allocation of each live
    /// block containing it, and for each remembered freed block containing it, its free and
    /// its allocation. Allocations and frees share one sequence counter, so their numbers
    /// order everything the process did.
    pub fn history_events(&self, addr: u64) -> Result<Vec<Event>, Error> {
        let mut events: Vec<Event> = self
            .live_blocks_containing(addr)?
            .into_iter()
            .map(|b| Event {
                kind: EventKind::Allocation,
                seq: b.seq,
                thread: b.thread,
                stack: b.stack,
                block: b,
                freed: None,
            })
            .collect();
        for r in self.freed_blocks_containing(addr)? {
            let a = r.block;
            events.push(Event {
                kind: EventKind::Free,
                seq: r.free_seq,
                thread: r.free_thread,
                stack: r.free_stack,
                block: a,
                freed: Some(r),
            });
            events.push(Event {
                kind: EventKind::Allocation,
                seq: a.seq,
                thread: a.thread,
                stack: a.stack,
                block: a,
                freed: Some(r),
            });
        }
        // On a (corrupt) tie, the free comes first: it cannot precede its allocation. A live
        // tagged block has no number, and is newer than every free of its memory.
        let order = |e: &Event| match (e.freed, e.seq) {
            (None, super::tags::NO_SEQ) => u64::MAX,
            (_, seq) => seq,
        };
        events.sort_by_key(|e| core::cmp::Reverse((order(e), e.kind == EventKind::Free)));
        Ok(events)
    }
}

#[cfg(test)]
mod tests;
