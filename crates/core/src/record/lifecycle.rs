//! The tracer's life cycle: lazy initialisation, threads arriving and leaving, `fork`, and the
//! statistics line at exit.
//!
//! Lifecycle: `UNINIT` → (first hooked call, or the library's ELF constructor, whichever comes
//! first) `INITIALISING` → `READY` → (the tracer's own memory ran out) `DEGRADED`. Calls that
//! arrive while another thread initialises are served untracked rather than made to wait; in
//! practice the first call comes before any thread.
//!
//! `DEGRADED` is for good: the arena could not map memory (under `ulimit -v`, or the kernel
//! refusing), so every store that grows may fail from then on, and the unwinder's allocations
//! live on the arena's small reserve. Rather than fail piecemeal, the tracer stops taking
//! memory: new blocks are not recorded (counted in the header's `untracked`), stacks are not
//! captured, frees are not held in quarantine. Blocks already recorded are still forgotten
//! when freed, so the table never claims a freed block is live. The program's calls keep
//! glibc's semantics throughout; stderr gets one line saying so ([`degrade`]).

use super::status::{
    degraded, CUT, DEGRADED, DETACHED, EXIT_KEY, FREES, INITIALISING, READY, STATE, UNINIT,
};
use crate::capture::{self, modules};
use crate::guard::Guard;
use crate::out::Out;
use crate::state::{self, ThreadState};
use crate::store::header::header;
use crate::store::{freed, quarantine, stacks, table, tags, threads};
use crate::{arena, config};
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, Ordering};
use mem_trace_format::{FLAG_FREE_STACKS, FLAG_INITIALISED, FLAG_PROFILE_MODE, SEQ_TAG_SIZE};

/// Whether the tracer is ready to record; initialises it on first call.
#[inline(always)]
pub(super) fn ready() -> bool {
    STATE.load(Ordering::Acquire) == READY || init()
}

/// Detaches a ready tracer (see `attached`): true if it was ready.
pub(super) fn stop_recording() -> bool {
    let stopped = STATE
        .compare_exchange(READY, DETACHED, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok();
    if stopped {
        stop_taking_memory();
    }
    stopped
}

/// Resumes a detached tracer with `settings` put back (what [`stop_recording`] turned off):
/// true if it was detached.
pub(super) fn resume_recording(settings: impl FnOnce()) -> bool {
    if STATE.load(Ordering::Acquire) != DETACHED {
        return false;
    }
    settings();
    STATE
        .compare_exchange(DETACHED, READY, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
}

/// Initialises the tracer if nothing did yet (the attach's first call): true once ready.
pub(super) fn start() -> bool {
    ready()
}

/// The one line [`degrade`] writes.
const DEGRADED_NOTE: &[u8] = b"mem-trace: out of memory for the tracer's own tables: from now on new blocks are not recorded (counted as untracked), stacks are not captured and freed blocks are not held in quarantine\n";

/// The arena could not map memory (called by it, once, from inside the failing allocation:
/// so this neither allocates nor locks): stop recording, capturing and holding, and say so.
fn degrade() {
    if STATE.swap(DEGRADED, Ordering::AcqRel) == DEGRADED {
        return;
    }
    stop_taking_memory();
    crate::out::note(DEGRADED_NOTE);
}

/// What degraded means for the paths that still run: frees capture no stack (the unwinder
/// allocates) and are not held (the quarantine's queue grows).
fn stop_taking_memory() {
    config::UNWIND.store(false, Ordering::Relaxed);
    config::FREE_STACKS.store(false, Ordering::Relaxed);
    quarantine::stop();
    // A batch waits for a hold that will not come: frees go back at once. (Batches already
    // open go at their thread's next allocation, `give_back` or exit.)
    super::deferred::configure(false);
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
    // First: every hook reads the thread's state, and this makes that cheaper.
    let offset = crate::state::learn_static_offset();
    // Before anything is recorded, and before the program can lower its limits.
    arena::when_short(degrade);
    arena::keep_reserve();
    // Before the first note (a bad variable's), and before the program can close fd 2.
    crate::out::remember_stderr();
    let c = config::load();
    crate::sample::configure(c.sample, c.sample_seed);
    crate::profile::init();
    freed::configure(c.freed, c.free_stacks);
    stacks::configure(c.max_stacks);
    stacks::when_capped(capped);
    quarantine::configure(c.quarantine);
    // Not in a process attached to, whose blocks from before have no tag and whose hooks
    // must pass frees straight through once detached; nor for a `Traced` wrapper in the
    // program, or a program allocating with another library than glibc: the tags' layout,
    // and the leak check's search for tagged blocks, are glibc's chunks'.
    tags::configure(
        c.tags_apply()
            && !config::attached()
            && !modules::tracer_in_program_set()
            && crate::real::is_glibc(),
        c.tags_carry_seq(),
    );
    super::tagged::configure(c.freed != 0 || c.free_stacks || c.quarantine != 0);
    super::deferred::configure(
        tags::bytes() == SEQ_TAG_SIZE && c.freed != 0 && c.quarantine >= quarantine::MIN_SHARE,
    );
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: creates a key with a destructor that only touches our own state.
    if unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) } == 0 {
        EXIT_KEY.store(key, Ordering::Relaxed);
    }
    let mut flags = FLAG_INITIALISED;
    if c.free_stacks {
        flags |= FLAG_FREE_STACKS;
    }
    if c.mode == config::Mode::Profile {
        flags |= FLAG_PROFILE_MODE;
    }
    header().flags.fetch_or(flags, Ordering::Relaxed);
    // Not over `DEGRADED`, should memory have run out while initialising: the settings just
    // loaded then give way again.
    let ready = STATE
        .compare_exchange(INITIALISING, READY, Ordering::Release, Ordering::Relaxed)
        .is_ok();
    if !ready {
        stop_taking_memory();
    }
    crate::sample::open_pass(offset);
    ready
}

