//! The program's threads, counted so that the profiler thread leaves with the last of them.
//!
//! glibc ends a process whose last thread returns or calls `pthread_exit` (the main one
//! included) with `exit(0)`, but it counts every thread it made, the profiler thread too:
//! while that lives, the process would live on with nothing but it, for ever, and no signal
//! but `SIGKILL` could end it (the profiler thread blocks them all, and a thread group whose
//! leader has left takes a process-wide signal only through its other threads). Seen: `main`
//! calling `pthread_exit` after starting its workers, and a child forked from a thread whose
//! only thread then ended (CPython's `test_threading` does both).
//!
//! Each thread the program makes through `pthread_create` is counted there, before glibc
//! counts it, and carries a value under a key of ours, whose destructor glibc runs as the
//! thread ends and before it counts it out; the main thread's is set at start. The destructor
//! that takes the count to zero stops and joins the profiler thread, and glibc then finds no
//! thread left and calls `exit(0)`, which writes the exit report as usual.
//!
//! Not counted: threads glibc makes for itself (a `SIGEV_THREAD` timer's, `aio`'s), those a
//! library's constructor made before ours ran, and, in a process attached to, those from
//! before the attach (so the count is not kept there at all).
//! Such a thread that outlives the counted ones finds the profiler thread gone: periodic
//! reports stop, the exit report is still written.

use crate::config;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering::AcqRel, Ordering::Relaxed};

/// The program's threads still running (the main thread is one).
static THREADS: AtomicU32 = AtomicU32::new(1);
/// The key whose destructor counts a thread out, once made.
static KEY: AtomicU32 = AtomicU32::new(u32::MAX);
/// Whether threads are counted in this process.
static COUNTING: AtomicBool = AtomicBool::new(false);

/// From the constructor, in the main thread: the key, and the main thread's value under it.
pub(crate) fn init() {
    if config::attached() {
        return;
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: makes a key whose destructor touches only this module's counters and the
    // profiler thread.
    if unsafe { libc::pthread_key_create(&mut key, Some(counted_out)) } != 0 {
        return;
    }
    KEY.store(key, Relaxed);
    COUNTING.store(true, Relaxed);
    counts_this_thread();
}

/// The program is about to make a thread: counted now, before glibc counts it, so that no
/// thread ending meanwhile finds the count at zero. Whether it was counted.
pub fn thread_coming() -> bool {
    if !COUNTING.load(Relaxed) {
        return false;
    }
    THREADS.fetch_add(1, Relaxed);
    true
}

/// A thread counted by [`thread_coming`] was not made after all.
pub fn thread_not_made() {
    THREADS.fetch_sub(1, Relaxed);
}

/// First thing in a thread counted by [`thread_coming`]: its end will count it out.
pub fn thread_begins() {
    counts_this_thread();
}

/// Whether the program is known to have one thread: the one asking.
pub(crate) fn alone() -> bool {
    COUNTING.load(Relaxed) && THREADS.load(Relaxed) == 1
}

/// In a forked child: the thread that forked is its only one, and keeps its value under the
/// key (the child's copy of its thread-specific data).
pub(crate) fn forked() {
    THREADS.store(1, Relaxed);
}

fn counts_this_thread() {
    let key = KEY.load(Relaxed);
    if key == u32::MAX {
        return;
    }
    // Inside the guard: a key past glibc's first 32 keeps its value in a block `calloc`
    // makes, which is not the program's.
    let was_busy = crate::guard::set_busy(true);
    // SAFETY: a key made by `init`; the value is a non-null marker, never dereferenced.
    unsafe { libc::pthread_setspecific(key, core::ptr::dangling::<c_void>()) };
    crate::guard::set_busy(was_busy);
}

/// The destructor of the key's value, as a counted thread ends.
unsafe extern "C" fn counted_out(_: *mut c_void) {
    if THREADS.fetch_sub(1, AcqRel) == 1 {
        super::reporter::last_thread_leaves();
    }
}
