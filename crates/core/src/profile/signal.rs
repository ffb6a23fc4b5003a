//! The snapshot signal (`MEM_TRACE_SNAPSHOT_SIGNAL`, default `SIGUSR2`): its handler only
//! sets a flag and wakes the profiler thread with `FUTEX_WAKE`, which is async-signal-safe, so the
//! signal is safe whatever the program is doing when it arrives (inside `malloc`, holding a
//! lock, inside the tracer). Several signals before the thread wakes make one report.
//!
//! Installed only if the program has not chosen a disposition for the signal by then (it is
//! `SIG_DFL` at start-up); a program that installs its own handler later simply replaces
//! ours and keeps it.

use crate::profile::wake;

/// Installs the handler for `sig` if its disposition is the default.
pub(crate) fn install(sig: i32) {
    // SAFETY: an all-zero sigaction is valid to pass as the output of sigaction(2).
    let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
    // SAFETY: reads the current disposition into `old`.
    if unsafe { libc::sigaction(sig, core::ptr::null(), &mut old) } != 0
        || old.sa_sigaction != libc::SIG_DFL
    {
        return;
    }
    // SAFETY: as above.
    let mut new: libc::sigaction = unsafe { core::mem::zeroed() };
    new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // Restart the program's interrupted system calls: the signal is not meant for it.
    new.sa_flags = libc::SA_RESTART;
    // SAFETY: `new.sa_mask` is ours to fill; the handler is a plain function of this library,
    // which is never unloaded.
    unsafe {
        libc::sigemptyset(&mut new.sa_mask);
        libc::sigaction(sig, &new, core::ptr::null_mut());
    }
}

extern "C" fn on_signal(_sig: libc::c_int) {
    // SAFETY: __errno_location returns this thread's errno; saved and restored so the
    // interrupted code does not see our write's errno.
    let errno = unsafe { *libc::__errno_location() };
    wake::wake_for_snapshot();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}
