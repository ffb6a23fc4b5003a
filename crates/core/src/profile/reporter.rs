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
//! for it except the exit report, for at most a second, for the right to symbolize.
//!
//! A process that must be single-threaded to do what it does (`unshare(CLONE_NEWUSER)` and
//! `setns` into a user namespace are refused to a process with two threads; Chromium's zygote
//! checks that `/proc/self/task` has one entry before it forks) cannot have ours in the way,
//! so the thread is made eagerly only in the program itself, and later, on need, elsewhere:
//!
//! - the program: from the constructor, as said above. Under `mem-trace run` (which names
//!   itself in `MEM_TRACE_RUN_PID`) that is the process `run` started, whatever it `exec`s in
//!   its place; with the library preloaded by hand, every process that starts with it.
//! - a forked child, which does not inherit the thread: at its first allocation, or when it
//!   makes a thread of its own, whichever comes first. A child that checks it is alone, or
//!   `unshare`s, before allocating finds no thread of ours; one that allocates first (a
//!   worker, the usual case) has periodic reports and `run`'s final report while idle.
//! - a process `exec`'d by another under `run` (a helper, a sandbox's zygote): when it makes a
//!   thread of its own (it is then not single-threaded anyway), or, with periodic reports on,
//!   at its first allocation once the first report is due. Until then it has no periodic
//!   report, no snapshot (the signal is kept and served once the thread is there) and no
//!   request file (`run` does not ask it for a final report; its exit report is written at
//!   `exit` as everywhere).
//!
//! A CPython that forks with no other thread of its own forks without ours too, as it would
//! plain: CPython 3.12 and later read the thread count in `/proc/self/stat` in the parent just
//! after `fork`, and warn that a multi-threaded process forked (`DeprecationWarning`, an error
//! where warnings are). The thread is joined in the fork's prepare handler (unless it is
//! writing a report, which the fork would wait for), its request file goes (`run` does not
//! wait on a process with no thread to answer), and both come back at the parent's first
//! allocation [`AFTER_FORK_MS`] later, or when it makes a thread: the Python code it goes on
//! running allocates. Only CPython: a C server's parent that forks its workers and then waits
//! in `pause` or `waitpid` would have no thread to answer `run`'s request for a final report,
//! and no other program is known to count its threads after a fork.
//!
//! A thread a program made through `pthread_create` and a first allocation are points where
//! glibc may make a thread: no lock of glibc's that `pthread_create` takes is held there by
//! the program (a program allocating inside `pthread_create` is inside our guard).
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
use crate::profile::wake::{wake, word, SNAPSHOT};
use crate::report::frames::Printing;
use crate::sync::SpinLock;
use core::fmt::Write;
use core::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// How long after a fork the thread joined for it may be made again: longer than a program
/// takes to look at itself once `fork` has returned.
const AFTER_FORK_MS: u64 = 10;
/// Set while the thread writes a report.
static WRITING: AtomicBool = AtomicBool::new(false);
/// Set when the thread was joined for a fork under way.
static JOINED_FOR_FORK: AtomicBool = AtomicBool::new(false);

/// Set when the exit report begins: the thread writes no more reports.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Set once the constructor found work for the thread: a forked child waits for its own.
static STARTED: AtomicBool = AtomicBool::new(false);
/// Non-zero asks the thread to return.
static STOP: AtomicU32 = AtomicU32::new(0);

/// What the process waits for before the thread is made ([`made_on_need`]): nothing, a
/// thread of the program's own, that or an allocation, that or an allocation once
/// [`DUE_MS`] has passed.
static WAITING: AtomicU8 = AtomicU8::new(NOT_WAITING);
const NOT_WAITING: u8 = 0;
const ON_THREAD: u8 = 1;
const ON_ALLOCATION: u8 = 2;
const ON_DUE_ALLOCATION: u8 = 3;
/// As [`ON_DUE_ALLOCATION`], the clock read at every allocation: briefly, after a fork.
const ON_ALLOCATION_AFTER: u8 = 4;
/// With [`ON_DUE_ALLOCATION`] or [`ON_ALLOCATION_AFTER`]: when (monotonic ms).
static DUE_MS: AtomicU64 = AtomicU64::new(0);
/// The process that waits: a `vfork` child or a `CLONE_VM` one shares our memory, and must not
/// make a thread in its parent's name.
static WAITING_PID: AtomicI32 = AtomicI32::new(0);

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

/// Starts the thread and installs the snapshot signal, if configured; in a process `exec`'d
/// by another under `mem-trace run`, waits for a need instead (module doc).
pub(crate) fn start() {
    let interval = config::PROFILE_INTERVAL_MS.load(Relaxed);
    let sig = config::SNAPSHOT_SIGNAL.load(Relaxed);
    if interval == 0 && sig == 0 && !requests::enabled() {
        return;
    }
    STARTED.store(true, Relaxed);
    if !is_the_program() {
        // The handler now, as for the program: the signal's disposition does not change when
        // the thread comes, and a snapshot asked for meanwhile is written then.
        if sig != 0 {
            super::signal::install(sig);
        }
        let due = crate::clock::monotonic_ns() / 1_000_000 + interval;
        DUE_MS.store(due, Relaxed);
        wait_for(if interval != 0 {
            ON_DUE_ALLOCATION
        } else {
            ON_THREAD
        });
        return;
    }
    let listening = requests::open();
    if interval == 0 && sig == 0 && !listening {
        return;
    }
    let mut thread = THREAD.lock();
    thread.running = make_thread();
    if thread.running.is_some() && sig != 0 {
        super::signal::install(sig);
    }
}

