//! Every thread of the target under ptrace, and the waits on them: the one place that
//! speaks to the kernel's ptrace interface.
//!
//! Threads are taken with `PTRACE_SEIZE`, which does not stop them (a stopped process would
//! not release the locks the injected call may need), with `PTRACE_O_TRACECLONE` so that a
//! thread born meanwhile is traced too. A thread stops only when asked (`PTRACE_INTERRUPT`),
//! at a breakpoint, or for a signal, which is passed on. [`Threads::release`] lets them all
//! go, and runs on every path out (`Drop`): the target is never left stopped.
//!
//! The breakpoints' hits are recognised here, where every stop arrives, and nowhere else: a
//! thread that executed one of the `int3`s (its rip one past the address, whether or not the
//! byte is still there) has its rip put back on the address and its `SIGTRAP` taken away,
//! whatever the caller was waiting for. A hit collected while waiting for another thread was
//! once left with its `SIGTRAP` to deliver, and killed the target (docs/FINDINGS.md).

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

/// A stop the caller must act on (the others are handled by [`Threads::wait`] itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Stopped by a signal, not yet delivered (delivered when resumed).
    Signal(i32),
    /// Stopped by one of the breakpoints at this address: rip is back on it and the
    /// `SIGTRAP` forgotten.
    Breakpoint(u64),
    /// A single step ([`Threads::step`]) done.
    Stepped,
    /// Stopped by `PTRACE_INTERRUPT`.
    Interrupted,
    /// The thread has exited.
    Exited,
}

/// A traced thread.
#[derive(Clone, Copy, Debug, Default)]
struct Thread {
    /// In a ptrace-stop (its registers may be read).
    stopped: bool,
    /// The signal to deliver when it resumes (one it stopped for and we did not cause).
    pending: i32,
    /// An interrupt was asked for and its stop has not been seen yet.
    interrupting: bool,
    /// Born while traced: its first stop is the automatic attach's, to be let run.
    fresh: bool,
    /// Being single-stepped: its next `SIGTRAP` is the step's.
    stepping: bool,
    /// Hit a breakpoint, already rewound, whose `SIGTRAP` is still queued: to be swallowed.
    trap_owed: bool,
}

/// The target's threads, seized.
pub struct Threads {
    pid: i32,
    threads: BTreeMap<i32, Thread>,
    /// Threads that stopped for the caller, not yet collected by it.
    queue: Vec<(i32, Stop)>,
    /// The addresses where an `int3` is or was during this session.
    traps: Vec<u64>,
}

const PTRACE_EVENT_STOP: i32 = 128;

