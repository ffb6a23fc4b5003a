//! The profiler for Rust programs that link this crate: the peaks as numbers, the reset that
//! starts a phase, and the full report on demand. They answer from the process's tables: the
//! preload's when the program runs under it (asked through its entries, since the copy of
//! the tracer linked into the program then records nothing), the program's own otherwise.

use crate::entries::{self, PeaksC, ThreadPeakC};
use crate::own_peaks::{own_peaks, Peaks, ThreadPeak};
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;

/// The peaks now (see [`Peaks`]). Under an old tracer-only preload, which kept none, all 0.
pub fn peaks() -> Peaks {
    let Some(e) = entries::preload() else {
        return own_peaks();
    };
    let Some(ask) = e.peaks else {
        return Peaks {
            global: 0,
            live: 0,
            threads: Vec::new(),
        };
    };
    let mut global = PeaksC::default();
    let mut threads = vec![ThreadPeakC::default(); 16];
    loop {
        // SAFETY: the preload's entry, with room for `threads.len()` threads.
        let n = unsafe { ask(&mut global, threads.as_mut_ptr(), threads.len()) };
        if n <= threads.len() {
            threads.truncate(n);
            break;
        }
        // Threads started between the calls: ask again with room for them.
        threads.resize(n + 16, ThreadPeakC::default());
    }
    Peaks {
        global: global.global,
        live: global.live,
        threads: threads
            .iter()
            .map(|t| ThreadPeak {
                tid: t.tid,
                name: String::from_utf8_lossy(t.name.split(|&b| b == 0).next().unwrap_or_default())
                    .into_owned(),
                peak: t.peak,
                live: t.live,
                exited: t.exited != 0,
            })
            .collect(),
    }
}

/// Starts a new phase: every peak (global, per thread, and the stacks held at the global
/// peak) becomes what is live now, so the next report's peaks are the new phase's own.
pub fn reset_peaks() {
    // Looked up here, so that the entry gdb calls knows whether the preload holds the tables.
    entries::preload();
    reset_peaks_known()
}

/// [`reset_peaks`] as far as already looked up (never calls anything, as gdb's call of
/// `mem_trace_reset_peaks` needs): the preload's reset when the preload holds the tables, else
/// this copy's.
pub(crate) fn reset_peaks_known() {
    match entries::preload_if_known() {
        Some(e) => {
            if let Some(reset) = e.reset_peaks {
                reset()
            }
        }
        None => mem_trace_core::profile::peaks::reset(),
    }
}

/// Writes the report to `fd`, from the process's tables; an error when the preload that
/// holds them is an old tracer-only build.
fn report_to(fd: i32) -> io::Result<()> {
    match entries::preload() {
        Some(e) => match e.report_to {
            Some(report) => report(fd),
            None => return Err(io::Error::other(NOT_PROFILER)),
        },
        None => mem_trace_core::profile::report_to(fd),
    }
    Ok(())
}

/// Why there is no report under an old tracer-only preload, which kept no counters.
const NOT_PROFILER: &str = "the preloaded libmem_trace.so is an old tracer-only build, which \
     keeps no counters for a report (rebuild it with cargo build --release)";

/// Writes the profiler's full report — the top stacks, the peaks and the stacks held at the
/// global peak, the leak check so far — to `out`, as the snapshot signal writes it.
pub fn report(out: &mut impl Write) -> io::Result<()> {
    // The report is written by the tracer straight to a descriptor, never through a Rust
    // writer (it may not allocate from the program's heap): an anonymous file in between.
    // SAFETY: a NUL-terminated name; the flags are valid.
    let fd = unsafe { libc::memfd_create(c"mem-trace-report".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made, owned by nobody else.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    report_to(file.as_raw_fd())?;
    file.rewind()?;
    let mut text = Vec::new();
    file.read_to_end(&mut text)?;
    out.write_all(&text)
}

/// [`report`] into the file at `path`, created or truncated.
pub fn report_to_file(path: impl AsRef<Path>) -> io::Result<()> {
    let file = std::fs::File::create(path)?;
    report_to(file.as_raw_fd())
}
