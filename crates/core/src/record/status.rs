//! Whether the tracer records, read on every call: the state of its life cycle (set by
//! `lifecycle`, `attached`), the calling thread's index in the thread table (registering it on
//! first use), and the statistics' counters. The leaf of `record` that the paths of a call
//! (`mod`, `steps`, `tagged`, `invalid`) and the life cycle share.

use crate::state::ThreadState;
use crate::store::threads;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};

pub(super) const UNINIT: u8 = 0;
pub(super) const INITIALISING: u8 = 1;
pub(super) const READY: u8 = 2;
pub(super) const DEGRADED: u8 = 3;
/// `mem-trace detach` stopped the tracer (`attached`): like `DEGRADED`, nothing is recorded or
/// held, until the next attach makes it `READY` again.
pub(super) const DETACHED: u8 = 4;
pub(super) static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// pthread key whose destructor tells us a thread exits (value: its thread index).
pub(super) static EXIT_KEY: AtomicU32 = AtomicU32::new(u32::MAX);
/// Frees seen, for statistics (`MEM_TRACE_STATS=1` only).
pub(super) static FREES: AtomicU64 = AtomicU64::new(0);
/// Captures recorded as a cut stack, for statistics (`MEM_TRACE_STATS=1` only).
pub(super) static CUT: AtomicU64 = AtomicU64::new(0);

/// Whether the tracer was ever started by an attach (read on the unknown-pointer path only).
pub(super) static ATTACHED: AtomicBool = AtomicBool::new(false);

/// Whether the tracer is ready, without initialising it (the free path: a block freed before
/// initialisation was never recorded). Still true once degraded: recorded blocks are forgotten
/// when freed.
#[inline(always)]
pub(super) fn is_ready() -> bool {
    STATE.load(Ordering::Acquire) >= READY
}

/// Whether the tracer stopped recording for want of memory (see the module documentation).
#[inline]
pub(crate) fn degraded() -> bool {
    STATE.load(Ordering::Relaxed) == DEGRADED
}

/// Whether new blocks go unrecorded and frees unheld for good or until the next attach:
/// degraded, or detached. A pointer the table does not know is then most likely a block
/// made meanwhile, and its free must free.
#[inline]
pub(crate) fn not_recording() -> bool {
    STATE.load(Ordering::Relaxed) >= DEGRADED
}

/// Whether this process's tracer was started by an attach rather than the preload.
#[inline]
pub(crate) fn attached() -> bool {
    ATTACHED.load(Ordering::Relaxed)
}

/// The calling thread's index in the thread table, registering it on first use.
#[inline(always)]
pub(super) fn thread_index(state: &ThreadState) -> u32 {
    match state.thread.index.get() {
        0 => register_thread(state),
        i => i,
    }
}

#[cold]
#[inline(never)]
fn register_thread(state: &ThreadState) -> u32 {
    let index = threads::register_current(&state.thread);
    let bounds = &state.capture.bounds;
    if !bounds.known() {
        // SAFETY: getpid and gettid have no preconditions.
        if unsafe { libc::gettid() == libc::getpid() } {
            bounds.set_main();
        } else {
            // A thread not started through the library's pthread_create (which sets bounds
            // first).
            bounds.set_from_pthread();
        }
    }
    crate::profile::roots::thread_registered(index, bounds);
    let key = EXIT_KEY.load(Ordering::Relaxed);
    if key != u32::MAX && index != 0 {
        // SAFETY: a key we created; the value is an integer, never dereferenced.
        unsafe { libc::pthread_setspecific(key, index as usize as *const c_void) };
    }
    index
}
