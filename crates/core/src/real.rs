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

static IS_OTHER: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// The program's blocks come from another allocator than glibc's (`path`, the library's file):
/// what reads glibc's chunk headers is off (block tags, the check of a pointer never seen
/// allocated), and the start-up line says so. Called before the tracer initialises.
pub fn set_other(path: &str) {
    IS_OTHER.store(true, core::sync::atomic::Ordering::Release);
    // Chosen at the first call of the family, before any block: the tracer may have
    // initialised already (its constructor, or a thread's first call), with tags on.
    crate::store::tags::configure(false, false);
    let _ = core::fmt::write(
        &mut crate::out::Out::stderr(),
        format_args!(
            "mem-trace: the program allocates with {path}, not glibc's malloc: its blocks are \
             traced there, without block tags and without the check of unknown pointers \
             against glibc's heap\n"
        ),
    );
}

/// Whether the allocator underneath is glibc's.
#[inline(always)]
pub fn is_glibc() -> bool {
    !IS_OTHER.load(core::sync::atomic::Ordering::Acquire)
}

/// The program's own `malloc` (in `module`) comes before this library's in the lookup order:
/// the tracer sees none of its blocks, and says so once.
pub fn shadowed(module: &str) {
    let _ = core::fmt::write(
        &mut crate::out::Out::stderr(),
        format_args!(
            "mem-trace: the program brings its own malloc (in {module}), found before the \
             tracer's: its blocks are invisible to the tracer\n"
        ),
    );
}
