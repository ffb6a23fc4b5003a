//! Nested allocations served from the arena: glibc's inside the tracer's own calls into glibc
//! while the thread asks for it ([`from_arena`]), and a signal handler's while the thread is
//! inside glibc's allocator (see `guard`).
//!
//! A hook entered while the guard is held (the tracer calling glibc, glibc calling `malloc`)
//! normally passes the call to glibc. One such call costs the program dearly: a new thread's
//! stack bounds come from `pthread_getattr_np`, which allocates the CPU affinity mask it
//! reports, and glibc's first allocation on a thread gives the thread a malloc arena of its
//! own, 64 MiB of address space (128 MiB while it is being aligned). A program whose threads
//! never allocate had none: under the tracer a 2-thread program's peak went from 18.9 MB to
//! 156 MB (docs/FINDINGS.md, "Extra glibc arenas"). Served from the arena instead, glibc never
//! sees the thread until the program's own code allocates.
//!
//! The blocks carry their size in a 16-byte header, so that `realloc` can copy and `free` can
//! give back the arena block; nested `free` and `realloc` know them by the arena's pages
//! (`arena::owns`). glibc's own calls undo theirs within the scope (the mask is freed before
//! `pthread_getattr_np`'s caller destroys the attributes, inside the scope). A handler's block
//! may outlive the handler: the program's `free`, `realloc` and `malloc_usable_size` of a
//! pointer the table does not know ask [`free`], [`realloc`] and [`usable_size`] first.

use crate::arena;
use crate::state;
use core::alloc::Layout;
use core::ffi::c_void;
use core::ptr;

/// Bytes before each block: its size, padded to keep the block 16-aligned like glibc's.
const HEADER: usize = 16;

/// While alive, the thread's nested `malloc`, `calloc` and `realloc` are served from the
/// arena. For the tracer's calls into glibc whose allocations glibc frees before returning.
pub(crate) struct FromArena(());

/// Serves this thread's nested allocations from the arena until the result is dropped.
pub(crate) fn from_arena() -> FromArena {
    state::current().nested_from_arena.set(true);
    FromArena(())
}

impl Drop for FromArena {
    fn drop(&mut self) {
        state::current().nested_from_arena.set(false);
    }
}

fn layout(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_add(HEADER)?, HEADER).ok()
}

/// Whether nested allocations come from the arena: asked for by the tracer, or a signal
/// handler's while the thread is inside glibc's allocator (`guard`), whose heap is half
/// updated then. A handler's block may reach the program's own `free`, `realloc` or
/// `malloc_usable_size`: [`free`], [`realloc`] and [`usable_size`] take it there too.
fn serving() -> bool {
    let s = state::current();
    s.nested_from_arena.get() || s.in_glibc.get()
}

fn allocate(size: usize, zeroed: bool) -> *mut c_void {
    let Some(l) = layout(size) else {
        return ptr::null_mut();
    };
    let p = match zeroed {
        true => arena::allocate_zeroed(l),
        false => arena::allocate(l),
    };
    if p.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: `p` has room for the header and `size` bytes after it.
    let block: *mut c_void = unsafe {
        p.cast::<usize>().write(size);
        p.add(HEADER).cast()
    };
    // Under sampling, a free the filter knows nothing of goes straight to glibc: this block's
    // must come back here.
    crate::sample::Filter::add(block as u64);
    block
}

/// The size recorded for a block of ours.
///
/// # Safety
/// `p` was returned by [`allocate`] and not released.
unsafe fn size_of(p: *mut c_void) -> usize {
    // SAFETY: the header precedes the block (caller's contract).
    unsafe { p.cast::<u8>().sub(HEADER).cast::<usize>().read() }
}

/// # Safety
/// `p` was returned by [`allocate`] and is not used any more.
unsafe fn release(p: *mut c_void) {
    // SAFETY: the caller's contract; the layout is the one it was allocated with.
    unsafe {
        let size = size_of(p);
        let l = layout(size).expect("the layout it was allocated with");
        arena::release(p.cast::<u8>().sub(HEADER), l);
    }
    crate::sample::Filter::remove(p as u64);
}

