//! Block tags (docs/LAYOUT.md "Block tags", version 6): a small block from `malloc`,
//! `calloc` or `realloc` is not in the live-block table. Its record is 16 or 32 bytes in front
//! of it, in the same chunk of glibc's heap: the free that follows reads a line glibc touches
//! anyway, where a table costs two misses per block on a large heap.

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
