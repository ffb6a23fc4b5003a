//! Where the memory goes: counters per interned stack, peaks global and per thread (kept in
//! every build), and the reports built from them (written only when asked for:
//! `MEM_TRACE_PROFILE=1`, or by default in the `profiler` build).
//!
//! Everything the hot path updates lives in the exported layout (docs/LAYOUT.md "Profile",
//! the header's live and peak words, the thread records' last five words), so that gdb and
//! the `mem-trace` command read the same numbers from a running process or a core file,
//! without calling in.
//!
//! - [`events`]: the sequence number and the global live bytes, moved together;
//! - [`counters`]: live, ever-allocated and at-peak bytes and blocks of each stack;
//! - [`peaks`]: the global and per-thread peaks, and the reset;
//!
//! and the reports, written in process (to stderr, or files under `MEM_TRACE_OUT`):
//!
//! - `rank`: every stack's counts summed, the top few by a key;
//! - `roots` and `leaks`: where the leak scan starts, and the scan that classifies live
//!   blocks as definitely lost, possibly lost or still reachable;
//! - `report`: the text of a report (periodic, snapshot, at exit);
//! - `output`: where a report goes;
//! - `deferred`: under `mem-trace run`, the head of an exit or final report whose frames `run`
//!   symbolizes after the program has ended (return addresses only are written in process);
//! - `svg`: a report's flame graph, drawn by the `mem-trace` binary beside the library from the
//!   report's folded stacks (`X.folded` beside `X.txt`);
//! - `pprof`: the process's pprof profile beside a report (`X.pb.gz`), written by that binary
//!   reading the process (without `mem-trace run`);
//! - `unseen`: that binary run in a child the program cannot see;
//! - `reporter`: the profiler thread that writes the periodic and snapshot reports;
//! - `last_thread`: the program's threads counted, so that the profiler thread leaves with
//!   the last of them;
//! - `signal`: the snapshot signal's handler, which only wakes that thread;
//! - `requests`: the shared file through which `mem-trace run` asks for a final report;
//! - `gate`: `MEM_TRACE_ERROR_EXITCODE`, the exit status of a process that failed.
//!
//! The exit report (with the leak check) is written by the library's ELF destructor, in the
//! thread that calls `exit`; a program that ends with `_exit` or by a signal gets none (under
//! `mem-trace run`, told to stop, it gets a final report first). Under `mem-trace run` it costs
//! the process the ranking, the leak scan and writing return addresses, about a millisecond
//! for a small program; symbolizing (tens of milliseconds of debug information) is `run`'s.

pub mod counters;
mod deferred;
mod events;
mod exit;
mod gate;
mod hold;
pub mod last_thread;
mod leaks;
mod output;
pub mod peaks;
mod pprof;
mod python;
mod rank;
mod report;
mod reporter;
mod requests;
pub(crate) mod roots;
mod signal;
mod svg;
mod unseen;
mod wake;
pub(crate) mod world;

use crate::state::ThreadState;
pub use exit::{exit_begins, program_starts};
use mem_trace_format::Block;

/// Takes the sequence number of an event that changes the live bytes by `delta` (wrapping:
/// a free passes the negated size); returns it with the live bytes after the change.
#[inline(always)]
pub(crate) fn tick(delta: u64) -> (u64, u64) {
    events::tick(delta)
}

/// Live blocks now and at the global peak, from the stacks' counters (see `rank::blocks`).
pub(crate) fn blocks() -> Option<(u64, u64)> {
    rank::blocks()
}

/// Undoes the live bytes of a [`tick`] whose block could not be recorded, or that of a block
/// that left the table without a free event (`realloc` in place).
pub(crate) fn untick(size: u64) {
    crate::store::header::header()
        .live_bytes
        .fetch_sub(size, core::sync::atomic::Ordering::Relaxed);
}

/// Start-up work.
pub(crate) fn init() {
    events::init();
    peaks::init();
}

/// From the library's constructor, once initialised: the root information the leak scan
/// needs, and the profiler thread if it has work.
pub(crate) fn started() {
    roots::init();
    python::check();
    crate::sync::find_single_threaded();
    last_thread::init();
    reporter::start();
}

/// In a forked child: the roots of the one thread left, and the thread when there is a need
/// for it (`reporter::forked`).
pub(crate) fn forked() {
    roots::forked();
    requests::forked();
    last_thread::forked();
    reporter::forked();
}

/// Before a fork: the profiler thread is joined if the program is a CPython with no other
/// thread (`reporter::before_fork`).
pub(crate) fn before_fork() {
    if python::is_cpython() && last_thread::alone() {
        reporter::before_fork();
    }
}

/// In the parent, after a fork: when the profiler thread was joined for it, it is made again
/// a little later.
pub(crate) fn after_fork_in_parent() {
    reporter::after_fork_in_parent();
}

/// Runs `change`, a call that changes the process's credentials (`setuid`, `setgroups` and
/// the rest, which glibc repeats in every thread and aborts on if any one fails), with no
/// thread of the tracer's in the process: the profiler thread stops first and is made again
/// after, from the calling thread.
pub fn changing_credentials<T>(change: impl FnOnce() -> T) -> T {
    reporter::without_thread(change)
}

