//! Where a report goes: standard error, or with `MEM_TRACE_OUT=DIR` a file of its own,
//! `DIR/mem-trace.<pid>.<n>.txt`, created with `O_EXCL` so an existing file is never
//! overwritten (the next free `n` is taken instead), nor a symlink followed (`O_EXCL` fails on
//! one, dangling or not; `O_NOFOLLOW` says so again). Files that go with a report (its folded
//! stacks, its flame graph) take the same name with their own extension.

use crate::config;
use crate::out::Out;
use core::fmt::Write;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The `n` the next report file tries first.
static NEXT: AtomicU64 = AtomicU64::new(1);
/// Files tried before giving up and writing to stderr.
const TRIES: u64 = 10_000;

/// The destination of one report, and its file's path when it has one (`None`: stderr).
pub(crate) fn open() -> (Out, Option<PathBuf>) {
    let Some(dir) = config::OUT_DIR.get() else {
        return (Out::stderr(), None);
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    for _ in 0..TRIES {
        let n = NEXT.fetch_add(1, Relaxed);
        let mut path = PathBuf::default();
        if write!(path, "{dir}/mem-trace.{pid}.{n}.txt\0").is_err() {
            break;
        }
        // SAFETY: `path` is NUL-terminated (written above, checked by `as_c`).
        let fd = unsafe {
            libc::open(
                path.as_c(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o644,
            )
        };
        if fd >= 0 {
            return (Out::owning(fd), Some(path));
        }
        let errno = std::io::Error::last_os_error().raw_os_error();
        // ELOOP: a symlink under that name, passed over as a file there is.
        if errno != Some(libc::EEXIST) && errno != Some(libc::ELOOP) {
            let mut err = Out::stderr();
            let _ = writeln!(
                err,
                "mem-trace: cannot create {}: {}; report on stderr",
                path.as_str(),
                std::io::Error::from_raw_os_error(errno.unwrap_or(0))
            );
            return (err, None);
        }
    }
    (Out::stderr(), None)
}

/// The file `report` (a report's `.txt`) with extension `ext` instead, created as the report
/// was (never overwriting a file); `None`, said on stderr, if it cannot be.
pub(crate) fn sibling(report: &PathBuf, ext: &str) -> Option<(Out, PathBuf)> {
    let path = report.with_extension(ext)?;
    // SAFETY: `path` is NUL-terminated (built by `with_extension`).
    let fd = unsafe {
        libc::open(
            path.as_c(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd < 0 {
        let _ = writeln!(
            Out::stderr(),
            "mem-trace: cannot create {}: {}",
            path.as_str(),
            std::io::Error::last_os_error()
        );
        return None;
    }
    Some((Out::owning(fd), path))
}

/// A NUL-terminated path (or any short text) built without allocating.
pub(crate) struct PathBuf {
    buf: [u8; 4096],
    len: usize,
}

impl Default for PathBuf {
    fn default() -> Self {
        PathBuf {
            buf: [0; 4096],
            len: 0,
        }
    }
}

impl PathBuf {
    /// The text as a C string; it must end with the NUL written last.
    pub(crate) fn as_c(&self) -> *const libc::c_char {
        debug_assert_eq!(self.buf[self.len - 1], 0);
        self.buf.as_ptr().cast()
    }

    /// The text without its NUL.
    pub(crate) fn as_str(&self) -> &str {
        core::str::from_utf8(&self.buf[..self.len.saturating_sub(1)]).unwrap_or("?")
    }

    /// The same path with the extension after its last `.` replaced by `ext`, NUL-terminated.
    pub(crate) fn with_extension(&self, ext: &str) -> Option<PathBuf> {
        let s = self.as_str();
        let stem = &s[..s.rfind('.')?];
        let mut p = PathBuf::default();
        write!(p, "{stem}.{ext}\0").ok()?;
        Some(p)
    }
}

impl Write for PathBuf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(core::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}
