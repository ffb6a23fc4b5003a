//! What a hook does once the real allocator has answered: capture, intern, publish. Also the
//! tracer's life cycle (lazy initialisation, fork, thread exit, statistics at exit).
//!
//! Lifecycle: `UNINIT` → (first hooked call, or our ELF constructor, whichever comes first)
//! `INITIALISING` → `READY`. Calls that arrive while another thread initialises are served
//! untracked rather than made to wait; in practice the first call comes before any thread.

use crate::freed::{self, Freed};
use crate::guard::{self, Guard, ThreadState};
use crate::layout::{FLAG_INITIALISED, MEM_TRACE_HEADER};
use crate::table::{self, Block};
use crate::{arena, config, modules, quarantine, real, report, stacks, threads, unwind};
use core::ffi::c_void;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

const UNINIT: u8 = 0;
const INITIALISING: u8 = 1;
const READY: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// pthread key whose destructor tells us a thread exits (value: its thread index).
static EXIT_KEY: AtomicU32 = AtomicU32::new(u32::MAX);
/// Frees seen, for statistics (`MEM_TRACE_STATS=1` only).
static FREES: AtomicU64 = AtomicU64::new(0);

/// Whether the tracer is ready to record; initialises it on first call.
#[inline(always)]
pub fn ready() -> bool {
    STATE.load(Ordering::Acquire) == READY || init()
}

#[cold]
#[inline(never)]
fn init() -> bool {
    if STATE
        .compare_exchange(UNINIT, INITIALISING, Ordering::Acquire, Ordering::Acquire)
        .is_err()
    {
        return STATE.load(Ordering::Acquire) == READY;
    }
    config::load();
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: creates a key with a destructor that only touches our own state.
    if unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) } == 0 {
        EXIT_KEY.store(key, Ordering::Relaxed);
    }
    let mut flags = FLAG_INITIALISED;
    if config::FREE_STACKS.load(Ordering::Relaxed) {
        flags |= crate::layout::FLAG_FREE_STACKS;
    }
    MEM_TRACE_HEADER.flags.fetch_or(flags, Ordering::Relaxed);
    STATE.store(READY, Ordering::Release);
    true
}

/// What the free hook must do with a pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Hand it to glibc now.
    Release,
    /// Kept in quarantine; glibc gets it later.
    Held,
    /// A double or invalid free, reported; glibc must never see it (it would abort).
    Reject,
}

/// The operation that met an unknown pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Free,
    Realloc,
}

/// Records a block the real allocator just returned.
#[inline(always)]
pub fn allocated(g: &Guard, p: *mut c_void, size: usize) {
    if !p.is_null() && ready() {
        record(g.state(), p as u64, size as u64);
    }
}

/// Captures and interns the calling thread's stack (0 when capture is off or failed).
#[inline(always)]
fn stack_here(state: &ThreadState) -> u32 {
    if !config::UNWIND.load(Ordering::Relaxed) {
        return 0;
    }
    // A thread's first call registers it, which sets the stack bounds the capture reads in.
    thread_index(state);
    // SAFETY: the thread's frame buffer is used only here, and this never nests: it runs
    // inside a hook holding the guard, and nothing it calls allocates through a hook.
    let buf = unsafe { &mut *state.frames.get() };
    let max = config::FRAMES
        .load(Ordering::Relaxed)
        .min(unwind::MAX_FRAMES);
    let c = unwind::capture_interned(state, &mut buf[..max]);
    if c.id != 0 {
        return c.id;
    }
    let id = stacks::intern_cached(&state.intern_cache, &buf[..c.frames]);
    unwind::remember_id(state, id, max);
    id
}

fn record(state: &ThreadState, addr: u64, size: u64) {
    // The table line loads while the stack is walked.
    table::prefetch(addr, size);
    let stack = stack_here(state);
    record_with(state, addr, size, stack);
}

fn record_with(state: &ThreadState, addr: u64, size: u64, stack: u32) {
    let thread = thread_index(state);
    let seq = MEM_TRACE_HEADER.next_seq.fetch_add(1, Ordering::Relaxed);
    table::insert(Block {
        addr,
        size,
        thread,
        seq,
        stack,
    });
}

/// Forgets a block that is about to be freed or moved, returning what was recorded. Called
/// *before* the real `free`/`realloc`: once freed, another thread may get the same address
/// from `malloc` and record it, and forgetting afterwards would erase that new block.
#[inline(always)]
pub fn take(_g: &Guard, p: *mut c_void) -> Option<Block> {
    if p.is_null() || STATE.load(Ordering::Acquire) != READY {
        return None;
    }
    table::remove(p as u64)
}

