//! Calling functions in the target on the chosen thread: the injection itself, without gdb
//! (gdb 13 cannot finish an inferior call on this machine's CPUs by itself, and the
//! anchors' gdb-driven attaches are where their crashes came from).
//!
//! A session seizes every thread, asks the target whether it is dumpable (`dumpable`),
//! stops one thread at a safe point (`safepoint`), and waits until no other thread holds a
//! lock of the allocator or the loader (`locks`) and the chosen one is not inside the loader
//! itself (`loader`: another is chosen, or it is waited for); then the calls (`call`).
//! [`Session::finish`] puts every register back and lets every thread go; dropping a
//! session does the same, so that no failure leaves the target stopped, with a breakpoint
//! in it, or on the wrong registers.

use super::call;
use super::checks;
use super::image::{Image, Module};
use super::libc_code::LibcCode;
use super::loader::{Held, Reach};
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
    /// `None` while no thread is held at a safe point (between two choices).
    point: Option<SafePoint>,
    finished: bool,
}

/// How many times a probe is asked again whether the chosen thread held its lock, when a
/// signal came while it was stepped.
const ASKED: usize = 3;

impl Session {
    /// Traces every thread of `pid`, refuses a process that is not dumpable when
    /// `refuse_undumpable`, stops one thread at a safe point (`safepoint`) and waits until no
    /// thread holds an arena's lock or the loader's (`locks`) and the chosen one is not
    /// inside the loader (`loader`). `malloc` and `free` are libc's entries, `unsafe_callers`
    /// libc's and ld.so's mappings (and the library's, when loaded), `ld` ld.so.
    pub fn begin(
        pid: i32,
        libc: &Image,
        ld: &Image,
        (malloc, free): (u64, u64),
        unsafe_callers: &[&Module],
        refuse_undumpable: bool,
    ) -> Result<Session, Error> {
        let fail = |e: String| Error::new(format!("process {pid}: {e}"));
        // The loader's locks and the code dladdr runs with its lock taken, exported by every
        // glibc whose libc has dlopen (2.34 and later) for libc's own use.
        let rtld_global = ld
            .sized("_rtld_global")
            .map(|(at, size)| (at, size as usize));
        let find_dso = ld
            .sized("_dl_find_dso_for_object")
            .map(|(at, size)| (at, at + size.max(1)));
        let (Some(rtld_global), Some(find_dso)) = (rtld_global, find_dso) else {
            return Err(fail(
                "its ld.so exports no _rtld_global or _dl_find_dso_for_object: whether a \
                 thread is inside the loader cannot be told, so nothing is loaded"
                    .to_string(),
            ));
        };
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
        let bps = Breakpoints::new(&mem, &[malloc, free])
            .map_err(|e| Error::new(format!("cannot read libc's code in process {pid}: {e}")))?;
        threads.set_traps(&bps.addrs());
        // On failure the session, dropped, takes the breakpoints out, puts the chosen
        // thread's registers back and lets go.
        let mut session = Session {
            threads,
            mem,
            bps,
            point: None,
            finished: false,
        };
        let functions = LibcCode::new(libc);
        let buffer = [0; 80];
        // Before glibc 2.33 there is no mallinfo2, and before 2.34 no dladdr in libc: no
        // dlopen in libc to call either.
        let getpid = [libc.defined("getpid").unwrap_or(0), 0];
        let reach = Reach {
            code: find_dso,
            data: rtld_global,
        };
        let probes = [
            libc.defined("mallinfo2")
                .map(|f| locks::allocator(f, &buffer)),
            libc.defined("dladdr")
                .map(|f| locks::loader(f, Some(reach))),
            libc.defined("dl_iterate_phdr")
                .filter(|_| getpid[0] != 0)
                .map(|f| locks::loader_list(f, &getpid, Some(rtld_global))),
        ];
        let probes: Vec<_> = probes.into_iter().flatten().collect();
        session
            .settle(unsafe_callers, &probes, &functions)
            .map_err(fail)?;
        Ok(session)
    }

