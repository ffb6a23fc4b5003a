//! Calling functions in the target on the chosen thread: the injection itself, without gdb
//! (gdb 13 cannot finish an inferior call on this machine's CPUs by itself, and the
//! anchors' gdb-driven attaches are where their crashes came from).
//!
//! A call moves the thread's stack pointer below the red zone, writes its argument string
//! there, pushes a return address of 0 and sets rip to the function: when the function
//! returns, the thread faults at address 0, which ends the call (that `SIGSEGV` is never
//! delivered). `orig_rax` is set to -1 so that the kernel does not restart the system call
//! the thread was interrupted in into the call. [`Session::finish`] puts every register back
//! and lets every thread go; dropping a session does the same, so that no failure leaves the
//! target stopped, with a breakpoint in it, or on the wrong registers.

use super::memory::Memory;
use super::ptrace::{self, Stop, Threads};
use super::safepoint::{self, Breakpoints, SafePoint};
use std::time::{Duration, Instant};

/// How long one injected call may take (a cold `dlopen` reads the library from disk).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Below the stack pointer, the x86-64 ABI's red zone, which a leaf function may be using.
const RED_ZONE: u64 = 128;

/// The target, every thread traced, one stopped at a safe point.
pub struct Session {
    threads: Threads,
    mem: Memory,
    bps: Breakpoints,
    point: SafePoint,
    finished: bool,
}

