//! Report requests from `mem-trace run` (`MEM_TRACE_REQUESTS=1`): each traced process keeps a
//! small file of its own in the report directory, `DIR/mem-trace.<pid>.request`, mapped
//! shared, on whose first word the profiler thread sleeps (a futex: `run` maps the same file
//! and wakes it).
//!
//! `run`, told to stop (SIGTERM, SIGINT), sets the request word of every file there and wakes
//! each process's thread, which asks it for its final report: a full report with the leak
//! check, written by the profiler thread (a normal thread: the program may be anywhere, inside
//! `malloc` too, and nothing runs in a signal handler). The process removes its file when that
//! report is written, and at exit once its exit report is: `run` waits for the files to go,
//! briefly, before it passes the signal on, and a file left behind names a process that ended
//! with no exit report (killed, or `_exit`).
//!
//! No signal is sent for it: a signal's disposition is the program's, and one it handles, or
//! whose default is to die, would change what it does. No descriptor is kept for it either
//! (the file is closed once mapped): a descriptor of ours is one the program can list in
//! `/proc/self/fd`, close (`closefrom(3)`, daemons do) or `dup2` another file onto, after
//! which the thread polled, read and at exit closed a descriptor of the program's. A mapping
//! stays where it is whatever the program does with its descriptors. A forked child maps a
//! file of its own (the inherited mapping is the parent's); an `exec`'d program maps the one
//! of its pid again. Either does so when its thread is made (`reporter`): a process with no
//! thread to answer has no file, and `run` does not wait for it.
//!
//! The file holds two native-endian `u32`: [`WAKE`] (the futex word, a counter every waker
//! increments) and [`ASKED`] (non-zero: a final report is asked for).

use crate::config;
use crate::out::Out;
use crate::profile::output::PathBuf;
use core::fmt::Write;
use core::sync::atomic::{
    AtomicPtr, AtomicU32,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// The word offsets in the file (in `u32`s), and its size: `mem-trace run` writes the same.
pub(crate) const WAKE: usize = 0;
pub(crate) const ASKED: usize = 1;
const FILE_SIZE: usize = 8;

/// The mapped file (null: none).
static MAPPED: AtomicPtr<AtomicU32> = AtomicPtr::new(core::ptr::null_mut());
/// The mapping of a file let go by [`pause`], kept for the next [`open`] to map over.
static PAUSED: AtomicPtr<AtomicU32> = AtomicPtr::new(core::ptr::null_mut());

/// The file's path for this process.
fn path() -> Option<PathBuf> {
    let dir = config::OUT_DIR.get()?;
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut p = PathBuf::default();
    write!(p, "{dir}/mem-trace.{pid}.request\0").ok()?;
    Some(p)
}

/// Whether requests are on (`MEM_TRACE_REQUESTS` with `MEM_TRACE_OUT`).
pub(crate) fn enabled() -> bool {
    config::REQUESTS.load(Relaxed)
}

/// Makes and maps this process's file, if requests are on; whether it listens. After a
/// [`pause`], the new file is mapped in place of the old one, at the same address: no page is
/// left behind per fork, and a waker never finds the word unmapped.
pub(crate) fn open() -> bool {
    if !enabled() {
        return false;
    }
    let Some(path) = path() else {
        return false;
    };
    // An existing file is reused only if it is a regular file of ours (this pid's before an
    // `exec`), never through a symlink.
    // SAFETY: opens a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            path.as_c(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o600,
        )
    };
    if fd < 0 {
        return said_not(&path);
    }
    // SAFETY: an all-zero stat is a valid output buffer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat writes into `st`.
    let ours = unsafe { libc::fstat(fd, &mut st) } == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        // SAFETY: geteuid has no preconditions.
        && st.st_uid == unsafe { libc::geteuid() };
    // Zeroed, at its size: a request left from before an `exec` is not one for this program.
    // SAFETY: truncates the file just opened.
    let sized = ours
        && unsafe { libc::ftruncate(fd, 0) } == 0
        // SAFETY: as above.
        && unsafe { libc::ftruncate(fd, FILE_SIZE as libc::off_t) } == 0;
    let paused = PAUSED.swap(core::ptr::null_mut(), Relaxed);
    let (at, fixed, asked) = if paused.is_null() {
        (core::ptr::null_mut(), 0, 0)
    } else {
        // SAFETY: PAUSED is a mapping of FILE_SIZE bytes of ours (`pause`), still mapped.
        let asked = unsafe { (*paused.add(ASKED)).load(Acquire) };
        (paused.cast(), libc::MAP_FIXED, asked)
    };
    let map = if sized {
        // SAFETY: maps the file just opened and sized, either where the kernel chooses or in
        // place of our own earlier mapping of the same size (`pause`), which nothing else
        // uses: nothing of the program's is replaced.
        unsafe {
            libc::mmap(
                at,
                FILE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | fixed,
                fd,
                0,
            )
        }
    } else {
        libc::MAP_FAILED
    };
    // SAFETY: the descriptor was opened above; the mapping, if any, outlives it.
    unsafe { libc::close(fd) };
    if map == libc::MAP_FAILED {
        return said_not(&path);
    }
    let map: *mut AtomicU32 = map.cast();
    if asked != 0 {
        // SAFETY: the mapping just made, FILE_SIZE bytes.
        unsafe { (*map.add(ASKED)).store(asked, Release) };
    }
    MAPPED.store(map, Relaxed);
    true
}

