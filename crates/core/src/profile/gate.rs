//! `MEM_TRACE_ERROR_EXITCODE`: a process that had a double or invalid free, or, with
//! `MEM_TRACE_FAIL_ON=leaks` (or `possibly`), leaked, ends with that status instead of its own,
//! as valgrind's `--error-exitcode` and LeakSanitizer's `exitcode` make a CI job fail.
//!
//! Decided at the end of the exit report, in the library's destructor, from the count of
//! errors reported and the exit report's leak check. The process then flushes its stdio
//! streams (which `exit` would have flushed after the destructors) and leaves by `_exit`: the
//! destructors after ours do not run, as under LeakSanitizer. One line on stderr says why the
//! status is not the program's. `mem-trace run` does not use this: it leaves the program's
//! status alone and decides for the whole run itself (`--error-exitcode`).

use crate::config;
use crate::out::Out;
use core::fmt::Write;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The exit report's leak check: definitely lost bytes and blocks, possibly lost bytes and
/// blocks.
static LEAKED: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// What the exit report's leak check found.
pub(crate) fn leak_check(lost: (u64, u64), possibly: (u64, u64)) {
    for (word, v) in LEAKED.iter().zip([lost.0, lost.1, possibly.0, possibly.1]) {
        word.store(v, Relaxed);
    }
}

/// At the end of `exit`, once the exit report (if any) is written: ends the process with
/// `MEM_TRACE_ERROR_EXITCODE` if it failed.
pub(crate) fn at_exit() {
    let code = config::ERROR_EXITCODE.load(Relaxed);
    if code == 0 {
        return;
    }
    let fail_on = config::FAIL_ON.load(Relaxed);
    let errors = crate::store::freed::HISTORY.errors.load(Relaxed);
    let [lost, lost_blocks, possibly, possibly_blocks] = LEAKED.each_ref().map(|w| w.load(Relaxed));
    let lost = (fail_on >= config::FAIL_ON_LEAKS && lost_blocks > 0).then_some((lost, lost_blocks));
    let possibly = (fail_on >= config::FAIL_ON_POSSIBLY && possibly_blocks > 0)
        .then_some((possibly, possibly_blocks));
    if errors == 0 && lost.is_none() && possibly.is_none() {
        return;
    }
    let mut out = Out::stderr();
    let _ = write!(
        out,
        "mem-trace: exit status {code} (MEM_TRACE_ERROR_EXITCODE):"
    );
    let mut sep = " ";
    if errors > 0 {
        let s = if errors == 1 { "" } else { "s" };
        let _ = write!(out, "{sep}{errors} double or invalid free{s}");
        sep = "; ";
    }
    for (what, found) in [("definitely", lost), ("possibly", possibly)] {
        if let Some((bytes, blocks)) = found {
            let s = if blocks == 1 { "" } else { "s" };
            let _ = write!(out, "{sep}{bytes} bytes {what} lost in {blocks} block{s}");
            sep = "; ";
        }
    }
    let _ = writeln!(out);
    drop(out);
    // SAFETY: flushes every stdio stream, as `exit` would have after the destructors; then
    // ends the process with the status asked for.
    unsafe {
        libc::fflush(core::ptr::null_mut());
        libc::_exit(i32::from(code));
    }
}
