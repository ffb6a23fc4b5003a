//! Block tags (docs/LAYOUT.md "Block tags", version 6): a small block from `malloc`,
//! `calloc` or `realloc` is not in the live-block table. Its record is 16 or 32 bytes in front
//! of it, in the same chunk of glibc's heap: the free that follows reads a line glibc touches
//! anyway, where a table costs two misses per block on a large heap.
//!
//! Freed tags (version 7, "Freed tags"): a long tag whose block was freed and is still held
//! by the tracer is rewritten in place with who freed it, so that the free is answered from
//! the block's own memory before (and after) its record reaches the freed-block history.

use crate::block::{Block, Freed};
use crate::packing::{pack_seq_id, unpack_seq_id};

/// Bytes of the short tag in front of a tagged block (profile mode); the block itself stays
/// 16-byte aligned. The check word is at `q - 16`, the record at `q - 8`, in both sizes.
pub const TAG_SIZE: u64 = 16;
/// Bytes of the long tag (with `FLAG_TAG_SEQ`): the short tag's two words preceded by the
/// block's sequence number at `q - 24` and a word that is 0 at `q - 32`.
pub const SEQ_TAG_SIZE: u64 = 32;
/// Only blocks of fewer bytes than this are tagged (the size takes 16 bits); larger ones, and
/// those of the aligned functions, go to the table.
pub const TAG_MAX_SIZE: u64 = 1 << 16;

/// The tag's first word for a block at `addr`: bound to the address and to the process's
/// secret key (`Header::tag_key`), so that no copy of a tag and no data the program wrote
/// reads as a tag anywhere else.
#[inline(always)]
pub fn tag_check(addr: u64, key: u64) -> u64 {
    addr ^ key
}

/// The check word of a freed tag for a block at `addr`: the live check's complement, so it
/// keeps the key's property (its top 16 bits neither all zero nor all one) and no live tag
/// reads as freed nor the other way round.
#[inline(always)]
pub fn freed_check(addr: u64, key: u64) -> u64 {
    !tag_check(addr, key)
}

/// The two words a freed tag puts before its check word, at `q - 32` and `q - 24`: the free's
/// sequence number and stack (as a freed record's `free_seq_stack`), then the block's own
/// sequence number (40 bits) with the freeing thread's index (24 bits) above it. The words at
/// `q - 16` ([`freed_check`]) and `q - 8` (the live tag's record) complete it.
#[inline(always)]
pub fn pack_freed_tag(f: &Freed) -> [u64; 2] {
    [
        pack_seq_id(f.free_seq, f.free_stack),
        pack_seq_id(f.block.seq, f.free_thread),
    ]
}

/// The free a freed tag of the block at `q` describes: `words` are the tag's four words, from
/// `q - 32` up (the check word, third, is not read).
#[inline(always)]
pub fn unpack_freed_tag(q: u64, words: [u64; 4]) -> Freed {
    let (free_seq, free_stack) = unpack_seq_id(words[0]);
    let (seq, free_thread) = unpack_seq_id(words[1]);
    let (size, thread, stack) = unpack_tag(words[3]);
    Freed {
        block: Block {
            addr: q,
            size,
            thread,
            seq,
            stack,
        },
        free_seq,
        free_stack,
        free_thread,
        by_realloc: false,
    }
}

/// The tag's second word: size (bits 0..16), thread index (16..40), stack id (40..64).
#[inline(always)]
pub fn pack_tag(size: u64, thread: u32, stack: u32) -> u64 {
    debug_assert!(size < TAG_MAX_SIZE);
    (size & 0xffff) | (u64::from(thread & 0xff_ffff) << 16) | (u64::from(stack) << 40)
}

/// The inverse of [`pack_tag`]: `(size, thread, stack)`.
#[inline(always)]
pub fn unpack_tag(word: u64) -> (u64, u32, u32) {
    (
        word & 0xffff,
        ((word >> 16) & 0xff_ffff) as u32,
        (word >> 40) as u32,
    )
}

/// A key for [`tag_check`] made from `seed` (random bits): its top 16 bits are never all zero
/// or all one, so a tag's first word is never a canonical user-space pointer nor a small
/// integer, the values a heap holds most.
pub fn tag_key(seed: u64) -> u64 {
    let top = (seed >> 48) as u16;
    let top = match top {
        0 => 0x5a5a,
        0xffff => 0xa5a5,
        t => t,
    };
    (seed & 0xffff_ffff_ffff) | (u64::from(top) << 48)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip() {
        assert_eq!(
            unpack_tag(pack_tag(65535, 0xff_ffff, 0xff_ffff)),
            (65535, 0xff_ffff, 0xff_ffff)
        );
        assert_eq!(unpack_tag(pack_tag(24, 3, 77)), (24, 3, 77));
        assert_eq!(unpack_tag(pack_tag(0, 0, 0)), (0, 0, 0));
    }

    #[test]
    fn freed_tags_round_trip_and_never_check_as_live() {
        let f = Freed {
            block: Block {
                addr: 0x5555_0000_1230,
                size: 65535,
                thread: 0xff_fffe,
                seq: (1 << 40) - 3,
                stack: 0xff_fffd,
            },
            free_seq: (1 << 40) - 2,
            free_stack: 0xff_fffc,
            free_thread: 0xff_fffb,
            by_realloc: false,
        };
        let [a, b] = pack_freed_tag(&f);
        let record = pack_tag(f.block.size, f.block.thread, f.block.stack);
        assert_eq!(unpack_freed_tag(f.block.addr, [a, b, 0, record]), f);
        let key = tag_key(0x1234_5678_9abc_def0);
        let q = f.block.addr;
        assert_ne!(freed_check(q, key), tag_check(q, key));
        assert_eq!(freed_check(q, key) >> 48, !(key >> 48) & 0xffff);
        assert_ne!(freed_check(q, key) >> 48, 0);
        assert_ne!(freed_check(q, key) >> 48, 0xffff);
    }

    #[test]
    fn keys_never_look_like_pointers() {
        for seed in [
            0,
            u64::MAX,
            0x0000_1234_5678_9abc,
            0xffff_0000_0000_0001,
            0x1234 << 48,
        ] {
            let k = tag_key(seed);
            let top = k >> 48;
            assert!(top != 0 && top != 0xffff, "{seed:#x} -> {k:#x}");
            // Any user-space address xor the key keeps the key's top bits.
            assert_eq!(tag_check(0x7fff_dead_beef, k) >> 48, top);
        }
    }
}
