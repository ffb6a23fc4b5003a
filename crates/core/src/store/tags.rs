//! Block tags: a small block's record lives in 16 bytes in front of it (profile mode), or 32
//! with its sequence number (debug mode), rather than in the table (docs/LAYOUT.md "Block
//! tags").
//!
//! Why: on a large heap, the table's slot for a block is a random line of a large array, and
//! both the insert and the remove miss on it: two misses per block that glibc's own work on the
//! block does not have (docs/FINDINGS.md "Block tags: profile mode without table slots for
//! small blocks"). The tag is in the chunk glibc hands out and reads back at `free`: its line
//! is the one glibc touches anyway.
//!
//! The key and the tags' size are set once, before the tracer is ready, and never change, so
//! that a tag written under them is read under them: a free of a tagged block must always find
//! its tag.

use super::header::header;
use core::ffi::c_void;
use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::{Relaxed, Release};
use mem_trace_format::{
    freed_check, pack_freed_tag, pack_tag, tag_check, tag_key, unpack_freed_tag, unpack_tag, Block,
    Freed, FLAG_TAG_SEQ, SEQ_TAG_SIZE, TAG_MAX_SIZE, TAG_SIZE,
};

/// Bytes of each tag: 0 (no tags), [`TAG_SIZE`] or [`SEQ_TAG_SIZE`].
static BYTES: AtomicU64 = AtomicU64::new(0);

/// log2 of the bytes of address space one bit of [`GRANULES`] stands for (1 MiB).
const GRANULE_SHIFT: u32 = 20;
/// One bit per MiB of the 47-bit user address space: set once a tag was written there. A
/// pointer given to `free` in memory where no tag ever was is no tagged block, and its tag is
/// then not read: a wild pointer into unmapped memory must be reported, not fault in the
/// check (the table build reported it; glibc alone faults). 16 MiB of zeroed static memory, of
/// which only the words of the heap's 64 MiB spans are ever touched.
static GRANULES: [AtomicU64; 1 << (47 - GRANULE_SHIFT - 6)] =
    [const { AtomicU64::new(0) }; 1 << (47 - GRANULE_SHIFT - 6)];

/// The word and bit of [`GRANULES`] for `addr`, if it is a user-space address.
#[inline(always)]
fn granule(addr: u64) -> Option<(&'static AtomicU64, u64)> {
    let g = addr >> GRANULE_SHIFT;
    let word = GRANULES.get((g >> 6) as usize)?;
    Some((word, 1 << (g & 63)))
}

/// Notes that a tag is written at `addr`, a block's from glibc (so a user-space address: the
/// index needs no bounds check, which each `malloc` would pay). The word is shared by every
/// block of 64 MiB, so it is written only the first time.
#[inline(always)]
fn mark(addr: u64) {
    let g = addr >> GRANULE_SHIFT;
    let word = &GRANULES[(g >> 6) as usize % GRANULES.len()];
    let bit = 1 << (g & 63);
    if word.load(Relaxed) & bit == 0 {
        word.fetch_or(bit, Relaxed);
    }
}

/// Whether a tag may have been written at `addr`.
#[inline(always)]
fn marked(addr: u64) -> bool {
    granule(addr).is_some_and(|(word, bit)| word.load(Relaxed) & bit != 0)
}

