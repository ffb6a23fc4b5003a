//! Report requests from `mem-trace run` (`MEM_TRACE_REQUESTS=1`): each traced process listens
//! on a FIFO of its own in the report directory, `DIR/mem-trace.<pid>.request`, which the
//! profiler thread polls beside the snapshot signal's eventfd.
//!
//! `run`, told to stop (SIGTERM, SIGINT), writes a byte to every FIFO there, which asks each
//! process for its final report: a full report with the leak check, written by the profiler
//! thread (a normal thread: the program may be anywhere, inside `malloc` too, and nothing runs
//! in a signal handler). The process removes its FIFO when that report is written, and at
//! exit once its exit report is: `run` waits for the FIFOs to go, briefly, before it passes
//! the signal on, and a FIFO left behind names a process that ended with no exit report
//! (killed, or `_exit`).
//!
//! No signal is sent for it: a signal's disposition is the program's, and one it handles, or
//! whose default is to die, would change what it does. The FIFO is opened read-write, so that
//! it never reports a hang-up (there is always a writer: us) and `run`'s non-blocking open for
//! writing fails (`ENXIO`) only once the process has gone. A forked child listens on its own
//! (the inherited descriptor is the parent's); an `exec`'d program reopens the one of its pid.

use crate::config;
use crate::out::Out;
use crate::profile::output::PathBuf;
use core::fmt::Write;
use core::sync::atomic::{AtomicI32, Ordering::Relaxed};

/// The FIFO's descriptor (-1: none, or the program closed it).
static FD: AtomicI32 = AtomicI32::new(-1);

/// The FIFO's path for this process.
fn path() -> Option<PathBuf> {
    let dir = config::OUT_DIR.get()?;
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut p = PathBuf::default();
    write!(p, "{dir}/mem-trace.{pid}.request\0").ok()?;
    Some(p)
}

/// Whether requests are on (`MEM_TRACE_REQUESTS` with `MEM_TRACE_OUT`).
pub(crate) fn enabled() -> bool {
    config::REQUESTS.load(Relaxed)
}

/// Makes and opens this process's FIFO, if requests are on; whether it listens.
pub(crate) fn open() -> bool {
    if !enabled() {
        return false;
    }
    let Some(path) = path() else {
        return false;
    };
    // SAFETY: `path` is NUL-terminated; mkfifo only creates a node.
    if unsafe { libc::mkfifo(path.as_c(), 0o600) } != 0
        && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
    {
        return said_not(&path);
    }
    // An existing name is reopened only if it is a FIFO of ours (this pid's before an `exec`),
    // never through a symlink.
    // SAFETY: an all-zero stat is a valid output buffer; lstat reads a NUL-terminated path.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let ours = unsafe { libc::lstat(path.as_c(), &mut st) } == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFIFO
        // SAFETY: geteuid has no preconditions.
        && st.st_uid == unsafe { libc::geteuid() };
    if !ours {
        return said_not(&path);
    }
    // SAFETY: opens a NUL-terminated path; O_NONBLOCK: a read never waits.
    let fd = unsafe {
        libc::open(
            path.as_c(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return said_not(&path);
    }
    FD.store(fd, Relaxed);
    true
}

fn said_not(path: &PathBuf) -> bool {
    let _ = writeln!(
        Out::stderr(),
        "mem-trace: no final report on request: cannot make {}: {}",
        path.as_str(),
        std::io::Error::last_os_error()
    );
    false
}

/// The descriptor to poll (-1: none).
pub(crate) fn fd() -> i32 {
    FD.load(Relaxed)
}

/// The descriptor was found closed (the program closed every descriptor): no more requests.
pub(crate) fn lost() {
    FD.store(-1, Relaxed);
}

/// Takes what was written to the FIFO; whether a request came.
pub(crate) fn take() -> bool {
    let fd = fd();
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 64];
    let mut any = false;
    loop {
        // SAFETY: reads into a local buffer from a non-blocking descriptor.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return any;
        }
        any = true;
    }
}

/// The final report is written (or the exit report): the FIFO goes, which tells `run` so.
pub(crate) fn done() {
    let fd = FD.swap(-1, Relaxed);
    if fd < 0 {
        return;
    }
    if let Some(path) = path() {
        // SAFETY: removes our own FIFO by its NUL-terminated path.
        unsafe { libc::unlink(path.as_c()) };
    }
    // SAFETY: the descriptor is ours (made by `open`), taken out of FD above.
    unsafe { libc::close(fd) };
}

/// In a forked child: the inherited descriptor is the parent's FIFO; the child makes its own.
pub(crate) fn forked() {
    let old = FD.swap(-1, Relaxed);
    if old >= 0 {
        // SAFETY: the descriptor is ours (made by `open` in the parent), a copy in this child.
        unsafe { libc::close(old) };
        open();
    }
}
