//! The per-thread rule cache: code address → compact CFI rule (`cfi::Rule`), two ways per set.

use super::cfi::Rule;

/// Sets in the rule cache (two entries each): 128 KiB per thread. A capture of churn touches
/// ~30 distinct addresses and a large program a few thousand; two ways make the conflict
/// misses of a direct-mapped table (each one a gimli evaluation, ~1 µs) rare.
pub(super) const SET_BITS: u32 = 12;
pub(super) const SETS: usize = 1 << SET_BITS;
/// Key bit marking the first frame, whose rule is looked up at its pc rather than at pc-1
/// (user-space addresses never have it).
pub(super) const FIRST: u64 = 1 << 63;

/// The set for a key: bits 2..14 of the address, xor the next 12 bits. Nearby return
/// addresses (the call sites of one function, the functions of one small program) land in
/// nearby sets, so a capture touches a few cache lines of the table rather than one per frame:
/// a line missed in a busy program's caches costs more than the rest of the frame. Bits 14..26
/// separate modules, whose bases are page-aligned. Not a multiplication: the index is on the
/// walk's critical path (return address → set → rule → next return address).
#[inline(always)]
pub(super) fn set_index(key: u64) -> usize {
    (((key >> 2) ^ (key >> (2 + SET_BITS))) as usize) & (SETS - 1)
}

#[derive(Clone, Copy)]
pub(super) struct Entry {
    /// A code address (| [`FIRST`]); 0 for an empty entry.
    pub(super) key: u64,
    pub(super) rule: Rule,
}

/// Two entries in one cache line; the newer one first.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(super) struct Set(pub(super) [Entry; 2]);

pub(super) const EMPTY: Set = Set([Entry {
    key: 0,
    rule: Rule::FRAMEHOP,
}; 2]);
