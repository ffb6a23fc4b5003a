//! What the quarantine holds and gives back: a held entry (a block's address, or a tagged
//! block's chunk marked [`TAGGED`]) and a batch of [`Released`] ones. The leaf the quarantine
//! (`mod`) and its recycling lists (`recycled`) share.

use core::mem::MaybeUninit;

/// The mark of a held entry that is a tagged block's chunk (chunks are 16-byte aligned).
pub(crate) const TAGGED: u64 = 1;

/// The block address the program knew for the held entry `e`.
pub(super) fn block_of(e: u64) -> u64 {
    match e & TAGGED {
        0 => e,
        _ => (e & !TAGGED) + crate::store::tags::bytes(),
    }
}

/// Blocks released from quarantine, to be freed for real by the caller. Left uninitialised
/// beyond `n`: zeroing 256 bytes on every free was 9% of perf's samples on churn with two
/// threads.
pub(crate) struct Released {
    pub(super) n: usize,
    pub(super) addrs: [MaybeUninit<u64>; 32],
}

impl Released {
    /// The released blocks, as pointers to give glibc (a tagged block's chunk).
    pub(crate) fn addrs(&self) -> &[u64] {
        // SAFETY: the first `n` entries were written by `hold`; `MaybeUninit<u64>` has the
        // layout of `u64`.
        unsafe { core::slice::from_raw_parts(self.addrs.as_ptr().cast(), self.n) }
    }

    pub(super) fn push(&mut self, entry: u64) {
        self.addrs[self.n] = MaybeUninit::new(entry & !TAGGED);
        self.n += 1;
    }

    pub(super) fn full(&self) -> bool {
        self.n == self.addrs.len()
    }
}
