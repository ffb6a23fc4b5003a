//! The allocator underneath the tracer, behind a trait.
//!
//! The tracer never allocates the program's blocks itself: the caller of `record` does
//! (the preload library's hooks call glibc). The one time the tracer hands a block back on its
//! own is when the quarantine lets a freed block go, long after the program's `free`; it does
//! that through this trait, so that another allocator can stand where glibc stands today (a
//! Rust `GlobalAlloc` wrapped by the tracer).
//!
//! The quarantine's accounting models glibc's chunk sizes (`store::quarantine`); an allocator
//! whose blocks need their layout to be freed will have to keep it with what it holds.

use core::ffi::c_void;

/// The allocator whose blocks the tracer records.
pub trait RealAlloc {
    /// Whether this is glibc's malloc, whose chunk headers tell a pointer that may be one of
    /// its blocks from one that cannot be (`glibc_heap`): a pointer the tracer never saw
    /// allocated is then checked before it is handed on.
    const GLIBC_HEAP: bool = false;

    /// Gives a block back to the allocator for good.
    ///
    /// # Safety
    /// - `block` was returned by this allocator, and neither the program nor the tracer uses
    ///   it any more.
    unsafe fn free(&self, block: *mut c_void);
}
