//! A report's flame graph: `X.svg` drawn from the report's `X.folded` by the `mem-trace`
//! binary that sits beside the library (`mem-trace flamegraph --from-folded X.folded -o X.svg`),
//! run as a child process the program cannot see.
//!
//! The drawing is not done here: the renderer (`inferno`) is a command-line dependency and must
//! not be linked into the preloaded library (docs/ARCHITECTURE.md). The child is made the way
//! `posix_spawn` makes one, but without the two things that would let the program notice it:
//!
//! - `clone` with `CLONE_VM | CLONE_VFORK` and exit signal 0: no `SIGCHLD` reaches the
//!   program when it ends, and a `wait(-1)` or `waitpid(-1, ..)` of the program's (which waits
//!   for children with exit signal `SIGCHLD` only, unless given `__WALL`/`__WCLONE`) cannot
//!   reap it and take its status away from us; we wait for it by pid with `__WALL`. With
//!   `CLONE_VM | CLONE_VFORK` nothing is copied and the caller is suspended until the child
//!   has called `execve`, so the child may use the caller's buffers.
//! - an empty environment: no `LD_PRELOAD` (the renderer is not traced) and no `MEM_TRACE_*`.
//!
//! Every signal is blocked around the `clone`, so that no handler of the program's runs in the
//! child while it shares the program's memory; the renderer unblocks them when it starts.
//!
//! Nothing here allocates or takes a lock: the paths and arguments are fixed buffers on this
//! stack, the child's stack is an anonymous mapping of its own, and the binary's directory comes
//! from the unwinder's module list (not `dladdr`, which takes the loader's lock). The wait is
//! bounded: a renderer still running after [`LIMIT_MS`] is killed. If the binary is not there,
//! the `.folded` file stays and one note on stderr says how to draw it later.

use crate::capture::modules;
use crate::out::Out;
use crate::profile::output::PathBuf;
use core::ffi::CStr;
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// The renderer's name, in the library's directory.
const BINARY: &str = "mem-trace";
/// How long a renderer may take before it is killed (a 10,000-stack graph takes well under a
/// second; a hang must not hold the program's exit).
const LIMIT_MS: u64 = 10_000;
/// The child's stack: it only calls `execve`, or `_exit` when that fails.
const CHILD_STACK: usize = 64 << 10;

/// Set once the missing binary has been reported.
static SAID_MISSING: AtomicBool = AtomicBool::new(false);

/// Draws `svg` from `folded`, whose counts are `by` (`live`, `allocated`, `blocks`), under
/// `title`. Returns whether the SVG was drawn.
pub(crate) fn draw(folded: &PathBuf, svg: &PathBuf, by: &CStr, title: &PathBuf) -> bool {
    let Some(binary) = renderer() else {
        return false;
    };
    // SAFETY: access reads a NUL-terminated path.
    if unsafe { libc::access(binary.as_c(), libc::X_OK) } != 0 {
        if !SAID_MISSING.swap(true, Relaxed) {
            let _ = writeln!(
                Out::stderr(),
                "mem-trace: no flame graphs: {} is not there to draw them (the .folded files \
                 stay: `mem-trace flamegraph --from-folded FILE.folded -o FILE.svg` draws one)",
                binary.as_str()
            );
        }
        return false;
    }
    let argv: [*const libc::c_char; 11] = [
        binary.as_c(),
        c"flamegraph".as_ptr(),
        c"--from-folded".as_ptr(),
        folded.as_c(),
        c"-o".as_ptr(),
        svg.as_c(),
        c"--by".as_ptr(),
        by.as_ptr(),
        c"--title".as_ptr(),
        title.as_c(),
        core::ptr::null(),
    ];
    let envp: [*const libc::c_char; 1] = [core::ptr::null()];
    let exec = Exec {
        path: binary.as_c(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
    };
    match spawn(&exec) {
        Some(pid) => wait(pid, svg),
        None => false,
    }
}

/// `mem-trace` in the directory of the library this code is in.
fn renderer() -> Option<PathBuf> {
    let here = draw as *const () as usize as u64;
    let set = modules::snapshot()?;
    let module = set.find(here)?;
    let path = core::str::from_utf8(&module.path).ok()?;
    let dir = &path[..path.rfind('/')?];
    let mut p = PathBuf::default();
    write!(p, "{dir}/{BINARY}\0").ok()?;
    Some(p)
}

/// What the child executes; it lives on the caller's stack, which the child shares.
struct Exec {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
}

extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Exec` of `spawn`'s caller, suspended (CLONE_VFORK) until this
    // child has called execve or _exit, so it and the buffers it points to are alive. execve
    // and _exit are system calls that touch nothing shared.
    unsafe {
        let e = &*(arg as *const Exec);
        libc::execve(e.path, e.argv, e.envp);
        libc::_exit(127)
    }
}

/// Starts the child; its pid, or `None` (said on stderr).
fn spawn(exec: &Exec) -> Option<libc::pid_t> {
    // SAFETY: a private anonymous mapping, unmapped below once the child no longer uses it.
    let stack = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            CHILD_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the sigsets are filled before use and the previous mask is restored. `child`
    // runs on its own stack (the mapping's top: stacks grow down) with `exec`, which outlives
    // it: CLONE_VFORK returns only after its execve or _exit. Exit signal 0 (the low byte of
    // the flags): no SIGCHLD for the program.
    let pid = unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let top = (stack as *mut u8).add(CHILD_STACK);
        let pid = libc::clone(
            child,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK,
            exec as *const Exec as *mut libc::c_void,
        );
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        pid
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: the child has left this stack (it has exec'd or exited: CLONE_VFORK).
    unsafe { libc::munmap(stack, CHILD_STACK) };
    if pid < 0 {
        let _ = writeln!(Out::stderr(), "mem-trace: no flame graph: clone: {err}");
        return None;
    }
    Some(pid)
}

/// Waits for the child `pid` at most [`LIMIT_MS`]; whether it drew `svg`.
fn wait(pid: libc::pid_t, svg: &PathBuf) -> bool {
    let mut status = 0;
    let mut waited = 0;
    loop {
        // SAFETY: waits for our own child; __WALL because its exit signal is not SIGCHLD.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == pid {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
        if waited >= LIMIT_MS {
            // SAFETY: our own child, not yet reaped, so the pid is still its.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, libc::__WALL);
            }
            let _ = writeln!(
                Out::stderr(),
                "mem-trace: drawing {} took over {} s: stopped",
                svg.as_str(),
                LIMIT_MS / 1000
            );
            return false;
        }
        sleep_ms(5);
        waited += 5;
    }
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

fn sleep_ms(ms: u64) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: (ms * 1_000_000) as libc::c_long,
    };
    // SAFETY: sleeps; `ts` is a valid duration.
    unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
}
