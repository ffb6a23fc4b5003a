//! A small output buffer written straight to a file descriptor with `write(2)`: the tracer's
//! one way to print. Not stdio, whose lock a thread stopped by gdb may hold; formatting into it
//! never allocates.
//!
//! "Standard error" is the program's stderr as it was at start-up. Many programs close fd 2
//! before they exit (coreutils' `ls`, `cat` and the rest close it in an `atexit` handler to
//! catch write errors), and the exit report, written after that, would get `EBADF`. The tracer
//! holds no descriptor of its own for it: a program may list its descriptors
//! (`/proc/self/fd`: CPython's `subprocess` tests compare the list with what they expect),
//! close them all (`closefrom(3)`, daemons) or `dup2` onto any number, and each of these
//! either showed the program a descriptor it never opened or silently moved our output.
//! Instead, [`remember_stderr`] notes at start-up which file fd 2 is (device and inode) and a
//! path that opens that same file again:
//!
//! - a file or a terminal: the path `/proc/self/fd/2` links to, if it still names that file;
//! - a pipe (or a FIFO): `/proc/PPID/fd/2`, when the parent's stderr is the same pipe (so it
//!   is under `mem-trace run`, whose stderr the program inherits): opening a pipe's
//!   `/proc/PID/fd/N` link gives a new end of that same pipe.
//!
//! A write goes to fd 2 while it is still that file; once the program has closed it or put
//! another file there, the path is opened (write-only, appending, close-on-exec), checked to
//! be the same file, written to and closed at once, so that the descriptor exists only during
//! the write. With no such path (a socket, a deleted file, a pipe the parent does not share,
//! a parent gone), the output goes to whatever fd 2 is then, as it did before any of this.

use core::fmt::{self, Write};
use core::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

/// The start-up stderr's device and inode, valid once [`SAVED`] is set.
static DEV: AtomicU64 = AtomicU64::new(0);
static INO: AtomicU64 = AtomicU64::new(0);
/// The length of the path in [`PATH`] (0: none), and whether the start-up stderr is known.
static PATH_LEN: AtomicUsize = AtomicUsize::new(0);
static SAVED: AtomicBool = AtomicBool::new(false);
/// A path that opens the start-up stderr again, NUL-terminated; written once, by the first
/// [`remember_stderr`] (the library's initialisation, one thread), before [`SAVED`] is set,
/// and only read after.
static PATH: PathBuf = PathBuf(core::cell::UnsafeCell::new([0; PATH_MAX]));
const PATH_MAX: usize = 4096;

struct PathBuf(core::cell::UnsafeCell<[u8; PATH_MAX]>);
// SAFETY: written only before `SAVED` is released, read only after it is acquired (above).
unsafe impl Sync for PathBuf {}

/// At start-up, before the program can close fd 2: which file it is, and a path to open it
/// again ([module docs](self)). An `exec`'d program's own copy of the library remembers its
/// own; a forked child keeps its parent's, which is its own fd 2 too.
pub(crate) fn remember_stderr() {
    if SAVED.load(Acquire) {
        return;
    }
    let Some((dev, ino, mode)) = file_id(2) else {
        return;
    };
    DEV.store(dev, Relaxed);
    INO.store(ino, Relaxed);
    // SAFETY: nothing reads PATH before SAVED is set, and nothing else writes it (the
    // library's initialisation runs once, in one thread).
    let buf = unsafe { &mut *PATH.0.get() };
    let len = match mode & libc::S_IFMT {
        libc::S_IFIFO | libc::S_IFSOCK => parents_path(buf, (dev, ino)),
        _ => own_path(buf, (dev, ino)),
    };
    PATH_LEN.store(len, Relaxed);
    SAVED.store(true, Release);
}

/// The path `/proc/self/fd/2` links to, in `buf` NUL-terminated, if it names the file `id`;
/// its length (0: none).
fn own_path(buf: &mut [u8; PATH_MAX], id: (u64, u64)) -> usize {
    // SAFETY: reads the link into `buf`, at most its size less the NUL.
    let n = unsafe {
        libc::readlink(
            c"/proc/self/fd/2".as_ptr(),
            buf.as_mut_ptr().cast(),
            PATH_MAX - 1,
        )
    };
    if n <= 0 || buf[0] != b'/' {
        return 0;
    }
    let n = n as usize;
    buf[n] = 0;
    // A deleted file's link reads "PATH (deleted)", which names another file or none.
    if path_id(buf.as_ptr().cast()) != Some(id) {
        return 0;
    }
    n
}

