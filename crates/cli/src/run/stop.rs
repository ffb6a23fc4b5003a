//! `mem-trace run` told to stop (SIGTERM, or SIGINT sent to it by a process): every traced
//! process of the run is asked for its final report, which it writes from its profiler
//! thread (crates/core/src/profile/requests.rs), and once they are written, or after
//! [`WAIT`], the signal is passed on to the program. The program then ends as the signal
//! makes it, and `run` with it (a death by SIGTERM: status 143 in the shell).
//!
//! The signals are blocked in every thread of ours and taken by one thread with
//! `sigwaitinfo`: no handler runs, nothing is done in signal context. The program does not
//! inherit the mask (`child` puts the previous one back between `fork` and `exec`).
//!
//! A SIGINT the terminal sent (Ctrl-C: `si_code` `SI_KERNEL`) went to the whole foreground
//! process group, the program included: it is the program's to handle, and is not passed on a
//! second time. The program is signalled through a pidfd, so that a signal that comes as it
//! ends never reaches another process that took its pid.
//!
//! Each traced process keeps `DIR/mem-trace.<pid>.request`, a small file it maps shared and
//! whose first word its profiler thread sleeps on (a futex), and removes it once its final or
//! exit report is written: those left when the run ends name the processes that ended
//! without an exit report ([`unfinished`]). A request sets the file's second word and wakes
//! the first: no descriptor is kept open in the program for it.
//!
//! A signal sent to the whole process group (systemd's default `KillMode=control-group`,
//! `kill -TERM -PGID`) reaches the program at the same moment as `run`: a program that does
//! not handle it dies at once, before any report can be asked for. That is not worked around:
//! the library would need a SIGTERM handler of its own in the program, which the program can
//! see (`sigaction` no longer says `SIG_DFL`; Python's `signal.getsignal` then returns `None`,
//! which code that saves and restores the handler passes back and fails on). `run` notes when
//! the program had already ended when it was to pass the signal on ([`ended_first`]), and the
//! summary says why the report is missing and how to send the signal so that it is written.

use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU32,
    Ordering::{Acquire, Relaxed, Release},
};

use crate::liveness::alive;
use std::ffi::OsStr;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the final reports may take before the signal is passed on anyway: a report with
/// its leak check takes well under a second for most programs.
pub const WAIT: Duration = Duration::from_secs(5);
/// The signals that stop `run`.
const SIGNALS: [i32; 2] = [libc::SIGTERM, libc::SIGINT];

/// The signals blocked in this thread (and the threads it makes from now on); the mask to
/// put back.
pub fn block() -> libc::sigset_t {
    // SAFETY: the sets are filled by sigemptyset/sigaddset before use; only this thread's
    // mask changes.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in SIGNALS {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

/// Puts back the mask [`block`] returned (in this thread).
pub fn unblock(old: &libc::sigset_t) {
    // SAFETY: `old` is a mask pthread_sigmask returned.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, core::ptr::null_mut()) };
}

/// The stopping signal `run` was told to stop by, when the program had already ended by the
/// time `run` was to pass it on (0: none).
static ENDED_FIRST: AtomicI32 = AtomicI32::new(0);
/// Set while the thread that took a stopping signal has not yet decided [`ENDED_FIRST`].
static HANDLING: AtomicBool = AtomicBool::new(false);

/// The signal `run` was told to stop by, if the program ended before `run` passed it on: it
/// reached the program directly too (a Ctrl-C at the terminal not counted: it is the
/// program's).
pub fn ended_first() -> Option<i32> {
    // The program's death may be seen here while the signal that caused it is being taken.
    let end = Instant::now() + Duration::from_secs(1);
    while HANDLING.load(Acquire) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Some(sig) = Some(ENDED_FIRST.load(Relaxed)).filter(|&s| s != 0) {
        return Some(sig);
    }
    // Sent to the group, the signal may not have been taken yet when the program's death is:
    // a SIGTERM still pending was sent to `run` (a SIGINT may be the terminal's).
    // SAFETY: sigpending writes the pending set into a zeroed local.
    let pending = unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigpending(&mut set) == 0 && libc::sigismember(&set, libc::SIGTERM) == 1
    };
    pending.then_some(libc::SIGTERM)
}

/// Starts the thread that takes the signals for the program `pid`, whose reports go to
/// `dir`. It runs until the process ends.
pub fn watch(pid: u32, dir: PathBuf) {
    // SAFETY: pidfd_open on our own child, not yet reaped (the caller waits for it after).
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as i32;
    std::thread::spawn(move || loop {
        let Some((sig, from_terminal)) = next_signal(None) else {
            continue;
        };
        if from_terminal {
            continue;
        }
        HANDLING.store(true, Release);
        let asked = request_final_reports(&dir);
        if !asked.is_empty() {
            eprintln!(
                "mem-trace: run: {}: asking {} for {} final report before passing it on",
                signal_name(sig),
                plural(asked.len(), "process", "processes"),
                if asked.len() == 1 { "its" } else { "their" },
            );
            wait_for_reports(&asked);
        }
        if !alive(pid) {
            let _ = ENDED_FIRST.compare_exchange(0, sig, Relaxed, Relaxed);
        }
        HANDLING.store(false, Release);
        send(pidfd, pid, sig);
    });
}