thread_local! {
    /// Whether a pending [`ENDING`] signal cuts the waits short: only while waiting for a safe
    /// point. A call under way is waited for (abandoning `dlopen` midway would leave the
    /// loader's lock taken), and so is the release (it must finish for the target to run on).
    static CUT_SHORT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Lets (`true`) a pending [`ENDING`] signal cut the waits short, or not.
pub fn cut_short_by_signals(on: bool) {
    CUT_SHORT.with(|c| c.set(on));
}

impl Threads {
    /// Seizes every thread of `pid`, again until a pass over /proc/PID/task finds no new one
    /// (threads born meanwhile are traced through `PTRACE_O_TRACECLONE` once their parent
    /// is). An error leaves every thread seized so far released.
    pub fn seize(pid: i32) -> io::Result<Threads> {
        hold_signals(true);
        let mut t = Threads {
            pid,
            threads: BTreeMap::new(),
            queue: Vec::new(),
            traps: Vec::new(),
        };
        loop {
            let mut new = 0;
            for tid in tasks(pid)? {
                if t.threads.contains_key(&tid) {
                    continue;
                }
                // SAFETY: PTRACE_SEIZE with an options word; no memory is passed.
                let rc = unsafe {
                    libc::ptrace(
                        libc::PTRACE_SEIZE,
                        tid,
                        0usize,
                        libc::PTRACE_O_TRACECLONE as usize,
                    )
                };
                if rc != 0 {
                    let e = io::Error::last_os_error();
                    // A thread that exited between the listing and the seize.
                    if e.raw_os_error() == Some(libc::ESRCH) {
                        continue;
                    }
                    return Err(e);
                }
                t.threads.insert(tid, Thread::default());
                new += 1;
            }
            if new == 0 {
                return Ok(t);
            }
        }
    }

    /// Makes the stops of threads that executed an `int3` at one of `addrs` be
    /// [`Stop::Breakpoint`], for the rest of the session (even after the bytes are back).
    pub fn set_traps(&mut self, addrs: &[u64]) {
        self.traps = addrs.to_vec();
    }

    /// The thread ids traced now.
    pub fn tids(&self) -> Vec<i32> {
        self.threads.keys().copied().collect()
    }

    /// Whether `tid` is in a ptrace-stop.
    pub fn is_stopped(&self, tid: i32) -> bool {
        self.threads.get(&tid).is_some_and(|t| t.stopped)
    }

    /// Asks `tid` to stop (its stop is then reported by [`Threads::wait`] as
    /// [`Stop::Interrupted`]).
    pub fn interrupt(&mut self, tid: i32) {
        let Some(t) = self.threads.get_mut(&tid) else {
            return;
        };
        if t.stopped || t.interrupting {
            return;
        }
        // SAFETY: PTRACE_INTERRUPT passes no memory.
        if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) } == 0 {
            t.interrupting = true;
        }
    }

    /// Resumes a stopped thread, delivering the signal it stopped for unless `suppress`.
    pub fn resume(&mut self, tid: i32, suppress: bool) -> io::Result<()> {
        let Some(t) = self.threads.get_mut(&tid) else {
            return Ok(());
        };
        if !t.stopped {
            return Ok(());
        }
        let sig = if suppress { 0 } else { t.pending };
        // SAFETY: PTRACE_CONT with a signal number; no memory is passed.
        if unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0usize, sig as usize) } != 0 {
            return Err(io::Error::last_os_error());
        }
        t.stopped = false;
        t.pending = 0;
        Ok(())
    }

    /// Executes one instruction of a stopped thread, and waits for it to stop again.
    pub fn step(&mut self, tid: i32, deadline: Instant) -> io::Result<Stop> {
        // SAFETY: PTRACE_SINGLESTEP passes no memory.
        if unsafe { libc::ptrace(libc::PTRACE_SINGLESTEP, tid, 0usize, 0usize) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(t) = self.threads.get_mut(&tid) {
            t.stopped = false;
            t.pending = 0;
            t.stepping = true;
        }
        let stop = self.wait_for(tid, deadline);
        // Whatever came (a signal may come before the step), the next SIGTRAP is not a step's.
        if let Some(t) = self.threads.get_mut(&tid) {
            t.stepping = false;
        }
        stop
    }

    /// Waits for the next stop the caller must act on, until `deadline` (`None`: timed out).
    /// Meanwhile threads born are traced and let run, and signals the program receives are
    /// delivered, except to a thread that is being interrupted.
    pub fn wait(&mut self, deadline: Instant) -> io::Result<Option<(i32, Stop)>> {
        if !self.queue.is_empty() {
            return Ok(Some(self.queue.remove(0)));
        }
        self.wait_kernel(deadline)
    }

    /// The next stop from the kernel, the queue left alone.
    fn wait_kernel(&mut self, deadline: Instant) -> io::Result<Option<(i32, Stop)>> {
        loop {
            let Some((tid, status)) = wait_any(deadline)? else {
                return Ok(None);
            };
            if super::debug::debugging() {
                let rip = if libc::WIFSTOPPED(status) {
                    regs(tid).map_or(0, |r| r.rip)
                } else {
                    0
                };
                super::debug::debug(format_args!(
                    "wait: tid {tid} status {status:#x} rip {rip:#x}"
                ));
            }
            if let Some(stop) = self.on_status(tid, status)? {
                return Ok(Some((tid, stop)));
            }
        }
    }

    /// Waits for `tid`'s next stop, keeping the other threads' stops for [`Threads::wait`].
    pub fn wait_for(&mut self, tid: i32, deadline: Instant) -> io::Result<Stop> {
        loop {
            if let Some(i) = self.queue.iter().position(|&(t, _)| t == tid) {
                return Ok(self.queue.remove(i).1);
            }
            match self.wait_kernel(deadline)? {
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("thread {tid} did not stop in time"),
                    ))
                }
                Some((t, stop)) if t == tid => return Ok(stop),
                Some(other) => self.queue.push(other),
            }
        }
    }

    /// The stop of a wait status, or `None` when it was handled here.
    fn on_status(&mut self, tid: i32, status: i32) -> io::Result<Option<Stop>> {
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            let known = self.threads.remove(&tid).is_some();
            return Ok(known.then_some(Stop::Exited));
        }
        if !libc::WIFSTOPPED(status) {
            return Ok(None);
        }
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        // A thread first seen here is one born meanwhile, reporting its first stop.
        let known = self.threads.get(&tid).is_some_and(|t| !t.fresh);
        let t = self.threads.entry(tid).or_default();
        t.fresh = false;
        t.stopped = true;
        if event == libc::PTRACE_EVENT_CLONE {
            let mut child: libc::c_ulong = 0;
            // SAFETY: PTRACE_GETEVENTMSG writes one c_ulong.
            unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, tid, 0usize, &mut child) };
            // Known from now on; its first stop lets it run (below). A child whose first stop
            // came before this event is known already, and running.
            if let std::collections::btree_map::Entry::Vacant(v) = self.threads.entry(child as i32)
            {
                v.insert(Thread {
                    fresh: true,
                    ..Thread::default()
                });
            }
            self.resume(tid, true)?;
            return Ok(None);
        }
        if event == PTRACE_EVENT_STOP {
            // A thread that executed an int3 and was stopped before its SIGTRAP was dequeued
            // (the kernel reports a PTRACE_INTERRUPT's stop first): rewound, the SIGTRAP
            // swallowed, or it would be delivered when the thread is let go.
            if !t.stepping {
                if let Some(dead) = self.fix_early_hit(tid) {
                    return Ok(dead);
                }
            }
            let t = self.threads.entry(tid).or_default();
            if std::mem::take(&mut t.interrupting) {
                return Ok(Some(Stop::Interrupted));
            }
            // A new thread's first stop, or the end of a signal-delivery we passed on.
            let group_stop = known
                && matches!(
                    sig,
                    libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                );
            if group_stop {
                // Stopped by a signal meant to stop it: it stays so, as without us.
                // SAFETY: PTRACE_LISTEN passes no memory.
                unsafe { libc::ptrace(libc::PTRACE_LISTEN, tid, 0usize, 0usize) };
                return Ok(None);
            }
            self.resume(tid, true)?;
            return Ok(None);
        }
        if event != 0 {
            self.resume(tid, true)?;
            return Ok(None);
        }
        if sig == libc::SIGTRAP {
            if std::mem::take(&mut t.stepping) {
                t.pending = 0;
                return Ok(Some(Stop::Stepped));
            }
            if std::mem::take(&mut t.trap_owed) {
                super::debug::debug(format_args!("tid {tid}: owed SIGTRAP swallowed"));
                t.pending = 0;
                self.resume(tid, true)?;
                return Ok(None);
            }
            if let Some(at) = self.hit_by_int3(tid)? {
                return Ok(Some(Stop::Breakpoint(at)));
            }
            let t = self.threads.entry(tid).or_default();
            t.pending = sig;
            return Ok(Some(Stop::Signal(sig)));
        }
        // A signal-delivery stop: the caller decides (the end of a call); whatever it does
        // not claim is delivered when the thread resumes.
        t.pending = sig;
        Ok(Some(Stop::Signal(sig)))
    }

    /// For a thread in a `SIGTRAP` signal-delivery stop: if an `int3` of ours raised it (the
    /// kernel's code, and rip one past a trap address), its rip goes back to the address and
    /// the signal is forgotten; the address.
    fn hit_by_int3(&mut self, tid: i32) -> io::Result<Option<u64>> {
        // SAFETY: an all-zero siginfo_t is a valid buffer for PTRACE_GETSIGINFO.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: PTRACE_GETSIGINFO writes one siginfo_t.
        if unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, tid, 0usize, &mut info) } != 0 {
            return Ok(None);
        }
        // int3 is reported with SI_KERNEL; a program's raise(SIGTRAP) with SI_TKILL.
        if info.si_code != libc::SI_KERNEL {
            return Ok(None);
        }
        let mut r = regs(tid)?;
        let Some(&at) = self.traps.iter().find(|&&a| a + 1 == r.rip) else {
            return Ok(None);
        };
        r.rip = at;
        set_regs(tid, &r)?;
        if let Some(t) = self.threads.get_mut(&tid) {
            t.pending = 0;
        }
        super::debug::debug(format_args!("tid {tid}: int3 hit at {at:#x}, rewound"));
        Ok(Some(at))
    }

    /// For a thread in a `PTRACE_EVENT_STOP` whose rip is one past a trap address (it
    /// executed the `int3`, and its `SIGTRAP` is still queued): rip back on the address, and
    /// the `SIGTRAP` taken out of the queue by letting it dequeue it (no instruction runs
    /// before that: a synchronous signal is dequeued first) and not delivering it. The
    /// thread stays stopped. `None`: go on with the stop as reported; `Some(stop)`: the stop
    /// is over, report `stop` instead (`Exited` if it died, nothing if it runs again).
    fn fix_early_hit(&mut self, tid: i32) -> Option<Option<Stop>> {
        let mut r = regs(tid).ok()?;
        let &at = self.traps.iter().find(|&&a| a + 1 == r.rip)?;
        r.rip = at;
        set_regs(tid, &r).ok()?;
        if !sigtrap_queued(tid) {
            super::debug::debug(format_args!(
                "tid {tid}: stopped just past the int3 at {at:#x}, no SIGTRAP queued; rewound"
            ));
            return None;
        }
        super::debug::debug(format_args!(
            "tid {tid}: stopped past the int3 at {at:#x} with its SIGTRAP queued; rewound, draining"
        ));
        // SAFETY: PTRACE_CONT with no signal; no memory is passed.
        if unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0usize, 0usize) } != 0 {
            if let Some(t) = self.threads.get_mut(&tid) {
                t.trap_owed = true;
            }
            return None;
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes the status word.
            let got = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
            if got == tid {
                super::debug::debug(format_args!("tid {tid}: drained with status {status:#x}"));
                if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                    self.threads.remove(&tid);
                    return Some(Some(Stop::Exited));
                }
                let t = self.threads.entry(tid).or_default();
                t.stopped = true;
                if libc::WIFSTOPPED(status)
                    && status >> 16 == 0
                    && libc::WSTOPSIG(status) == libc::SIGTRAP
                {
                    t.pending = 0;
                } else {
                    // Something came first: the SIGTRAP is still owed. A signal for the
                    // program is kept, to be delivered.
                    t.trap_owed = true;
                    if libc::WIFSTOPPED(status) && status >> 16 == 0 {
                        t.pending = libc::WSTOPSIG(status);
                    }
                }
                return None;
            }
            if (got < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
                || Instant::now() >= deadline
            {
                // Running, its SIGTRAP to come: swallowed when it does; this stop, the
                // interrupt's, is over.
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.trap_owed = true;
                    t.stopped = false;
                    t.interrupting = false;
                }
                return Some(None);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Stops every thread (interrupting those that run, threads born meanwhile included),
    /// until each is stopped or gone or `deadline` passes; every stop seen, those collected
    /// earlier and not acted on included, in order. Breakpoint hits among them are fixed
    /// already.
    pub fn stop_all(&mut self, deadline: Instant) -> Vec<(i32, Stop)> {
        let mut seen = std::mem::take(&mut self.queue);
        loop {
            let running: Vec<i32> = self
                .threads
                .iter()
                .filter(|(_, t)| !t.stopped)
                .map(|(&tid, _)| tid)
                .collect();
            if running.is_empty() {
                break;
            }
            for &tid in &running {
                self.interrupt(tid);
            }
            for tid in running {
                while self.threads.get(&tid).is_some_and(|t| !t.stopped) {
                    match self.wait_for(tid, deadline) {
                        Ok(stop) => seen.push((tid, stop)),
                        Err(_) => {
                            seen.append(&mut self.queue);
                            return seen;
                        }
                    }
                }
            }
            seen.append(&mut self.queue);
        }
        seen
    }

    /// Lets every thread go: each running one is stopped first (only a stopped thread can be
    /// detached, and a breakpoint hit must be fixed first), each keeps the signal it stopped
    /// for. Threads that exited meanwhile are forgotten. Never fails: what cannot be done in
    /// two seconds is left to the kernel, which detaches every tracee when the tracer exits.
    pub fn release(&mut self) {
        cut_short_by_signals(false);
        let deadline = Instant::now() + Duration::from_secs(2);
        super::debug::debug(format_args!("releasing {:?}", self.tids()));
        let stops = self.stop_all(deadline);
        super::debug::debug(format_args!("release saw {stops:?}"));
        for (tid, t) in std::mem::take(&mut self.threads) {
            if t.stopped {
                super::debug::debug(format_args!(
                    "detach: tid {tid} signal {} rip {:#x}{}",
                    t.pending,
                    regs(tid).map_or(0, |r| r.rip),
                    if t.trap_owed {
                        " (SIGTRAP still owed)"
                    } else {
                        ""
                    }
                ));
                // SAFETY: PTRACE_DETACH with the signal to deliver; no memory is passed.
                unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, t.pending as usize) };
            }
        }
        // A Ctrl-C held meanwhile is delivered now, the target let go.
        hold_signals(false);
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Forgets the signal `tid` stopped for: it was ours (a breakpoint, the end of a call).
    pub fn clear_pending(&mut self, tid: i32) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.pending = 0;
        }
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.release();
        }
    }
}

