//! The profiler thread: writes the periodic report every `MEM_TRACE_PROFILE_INTERVAL`, a
//! full report when the snapshot signal wakes it, and the final report `mem-trace run` asks
//! for (`requests`), off the allocation path.
//!
//! It sleeps in `poll` on an eventfd (and the request FIFO) with the interval as timeout: no
//! spinning, no CPU while idle. It is started from the library's constructor only when it has
//! work (an interval, a snapshot signal or requests), with every signal blocked (so the program's signals, ours included, are
//! delivered to the program's threads). It never counts as the program's: it is created and
//! runs inside the reentrancy guard, so whatever glibc allocates for it (its TLS vector) and
//! anything it allocates pass through untraced, and its Rust allocations come from the arena.
//! It does not keep the process alive (`exit` ends it wherever it is) and nothing at exit waits
//! for it except the exit report, for at most a second, for the right to symbolize. In a
//! forked child, which inherits neither the thread nor (usefully) the eventfd, both are made
//! again.
//!
//! While the program changes its credentials ([`without_thread`]) the thread is not there:
//! glibc makes every thread repeat a `setuid` or `setgroups` and aborts when one fails, and
//! ours would, holding none of the capabilities the program keeps or raises in its own thread
//! (`PR_SET_KEEPCAPS`, `capset`: `setpriv` does both). It is made again afterwards from the
//! calling thread, so it starts with that thread's credentials.

use crate::config;
use crate::guard;
use crate::out::Out;
use crate::profile::report::{self, Kind};
use crate::profile::requests;
use crate::report::frames::Printing;
use crate::sync::SpinLock;
use core::fmt::Write;
use core::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU32,
    Ordering::{Acquire, Relaxed, Release},
};

/// The eventfd the signal handler writes to and the thread polls (-1: none, or the program
/// closed it).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// Set when the exit report begins: the thread writes no more reports.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Set once the constructor has made the thread: a forked child makes its own.
static STARTED: AtomicBool = AtomicBool::new(false);
/// Non-zero asks the thread to return; a futex word, so a thread waiting on it wakes at once.
static STOP: AtomicU32 = AtomicU32::new(0);

/// The thread and the credential changes under way.
struct Thread {
    /// The running thread's `pthread_t` (joinable), as a word: an integer in glibc, a pointer
    /// in musl.
    running: Option<usize>,
    /// Credential changes in progress: the thread is made again when the last one ends.
    changes: u32,
    /// Whether the first of them stopped a thread.
    stopped: bool,
}

static THREAD: SpinLock<Thread> = SpinLock::new(Thread {
    running: None,
    changes: 0,
    stopped: false,
});

/// Starts the thread and installs the snapshot signal, if configured.
pub(crate) fn start() {
    let interval = config::PROFILE_INTERVAL_MS.load(Relaxed);
    let sig = config::SNAPSHOT_SIGNAL.load(Relaxed);
    let listening = requests::open();
    if interval == 0 && sig == 0 && !listening {
        return;
    }
    if !make_eventfd() {
        return;
    }
    let mut thread = THREAD.lock();
    thread.running = make_thread();
    if thread.running.is_some() {
        STARTED.store(true, Relaxed);
        if sig != 0 {
            super::signal::install(sig);
        }
    }
}

