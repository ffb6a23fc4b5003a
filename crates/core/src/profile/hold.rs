//! An exiting process held for `mem-trace run --pprof` (`MEM_TRACE_HOLD_AT_EXIT=1`): after
//! its exit report, the process names itself on `run`'s FIFO, `DIR/mem-trace.exits`, and
//! waits on a FIFO of its own, `DIR/mem-trace.<pid>.held`, until `run` has read its tables
//! (as `mem-trace pprof PID` reads a live process) and writes a byte there, or 10 s pass.
//!
//! Why wait: once the process has gone, its tables have gone with it, and a profile with every
//! stack's four counts (what pprof and a profiling server take) is not in any report. Held at
//! the end of `exit`, the process has nothing left to do but the other destructors, and its
//! tables are final.
//!
//! Never a hang: `run`'s FIFO is opened without blocking (no reader, `ENXIO`: nobody to wait
//! for), and the wait has a deadline. Nothing here allocates.

use crate::config;
use crate::profile::output::PathBuf;
use core::fmt::Write;
use core::sync::atomic::Ordering::Relaxed;

/// How long an exiting process waits for `run` at most.
const WAIT_MS: i32 = 10_000;

/// Names this process to `run` and waits until it has been read, if asked to.
pub(crate) fn at_exit() {
    if !config::HOLD_AT_EXIT.load(Relaxed) {
        return;
    }
    let Some(dir) = config::OUT_DIR.get() else {
        return;
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut held = PathBuf::default();
    let mut exits = PathBuf::default();
    if write!(held, "{dir}/mem-trace.{pid}.held\0").is_err()
        || write!(exits, "{dir}/mem-trace.exits\0").is_err()
    {
        return;
    }
    // Ours first, so that `run`'s answer has somewhere to go. Opened read-write: the open
    // never blocks and the FIFO never reports a hang-up (we are a writer too).
    // SAFETY: NUL-terminated path; mkfifo only creates a node.
    if unsafe { libc::mkfifo(held.as_c(), 0o600) } != 0 {
        return;
    }
    // SAFETY: NUL-terminated path.
    let fd = unsafe {
        libc::open(
            held.as_c(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd >= 0 {
        if tell(&exits, pid) {
            wait(fd);
        }
        // SAFETY: closes the descriptor opened above.
        unsafe { libc::close(fd) };
    }
    // SAFETY: NUL-terminated path.
    unsafe { libc::unlink(held.as_c()) };
}

/// Writes `PID\n` to `run`'s FIFO; whether `run` was there to read it.
fn tell(exits: &PathBuf, pid: i32) -> bool {
    // SAFETY: NUL-terminated path; non-blocking, so no reader means ENXIO, not a wait.
    let fd = unsafe {
        libc::open(
            exits.as_c(),
            libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return false;
    }
    // Written with its NUL, which `as_str` leaves out.
    let mut line = PathBuf::default();
    let ok = write!(line, "{pid}\n\0").is_ok();
    let text = line.as_str();
    let n = match ok {
        // SAFETY: writes our own buffer; under PIPE_BUF, so the line arrives whole.
        true => unsafe { libc::write(fd, text.as_ptr().cast(), text.len()) },
        false => -1,
    };
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
    n == text.len() as isize
}

/// Waits for a byte on `fd`, at most [`WAIT_MS`].
fn wait(fd: i32) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of ours; a signal that interrupts the wait ends it early, which only
    // shortens the hold.
    unsafe { libc::poll(&mut p, 1, WAIT_MS) };
}
