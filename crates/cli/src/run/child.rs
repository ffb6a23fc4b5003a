//! The program as `mem-trace run` runs it: found as a shell would find it, started with the
//! preload, waited for, and its end passed on as our own.
//!
//! While it runs we ignore SIGQUIT, as `time` and `env`-like wrappers do: the terminal sends
//! it to the whole foreground process group, and it is the program's to handle. It is
//! ignored only after the program has started, so that it does not inherit the ignoring
//! across `exec`. SIGTERM and SIGINT are taken by `stop`: the program is asked for its final
//! report, then given the signal (a Ctrl-C, which reached the program already, is left to it).
//!
//! Its death by a signal is passed on by dying of the same signal: the default disposition is
//! restored and the signal raised on ourselves, so a shell reports the same death
//! ("Aborted", status 128+6). Before that we make ourselves non-dumpable with a zero core
//! limit: the core file the program may have left must not be overwritten by ours.

use crate::error::{Error, Result};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

/// The shell's status for a program that was found but cannot run.
const CANNOT_RUN: u8 = 126;
/// The shell's status for a program that is not found.
const NOT_FOUND: u8 = 127;

/// `program` as `execvp` finds it: a name with a `/` as it is, else the first executable file
/// of that name in `$PATH`. `who` (`run`, `gdb`) begins the error's line.
pub fn resolve(who: &str, program: &OsStr) -> Result<PathBuf> {
    let shown = Path::new(program).display();
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        if !path.exists() {
            return Err(Error::with_code(
                format!("{who}: {shown}: no such file"),
                NOT_FOUND,
            ));
        }
        return Ok(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            Error::with_code(
                format!(
                    "{who}: {shown}: command not found (not in PATH; give its path, e.g. ./{shown})"
                ),
                NOT_FOUND,
            )
        })
}

/// Why `path` could not be run, in the user's terms rather than `execve`'s error alone.
fn cannot_run(path: &Path, e: &std::io::Error) -> String {
    let shown = path.display();
    match e.raw_os_error() {
        Some(libc::EACCES) if path.is_dir() => format!("cannot execute {shown}: it is a directory"),
        Some(libc::EACCES) if !is_executable(path) => {
            format!("cannot execute {shown}: it is not an executable file (no execute permission)")
        }
        Some(libc::EACCES) => format!("cannot execute {shown}: permission denied"),
        Some(libc::ENOEXEC) => format!(
            "cannot execute {shown}: not a program this system can run (no #! line, not an ELF file)"
        ),
        Some(libc::ENOENT) => format!(
            "cannot execute {shown}: it or the interpreter its #! line names does not exist"
        ),
        _ => format!("cannot execute {shown}: {e}"),
    }
}

fn is_executable(p: &Path) -> bool {
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs `path` (named `name` in its `argv[0]`) with `args` and the environment changes `env`,
/// its reports going to `dir`; its status once it has ended.
pub fn run(
    name: &OsStr,
    path: &Path,
    args: &[OsString],
    env: &[(&str, OsString)],
    dir: &Path,
    started: impl FnOnce(u32),
) -> Result<ExitStatus> {
    let mut cmd = Command::new(path);
    cmd.arg0(name).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    // Blocked before the spawn, so that none is lost before the thread that takes them
    // runs; every thread made from here on (the pusher's too) inherits the mask, the program
    // does not. They stay blocked to the end: `pass_on` unblocks the one it passes on.
    let mask = super::stop::block();
    let unblocked = mask;
    // SAFETY: between fork and exec only pthread_sigmask runs, which is async-signal-safe and
    // touches no memory of the parent's.
    unsafe {
        cmd.pre_exec(move || {
            // The program starts with the mask we had, not the one that keeps the signals for
            // our thread: a SIGTERM must reach it.
            libc::pthread_sigmask(libc::SIG_SETMASK, &unblocked, core::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        super::stop::unblock(&mask);
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => NOT_FOUND,
            _ => CANNOT_RUN,
        };
        Error::with_code(format!("run: {}", cannot_run(path, &e)), code)
    })?;
    super::stop::watch(child.id(), dir.to_path_buf());
    started(child.id());
    let quit = ignore(libc::SIGQUIT);
    let status = child.wait();
    restore(libc::SIGQUIT, quit);
    status.map_err(|e| Error::new(format!("run: waiting for {}: {e}", path.display())))
}

/// Ignores `sig`; returns its previous disposition.
fn ignore(sig: i32) -> libc::sighandler_t {
    // SAFETY: sets a standard disposition; no handler of ours runs.
    unsafe { libc::signal(sig, libc::SIG_IGN) }
}

fn restore(sig: i32, old: libc::sighandler_t) {
    if old != libc::SIG_ERR {
        // SAFETY: puts back the disposition `ignore` returned.
        unsafe { libc::signal(sig, old) };
    }
}

/// Our exit status for the program's `status`; a death by a signal is passed on by dying of
/// it here (this function then does not return).
pub fn pass_on(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return code as u8;
    }
    let Some(sig) = status.signal() else {
        return 1;
    };
    // SAFETY: each call changes only this process's own state: no core of ours (not to
    // overwrite the program's), the signal's default action, the signal unblocked, then raised.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, core::ptr::null_mut());
        libc::raise(sig);
    }
    // A signal whose default is not to die (the program died of it by its own doing): the
    // shell's convention.
    (128 + sig) as u8
}
