//! [`Traced`]: a `GlobalAlloc` that records the program's blocks in mem-trace's tables, for
//! Rust programs that bring their own allocator (jemalloc, mimalloc, ...) or are never run
//! under `LD_PRELOAD` (statically linked ones included).
//!
//! Three kinds of requests reach it:
//! - the program's: served by the inner allocator, then recorded exactly as the preload's
//!   hooks record a `malloc` (`mem_trace_core::record`), with no header in the block;
//! - the tracer's own (the unwinder's caches, symbolizing in `print_trace`, the profiler's
//!   reports), recognised by the reentrancy guard being held: served from the tracer's arena
//!   (and its lock-free scratch region while `print_trace` runs), never from the inner
//!   allocator, whose locks a thread stopped by gdb may hold. On `dealloc`, the arena knows its
//!   own pages (`arena::owns`);
//! - any, while the wrapper is starting on another thread: passed through unrecorded.
//!
//! Unlike the preload, freed blocks go back to the inner allocator at once: a `GlobalAlloc`
//! needs a block's layout to free it, which the quarantine does not keep. So there is no
//! quarantine and no recycling, and a use after free is seen by the freed-block history only.
//!
//! Stacks start at the program's call into the allocator. The wrapper is in the program's own
//! module, so its frames cannot be skipped by module as the preload's are: instead each
//! method, inlined into the `__rust_alloc` shim that `#[global_allocator]` generates, reads
//! the registers where it records (`record::start_here`), and the walk skips the frame at
//! that pc. The shim stays a function of its own even under fat LTO (checked by the jemalloc
//! fixture, built with it), so the next frame is the program's.
//!
//! Under `LD_PRELOAD=libmem_trace.so` the preload owns the process's tables: a
//! `Traced<System>` records nothing (`System` calls `malloc`, which the preload records; the
//! wrapper only tells it where the stack starts), and a `Traced` over another allocator hands
//! its records to the preload (`entries`). This program's own header then stays
//! uninitialised, and readers take the preload's (`MEM_TRACE_PRELOAD_HEADER`).

use crate::entries::{self, Entries, Start, Taken};
use core::alloc::{GlobalAlloc, Layout};
use core::any::TypeId;
use core::ffi::c_void;
use core::sync::atomic::{AtomicU8, Ordering};
use mem_trace_core::arena::{self, Arena};
use mem_trace_core::guard::Guard;
use mem_trace_core::record::{self, Disposition};
use std::alloc::System;

/// A global allocator that records every block of `A` in mem-trace's tables:
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: mem_trace::Traced<std::alloc::System> = mem_trace::Traced::new(std::alloc::System);
/// ```
pub struct Traced<A> {
    inner: A,
}

impl<A> Traced<A> {
    /// Wraps `inner`; usable in a `static`.
    pub const fn new(inner: A) -> Self {
        Self { inner }
    }
}

/// Not started yet.
const UNKNOWN: u8 = 0;
/// Another thread is starting it: pass through.
const STARTING: u8 = 1;
/// Recording into this program's own tables.
const OWN: u8 = 2;
/// The preload records the inner allocator's blocks itself (it is `System`).
const PRELOAD_SEES: u8 = 3;
/// Handing records to the preload's entries.
const FORWARD: u8 = 4;

static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// What to do with one request.
enum Route {
    /// The tracer's own: the arena.
    Tracer,
    /// The program's, recorded here.
    Own(Guard),
    /// The program's, recorded by the preload through its entries.
    Forward(&'static Entries),
    /// The program's, recorded by the preload's hooks when `System` calls `malloc`; the
    /// preload is told where their stacks start.
    Seen(&'static Entries),
    /// The program's, not recorded here.
    Plain,
}

fn route<A: 'static>() -> Route {
    let Some(g) = Guard::enter() else {
        return Route::Tracer;
    };
    let mode = match MODE.load(Ordering::Acquire) {
        UNKNOWN => start::<A>(),
        m => m,
    };
    // The two preload modes are chosen only once the entries were found.
    match (mode, entries::preload_if_known()) {
        (OWN, _) => Route::Own(g),
        (FORWARD, Some(e)) => Route::Forward(e),
        (PRELOAD_SEES, Some(e)) => Route::Seen(e),
        _ => Route::Plain,
    }
}

/// Decides, once, who records (see the module documentation), and starts this program's
/// tracer when it is the one. Runs inside the guard, so what starting allocates is the
/// tracer's.
#[cold]
#[inline(never)]
fn start<A: 'static>() -> u8 {
    if MODE
        .compare_exchange(UNKNOWN, STARTING, Ordering::Acquire, Ordering::Acquire)
        .is_err()
    {
        return MODE.load(Ordering::Acquire);
    }
    let mode = match entries::preload() {
        Some(_) if TypeId::of::<A>() == TypeId::of::<System>() => PRELOAD_SEES,
        Some(_) => FORWARD,
        None => {
            mem_trace_core::capture::modules::tracer_in_program();
            record::on_load();
            // SAFETY: registers a plain function of this crate, which is never unloaded.
            unsafe { libc::atexit(on_exit) };
            OWN
        }
    };
    MODE.store(mode, Ordering::Release);
    mode
}

