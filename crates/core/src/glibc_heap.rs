//! Whether a pointer the tracer never saw allocated could still be a block of glibc's heap.
//!
//! Blocks made before the tracer started, or while it could not record, are unknown to the
//! table, and their frees must reach glibc. Anything else that is no block start glibc would
//! read as a chunk header, and then crash (a wild pointer) or abort ("free(): invalid
//! pointer"). So the pointer is checked the way glibc itself checks a chunk, but only after
//! `/proc/self/maps` says the words read are mapped and readable: the mapping must be heap
//! memory (the program break or anonymous), and the header before the pointer must describe
//! an in-use chunk that fits in it. Only glibc's malloc has these headers; other allocators
//! are not asked.

use crate::maps::{self, Mapping, Place};

/// A chunk's size field holds flags in its low bits (glibc's malloc.c).
const PREV_INUSE: u64 = 1;
const IS_MMAPPED: u64 = 2;
const FLAGS: u64 = 7;
/// The smallest chunk, and the alignment of every chunk and size, on 64-bit glibc.
const MIN_CHUNK: u64 = 32;
const ALIGN: u64 = 16;
/// The header before a block: the previous chunk's size, then this chunk's size and flags.
const HEADER: u64 = 16;
const PAGE: u64 = 4096;

/// Why a pointer cannot be one of glibc's blocks.
#[derive(Clone, Copy, Debug)]
pub enum NotHeap {
    /// No memory is mapped there: a wild pointer.
    Unmapped,
    /// In a mapping where glibc keeps no heap (a file, the stack, read-only memory).
    Mapping(Mapping),
    /// In heap memory, but what lies before it is no in-use chunk's header.
    NoChunk(Mapping),
}

/// Says whether glibc may take `addr` as one of its blocks (`Ok`, also when the mappings
/// cannot be read: then glibc decides as it would without the tracer).
// The error is large (a mapping's name): boxing it would allocate inside the allocator, on a
// path taken only for bad pointers.
#[allow(clippy::result_large_err)]
pub fn vouch(addr: u64) -> Result<(), NotHeap> {
    let m = match maps::find(addr) {
        Place::Unknown => return Ok(()),
        Place::Unmapped => return Err(NotHeap::Unmapped),
        Place::In(m) if !m.may_hold_heap() => return Err(NotHeap::Mapping(m)),
        Place::In(m) => m,
    };
    match chunk_fits(&m, addr) {
        Some(true) => Ok(()),
        Some(false) => Err(NotHeap::NoChunk(m)),
        // Unmapped since `/proc/self/maps` was read.
        None => Err(NotHeap::Unmapped),
    }
}

/// Whether the header before `addr` describes an in-use chunk inside `m`, by the checks glibc's
/// `free` makes (`munmap_chunk` for `mmap`ed chunks; for the others, the size's alignment and
/// the next chunk's `PREV_INUSE` bit, which says this one is in use). `None` if a word could
/// not be read after all.
fn chunk_fits(m: &Mapping, addr: u64) -> Option<bool> {
    let Some(chunk) = addr.checked_sub(HEADER) else {
        return Some(false);
    };
    if !m.holds(chunk, addr) {
        return Some(false);
    }
    let size_field = read(chunk + 8)?;
    let size = size_field & !FLAGS;
    if size_field & IS_MMAPPED != 0 {
        // An mmap'ed chunk starts `prev_size` bytes into its mapping (alignment padding of
        // memalign), and the mapping is whole pages.
        let offset = read(chunk)?;
        let Some(start) = chunk.checked_sub(offset) else {
            return Some(false);
        };
        let in_page = addr & (PAGE - 1);
        return Some(
            (start | offset.wrapping_add(size)) & (PAGE - 1) == 0
                && in_page & in_page.wrapping_sub(1) == 0
                && m.holds(start, start.saturating_add(offset).saturating_add(size)),
        );
    }
    let Some(next) = chunk.checked_add(size) else {
        return Some(false);
    };
    if size < MIN_CHUNK
        || !size.is_multiple_of(ALIGN)
        || !m.holds(chunk, next.saturating_add(HEADER))
    {
        return Some(false);
    }
    let next_size = read(next + 8)?;
    Some(next_size & PREV_INUSE != 0 && next_size & !FLAGS >= ALIGN)
}

/// Reads a word the mappings said readable (the caller checked it with
/// [`Mapping::holds`]), through `process_vm_readv` on this process: the mapping may be gone
/// by now (another thread's `free` unmapped an mmapped chunk, or `munmap`), and a plain read
/// would then kill the program with SIGSEGV where the system call fails with `EFAULT`.
/// `None` if it failed so.
fn read(at: u64) -> Option<u64> {
    let mut word = 0u64;
    let local = libc::iovec {
        iov_base: (&mut word as *mut u64).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: at as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: `local` is a local word; the kernel checks `remote`.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == 8 {
        return Some(word);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EFAULT) => None,
        // Refused (a seccomp filter, ENOSYS or EPERM): read directly, as before the race was
        // known; the mappings were read just now.
        // SAFETY: `at` is 8-byte aligned (the pointer is 16-aligned and offsets are multiples
        // of 8) and was inside a readable mapping when the mappings were read.
        _ => Some(unsafe { core::ptr::read_volatile(at as *const u64) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_block_passes() {
        // SAFETY: a plain glibc allocation, freed below.
        let p = unsafe { libc::malloc(100) } as u64;
        assert!(vouch(p).is_ok());
        // An mmap'ed chunk.
        // SAFETY: as above.
        let big = unsafe { libc::malloc(4 << 20) } as u64;
        assert!(vouch(big).is_ok());
        // SAFETY: both came from malloc above.
        unsafe {
            libc::free(p as *mut _);
            libc::free(big as *mut _);
        }
    }

    #[test]
    fn wild_and_foreign_pointers_fail() {
        assert!(matches!(vouch(0x10), Err(NotHeap::Unmapped)));
        let code = a_live_block_passes as *const () as u64 & !15;
        assert!(matches!(vouch(code), Err(NotHeap::Mapping(_))));
        // Zeroed anonymous memory: heap-like, but no chunk header.
        // SAFETY: a fresh private mapping, unmapped below.
        let page = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                1 << 16,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as u64;
        assert!(matches!(vouch(page + 256), Err(NotHeap::NoChunk(_))));
        // The mapping's first bytes: the header would lie before it.
        assert!(matches!(vouch(page), Err(NotHeap::NoChunk(_))));
        // SAFETY: our own mapping.
        unsafe { libc::munmap(page as *mut _, 1 << 16) };
    }

    #[test]
    fn inside_a_block_fails() {
        // SAFETY: a plain glibc allocation, zeroed, freed below.
        let p = unsafe { libc::calloc(1, 256) } as u64;
        assert!(matches!(vouch(p + 64), Err(NotHeap::NoChunk(_))));
        // SAFETY: from calloc above.
        unsafe { libc::free(p as *mut _) };
    }
}
