//! The recycling lists: blocks out of the quarantine's FIFO, kept per glibc size class for
//! `malloc` to take back, and given to glibc by a clock hand once over the thread's share
//! (the quarantine's documentation says why).

use super::held::{block_of, Released, TAGGED};
use super::ring::Ring;

/// Largest glibc chunk kept for reuse; larger blocks go back to glibc when pushed out.
pub(super) const REUSE_MAX: u64 = 4096;
/// Chunk sizes 32, 48, ..., [`REUSE_MAX`]: one recycling list each.
pub(super) const CLASSES: usize = (REUSE_MAX / 16 - 1) as usize;

/// Blocks kept for reuse, per chunk size class.
pub(super) struct Recycled {
    /// Oldest first; `malloc` takes the newest, the one most likely still in cache.
    pub(super) lists: [Ring<u64>; CLASSES],
    /// The classes whose list is not empty: the hand visits only those (a program uses a
    /// few classes of the 255; stepping over the others was 10% of python3's frees).
    pub(super) filled: Classes,
    /// The classes that served a `malloc` since the clock hand last passed them.
    pub(super) used: Classes,
    /// Sum of the chunk sizes in `lists`.
    pub(super) bytes: u64,
    hand: usize,
}

impl Recycled {
    /// Keeps `addr`, a block of chunk size class `k`, then gives glibc (through `released`)
    /// what no longer fits under `cap` bytes.
    pub(super) fn keep(&mut self, k: usize, addr: u64, cap: u64, released: &mut Released) {
        if !self.lists[k].push_back(addr) {
            // No memory to keep it: glibc gets it now (`released` has room: the caller
            // checked before calling).
            released.push(addr);
            return;
        }
        self.filled.insert(k);
        self.bytes += class_bytes(k);
        // Each filled class is passed at most twice: the first pass may only clear its mark.
        let mut passes = 2 * CLASSES;
        while self.bytes > cap && passes > 0 && !released.full() {
            passes -= 1;
            let Some(k) = self.filled.next_from(self.hand) else {
                break;
            };
            self.hand = (k + 1) % CLASSES;
            if self.used.remove(k) {
                continue;
            }
            if let Some(a) = self.lists[k].pop_front() {
                self.bytes -= class_bytes(k);
                released.push(a);
            }
            if self.lists[k].is_empty() {
                self.filled.remove(k);
            }
        }
    }

    /// The block the clock hand would give glibc next, and its chunk size.
    pub(super) fn next_release(&self) -> Option<(u64, u64)> {
        let k = self.filled.next_from(self.hand)?;
        let &a = self.lists[k].get(0)?;
        Some((a & !TAGGED, class_bytes(k)))
    }

    /// The newest block of class `k`, if any.
    pub(super) fn take(&mut self, k: usize) -> Option<u64> {
        let a = self.lists[k].pop_back()?;
        match self.lists[k].back() {
            // The block the next `malloc` of this class will get: its table line and its
            // first bytes were last touched a quarantine ago, so start loading them now, a
            // whole `malloc` ahead. (Prefetched only once `record` has it, the table line was
            // still missing when the insert came: python3's dicts spent 15% of the run there,
            // and 8% less time in all with this.)
            Some(&next) => {
                let next = next & !TAGGED;
                crate::store::table::prefetch(next, class_bytes(k));
                crate::prefetch::line(next as *const u8);
            }
            None => {
                self.filled.remove(k);
            }
        }
        self.bytes -= class_bytes(k);
        self.used.insert(k);
        Some(a & !TAGGED)
    }

    pub(super) fn contains(&self, addr: u64) -> bool {
        self.lists
            .iter()
            .any(|l| l.iter().any(|a| block_of(a) == addr))
    }

    /// Blocks kept, all classes.
    pub(super) fn count(&self) -> usize {
        self.lists.iter().map(Ring::len).sum()
    }

    /// The oldest block of the first class that has one, if any (for [`drain`]).
    pub(super) fn take_oldest(&mut self) -> Option<u64> {
        let k = self.filled.next_from(0)?;
        let a = self.lists[k].pop_front()?;
        if self.lists[k].is_empty() {
            self.filled.remove(k);
        }
        self.bytes -= class_bytes(k);
        Some(a)
    }
}

/// A set of recycling classes.
#[derive(Clone, Copy, Default)]
pub(super) struct Classes([u64; CLASSES.div_ceil(64)]);

impl Classes {
    pub(super) fn insert(&mut self, k: usize) {
        self.0[k / 64] |= 1 << (k % 64);
    }

    /// Removes `k`; whether it was there.
    pub(super) fn remove(&mut self, k: usize) -> bool {
        let bit = 1 << (k % 64);
        let was = self.0[k / 64] & bit != 0;
        self.0[k / 64] &= !bit;
        was
    }

    /// The first class in the set at or after `k`, wrapping around.
    pub(super) fn next_from(&self, k: usize) -> Option<usize> {
        let words = self.0.len();
        // The word holding `k` (from bit k), the others in order, then that word's low bits.
        (0..=words).find_map(|i| {
            let w = (k / 64 + i) % words;
            let mut bits = self.0[w];
            if i == 0 {
                bits &= u64::MAX << (k % 64);
            }
            (bits != 0).then(|| w * 64 + bits.trailing_zeros() as usize)
        })
    }
}

/// The recycling class of a chunk size, if it has one.
pub(super) fn class_of(chunk: u64) -> Option<usize> {
    (chunk <= REUSE_MAX).then(|| (chunk / 16 - 2) as usize)
}

/// The chunk size of recycling class `k`.
pub(super) fn class_bytes(k: usize) -> u64 {
    (k as u64 + 2) * 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_sets_find_the_next_member_wrapping_around() {
        let mut s = Classes::default();
        assert_eq!(s.next_from(0), None);
        s.insert(3);
        s.insert(70);
        s.insert(254);
        assert_eq!(s.next_from(0), Some(3));
        assert_eq!(s.next_from(3), Some(3));
        assert_eq!(s.next_from(4), Some(70));
        assert_eq!(s.next_from(71), Some(254));
        assert_eq!(s.next_from(254), Some(254));
        assert!(s.remove(254) && !s.remove(254));
        assert_eq!(s.next_from(71), Some(3), "wraps around");
        assert_eq!(s.next_from(200), Some(3));
    }
}
