//! Hash-table entries of 8 bytes: a 32-bit part of an entry's 64-bit hash beside its 32-bit
//! id, instead of the whole hash (16 bytes with padding). The tables of interned stacks and
//! call-tree nodes grow with every distinct stack a program makes: an evaluator on inputs
//! that never repeat made 2 million stacks and 3.8 million nodes, and their entries were a
//! fifth of the ~157 bytes a stack cost.
//!
//! The table places entries by [`spread`] of the stored part, so it can grow without the
//! full hash (recomputing it would read every node or stack again). Shards are chosen from
//! bits 48-51 of the full hash, which [`part`] keeps: within a shard the table still tells
//! entries apart by all 32 bits.

/// The part of a 64-bit hash an entry keeps.
#[inline(always)]
pub(crate) fn part(h: u64) -> u32 {
    (h >> 32) as u32
}

/// The hash a table places an entry of stored part `p` by: every bit of `p` reaches the top
/// bits (hashbrown's tags) and the low ones (its buckets).
#[inline(always)]
pub(crate) fn spread(p: u32) -> u64 {
    let m = u64::from(p).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    m ^ (m >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_that_differ_spread_apart_in_tags_and_buckets() {
        let a = spread(part(0x1234_5678_0000_0000));
        let b = spread(part(0x1234_5679_0000_0000));
        assert_ne!(a >> 57, b >> 57);
        assert_ne!(a & 0xffff, b & 0xffff);
        assert_eq!(part(0xdead_beef_0000_0001), 0xdead_beef);
    }
}