/// Whether `tid` has a `SIGTRAP` queued for it alone (SigPnd in /proc/TID/status).
fn sigtrap_queued(tid: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigPnd:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGTRAP - 1)) != 0)
}

/// The thread ids in /proc/PID/task.
fn tasks(pid: i32) -> io::Result<Vec<i32>> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// The signals that end the command (Ctrl-C, `kill`, a closed terminal): held while the
/// target is traced, so that none kills the command with a breakpoint in the target's
/// `malloc` or a thread on borrowed registers (memray's Ctrl-C crash); [`wait_any`] sees them
/// pending and gives up, the target is let go, and then the signal is delivered.
const ENDING: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

fn ending_set() -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is a valid buffer for sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigemptyset and sigaddset write the set.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in ENDING {
            libc::sigaddset(&mut set, s);
        }
    }
    set
}

/// Blocks (`true`) or unblocks the [`ENDING`] signals.
fn hold_signals(hold: bool) {
    let set = ending_set();
    let how = if hold {
        libc::SIG_BLOCK
    } else {
        libc::SIG_UNBLOCK
    };
    // SAFETY: changes this thread's mask with a valid set.
    unsafe { libc::pthread_sigmask(how, &set, std::ptr::null_mut()) };
}

/// Whether an [`ENDING`] signal is waiting.
fn ending_pending() -> bool {
    // SAFETY: an all-zero sigset_t is a valid buffer for sigpending.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigpending writes the set; sigismember reads it.
    unsafe {
        libc::sigpending(&mut set) == 0 && ENDING.iter().any(|&s| libc::sigismember(&set, s) == 1)
    }
}

