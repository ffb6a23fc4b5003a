//! Whether the target is dumpable, asked of the target itself: `prctl(PR_GET_DUMPABLE)`
//! called on one of its threads right after they are seized, before anything is written
//! into it.
//!
//! checks.rs sees a non-dumpable process only as /proc files owned by root while the
//! process's uid is not, so a root process that called `prctl(PR_SET_DUMPABLE, 0)`, attached
//! to by root (whom the kernel lets trace it), looked dumpable. /proc shows the flag nowhere
//! else. `prctl` is a system call wrapper, safe in a signal handler, so it may be called at
//! whatever instruction the thread was interrupted at ([`super::call`]).

use super::call;
use super::memory::Memory;
use super::ptrace::{self, Stop, Threads};
use std::time::{Duration, Instant};

/// `PR_GET_DUMPABLE`.
const PR_GET_DUMPABLE: u64 = 3;
/// `SUID_DUMP_DISABLE` (`prctl(PR_SET_DUMPABLE, 0)`) and `SUID_DUMP_ROOT` (a set-user-ID
/// program under `fs.suid_dumpable = 2`): the values with which the kernel lets only a
/// privileged debugger attach. An error (`prctl` denied by a seccomp filter) says nothing.
const NOT_DUMPABLE: [i32; 2] = [0, 2];
/// How long the thread is given to stop, and the call to return.
const LIMIT: Duration = Duration::from_secs(2);

/// Whether the process of `threads` is dumpable, by calling libc's `prctl` (at `prctl`) on
/// one of its threads; the thread's registers put back and the thread let run on after.
pub fn is_dumpable(threads: &mut Threads, mem: &Memory, prctl: u64) -> Result<bool, String> {
    let pid = threads.pid();
    let mut tids = threads.tids();
    // The main thread first: the others may be short-lived.
    tids.sort_by_key(|&t| t != pid);
    for tid in tids {
        let Some((regs, fpregs)) = stop(threads, tid)? else {
            continue;
        };
        let got = call::start(threads, mem, tid, &regs, prctl, None, &[PR_GET_DUMPABLE])
            .and_then(|()| call::wait(threads, tid, prctl, Instant::now() + LIMIT));
        // On every path: a thread left on the call's registers would run on from address 0.
        let restored = put_back(threads, tid, &regs, &fpregs);
        let value =
            got?.ok_or_else(|| format!("prctl did not return within {LIMIT:?} in thread {tid}"))?;
        restored?;
        super::debug::debug(format_args!("PR_GET_DUMPABLE in thread {tid}: {value}"));
        // The wrapper returns an int.
        return Ok(!NOT_DUMPABLE.contains(&(value as u32 as i32)));
    }
    Err(format!("no thread of process {pid} could be stopped"))
}

/// `tid` stopped by an interrupt, its registers; `None` if it exited or did not stop (a
/// zombie main thread), for another thread to be asked. A signal that stops it first is
/// delivered, and the interrupt, still pending, stops it after.
fn stop(
    threads: &mut Threads,
    tid: i32,
) -> Result<Option<(libc::user_regs_struct, libc::user_fpregs_struct)>, String> {
    threads.interrupt(tid);
    let deadline = Instant::now() + LIMIT;
    loop {
        match threads.wait_for(tid, deadline) {
            Ok(Stop::Interrupted) => break,
            Ok(Stop::Exited) | Err(_) => return Ok(None),
            Ok(Stop::Signal(_) | Stop::Breakpoint(_) | Stop::Stepped) => threads
                .resume(tid, false)
                .map_err(|e| format!("cannot resume thread {tid}: {e}"))?,
        }
    }
    let regs = ptrace::regs(tid).map_err(|e| format!("thread {tid}'s registers: {e}"))?;
    let fpregs = ptrace::fpregs(tid).map_err(|e| format!("thread {tid}'s registers: {e}"))?;
    Ok(Some((regs, fpregs)))
}

/// Puts `tid`'s registers back and lets it run: stopped first if the call still runs. A stop
/// the call ended in (its `SIGSEGV`) is forgotten; a signal of the program's it stopped for
/// on the way is delivered.
fn put_back(
    threads: &mut Threads,
    tid: i32,
    regs: &libc::user_regs_struct,
    fpregs: &libc::user_fpregs_struct,
) -> Result<(), String> {
    if threads.is_stopped(tid) {
        threads.clear_pending(tid);
    } else {
        threads.interrupt(tid);
        let deadline = Instant::now() + LIMIT;
        while !threads.is_stopped(tid) {
            match threads.wait_for(tid, deadline) {
                Ok(Stop::Exited) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(format!("cannot stop thread {tid}: {e}")),
            }
        }
    }
    ptrace::set_regs(tid, regs)
        .and_then(|()| ptrace::set_fpregs(tid, fpregs))
        .map_err(|e| format!("cannot restore thread {tid}'s registers: {e}"))?;
    threads
        .resume(tid, false)
        .map_err(|e| format!("cannot resume thread {tid}: {e}"))
}
