//! The reentrancy guard that lets nested calls pass straight through.
//!
//! A hook enters the guard before calling the real allocator and records only if it was the
//! outermost entry. Anything the tracer does while the guard is held — its own allocations,
//! `dlsym` calling `calloc`, glibc calling `malloc` from inside `posix_memalign` — reaches the
//! hooks again and goes straight to glibc untracked, so each block is counted once.
//! The flag lives in the thread's `state::ThreadState`.

use crate::state::{self, ThreadState};
use core::marker::PhantomData;

/// Proof that the current thread is inside the tracer; dropping it leaves.
pub struct Guard {
    state: &'static ThreadState,
    _not_send: PhantomData<*mut ()>,
}

impl Guard {
    /// Enters the tracer, or `None` when this thread is already inside it.
    #[inline(always)]
    pub fn enter() -> Option<Guard> {
        let state = state::current();
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
    pub(crate) fn state(&self) -> &'static ThreadState {
        self.state
    }
}

impl Drop for Guard {
    #[inline(always)]
    fn drop(&mut self) {
        self.state.busy.set(false);
    }
}

/// Marks the current thread busy (or not) regardless of the previous value; returns the
/// previous value so the caller can restore it. `print_trace` uses this because it may be
/// called by gdb on a thread that was stopped inside a hook.
pub fn set_busy(busy: bool) -> bool {
    state::current().busy.replace(busy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_entry_passes_through() {
        let outer = Guard::enter().expect("first entry");
        assert!(Guard::enter().is_none());
        assert!(state::current().busy.get());
        drop(outer);
        assert!(!state::current().busy.get());
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
