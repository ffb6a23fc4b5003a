//! What capture keeps per thread: the stack bounds, the unwinder state, the frame buffer.

use super::stack::Bounds;
use crate::config::MAX_FRAMES;
use core::cell::{Cell, UnsafeCell};

/// The capture's per-thread part of `state::ThreadState`.
pub struct Local {
    /// Bounds of this thread's stack, within which alone a walk reads.
    pub bounds: Bounds,
    /// The thread's `ThreadCache`, made on its first capture (see `cache`).
    pub(super) cache: Cell<*mut u8>,
    /// Set once the thread's exit handler dropped the cache: no new one is made after it.
    pub(super) closed: Cell<bool>,
    /// Scratch space for the frames of one capture, here rather than on the stack because a
    /// fresh 1 KiB array would be zeroed on every allocation (measured: ~7% of churn's time).
    /// Only `record` uses it, and captures never nest (the reentrancy guard is held).
    pub frames: UnsafeCell<[u64; MAX_FRAMES]>,
    /// Registers the next capture starts from instead of its own (0: none), set by an
    /// allocator wrapper whose frames lie in the program's own module (`record::start_here`).
    pub(super) start: Cell<(u64, u64, u64)>,
    /// `start`'s pc is a return address: the caller of a hook (see `capture::start_at_return`).
    pub(super) start_returns: Cell<bool>,
}

impl Local {
    /// A thread's state before its first capture.
    pub const fn new() -> Self {
        Local {
            bounds: Bounds::new(),
            cache: Cell::new(core::ptr::null_mut()),
            closed: Cell::new(false),
            frames: UnsafeCell::new([0; MAX_FRAMES]),
            start: Cell::new((0, 0, 0)),
            start_returns: Cell::new(false),
        }
    }
}

impl Default for Local {
    fn default() -> Self {
        Self::new()
    }
}