fn said_not(path: &PathBuf) -> bool {
    let _ = writeln!(
        Out::stderr(),
        "mem-trace: no final report on request: cannot make {}: {}",
        path.as_str(),
        std::io::Error::last_os_error()
    );
    false
}

/// The mapped file's words, if any.
fn words() -> Option<&'static [AtomicU32; 2]> {
    let p = MAPPED.load(Relaxed);
    // SAFETY: a non-null MAPPED is a mapping of FILE_SIZE bytes, page-aligned, unmapped only
    // after MAPPED is cleared (`done`, `forked`), by the thread that sleeps on it or once the
    // thread is gone.
    (!p.is_null()).then(|| unsafe { &*p.cast::<[AtomicU32; 2]>() })
}

/// The word `run` wakes the profiler thread on, if requests are on; wakers of the thread's
/// own (the snapshot signal, a stop) use it too, so that the thread sleeps on one word.
pub(crate) fn wake_word() -> Option<&'static AtomicU32> {
    words().map(|w| &w[WAKE])
}

/// Takes the request, if one came.
pub(crate) fn take() -> bool {
    words().is_some_and(|w| w[ASKED].swap(0, AcqRel) != 0)
}

/// The final report is written (or the exit report): the file goes, which tells `run` so.
pub(crate) fn done() {
    let Some(p) = let_go() else {
        return;
    };
    // A thread asleep on the word wakes and finds MAPPED cleared; the pages stay mapped (8
    // bytes, one page) so that no sleeper or waker ever touches an unmapped word.
    // SAFETY: `p` is the mapping's first word, still mapped.
    let word = unsafe { &*p };
    wake_on(word);
}

/// The profiler thread is gone for a while (a fork): the file goes, so that `run` does not
/// wait on a process with no thread to answer; its mapping stays for [`open`] to reuse. A
/// request that came just before is kept, and answered when the thread is back.
pub(crate) fn pause() {
    if let Some(p) = let_go() {
        PAUSED.store(p, Relaxed);
    }
}

/// The file removed and its mapping no longer listened on; the mapping, if there was one.
fn let_go() -> Option<*mut AtomicU32> {
    let p = MAPPED.swap(core::ptr::null_mut(), Relaxed);
    if p.is_null() {
        return None;
    }
    if let Some(path) = path() {
        // SAFETY: removes our own file by its NUL-terminated path.
        unsafe { libc::unlink(path.as_c()) };
    }
    Some(p)
}

/// In a forked child: the inherited mapping is the parent's file; the child makes its own
/// with its thread (`reporter`), if it ever has one.
pub(crate) fn forked() {
    for mapped in [&MAPPED, &PAUSED] {
        let old = mapped.swap(core::ptr::null_mut(), Relaxed);
        if !old.is_null() {
            // SAFETY: the child's copy of the parent's mapping, which nothing in the child
            // uses any more (its only thread is this one).
            unsafe { libc::munmap(old.cast(), FILE_SIZE) };
        }
    }
}

/// Async-signal-safe: wakes whoever sleeps on `word` (shared, possibly: no
/// `FUTEX_PRIVATE_FLAG`).
pub(crate) fn wake_on(word: &AtomicU32) {
    word.fetch_add(1, core::sync::atomic::Ordering::Release);
    // SAFETY: wakes the sleepers on a word that stays mapped; no memory is written.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}
