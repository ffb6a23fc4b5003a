//! Calling functions in the target on the chosen thread: the injection itself, without gdb
//! (gdb 13 cannot finish an inferior call on this machine's CPUs by itself, and the
//! anchors' gdb-driven attaches are where their crashes came from).
//!
//! A session seizes every thread, asks the target whether it is dumpable (`dumpable`),
//! stops one thread at a safe point (`safepoint`), and waits until no other thread holds a
//! lock of the allocator or the loader (`locks`); then the calls (`call`).
//! [`Session::finish`] puts every register back and lets every thread go; dropping a
//! session does the same, so that no failure leaves the target stopped, with a breakpoint
//! in it, or on the wrong registers.

use super::call;
use super::checks;
use super::image::{Image, Module};
use super::memory::Memory;
use super::ptrace::{self, Stop, Threads};
use super::safepoint::{self, Breakpoints, SafePoint};
use super::{dumpable, locks};
use crate::error::Error;
use std::time::{Duration, Instant};

/// How long one injected call may take (a cold `dlopen` reads the library from disk).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// The target, every thread traced, one stopped at a safe point.
pub struct Session {
    threads: Threads,
    mem: Memory,
    bps: Breakpoints,
    point: SafePoint,
    finished: bool,
}

impl Session {
    /// Traces every thread of `pid`, refuses a process that is not dumpable when
    /// `refuse_undumpable`, stops one thread at a safe point (`safepoint`) and waits until no
    /// thread holds an arena's lock or the loader's (`locks`). `malloc` and `free` are
    /// libc's entries, `unsafe_callers` libc's and ld.so's mappings (and the library's, when
    /// loaded).
    pub fn begin(
        pid: i32,
        libc: &Image,
        (malloc, free): (u64, u64),
        unsafe_callers: &[&Module],
        refuse_undumpable: bool,
    ) -> Result<Session, Error> {
        let fail = |e: String| Error::new(format!("process {pid}: {e}"));
        let mut threads = Threads::seize(pid).map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) => Error::new(format!(
                "not allowed to trace process {pid} ({e}): attaching needs the rights a \
                 debugger needs"
            )),
            _ => Error::new(format!("cannot trace process {pid}: {e}")),
        })?;
        let mem = Memory::open(pid)
            .map_err(|e| Error::new(format!("cannot open /proc/{pid}/mem: {e}")))?;
        if refuse_undumpable {
            let prctl = libc.symbol("prctl").map_err(|e| fail(e.to_string()))?;
            if !dumpable::is_dumpable(&mut threads, &mem, prctl).map_err(fail)? {
                return Err(Error::new(checks::not_dumpable(pid)));
            }
        }
        let mut bps = Breakpoints::new(&mem, &[malloc, free])
            .map_err(|e| Error::new(format!("cannot read libc's code in process {pid}: {e}")))?;
        threads.set_traps(&bps.addrs());
        let point = match safepoint::choose(&mut threads, &mem, &mut bps, unsafe_callers) {
            Ok(p) => p,
            Err(e) => {
                bps.remove(&mem);
                threads.release();
                return Err(fail(e));
            }
        };
        let mut session = Session {
            threads,
            mem,
            bps,
            point,
            finished: false,
        };
        let functions = libc.functions();
        let buffer = [0; 80];
        // Before glibc 2.33 there is no mallinfo2, and before 2.34 no dladdr in libc: no
        // dlopen in libc to call either.
        let getpid = [libc.defined("getpid").unwrap_or(0), 0];
        let probes = [
            libc.defined("mallinfo2")
                .map(|f| locks::allocator(f, &buffer)),
            libc.defined("dladdr").map(locks::loader),
            libc.defined("dl_iterate_phdr")
                .filter(|_| getpid[0] != 0)
                .map(|f| locks::loader_list(f, &getpid)),
        ];
        for probe in probes.iter().flatten() {
            // On failure the session, dropped, puts the registers back and lets go.
            locks::wait_unlocked(
                &mut session.threads,
                &session.mem,
                &session.point,
                probe,
                &functions,
            )
            .map_err(fail)?;
        }
        Ok(session)
    }

    /// Where the chosen thread was stopped.
    pub fn place(&self) -> &str {
        &self.point.place
    }

    /// Calls `func` on the chosen thread with `data` (NUL-terminated here) as its first
    /// argument when given, then `args`; its return value (rax).
    pub fn call(&mut self, func: u64, data: Option<&[u8]>, args: &[u64]) -> Result<u64, String> {
        let tid = self.point.tid;
        let regs = self.point.regs;
        call::start(&mut self.threads, &self.mem, tid, &regs, func, data, args)?;
        call::wait(&mut self.threads, tid, func, Instant::now() + CALL_TIMEOUT)?.ok_or_else(|| {
            format!(
                "the call to {func:#x} in thread {tid} did not return within {} s",
                CALL_TIMEOUT.as_secs()
            )
        })
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