/// The whole of `free` but the call into glibc: forget the block, remember who freed it, and
/// say whether glibc gets it now, later (quarantine), or never (a double or invalid free).
pub fn free(g: &Guard, p: *mut c_void) -> Disposition {
    if STATE.load(Ordering::Acquire) != READY {
        return Disposition::Release;
    }
    // The stack first, so that the table line (prefetched here) loads meanwhile; on a double
    // or invalid free, rare, it is captured for nothing.
    table::prefetch(p as u64, 0);
    let free_stack = free_stack_here(g.state());
    let Some(block) = take(g, p) else {
        return match unknown_pointer(g, p as u64, Op::Free) {
            true => Disposition::Release,
            false => Disposition::Reject,
        };
    };
    remember_free(g.state(), block, free_stack, false);
    let mut released = quarantine::released();
    if !quarantine::hold(g.state(), block.addr, block.size, &mut released) {
        return Disposition::Release;
    }
    for &a in released.addrs() {
        // SAFETY: a block the program freed and that we held back; nobody else owns it.
        unsafe { real::__libc_free(a as *mut c_void) };
    }
    Disposition::Held
}

/// Notes that `realloc(p, 0)` freed `block`.
pub fn freed_by_realloc(g: &Guard, block: Block) {
    let state = g.state();
    remember_free(state, block, free_stack_here(state), true);
}

/// Notes that `realloc` moved `old` to `q`, now `size` bytes: one capture serves as the old
/// block's free stack and the new block's allocation stack (same call).
/// (`old` was a recorded block, so the tracer is ready.)
pub fn moved(g: &Guard, old: Block, q: *mut c_void, size: usize) {
    let state = g.state();
    table::prefetch(q as u64, size as u64);
    let stack = stack_here(state);
    let free_stack = if config::FREE_STACKS.load(Ordering::Relaxed) {
        stack
    } else {
        0
    };
    remember_free(state, old, free_stack, true);
    record_with(state, q as u64, size as u64, stack);
}

/// The stack to remember a free by (0 when free stacks are off).
#[inline(always)]
fn free_stack_here(state: &ThreadState) -> u32 {
    if config::FREE_STACKS.load(Ordering::Relaxed) {
        stack_here(state)
    } else {
        0
    }
}

fn remember_free(state: &ThreadState, block: Block, free_stack: u32, by_realloc: bool) {
    // A shared counter costs a cache-line transfer per free between threads: count only
    // when the statistics line was asked for.
    if config::STATS.load(Ordering::Relaxed) {
        FREES.fetch_add(1, Ordering::Relaxed);
    }
    let free_thread = thread_index(state);
    freed::push(
        &state.history,
        &Freed {
            block,
            free_seq: MEM_TRACE_HEADER.next_seq.fetch_add(1, Ordering::Relaxed),
            free_stack,
            free_thread,
            by_realloc,
        },
    );
}

/// A pointer given to `free` or `realloc` that is not a live block start. Returns whether glibc
/// may see it: `false` for a double free (the block is in quarantine, or the history saw it
/// freed and nothing allocated it since) and for pointers glibc would abort on (inside a live
/// block, misaligned, on the stack, in code). Other pointers may be blocks made while the
/// tracer was not recording (inside its own calls), so they pass.
fn unknown_pointer(g: &Guard, addr: u64, op: Op) -> bool {
    let state = g.state();
    // A report names this thread and walks its stack, and the stack check below reads its
    // bounds: all set by registration, which a thread whose first allocator call is this one
    // has not had yet.
    thread_index(state);
    if quarantine::contains(addr) {
        report::double_free(state, addr, freed::newest_at(addr), op);
        return false;
    }
    let (inside, _) = table::find_containing(addr);
    let on_stack = (state.stack_lo.get()..state.stack_hi.get()).contains(&addr);
    let in_code = modules::snapshot().is_some_and(|m| m.find(addr).is_some());
    if inside.is_some() || addr % 16 != 0 || on_stack || in_code {
        let why = if let Some(b) = inside {
            report::Why::Inside(b)
        } else if on_stack {
            report::Why::Stack
        } else if in_code {
            report::Why::Code
        } else {
            report::Why::Misaligned
        };
        report::invalid_free(state, addr, why, op);
        return false;
    }
    // The history scan costs a pass over the ring: bound how often a program that frees many
    // untracked blocks pays it.
    if HISTORY_SCANS.fetch_sub(1, Ordering::Relaxed) > 0 {
        if let Some(f) = freed::newest_at(addr) {
            report::double_free(state, addr, Some(f), op);
            return false;
        }
    } else {
        HISTORY_SCANS.store(0, Ordering::Relaxed);
    }
    true
}