    /// Chooses the safe point and runs the probes on it, until one is not inside the loader:
    /// a thread found there is skipped while another can be chosen, and waited for (as
    /// long as `locks::lock_wait`) when none can.
    fn settle(
        &mut self,
        unsafe_callers: &[&Module],
        probes: &[locks::Probe],
        functions: &LibcCode,
    ) -> Result<(), String> {
        let mut skip = Vec::new();
        // The thread last found inside the loader, where, the lock it holds, and since when.
        let mut inside: Option<(String, &str, Instant)> = None;
        let mut said = false;
        loop {
            let chosen = safepoint::choose(
                &mut self.threads,
                &self.mem,
                &mut self.bps,
                unsafe_callers,
                &skip,
            )?;
            let Some(point) = chosen else {
                let Some((who, lock, since)) = &inside else {
                    return Err(safepoint::NONE_FOUND.to_string());
                };
                let limit = locks::lock_wait();
                if !said {
                    said = true;
                    eprintln!(
                        "mem-trace: {who}, holding {lock}, and no other thread is at a safe \
                         point: the tracer cannot be loaded from inside the loader; waiting \
                         up to {} s for it to leave",
                        limit.as_secs_f64()
                    );
                }
                if since.elapsed() >= limit {
                    return Err(format!(
                        "{} for {} s, holding {lock}, and no other thread came to a safe \
                         point: the tracer cannot be loaded from inside the loader; nothing \
                         was loaded and the process runs on as it was; attach again once it \
                         has left (MEM_TRACE_ATTACH_LOCK_WAIT_MS=N waits N ms)",
                        who.replacen(" is inside", " stayed inside", 1),
                        limit.as_secs_f64()
                    ));
                }
                // It may have left meanwhile: every thread is a candidate again.
                skip.clear();
                continue;
            };
            let (tid, regs) = (point.tid, point.regs);
            self.point = Some(point);
            let Some(probe) = self.probe(probes, functions)? else {
                return Ok(());
            };
            let place = locks::place(&self.mem, &regs, functions, probe);
            super::debug::debug(format_args!("thread {tid} is inside {place}: skipped"));
            let since = inside.map_or_else(Instant::now, |(_, _, since)| since);
            inside = Some((format!("thread {tid} is inside {place}"), probe.lock, since));
            skip.push(tid);
            self.put_back()?;
        }
    }

    /// Runs each probe on the chosen thread (`locks::wait_unlocked`): the first whose lock
    /// the thread itself held, if any.
    fn probe<'p, 'a>(
        &mut self,
        probes: &'p [locks::Probe<'a>],
        functions: &LibcCode,
    ) -> Result<Option<&'p locks::Probe<'a>>, String> {
        let point = self.point.as_ref().ok_or("no thread at a safe point")?;
        for probe in probes {
            let mut held = Held::Unknown;
            for _ in 0..ASKED {
                held = locks::wait_unlocked(&mut self.threads, &self.mem, point, probe, functions)?;
                if held != Held::Unknown || probe.reach.is_none() {
                    break;
                }
            }
            match held {
                Held::ByIt => return Ok(Some(probe)),
                Held::Unknown if probe.reach.is_some() => {
                    return Err(format!(
                        "whether thread {} holds {} could not be told (signals kept coming \
                         while {} was stepped): nothing was loaded and the process runs on \
                         as it was; attach again",
                        point.tid, probe.lock, probe.name
                    ))
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Puts the chosen thread's registers back and lets it run on; none is chosen then.
    fn put_back(&mut self) -> Result<(), String> {
        let Some(point) = self.point.take() else {
            return Ok(());
        };
        let tid = point.tid;
        ptrace::set_regs(tid, &point.regs)
            .and_then(|()| ptrace::set_fpregs(tid, &point.fpregs))
            .map_err(|e| format!("cannot restore thread {tid}'s registers: {e}"))?;
        self.threads.clear_pending(tid);
        self.threads
            .resume(tid, true)
            .map_err(|e| format!("cannot resume thread {tid}: {e}"))
    }

    /// Where the chosen thread was stopped.
    pub fn place(&self) -> &str {
        self.point.as_ref().map_or("", |p| p.place.as_str())
    }

    /// Calls `func` on the chosen thread with `data` (NUL-terminated here) as its first
    /// argument when given, then `args`; its return value (rax).
    pub fn call(&mut self, func: u64, data: Option<&[u8]>, args: &[u64]) -> Result<u64, String> {
        let point = self.point.as_ref().ok_or("no thread at a safe point")?;
        let (tid, regs) = (point.tid, point.regs);
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
        super::debug::debug(format_args!("finishing"));
        self.bps.remove(&self.mem);
        let Some(point) = self.point.take() else {
            self.threads.release();
            return Ok(());
        };
        let tid = point.tid;
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
        let restored = ptrace::set_regs(tid, &point.regs)
            .and_then(|()| ptrace::set_fpregs(tid, &point.fpregs));
        self.threads.clear_pending(tid);
        self.threads.release();
        restored.map_err(|e| format!("cannot restore thread {tid}'s registers: {e}"))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.end();
    }
}