/// The stack store reached `MEM_TRACE_MAX_STACKS` (called once, with no lock held): the call
/// tree stops growing with it, since its nodes would name stacks that are no longer stored,
/// and stderr says what happens from now on.
fn capped() {
    capture::stop_naming();
    let _ = core::fmt::write(
        &mut Out::stderr(),
        format_args!(
            "mem-trace: MEM_TRACE_MAX_STACKS={} distinct stacks reached: new stacks keep only their innermost frame\n",
            stacks::cap()
        ),
    );
}

unsafe extern "C" fn on_thread_exit(value: *mut c_void) {
    let state = state::current();
    capture::drop_cache(&state.capture);
    super::deferred::thread_exiting(state);
    super::racing::thread_exiting(&state.freeing);
    quarantine::thread_exiting(&state.quarantine);
    crate::profile::counters::thread_exiting(&state.profile, state.thread.record());
    crate::profile::roots::thread_exited(value as usize as u32);
    threads::mark_exited(value as usize as u32);
}

/// Thread start-up work done outside any hook: the stack bounds the unwinder reads within.
/// Called first thing on a thread the program creates.
pub fn thread_started() {
    let state = state::current();
    if let Some(_g) = Guard::enter() {
        // `pthread_getattr_np` allocates: from the arena, or glibc would give the thread a
        // malloc arena that the program's code may never need (see `nested`).
        let _arena = super::nested::from_arena();
        state.capture.bounds.set_from_pthread();
    }
}

/// Whether the forking thread was busy before [`fork_prepare`] made it so (forks run their
/// handlers one at a time: glibc holds its atfork lock from the first prepare handler to the
/// last parent or child handler).
static BUSY_BEFORE_FORK: AtomicBool = AtomicBool::new(false);