extern "C" fn on_exit() {
    record::on_unload()
}

// SAFETY: every block is the inner allocator's or the arena's, each honouring the layout it
// was asked for; `dealloc` and `realloc` give a block back to the one that made it
// (`arena::owns`), and recording never touches a block's bytes.
unsafe impl<A: GlobalAlloc + 'static> GlobalAlloc for Traced<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match route::<A>() {
            // SAFETY: forwarded contract.
            Route::Tracer => unsafe { Arena.alloc(layout) },
            // SAFETY: forwarded contract.
            Route::Seen(e) => seen(e, || unsafe { self.inner.alloc(layout) }),
            route => {
                // SAFETY: forwarded contract.
                let p = unsafe { self.inner.alloc(layout) };
                allocated(route, p, layout.size());
                p
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match route::<A>() {
            // SAFETY: forwarded contract.
            Route::Tracer => unsafe { Arena.alloc_zeroed(layout) },
            // SAFETY: forwarded contract.
            Route::Seen(e) => seen(e, || unsafe { self.inner.alloc_zeroed(layout) }),
            route => {
                // SAFETY: forwarded contract.
                let p = unsafe { self.inner.alloc_zeroed(layout) };
                allocated(route, p, layout.size());
                p
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if arena::owns(p) {
            // SAFETY: an arena block, allocated by `Arena` with this layout.
            return unsafe { Arena.dealloc(p, layout) };
        }
        let release = match route::<A>() {
            Route::Own(g) => {
                let _start = record::start_here(&g);
                record::free_unheld(&g, p.cast()) != Disposition::Reject
            }
            // SAFETY: the preload's entry, with a block of the program.
            Route::Forward(e) => unsafe { (e.free)(p.cast(), Start::here()) },
            Route::Seen(e) => {
                // SAFETY: forwarded contract.
                return seen(e, || unsafe { self.inner.dealloc(p, layout) });
            }
            Route::Tracer | Route::Plain => true,
        };
        if release {
            // SAFETY: forwarded contract; the tracer no longer refers to the block.
            unsafe { self.inner.dealloc(p, layout) }
        }
    }

    #[inline]
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if arena::owns(p) {
            // SAFETY: an arena block, allocated by `Arena` with this layout.
            return unsafe { Arena.realloc(p, layout, new_size) };
        }
        match route::<A>() {
            Route::Own(g) => {
                let _start = record::start_here(&g);
                let old = record::take(&g, p.cast());
                // SAFETY: forwarded contract.
                let q = unsafe { self.inner.realloc(p, layout, new_size) };
                record::reallocated(&g, old, p.cast(), q.cast(), new_size);
                q
            }
            Route::Forward(e) => {
                let mut taken = Taken::default();
                // SAFETY: the preload's entry, writing into our `taken`.
                let had = unsafe { (e.take)(p.cast(), &mut taken) };
                // SAFETY: forwarded contract.
                let q = unsafe { self.inner.realloc(p, layout, new_size) };
                let old: *const Taken = if had { &taken } else { core::ptr::null() };
                // SAFETY: the preload's entry; `old` is null or what `take` wrote.
                unsafe { (e.reallocated)(old, p.cast(), q.cast(), new_size, Start::here()) };
                q
            }
            // SAFETY: forwarded contract.
            Route::Seen(e) => seen(e, || unsafe { self.inner.realloc(p, layout, new_size) }),
            // SAFETY: forwarded contract.
            Route::Tracer | Route::Plain => unsafe { self.inner.realloc(p, layout, new_size) },
        }
    }
}

/// Runs `f`, a call into `System` and so into the preload's hooks, with the stacks they
/// record starting here (where the wrapper is inlined), not in `__rust_alloc`.
#[inline(always)]
fn seen<R>(e: &Entries, f: impl FnOnce() -> R) -> R {
    let start = Start::here();
    // SAFETY: the preload's entry, with our own `Start`.
    unsafe { (e.start)(&start) };
    let r = f();
    // SAFETY: the preload's entry; null goes back to capturing where it is.
    unsafe { (e.start)(core::ptr::null()) };
    r
}

/// Records a block the inner allocator just returned.
#[inline(always)]
fn allocated(route: Route, p: *mut u8, size: usize) {
    match route {
        Route::Own(g) => {
            let _start = record::start_here(&g);
            record::allocated(&g, p.cast::<c_void>(), size)
        }
        Route::Forward(e) if !p.is_null() => {
            // SAFETY: the preload's entry, with a block the inner allocator just returned.
            unsafe { (e.allocated)(p.cast(), size, Start::here()) }
        }
        _ => {}
    }
}