/// `/proc/PPID/fd/2`, in `buf` NUL-terminated, if the parent's stderr is the pipe `id`; its
/// length (0: none).
fn parents_path(buf: &mut [u8; PATH_MAX], id: (u64, u64)) -> usize {
    // SAFETY: getppid has no preconditions.
    let ppid = unsafe { libc::getppid() };
    let mut w = Cursor { buf, len: 0 };
    if write!(w, "/proc/{ppid}/fd/2\0").is_err() {
        return 0;
    }
    let n = w.len - 1;
    if path_id(buf.as_ptr().cast()) != Some(id) {
        return 0;
    }
    n
}

/// Formats into a fixed buffer.
struct Cursor<'a> {
    buf: &'a mut [u8; PATH_MAX],
    len: usize,
}

impl Write for Cursor<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// The device, inode and mode of the file open at `fd`; `None` if none is.
fn file_id(fd: libc::c_int) -> Option<(u64, u64, u32)> {
    // SAFETY: an all-zero stat is a valid output buffer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat writes into `st`; async-signal-safe, no allocation.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino, st.st_mode))
}

/// The device and inode of the file `path` (NUL-terminated) names, links followed.
fn path_id(path: *const libc::c_char) -> Option<(u64, u64)> {
    // SAFETY: an all-zero stat is a valid output buffer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated (the callers'); stat writes into `st`.
    if unsafe { libc::stat(path, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Where the tracer's stderr output goes now, and whether the descriptor is ours to close
/// after the write: fd 2 while it is the start-up stderr (or none was known); else that file
/// opened again, for this write only; else fd 2, whatever it is. Async-signal-safe (`fstat`,
/// `open`, `fcntl`).
fn stderr_fd() -> (libc::c_int, bool) {
    if !SAVED.load(Acquire) {
        return (2, false);
    }
    let id = (DEV.load(Relaxed), INO.load(Relaxed));
    if file_id(2).is_some_and(|(dev, ino, _)| (dev, ino) == id) {
        return (2, false);
    }
    if PATH_LEN.load(Relaxed) == 0 {
        return (2, false);
    }
    // SAFETY: PATH was written before SAVED was released, and is not written again.
    let path = unsafe { (*PATH.0.get()).as_ptr() };
    // Non-blocking: opening a pipe for writing waits for a reader, and there may be none any
    // more (`ENXIO` then). Writes block again below, so that a full pipe does not cut a report.
    // SAFETY: opens a NUL-terminated path of our own.
    let fd = unsafe {
        libc::open(
            path.cast(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return (2, false);
    }
    // A path can come to name another file (a parent gone and its pid reused, a file
    // replaced): only the start-up stderr is written to.
    if file_id(fd).is_none_or(|(dev, ino, _)| (dev, ino) != id) {
        // SAFETY: the descriptor was just opened here.
        unsafe { libc::close(fd) };
        return (2, false);
    }
    // SAFETY: changes the flags of the descriptor just opened here.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    (fd, true)
}

/// Writes a one-line note to stderr in one `write(2)`, with no buffer: for the tracer's
/// notes from places where even [`Out`]'s 2 KiB of stack is too much (a signal handler's
/// small stack) or nothing may be taken (inside a failing allocation).
pub(crate) fn note(line: &[u8]) {
    let (fd, owned) = stderr_fd();
    // SAFETY: writes the caller's initialised bytes; no allocation, no lock.
    unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
    if owned {
        // SAFETY: opened by `stderr_fd` for this write alone.
        unsafe { libc::close(fd) };
    }
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
    /// ([`stderr_fd`]); a descriptor opened for it is closed when the buffer is dropped.
    pub fn stderr() -> Self {
        match stderr_fd() {
            (fd, true) => Self::owning(fd),
            (fd, false) => Self::borrowing(fd),
        }
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
