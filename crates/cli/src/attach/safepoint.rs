//! Choosing the thread the library is loaded on, and the moment: one that is inside neither
//! the allocator nor the loader, so that `dlopen` and the tracer's start cannot wait on a
//! lock that thread holds (memray's attach deadlocks and crashes came from calling at any
//! stop). Two ways, the first preferred:
//!
//! 1. A busy target: `int3` at the entry of libc's `malloc` and `free`, and the first thread
//!    that reaches one from outside libc, ld.so and the tracer (its return address, at `[rsp]`) is taken
//!    there: it is at the allocator's door, not inside, and holds no lock of libc's or the
//!    loader's. The other threads run meanwhile, so what they hold they release. A hit from
//!    inside libc or ld.so is stepped over and waited past.
//! 2. An idle target (no acceptable hit within [`BUSY_WAIT`]): every thread is interrupted,
//!    and one blocked in a system call that neither malloc nor the loader ever blocks in
//!    (`epoll_wait`, `poll`, `read` of a pipe or socket, `nanosleep`, ...) is taken; the
//!    others run on. Its call is restarted, or returns `EINTR`, as after any signal.
//!
//! The breakpoints' original bytes are put back as soon as a thread is chosen; a thread that
//! hit one meanwhile is rewound by one byte, its `SIGTRAP` swallowed, wherever its stop is
//! seen (`ptrace`, which knows the breakpoints' addresses).

use super::image::Module;
use super::memory::Memory;
use super::ptrace::{self, Stop, Threads};
use std::io;
use std::time::{Duration, Instant};

/// How long a busy target is given to call the allocator from outside libc.
pub const BUSY_WAIT: Duration = Duration::from_millis(200);

/// The chosen thread, stopped, and its registers as they were.
pub struct SafePoint {
    /// The thread.
    pub tid: i32,
    /// Its registers, to put back after the calls (for a breakpoint hit, rewound to the
    /// function's entry).
    pub regs: libc::user_regs_struct,
    /// Its floating-point and SSE registers.
    pub fpregs: libc::user_fpregs_struct,
    /// Where it was stopped, for the command's line.
    pub place: String,
}

/// `int3` at functions' entries.
pub struct Breakpoints {
    /// Address and original byte.
    at: Vec<(u64, u8)>,
    inserted: bool,
}

impl Breakpoints {
    /// Breakpoints at `addrs` (not inserted yet).
    pub fn new(mem: &Memory, addrs: &[u64]) -> io::Result<Breakpoints> {
        let mut at = Vec::new();
        for &a in addrs {
            let mut b = [0u8];
            mem.read(a, &mut b)?;
            at.push((a, b[0]));
        }
        Ok(Breakpoints {
            at,
            inserted: false,
        })
    }

    fn insert(&mut self, mem: &Memory) -> io::Result<()> {
        for &(a, _) in &self.at {
            mem.write(a, &[0xcc])?;
        }
        self.inserted = true;
        Ok(())
    }

    /// Puts the original bytes back (idempotent; also on every failure path).
    pub fn remove(&mut self, mem: &Memory) {
        if self.inserted {
            for &(a, b) in &self.at {
                let _ = mem.write(a, &[b]);
            }
            self.inserted = false;
        }
    }

    /// The addresses.
    pub fn addrs(&self) -> Vec<u64> {
        self.at.iter().map(|&(a, _)| a).collect()
    }
}

/// Why [`choose`] found no safe point.
pub const NONE_FOUND: &str = "no thread was at a safe point: none called malloc or free from \
     outside libc within 200 ms, and none was blocked in a call the allocator never blocks in \
     (epoll_wait, poll, select, read of a pipe or socket, nanosleep, accept, recvmsg); try \
     again when the process is busy or idle";

/// Waits for a safe point in `threads` (see the module documentation), on a thread not in
/// `skip` (found inside the loader); `None` (every thread running) when there is none.
/// `unsafe_callers` are libc and ld.so. On return, the breakpoints are out of the target
/// whatever happened.
pub fn choose(
    threads: &mut Threads,
    mem: &Memory,
    bps: &mut Breakpoints,
    unsafe_callers: &[&Module],
    skip: &[i32],
) -> Result<Option<SafePoint>, String> {
    ptrace::cut_short_by_signals(true);
    let found = at_allocator_entry(threads, mem, bps, unsafe_callers, skip);
    bps.remove(mem);
    let found = match found {
        Ok(None) => in_blocking_call(threads, mem, skip)
            .map_err(|e| format!("while stopping the threads: {e}")),
        Ok(Some(p)) => Ok(Some(p)),
        Err(e) => Err(format!("while waiting for a thread to call malloc: {e}")),
    };
    ptrace::cut_short_by_signals(false);
    found
}