impl Session {
    /// Traces every thread of `pid` and stops one at a safe point (`safepoint`): `malloc`
    /// and `free` are libc's entries, `unsafe_callers` libc's and ld.so's mappings.
    pub fn begin(
        pid: i32,
        malloc: u64,
        free: u64,
        unsafe_callers: &[&super::image::Module],
    ) -> Result<Session, String> {
        let mut threads = Threads::seize(pid).map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) => format!(
                "not allowed to trace process {pid} ({e}): attaching needs the rights a \
                 debugger needs"
            ),
            _ => format!("cannot trace process {pid}: {e}"),
        })?;
        let mem = Memory::open(pid).map_err(|e| format!("cannot open /proc/{pid}/mem: {e}"))?;
        let mut bps = Breakpoints::new(&mem, &[malloc, free])
            .map_err(|e| format!("cannot read libc's code in process {pid}: {e}"))?;
        threads.set_traps(&bps.addrs());
        let point = match safepoint::choose(&mut threads, &mem, &mut bps, unsafe_callers) {
            Ok(p) => p,
            Err(e) => {
                bps.remove(&mem);
                threads.release();
                return Err(e);
            }
        };
        Ok(Session {
            threads,
            mem,
            bps,
            point,
            finished: false,
        })
    }

    /// Where the chosen thread was stopped.
    pub fn place(&self) -> &str {
        &self.point.place
    }

    /// Calls `func` on the chosen thread with `data` (NUL-terminated here) as its first
    /// argument when given, then `args`; its return value (rax).
    pub fn call(&mut self, func: u64, data: Option<&[u8]>, args: &[u64]) -> Result<u64, String> {
        let tid = self.point.tid;
        let mut r = self.point.regs;
        let mut sp = r.rsp - RED_ZONE;
        let mut list = Vec::new();
        if let Some(data) = data {
            let mut bytes = data.to_vec();
            bytes.push(0);
            sp = (sp - bytes.len() as u64) & !15;
            self.mem
                .write(sp, &bytes)
                .map_err(|e| format!("cannot write to thread {tid}'s stack: {e}"))?;
            list.push(sp);
        }
        list.extend_from_slice(args);
        // 16-byte aligned at the call, as the ABI requires; then the return address.
        sp = (sp & !15) - 16 - 8;
        self.mem
            .write(sp, &0u64.to_le_bytes())
            .map_err(|e| format!("cannot write to thread {tid}'s stack: {e}"))?;
        r.rsp = sp;
        r.rip = func;
        r.rax = 0;
        r.orig_rax = u64::MAX;
        let regs = [
            &mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.rcx, &mut r.r8, &mut r.r9,
        ];
        for (reg, &v) in regs.into_iter().zip(&list) {
            *reg = v;
        }
        ptrace::set_regs(tid, &r)
            .map_err(|e| format!("cannot set thread {tid}'s registers: {e}"))?;
        self.threads
            .resume(tid, true)
            .map_err(|e| format!("cannot resume thread {tid}: {e}"))?;
        self.wait_return(func)
    }

    /// Waits for the call to return to address 0, passing the program's signals on.
    fn wait_return(&mut self, func: u64) -> Result<u64, String> {
        let tid = self.point.tid;
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let next = self
                .threads
                .wait(deadline)
                .map_err(|e| format!("while waiting for the call to {func:#x}: {e}"))?;
            let Some((t, stop)) = next else {
                return Err(format!(
                    "the call to {func:#x} in thread {tid} did not return within {} s",
                    CALL_TIMEOUT.as_secs()
                ));
            };
            match stop {
                Stop::Exited if t == tid => {
                    return Err(format!("thread {tid} exited during the call to {func:#x}"))
                }
                Stop::Exited => {}
                Stop::Signal(libc::SIGSEGV) if t == tid => {
                    let r = ptrace::regs(tid).map_err(|e| e.to_string())?;
                    debug(format_args!(
                        "call {func:#x} ended: rip {:#x} rax {:#x}",
                        r.rip, r.rax
                    ));
                    if r.rip == 0 {
                        self.threads.clear_pending(tid);
                        return Ok(r.rax);
                    }
                    // SAFETY: an all-zero siginfo_t is a valid buffer for PTRACE_GETSIGINFO.
                    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                    // SAFETY: PTRACE_GETSIGINFO writes one siginfo_t.
                    unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, tid, 0usize, &mut info) };
                    // SAFETY: a SIGSEGV's siginfo carries a fault address.
                    let addr = unsafe { info.si_addr() } as u64;
                    return Err(format!(
                        "the call to {func:#x} faulted at {:#x} (address {addr:#x}, code {}, \
                         stack pointer {:#x}) in thread {tid}; the process was put back as it \
                         was",
                        r.rip, info.si_code, r.rsp
                    ));
                }
                // A thread that hit a breakpoint before it was removed, rewound.
                Stop::Breakpoint(_) => self.resume(t, true)?,
                Stop::Signal(_) | Stop::Interrupted | Stop::Stepped => self.resume(t, false)?,
            }
        }
    }

    fn resume(&mut self, tid: i32, suppress: bool) -> Result<(), String> {
        self.threads
            .resume(tid, suppress)
            .map_err(|e| format!("cannot resume thread {tid}: {e}"))
    }

    /// A NUL-terminated string of the target's, up to 4 KiB.
    pub fn string_at(&self, addr: u64) -> String {
        let mut out = Vec::new();
        let mut chunk = [0u8; 64];
        while out.len() < 4096 {
            if self.mem.read(addr + out.len() as u64, &mut chunk).is_err() {
                break;
            }
            match chunk.iter().position(|&b| b == 0) {
                Some(n) => {
                    out.extend_from_slice(&chunk[..n]);
                    break;
                }
                None => out.extend_from_slice(&chunk),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Puts the chosen thread's registers back and lets every thread go.
    pub fn finish(mut self) -> Result<(), String> {
        self.end()
    }

    fn end(&mut self) -> Result<(), String> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        debug(format_args!("finishing"));
        self.bps.remove(&self.mem);
        let tid = self.point.tid;
        // A call that timed out is still running: stopped first, for its registers to be set.
        if !self.threads.is_stopped(tid) {
            self.threads.interrupt(tid);
            let deadline = Instant::now() + Duration::from_secs(2);
            while !self.threads.is_stopped(tid) {
                match self.threads.wait_for(tid, deadline) {
                    Ok(Stop::Exited) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
        let restored = ptrace::set_regs(tid, &self.point.regs)
            .and_then(|()| ptrace::set_fpregs(tid, &self.point.fpregs));
        self.threads.clear_pending(tid);
        self.threads.release();
        restored.map_err(|e| format!("cannot restore thread {tid}'s registers: {e}"))
    }
}

/// A line on stderr when `MEM_TRACE_ATTACH_DEBUG` is set: what the injector saw.
pub fn debug(what: std::fmt::Arguments) {
    if debugging() {
        eprintln!("mem-trace attach: {what}");
    }
}

/// Whether `MEM_TRACE_ATTACH_DEBUG` is set.
pub fn debugging() -> bool {
    std::env::var_os("MEM_TRACE_ATTACH_DEBUG").is_some()
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.end();
    }
}
