//! The exported malloc family, and the two other entry points the tracer needs to see
//! (`pthread_create` for stack bounds, `dlclose` for module unloads). Nothing else lives here.
//!
//! Each hook is the same few lines: enter the reentrancy guard, call glibc, record if this was
//! the outermost entry (`malloc` and `calloc` first try a block the quarantine recycles, see
//! `quarantine::reuse`). Recording happens after the real allocation returns; forgetting
//! happens before the real free (see `record::freed`). Semantics — return values, `errno`,
//! alignment, `realloc(NULL, n)`, `realloc(p, 0)` — are glibc's own, because glibc does the
//! work.
//!
//! The symbols are `#[no_mangle]` only outside unit tests, so the test binary keeps glibc's.

use crate::guard::Guard;
use crate::record::{self, Disposition};
use crate::{quarantine, real};
use core::ffi::{c_int, c_void};
use core::ptr;

#[cfg_attr(not(test), no_mangle)]
/// `malloc(3)`.
///
/// # Safety
/// As for glibc's `malloc`.
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let Some(g) = Guard::enter() else {
        // SAFETY: glibc's malloc has no preconditions.
        return unsafe { real::__libc_malloc(size) };
    };
    let mut p = quarantine::reuse(g.state(), size);
    if p.is_null() {
        // SAFETY: as above.
        p = unsafe { real::__libc_malloc(size) };
    }
    record::allocated(&g, p, size);
    p
}

#[cfg_attr(not(test), no_mangle)]
/// `calloc(3)`; overflow of `n * size` is glibc's to report (NULL, `ENOMEM`).
///
/// # Safety
/// As for glibc's `calloc`.
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(g) = Guard::enter() else {
        // SAFETY: glibc's calloc has no preconditions.
        return unsafe { real::__libc_calloc(n, size) };
    };
    let recycled = n
        .checked_mul(size)
        .map(|total| (total, quarantine::reuse(g.state(), total)));
    let p = match recycled {
        Some((total, p)) if !p.is_null() => {
            // SAFETY: a recycled block of at least `total` bytes, now this call's.
            unsafe { ptr::write_bytes(p.cast::<u8>(), 0, total) };
            p
        }
        // SAFETY: as above.
        _ => unsafe { real::__libc_calloc(n, size) },
    };
    // Non-null means the product did not overflow.
    record::allocated(&g, p, n.wrapping_mul(size));
    p
}

#[cfg_attr(not(test), no_mangle)]
/// `free(3)`. A freed block may be held in quarantine instead of going back to glibc at once,
/// and a double or invalid free is reported and kept from glibc (which would abort).
///
/// # Safety
/// `p` is null or a live block of this process's allocator (violations are reported).
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    let disposition = match Guard::enter() {
        Some(g) => record::free(&g, p),
        None => Disposition::Release,
    };
    if disposition == Disposition::Release {
        // SAFETY: forwarded contract; the tracer no longer refers to the block.
        unsafe { real::__libc_free(p) };
    }
}

#[cfg_attr(not(test), no_mangle)]
/// `realloc(3)`: the result is recorded as a new block allocated here (ASan does the same);
/// when the block moves, or size 0 frees it, the old one joins the freed-block history.
///
/// # Safety
/// As for glibc's `realloc`.
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: realloc(NULL, n) is malloc(n).
        return unsafe { malloc(size) };
    }
    let Some(g) = Guard::enter() else {
        // SAFETY: forwarded contract.
        return unsafe { real::__libc_realloc(p, size) };
    };
    let old = record::take(&g, p);
    if old.is_none() && !record::realloc_unknown(&g, p) {
        // A freed (or never allocated) block: glibc would corrupt its heap or abort.
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return core::ptr::null_mut();
    }
    // SAFETY: forwarded contract.
    let q = unsafe { real::__libc_realloc(p, size) };
    match (q.is_null(), old) {
        (false, Some(old)) if q != p => record::moved(&g, old, q, size),
        (false, _) => record::allocated(&g, q, size),
        // realloc(p, 0) freed the block.
        (true, Some(old)) if size == 0 => record::freed_by_realloc(&g, old),
        // Failed to grow: the old block is untouched and still the program's.
        (true, Some(old)) => record::restore(old),
        (true, None) => {}
    }
    q
}

#[cfg_attr(not(test), no_mangle)]
/// `reallocarray(3)`: `ENOMEM` on overflow of `n * size`, like glibc, else `realloc`.
///
/// # Safety
/// As for glibc's `reallocarray`.
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: forwarded contract.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = libc::ENOMEM };
            core::ptr::null_mut()
        }
    }
}

