//! The `mem-trace` binary beside the library, run for a report (its flame graph, `svg`; its
//! pprof profile, `pprof`) as a child process the program cannot see.
//!
//! The work is not done here: the flame graph renderer (`inferno`) and the protobuf encoder
//! are command-line dependencies and must not be linked into the preloaded library
//! (docs/ARCHITECTURE.md). The command must not be a child the program can see: a `SIGCHLD` it
//! did not expect, or a `wait(-1)` of its own that reaps our child and takes its status (or
//! that it counts as one of its own), changes what the program does. So it runs two levels
//! down (docs/FINDINGS.md, "A child the traced program cannot see"):
//!
//! - a helper, made with `clone(CLONE_VM | CLONE_VFORK)` and exit signal 0, that never calls
//!   `execve`: a child with a non-`SIGCHLD` exit signal sends the program no `SIGCHLD` and is
//!   invisible to `wait`/`waitpid` without `__WALL`/`__WCLONE`. We wait for it by pid with
//!   `__WALL`. (The command itself cannot be that child: `execve` resets a process's exit
//!   signal to `SIGCHLD`.)
//! - the command, the helper's child (`clone(CLONE_VM | CLONE_VFORK)` then `execve`, as
//!   `vfork` does): its `SIGCHLD` and its status go to the helper, which waits for it, kills it
//!   past [`LIMIT_MS`], and exits with its status.
//!
//! With `CLONE_VM | CLONE_VFORK` nothing is copied and each parent is suspended until its
//! child has exec'd or exited, so both children use the caller's buffers. Every signal is
//! blocked around the first `clone` and stays blocked in the helper (a handler of the
//! program's must not run in it: it shares the program's memory); the command, after its
//! `execve`, unblocks them itself. Its environment is empty: no `LD_PRELOAD` (it is not traced)
//! and no `MEM_TRACE_*`.
//!
//! A command that reads this process ([`Reads::Us`]: `mem-trace pprof PID`) is its
//! grandchild, and `process_vm_readv` of an ancestor needs ptrace rights: under Yama's
//! `ptrace_scope` 1 only a process's descendants have them, unless it names a tracer with
//! `prctl(PR_SET_PTRACER)`. We name ourselves for the command's life, which lets our
//! descendants (the helper's child among them) read us, and name nobody afterwards: Linux has
//! no way to ask which tracer a process named before (docs/FINDINGS.md, "Letting our own
//! grandchild read us"). Its standard error is a pipe whose first line we read back, so that a
//! failure is one note of ours rather than its line and ours.
//!
//! Nothing here allocates or takes a lock: the paths and arguments are fixed buffers on the
//! caller's stack, the children's stacks are an anonymous mapping, and the binary's directory
//! comes from the unwinder's module list (not `dladdr`, which takes the loader's lock).

use crate::capture::modules;
use crate::out::Out;
use crate::profile::output::PathBuf;
use core::fmt::Write;
use core::sync::atomic::{
    AtomicBool, AtomicU32,
    Ordering::{Relaxed, SeqCst},
};

/// The command's name, in the library's directory.
const BINARY: &str = "mem-trace";
/// How long a command may take before it is killed (a 10,000-stack graph takes well under a
/// second; a hang must not hold the program's exit).
pub(crate) const LIMIT_MS: u64 = 10_000;
/// Each child's stack: the helper waits and sleeps, the command calls `execve` (or `_exit`).
const CHILD_STACK: usize = 32 << 10;
/// The most of the command's standard error kept (its first line is what is said).
const ERR_MAX: usize = 512;

/// `mem-trace` in the directory of the library this code is in, if it can be run.
pub(crate) enum Binary {
    /// There, executable.
    There(PathBuf),
    /// Not there (or not executable): its path.
    Missing(PathBuf),
    /// The library's own path is not known.
    Unknown,
}

