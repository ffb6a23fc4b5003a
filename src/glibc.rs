//! The real allocator: glibc's own entry points, and the tracer's view of it ([`Glibc`]).
//!
//! glibc exports its allocator under `__libc_malloc` and friends, so the common functions are
//! linked directly: no `dlsym` is needed before the first `malloc` can be served, and there is
//! no bootstrap window in which allocations would need a stand-in heap (docs/FINDINGS.md,
//! "Finding glibc's allocator without a bootstrap heap": `dlsym` itself calls `calloc`).
//! `posix_memalign` and `reallocarray` are glibc's
//! own few lines of checks around these, repeated in the hooks. The rest (`aligned_alloc`,
//! `malloc_usable_size`, `pthread_create`, `dlclose`) have no `__libc_` twin and are found with
//! `dlsym(RTLD_NEXT, ...)` on first use; `dlsym`'s own `calloc` reaches our hook inside the
//! reentrancy guard and goes straight to glibc.

use core::ffi::c_void;
use core::sync::atomic::{AtomicUsize, Ordering};
use mem_trace_core::real::RealAlloc;

extern "C" {
    pub fn __libc_malloc(size: usize) -> *mut c_void;
    pub fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    pub fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    pub fn __libc_free(p: *mut c_void);
    pub fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    pub fn __libc_valloc(size: usize) -> *mut c_void;
    pub fn __libc_pvalloc(size: usize) -> *mut c_void;
}

/// A function found lazily with `dlsym(RTLD_NEXT, name)`.
pub struct Next {
    name: &'static core::ffi::CStr,
    addr: AtomicUsize,
}

impl Next {
    /// A not-yet-resolved symbol.
    pub const fn new(name: &'static core::ffi::CStr) -> Self {
        Self {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    /// The address of the next definition after ours, or 0 if there is none.
    pub fn get(&self) -> usize {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 {
            return a;
        }
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips our own definition.
        let a = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
        self.addr.store(a, Ordering::Relaxed);
        a
    }
}

pub static ALIGNED_ALLOC: Next = Next::new(c"aligned_alloc");
pub static MALLOC_USABLE_SIZE: Next = Next::new(c"malloc_usable_size");
pub static PTHREAD_CREATE: Next = Next::new(c"pthread_create");
pub static DLCLOSE: Next = Next::new(c"dlclose");

/// glibc, as the allocator underneath the tracer: what the quarantine lets go returns here.
pub struct Glibc;

impl RealAlloc for Glibc {
    const GLIBC_HEAP: bool = true;

    #[inline(always)]
    unsafe fn free(&self, block: *mut c_void) {
        // SAFETY: a block glibc returned that nobody uses any more (the trait's contract).
        unsafe { __libc_free(block) }
    }
}
