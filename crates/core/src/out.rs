//! A small output buffer written straight to a file descriptor with `write(2)`: the tracer's
//! one way to print. Not stdio, whose lock a thread stopped by gdb may hold; formatting into it
//! never allocates.

use core::fmt::{self, Write};

/// Writes a one-line note to stderr in one `write(2)`, with no buffer: for the tracer's
/// notes from places where even [`Out`]'s 2 KiB of stack is too much (a signal handler's
/// small stack) or nothing may be taken (inside a failing allocation).
pub(crate) fn note(line: &[u8]) {
    // SAFETY: writes the caller's initialised bytes; no allocation, no lock.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
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
    /// A buffer for standard error.
    pub fn stderr() -> Self {
        Self::borrowing(2)
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