/// A nested `malloc(size)`: an arena block while serving, else null (the caller asks glibc).
pub fn malloc(size: usize) -> *mut c_void {
    match serving() {
        true => allocate(size, false),
        false => ptr::null_mut(),
    }
}

/// A nested `calloc(n, size)`, as [`malloc`].
pub fn calloc(n: usize, size: usize) -> *mut c_void {
    match (serving(), n.checked_mul(size)) {
        (true, Some(total)) => allocate(total, true),
        _ => ptr::null_mut(),
    }
}

/// A nested `realloc(p, size)`: `Some` when this module serves it (`p` is one of its blocks,
/// or null while serving), with glibc's result for it; `None`: the caller asks glibc.
///
/// # Safety
/// `p` is null or a live block of glibc's or of this module.
pub unsafe fn realloc(p: *mut c_void, size: usize) -> Option<*mut c_void> {
    if p.is_null() {
        return serving().then(|| allocate(size, false));
    }
    if !arena::owns(p.cast()) {
        return None;
    }
    let q = allocate(size, false);
    if !q.is_null() {
        // SAFETY: `p` is ours (its pages are the arena's and only this module hands arena
        // blocks to glibc) with `size_of(p)` bytes; `q` has `size`.
        unsafe {
            ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), size_of(p).min(size));
            release(p);
        }
    }
    // Null: `p` is left alone, as glibc's `realloc` does when it fails.
    Some(q)
}

/// `malloc_usable_size(p)` when `p` is one of this module's blocks.
///
/// # Safety
/// `p` is null or a live block of glibc's or of this module.
pub unsafe fn usable_size(p: *mut c_void) -> Option<usize> {
    // SAFETY: ours, per `owns` (the caller's contract rules out freed blocks).
    arena::owns(p.cast()).then(|| unsafe { size_of(p) })
}

/// A nested `free(p)`: whether `p` was one of this module's blocks (then given back).
///
/// # Safety
/// `p` is a live block of glibc's or of this module.
pub unsafe fn free(p: *mut c_void) -> bool {
    if !arena::owns(p.cast()) {
        return false;
    }
    // SAFETY: an arena block handed to glibc by this module (see `realloc`), now freed.
    unsafe { release(p) };
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_served_only_within_the_scope_and_freed_by_address() {
        assert!(malloc(10).is_null(), "not serving");
        let heap = Box::into_raw(Box::new([7u8; 32]));
        let (p, q) = {
            let _scope = from_arena();
            let p = malloc(24);
            assert!(!p.is_null() && (p as usize).is_multiple_of(16));
            // SAFETY: 24 bytes of ours.
            unsafe { p.cast::<u8>().write_bytes(0xab, 24) };
            let z = calloc(4, 8);
            // SAFETY: 32 zeroed bytes of ours.
            assert!(unsafe { core::slice::from_raw_parts(z.cast::<u8>(), 32) }
                .iter()
                .all(|&b| b == 0));
            // SAFETY: `p` is ours; grown, its 24 bytes move along.
            let q = unsafe { realloc(p, 100) }.expect("ours");
            // SAFETY: 100 bytes of ours, the first 24 copied.
            assert_eq!(unsafe { *q.cast::<u8>().add(23) }, 0xab);
            // SAFETY: `z` is ours.
            assert!(unsafe { free(z) });
            (p, q)
        };
        assert_ne!(p, q);
        // SAFETY: a block of the test's own allocator, not ours: left to it.
        assert!(!unsafe { free(heap.cast()) });
        // SAFETY: as above.
        assert!(unsafe { realloc(heap.cast(), 10) }.is_none());
        // SAFETY: still the test's own.
        drop(unsafe { Box::from_raw(heap) });
        // After the scope, a block made inside it is still freed by address.
        // SAFETY: `q` is ours.
        assert!(unsafe { free(q) });
    }
}
