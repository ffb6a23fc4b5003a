//! A growable FIFO ring in the tracer's arena, for the quarantine's queues.
//!
//! `std`'s `VecDeque` allocates through the global allocator and aborts the program when growth
//! fails; the quarantine runs inside `free`, so a failed growth must instead say so and let the
//! caller give the block straight back.

use crate::arena;
use core::alloc::Layout;

/// A double-ended queue of `T` in arena memory.
pub(super) struct Ring<T: Copy> {
    buf: *mut T,
    cap: usize,
    head: usize,
    len: usize,
}

// SAFETY: the ring owns its buffer exclusively; moving it to another thread moves that
// ownership (the quarantine keeps rings behind a lock).
unsafe impl<T: Copy + Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// An empty ring; allocates nothing until the first push.
    pub(super) const fn new() -> Self {
        Ring {
            buf: core::ptr::null_mut(),
            cap: 0,
            head: 0,
            len: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slot(&self, i: usize) -> *mut T {
        let mut k = self.head + i;
        if k >= self.cap {
            k -= self.cap;
        }
        // SAFETY (of the arithmetic): `k < cap`, inside the buffer.
        self.buf.wrapping_add(k)
    }

    /// Appends `v`; `false` when the ring is full and no memory is left to grow it.
    pub(super) fn push_back(&mut self, v: T) -> bool {
        if self.len == self.cap && !self.grow() {
            return false;
        }
        // SAFETY: `len < cap`, so the slot is inside the buffer and unused.
        unsafe { self.slot(self.len).write(v) };
        self.len += 1;
        true
    }

    /// Removes and returns the oldest element.
    pub(super) fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        // SAFETY: slot 0 holds an element written by `push_back`.
        let v = unsafe { self.slot(0).read() };
        self.head = if self.head + 1 == self.cap {
            0
        } else {
            self.head + 1
        };
        self.len -= 1;
        Some(v)
    }

    /// Removes and returns the newest element.
    pub(super) fn pop_back(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: slot `len` (before the decrement, the last) holds an element.
        Some(unsafe { self.slot(self.len).read() })
    }

    /// The newest element, as a reference (for prefetching its address).
    pub(super) fn back(&self) -> Option<&T> {
        self.get(self.len.checked_sub(1)?)
    }

    /// The element `i` places from the front, as a reference (for prefetching its address).
    pub(super) fn get(&self, i: usize) -> Option<&T> {
        // SAFETY: `i < len`: an element written by `push_back`, borrowed with `self`.
        (i < self.len).then(|| unsafe { &*self.slot(i) })
    }

    /// The elements, oldest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = T> + '_ {
        // SAFETY: every `i < len` names a written element.
        (0..self.len).map(|i| unsafe { self.slot(i).read() })
    }

    /// Empties the ring, keeping its buffer.
    #[cfg(test)]
    pub(super) fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }

    /// Doubles the buffer (at least 16 elements), copying the elements to its start.
    #[cold]
    fn grow(&mut self) -> bool {
        let new_cap = (self.cap * 2).max(16);
        let Ok(layout) = Layout::array::<T>(new_cap) else {
            return false;
        };
        let new = arena::allocate(layout) as *mut T;
        if new.is_null() {
            return false;
        }
        for i in 0..self.len {
            // SAFETY: `i < len` is a written element; `new` has room for `new_cap > len`.
            unsafe { new.add(i).write(self.slot(i).read()) };
        }
        self.release();
        self.buf = new;
        self.cap = new_cap;
        self.head = 0;
        true
    }

    fn release(&mut self) {
        if self.cap != 0 {
            let layout = Layout::array::<T>(self.cap).expect("the layout it was allocated with");
            // SAFETY: allocated by `grow` from the arena with this layout; no longer used.
            unsafe { arena::release(self.buf.cast(), layout) };
        }
    }
}

impl<T: Copy> Drop for Ring<T> {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_lifo_ends_across_growth_and_wrap() {
        let mut r = Ring::new();
        assert!(r.is_empty() && r.pop_front().is_none() && r.pop_back().is_none());
        for i in 0..10u64 {
            assert!(r.push_back(i));
        }
        for i in 0..6 {
            assert_eq!(r.pop_front(), Some(i));
        }
        // Wraps around the 16-slot buffer, then grows while wrapped.
        for i in 10..40u64 {
            assert!(r.push_back(i));
        }
        assert_eq!(r.len(), 34);
        assert_eq!(r.get(0), Some(&6));
        assert_eq!(r.get(33), Some(&39));
        assert_eq!(r.get(34), None);
        assert!(r.iter().eq(6..40));
        assert_eq!(r.pop_back(), Some(39));
        assert_eq!(r.pop_front(), Some(6));
        r.clear();
        assert!(r.is_empty());
    }
}
