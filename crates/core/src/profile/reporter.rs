//! The profiler thread: writes the periodic report every `MEM_TRACE_PROFILE_INTERVAL`, a
//! full report when the snapshot signal wakes it, and the final report `mem-trace run` asks
//! for (`requests`), off the allocation path.
//!
//! It sleeps on a futex word with the interval as timeout: no spinning, no CPU while idle, and
//! no descriptor (an eventfd was one the program could list in `/proc/self/fd`, close or
//! `dup2` onto). Whoever has work for it sets a flag, increments the word and wakes it: the
//! snapshot signal's handler (`FUTEX_WAKE` is async-signal-safe), `mem-trace run` through the
//! shared file of `requests` (whose word it then is), and [`end`]. It is started from the library's constructor only when it has
//! work (an interval, a snapshot signal or requests), with every signal blocked (so the program's signals, ours included, are
//! delivered to the program's threads). It never counts as the program's: it is created and
//! runs inside the reentrancy guard, so whatever glibc allocates for it (its TLS vector) and
//! anything it allocates pass through untraced, and its Rust allocations come from the arena.
//! It does not keep the process alive (`exit` ends it wherever it is) and nothing at exit waits
//! for it except the exit report, for at most a second, for the right to symbolize. In a
//! forked child, which does not inherit the thread, it is made again.
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
    AtomicBool, AtomicU32,
    Ordering::{Acquire, Relaxed, Release},
};

/// The word the thread sleeps on when `requests` has none to offer.
static WAKE: AtomicU32 = AtomicU32::new(0);
/// Set by the snapshot signal's handler, taken by the thread.
static SNAPSHOT: AtomicBool = AtomicBool::new(false);
/// Set when the exit report begins: the thread writes no more reports.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Set once the constructor has made the thread: a forked child makes its own.
static STARTED: AtomicBool = AtomicBool::new(false);
/// Non-zero asks the thread to return.
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
    let mut thread = THREAD.lock();
    thread.running = make_thread();
    if thread.running.is_some() {
        STARTED.store(true, Relaxed);
        if sig != 0 {
            super::signal::install(sig);
        }
    }
}

/// In a forked child: a new thread (`requests` has made the child's own file first).
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
    thread.running = make_thread();
}

/// Async-signal-safe: wakes the thread for a snapshot.
pub(crate) fn wake_for_snapshot() {
    SNAPSHOT.store(true, Release);
    wake();
}

/// The word the thread sleeps on: `requests`' shared one while there is one, else ours.
fn word() -> &'static AtomicU32 {
    requests::wake_word().unwrap_or(&WAKE)
}

/// Async-signal-safe: wakes the thread to look at its flags.
fn wake() {
    wake_on(word());
}

/// Async-signal-safe: wakes whoever sleeps on `word` (shared, possibly: no
/// `FUTEX_PRIVATE_FLAG`).
pub(crate) fn wake_on(word: &AtomicU32) {
    word.fetch_add(1, Release);
    // SAFETY: wakes the sleepers on a word that stays mapped; no memory is written.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// Sleeps on `word` while it is `seen`, at most `ms` milliseconds if given.
fn sleep_on(word: &AtomicU32, seen: u32, ms: Option<u64>) {
    let ts = ms.map(|ms| libc::timespec {
        tv_sec: (ms / 1000).min(i32::MAX as u64) as _,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    });
    let timeout = ts
        .as_ref()
        .map_or(core::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: waits while the word (which stays mapped) is `seen`, at most the duration
    // `timeout` points to (a local) if any.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            timeout,
        )
    };
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
    // A snapshot or request flag set meanwhile stays set: the next thread reports it.
    wake();
    // SAFETY: `t` is the joinable thread `make_thread` made, joined only here, once (it was
    // taken out of `THREAD.running` under the lock).
    unsafe { libc::pthread_join(t as libc::pthread_t, core::ptr::null_mut()) };
    STOP.store(0, Relaxed);
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
        // Read before the flags: a waker that sets one after this changes the word, and the
        // sleep below then returns at once.
        let word = word();
        let seen = word.load(Acquire);
        if STOP.load(Acquire) != 0 {
            return core::ptr::null_mut();
        }
        if EXITING.load(Relaxed) {
            // Nothing more to do until asked to stop; `exit` ends the thread.
            sleep_on(word, seen, None);
            continue;
        }
        if requests::take() {
            write(Kind::Final);
            requests::done();
        }
        if SNAPSHOT.swap(false, Acquire) {
            write(Kind::Snapshot);
        }
        if interval != 0 && now_ms() >= next {
            write(Kind::Periodic);
            next = now_ms() + interval;
        }
        let wait = (interval != 0).then(|| next.saturating_sub(now_ms()));
        sleep_on(word, seen, wait);
    }
}

fn write(kind: Kind) {
    let printing = printing_within_a_second();
    report::write(kind, None, printing.as_ref(), None);
}

fn now_ms() -> u64 {
    super::monotonic_ns() / 1_000_000
}