/// Finds the binary.
pub(crate) fn binary() -> Binary {
    let Some(path) = binary_path() else {
        return Binary::Unknown;
    };
    // SAFETY: access reads a NUL-terminated path.
    if unsafe { libc::access(path.as_c(), libc::X_OK) } != 0 {
        return Binary::Missing(path);
    }
    Binary::There(path)
}

/// Set once the missing binary has been reported.
static SAID_MISSING: AtomicBool = AtomicBool::new(false);

/// Says once that the binary at `path` is not there, and what is lost for it: flame graphs
/// can be drawn later from the `.folded` files, pprof profiles cannot be made once the process
/// has ended. `pprof`: whether reports get a pprof profile (`pprof::wanted`), told by the
/// caller so that this module, which `pprof` runs its binary through, does not import it.
pub(crate) fn say_missing(path: &PathBuf, pprof: bool) {
    if SAID_MISSING.swap(true, Relaxed) {
        return;
    }
    let folded = "the .folded files stay: `mem-trace flamegraph --from-folded FILE.folded -o \
                  FILE.svg` draws one";
    let _ = if pprof {
        writeln!(
            Out::stderr(),
            "mem-trace: no flame graphs and no pprof profiles: {} is not there to make them \
             ({folded}; the pprof profiles are lost: `mem-trace pprof PID` reads only a \
             running process)",
            path.as_str()
        )
    } else {
        writeln!(
            Out::stderr(),
            "mem-trace: no flame graphs: {} is not there to draw them ({folded})",
            path.as_str()
        )
    };
}

fn binary_path() -> Option<PathBuf> {
    let here = binary_path as *const () as usize as u64;
    let set = modules::snapshot()?;
    let module = set.find(here)?;
    let path = core::str::from_utf8(&module.path).ok()?;
    let dir = &path[..path.rfind('/')?];
    let mut p = PathBuf::default();
    write!(p, "{dir}/{BINARY}\0").ok()?;
    Some(p)
}

/// Whether the command reads this process.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// It reads files only; its standard error is the program's.
    Files,
    /// It reads this process (`process_vm_readv`): it is allowed to, and its standard error
    /// comes back in [`Ended::said`].
    Us,
}

/// How the command ended.
pub(crate) struct Ended {
    /// Why it failed, in words; `None`: it succeeded.
    pub(crate) why: Option<&'static str>,
    /// The first line it wrote on standard error, without its `mem-trace: ` (with
    /// [`Reads::Us`]).
    said: [u8; ERR_MAX],
    said_len: usize,
}

impl Ended {
    /// The command's own first line of error, if it wrote one.
    pub(crate) fn said(&self) -> Option<&str> {
        let text = core::str::from_utf8(&self.said[..self.said_len]).ok()?;
        let line = text.lines().next()?.trim_start();
        let line = line.strip_prefix("mem-trace:").unwrap_or(line).trim();
        (!line.is_empty()).then_some(line)
    }
}

/// Runs `argv` (NUL-terminated strings, its first the binary's path, then a null) with an
/// empty environment, and waits for it, at most [`LIMIT_MS`].
pub(crate) fn run(argv: &[*const libc::c_char], reads: Reads) -> Ended {
    debug_assert!(argv.last().is_some_and(|a| a.is_null()));
    let envp: [*const libc::c_char; 1] = [core::ptr::null()];
    let mut ended = Ended {
        why: None,
        said: [0; ERR_MAX],
        said_len: 0,
    };
    let pipe = match reads {
        Reads::Us => err_pipe(),
        Reads::Files => None,
    };
    let allowed = reads == Reads::Us && allow_descendants();
    let status = spawn(&mut Job {
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        stderr: pipe.map_or(-1, |(_, w)| w),
        command_stack: core::ptr::null_mut(),
    });
    if allowed {
        forbid_descendants();
    }
    if let Some((r, w)) = pipe {
        // SAFETY: closes our write end (the command's copy went with it), reads what it wrote
        // into our buffer (non-blocking: nothing more is coming), closes the read end.
        unsafe {
            libc::close(w);
            let n = libc::read(r, ended.said.as_mut_ptr().cast(), ERR_MAX);
            ended.said_len = n.max(0) as usize;
            libc::close(r);
        }
    }
    ended.why = match status {
        Some(0) => None,
        Some(TIMED_OUT) => Some("it took too long and was stopped"),
        Some(EXEC_FAILED) => Some("it could not be started"),
        Some(_) => Some("it failed"),
        None => Some("no process could be made for it"),
    };
    ended
}