/// Way 1: the first thread not in `skip` at `malloc`'s or `free`'s entry called from
/// outside `unsafe_callers`, within [`BUSY_WAIT`].
fn at_allocator_entry(
    threads: &mut Threads,
    mem: &Memory,
    bps: &mut Breakpoints,
    unsafe_callers: &[&Module],
    skip: &[i32],
) -> io::Result<Option<SafePoint>> {
    bps.insert(mem)?;
    // `MEM_TRACE_ATTACH_WAIT_MS`: another wait, for tests of the second way on a busy target.
    let wait = std::env::var("MEM_TRACE_ATTACH_WAIT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(BUSY_WAIT, Duration::from_millis);
    let deadline = Instant::now() + wait;
    while let Some((tid, stop)) = threads.wait(deadline)? {
        // Stops of no interest are let run, the program's signals delivered.
        let at = match stop {
            Stop::Breakpoint(at) => at,
            Stop::Exited => continue,
            Stop::Signal(_) | Stop::Interrupted | Stop::Stepped => {
                threads.resume(tid, false)?;
                continue;
            }
        };
        // Rewound by `threads` already: rip is `at`, the return address at [rsp].
        let r = ptrace::regs(tid)?;
        let caller = mem.read_u64(r.rsp)?;
        super::debug::debug(format_args!("hit: tid {tid} at {at:#x} from {caller:#x}"));
        if !unsafe_callers.iter().any(|m| m.contains(caller)) && !skip.contains(&tid) {
            bps.remove(mem);
            let which = if bps.at.first().is_some_and(|&(a, _)| a == at) {
                "malloc"
            } else {
                "free"
            };
            return Ok(Some(SafePoint {
                tid,
                fpregs: ptrace::fpregs(tid)?,
                regs: r,
                place: format!("thread {tid} at the entry of {which}, called from {caller:#x}"),
            }));
        }
        // Called from inside libc or the loader (or skipped): stepped over its first
        // instruction with the breakpoints out, then they go back in.
        bps.remove(mem);
        let stepped = threads.step(tid, Instant::now() + Duration::from_secs(1))?;
        super::debug::debug(format_args!("stepped: tid {tid} {stepped:?}"));
        match stepped {
            Stop::Stepped | Stop::Breakpoint(_) => threads.resume(tid, true)?,
            Stop::Exited => {}
            // A signal came before the step: delivered; the thread meets the breakpoint again.
            Stop::Signal(_) | Stop::Interrupted => threads.resume(tid, false)?,
        }
        bps.insert(mem)?;
    }
    Ok(None)
}

/// x86-64 system calls that malloc and the loader never block in.
const BLOCKING: [(u64, &str); 19] = [
    (0, "read"),
    (7, "poll"),
    (23, "select"),
    (34, "pause"),
    (35, "nanosleep"),
    (43, "accept"),
    (45, "recvfrom"),
    (47, "recvmsg"),
    (61, "wait4"),
    (128, "rt_sigtimedwait"),
    (130, "rt_sigsuspend"),
    (230, "clock_nanosleep"),
    (232, "epoll_wait"),
    (270, "pselect6"),
    (271, "ppoll"),
    (281, "epoll_pwait"),
    (288, "accept4"),
    (299, "recvmmsg"),
    (441, "epoll_pwait2"),
];

/// The kernel's "interrupted, restart me" results, and `EINTR`.
pub fn interrupted(rax: u64) -> bool {
    matches!(rax as i64, -4 | -512 | -513 | -514 | -516)
}

/// Way 2: every thread stopped; one not in `skip` blocked in a [`BLOCKING`] call (or about
/// to restart one, see [`restarting`]) is kept, the others run on. `None` (all running
/// again) when there is none.
fn in_blocking_call(
    threads: &mut Threads,
    mem: &Memory,
    skip: &[i32],
) -> io::Result<Option<SafePoint>> {
    let stops = threads.stop_all(Instant::now() + Duration::from_secs(2));
    super::debug::debug(format_args!("stopped for a blocking call: {stops:?}"));
    let interrupted_ones: Vec<i32> = stops
        .iter()
        .filter(|&&(tid, s)| s == Stop::Interrupted && threads.is_stopped(tid))
        .map(|&(tid, _)| tid)
        .collect();
    let pid = threads.pid();
    let mut chosen = None;
    for &tid in &interrupted_ones {
        let r = ptrace::regs(tid)?;
        super::debug::debug(format_args!(
            "tid {tid}: rip {:#x} rax {:#x} orig_rax {:#x}",
            r.rip, r.rax, r.orig_rax
        ));
        // The bytes at rip are read only for a thread that is not inside the call.
        let restarts = || {
            let mut insn = [0u8; 2];
            mem.read(r.rip, &mut insn).is_ok() && restarting(&r, insn)
        };
        if chosen.is_none() && !skip.contains(&tid) && (interrupted(r.rax) || restarts()) {
            if let Some(name) = blocking_call(pid, &r) {
                chosen = Some(SafePoint {
                    tid,
                    fpregs: ptrace::fpregs(tid)?,
                    regs: r,
                    place: format!("thread {tid} blocked in {name}"),
                });
            }
        }
    }
    for tid in threads.tids() {
        if chosen.as_ref().is_none_or(|c| c.tid != tid) {
            threads.resume(tid, false)?;
        }
    }
    Ok(chosen)
}

/// Whether a thread stopped outside the kernel is about to make again the system call its
/// registers name, `insn` being the bytes at its rip: a stop had interrupted the call, the
/// kernel rewound the thread onto its `syscall` instruction and put the call's number back
/// in rax to restart it, and the thread was stopped again before it ran that instruction.
/// The injector's own first stop of the thread, and the call it makes there, set this up;
/// a busy target's main thread blocked in `read` was then refused about once in 150
/// attaches that did not wait for `malloc` (its rax was 0, no "interrupted" code).
fn restarting(r: &libc::user_regs_struct, insn: [u8; 2]) -> bool {
    insn == [0x0f, 0x05] && r.rax == r.orig_rax
}

/// The name of the call a thread interrupted in a system call was blocked in, if one of
/// [`BLOCKING`] (`read` only of a pipe or a socket: a file's read may be one the loader
/// makes).
fn blocking_call(pid: i32, r: &libc::user_regs_struct) -> Option<&'static str> {
    let &(nr, name) = BLOCKING.iter().find(|&&(nr, _)| nr == r.orig_rax)?;
    if nr == 0 {
        use std::os::unix::fs::FileTypeExt;
        let kind = std::fs::metadata(format!("/proc/{pid}/fd/{}", r.rdi))
            .ok()?
            .file_type();
        if !(kind.is_fifo() || kind.is_socket()) {
            return None;
        }
    }
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_codes_are_interruptions() {
        for code in [-4i64, -512, -513, -514, -516] {
            assert!(interrupted(code as u64));
        }
        assert!(!interrupted(0));
        assert!(!interrupted((-11i64) as u64));
    }

    #[test]
    fn a_thread_on_its_syscall_with_the_call_number_back_is_restarting() {
        // SAFETY: all-zero is a valid register set.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        (r.rax, r.orig_rax) = (0, 0);
        assert!(restarting(&r, [0x0f, 0x05]));
        // Any other instruction, or a result in rax: not a restart.
        assert!(!restarting(&r, [0x48, 0x89]));
        (r.rax, r.orig_rax) = ((-512i64) as u64, 0);
        assert!(!restarting(&r, [0x0f, 0x05]));
        // Stopped in user space with no call under way: orig_rax is -1.
        (r.rax, r.orig_rax) = (0, u64::MAX);
        assert!(!restarting(&r, [0x0f, 0x05]));
    }

    #[test]
    fn only_calls_the_allocator_never_blocks_in() {
        // futex (202) is where a thread waits for malloc's arena lock.
        assert!(BLOCKING.iter().all(|&(nr, _)| nr != 202));
        assert!(BLOCKING.iter().any(|&(_, n)| n == "epoll_wait"));
    }
}
