//! Which pages the arena has mapped, so that a global allocator wrapping another one (the
//! root crate's `Traced`) can tell the arena's blocks from its inner allocator's on `dealloc`,
//! given only the pointer.
//!
//! A two-level bitmap over the 48-bit address space, one bit a page: a static directory of
//! leaves, each leaf a lazily mapped bitmap covering 16 GiB (512 KiB of bits, `MAP_NORESERVE`:
//! the kernel backs only the words that were written). Lookups take no lock and never
//! allocate, so they are safe in `dealloc` at any time, `print_trace` included.
//!
//! The leaf size weighs address space, which `ulimit -v` counts even where nothing is backed:
//! the directory (8 bytes a leaf, in `.bss`) against the leaves the arena's mappings touch,
//! usually one. 64 GiB leaves cost 2 MiB for a tracer that maps a few; 16 GiB leaves, 512 KiB
//! and a 128 KiB directory.

use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

// Readers outside the process read the bitmap too (its geometry is the layout's).
use mem_trace_format::{
    ARENA_LEAF_BITS as LEAF_BITS, ARENA_LEAVES as LEAVES, ARENA_PAGE_BITS as PAGE_BITS,
};

const LEAF_WORDS: usize = (1 << LEAF_BITS) / 64;

/// The directory, exported through the header's arena map (`super::MAP`).
pub(super) static DIRECTORY: [AtomicPtr<AtomicU64>; LEAVES] =
    [const { AtomicPtr::new(ptr::null_mut()) }; LEAVES];

/// The leaf and bit of a page, or `None` for an address outside the 48-bit space.
fn place(page: usize) -> Option<(usize, usize)> {
    let leaf = page >> LEAF_BITS;
    (leaf < LEAVES).then_some((leaf, page & ((1 << LEAF_BITS) - 1)))
}

/// The leaf `index`, mapped first when `create` and there is none; `None` if absent.
fn leaf(index: usize, create: bool) -> Option<&'static [AtomicU64]> {
    let slot = &DIRECTORY[index];
    let mut p = slot.load(Ordering::Acquire);
    if p.is_null() && create {
        let len = LEAF_WORDS * 8;
        let fresh = anonymous(len, true)?;
        p = match slot.compare_exchange(
            ptr::null_mut(),
            fresh.cast(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => fresh.cast(),
            Err(existing) => {
                // SAFETY: our own mapping, never published.
                unsafe { libc::munmap(fresh.cast(), len) };
                existing
            }
        };
    }
    // SAFETY: a published leaf is a zero-initialised mapping of LEAF_WORDS words, never
    // unmapped; AtomicU64 has the layout of u64.
    (!p.is_null()).then(|| unsafe { core::slice::from_raw_parts(p, LEAF_WORDS) })
}

/// Marks (or unmarks) the pages of `start..start+len` as the arena's. Marking fails only when
/// a leaf cannot be mapped; the caller then gives the memory back instead of using it.
pub(super) fn mark(start: *mut u8, len: usize, owned: bool) -> bool {
    let first = start as usize >> PAGE_BITS;
    let last = (start as usize + len).div_ceil(1 << PAGE_BITS);
    for page in first..last {
        let Some((l, bit)) = place(page) else {
            return false;
        };
        let Some(words) = leaf(l, owned) else {
            return !owned;
        };
        let mask = 1u64 << (bit % 64);
        match owned {
            true => words[bit / 64].fetch_or(mask, Ordering::Release),
            false => words[bit / 64].fetch_and(!mask, Ordering::Release),
        };
    }
    true
}

/// Whether `p` lies in a page the arena mapped and still holds.
pub(super) fn marked(p: *const u8) -> bool {
    let Some((l, bit)) = place(p as usize >> PAGE_BITS) else {
        return false;
    };
    leaf(l, false).is_some_and(|w| w[bit / 64].load(Ordering::Acquire) & (1 << (bit % 64)) != 0)
}

/// `len` bytes of zeroed, private, anonymous memory at an address of the kernel's choosing;
/// with `noreserve`, backed only where touched (`MAP_NORESERVE`). `None` on failure. The one
/// `mmap` of the arena: its mappings, the reserve, the scratch region and the page bitmap.
pub(super) fn anonymous(len: usize, noreserve: bool) -> Option<*mut u8> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let flags = if noreserve {
        flags | libc::MAP_NORESERVE
    } else {
        flags
    };
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_per_page_and_undone() {
        let mut buf = vec![0u8; 5 << PAGE_BITS];
        let base = ((buf.as_mut_ptr() as usize).div_ceil(4096) * 4096) as *mut u8;
        assert!(!marked(base));
        assert!(mark(base, 2 << PAGE_BITS, true));
        assert!(marked(base));
        // SAFETY: within `buf` (5 pages, so one page past the aligned base + 2 fits).
        unsafe {
            assert!(marked(base.add((2 << PAGE_BITS) - 1)));
            assert!(!marked(base.add(2 << PAGE_BITS)));
        }
        assert!(mark(base, 2 << PAGE_BITS, false));
        assert!(!marked(base));
        assert!(!marked(usize::MAX as *const u8));
    }
}