/// A pipe for the command's standard error: (read end, non-blocking; write end), both
/// close-on-exec (the command gets its own copy of the write end as fd 2).
fn err_pipe() -> Option<(i32, i32)> {
    let mut fds = [-1; 2];
    // SAFETY: fills two descriptors of ours.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: sets a flag on the read end made above.
    unsafe { libc::fcntl(fds[0], libc::F_SETFL, libc::O_NONBLOCK) };
    Some((fds[0], fds[1]))
}

/// Commands reading this process now (the profiler thread's and the exiting thread's may
/// overlap): the last to end names no tracer.
static READERS: AtomicU32 = AtomicU32::new(0);

/// Under Yama's `ptrace_scope` 1, names this process's own descendants as its tracers (the
/// command is one), and says so; other scopes need nothing (0) or cannot be helped (2, 3:
/// the command says why it cannot read us).
fn allow_descendants() -> bool {
    if yama_scope() != Some(1) {
        return false;
    }
    READERS.fetch_add(1, SeqCst);
    name_descendants();
    true
}

/// Names no tracer again once no command reads us. One that began meanwhile named us after
/// counting itself: seen here, it is named again (idempotent), so its read is refused only if
/// it falls between these two calls.
fn forbid_descendants() {
    if READERS.fetch_sub(1, SeqCst) != 1 {
        return;
    }
    // SAFETY: PR_SET_PTRACER with 0 names no tracer; no memory is touched.
    unsafe { libc::prctl(libc::PR_SET_PTRACER, 0 as libc::c_ulong) };
    if READERS.load(SeqCst) > 0 {
        name_descendants();
    }
}

fn name_descendants() {
    // SAFETY: getpid has no preconditions; PR_SET_PTRACER takes a pid and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::getpid() as libc::c_ulong) };
}