/// Starts tagging blocks (`on`: the configuration allows it), with a key that is random per
/// process; `seq`: tags carry the block's sequence number (32 bytes instead of 16). Called
/// once, while the tracer initialises, before any block is recorded.
pub(crate) fn configure(on: bool, seq: bool) {
    let key = if on { tag_key(seed()) } else { 0 };
    let bytes = match (on, seq) {
        (false, _) => 0,
        (true, false) => TAG_SIZE,
        (true, true) => SEQ_TAG_SIZE,
    };
    BYTES.store(bytes, Relaxed);
    if bytes == SEQ_TAG_SIZE {
        header().flags.fetch_or(FLAG_TAG_SEQ, Relaxed);
    } else {
        header().flags.fetch_and(!FLAG_TAG_SEQ, Relaxed);
    }
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

/// Bytes of each tag in front of its block: 0 when no block is tagged.
#[inline(always)]
pub fn bytes() -> u64 {
    BYTES.load(Relaxed)
}

/// Bytes to ask glibc for so that a block of `size` bytes can carry a tag, or `None` when
/// it goes to the table (tags off, or too large for one).
///
/// A block of 1 to 8 bytes is asked for as if it were [`TINY_ROOM`] bytes. With its tag in
/// front, glibc's smallest chunk would end exactly where the block starts (a 16 or 32-byte
/// tag plus 8 bytes fill the chunk, and glibc lends the next chunk's first word to this one),
/// so the next chunk's header would begin at the block's first byte: glibc's `top` or a bin
/// in `main_arena` (libc's data, a root of the leak check) would then hold the block's exact
/// address, and a lone leaked `malloc(4)` would read as "still reachable". Asked for as 9
/// bytes, the chunk is 16 bytes longer and the next header lies 16 bytes into the block's
/// room, past its last byte.
#[inline(always)]
pub fn room(size: usize) -> Option<usize> {
    let bytes = bytes();
    (bytes != 0 && (size as u64) < TAG_MAX_SIZE).then_some(size.max(TINY_ROOM) + bytes as usize)
}

/// The least a tagged block is asked for as (see [`room`]).
pub const TINY_ROOM: usize = 9;

/// Writes the tag of a block of `size` bytes (sequence number `seq`, kept only by long tags)
/// at the start of the chunk `p0` glibc returned, and returns the block's address, [`bytes`]
/// in.
///
/// # Safety
/// Tags are on; `p0` is a 16-byte aligned chunk of at least `size + bytes()` bytes, the
/// caller's alone; `size` < `TAG_MAX_SIZE`.
#[inline(always)]
pub unsafe fn write(p0: *mut c_void, size: u64, thread: u32, stack: u32, seq: u64) -> *mut c_void {
    let bytes = bytes();
    // SAFETY: forwarded contract: the first `bytes` bytes are the chunk's, 8-byte aligned.
    unsafe {
        let q = p0.cast::<u8>().add(bytes as usize).cast::<u64>();
        if bytes == SEQ_TAG_SIZE {
            q.sub(4).write(0);
            q.sub(3).write(seq);
        }
        mark(q.sub(2) as u64);
        // The record first, the check word last: a reader in another process (or a core
        // taken between the two stores) that sees the check sees the record it vouches for.
        q.sub(1).write(pack_tag(size, thread, stack));
        AtomicU64::from_ptr(q.sub(2)).store(tag_check(q as u64, key()), Release);
        q.cast()
    }
}

/// The record of the tagged block `p`, if `p` is one: a cheap check made at every `free` and
/// `realloc` before the table is asked.
///
/// # Safety
/// `p` is a pointer the program passes to `free`, `realloc` or `malloc_usable_size`: a block
/// of glibc's, or a bad pointer. The 16 bytes before `p` are read only in memory where tags
/// were written (a wild pointer elsewhere is no tagged block), and through the kernel when
/// `p` starts a page (whose previous page may be unmapped). What is left is a bad pointer into
/// memory glibc gave back to the system after tags were written there, which glibc alone
/// would fault on too.
#[inline(always)]
pub unsafe fn read(p: *mut c_void) -> Option<Block> {
    let key = key();
    let q = p as u64;
    if key == 0 || !q.is_multiple_of(16) || q < TAG_SIZE || !marked(q - 16) {
        return None;
    }
    let h = p.cast::<u64>();
    let check = match q & 4095 {
        0 => read_word(q - 16)?,
        // SAFETY: the same page as `p`, which the program passes as a block of its: mapped,
        // or glibc would fault reading its chunk header there too.
        _ => unsafe { h.sub(2).read() },
    };
    if check != tag_check(q, key) {
        return None;
    }
    // SAFETY: as above; the tag's second word is in the same 16 bytes.
    let (size, thread, stack) = unpack_tag(unsafe { h.sub(1).read() });
    let seq = match bytes() {
        // SAFETY: the check word vouched for a long tag, whose sequence number is in the
        // block's own chunk.
        SEQ_TAG_SIZE => unsafe { h.sub(3).read() },
        _ => 0,
    };
    Some(Block {
        addr: q,
        size,
        thread,
        seq,
        stack,
    })
}

/// Erases the tag of the tagged block `p` (before its chunk goes back to glibc, or is handed
/// to `realloc`), so that no stale tag is ever read as a live block; or the freed tag of a
/// block whose free is in the history now ([`mark_freed`]: a freed tag must not outlive the
/// hold, since glibc writes its own links over the words before it once it has the chunk).
/// Returns the chunk.
///
/// # Safety
/// [`read`] said `p` is a tagged block, and the program gives it up now; or [`mark_freed`]
/// wrote `p`'s freed tag, and the tracer still holds its chunk.
#[inline(always)]
pub unsafe fn erase(p: *mut c_void) -> *mut c_void {
    // SAFETY: forwarded contract: the check word is 16 bytes before the block, in its chunk,
    // 8-byte aligned.
    unsafe {
        // The check word goes first, before glibc or a new tag reuses the record.
        AtomicU64::from_ptr(p.cast::<u64>().sub(2)).store(0, Relaxed);
    }
    chunk(p)
}

/// Erases the tag of `p` as [`erase`] does, only if it is still the live tag [`read`] found:
/// of several threads freeing one block at once, exactly one gets `true`, and the erase
/// (release) publishes what that thread stored before it (`record::racing`).
///
/// # Safety
/// As for [`erase`].
#[inline(always)]
pub unsafe fn claim(p: *mut c_void) -> bool {
    let q = p as u64;
    // SAFETY: forwarded contract: the check word is 16 bytes before the block, in its chunk,
    // 8-byte aligned.
    let check = unsafe { AtomicU64::from_ptr(p.cast::<u64>().sub(2)) };
    check
        .compare_exchange(tag_check(q, key()), 0, Release, Relaxed)
        .is_ok()
}

/// Rewrites the erased long tag of the block `f` describes as a freed tag (docs/LAYOUT.md
/// "Freed tags"): its free is then answered from the block's own memory while the tracer
/// holds the chunk.
///
/// # Safety
/// Tags are long ([`SEQ_TAG_SIZE`]); [`erase`] erased the tag of `f.block`, whose chunk the
/// tracer holds (no longer the program's, not yet glibc's).
#[inline(always)]
pub unsafe fn mark_freed(f: &Freed) {
    let [free, seq] = pack_freed_tag(f);
    let q = f.block.addr as *mut u64;
    // SAFETY: forwarded contract: the long tag's four words are in the chunk, 8-byte aligned.
    unsafe {
        q.sub(4).write(free);
        q.sub(3).write(seq);
        // Last, as a live tag's: a reader that sees it sees the words it vouches for.
        AtomicU64::from_ptr(q.sub(2)).store(freed_check(f.block.addr, key()), Release);
    }
}

/// The free recorded in the freed tag of `p`, if `p` is a block freed and still held
/// ([`mark_freed`]): the cheap answer to a second `free` of it.
///
/// # Safety
/// As for [`read`].
#[inline]
pub unsafe fn read_freed(p: *mut c_void) -> Option<Freed> {
    let key = key();
    let q = p as u64;
    if key == 0 || bytes() != SEQ_TAG_SIZE || !q.is_multiple_of(16) || q < SEQ_TAG_SIZE {
        return None;
    }
    if !marked(q - 16) {
        return None;
    }
    let mut w = [0u64; 4];
    if q & 4095 < SEQ_TAG_SIZE {
        // The tag may start on the previous page, which may be unmapped.
        if !read_self(q - SEQ_TAG_SIZE, &mut w) {
            return None;
        }
    } else {
        // SAFETY: the same page as `p`, as in `read`.
        w = unsafe { p.cast::<[u64; 4]>().sub(1).read() };
    }
    (w[2] == freed_check(q, key)).then(|| unpack_freed_tag(q, w))
}

/// The free [`mark_freed`] recorded in the tag of `q`.
///
/// # Safety
/// [`mark_freed`] wrote the freed tag of the block at `q`, whose chunk the tracer still holds.
#[inline(always)]
pub unsafe fn held_freed(q: u64) -> Freed {
    // SAFETY: forwarded contract: the tag's four words are in the held chunk.
    unpack_freed_tag(q, unsafe { (q as *const [u64; 4]).sub(1).read() })
}

/// Puts back the tag [`erase`] erased, for a `realloc` that failed and left the block as it was.
///
/// # Safety
/// `p0` is the chunk of `block`, which was tagged and is still the program's.
pub unsafe fn restore(p0: *mut c_void, block: &Block) {
    // SAFETY: forwarded contract.
    unsafe { write(p0, block.size, block.thread, block.stack, block.seq) };
}

/// The chunk in front of the tagged block `p`.
#[inline(always)]
pub fn chunk(p: *mut c_void) -> *mut c_void {
    (p as u64 - bytes()) as *mut c_void
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
                let seq = match bytes() {
                    SEQ_TAG_SIZE if i > 0 => page[i - 1],
                    SEQ_TAG_SIZE => read_word(s - 8).unwrap_or(0),
                    _ => 0,
                };
                return Some(Block {
                    addr: q,
                    size,
                    thread,
                    seq,
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

/// The word of this process's memory at `addr`, if mapped.
#[cold]
#[inline(never)]
fn read_word(addr: u64) -> Option<u64> {
    let mut w = [0u64; 1];
    read_self(addr, &mut w).then_some(w[0])
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
pub(crate) mod tests {
    use super::*;
    use std::sync::{Mutex, MutexGuard};

    /// Tests set the process's one key and tag size: one at a time.
    static CONFIG: Mutex<()> = Mutex::new(());

    /// Tags on (long ones with `seq`) until the result is dropped; other tests wait.
    pub(crate) fn tags_on(seq: bool) -> MutexGuard<'static, ()> {
        let lock = CONFIG.lock().unwrap_or_else(|e| e.into_inner());
        configure(true, seq);
        lock
    }

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
        unsafe { write(pages.at(chunk), size, 3, 77, 9) as u64 }
    }

    #[test]
    fn a_tagged_block_is_found_from_each_of_its_bytes_only() {
        let _on = tags_on(false);
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
        let _on = tags_on(false);
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
        let _on = tags_on(false);
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
        let q = unsafe { write(p, size, 1, 5, 0) } as u64;
        assert_eq!(find_containing(q + size - 1).map(|b| b.size), Some(size));
        assert!(find_containing(q + size).is_none());
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, len) };
    }

    #[test]
    fn a_scan_stops_at_an_unmapped_page() {
        let _on = tags_on(false);
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
        let _on = tags_on(false);
        assert_eq!(room(100), Some(116));
        assert_eq!(room(TAG_MAX_SIZE as usize), None);
    }

    /// The free of the long-tagged block at `q`, as `record::deferred` makes it.
    fn freed(q: u64) -> Freed {
        Freed {
            block: Block {
                addr: q,
                size: 40,
                thread: 2,
                seq: 901,
                stack: 7,
            },
            free_seq: 950,
            free_stack: 11,
            free_thread: 3,
            by_realloc: false,
        }
    }

    #[test]
    fn a_freed_tag_answers_a_second_free_until_erased_and_is_no_live_block() {
        let _on = tags_on(true);
        let pages = Pages::new();
        // One chunk in a page, one whose tag starts on the page before its block's.
        for at in [64, 4096 - 16] {
            // SAFETY: 32 bytes at a 16-byte aligned offset of the accessible pages.
            let q = unsafe { write(pages.at(at), 40, 2, 7, 901) } as u64;
            let p = q as *mut c_void;
            // SAFETY: the block just tagged; the program gives it up and the tracer holds it.
            unsafe {
                erase(p);
                mark_freed(&freed(q));
            }
            // SAFETY: `p` is a pointer the program passes to `free` (a second time).
            assert_eq!(unsafe { read_freed(p) }, Some(freed(q)));
            // SAFETY: as above.
            assert_eq!(unsafe { held_freed(q) }, freed(q));
            // SAFETY: as above: a freed tag is no live tag.
            assert!(unsafe { read(p) }.is_none());
            assert!(find_containing(q + 1).is_none());
            // SAFETY: the held block's freed tag, its free recorded.
            unsafe { erase(p) };
            // SAFETY: as above.
            assert!(unsafe { read_freed(p) }.is_none(), "erased at {at}");
        }
    }

    #[test]
    fn short_tags_are_never_read_as_freed() {
        let _on = tags_on(false);
        let pages = Pages::new();
        let q = tag_at(&pages, 64, 40);
        let f = freed(q);
        let [free, seq] = mem_trace_format::pack_freed_tag(&f);
        // The words a long freed tag would hold, in front of a short tag's block.
        // SAFETY: 32 bytes at a 16-byte aligned offset of the accessible pages.
        unsafe {
            let w = (q as *mut u64).sub(4);
            w.write(free);
            w.add(1).write(seq);
            w.add(2).write(freed_check(q, key()));
        }
        // SAFETY: a pointer the program passes to `free`.
        assert!(unsafe { read_freed(q as *mut c_void) }.is_none());
    }

    #[test]
    fn long_tags_carry_the_sequence_number_even_across_a_page() {
        let _on = tags_on(true);
        let pages = Pages::new();
        assert_eq!(room(100), Some(132));
        // A chunk whose tag's check word starts the second page: its sequence number is the
        // first page's last word, read apart from the page scanned.
        for at in [64, 4096 - 16] {
            // SAFETY: 32 bytes at a 16-byte aligned offset of the accessible pages.
            let q = unsafe { write(pages.at(at), 40, 2, 7, 123_456_789_012) } as u64;
            assert_eq!(q, pages.at(at + 32) as u64);
            // SAFETY: the block tagged just above.
            let read_back = unsafe { read(q as *mut c_void) };
            for b in [find_containing(q + 39), read_back] {
                let b = b.expect("found");
                assert_eq!((b.addr, b.size, b.seq), (q, 40, 123_456_789_012));
            }
            assert_eq!(chunk(q as *mut c_void), pages.at(at));
        }
    }
}
