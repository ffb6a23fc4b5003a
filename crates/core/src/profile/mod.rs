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
//! - `svg`: a report's flame graph, drawn by the `mem-trace` binary beside the library from the
//!   report's folded stacks (`X.folded` beside `X.txt`), in a child the program cannot see;
//! - `reporter`: the profiler thread that writes the periodic and snapshot reports;
//! - `signal`: the snapshot signal's handler, which only wakes that thread.
//!
//! The exit report (with the leak check) is written by the library's ELF destructor, in the
//! thread that calls `exit`; a program that ends with `_exit` or by a signal gets none.

pub mod counters;
mod events;
mod leaks;
mod output;
pub mod peaks;
mod rank;
mod report;
mod reporter;
pub(crate) mod roots;
mod signal;
mod svg;

use crate::state::ThreadState;
use mem_trace_format::Block;

/// Takes the sequence number of an event that changes the live bytes by `delta` (wrapping:
/// a free passes the negated size); returns it with the live bytes after the change.
#[inline(always)]
pub(crate) fn tick(delta: u64) -> (u64, u64) {
    events::tick(delta)
}

/// Undoes the live bytes of a [`tick`] whose block could not be recorded, or that of a block
/// that left the table without a free event (`realloc` in place).
pub(crate) fn untick(size: u64) {
    crate::store::header::header()
        .live_bytes
        .fetch_sub(size, core::sync::atomic::Ordering::Relaxed);
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock reports measure time with.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the current time into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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
    reporter::start();
}

/// In a forked child: the thread again, and the roots of the one thread left.
pub(crate) fn forked() {
    roots::forked();
    reporter::forked();
}

/// Runs `change`, a call that changes the process's credentials (`setuid`, `setgroups` and
/// the rest, which glibc repeats in every thread and aborts on if any one fails), with no
/// thread of the tracer's in the process: the profiler thread stops first and is made again
/// after, from the calling thread.
pub fn changing_credentials<T>(change: impl FnOnce() -> T) -> T {
    reporter::without_thread(change)
}

/// From the library's destructor, in the thread that called `exit`: the exit report with the
/// leak check (`MEM_TRACE_LEAKS`).
pub(crate) fn exiting() {
    use core::sync::atomic::Ordering::Relaxed;
    if !crate::config::LEAKS.load(Relaxed) {
        return;
    }
    reporter::stop();
    if crate::record::degraded() && !room_for_the_report() {
        crate::out::note(NO_ROOM_NOTE);
        return;
    }
    full_report(report::Kind::Exit, None);
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

/// A full report from a program thread, whose stack the leak scan reads from the caller's
/// frame up.
#[inline(never)]
fn full_report(kind: report::Kind, to: Option<crate::out::Out>) {
    // The scan reads this thread's stack from here up: the frames of the caller and of the
    // program, not the scan's own (below this one, and full of block addresses).
    let marker = 0u64;
    let sp = core::hint::black_box(&marker) as *const u64 as u64;
    let was_busy = crate::guard::set_busy(true);
    let printing = reporter::printing_within_a_second();
    report::write(kind, Some(sp), printing.as_ref(), to);
    drop(printing);
    crate::guard::set_busy(was_busy);
}

/// Counts a block just recorded (its [`tick`] gave `live`, the global live bytes after it):
/// its stack's counters, its thread's live bytes, and the peaks.
#[inline(always)]
pub(crate) fn allocated(state: &ThreadState, block: &Block, live: u64) {
    peaks::global(live, block.seq);
    counters::add(state, block.stack, block.size, block.seq, true);
    peaks::add(state, block.size, true);
}

/// Counts a block put back after a failed `realloc`: live again, but not a new allocation
/// (the global count never dropped: see [`forgotten`]).
pub(crate) fn restored(state: &ThreadState, block: &Block) {
    counters::add(state, block.stack, block.size, events::now_seq(), false);
    peaks::add(state, block.size, false);
}

/// Uncounts a block just taken out of the table (freed, or about to be moved by `realloc`)
/// from its stack and its thread. The global count moves with the free's own [`tick`].
#[inline(always)]
pub(crate) fn forgotten(state: &ThreadState, block: &Block) {
    counters::sub(state, block.stack, block.size, events::now_seq());
    peaks::sub(state, block.size, block.thread);
}
