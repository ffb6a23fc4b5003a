//! Files mapped read-only with plain `open`/`mmap`: no stdio, no lock, nothing the
//! dynamic loader holds.

use super::types::SymError;

/// A read-only private mapping of a whole file; unmapped on drop.
pub(crate) struct Mapping {
    pub(super) ptr: *mut libc::c_void,
    pub(super) len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone; moving it to another
// thread moves nothing but the right to read and unmap it.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps the file at `path` (no NUL byte allowed in it).
    pub(crate) fn open(path: &[u8]) -> Result<Mapping, SymError> {
        if path.contains(&0) {
            return Err(SymError::BadPath);
        }
        let mut cpath = Vec::with_capacity(path.len() + 1);
        cpath.extend_from_slice(path);
        cpath.push(0);
        let fd = loop {
            // O_NONBLOCK: a path that names a FIFO (a core's NT_FILE names whatever was mapped)
            // must not block the open; the fstat below then refuses anything not a regular
            // file, and reads from a mapping do not care about the flag.
            let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK;
            // SAFETY: `cpath` is NUL-terminated and outlives the call.
            let fd = unsafe { libc::open(cpath.as_ptr().cast(), flags) };
            if fd >= 0 {
                break fd;
            }
            let errno = last_errno();
            if errno != libc::EINTR {
                return Err(SymError::Open(errno));
            }
        };
        let result = Self::map_fd(fd);
        // SAFETY: `fd` was opened above and is closed exactly once; the mapping (if any)
        // stays valid after the descriptor is closed.
        unsafe { libc::close(fd) };
        result
    }

    pub(super) fn map_fd(fd: libc::c_int) -> Result<Mapping, SymError> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
        // SAFETY: `st` points to writable storage of the right type; `fd` is open.
        if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
            return Err(SymError::Open(last_errno()));
        }
        // SAFETY: fstat succeeded, so it filled `st` (which was zeroed besides).
        let st = unsafe { st.assume_init() };
        // Only regular files: a FIFO or device would block or map something unbounded.
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size <= 0 {
            return Err(SymError::NotAFile);
        }
        let len = usize::try_from(st.st_size).map_err(|_| SymError::NotAFile)?;
        // SAFETY: a fresh read-only private mapping of an open regular file; the kernel
        // picks the address, so nothing existing is replaced.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(SymError::Map(last_errno()));
        }
        Ok(Mapping { ptr, len })
    }

    /// The mapped bytes, for as long as the mapping lives.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: the slice borrows `self`, so it cannot outlive the mapping.
        unsafe { self.bytes() }
    }

    /// The mapped bytes, with a lifetime the borrow checker cannot see.
    ///
    /// # Safety
    /// The slice (and everything borrowed from it) must not be used after this `Mapping`
    /// is dropped. [`Loaded`] guarantees it by dropping its parsers before its mappings.
    pub(super) unsafe fn bytes(&self) -> &'static [u8] {
        // SAFETY: `ptr..ptr+len` is a live read-only mapping until `drop`; the caller
        // promises not to outlive it.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping made by `map_fd` and unmapped only here.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

pub(super) fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
