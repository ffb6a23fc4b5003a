//! The quarantine: freed blocks held back from glibc, oldest released first, up to
//! `MEM_TRACE_QUARANTINE` bytes, so that a dangling pointer keeps pointing into the block it
//! came from instead of into whatever `malloc` hands out next. It also makes double frees
//! certain: a block still held here cannot belong to anyone else.
//!
//! One FIFO for the process (a per-shard FIFO would give a single-threaded program only the
//! few shards its heap lands in). Released blocks are handed to glibc after the lock is
//! dropped. Membership ("is this block held?") is only asked for pointers that are not live
//! blocks — double and invalid frees, rare in any program — so it is a scan of the FIFO
//! rather than a set kept up to date on every free.

use crate::freed::HISTORY;
use crate::sync::SpinLock;
use core::mem::MaybeUninit;
use core::sync::atomic::Ordering;
use std::collections::VecDeque;

/// Default bytes held back (`MEM_TRACE_QUARANTINE`).
pub const DEFAULT_LIMIT: u64 = 4 << 20;

struct Quarantine {
    fifo: VecDeque<(u64, u64)>,
    bytes: u64,
}

static Q: SpinLock<Quarantine> = SpinLock::new(Quarantine {
    fifo: VecDeque::new(),
    bytes: 0,
});

/// Blocks released from quarantine, to be freed for real by the caller. Left uninitialised
/// beyond `n`: zeroing 256 bytes on every free was 9% of perf's samples on churn with two
/// threads.
pub struct Released {
    n: usize,
    addrs: [MaybeUninit<u64>; 32],
}

impl Released {
    /// The released block starts.
    pub fn addrs(&self) -> &[u64] {
        // SAFETY: the first `n` entries were written by `hold`; `MaybeUninit<u64>` has the
        // layout of `u64`.
        unsafe { core::slice::from_raw_parts(self.addrs.as_ptr().cast(), self.n) }
    }
}

/// The configured limit in bytes (0: quarantine off).
pub fn limit() -> u64 {
    HISTORY.quarantine_limit.load(Ordering::Relaxed)
}

/// Holds a freed block. Returns `false` if it was not taken (quarantine off, or the block is
/// larger than the whole quarantine): the caller frees it at once. `released` gets blocks
/// pushed out (at most 32 per call: a big block may push out more on later calls, which keeps
/// each free's work bounded).
pub fn hold(addr: u64, size: u64, released: &mut Released) -> bool {
    released.n = 0;
    let limit = limit();
    if limit == 0 || size > limit {
        return false;
    }
    let mut q = Q.lock();
    q.fifo.push_back((addr, size));
    q.bytes += size;
    while q.bytes > limit && released.n < released.addrs.len() {
        let Some((a, s)) = q.fifo.pop_front() else {
            break;
        };
        q.bytes -= s;
        released.addrs[released.n] = MaybeUninit::new(a);
        released.n += 1;
    }
    // The block a few releases from now: glibc's `free` will read its header and the next
    // chunk's, lines untouched since the program freed it (python3: one miss per free,
    // ~15% of the run), so start loading them now.
    if let Some(&(a, s)) = q.fifo.get(PREFETCH_AHEAD) {
        crate::prefetch::line(a.wrapping_sub(8) as *const u8);
        crate::prefetch::line(a.wrapping_add(s) as *const u8);
    }
    HISTORY.quarantined_bytes.store(q.bytes, Ordering::Relaxed);
    true
}

/// How many blocks ahead of the next release [`hold`] prefetches.
const PREFETCH_AHEAD: usize = 4;

/// An empty release list.
pub fn released() -> Released {
    Released {
        n: 0,
        addrs: [MaybeUninit::uninit(); 32],
    }
}

/// Whether the block starting at `addr` is held in quarantine (so freeing it again is a
/// double free).
pub fn contains(addr: u64) -> bool {
    Q.lock().fifo.iter().any(|&(a, _)| a == addr)
}

/// Locks the quarantine (fork prepare).
pub fn lock() {
    Q.raw().lock();
}

/// Unlocks it (fork parent and child).
pub fn unlock() {
    Q.raw().unlock();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_up_to_the_limit_oldest_out_first() {
        HISTORY.quarantine_limit.store(100, Ordering::Relaxed);
        let mut r = released();
        assert!(hold(0x10, 40, &mut r));
        assert!(hold(0x20, 40, &mut r));
        assert!(r.addrs().is_empty());
        assert!(contains(0x10));
        assert!(hold(0x30, 40, &mut r));
        assert_eq!(r.addrs(), &[0x10]);
        assert!(!contains(0x10));
        assert!(contains(0x20) && contains(0x30));
        assert!(!hold(0x40, 101, &mut r), "larger than the whole quarantine");
        HISTORY.quarantine_limit.store(0, Ordering::Relaxed);
        assert!(!hold(0x50, 8, &mut r), "off");
    }
}