/// Runs `call`, one the kernel refuses to a process with more than one thread (`unshare`
/// and `setns` into a user namespace) or that should find the process as the program left
/// it (`clone` into new namespaces), with no thread of the tracer's: joined first, made again
/// after from the calling thread, in its new namespaces.
pub fn single_threaded<T>(call: impl FnOnce() -> T) -> T {
    reporter::without_thread(call)
}

/// From the library's destructor, in the thread that called `exit`: the exit report with the
/// leak check (`MEM_TRACE_LEAKS`). `degraded` says whether the tracer ran out of memory
/// (`record`'s state, which this module does not import), asked once the reporter stopped.
pub(crate) fn exiting(degraded: fn() -> bool) {
    use core::sync::atomic::Ordering::Relaxed;
    if !crate::config::LEAKS.load(Relaxed) {
        reporter::wait_no_more();
        requests::done();
        gate::at_exit();
        return;
    }
    reporter::stop();
    if degraded() && !room_for_the_report() {
        crate::out::note(NO_ROOM_NOTE);
    } else {
        full_report(report::Kind::Exit, None);
    }
    hold::at_exit();
    // The process ended by `exit`: `mem-trace run` counts it as such.
    requests::done();
    gate::at_exit();
}

/// The line written instead of the exit report when there is no memory for it.
const NO_ROOM_NOTE: &[u8] = b"mem-trace: no exit report: the tracer ran out of memory during the run and there is still no room to symbolize and sort the stacks\n";

/// Address space the exit report may take (the symbolizer maps debug files and parses them;
/// a large program's take tens of MiB).
const REPORT_ROOM: usize = 64 << 20;

/// Whether [`REPORT_ROOM`] can be mapped now, for a tracer that ran out of memory: the
/// report allocates through Rust's global allocator, which aborts when it cannot, and the
/// program's exit status must stay its own. (A probe, not a reservation: what the report
/// needs is only known as it goes.)
fn room_for_the_report() -> bool {
    // SAFETY: a fresh private anonymous mapping, unmapped at once; nothing else refers to it.
    unsafe {
        let p = libc::mmap(
            core::ptr::null_mut(),
            REPORT_ROOM,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return false;
        }
        libc::munmap(p, REPORT_ROOM);
    }
    true
}

/// A full report, with the leak check, written now to the descriptor `fd` (not closed), for a
/// program that asks for one (`mem_trace::report`). Waits up to a second for the right to
/// symbolize (a report or `print_trace` in progress), then writes frames raw.
pub fn report_to(fd: i32) {
    full_report(
        report::Kind::Requested,
        Some(crate::out::Out::borrowing(fd)),
    );
}

/// The program made a thread whose control block is `tcb` (its `pthread_t`): its dynamic
/// thread vector is a root of the leak check (`roots::thread_created`).
pub fn thread_created(tcb: u64) {
    roots::thread_created(tcb);
    reporter::program_made_a_thread();
}

/// A full report from a program thread, whose stack the leak scan reads from the caller's
/// frame up, or at exit from where the program's stack ended ([`exit_begins`],
/// [`program_starts`]).
#[inline(never)]
fn full_report(kind: report::Kind, to: Option<crate::out::Out>) {
    // The scan reads this thread's stack from here up: the frames of the caller and of the
    // program, not the scan's own (below this one, and full of block addresses).
    let marker = 0u64;
    let mut sp = core::hint::black_box(&marker) as *const u64 as u64;
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    // Only this thread's, and above this frame: a stack pointer noted by another thread, or
    // one this thread has since returned above (an exit that did not happen), is no bound.
    if matches!(kind, report::Kind::Exit) {
        sp = exit::scan_from(sp, me);
    }
    let was_busy = crate::guard::set_busy(true);
    let printing = reporter::printing_within_a_second();
    report::write(kind, Some(sp), printing.as_ref(), to);
    drop(printing);
    crate::guard::set_busy(was_busy);
}

/// Counts a block just recorded (its [`tick`] gave `live`, the global live bytes after it):
/// its stack's counters, its thread's live bytes, and the peaks; `counted` is the bytes and
/// blocks it stands for (itself, or a sample's weight).
#[inline(always)]
pub(crate) fn allocated(state: &ThreadState, block: &Block, counted: (u64, u64), live: u64) {
    peaks::global(live, block.seq);
    counters::add(
        &state.profile,
        &state.thread,
        block.stack,
        counted,
        block.seq,
        true,
    );
    peaks::add(&state.thread, counted.0, true);
    if reporter::waits_for_allocation(block.seq) {
        reporter::made_on_need();
    }
}

/// Counts a block put back after a failed `realloc`: live again, but not a new allocation
/// (the global count never dropped: see [`forgotten`]).
pub(crate) fn restored(state: &ThreadState, block: &Block, counted: (u64, u64)) {
    counters::add(
        &state.profile,
        &state.thread,
        block.stack,
        counted,
        events::now_seq(),
        false,
    );
    peaks::add(&state.thread, counted.0, false);
}

/// Uncounts a block just taken out of the table (freed, or about to be moved by `realloc`)
/// from its stack and its thread. The global count moves with the free's own [`tick`].
#[inline(always)]
pub(crate) fn forgotten(state: &ThreadState, block: &Block, counted: (u64, u64)) {
    counters::sub(
        &state.profile,
        &state.thread,
        block.stack,
        counted,
        events::now_seq(),
    );
    peaks::sub(&state.thread, counted.0, block.thread);
}
