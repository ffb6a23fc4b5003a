//! A block and a free as the tables record them, and their packing into a slot's (or a freed
//! record's) words: the values writer and readers exchange.

use crate::freed::FREED_BY_REALLOC;
use crate::packing::{pack_seq_id, pack_size_thread, unpack_seq_id, unpack_size_thread};

/// A live block as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Start address.
    pub addr: u64,
    /// Size in bytes (saturating at 2^40 - 1 once stored).
    pub size: u64,
    /// Index in the thread table (1-based; 0 unknown).
    pub thread: u32,
    /// Sequence number of the allocation.
    pub seq: u64,
    /// Stack id in the stack store (0: no stack).
    pub stack: u32,
}

impl Block {
    /// The `size_thread` and `seq_stack` words of a slot (or of a freed record).
    #[inline(always)]
    pub fn pack(&self) -> (u64, u64) {
        (
            pack_size_thread(self.size, self.thread),
            pack_seq_id(self.seq, self.stack),
        )
    }

    /// The block a slot's (or freed record's) words describe.
    #[inline(always)]
    pub fn unpack(addr: u64, size_thread: u64, seq_stack: u64) -> Self {
        let (size, thread) = unpack_size_thread(size_thread);
        let (seq, stack) = unpack_seq_id(seq_stack);
        Block {
            addr,
            size,
            thread,
            seq,
            stack,
        }
    }

    /// Whether `a` lies inside the block (a zero-sized block contains only its start).
    pub fn contains(&self, a: u64) -> bool {
        a == self.addr || (a > self.addr && a - self.addr < self.size)
    }
}

/// A free as the history remembers it (docs/LAYOUT.md "Freed record").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Freed {
    /// The block as it was recorded while live.
    pub block: Block,
    /// Sequence number of the free (the same counter as allocations).
    pub free_seq: u64,
    /// Stack id of the free (0: none recorded).
    pub free_stack: u32,
    /// Thread index of the freeing thread.
    pub free_thread: u32,
    /// Freed by `realloc` (a move, or size 0).
    pub by_realloc: bool,
}

impl Freed {
    /// The free a freed record's five words describe (the last one holds `free_thread` in its
    /// low half and the flags in its high half).
    #[inline]
    pub fn unpack(r: &[u64; 5]) -> Self {
        let (free_seq, free_stack) = unpack_seq_id(r[3]);
        Freed {
            block: Block::unpack(r[0], r[1], r[2]),
            free_seq,
            free_stack,
            free_thread: r[4] as u32,
            by_realloc: (r[4] >> 32) as u32 & FREED_BY_REALLOC != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packing::LOW40;

    #[test]
    fn bitfields_round_trip_and_saturate() {
        let b = Block {
            addr: 0x10,
            size: 1 << 45,
            thread: 0xff_ffff,
            seq: 0x12_3456_789a,
            stack: 0xab_cdef,
        };
        let (st, ss) = b.pack();
        let u = Block::unpack(0x10, st, ss);
        assert_eq!(u.size, LOW40);
        assert_eq!((u.thread, u.seq, u.stack), (b.thread, b.seq, b.stack));
    }

    #[test]
    fn contains_its_bytes_only() {
        let b = Block::unpack(0x100, 16, 0);
        assert!(b.contains(0x100) && b.contains(0x10f));
        assert!(!b.contains(0x110) && !b.contains(0xff));
        assert!(Block::unpack(0x200, 0, 0).contains(0x200));
    }
}
