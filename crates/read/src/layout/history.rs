//! The freed-block history as the answers need it: its header, checked (`mtrace-info`, and
//! what a missing free stack means), and every remembered event at an address
//! (`mtrace-history`).

use super::events::{Event, EventKind, History};
use super::{Error, Tables};
use crate::memory::{read_plain, Memory};
use core::sync::atomic::Ordering::Relaxed;
use mem_trace_format::{Freed, FreedHistory, FreedRecord, LOW40};

/// `MEM_TRACE_FREED` accepts at most 2^26 records (crates/core/src/config.rs).
const MAX_HISTORY_CAPACITY: u64 = 1 << 26;
/// Sequence numbers are 40 bits: more frees than that cannot have been written.
const MAX_WRITTEN: u64 = LOW40 + 1;

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
