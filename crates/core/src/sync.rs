//! A spin lock small enough to live inside the exported layout, with `try_lock` for readers that
//! must never wait (`print_trace`) and a forced unlock for the child side of `fork`.
//!
//! Why not `parking_lot` or `std::sync::Mutex`: the lock word is part of the layout contract
//! (`docs/LAYOUT.md`, a `u32` at offset 0 of each shard), it is taken inside `malloc` hooks
//! where parking would touch thread-locals with destructors, and critical sections are a few
//! dozen instructions long. Contention falls back to `sched_yield` so a descheduled holder is
//! not spun against for a whole time slice.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicPtr, AtomicU32, Ordering, Ordering::Relaxed};

/// A raw spin lock word: `0` free, `1` held.
#[repr(transparent)]
#[derive(Default)]
pub struct RawSpin(AtomicU32);

impl RawSpin {
    /// A free lock.
    pub const fn new() -> Self {
        Self(AtomicU32::new(0))
    }

    /// Takes the lock, spinning then yielding while someone else holds it.
    #[inline]
    pub fn lock(&self) {
        if self.try_lock() {
            return;
        }
        self.lock_slow();
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        let mut spins = 0u32;
        loop {
            if self.0.load(Ordering::Relaxed) == 0 && self.try_lock() {
                return;
            }
            spins += 1;
            if spins < 64 {
                core::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }

    /// Takes the lock if it is free; never waits.
    #[inline]
    pub fn try_lock(&self) -> bool {
        self.0
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// The lock word of a layout type (a shard's `lock`, docs/LAYOUT.md), used as a lock.
    #[inline(always)]
    pub fn of(word: &AtomicU32) -> &RawSpin {
        // SAFETY: `RawSpin` is `repr(transparent)` over `AtomicU32`, so the reference is to a
        // valid `RawSpin` with the same lifetime.
        unsafe { &*(word as *const AtomicU32 as *const RawSpin) }
    }

    /// Releases the lock.
    #[inline]
    pub fn unlock(&self) {
        self.0.store(0, Ordering::Release);
    }
}

/// A value protected by a [`RawSpin`].
pub struct SpinLock<T> {
    raw: RawSpin,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `raw`, like a mutex.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the value; no thread-affine state.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// A free lock around `value`.
    pub const fn new(value: T) -> Self {
        Self {
            raw: RawSpin::new(),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, waiting as long as needed.
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        self.raw.lock();
        SpinGuard {
            lock: self,
            held: true,
        }
    }

    /// The value, without the lock's atomic instruction while the process has one thread
    /// ([`one_thread`]); locked otherwise.
    ///
    /// # Safety
    /// The caller is inside the tracer's guard, and whatever else uses this lock on the same
    /// thread does not run meanwhile: no other thread exists, and a signal handler's
    /// allocations are nested in the guard, never here.
    #[inline(always)]
    pub unsafe fn lock_unless_alone(&self) -> SpinGuard<'_, T> {
        if one_thread() {
            return SpinGuard {
                lock: self,
                held: false,
            };
        }
        self.lock()
    }

    /// Takes the lock only if it is free.
    #[cfg(test)]
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        self.raw.try_lock().then_some(SpinGuard {
            lock: self,
            held: true,
        })
    }

    /// The lock word, for `fork` handlers that lock and unlock without a guard.
    pub fn raw(&self) -> &RawSpin {
        &self.raw
    }

    /// The protected value, for code that holds the lock through [`SpinLock::raw`]; only
    /// dereferenced while that lock is held.
    pub fn data_ptr(&self) -> *mut T {
        self.value.get()
    }
}

/// Holds a [`SpinLock`] (or stands for it, see [`SpinLock::lock_unless_alone`]); releases it
/// on drop.
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    held: bool,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves the lock is held (or that nothing else can take it), so no
        // one else touches the value.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        if self.held {
            self.lock.raw.unlock();
        }
    }
}

/// glibc's `__libc_single_threaded` (glibc 2.32 on): not 0 while the process has had only
/// one thread. Null until found, and where glibc has none: the process then counts as
/// having several.
static SINGLE_THREADED: AtomicPtr<u8> = AtomicPtr::new(core::ptr::null_mut());

/// Looks up glibc's `__libc_single_threaded` (from the library's start, outside any hook:
/// `dlsym` may take the loader's lock and allocate).
pub(crate) fn find_single_threaded() {
    // SAFETY: a symbol lookup with a NUL-terminated name; the result is only ever read as a
    // byte, which is what glibc declares it as.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__libc_single_threaded".as_ptr()) };
    SINGLE_THREADED.store(p.cast(), Relaxed);
}

/// Whether the process has only ever had one thread: no other thread can write a shared
/// record. glibc clears the flag before the second thread starts and never sets it again.
#[inline(always)]
pub(crate) fn one_thread() -> bool {
    let p = SINGLE_THREADED.load(Relaxed);
    // SAFETY: glibc's `char __libc_single_threaded`, a static of libc.so that lives as long
    // as the process; written only by glibc, before a second thread exists.
    !p.is_null() && unsafe { p.read_volatile() } != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn try_lock_fails_while_held() {
        let l = SpinLock::new(1);
        let g = l.lock();
        assert!(l.try_lock().is_none());
        drop(g);
        assert!(l.try_lock().is_some());
    }

    #[test]
    fn counts_correctly_across_threads() {
        let l = Arc::new(SpinLock::new(0u64));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*l.lock(), 80_000);
    }
}
