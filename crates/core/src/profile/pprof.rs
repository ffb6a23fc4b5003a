//! A report's pprof profile: `X.pb.gz` beside the report's `X.txt`, written by the `mem-trace`
//! binary beside the library reading this process (`mem-trace pprof PID -o X.pb.gz`), run as
//! a child the program cannot see (`unseen`).
//!
//! A report holds the top stacks; a profile holds every stack's four counts (Go's
//! `alloc_objects`, `alloc_space`, `inuse_objects`, `inuse_space`), which only the process's
//! tables have. So the profile is read from the process while it is there: the periodic and
//! snapshot reports' from the profiler thread while the program goes on (as `mem-trace pprof
//! PID` reads any running process), the exit report's with the exiting thread waiting for it
//! (the tables go with the process). The library does not encode protobuf itself: the encoder
//! is the command's, and stays out of the preloaded library.
//!
//! Only without `mem-trace run` (`MEM_TRACE_OUT` alone): under `run` (which sets
//! `MEM_TRACE_DEFER_SYMBOLS`), `run --pprof` reads each process as it exits instead.
//!
//! A failure is one note on stderr, the command's own reason in it (permission to read the
//! process, most likely: docs/FINDINGS.md, "Letting our own grandchild read us"), and the
//! process makes no more profiles after it: the next would fail the same way, and a reporter
//! thread waiting out a command that hangs misses its reports.

use crate::config;
use crate::out::Out;
use crate::profile::output::PathBuf;
use crate::profile::unseen::{self, Binary, Reads};
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Set once a profile could not be made: no more are tried.
static GAVE_UP: AtomicBool = AtomicBool::new(false);

/// Whether reports written to files get a pprof profile beside them.
pub(crate) fn wanted() -> bool {
    config::OUT_DIR.get().is_some()
        && !config::DEFER_SYMBOLS.load(Relaxed)
        && !GAVE_UP.load(Relaxed)
}

/// Writes the profile of this process beside `report` (a report's `.txt`), if wanted.
pub(crate) fn beside(report: &PathBuf) {
    if !wanted() {
        return;
    }
    let Some(profile) = report.with_extension("pb.gz") else {
        return;
    };
    let binary = match unseen::binary() {
        Binary::There(path) => path,
        Binary::Missing(path) => {
            unseen::say_missing(&path, wanted());
            GAVE_UP.store(true, Relaxed);
            return;
        }
        Binary::Unknown => return,
    };
    let mut pid = PathBuf::default();
    // SAFETY: getpid has no preconditions.
    if write!(pid, "{}\0", unsafe { libc::getpid() }).is_err() {
        return;
    }
    let argv: [*const libc::c_char; 6] = [
        binary.as_c(),
        c"pprof".as_ptr(),
        pid.as_c(),
        c"-o".as_ptr(),
        profile.as_c(),
        core::ptr::null(),
    ];
    let ended = unseen::run(&argv, Reads::Us);
    let Some(why) = ended.why else {
        return;
    };
    GAVE_UP.store(true, Relaxed);
    let _ = writeln!(
        Out::stderr(),
        "mem-trace: no pprof profile {}: {}; no more pprof profiles from this process",
        profile.as_str(),
        ended.said().unwrap_or(why)
    );
}
