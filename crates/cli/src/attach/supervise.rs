//! The attacher in two processes, so that killing one does not leave the target broken.
//!
//! When a tracer dies, the kernel detaches its tracees, but what it wrote into their text
//! stays: an `int3` left at `malloc`'s entry kills the target with `SIGTRAP` at its next
//! allocation, and nothing in the target can catch it. Killing the command with `SIGKILL` (a
//! script's timeout, `kill -9`) must not do that, so the command forks before it touches the
//! target:
//!
//! - the child traces the target and does the whole attach or detach; it asks the kernel for
//!   `SIGTERM` when its parent dies (`PR_SET_PDEATHSIG`), a signal it holds, and which makes
//!   it give up the wait for a safe point and let the target go cleanly, breakpoints out and
//!   hit threads rewound, as Ctrl-C does;
//! - the parent, the command that was started, forwards Ctrl-C and `kill` to the child, waits
//!   for it and ends as it ended; if the child was killed, it puts back the original bytes of
//!   the breakpoints it finds still there (it opened the target's memory before the fork, so
//!   it needs no tracing rights of its own).
//!
//! Only both killed at once (`kill -9` of the process group) can still leave a breakpoint
//! behind; and a child killed while a thread of the target was stopped at a hit leaves that
//! thread its `SIGTRAP` (the kernel delivers what the thread stopped for), which nothing
//! outside the kernel can take back.

use super::memory::Memory;
use std::io;
use std::time::Duration;

/// The `int3` opcode.
const INT3: u8 = 0xcc;

/// The signals forwarded to the child; the child holds them (`ptrace::hold_signals`).
const FORWARDED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Forks: returns in the child, which does the attach; the parent waits for it and exits as
/// it did (never returns). `entries` are the addresses the child may put breakpoints at
/// (libc's `malloc` and `free`), read here while they hold their original bytes.
pub fn split(pid: i32, entries: &[(u64, &str)]) -> Result<(), String> {
    let mem = Memory::open(pid).map_err(|e| format!("cannot open /proc/{pid}/mem: {e}"))?;
    let mut original = Vec::new();
    for &(addr, name) in entries {
        let mut b = [0u8];
        mem.read(addr, &mut b)
            .map_err(|e| format!("cannot read libc's code in process {pid}: {e}"))?;
        if b[0] == INT3 {
            return Err(format!(
                "process {pid} has a breakpoint at the entry of {name} already (a debugger's, \
                 or one an attacher killed at once with its parent left): not attached"
            ));
        }
        original.push((addr, b[0]));
    }
    let set = signal_set();
    // Held before the fork, so that none is lost between the fork and the wait below.
    // SAFETY: changes this thread's mask with a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the command is single-threaded here (the attach starts no thread before), so
    // the child may go on running Rust code.
    let child = unsafe { libc::fork() };
    if child < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: as above.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
        return Err(format!("cannot fork: {e}"));
    }
    if child == 0 {
        // SAFETY: prctl with an integer argument; getppid has no preconditions.
        let orphan = unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0
                || libc::getppid() != parent
        };
        // SAFETY: as above; the child holds these again once it traces the target.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
        if orphan {
            // The parent is gone already: nothing was done to the target.
            std::process::exit(1);
        }
        return Ok(());
    }
    let status = wait_forwarding(child, &set);
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        let mut put_back = 0;
        for &(addr, byte) in &original {
            let mut b = [0u8];
            if mem.read(addr, &mut b).is_ok() && b[0] == INT3 && mem.write(addr, &[byte]).is_ok() {
                put_back += 1;
            }
        }
        if put_back > 0 {
            eprintln!(
                "mem-trace: the attaching process was killed by signal {sig} with {put_back} \
                 breakpoint(s) in process {pid}'s allocator; their bytes were put back and the \
                 kernel let the process go"
            );
        }
        // Ended as the child did, for the caller's status.
        // SAFETY: default disposition, unblocked, then raised on this process.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
        std::process::exit(128 + sig);
    }
    std::process::exit(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        1
    });
}

/// Waits for `child` to end, passing it every signal of `set` the parent receives; its
/// wait status.
fn wait_forwarding(child: i32, set: &libc::sigset_t) -> i32 {
    let poll = libc::timespec {
        tv_sec: 0,
        tv_nsec: Duration::from_millis(20).as_nanos() as libc::c_long,
    };
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status word.
        let got = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if got == child {
            return status;
        }
        if got < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 0;
        }
        // SAFETY: sigtimedwait reads the set and the timeout; no siginfo is asked for.
        let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &poll) };
        if sig > 0 {
            // SAFETY: kill of our own child.
            unsafe { libc::kill(child, sig) };
        }
    }
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is a valid buffer for sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigemptyset and sigaddset write the set.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
    }
    set
}