/// Whether this process is the program `mem-trace run` started (it or what it `exec`'d in
/// its place: its parent is `run`), or the library was preloaded by hand.
fn is_the_program() -> bool {
    let run = config::RUN_PID.load(Relaxed);
    // SAFETY: getppid has no preconditions.
    run == 0 || unsafe { libc::getppid() } as u32 == run
}

/// From now on, the thread is made when `what` happens.
fn wait_for(what: u8) {
    // SAFETY: getpid has no preconditions.
    WAITING_PID.store(unsafe { libc::getpid() }, Relaxed);
    WAITING.store(what, Release);
}

/// In a forked child (`requests` has let the parent's file go): no thread until the child
/// allocates or makes one of its own, so that a child that checks it is alone, or unshares,
/// first finds itself so.
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
    JOINED_FOR_FORK.store(false, Relaxed);
    if !EXITING.load(Relaxed) {
        wait_for(ON_ALLOCATION);
    }
}

/// The program allocated a block, the `seq`th event: whether that makes the thread now. One
/// load while nothing is waited for.
#[inline(always)]
pub(crate) fn waits_for_allocation(seq: u64) -> bool {
    match WAITING.load(Relaxed) {
        ON_ALLOCATION => true,
        // The clock read once in 1024 allocations.
        ON_DUE_ALLOCATION => seq.is_multiple_of(1024) && now_ms() >= DUE_MS.load(Relaxed),
        ON_ALLOCATION_AFTER => now_ms() >= DUE_MS.load(Relaxed),
        _ => false,
    }
}

/// The program made a thread of its own: the process is not single-threaded any more, and a
/// thread waited for is made now.
pub(crate) fn program_made_a_thread() {
    if WAITING.load(Relaxed) != NOT_WAITING {
        made_on_need();
    }
}

/// Makes the thread waited for, in the process that waits for it (module doc), unless the
/// exit report has begun. A credential change under way makes it when it ends.
#[cold]
pub(crate) fn made_on_need() {
    // SAFETY: getpid has no preconditions.
    if WAITING_PID.load(Relaxed) != unsafe { libc::getpid() } || EXITING.load(Relaxed) {
        return;
    }
    let mut thread = THREAD.lock();
    // Taken under the lock: one maker; the thread's own `pthread_create` finds nothing left
    // to wait for.
    if WAITING.swap(NOT_WAITING, AcqRel) == NOT_WAITING {
        return;
    }
    let listening = requests::open();
    if config::PROFILE_INTERVAL_MS.load(Relaxed) == 0
        && config::SNAPSHOT_SIGNAL.load(Relaxed) == 0
        && !listening
    {
        return;
    }
    if thread.changes != 0 {
        thread.stopped = true;
        return;
    }
    thread.running = make_thread();
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
    WAITING.store(NOT_WAITING, Relaxed);
    let running = THREAD.lock().running.take();
    if let Some(t) = running {
        end(t);
    }
}

/// The program's last thread is ending (`last_thread`): the thread is joined first, so that
/// glibc finds no thread left and ends the process, and none is made any more.
pub(crate) fn last_thread_leaves() {
    WAITING.store(NOT_WAITING, Relaxed);
    let running = THREAD.lock().running.take();
    if let Some(t) = running {
        end(t);
    }
}

/// In the fork's prepare handler of a CPython with no other thread: the thread is joined
/// unless it writes a report (module doc).
pub(crate) fn before_fork() {
    if WRITING.load(Acquire) {
        return;
    }
    let mut thread = THREAD.lock();
    if thread.changes != 0 {
        return;
    }
    if let Some(t) = thread.running.take() {
        end(t);
        requests::pause();
        JOINED_FOR_FORK.store(true, Relaxed);
    }
}

/// In the fork's parent handler: a thread joined for the fork is made again at the first
/// allocation [`AFTER_FORK_MS`] from now, or when the program makes a thread.
pub(crate) fn after_fork_in_parent() {
    if JOINED_FOR_FORK.swap(false, Relaxed) {
        DUE_MS.store(now_ms() + AFTER_FORK_MS, Relaxed);
        wait_for(ON_ALLOCATION_AFTER);
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

/// The process exits without an exit report: no thread is made any more.
pub(crate) fn wait_no_more() {
    WAITING.store(NOT_WAITING, Relaxed);
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
    WRITING.store(true, Release);
    let printing = printing_within_a_second();
    report::write(kind, None, printing.as_ref(), None);
    WRITING.store(false, Release);
}

fn now_ms() -> u64 {
    crate::clock::monotonic_ns() / 1_000_000
}