extern "C" fn fork_prepare() {
    // The forking thread passes straight to glibc until the parent or child handler: prepare
    // handlers run last-registered first, so in an attached process (ours registered after
    // the program's) the program's own prepare handlers run after this one, with every lock
    // below held, and a hook recording their allocations would wait on them for ever (seen:
    // a program whose prepare handler calls malloc spun in the module-set lock). Under the
    // preload ours run last and nothing allocates in between.
    BUSY_BEFORE_FORK.store(crate::guard::set_busy(true), Ordering::Relaxed);
    // Before the locks: the profiler thread, joined here if the program forks alone, may
    // hold them.
    crate::profile::before_fork();
    // Lock order: everything a hook may hold, in the order hooks take them. The module-set
    // build lock comes first: a rebuild allocates from the arena and calls dl_iterate_phdr,
    // so it must not straddle a fork either.
    modules::fork_lock(true);
    quarantine::lock();
    capture::lock_all();
    stacks::lock_all();
    table::lock_all();
    arena::lock_all();
}

extern "C" fn fork_parent() {
    unlock_after_fork(None);
    crate::profile::after_fork_in_parent();
}

fn unlock_after_fork(child: Option<&ThreadState>) {
    arena::unlock_all();
    table::unlock_all();
    stacks::unlock_all();
    capture::unlock_all();
    quarantine::unlock(child.map(|s| &s.quarantine));
    modules::fork_lock(false);
    crate::guard::set_busy(BUSY_BEFORE_FORK.load(Ordering::Relaxed));
}

extern "C" fn fork_child() {
    let state = state::current();
    unlock_after_fork(Some(state));
    super::racing::forked(&state.freeing);
    // The child's only thread is a new kernel thread: give it its own record on next use.
    state.thread.forget();
    crate::profile::forked();
}

/// For the library's ELF constructor: initialise before `main` even if nothing allocated yet,
/// and register the fork handlers here rather than from inside a hook (pthread_atfork takes a
/// glibc lock that the first `malloc` may be called under).
pub fn on_load() {
    ready();
    after_start();
}

/// What follows initialisation at load, or at the first attach: the fork handlers and the
/// profiler's start.
pub(super) fn after_start() {
    // SAFETY: handlers are plain functions of this library, which is never unloaded.
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    // Inside the guard: what the loader and glibc allocate for the profiler's start (dlsym,
    // the thread) is not the program's.
    let was_busy = crate::guard::set_busy(true);
    crate::profile::started();
    crate::guard::set_busy(was_busy);
}

/// For the library's ELF destructor: the profiler's exit report, and the statistics line,
/// when asked for.
pub fn on_unload() {
    crate::profile::exiting(degraded);
    super::steps::report_check();
    if !config::STATS.load(Ordering::Relaxed) {
        return;
    }
    let (mut live, _) = table::totals();
    let mut peak_live = table::peak_live();
    // Tagged blocks are in no table: the stacks' counters count every block, the peak's as
    // at the peak of live bytes. Their records are 16 bytes each in glibc's heap.
    let mut tag_bytes = 0;
    if tags::key() != 0 {
        if let Some((now, peak)) = crate::profile::blocks() {
            tag_bytes = tags::bytes() * peak.saturating_sub(peak_live);
            (live, peak_live) = (now, peak.max(peak_live));
        }
    }
    let h = header();
    // Every allocation and every free takes a sequence number.
    let events = h.next_seq.load(Ordering::Relaxed) - 1;
    let frees = FREES.load(Ordering::Relaxed);
    let mut out = Out::stderr();
    let _ = core::fmt::write(
        &mut out,
        format_args!(
            "mem-trace: stats: live_blocks={} peak_live_blocks={} internal_bytes={} peak_internal_bytes={} internal_bytes_at_peak={} table_bytes={} tag_bytes={} stacks={} cut_captures={} call_nodes={} allocs={} frees={} untracked={} symbolized_frames={}\n",
            live,
            peak_live,
            arena::MAPPED.load(Ordering::Relaxed),
            arena::PEAK_MAPPED.load(Ordering::Relaxed),
            arena::MAPPED_AT_PEAK.load(Ordering::Relaxed),
            table::slot_bytes(),
            tag_bytes,
            stacks::count(),
            CUT.load(Ordering::Relaxed),
            capture::tree_nodes(),
            events - frees,
            frees,
            h.untracked.load(Ordering::Relaxed),
            crate::report::frames::SYMBOLIZED.load(Ordering::Relaxed),
        ),
    );
}
