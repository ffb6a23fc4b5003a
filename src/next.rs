//! Functions of the libraries after this one, found with `dlsym(RTLD_NEXT, name)` on first use:
//! those the hooks outside the malloc family pass their calls on to (`pthread_create`,
//! `dlclose`, the credential calls). The malloc family has its own choice (`allocator`).

use core::ffi::CStr;
use core::sync::atomic::{AtomicUsize, Ordering};

/// A function found lazily with `dlsym(RTLD_NEXT, name)`.
pub struct Next {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Next {
    /// A not-yet-resolved symbol.
    pub const fn new(name: &'static CStr) -> Self {
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

pub static PTHREAD_CREATE: Next = Next::new(c"pthread_create");
pub static DLCLOSE: Next = Next::new(c"dlclose");
