//! The leak check: which live blocks the program can still reach, classified as memcheck
//! does (docs/FINDINGS.md "Peaks and leaks as DHAT, LSan and memcheck define them").
//!
//! A conservative scan: every aligned word of the roots ([`roots`]) and, transitively, of the
//! blocks reached, is taken for a pointer if it points into a live block. The rule for
//! pointers into the middle of a block is memcheck's: a block reached through a chain of
//! pointers to block starts is *still reachable*; one reached only through some interior
//! pointer is *possibly lost*; one not reached at all is *definitely lost* (memcheck's
//! "indirectly lost", a lost block pointed to by another lost one, is counted as definitely
//! lost here). Counting interior pointers as reaching, as LSan does, would call reachable a
//! leaked block whose last 8 bytes glibc's own bookkeeping points at (a free chunk's header
//! just after it, in `main_arena`'s bins), which the profiler's reference fixture hits.
//!
//! That header is also why a pointer exactly 8 bytes before a block's end does not count at
//! all: glibc's chunk header of the next chunk starts there whenever the block's size is 8 more
//! than a multiple of 16 (a 1000-byte block: chunk of 1008 bytes, next header at +992), and
//! glibc's own bins and `top` (in libc's data, a root) point at free chunks' headers. Without
//! the exception, a leaked block followed by a free chunk would be "possibly lost". memcheck and
//! LSan replace the allocator, so their scans never see glibc's bookkeeping.
//!
//! Nothing is stopped: the live blocks are copied shard by shard (`table::for_each_block`, a
//! shard's lock held only for its copy), and all memory is read with `process_vm_readv` on
//! the process itself, which fails cleanly on memory that another thread unmapped meanwhile
//! rather than faulting. While the program runs (a snapshot), the answer is approximate in
//! the way any such scan is; at exit, with the program's threads idle, it is exact for the
//! roots it has. Its memory comes from the arena, not the program's heap.

use crate::arena::Arena;
use crate::profile::roots::{self, Root};
use crate::store::table;
use allocator_api2::vec::Vec as AVec;

/// A vector in the tracer's arena.
pub(crate) type ArenaVec<T> = AVec<T, Arena>;

/// Reach levels, also the classes.
const LOST: u8 = 0;
const POSSIBLY: u8 = 1;
const REACHABLE: u8 = 2;

/// Bytes read per `process_vm_readv`.
const BUF: usize = 1 << 20;
const PAGE: u64 = 4096;
/// At most this many ranges per `process_vm_readv` (the kernel's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// A live block as the scan sees it.
#[derive(Clone, Copy)]
pub(crate) struct Live {
    pub addr: u64,
    pub size: u64,
    pub stack: u32,
    level: u8,
}

/// Bytes and blocks of one class.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Total {
    pub bytes: u64,
    pub blocks: u64,
}

/// The scan's answer: every block with its class, and the totals per class.
pub(crate) struct Leaks {
    pub blocks: ArenaVec<Live>,
    pub lost: Total,
    pub possibly: Total,
    pub reachable: Total,
}

impl Live {
    /// 0: definitely lost, 1: possibly lost, 2: still reachable.
    pub(crate) fn class(&self) -> u8 {
        self.level
    }
}

/// Runs the check. `own_sp`: see [`roots::for_each`]. `None` when out of memory.
pub(crate) fn check(own_sp: Option<u64>) -> Option<Leaks> {
    let mut blocks = snapshot()?;
    let mut scan = Scan {
        starts: AVec::new_in(Arena),
        work: AVec::new_in(Arena),
        buf: AVec::new_in(Arena),
        iov: AVec::new_in(Arena),
    };
    scan.starts.try_reserve_exact(blocks.len()).ok()?;
    scan.starts.extend(blocks.iter().map(|b| b.addr));
    scan.buf.try_reserve_exact(BUF).ok()?;
    scan.buf.resize(BUF, 0);
    scan.iov.try_reserve_exact(IOV_MAX).ok()?;
    scan.work.try_reserve(1024).ok()?;
    roots::for_each(own_sp, |r| scan.root(&mut blocks, r));
    scan.drain(&mut blocks);
    let mut leaks = Leaks {
        blocks,
        lost: Total::default(),
        possibly: Total::default(),
        reachable: Total::default(),
    };
    for b in leaks.blocks.iter() {
        let t = match b.level {
            LOST => &mut leaks.lost,
            POSSIBLY => &mut leaks.possibly,
            _ => &mut leaks.reachable,
        };
        t.bytes += b.size;
        t.blocks += 1;
    }
    Some(leaks)
}

/// The live blocks, sorted by address, each once.
fn snapshot() -> Option<ArenaVec<Live>> {
    let mut v: ArenaVec<Live> = AVec::new_in(Arena);
    // Room for the blocks now and some more, so that pushing under a shard lock rarely grows
    // the vector (an mmap while allocating threads wait).
    let (n, _) = table::totals();
    v.try_reserve(n as usize + n as usize / 8 + 1024).ok()?;
    table::for_each_block(|b| {
        v.push(Live {
            addr: b.addr,
            size: b.size,
            stack: b.stack,
            level: LOST,
        })
    });
    v.sort_unstable_by_key(|b| b.addr);
    v.dedup_by_key(|b| b.addr);
    Some(v)
}

struct Scan {
    /// The blocks' start addresses (a copy, for a cache-friendly binary search).
    starts: ArenaVec<u64>,
    /// Blocks whose level rose and whose words are still to scan.
    work: ArenaVec<u32>,
    buf: ArenaVec<u8>,
    iov: ArenaVec<libc::iovec>,
}

