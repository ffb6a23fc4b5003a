//! Block tags: in profile mode, a small block's record lives in 16 bytes in front of it rather
//! than in the table (docs/LAYOUT.md "Block tags").
//!
//! Why: on a large heap, the table's slot for a block is a random line of a large array, and
//! both the insert and the remove miss on it: two misses per block that glibc's own work on the
//! block does not have (docs/FINDINGS.md "Block tags: profile mode without table slots for
//! small blocks"). The tag is in the chunk glibc hands out and reads back at `free`: its line
//! is the one glibc touches anyway.
//!
//! The key is set once, before the tracer is ready, and never changes, so that a tag written
//! under it is read under it: a free of a tagged block must always find its tag.

use super::header::header;
use core::ffi::c_void;
use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::{Relaxed, Release};
use mem_trace_format::{pack_tag, tag_check, tag_key, unpack_tag, Block, TAG_MAX_SIZE, TAG_SIZE};

/// Starts tagging blocks (`on`: the configuration allows it), with a key that is random per
/// process. Called once, while the tracer initialises, before any block is recorded.
pub(crate) fn configure(on: bool) {
    let key = if on { tag_key(seed()) } else { 0 };
    header().tag_key.store(key, Relaxed);
}

/// Random bits without a system call or an allocation: the kernel's 16 random bytes for this
/// process (`AT_RANDOM`), mixed with the time stamp counter.
fn seed() -> u64 {
    // SAFETY: getauxval has no preconditions; AT_RANDOM, when present, points at 16 bytes the
    // kernel placed on the initial stack, which stay mapped for the life of the process.
    let random = unsafe {
        match libc::getauxval(libc::AT_RANDOM) {
            0 => 0,
            p => (p as *const u64).read_unaligned() ^ (p as *const u64).add(1).read_unaligned(),
        }
    };
    // SAFETY: rdtsc has no preconditions on x86_64.
    let tsc = unsafe { core::arch::x86_64::_rdtsc() };
    (random ^ tsc.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ random
}

/// The key, or 0 when no block is tagged.
#[inline(always)]
pub fn key() -> u64 {
    header().tag_key.load(Relaxed)
}

/// Bytes to ask glibc for so that a block of `size` bytes can carry a tag, or `None` when
/// it goes to the table (tags off, or too large for one).
#[inline(always)]
pub fn room(size: usize) -> Option<usize> {
    (key() != 0 && (size as u64) < TAG_MAX_SIZE).then_some(size + TAG_SIZE as usize)
}

/// Writes the tag of a block of `size` bytes at the start of the chunk `p0` glibc returned,
/// and returns the block's address, `TAG_SIZE` bytes in.
///
/// # Safety
/// `p0` is a 16-byte aligned chunk of at least `size + TAG_SIZE` bytes, the caller's alone;
/// `size` < `TAG_MAX_SIZE`.
#[inline(always)]
pub unsafe fn write(p0: *mut c_void, size: u64, thread: u32, stack: u32) -> *mut c_void {
    let h = p0.cast::<u64>();
    // SAFETY: forwarded contract: the first 16 bytes are the chunk's, 8-byte aligned.
    unsafe {
        let q = h.add(2);
        // The record first, the check word last: a reader in another process (or a core
        // taken between the two stores) that sees the check sees the record it vouches for.
        h.add(1).write(pack_tag(size, thread, stack));
        AtomicU64::from_ptr(h).store(tag_check(q as u64, key()), Release);
        q.cast()
    }
}

/// The record of the tagged block `p`, if `p` is one: a cheap check made at every `free` and
/// `realloc` before the table is asked.
///
/// # Safety
/// `p` is a pointer the program passes to `free`, `realloc` or `malloc_usable_size`: a block
/// of glibc's (whose 16 bytes before it are its chunk's header, so readable), or a bad
/// pointer that glibc itself would read the header of. A 16-byte aligned address of a mapped
/// page whose previous page is unmapped is read only where glibc would fault too.
#[inline(always)]
pub unsafe fn read(p: *mut c_void) -> Option<Block> {
    let key = key();
    let q = p as u64;
    if key == 0 || !q.is_multiple_of(16) || q < TAG_SIZE {
        return None;
    }
    let h = p.cast::<u64>();
    // SAFETY: forwarded contract.
    let check = unsafe { h.sub(2).read() };
    if check != tag_check(q, key) {
        return None;
    }
    // SAFETY: as above; the tag's second word is in the same 16 bytes.
    let (size, thread, stack) = unpack_tag(unsafe { h.sub(1).read() });
    Some(Block {
        addr: q,
        size,
        thread,
        seq: 0,
        stack,
    })
}

/// Erases the tag of the tagged block `p` (before its chunk goes back to glibc, or is handed
/// to `realloc`), so that no stale tag is ever read as a live block. Returns the chunk.
///
/// # Safety
/// [`read`] said `p` is a tagged block, and the program gives it up now.
#[inline(always)]
pub unsafe fn erase(p: *mut c_void) -> *mut c_void {
    // SAFETY: forwarded contract: the tag is the chunk's first 16 bytes, 8-byte aligned.
    unsafe {
        let p0 = p.cast::<u64>().sub(2);
        // The check word goes first, before glibc or a new tag reuses the record.
        AtomicU64::from_ptr(p0).store(0, Relaxed);
        p0.cast()
    }
}

/// Puts back the tag [`erase`] erased, for a `realloc` that failed and left the block as it was.
///
/// # Safety
/// `p0` is the chunk of `block`, which was tagged and is still the program's.
pub unsafe fn restore(p0: *mut c_void, block: &Block) {
    // SAFETY: forwarded contract.
    unsafe { write(p0, block.size, block.thread, block.stack) };
}

/// The chunk in front of the tagged block `p`.
#[inline(always)]
pub fn chunk(p: *mut c_void) -> *mut c_void {
    (p as u64 - TAG_SIZE) as *mut c_void
}

/// The live tagged block that holds `addr`, for `print_trace` and the reports of bad frees.
pub fn find_containing(addr: u64) -> Option<Block> {
    nearest_at_or_below(addr).filter(|b| b.contains(addr))
}

/// The live tagged block that starts nearest at or below `addr`, at most `TAG_MAX_SIZE`
/// bytes down (docs/LAYOUT.md "Block tags"). Memory is read a page at a time with
/// `process_vm_readv`, which fails on an unmapped page instead of faulting, into a buffer on
/// the stack: nothing allocates and nothing waits.
pub fn nearest_at_or_below(addr: u64) -> Option<Block> {
    let key = key();
    let top = addr & !15;
    if key == 0 || top < TAG_SIZE {
        return None;
    }
    // Tags are 16-byte aligned pairs of words, so a tag never straddles two pages: `s` is the
    // start of the tag of a block at `s + 16`.
    let mut s = top - TAG_SIZE;
    let lowest = s.saturating_sub(TAG_MAX_SIZE);
    let mut page = [0u64; 512];
    loop {
        let base = s & !4095;
        if !read_self(base, &mut page) {
            // An unmapped page: no block reaches across it.
            return None;
        }
        loop {
            let i = ((s - base) / 8) as usize;
            let q = s + TAG_SIZE;
            if page[i] == tag_check(q, key) {
                let (size, thread, stack) = unpack_tag(page[i + 1]);
                return Some(Block {
                    addr: q,
                    size,
                    thread,
                    seq: 0,
                    stack,
                });
            }
            if s <= lowest || s == base {
                break;
            }
            s -= 16;
        }
        if s <= lowest || base == 0 {
            return None;
        }
        s = base - 16;
    }
}

/// Copies this process's memory at `addr` into `buf`, all of it or nothing.
fn read_self(addr: u64, buf: &mut [u64]) -> bool {
    let len = core::mem::size_of_val(buf);
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut c_void,
        iov_len: len,
    };
    // SAFETY: `local` is `buf`, writable for `len` bytes; the kernel checks `remote`.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == len as isize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three pages after an inaccessible one: a tag scan that runs off the start must stop
    /// there, not fault.
    struct Pages(*mut u8);

    impl Pages {
        fn new() -> Pages {
            // SAFETY: a fresh anonymous mapping; the first page is made inaccessible below.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    4 * 4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: the first page of the mapping just made.
            assert_eq!(unsafe { libc::mprotect(p, 4096, libc::PROT_NONE) }, 0);
            Pages(p.cast())
        }

        /// The address `offset` bytes into the accessible pages.
        fn at(&self, offset: usize) -> *mut c_void {
            // SAFETY: within the mapping (tests keep offsets under 3 pages).
            unsafe { self.0.add(4096 + offset).cast() }
        }
    }

    impl Drop for Pages {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`.
            unsafe { libc::munmap(self.0.cast(), 4 * 4096) };
        }
    }

    fn tag_at(pages: &Pages, chunk: usize, size: u64) -> u64 {
        // SAFETY: 16 bytes at a 16-byte aligned offset of the accessible pages.
        unsafe { write(pages.at(chunk), size, 3, 77) as u64 }
    }

    #[test]
    fn a_tagged_block_is_found_from_each_of_its_bytes_only() {
        configure(true);
        let pages = Pages::new();
        let q = tag_at(&pages, 4000, 100);
        for a in [q, q + 1, q + 99] {
            let b = find_containing(a).unwrap_or_else(|| panic!("{:#x} not found", a - q));
            assert_eq!(
                (b.addr, b.size, b.thread, b.stack, b.seq),
                (q, 100, 3, 77, 0)
            );
        }
        assert!(find_containing(q + 100).is_none(), "just past it");
        assert!(find_containing(q - 8).is_none(), "its tag");
        assert_eq!(nearest_at_or_below(q + 500).map(|b| b.addr), Some(q));
        // SAFETY: the block tagged above.
        assert_eq!(unsafe { read(q as *mut c_void) }.map(|b| b.size), Some(100));
        // SAFETY: as above; the program gives it up.
        unsafe { erase(q as *mut c_void) };
        assert!(find_containing(q).is_none(), "an erased tag");
    }

    #[test]
    fn a_copied_tag_is_no_tag() {
        configure(true);
        let pages = Pages::new();
        let q = tag_at(&pages, 32, 64);
        let copy = pages.at(1024).cast::<u64>();
        // SAFETY: both 16-byte runs are in the accessible pages.
        unsafe { core::ptr::copy_nonoverlapping((q - 16) as *const u64, copy, 2) };
        assert!(find_containing(copy as u64 + 16).is_none());
        // SAFETY: a 16-byte aligned pointer into the accessible pages.
        assert!(unsafe { read((copy as u64 + 16) as *mut c_void) }.is_none());
        assert_eq!(find_containing(q + 10).map(|b| b.addr), Some(q));
    }

    #[test]
    fn the_largest_tagged_block_is_found_from_its_end_across_pages() {
        configure(true);
        // A block that starts in a mapping of its own and ends 64 KiB - 1 bytes later.
        let len = 17 * 4096;
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let size = TAG_MAX_SIZE - 1;
        // SAFETY: the mapping's first 16 bytes, the block's `size` after them.
        let q = unsafe { write(p, size, 1, 5) } as u64;
        assert_eq!(find_containing(q + size - 1).map(|b| b.size), Some(size));
        assert!(find_containing(q + size).is_none());
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, len) };
    }

    #[test]
    fn a_scan_stops_at_an_unmapped_page() {
        configure(true);
        let pages = Pages::new();
        // Nothing tagged: the scan from the first accessible bytes reaches the inaccessible
        // page before it and stops there.
        assert!(find_containing(pages.at(48) as u64).is_none());
        assert!(nearest_at_or_below(pages.at(0) as u64).is_none());
    }

    #[test]
    fn no_key_no_tags() {
        assert_eq!(tag_key(0) >> 48, 0x5a5a);
        // `room` follows the key: a block under the limit gets 16 more bytes, only with one.
        configure(true);
        assert_eq!(room(100), Some(116));
        assert_eq!(room(TAG_MAX_SIZE as usize), None);
    }
}