/// `/proc/sys/kernel/yama/ptrace_scope`; `None` without Yama.
fn yama_scope() -> Option<u8> {
    // SAFETY: opens a NUL-terminated path; no memory is touched.
    let fd = unsafe {
        libc::open(
            c"/proc/sys/kernel/yama/ptrace_scope".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 8];
    // SAFETY: reads into our buffer, then closes the descriptor opened above.
    let n = unsafe {
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    scope_of(&buf[..n.max(0) as usize])
}

/// The scope in the text of the `ptrace_scope` file (`1\n`).
fn scope_of(text: &[u8]) -> Option<u8> {
    match text {
        [d @ b'0'..=b'9', b'\n', ..] | [d @ b'0'..=b'9'] => Some(d - b'0'),
        _ => None,
    }
}

/// The helper's exit status when the command did not end within [`LIMIT_MS`].
const TIMED_OUT: i32 = 124;
/// The helper's exit status when the command could not be made.
const NO_COMMAND: i32 = 125;
/// The command's exit status when `execve` failed.
const EXEC_FAILED: i32 = 127;

/// What the helper and the command need; on the caller's stack, which both share.
struct Job {
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// The command's standard error (-1: the program's).
    stderr: i32,
    /// The top of the command's stack (in the same mapping as the helper's).
    command_stack: *mut u8,
}

/// Runs the helper (which runs the command) and waits for it; its exit status, or `None`.
fn spawn(job: &mut Job) -> Option<i32> {
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
    let (helper_top, command_top) = unsafe { (base.add(2 * CHILD_STACK), base.add(CHILD_STACK)) };
    job.command_stack = command_top;
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
    // command left for its own address space (or exited) before the helper went on.
    unsafe { libc::munmap(stacks, 2 * CHILD_STACK) };
    (reaped && libc::WIFEXITED(status)).then(|| libc::WEXITSTATUS(status))
}

/// The helper: starts the command as its own child, waits for it at most [`LIMIT_MS`], and
/// exits with its status. Every signal stays blocked here.
extern "C" fn helper(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Job` of `spawn`'s caller, suspended until this helper exits. The
    // command gets its own stack (the other half of the mapping); CLONE_VFORK returns once it
    // has exec'd, after which it shares nothing with us. The rest are system calls on our own
    // child.
    unsafe {
        let job = &*(arg as *const Job);
        let pid = libc::clone(
            command,
            job.command_stack.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            arg,
        );
        if pid < 0 {
            return NO_COMMAND;
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

/// The command, until its `execve`.
extern "C" fn command(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Job`, alive while the helper is suspended (CLONE_VFORK) until this
    // child has called execve or _exit. dup2 and fcntl change this child's own descriptor
    // table (not shared: no CLONE_FILES); execve and _exit touch nothing shared.
    unsafe {
        let job = &*(arg as *const Job);
        if job.stderr == 2 {
            // Already fd 2, but close-on-exec: kept across the execve.
            libc::fcntl(2, libc::F_SETFD, 0);
        } else if job.stderr >= 0 {
            libc::dup2(job.stderr, 2);
        }
        libc::execve(*job.argv, job.argv, job.envp);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(stderr: &str) -> Ended {
        let mut e = Ended {
            why: Some("it failed"),
            said: [0; ERR_MAX],
            said_len: stderr.len().min(ERR_MAX),
        };
        e.said[..e.said_len].copy_from_slice(&stderr.as_bytes()[..e.said_len]);
        e
    }

    #[test]
    fn the_commands_first_line_is_said_without_its_prefix() {
        let e = ended("mem-trace: cannot read process 7: permission denied\nmore\n");
        assert_eq!(e.said(), Some("cannot read process 7: permission denied"));
        assert_eq!(ended("plain line\n").said(), Some("plain line"));
        assert_eq!(ended("").said(), None);
        assert_eq!(ended("mem-trace: \n").said(), None);
        // Cut inside a character: not said rather than garbled.
        let mut cut = ended("caf\u{e9}");
        cut.said_len -= 1;
        assert_eq!(cut.said(), None);
    }

    #[test]
    fn scope_is_read_from_the_files_text() {
        assert_eq!(scope_of(b"1\n"), Some(1));
        assert_eq!(scope_of(b"0"), Some(0));
        assert_eq!(scope_of(b"3\n"), Some(3));
        assert_eq!(scope_of(b""), None);
        assert_eq!(scope_of(b"x\n"), None);
        assert_eq!(scope_of(b"12\n"), None);
    }

    #[test]
    fn a_command_that_fails_is_told_from_one_that_succeeds() {
        let argv = |prog: &core::ffi::CStr| [prog.as_ptr(), core::ptr::null()];
        assert_eq!(run(&argv(c"/bin/true"), Reads::Files).why, None);
        assert_eq!(
            run(&argv(c"/bin/false"), Reads::Files).why,
            Some("it failed")
        );
        assert_eq!(
            run(&argv(c"/nonexistent/mem-trace"), Reads::Us).why,
            Some("it could not be started")
        );
    }

    #[test]
    fn what_a_reader_says_comes_back_through_the_pipe() {
        let sh = [
            c"/bin/sh".as_ptr(),
            c"-c".as_ptr(),
            c"echo 'mem-trace: cannot read process 1: no' >&2; exit 1".as_ptr(),
            core::ptr::null(),
        ];
        let e = run(&sh, Reads::Us);
        assert_eq!(e.why, Some("it failed"));
        assert_eq!(e.said(), Some("cannot read process 1: no"));
    }
}