/// The next wait status of any tracee, polling until `deadline` (`None`: none came). An
/// [`ENDING`] signal pending is an error: the caller lets the target go.
fn wait_any(deadline: Instant) -> io::Result<Option<(i32, i32)>> {
    loop {
        if CUT_SHORT.with(|c| c.get()) && ending_pending() {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "interrupted by a signal; the process was let go as it was",
            ));
        }
        let mut status = 0;
        // SAFETY: waitpid writes the status word.
        let tid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::WNOHANG) };
        if tid > 0 {
            return Ok(Some((tid, status)));
        }
        if tid < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A stopped thread's general registers.
pub fn regs(tid: i32) -> io::Result<libc::user_regs_struct> {
    // SAFETY: an all-zero register set is a valid buffer.
    let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: PTRACE_GETREGS writes one user_regs_struct.
    if unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0usize, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// Sets a stopped thread's general registers.
pub fn set_regs(tid: i32, r: &libc::user_regs_struct) -> io::Result<()> {
    // SAFETY: PTRACE_SETREGS reads one user_regs_struct.
    if unsafe { libc::ptrace(libc::PTRACE_SETREGS, tid, 0usize, r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A stopped thread's floating-point and SSE registers.
pub fn fpregs(tid: i32) -> io::Result<libc::user_fpregs_struct> {
    // SAFETY: an all-zero register set is a valid buffer.
    let mut r: libc::user_fpregs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: PTRACE_GETFPREGS writes one user_fpregs_struct.
    if unsafe { libc::ptrace(libc::PTRACE_GETFPREGS, tid, 0usize, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// Sets a stopped thread's floating-point and SSE registers.
pub fn set_fpregs(tid: i32, r: &libc::user_fpregs_struct) -> io::Result<()> {
    // SAFETY: PTRACE_SETFPREGS reads one user_fpregs_struct.
    if unsafe { libc::ptrace(libc::PTRACE_SETFPREGS, tid, 0usize, r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
