//! A small output buffer written straight to a file descriptor with `write(2)`: the tracer's
//! one way to print. Not stdio, whose lock a thread stopped by gdb may hold; formatting into it
//! never allocates.
//!
//! "Standard error" is the program's stderr as it was at start-up, kept on a descriptor of
//! our own ([`keep_stderr`]): many programs close fd 2 before they exit (coreutils' `ls`,
//! `cat` and the rest close it in an `atexit` handler to catch write errors), and the exit
//! report, written after that, would get `EBADF`. The kept descriptor is used only while it is
//! still the same file (device and inode); a program that closed it, or put another file at
//! its number, gets its fd 2 as before.

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};

/// The kept copy of the start-up stderr (-1: none), and the file it was.
static KEPT_FD: AtomicI32 = AtomicI32::new(-1);
static KEPT_DEV: AtomicU64 = AtomicU64::new(0);
static KEPT_INO: AtomicU64 = AtomicU64::new(0);
/// The lowest number the kept descriptor may take: high, out of the way of programs that
/// expect their descriptors at the low numbers (shells keep theirs from 10 up, bash a
/// script's at 255).
const KEPT_FROM: libc::c_int = 1000;

/// At start-up: keeps a close-on-exec copy of fd 2, if it is open, for [`stderr_fd`]. An
/// `exec`'d program's own copy of the library keeps its own.
pub(crate) fn keep_stderr() {
    let Some(id) = file_id(2) else {
        return;
    };
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: writes the limit into a local.
    let from = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        // Below the soft limit, or F_DUPFD fails with EINVAL.
        let soft = limit.rlim_cur.min(i32::MAX as u64) as libc::c_int;
        KEPT_FROM.min(soft.saturating_sub(24)).max(3)
    } else {
        3
    };
    // SAFETY: duplicates a descriptor we just checked is open; no memory touched.
    let fd = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, from) };
    if fd < 0 {
        return;
    }
    KEPT_DEV.store(id.0, Relaxed);
    KEPT_INO.store(id.1, Relaxed);
    let old = KEPT_FD.swap(fd, Relaxed);
    if old >= 0 {
        // SAFETY: a copy made here before (a second call), ours to close.
        unsafe { libc::close(old) };
    }
}

/// The device and inode of the file open at `fd`; `None` if none is.
fn file_id(fd: libc::c_int) -> Option<(u64, u64)> {
    // SAFETY: an all-zero stat is a valid output buffer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat writes into `st`; async-signal-safe, no allocation.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Where the tracer's stderr output goes now: the kept copy of the start-up stderr while it is
/// still that file, else fd 2. Async-signal-safe (one `fstat`).
pub(crate) fn stderr_fd() -> libc::c_int {
    let fd = KEPT_FD.load(Relaxed);
    if fd >= 0 && file_id(fd) == Some((KEPT_DEV.load(Relaxed), KEPT_INO.load(Relaxed))) {
        return fd;
    }
    2
}

/// Writes a one-line note to stderr in one `write(2)`, with no buffer: for the tracer's
/// notes from places where even [`Out`]'s 2 KiB of stack is too much (a signal handler's
/// small stack) or nothing may be taken (inside a failing allocation).
pub(crate) fn note(line: &[u8]) {
    // SAFETY: writes the caller's initialised bytes; no allocation, no lock.
    unsafe { libc::write(stderr_fd(), line.as_ptr().cast(), line.len()) };
}

/// A small output buffer written to a file descriptor with `write(2)`, flushed when full and on
/// drop. Formatting into it never allocates.
pub struct Out {
    fd: i32,
    /// Closed on drop (a report file), after the last flush.
    owned: bool,
    len: usize,
    buf: [u8; 2048],
}

impl Out {
    /// A buffer for standard error: the program's stderr as it was at start-up
    /// ([`stderr_fd`]).
    pub fn stderr() -> Self {
        Self::borrowing(stderr_fd())
    }

    /// A buffer for a file descriptor someone else closes.
    pub fn borrowing(fd: i32) -> Self {
        Out {
            fd,
            owned: false,
            len: 0,
            buf: [0; 2048],
        }
    }

    /// A buffer for a file descriptor this `Out` owns: closed when it is dropped.
    pub fn owning(fd: i32) -> Self {
        Out {
            fd,
            owned: true,
            len: 0,
            buf: [0; 2048],
        }
    }

    fn flush(&mut self) {
        let mut done = 0;
        while done < self.len {
            // SAFETY: writes initialised bytes of our own buffer.
            let n =
                unsafe { libc::write(self.fd, self.buf[done..].as_ptr().cast(), self.len - done) };
            if n <= 0 {
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                break;
            }
            done += n as usize;
        }
        self.len = 0;
    }
}

impl Write for Out {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for chunk in s.as_bytes().chunks(self.buf.len()) {
            if self.len + chunk.len() > self.buf.len() {
                self.flush();
            }
            self.buf[self.len..self.len + chunk.len()].copy_from_slice(chunk);
            self.len += chunk.len();
        }
        Ok(())
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        self.flush();
        if self.owned {
            // SAFETY: the descriptor was handed to this `Out` to own; nothing else closes it.
            unsafe { libc::close(self.fd) };
        }
    }
}