/// `1 ONE`, `N MANY`.
pub(super) fn plural(n: usize, one: &str, many: &str) -> String {
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

/// SIGTERM's and SIGINT's names.
fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "a signal",
    }
}

/// The next stopping signal, and whether the terminal sent it, waiting at most `timeout`
/// (`None`: for ever); `None` when none came.
fn next_signal(timeout: Option<Duration>) -> Option<(i32, bool)> {
    // SAFETY: the set is filled before use; the siginfo is written by the kernel into a
    // zeroed local.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in SIGNALS {
            libc::sigaddset(&mut set, sig);
        }
        let mut info: libc::siginfo_t = core::mem::zeroed();
        let sig = match timeout {
            None => libc::sigwaitinfo(&set, &mut info),
            Some(t) => {
                let ts = libc::timespec {
                    tv_sec: t.as_secs() as libc::time_t,
                    tv_nsec: t.subsec_nanos() as libc::c_long,
                };
                libc::sigtimedwait(&set, &mut info, &ts)
            }
        };
        (sig > 0).then_some((sig, info.si_code == libc::SI_KERNEL))
    }
}

/// Asks every process listening in `dir` for its final report; the requests made.
fn request_final_reports(dir: &Path) -> Vec<PathBuf> {
    listening(dir)
        .into_iter()
        .filter(|(_, path)| request(path))
        .map(|(_, path)| path)
        .collect()
}

/// The request file's words (in `u32`s) and size: crates/core/src/profile/requests.rs.
const WAKE: usize = 0;
const ASKED: usize = 1;
const FILE_SIZE: usize = 8;

/// Asks the process of the request file at `path` for its final report: only a regular file
/// of the right size, never through a symlink, and only if its process is still there.
fn request(path: &Path) -> bool {
    if !pid_of(path).is_some_and(alive) {
        return false;
    }
    let Ok(file) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    if !file
        .metadata()
        .is_ok_and(|m| m.is_file() && m.len() == FILE_SIZE as u64)
    {
        return false;
    }
    // SAFETY: maps the regular file just checked to hold FILE_SIZE bytes; no address given.
    let map = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            FILE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: the mapping is FILE_SIZE bytes, page-aligned: two u32 words, used atomically
    // on both sides; unmapped below, after the last use.
    let words = unsafe { &*map.cast::<[AtomicU32; 2]>() };
    words[ASKED].store(1, Release);
    words[WAKE].fetch_add(1, Release);
    // SAFETY: wakes the sleepers on the shared word (no FUTEX_PRIVATE_FLAG: another process
    // sleeps on it); then unmaps our own mapping.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            words[WAKE].as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
        );
        libc::munmap(map, FILE_SIZE);
    }
    true
}

/// Waits until every process asked has written its final report (removed its file), or has
/// gone, for at most [`WAIT`]; a second signal ends the wait.
fn wait_for_reports(asked: &[PathBuf]) {
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        let pending = asked
            .iter()
            .filter(|p| p.exists() && pid_of(p).is_some_and(alive))
            .count();
        if pending == 0 {
            return;
        }
        if next_signal(Some(Duration::from_millis(20))).is_some_and(|(_, tty)| !tty) {
            eprintln!("mem-trace: run: signalled again: not waiting for the final reports");
            return;
        }
    }
    eprintln!(
        "mem-trace: run: the final reports took more than {} s: passing the signal on",
        WAIT.as_secs()
    );
}

/// Signals the program: through its pidfd when there is one.
fn send(pidfd: i32, pid: u32, sig: i32) {
    if pidfd >= 0 {
        // SAFETY: signals the process the pidfd refers to; a process that has ended is not
        // signalled (ESRCH), whoever took its pid.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd,
                sig,
                core::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    } else {
        // SAFETY: signals our own child (no pidfd: a kernel before 5.3).
        unsafe { libc::kill(pid as libc::pid_t, sig) };
    }
}

/// The pid of `DIR/mem-trace.<pid>.request`.
fn pid_of(path: &Path) -> Option<u32> {
    request_pid(path.file_name()?)
}

fn request_pid(name: &OsStr) -> Option<u32> {
    name.to_str()?
        .strip_prefix("mem-trace.")?
        .strip_suffix(".request")?
        .parse()
        .ok()
}

/// The request files in `dir`, by pid.
fn listening(dir: &Path) -> Vec<(u32, PathBuf)> {
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((request_pid(&e.file_name())?, e.path())))
        .collect();
    found.sort();
    found
}

/// A process of the run that ended without writing its exit report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    pub pid: u32,
    /// Whether it is still running (a child the program left behind).
    pub running: bool,
}

/// The processes whose request file is still in `dir`: they ended without an exit report (or
/// still run). Their files are removed: nothing will read them.
pub fn unfinished(dir: &Path) -> Vec<Unfinished> {
    listening(dir)
        .into_iter()
        .map(|(pid, path)| {
            let running = alive(pid);
            if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file()) {
                let _ = fs::remove_file(&path);
            }
            Unfinished { pid, running }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_names() {
        assert_eq!(request_pid(OsStr::new("mem-trace.123.request")), Some(123));
        assert_eq!(request_pid(OsStr::new("mem-trace.123.1.txt")), None);
        assert_eq!(request_pid(OsStr::new("mem-trace.x.request")), None);
    }
}
