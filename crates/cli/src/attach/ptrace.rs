//! Every thread of the target under ptrace, and the waits on them: the one place that
//! speaks to the kernel's ptrace interface.
//!
//! Threads are taken with `PTRACE_SEIZE`, which does not stop them (a stopped process would
//! not release the locks the injected call may need), with `PTRACE_O_TRACECLONE` so that a
//! thread born meanwhile is traced too. A thread stops only when asked (`PTRACE_INTERRUPT`),
//! at a breakpoint, or for a signal, which is passed on. [`Threads::release`] lets them all
//! go, and runs on every path out (`Drop`): the target is never left stopped.

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

/// A stop the caller must act on (the others are handled by [`Threads::wait`] itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Stopped by a signal (`SIGTRAP` for a breakpoint), not yet delivered.
    Signal(i32),
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
}

/// The target's threads, seized.
pub struct Threads {
    pid: i32,
    threads: BTreeMap<i32, Thread>,
    /// Threads that stopped for the caller, not yet collected by it.
    queue: Vec<(i32, Stop)>,
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
        }
        self.wait_for(tid, deadline)
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
            super::inject::debug(format_args!("wait: tid {tid} status {status:#x}"));
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
            // Known from now on; its first stop lets it run (below).
            self.threads.entry(child as i32).or_default().fresh = true;
            self.resume(tid, true)?;
            return Ok(None);
        }
        if event == PTRACE_EVENT_STOP {
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
        // A signal-delivery stop: the caller decides (a breakpoint, the end of a call);
        // whatever it does not claim is delivered when the thread resumes.
        t.pending = sig;
        Ok(Some(Stop::Signal(sig)))
    }

    /// Lets every thread go: each running one is stopped first (only a stopped thread can be
    /// detached), each keeps the signal it stopped for; `fixup` runs on each stopped thread
    /// before it is detached (a breakpoint hit's rewind). Threads that exited meanwhile are
    /// forgotten. Never fails: what cannot be done in two seconds is left to the kernel,
    /// which detaches every tracee when the tracer exits.
    pub fn release(&mut self, mut fixup: impl FnMut(i32, Stop) -> bool) {
        cut_short_by_signals(false);
        let deadline = Instant::now() + Duration::from_secs(2);
        let tids = self.tids();
        super::inject::debug(format_args!("releasing {tids:?}"));
        for &tid in &tids {
            self.interrupt(tid);
        }
        for tid in tids {
            while self.threads.get(&tid).is_some_and(|t| !t.stopped) {
                match self.wait_for(tid, deadline) {
                    Ok(Stop::Exited) | Err(_) => break,
                    Ok(stop) => {
                        if fixup(tid, stop) {
                            if let Some(t) = self.threads.get_mut(&tid) {
                                t.pending = 0;
                            }
                        }
                    }
                }
            }
            // A stop collected earlier by `wait` but not acted on: fixed up now.
            let queued: Vec<Stop> = self
                .queue
                .iter()
                .filter(|&&(t, _)| t == tid)
                .map(|&(_, s)| s)
                .collect();
            self.queue.retain(|&(t, _)| t != tid);
            for stop in queued {
                if fixup(tid, stop) {
                    if let Some(t) = self.threads.get_mut(&tid) {
                        t.pending = 0;
                    }
                }
            }
            let Some(t) = self.threads.remove(&tid) else {
                continue;
            };
            if t.stopped {
                // SAFETY: PTRACE_DETACH with the signal to deliver; no memory is passed.
                unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, t.pending as usize) };
            }
        }
        self.threads.clear();
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
            self.release(|_, _| false);
        }
    }
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
