//! What the tracer keeps per thread, assembled from the part each module owns.
//!
//! The state is a `const`-initialised thread-local without a destructor: accessing it never
//! allocates and never registers a TLS destructor (which would call `calloc` through
//! `__cxa_thread_atexit_impl`), so it is usable from the first `malloc` of a thread to its
//! last one, even while the thread is being torn down.

use crate::capture;
use crate::store::{freed, quarantine, stacks, threads};
use core::cell::Cell;

/// The per-thread state: one field per module that keeps something per thread.
pub(crate) struct ThreadState {
    /// Whether the thread is inside the tracer (see `guard`).
    pub(crate) busy: Cell<bool>,
    /// The stack pointer where the thread last entered the tracer (see `guard`).
    pub(crate) entry_sp: Cell<usize>,
    /// Whether the thread is inside glibc's allocator, called by the tracer (see `guard`).
    pub(crate) in_glibc: Cell<bool>,
    /// Whether a signal handler left the tracer for good with `siglongjmp` (see `guard`).
    pub(crate) left: Cell<bool>,
    /// Whether glibc's allocations inside the tracer's calls come from the arena
    /// (`record::nested`).
    pub(crate) nested_from_arena: Cell<bool>,
    /// The thread's index in the thread table.
    pub thread: threads::Local,
    /// Stack bounds, unwinder state and the frame buffer.
    pub capture: capture::Local,
    /// Recently interned stacks.
    pub stacks: stacks::Local,
    /// Records of the freed-block history this thread has claimed.
    pub history: freed::Claim,
    /// This thread's quarantine.
    pub quarantine: quarantine::Local,
    /// Bytes to this thread's next sampled allocation (`MEM_TRACE_SAMPLE`).
    pub(crate) sample: crate::sample::Local,
    /// This thread's cache of per-stack counter deltas.
    pub profile: crate::profile::counters::Local,
}

impl ThreadState {
    const fn new() -> Self {
        Self {
            busy: Cell::new(false),
            entry_sp: Cell::new(0),
            in_glibc: Cell::new(false),
            left: Cell::new(false),
            nested_from_arena: Cell::new(false),
            thread: threads::Local::new(),
            capture: capture::Local::new(),
            stacks: stacks::Local::new(),
            history: freed::Claim::new(),
            quarantine: quarantine::Local::new(),
            sample: crate::sample::Local::new(),
            profile: crate::profile::counters::Local::new(),
        }
    }
}

thread_local! {
    static STATE: ThreadState = const { ThreadState::new() };
}

/// The current thread's state. The reference stays valid for the thread's whole life: the
/// thread-local has no destructor, so its storage lives as long as the thread.
#[inline(always)]
pub(crate) fn current() -> &'static ThreadState {
    // SAFETY: see above; the reference never leaves this thread because ThreadState is !Sync.
    STATE.with(|s| unsafe { &*(s as *const ThreadState) })
}
