//! One function called on a stopped thread of the target: its arguments set, the call
//! started, and its return waited for.
//!
//! A call moves the thread's stack pointer below the red zone, writes its argument string
//! there, pushes a return address of 0 and sets rip to the function: when the function
//! returns, the thread faults at address 0, which ends the call (that `SIGSEGV` is never
//! delivered). `orig_rax` is set to -1 so that the kernel does not restart the system call
//! the thread was interrupted in into the call. This is what a signal's delivery does to a
//! thread, so a function that is safe in a signal handler is safe to call at any stop. The
//! caller puts the thread's registers back afterwards.

use super::memory::Memory;
use super::ptrace::{self, Stop, Threads};
use std::time::Instant;

/// Below the stack pointer, the x86-64 ABI's red zone, which a leaf function may be using.
const RED_ZONE: u64 = 128;

/// Starts `func(data, args...)` on the stopped thread `tid`, whose registers are `base`:
/// `data`, NUL-terminated, is copied to its stack and passed first, when given.
pub fn start(
    threads: &mut Threads,
    mem: &Memory,
    tid: i32,
    base: &libc::user_regs_struct,
    func: u64,
    data: Option<&[u8]>,
    args: &[u64],
) -> Result<(), String> {
    prepare(mem, tid, base, func, data, args)?;
    threads
        .resume(tid, true)
        .map_err(|e| format!("cannot resume thread {tid}: {e}"))
}

/// [`start`] without the resumption: the thread stopped at `func`'s first instruction.
pub fn prepare(
    mem: &Memory,
    tid: i32,
    base: &libc::user_regs_struct,
    func: u64,
    data: Option<&[u8]>,
    args: &[u64],
) -> Result<(), String> {
    let mut r = *base;
    let mut sp = r.rsp - RED_ZONE;
    let mut list = Vec::new();
    if let Some(data) = data {
        let mut bytes = data.to_vec();
        bytes.push(0);
        sp = (sp - bytes.len() as u64) & !15;
        mem.write(sp, &bytes)
            .map_err(|e| format!("cannot write to thread {tid}'s stack: {e}"))?;
        list.push(sp);
    }
    list.extend_from_slice(args);
    // 16-byte aligned at the call, as the ABI requires; then the return address.
    sp = (sp & !15) - 16 - 8;
    mem.write(sp, &0u64.to_le_bytes())
        .map_err(|e| format!("cannot write to thread {tid}'s stack: {e}"))?;
    r.rsp = sp;
    r.rip = func;
    // Also the count of vector registers a variadic function (`prctl`) is passed: none.
    r.rax = 0;
    r.orig_rax = u64::MAX;
    let regs = [
        &mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.rcx, &mut r.r8, &mut r.r9,
    ];
    for (reg, &v) in regs.into_iter().zip(&list) {
        *reg = v;
    }
    ptrace::set_regs(tid, &r).map_err(|e| format!("cannot set thread {tid}'s registers: {e}"))
}

/// Waits until `deadline` for the call to `func` started on `tid` to return to address 0,
/// passing the program's signals on: its return value (rax), or `None` if it still runs.
pub fn wait(
    threads: &mut Threads,
    tid: i32,
    func: u64,
    deadline: Instant,
) -> Result<Option<u64>, String> {
    loop {
        let next = threads
            .wait(deadline)
            .map_err(|e| format!("while waiting for the call to {func:#x}: {e}"))?;
        let Some((t, stop)) = next else {
            return Ok(None);
        };
        match stop {
            Stop::Exited if t == tid => {
                return Err(format!("thread {tid} exited during the call to {func:#x}"))
            }
            Stop::Exited => {}
            Stop::Signal(libc::SIGSEGV) if t == tid => return ended(threads, tid, func).map(Some),
            // A thread that hit a breakpoint before it was removed, rewound.
            Stop::Breakpoint(_) => resume(threads, t, true)?,
            Stop::Signal(_) | Stop::Interrupted | Stop::Stepped => resume(threads, t, false)?,
        }
    }
}

/// For `tid` stopped by a `SIGSEGV` during the call to `func`: its return value if the fault
/// is the return to address 0 (the signal forgotten), else what faulted.
pub fn ended(threads: &mut Threads, tid: i32, func: u64) -> Result<u64, String> {
    let r = ptrace::regs(tid).map_err(|e| e.to_string())?;
    super::debug::debug(format_args!(
        "call {func:#x} ended: rip {:#x} rax {:#x}",
        r.rip, r.rax
    ));
    if r.rip == 0 {
        threads.clear_pending(tid);
        return Ok(r.rax);
    }
    // SAFETY: an all-zero siginfo_t is a valid buffer for PTRACE_GETSIGINFO.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: PTRACE_GETSIGINFO writes one siginfo_t.
    unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, tid, 0usize, &mut info) };
    // SAFETY: a SIGSEGV's siginfo carries a fault address.
    let addr = unsafe { info.si_addr() } as u64;
    Err(format!(
        "the call to {func:#x} faulted at {:#x} (address {addr:#x}, code {}, stack pointer \
         {:#x}) in thread {tid}; the process was put back as it was",
        r.rip, info.si_code, r.rsp
    ))
}

fn resume(threads: &mut Threads, tid: i32, suppress: bool) -> Result<(), String> {
    threads
        .resume(tid, suppress)
        .map_err(|e| format!("cannot resume thread {tid}: {e}"))
}