/// Whether `realloc` may pass `p` to glibc (see `unknown_pointer`); `p` is not a live block.
pub fn realloc_unknown(g: &Guard, p: *mut c_void) -> bool {
    STATE.load(Ordering::Acquire) != READY || unknown_pointer(g, p as u64, Op::Realloc)
}

static HISTORY_SCANS: core::sync::atomic::AtomicI64 = core::sync::atomic::AtomicI64::new(10_000);

/// Puts back a block that `realloc` failed to move (the old block is still valid).
pub fn restore(block: Block) {
    table::insert(block);
}

#[inline(always)]
fn thread_index(state: &ThreadState) -> u32 {
    match state.index.get() {
        0 => register_thread(state),
        i => i,
    }
}

#[cold]
#[inline(never)]
fn register_thread(state: &ThreadState) -> u32 {
    let index = threads::register_current();
    state.index.set(index);
    if state.stack_hi.get() == 0 {
        // SAFETY: getpid and gettid have no preconditions.
        if unsafe { libc::gettid() == libc::getpid() } {
            unwind::set_bounds_main(state);
        } else {
            // A thread not started through our pthread_create (which sets bounds first).
            unwind::set_bounds_from_pthread(state);
        }
    }
    let key = EXIT_KEY.load(Ordering::Relaxed);
    if key != u32::MAX && index != 0 {
        // SAFETY: a key we created; the value is an integer, never dereferenced.
        unsafe { libc::pthread_setspecific(key, index as usize as *const c_void) };
    }
    index
}

unsafe extern "C" fn on_thread_exit(value: *mut c_void) {
    let state = guard::current();
    state.exiting.set(true);
    unwind::drop_cache(state);
    quarantine::thread_exiting(state);
    threads::mark_exited(value as usize as u32);
}

/// Thread start-up work done outside any hook: the stack bounds the unwinder reads within.
pub fn thread_started() {
    let state = guard::current();
    if let Some(_g) = Guard::enter() {
        unwind::set_bounds_from_pthread(state);
    }
}

extern "C" fn fork_prepare() {
    // Lock order: everything a hook may hold, in the order hooks take them.
    modules_lock(true);
    quarantine::lock();
    stacks::lock_all();
    table::lock_all();
    arena::lock_all();
}

extern "C" fn fork_parent() {
    unlock_after_fork(None);
}

fn unlock_after_fork(child: Option<&ThreadState>) {
    arena::unlock_all();
    table::unlock_all();
    stacks::unlock_all();
    quarantine::unlock(child);
    modules_lock(false);
}

extern "C" fn fork_child() {
    unlock_after_fork(Some(guard::current()));
    // The child's only thread is a new kernel thread: give it its own record on next use.
    guard::current().index.set(0);
}

fn modules_lock(lock: bool) {
    // The module-set build lock is internal to `modules`; a rebuild allocates from the arena
    // and calls dl_iterate_phdr, so it must not straddle a fork either.
    modules::fork_lock(lock);
}

/// ELF constructor: initialise before `main` even if nothing allocated yet, and register the
/// fork handlers here rather than from inside a hook (pthread_atfork takes a glibc lock that
/// the first `malloc` may be called under).
pub extern "C" fn on_load() {
    ready();
    // SAFETY: handlers are plain functions of this library, which is never unloaded.
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
}

/// ELF destructor: the statistics line, when asked for.
pub extern "C" fn on_unload() {
    if !config::STATS.load(Ordering::Relaxed) {
        return;
    }
    let (live, _) = table::totals();
    // Every allocation and every free takes a sequence number.
    let events = MEM_TRACE_HEADER.next_seq.load(Ordering::Relaxed) - 1;
    let frees = FREES.load(Ordering::Relaxed);
    let mut out = crate::print::Out::stderr();
    let _ = core::fmt::write(
        &mut out,
        format_args!(
            "mem-trace: stats: live_blocks={} peak_live_blocks={} internal_bytes={} peak_internal_bytes={} table_bytes={} stacks={} allocs={} frees={} untracked={}\n",
            live,
            table::peak_live(),
            arena::MAPPED.load(Ordering::Relaxed),
            arena::PEAK_MAPPED.load(Ordering::Relaxed),
            table::slot_bytes(),
            stacks::count(),
            events - frees,
            frees,
            MEM_TRACE_HEADER.untracked.load(Ordering::Relaxed),
        ),
    );
}
