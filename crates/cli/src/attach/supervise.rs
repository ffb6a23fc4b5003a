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
//! behind; the next attach or detach takes it out before anything else ([`split`]: an
//! `int3` in place of the first byte of `malloc` or `free`, the rest as in libc's file, in a
//! process nobody traces, is what a killed attach leaves). A child killed while a thread of
//! the target was stopped at a hit leaves that thread its `SIGTRAP` (the kernel delivers what
//! the thread stopped for), which nothing outside the kernel can take back.

use super::memory::Memory;
use std::io;
use std::time::Duration;

/// The `int3` opcode.
const INT3: u8 = 0xcc;

/// The signals forwarded to the child; the child holds them (`ptrace::hold_signals`).
const FORWARDED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// How many bytes of a function's entry are compared with the file's.
pub const ENTRY: usize = 16;

/// A function the child may put a breakpoint at: its address, its name, and its first
/// [`ENTRY`] bytes in the module's file, when they could be read.
pub type Entry<'a> = (u64, &'a str, Option<&'a [u8]>);

/// Forks: returns in the child, which does the attach; the parent waits for it and exits as
/// it did (never returns). `entries` are the addresses the child may put breakpoints at
/// (libc's `malloc` and `free`), read here while they hold their original bytes; one left
/// by an attach killed with its parent is taken out first ([`leftover`]). The process is
/// traced by nobody (`checks`).
pub fn split(pid: i32, entries: &[Entry]) -> Result<(), String> {
    let mem = Memory::open(pid).map_err(|e| format!("cannot open /proc/{pid}/mem: {e}"))?;
    let mut original = Vec::new();
    for &(addr, name, file) in entries {
        let mut b = [0u8; ENTRY];
        mem.read(addr, &mut b)
            .map_err(|e| format!("cannot read libc's code in process {pid}: {e}"))?;
        if b[0] == INT3 {
            let Some(byte) = file.and_then(|file| leftover(&b, file)) else {
                let why = if file.is_some() {
                    "the code after it differs from libc's file"
                } else {
                    "libc's file could not be read to compare"
                };
                return Err(format!(
                    "process {pid} has a breakpoint at the entry of {name} already, not one \
                     mem-trace leaves ({why}): not attached"
                ));
            };
            mem.write(addr, &[byte]).map_err(|e| {
                format!("cannot take out the breakpoint left at {name} in process {pid}: {e}")
            })?;
            eprintln!(
                "mem-trace: process {pid} had an int3 at the entry of {name}, left by an \
                 attach killed with its parent: taken out, the byte of libc's file put back"
            );
            b[0] = byte;
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

/// The byte to put back when `memory`, a function's entry, is what an attach leaves: an
/// `int3` where `file` has another byte, and the rest of the entry as in `file`.
pub fn leftover(memory: &[u8], file: &[u8]) -> Option<u8> {
    let (&first, rest) = file.split_first()?;
    (memory.len() == file.len() && memory[0] == INT3 && first != INT3 && memory[1..] == *rest)
        .then_some(first)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_int3_in_place_of_the_first_byte_is_a_leftover() {
        // endbr64; push %r12 ...
        let file = [0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x54];
        let mut memory = file;
        memory[0] = INT3;
        assert_eq!(leftover(&memory, &file), Some(0xf3));
        // Anything else changed too: someone else's patch.
        memory[3] = 0x90;
        assert_eq!(leftover(&memory, &file), None);
        // No int3, or the file's own, or bytes of another length.
        assert_eq!(leftover(&file, &file), None);
        let int3_file = [INT3, 0x0f];
        assert_eq!(leftover(&int3_file, &int3_file), None);
        assert_eq!(leftover(&[INT3], &file), None);
    }
}