/// In a forked child: a new eventfd (the inherited one is shared with the parent, whose
/// thread would get the child's snapshots) and a new thread.
pub(crate) fn forked() {
    if !STARTED.load(Relaxed) {
        return;
    }
    // The child's only thread is the one that forked, which was not changing credentials (it
    // was in fork): whatever the lock and the state say belongs to the parent's threads.
    THREAD.raw().unlock();
    let mut thread = THREAD.lock();
    *thread = Thread {
        running: None,
        changes: 0,
        stopped: false,
    };
    STOP.store(0, Relaxed);
    let old = WAKE_FD.swap(-1, Relaxed);
    if old >= 0 {
        // SAFETY: the descriptor is ours (made by `make_eventfd` in the parent).
        unsafe { libc::close(old) };
    }
    if make_eventfd() {
        thread.running = make_thread();
    }
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

/// The exit report begins: no more reports from the thread, which is gone on return. The
/// exit report's leak scan stops every other thread, and waits for those inside the tracer
/// to leave it; this one is inside for its whole life.
pub(crate) fn stop() {
    EXITING.store(true, Relaxed);
    let running = THREAD.lock().running.take();
    if let Some(t) = running {
        end(t);
    }
}

/// Runs `change`, a call that changes the process's credentials, with the thread stopped,
/// and makes it again after the last of such calls in progress.
pub(crate) fn without_thread<T>(change: impl FnOnce() -> T) -> T {
    {
        let mut thread = THREAD.lock();
        if thread.changes == 0 {
            thread.stopped = match thread.running.take() {
                Some(t) => {
                    end(t);
                    true
                }
                None => false,
            };
        }
        thread.changes += 1;
    }
    let result = change();
    // SAFETY: __errno_location returns this thread's errno: the change's, kept for its
    // caller across the thread's creation.
    let errno = unsafe { *libc::__errno_location() };
    {
        let mut thread = THREAD.lock();
        thread.changes -= 1;
        if thread.changes == 0 && thread.stopped {
            thread.stopped = false;
            thread.running = make_thread();
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    result
}

/// Asks the thread `t` to return and waits until it has.
fn end(t: usize) {
    STOP.store(1, Release);
    // SAFETY: wakes whoever waits on the STOP word (a thread with no eventfd left to poll).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            STOP.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
    // The thread returns before reading what this adds; taken back below.
    wake();
    // SAFETY: `t` is the joinable thread `make_thread` made, joined only here, once (it was
    // taken out of `THREAD.running` under the lock).
    unsafe { libc::pthread_join(t as libc::pthread_t, core::ptr::null_mut()) };
    STOP.store(0, Relaxed);
    let fd = WAKE_FD.load(Relaxed);
    if fd >= 0 {
        let mut n = 0u64;
        // SAFETY: reads the (non-blocking) eventfd's counter into a local.
        let read = unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) };
        if read == 8 && n > 1 {
            // A snapshot signal came meanwhile: the next thread reports it.
            wake();
        }
    }
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

/// Sleeps `ms` milliseconds (forever if `None`) or until the thread is asked to stop.
fn sleep_until_stopped(ms: Option<u64>) {
    let ts = ms.map(|ms| libc::timespec {
        tv_sec: (ms / 1000).min(i32::MAX as u64) as _,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    });
    let timeout = ts
        .as_ref()
        .map_or(core::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: waits while the STOP word is 0, at most the duration `timeout` points to (a
    // local) if any.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            STOP.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            0,
            timeout,
        )
    };
}

/// Makes the eventfd; false if it cannot be made (said on stderr).
fn make_eventfd() -> bool {
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
    true
}

/// Makes the thread (joinable); `None` if it cannot be made (said on stderr).
fn make_thread() -> Option<usize> {
    // Inside the guard: glibc's allocations for the new thread are not the program's.
    let was_busy = guard::set_busy(true);
    // Zeroed rather than 0: an integer in glibc, a pointer in musl.
    // SAFETY: all-zero bytes are a valid pthread_t of either kind.
    let mut t: libc::pthread_t = unsafe { core::mem::zeroed() };
    // SAFETY: the sigsets are initialised by the calls that fill them before use, and the
    // previous signal mask is restored; the start routine is a function of this library.
    let rc = unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let rc = libc::pthread_create(&mut t, core::ptr::null(), run, core::ptr::null_mut());
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
        return None;
    }
    Some(t as usize)
}

extern "C" fn run(_: *mut libc::c_void) -> *mut libc::c_void {
    // For the thread's whole life: nothing it does is the program's.
    guard::set_busy(true);
    // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"mem-trace".as_ptr()) };
    let interval = config::PROFILE_INTERVAL_MS.load(Relaxed);
    let mut next = now_ms() + interval;
    loop {
        if STOP.load(Acquire) != 0 {
            return core::ptr::null_mut();
        }
        let fd = WAKE_FD.load(Relaxed);
        let request_fd = requests::fd();
        if EXITING.load(Relaxed) || (fd < 0 && request_fd < 0 && interval == 0) {
            // Nothing more to do until asked to stop; `exit` ends the thread.
            sleep_until_stopped(None);
            continue;
        }
        let wait = next.saturating_sub(now_ms());
        let woken = if fd < 0 && request_fd < 0 {
            sleep_until_stopped(Some(wait));
            Woken::default()
        } else {
            poll(fd, request_fd, interval, wait)
        };
        if STOP.load(Acquire) != 0 || EXITING.load(Relaxed) {
            continue;
        }
        if woken.request && requests::take() {
            write(Kind::Final);
            requests::done();
        }
        let mut n = 0u64;
        // SAFETY: reads the eventfd's 8-byte counter into a local (and so resets it: signals
        // that arrived meanwhile make this one report).
        if woken.snapshot && unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) } == 8 {
            write(Kind::Snapshot);
        }
        if interval != 0 && now_ms() >= next {
            write(Kind::Periodic);
            next = now_ms() + interval;
        }
    }
}

/// What woke the thread.
#[derive(Default)]
struct Woken {
    /// The snapshot signal's eventfd.
    snapshot: bool,
    /// The request FIFO.
    request: bool,
}

/// Waits on the eventfd `fd` for a snapshot and on `request_fd` for a request (either may be
/// -1: none), at most `wait_ms` if there is an `interval`. A descriptor the program closed (a
/// daemon closing every fd) ends what it brought: periodic reports go on, timed by sleeping.
fn poll(fd: i32, request_fd: i32, interval: u64, wait_ms: u64) -> Woken {
    let timeout = if interval == 0 {
        -1
    } else {
        wait_ms.min(i32::MAX as u64) as i32
    };
    // poll(2) skips an entry whose descriptor is negative.
    let mut p = [fd, request_fd].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: two pollfds on our stack.
    let r = unsafe { libc::poll(p.as_mut_ptr(), 2, timeout) };
    if r <= 0 {
        return Woken::default();
    }
    let gone = |p: &libc::pollfd| p.revents & (libc::POLLNVAL | libc::POLLERR) != 0;
    // Not closed again, nor written to, by us: the number may be the program's now.
    if gone(&p[0]) {
        WAKE_FD.store(-1, Relaxed);
    }
    if gone(&p[1]) {
        requests::lost();
    }
    let ready = |p: &libc::pollfd| !gone(p) && p.revents & libc::POLLIN != 0;
    Woken {
        snapshot: ready(&p[0]),
        request: ready(&p[1]),
    }
}

fn write(kind: Kind) {
    let printing = printing_within_a_second();
    report::write(kind, None, printing.as_ref(), None);
}

fn now_ms() -> u64 {
    super::monotonic_ns() / 1_000_000
}
