//! The part of the stack a walk may read: from the capture's stack pointer up to the thread's
//! stack top, whose bounds each thread notes once (`Bounds`). Reading only inside them is what
//! makes a wrong rule truncate a stack instead of faulting.

use core::cell::Cell;

/// The readable stack, `[lo, hi)`: from the capture's own stack pointer to the thread's top.
#[derive(Clone, Copy)]
pub(super) struct Stack {
    pub(super) lo: u64,
    pub(super) hi: u64,
}

impl Stack {
    /// The word at `addr`, if it lies inside the stack.
    #[inline(always)]
    pub(super) fn read(self, addr: u64) -> Option<u64> {
        // One comparison: addr - lo wraps to a huge value below lo.
        if addr.wrapping_sub(self.lo) <= self.hi.wrapping_sub(8).wrapping_sub(self.lo) {
            // SAFETY: `[lo, hi)` is the live part of this thread's stack (callers pass the
            // stack pointer of a frame still running and the thread's stack top), mapped and
            // readable; unaligned because a wrong rule can produce any address.
            Some(unsafe { (addr as *const u64).read_unaligned() })
        } else {
            None
        }
    }
}

/// A thread's stack bounds, `[lo, hi)`; `hi == 0` while unknown.
#[derive(Default)]
pub struct Bounds {
    pub(crate) lo: Cell<u64>,
    pub(crate) hi: Cell<u64>,
}

impl Bounds {
    /// Unknown bounds.
    pub const fn new() -> Self {
        Bounds {
            lo: Cell::new(0),
            hi: Cell::new(0),
        }
    }

    /// Whether `addr` lies on this stack.
    pub fn contains(&self, addr: u64) -> bool {
        (self.lo.get()..self.hi.get()).contains(&addr)
    }

    /// Whether the bounds are known.
    pub fn known(&self) -> bool {
        self.hi.get() != 0
    }
    /// Sets the current thread's stack bounds from pthread's attributes (threads other than the
    /// main one; glibc answers those without reading /proc or allocating under its lock).
    pub fn set_from_pthread(&self) {
        if let Some((lo, hi)) = pthread_stack() {
            self.lo.set(lo);
            self.hi.set(hi);
        }
    }

    /// Sets the main thread's stack bounds: from its top (`main_top`) down by the stack's
    /// size limit, to which the main stack grows on demand.
    pub fn set_main(&self) {
        let hi = main_top();
        if hi == 0 {
            return;
        }
        let mut lim: libc::rlimit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct.
        unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut lim) };
        let size = if lim.rlim_cur == libc::RLIM_INFINITY || lim.rlim_cur == 0 {
            1 << 30
        } else {
            lim.rlim_cur.min(1 << 30)
        };
        self.lo.set(hi.saturating_sub(size));
        self.hi.set(hi);
    }
}

/// The calling thread's stack, `(lo, hi)`, from pthread's attributes.
fn pthread_stack() -> Option<(u64, u64)> {
    // SAFETY: attr is initialised by pthread_getattr_np before use and destroyed after.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = core::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let got = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        got.then_some((addr as u64, addr as u64 + size as u64))
    }
}

/// The top of the main thread's stack (0: unknown), without glibc's `pthread_getattr_np`,
/// which for the main thread reads `/proc/self/maps` with `malloc` under a glibc lock (and
/// deadlocked a Rust program's start-up when called from a hook).
#[cfg(not(target_env = "musl"))]
fn main_top() -> u64 {
    extern "C" {
        /// Set by the dynamic loader to the initial stack pointer of the main thread.
        static __libc_stack_end: *mut libc::c_void;
    }
    // SAFETY: a plain read of a loader-initialised variable.
    let end = unsafe { __libc_stack_end } as u64;
    match end {
        0 => 0,
        // Everything from the initial stack pointer to the end of its page is mapped.
        _ => (end + 8 + 4095) & !4095,
    }
}

/// The top of the main thread's stack (0: unknown). musl has no `__libc_stack_end`; its
/// `pthread_getattr_np` answers for the main thread from where the auxiliary vector lies,
/// probing the mapping with `mremap`: no `malloc`, no lock.
#[cfg(target_env = "musl")]
fn main_top() -> u64 {
    pthread_stack().map_or(0, |(_, hi)| hi)
}
