//! The aligned allocators (`posix_memalign`, `aligned_alloc`, `memalign`, `valloc`,
//! `pvalloc`) and `malloc_usable_size`.

use super::alloc::from_allocator;
use crate::allocator;
use core::ffi::{c_int, c_void};
use mem_trace_core::guard::Guard;
use mem_trace_core::record::{self, nested};

/// `ask()`, and once more if glibc ran out of memory while the quarantine held blocks (see
/// `alloc::from_allocator`); only for the outermost call (`g`), not the tracer's own.
#[inline(always)]
fn retried(g: &Option<Guard>, size: usize, ask: impl Fn() -> *mut c_void) -> *mut c_void {
    match g {
        Some(g) => from_allocator(g, size, ask),
        None => ask(),
    }
}

/// The glibc rule for `posix_memalign`: a power-of-two multiple of `sizeof(void *)`.
fn valid_posix_alignment(align: usize) -> bool {
    let word = core::mem::size_of::<*const c_void>();
    align != 0 && align.is_multiple_of(word) && (align / word).is_power_of_two()
}

#[cfg_attr(not(test), no_mangle)]
/// `posix_memalign(3)`: `EINVAL` for a bad alignment, `ENOMEM` when out of memory, exactly as
/// glibc decides (its own implementation is this check followed by `memalign`).
///
/// # Safety
/// `out` must be valid for a write.
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !valid_posix_alignment(align) {
        return libc::EINVAL;
    }
    allocator::ensure_chosen();
    let g = Guard::enter();
    // SAFETY: the allocator's memalign has no preconditions.
    let p = retried(&g, size, || unsafe { allocator::memalign(align, size) });
    if p.is_null() {
        return libc::ENOMEM;
    }
    if let Some(g) = g {
        record::allocated(&g, p, size);
    }
    // SAFETY: caller guarantees `out` is writable.
    unsafe { out.write(p) };
    0
}

#[cfg_attr(not(test), no_mangle)]
/// `aligned_alloc(3)`: forwarded to the allocator's own, whose alignment rules are its own
/// (glibc 2.38 rejects non-powers of two), so the program sees the ones it runs on.
///
/// # Safety
/// As for glibc's `aligned_alloc`.
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    allocator::ensure_chosen();
    let g = Guard::enter();
    // SAFETY: forwarded contract.
    let p = retried(&g, size, || unsafe {
        allocator::aligned_alloc(align, size)
    });
    if let Some(g) = g {
        record::allocated(&g, p, size);
    }
    p
}

#[cfg_attr(not(test), no_mangle)]
/// `memalign(3)`.
///
/// # Safety
/// As for glibc's `memalign`.
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    allocator::ensure_chosen();
    let g = Guard::enter();
    // SAFETY: the allocator's memalign has no preconditions.
    let p = retried(&g, size, || unsafe { allocator::memalign(align, size) });
    if let Some(g) = g {
        record::allocated(&g, p, size);
    }
    p
}

#[cfg_attr(not(test), no_mangle)]
/// `valloc(3)`.
///
/// # Safety
/// As for glibc's `valloc`.
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    allocator::ensure_chosen();
    let g = Guard::enter();
    // SAFETY: the allocator's valloc has no preconditions.
    let p = retried(&g, size, || unsafe { allocator::valloc(size) });
    if let Some(g) = g {
        record::allocated(&g, p, size);
    }
    p
}

#[cfg_attr(not(test), no_mangle)]
/// `pvalloc(3)`: the block is the size rounded up to whole pages, and that is what we record.
///
/// # Safety
/// As for glibc's `pvalloc`.
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    allocator::ensure_chosen();
    let g = Guard::enter();
    // SAFETY: the allocator's pvalloc has no preconditions.
    let p = retried(&g, size, || unsafe { allocator::pvalloc(size) });
    if let Some(g) = g {
        let page = 4096usize;
        record::allocated(&g, p, size.div_ceil(page).max(1) * page);
    }
    p
}

#[cfg_attr(not(test), no_mangle)]
/// `malloc_usable_size(3)`: our blocks are the allocator's blocks, so it answers.
///
/// # Safety
/// `p` is null or a live block.
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    allocator::ensure_chosen();
    let _g = Guard::enter();
    // A block a signal handler got from the tracer's arena (see `record::nested`).
    // SAFETY: forwarded contract.
    if let Some(n) = unsafe { nested::usable_size(p) } {
        return n;
    }
    // A tagged block's chunk starts at its tag, which is not the program's to use.
    // SAFETY: forwarded contract.
    let (chunk, tag) = match unsafe { mem_trace_core::store::tags::read(p) } {
        Some(_) => (
            mem_trace_core::store::tags::chunk(p),
            mem_trace_core::store::tags::bytes() as usize,
        ),
        None => (p, 0),
    };
    // SAFETY: forwarded contract.
    unsafe { allocator::usable_size(chunk) }.saturating_sub(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posix_alignment_rule() {
        assert!(valid_posix_alignment(8));
        assert!(valid_posix_alignment(64));
        assert!(valid_posix_alignment(4096));
        assert!(!valid_posix_alignment(0));
        assert!(!valid_posix_alignment(4));
        assert!(!valid_posix_alignment(24));
    }
}