/// The glibc rule for `posix_memalign`: a power-of-two multiple of `sizeof(void *)`.
fn valid_posix_alignment(align: usize) -> bool {
    let word = core::mem::size_of::<*const c_void>();
    align != 0 && align % word == 0 && (align / word).is_power_of_two()
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
    let g = Guard::enter();
    // SAFETY: glibc's memalign has no preconditions.
    let p = unsafe { real::__libc_memalign(align, size) };
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
/// `aligned_alloc(3)`: forwarded to glibc's own, whose alignment rules changed across versions
/// (2.38 rejects non-powers of two), so the program sees the ones of the glibc it runs on.
///
/// # Safety
/// As for glibc's `aligned_alloc`.
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    let g = Guard::enter();
    let p = match real::ALIGNED_ALLOC.get() {
        0 => {
            // SAFETY: glibc's memalign has no preconditions.
            unsafe { real::__libc_memalign(align, size) }
        }
        f => {
            // SAFETY: the next `aligned_alloc` in the lookup order, glibc's.
            let f: unsafe extern "C" fn(usize, usize) -> *mut c_void =
                unsafe { core::mem::transmute(f) };
            // SAFETY: forwarded contract.
            unsafe { f(align, size) }
        }
    };
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
    let g = Guard::enter();
    // SAFETY: glibc's memalign has no preconditions.
    let p = unsafe { real::__libc_memalign(align, size) };
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
    let g = Guard::enter();
    // SAFETY: glibc's valloc has no preconditions.
    let p = unsafe { real::__libc_valloc(size) };
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
    let g = Guard::enter();
    // SAFETY: glibc's pvalloc has no preconditions.
    let p = unsafe { real::__libc_pvalloc(size) };
    if let Some(g) = g {
        let page = 4096usize;
        record::allocated(&g, p, size.div_ceil(page).max(1) * page);
    }
    p
}

#[cfg_attr(not(test), no_mangle)]
/// `malloc_usable_size(3)`: our blocks are glibc's blocks, so glibc answers.
///
/// # Safety
/// `p` is null or a live block.
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    let _g = Guard::enter();
    match real::MALLOC_USABLE_SIZE.get() {
        0 => 0,
        f => {
            // SAFETY: glibc's malloc_usable_size, found with RTLD_NEXT.
            let f: unsafe extern "C" fn(*mut c_void) -> usize = unsafe { core::mem::transmute(f) };
            // SAFETY: forwarded contract.
            unsafe { f(p) }
        }
    }
}

type StartRoutine = extern "C" fn(*mut c_void) -> *mut c_void;
type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartRoutine,
    *mut c_void,
) -> c_int;

struct Start {
    routine: StartRoutine,
    arg: *mut c_void,
}

extern "C" fn thread_trampoline(p: *mut c_void) -> *mut c_void {
    // SAFETY: `p` is the Box made in `pthread_create` below, handed over to this thread.
    let start = unsafe { Box::from_raw(p as *mut Start) };
    record::thread_started();
    let Start { routine, arg } = *start;
    routine(arg)
}

#[cfg_attr(not(test), no_mangle)]
/// `pthread_create(3)`: the new thread first notes its stack bounds (the unwinder reads only
/// within them; asking glibc for them from inside a hook can deadlock), then runs `routine`.
///
/// # Safety
/// As for glibc's `pthread_create`.
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    routine: StartRoutine,
    arg: *mut c_void,
) -> c_int {
    let real = {
        let _g = Guard::enter();
        real::PTHREAD_CREATE.get()
    };
    if real == 0 {
        return libc::EAGAIN;
    }
    // SAFETY: glibc's pthread_create, found with RTLD_NEXT.
    let real: PthreadCreate = unsafe { core::mem::transmute(real) };
    let start = {
        let _g = Guard::enter();
        Box::into_raw(Box::new(Start { routine, arg }))
    };
    // SAFETY: forwarded contract; the trampoline takes ownership of `start`.
    let rc = unsafe { real(thread, attr, thread_trampoline, start.cast()) };
    if rc != 0 {
        let _g = Guard::enter();
        // SAFETY: the thread was not created, so the Box is still ours.
        drop(unsafe { Box::from_raw(start) });
    }
    rc
}

#[cfg_attr(not(test), no_mangle)]
/// `dlclose(3)`: after an unload the unwinder must forget the module before another library
/// can be mapped at the same addresses.
///
/// # Safety
/// As for glibc's `dlclose`.
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let real = {
        let _g = Guard::enter();
        real::DLCLOSE.get()
    };
    if real == 0 {
        return -1;
    }
    // SAFETY: glibc's dlclose, found with RTLD_NEXT.
    let f: unsafe extern "C" fn(*mut c_void) -> c_int = unsafe { core::mem::transmute(real) };
    // SAFETY: forwarded contract.
    let rc = unsafe { f(handle) };
    crate::modules::invalidate();
    rc
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
