//! Words that hold two fields (docs/LAYOUT.md "Slot", "Freed record"): a 40-bit size or
//! sequence number in the low bits, a 24-bit thread index or stack id in the high bits.

/// Width of the low field.
pub const SIZE_BITS: u32 = 40;
/// Mask of the low field; also the largest size a slot can hold (larger sizes saturate).
pub const LOW40: u64 = (1 << SIZE_BITS) - 1;

/// A slot's `size_thread` word: the size (saturating at [`LOW40`]) and a thread index.
#[inline(always)]
pub fn pack_size_thread(size: u64, thread: u32) -> u64 {
    size.min(LOW40) | (u64::from(thread) << SIZE_BITS)
}

/// The inverse of [`pack_size_thread`]: `(size, thread)`.
#[inline(always)]
pub fn unpack_size_thread(word: u64) -> (u64, u32) {
    (word & LOW40, (word >> SIZE_BITS) as u32)
}

/// A `seq_stack` or `free_seq_stack` word: a sequence number (low 40 bits) and a 24-bit id.
#[inline(always)]
pub fn pack_seq_id(seq: u64, id: u32) -> u64 {
    (seq & LOW40) | (u64::from(id) << SIZE_BITS)
}

/// The inverse of [`pack_seq_id`]: `(seq, id)`.
#[inline(always)]
pub fn unpack_seq_id(word: u64) -> (u64, u32) {
    (word & LOW40, (word >> SIZE_BITS) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_sizes_saturate() {
        assert_eq!(
            unpack_size_thread(pack_size_thread(1 << 45, 0xff_ffff)),
            (LOW40, 0xff_ffff)
        );
        assert_eq!(unpack_size_thread(pack_size_thread(48, 3)), (48, 3));
        assert_eq!(
            unpack_seq_id(pack_seq_id(0x12_3456_789a, 0xab_cdef)),
            (0x12_3456_789a, 0xab_cdef)
        );
    }
}
