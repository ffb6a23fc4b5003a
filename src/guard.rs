//! Per-thread state, and the reentrancy guard that lets nested calls pass straight through.
//!
//! A hook enters the guard before calling the real allocator and records only if it was the
//! outermost entry. Anything the tracer does while the guard is held — its own allocations,
//! `dlsym` calling `calloc`, glibc calling `malloc` from inside `posix_memalign` — reaches the
//! hooks again and goes straight to glibc untracked, so each block is counted once.
//!
//! The state is a `const`-initialised thread-local without a destructor: accessing it never
//! allocates and never registers a TLS destructor (which would call `calloc` through
//! `__cxa_thread_atexit_impl`), so it is usable from the first `malloc` of a thread to its
//! last one, even while the thread is being torn down.

use core::cell::{Cell, UnsafeCell};
use core::marker::PhantomData;

/// What the tracer keeps per thread.
pub struct ThreadState {
    busy: Cell<bool>,
    scratch: Cell<bool>,
    /// Thread index in the exported thread table; 0 until the thread first records a block.
    pub index: Cell<u32>,
    /// Bounds of this thread's stack, `[lo, hi)`; `hi == 0` while unknown.
    pub stack_lo: Cell<u64>,
    pub stack_hi: Cell<u64>,
    /// The unwinder's per-thread rule cache, created on first capture (see `unwind`).
    pub unwind_cache: Cell<*mut u8>,
    /// Set once the thread's exit handler ran: from then on no per-thread cache is created.
    pub exiting: Cell<bool>,
    /// Scratch space for the frames of one capture, here rather than on the stack because a
    /// fresh 1 KiB array would be zeroed on every allocation (measured: ~7% of churn's time).
    /// Only `record::stack_here` uses it, and captures never nest (the guard is held).
    pub frames: UnsafeCell<[u64; crate::unwind::MAX_FRAMES]>,
    /// Recently interned stacks, so a repeated stack is found without the interner's lock:
    /// entry `hash % N` holds the hash's top 40 bits and the stack id (see `stacks::intern`).
    pub intern_cache: [Cell<u64>; INTERN_CACHE],
    /// Records of the freed-block history this thread has claimed.
    pub history: crate::freed::Claim,
    /// This thread's quarantine (see `quarantine`), null until its first held free.
    pub quarantine: Cell<*mut u8>,
}

/// Entries of the per-thread intern cache.
pub const INTERN_CACHE: usize = 256;

impl ThreadState {
    const fn new() -> Self {
        Self {
            busy: Cell::new(false),
            scratch: Cell::new(false),
            index: Cell::new(0),
            stack_lo: Cell::new(0),
            stack_hi: Cell::new(0),
            unwind_cache: Cell::new(core::ptr::null_mut()),
            exiting: Cell::new(false),
            frames: UnsafeCell::new([0; crate::unwind::MAX_FRAMES]),
            intern_cache: [const { Cell::new(0) }; INTERN_CACHE],
            history: crate::freed::Claim::new(),
            quarantine: Cell::new(core::ptr::null_mut()),
        }
    }
}

thread_local! {
    static STATE: ThreadState = const { ThreadState::new() };
}

/// The current thread's state. The reference stays valid for the thread's whole life: the
/// thread-local has no destructor, so its storage lives as long as the thread.
#[inline(always)]
pub fn current() -> &'static ThreadState {
    // SAFETY: see above; the reference never leaves this thread because ThreadState is !Sync.
    STATE.with(|s| unsafe { &*(s as *const ThreadState) })
}

/// Proof that the current thread is inside the tracer; dropping it leaves.
pub struct Guard {
    state: &'static ThreadState,
    _not_send: PhantomData<*mut ()>,
}

impl Guard {
    /// Enters the tracer, or `None` when this thread is already inside it.
    #[inline(always)]
    pub fn enter() -> Option<Guard> {
        let state = current();
        if state.busy.replace(true) {
            return None;
        }
        Some(Guard {
            state,
            _not_send: PhantomData,
        })
    }

    /// The state of the thread holding the guard.
    #[inline(always)]
    pub fn state(&self) -> &'static ThreadState {
        self.state
    }
}

impl Drop for Guard {
    #[inline(always)]
    fn drop(&mut self) {
        self.state.busy.set(false);
    }
}

/// Whether the current thread is inside the tracer (used by `print_trace` to say so).
pub fn inside_tracer() -> bool {
    current().busy.get()
}

/// Marks the current thread busy (or not) regardless of the previous value; returns the
/// previous value so the caller can restore it. `print_trace` uses this because it may be
/// called by gdb on a thread that was stopped inside a hook.
pub fn set_busy(busy: bool) -> bool {
    current().busy.replace(busy)
}

/// Whether the current thread's allocations go to the scratch region (see `arena`).
#[inline(always)]
pub fn in_scratch() -> bool {
    current().scratch.get()
}

pub(crate) fn set_scratch(on: bool) {
    current().scratch.set(on);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_entry_passes_through() {
        let outer = Guard::enter().expect("first entry");
        assert!(Guard::enter().is_none());
        assert!(inside_tracer());
        drop(outer);
        assert!(!inside_tracer());
        assert!(Guard::enter().is_some());
    }

    #[test]
    fn state_is_per_thread() {
        let _g = Guard::enter().unwrap();
        std::thread::spawn(|| assert!(Guard::enter().is_some()))
            .join()
            .unwrap();
    }
}
