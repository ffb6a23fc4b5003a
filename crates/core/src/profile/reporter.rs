//! The profiler thread: writes the periodic report every `MEM_TRACE_PROFILE_INTERVAL` and a
//! full report when the snapshot signal wakes it, off the allocation path.
//!
//! It sleeps in `poll` on an eventfd with the interval as timeout: no spinning, no CPU while
//! idle. It is started from the library's constructor only when it has work (an interval or a
//! snapshot signal), detached, with every signal blocked (so the program's signals, ours
//! included, are delivered to the program's threads). It never counts as the program's: it is
//! created and runs inside the reentrancy guard, so whatever glibc allocates for it (its TLS
//! vector) and anything it allocates pass through untraced, and its Rust allocations come from
//! the arena. It does not keep the process alive (`exit` ends it wherever it is) and nothing
//! at exit waits for it except the exit report, for at most a second, for the right to
//! symbolize. In a forked child, which inherits neither the thread nor (usefully) the eventfd,
//! both are made again.

use crate::config;
use crate::guard;
use crate::out::Out;
use crate::profile::report::{self, Kind};
use crate::report::frames::Printing;
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, AtomicI32, Ordering::Relaxed};

/// The eventfd the signal handler writes to and the thread polls (-1: none).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// Set when the exit report begins: the thread writes no more reports.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Starts the thread and installs the snapshot signal, if configured.
pub(crate) fn start() {
    let interval = config::PROFILE_INTERVAL_MS.load(Relaxed);
    let sig = config::SNAPSHOT_SIGNAL.load(Relaxed);
    if interval == 0 && sig == 0 {
        return;
    }
    if spawn() && sig != 0 {
        super::signal::install(sig);
    }
}

/// In a forked child: a new eventfd (the inherited one is shared with the parent, whose
/// thread would get the child's snapshots) and a new thread.
pub(crate) fn forked() {
    let old = WAKE_FD.swap(-1, Relaxed);
    if old < 0 {
        return;
    }
    // SAFETY: the descriptor is ours (made by `spawn` in the parent).
    unsafe { libc::close(old) };
    spawn();
}

/// Async-signal-safe: wakes the thread for a snapshot.
pub(crate) fn wake() {
    let fd = WAKE_FD.load(Relaxed);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to an eventfd; write(2) is async-signal-safe.
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
}

/// The exit report begins: no more reports from the thread.
pub(crate) fn stop() {
    EXITING.store(true, Relaxed);
}

/// The right to symbolize, waiting up to about a second for the thread (or a `print_trace`)
/// to finish with it; `None` after that (frames are then written raw).
pub(crate) fn printing_within_a_second() -> Option<Printing> {
    for _ in 0..1000 {
        if let Ok(p) = Printing::begin() {
            return Some(p);
        }
        sleep_ms(1);
    }
    None
}

fn sleep_ms(ms: u64) {
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as _,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: sleeps; `ts` is a valid duration.
    unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
}

/// Makes the eventfd and the thread; false if either cannot be made (said on stderr).
fn spawn() -> bool {
    // SAFETY: creates a descriptor; no memory is touched.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        let _ = writeln!(
            Out::stderr(),
            "mem-trace: no profiler thread: eventfd: {}",
            std::io::Error::last_os_error()
        );
        return false;
    }
    WAKE_FD.store(fd, Relaxed);
    // Inside the guard: glibc's allocations for the new thread are not the program's.
    let was_busy = guard::set_busy(true);
    // SAFETY: sigset and attr are initialised by the calls that fill them before use, and
    // the previous signal mask is restored; the start routine is a function of this library.
    let rc = unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        // Zeroed rather than 0: an integer in glibc, a pointer in musl.
        let mut t: libc::pthread_t = core::mem::zeroed();
        let rc = libc::pthread_create(&mut t, &attr, run, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        rc
    };
    guard::set_busy(was_busy);
    if rc != 0 {
        let _ = writeln!(
            Out::stderr(),
            "mem-trace: no profiler thread: pthread_create: {}",
            std::io::Error::from_raw_os_error(rc)
        );
        return false;
    }
    true
}

extern "C" fn run(_: *mut libc::c_void) -> *mut libc::c_void {
    // For the thread's whole life: nothing it does is the program's.
    guard::set_busy(true);
    // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"mem-trace".as_ptr()) };
    let interval = config::PROFILE_INTERVAL_MS.load(Relaxed);
    let mut next = now_ms() + interval;
    loop {
        let fd = WAKE_FD.load(Relaxed);
        let timeout = if interval == 0 {
            -1
        } else {
            next.saturating_sub(now_ms()).min(i32::MAX as u64) as i32
        };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack.
        let r = unsafe { libc::poll(&mut p, 1, timeout) };
        if EXITING.load(Relaxed) {
            // Nothing more to do; `exit` ends the thread.
            loop {
                sleep_ms(1 << 20);
            }
        }
        let snapshot = r > 0 && p.revents & libc::POLLIN != 0 && {
            let mut n = 0u64;
            // SAFETY: reads the eventfd's 8-byte counter into a local (and so resets it:
            // signals that arrived meanwhile make this one report).
            unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) == 8 }
        };
        if r > 0 && p.revents & (libc::POLLNVAL | libc::POLLERR) != 0 {
            // The program closed our descriptor (a daemon closing every fd): snapshots are
            // over; periodic reports go on, timed by sleeping.
            if interval == 0 {
                return core::ptr::null_mut();
            }
            sleep_ms(next.saturating_sub(now_ms()));
        }
        if snapshot {
            write(Kind::Snapshot);
        }
        if interval != 0 && now_ms() >= next {
            write(Kind::Periodic);
            next = now_ms() + interval;
        }
    }
}

fn write(kind: Kind) {
    let printing = printing_within_a_second();
    report::write(kind, None, printing.as_ref(), None);
}

fn now_ms() -> u64 {
    super::monotonic_ns() / 1_000_000
}
