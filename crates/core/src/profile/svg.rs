//! A report's flame graph: `X.svg` drawn from the report's `X.folded` by the `mem-trace`
//! binary that sits beside the library (`mem-trace flamegraph --from-folded X.folded -o X.svg`),
//! run as a child process the program cannot see.
//!
//! The drawing is not done here: the renderer (`inferno`) is a command-line dependency and must
//! not be linked into the preloaded library (docs/ARCHITECTURE.md). The renderer must not be a
//! child the program can see: a `SIGCHLD` it did not expect, or a `wait(-1)` of its own that
//! reaps our child and takes its status (or that it counts as one of its own), changes what the
//! program does. So it runs two levels down (docs/FINDINGS.md, "A child the traced program
//! cannot see"):
//!
//! - a helper, made with `clone(CLONE_VM | CLONE_VFORK)` and exit signal 0, that never calls
//!   `execve`: a child with a non-`SIGCHLD` exit signal sends the program no `SIGCHLD` and is
//!   invisible to `wait`/`waitpid` without `__WALL`/`__WCLONE`. We wait for it by pid with
//!   `__WALL`. (The renderer itself cannot be that child: `execve` resets a process's exit
//!   signal to `SIGCHLD`.)
//! - the renderer, the helper's child (`clone(CLONE_VM | CLONE_VFORK)` then `execve`, as
//!   `vfork` does): its `SIGCHLD` and its status go to the helper, which waits for it, kills it
//!   past [`LIMIT_MS`], and exits with its status.
//!
//! With `CLONE_VM | CLONE_VFORK` nothing is copied and each parent is suspended until its
//! child has exec'd or exited, so both children use the caller's buffers. Every signal is
//! blocked around the first `clone` and stays blocked in the helper (a handler of the
//! program's must not run in it: it shares the program's memory); the renderer, after its
//! `execve`, unblocks them itself. Its environment is empty: no `LD_PRELOAD` (it is not traced)
//! and no `MEM_TRACE_*`.
//!
//! Nothing here allocates or takes a lock: the paths and arguments are fixed buffers on this
//! stack, the children's stacks are an anonymous mapping, and the binary's directory comes from
//! the unwinder's module list (not `dladdr`, which takes the loader's lock). If the binary is not
//! there, the `.folded` file stays and one note on stderr says how to draw it later.

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
/// Each child's stack: the helper waits and sleeps, the renderer calls `execve` (or `_exit`).
const CHILD_STACK: usize = 32 << 10;

/// Set once the missing binary has been reported.
static SAID_MISSING: AtomicBool = AtomicBool::new(false);

/// Draws `svg` from `folded`, whose counts are `by` (`live`, `allocated`, `blocks`), under
/// `title`. Returns whether the SVG was drawn.
pub(crate) fn draw(folded: &PathBuf, svg: &PathBuf, by: &CStr, title: &PathBuf) -> bool {
    let Some(binary) = binary_path() else {
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
    let status = run(&mut Job {
        path: binary.as_c(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        renderer_stack: core::ptr::null_mut(),
    });
    let why = match status {
        Some(0) => return true,
        Some(TIMED_OUT) => "it took too long and was stopped",
        Some(EXEC_FAILED) => "it could not be started",
        Some(_) => "it failed",
        None => "no process could be made for it",
    };
    let _ = writeln!(
        Out::stderr(),
        "mem-trace: no flame graph {}: {why}",
        svg.as_str()
    );
    false
}

/// `mem-trace` in the directory of the library this code is in.
fn binary_path() -> Option<PathBuf> {
    let here = draw as *const () as usize as u64;
    let set = modules::snapshot()?;
    let module = set.find(here)?;
    let path = core::str::from_utf8(&module.path).ok()?;
    let dir = &path[..path.rfind('/')?];
    let mut p = PathBuf::default();
    write!(p, "{dir}/{BINARY}\0").ok()?;
    Some(p)
}

/// The helper's exit status when the renderer did not end within [`LIMIT_MS`].
const TIMED_OUT: i32 = 124;
/// The helper's exit status when the renderer could not be made.
const NO_RENDERER: i32 = 125;
/// The renderer's exit status when `execve` failed.
const EXEC_FAILED: i32 = 127;

/// What the helper and the renderer need; on the caller's stack, which both share.
struct Job {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// The top of the renderer's stack (in the same mapping as the helper's).
    renderer_stack: *mut u8,
}

/// Runs the helper (which runs the renderer) and waits for it; its exit status, or `None`.
fn run(job: &mut Job) -> Option<i32> {
    // SAFETY: a private anonymous mapping, unmapped below once neither child uses it.
    let stacks = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            2 * CHILD_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stacks == libc::MAP_FAILED {
        return None;
    }
    let base = stacks as *mut u8;
    // Stacks grow down: each child starts at the top of its half.
    // SAFETY: both offsets are within the mapping (its end is one past it).
    let (helper_top, renderer_top) = unsafe { (base.add(2 * CHILD_STACK), base.add(CHILD_STACK)) };
    job.renderer_stack = renderer_top;
    // SAFETY: the sigsets are filled before use and the previous mask is restored. The helper
    // runs on its own stack with `job`, which outlives it: CLONE_VFORK returns only once the
    // helper has exited (it never calls execve). Exit signal 0 (the flags' low byte): no
    // SIGCHLD for the program, and invisible to its wait(-1).
    let pid = unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            helper,
            helper_top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK,
            (job as *mut Job).cast(),
        );
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        pid
    };
    let mut status = 0;
    // SAFETY: waits for our own child (__WALL: its exit signal is not SIGCHLD). It has already
    // exited (CLONE_VFORK), so this does not block.
    let reaped = pid > 0 && unsafe { libc::waitpid(pid, &mut status, libc::__WALL) } == pid;
    // SAFETY: neither child is on these stacks any more: the helper has exited, and the
    // renderer left for its own address space (or exited) before the helper went on.
    unsafe { libc::munmap(stacks, 2 * CHILD_STACK) };
    (reaped && libc::WIFEXITED(status)).then(|| libc::WEXITSTATUS(status))
}

/// The helper: starts the renderer as its own child, waits for it at most [`LIMIT_MS`], and
/// exits with its status. Every signal stays blocked here.
extern "C" fn helper(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Job` of `run`'s caller, suspended until this helper exits. The
    // renderer gets its own stack (the other half of the mapping); CLONE_VFORK returns once it
    // has exec'd, after which it shares nothing with us. The rest are system calls on our own
    // child.
    unsafe {
        let job = &*(arg as *const Job);
        let pid = libc::clone(
            renderer,
            job.renderer_stack.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            arg,
        );
        if pid < 0 {
            return NO_RENDERER;
        }
        let mut status = 0;
        let mut waited = 0;
        while libc::waitpid(pid, &mut status, libc::WNOHANG) == 0 {
            if waited >= LIMIT_MS {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
                return TIMED_OUT;
            }
            sleep_ms(5);
            waited += 5;
        }
        if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            128 + libc::WTERMSIG(status)
        }
    }
}

/// The renderer, until its `execve`.
extern "C" fn renderer(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Job`, alive while the helper is suspended (CLONE_VFORK) until this
    // child has called execve or _exit. Both are system calls that touch nothing shared.
    unsafe {
        let job = &*(arg as *const Job);
        libc::execve(job.path, job.argv, job.envp);
        libc::_exit(EXEC_FAILED)
    }
}

fn sleep_ms(ms: u64) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: (ms * 1_000_000) as libc::c_long,
    };
    // SAFETY: sleeps; `ts` is a valid duration.
    unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
}