impl Scan {
    /// The words of `bytes` (8-byte aligned) found in memory at level `from`: every block one
    /// of them points into rises to the level the pointer gives.
    fn words(
        starts: &[u64],
        blocks: &mut [Live],
        work: &mut ArenaVec<u32>,
        bytes: &[u8],
        from: u8,
    ) {
        let (Some(&min), Some(last)) = (starts.first(), blocks.last()) else {
            return;
        };
        let max = last.addr + last.size;
        for w in bytes.chunks_exact(8) {
            let p = u64::from_ne_bytes(w.try_into().expect("8 bytes"));
            if p < min || p >= max {
                continue;
            }
            // The last block starting at or before `p`.
            let i = starts.partition_point(|&a| a <= p) - 1;
            let b = &mut blocks[i];
            let level = if p == b.addr {
                from
            } else if p < b.addr + b.size && p != b.addr + b.size - 8 {
                from.min(POSSIBLY)
            } else {
                continue;
            };
            if level > b.level {
                b.level = level;
                if work.try_reserve(1).is_ok() {
                    work.push(i as u32);
                }
            }
        }
    }

    /// Scans a root at the highest level.
    fn root(&mut self, blocks: &mut [Live], r: Root) {
        let lo = (r.lo + 7) & !7;
        if r.hi <= lo {
            return;
        }
        if r.downward {
            // From the top down, a chunk at a time, until the first unreadable page.
            let mut hi = r.hi & !7;
            while hi > lo {
                let start = hi.saturating_sub(BUF as u64).max(lo);
                if self.range(blocks, start, hi, REACHABLE) {
                    hi = start;
                    continue;
                }
                // Something below is unmapped: page by page down to it.
                while hi > start {
                    let p = ((hi - 1) & !(PAGE - 1)).max(start);
                    if !self.range(blocks, p, hi, REACHABLE) {
                        return;
                    }
                    hi = p;
                }
            }
        } else {
            let mut at = lo;
            while at < r.hi {
                let end = (at + BUF as u64).min(r.hi & !7);
                if end <= at {
                    break;
                }
                if !self.range(blocks, at, end, REACHABLE) {
                    // Page by page, skipping what cannot be read.
                    let mut p = at;
                    while p < end {
                        let next = ((p + PAGE) & !(PAGE - 1)).min(end);
                        self.range(blocks, p, next, REACHABLE);
                        p = next;
                    }
                }
                at = end;
            }
        }
    }

    /// Reads `[lo, hi)` (at most [`BUF`] bytes) and scans it; false if it could not be read.
    fn range(&mut self, blocks: &mut [Live], lo: u64, hi: u64, from: u8) -> bool {
        let len = (hi - lo) as usize;
        let remote = [libc::iovec {
            iov_base: lo as *mut libc::c_void,
            iov_len: len,
        }];
        if read(&mut self.buf[..len], &remote) != len {
            return false;
        }
        Self::words(&self.starts, blocks, &mut self.work, &self.buf[..len], from);
        true
    }

    /// Scans the blocks whose level rose, until none is left. Small blocks are read many at
    /// a time (one system call for up to [`IOV_MAX`] of them), large ones in chunks.
    fn drain(&mut self, blocks: &mut [Live]) {
        while let Some(&top) = self.work.last() {
            let b = blocks[top as usize];
            if b.size as usize > BUF / 4 {
                self.work.pop();
                let mut at = b.addr;
                let end = b.addr + (b.size & !7);
                while at < end {
                    let next = (at + BUF as u64).min(end);
                    self.range(blocks, at, next, b.level);
                    at = next;
                }
                continue;
            }
            // A batch: (index, level) of blocks whose words go one after the other in `buf`.
            let mut batch: [(u32, u8); IOV_MAX] = [(0, 0); IOV_MAX];
            let mut n = 0;
            let mut total = 0usize;
            self.iov.clear();
            while let Some(&i) = self.work.last() {
                let b = blocks[i as usize];
                let len = (b.size & !7) as usize;
                if n == IOV_MAX || len > BUF / 4 || total + len > BUF {
                    break;
                }
                self.work.pop();
                batch[n] = (i, b.level);
                n += 1;
                total += len;
                self.iov.push(libc::iovec {
                    iov_base: b.addr as *mut libc::c_void,
                    iov_len: len,
                });
            }
            let mut first = 0;
            while first < n {
                let want: usize = self.iov[first..n].iter().map(|v| v.iov_len).sum();
                let got = read(&mut self.buf[..want], &self.iov[first..n]);
                // Scan the ranges read whole; skip the one the read stopped in (freed and
                // unmapped meanwhile) and go on after it.
                let mut off = 0;
                let mut k = first;
                while k < n && off + self.iov[k].iov_len <= got {
                    let len = self.iov[k].iov_len;
                    let level = batch[k].1;
                    Self::words(
                        &self.starts,
                        blocks,
                        &mut self.work,
                        &self.buf[off..off + len],
                        level,
                    );
                    off += len;
                    k += 1;
                }
                first = if got == want { n } else { k + 1 };
            }
        }
    }
}

/// `process_vm_readv` on this process: `remote` into `local` (as long as their sum); the
/// bytes read, 0 on failure.
fn read(local: &mut [u8], remote: &[libc::iovec]) -> usize {
    if local.is_empty() {
        return 0;
    }
    let l = [libc::iovec {
        iov_base: local.as_mut_ptr().cast(),
        iov_len: local.len(),
    }];
    // SAFETY: the local buffer is ours and as long as the remote ranges together; the kernel
    // checks the remote ranges and fails on unmapped memory instead of faulting.
    let n = unsafe {
        libc::process_vm_readv(
            libc::getpid(),
            l.as_ptr(),
            1,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        )
    };
    n.max(0) as usize
}
