//! The head of a report whose frames `mem-trace run` symbolizes (`MEM_TRACE_DEFER_SYMBOLS`,
//! `mem_trace_read::deferred`): the line saying what the file is, the process's command line
//! (by which `run` names the report) and its modules (by which it reads the return addresses).
//!
//! Written at exit, in the thread that called `exit`: nothing here allocates (the command line
//! is read into a fixed buffer, cut if longer) or opens any file but `/proc/self/cmdline`.

use crate::capture::modules;
use crate::out::Out;
use core::fmt;
use mem_trace_read::deferred;

/// The most of the command line kept: enough for a name and its arguments; `run` shortens it
/// further.
const CMDLINE_MAX: usize = 4096;

/// Whether a report to a file leaves its symbolizing to `run`: only a last one (`at_end`: an
/// exit or final report).
pub(crate) fn on(at_end: bool, to_a_file: bool) -> bool {
    to_a_file && at_end && crate::config::DEFER_SYMBOLS.load(core::sync::atomic::Ordering::Relaxed)
}

/// The first lines of a raw report.
pub(crate) fn write_head(out: &mut Out) -> fmt::Result {
    deferred::write_first_line(out)?;
    let mut buf = [0u8; CMDLINE_MAX];
    deferred::write_cmdline(out, cmdline(&mut buf))?;
    let Some(set) = modules::snapshot() else {
        return Ok(());
    };
    for m in &set.modules {
        deferred::write_module(out, (m.start, m.end), m.bias, &m.name, &m.path)?;
    }
    Ok(())
}

/// `/proc/self/cmdline` read into `buf` (empty if it cannot be read).
fn cmdline(buf: &mut [u8; CMDLINE_MAX]) -> &[u8] {
    // SAFETY: opens a NUL-terminated path; no memory is touched.
    let fd = unsafe {
        libc::open(
            c"/proc/self/cmdline".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return &[];
    }
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: reads into the unfilled part of our own buffer.
        let n = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        if n <= 0 {
            break;
        }
        len += n as usize;
    }
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
    &buf[..len]
}
