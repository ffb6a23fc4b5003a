//! The program's other threads stopped for the exit report's leak scan, as LeakSanitizer
//! stops them: a tracer task ptrace-attaches to every other thread of the process, takes its
//! registers, and holds it until the scan is done.
//!
//! Why stop them: a thread that keeps allocating while the scan reads makes blocks it has just
//! linked into a reachable list look lost (the scan copied the block list before the link
//! existed, or read the list's head after it changed), and a thread's registers and the live
//! part of its stack (from its stack pointer up) are only known while it stands still. With
//! every thread stopped, each one's registers, stack and TLS are roots, threads that never
//! called `malloc` included, and a thread still running its thread-specific-data destructors
//! is scanned like any other live thread.
//!
//! How: a task cloned with `CLONE_VM` (our memory, its own process, so that ptrace allows it
//! to trace this process's threads; with no exit signal, so that the program's `wait` never
//! reaps it) seizes and interrupts each thread listed in `/proc/PID/task`, again until a pass
//! finds no new one, copies their registers into memory both share, and waits to be told to
//! let go. A thread stopped inside the tracer's own code (its `busy` flag set) may hold a lock
//! the scan needs: it is let run a millisecond at a time until it is outside. Under Yama's
//! `ptrace_scope` 1, the process names the task as its tracer first (`PR_SET_PTRACER`).
//!
//! When the threads cannot be stopped — the process is traced already (gdb), ptrace is not
//! allowed (a container, a non-dumpable process), or a thread stays inside the tracer — the
//! scan runs unstopped as before, and the report says so and why. The task's code runs on its
//! own stack in our memory, with the thread pointer of the thread that made it: it makes
//! system calls only, allocates nothing and takes no lock.

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};

/// Nonzero while a thread stops the others: a thread that leaves the tracer meanwhile waits
/// ([`park`]) until it is 0 again, so that the tracer task, which lets a thread it stopped
/// inside the tracer run on, finds it next outside, holding none of the tracer's locks (a
/// thread that allocates in a loop is inside most of the time: stopped again at a random
/// point, it would be inside again).
pub(crate) static STOPPING: AtomicU32 = AtomicU32::new(0);
/// The thread that stops the others (`pthread_self`), which never waits.
static STOPPER: AtomicU64 = AtomicU64::new(0);
/// The longest a thread waits in [`park`]: a stop that never ends must not hang the program.
const PARK_MS: u64 = 10_000;

/// Called by a thread that just left the tracer while [`STOPPING`] is set: waits until the
/// stop is over. Makes raw system calls only, so the caller's `errno` stays as it was.
#[cold]
#[inline(never)]
pub(crate) fn park() {
    // SAFETY: pthread_self has no preconditions.
    if STOPPER.load(SeqCst) == unsafe { libc::pthread_self() } as u64 {
        return;
    }
    let deadline = now_ms() + PARK_MS;
    while STOPPING.load(SeqCst) != 0 {
        let now = now_ms();
        if now >= deadline {
            return;
        }
        futex_wait(&STOPPING, 1, (deadline - now).min(100));
    }
}

/// Threads that can be stopped at once; beyond, the rest run on (and the report says so).
pub(crate) const MAX_THREADS: usize = 1024;
/// The tracer task's stack.
const STACK_BYTES: usize = 256 << 10;
/// How long the exiting thread waits for the world to stop.
const STOP_TIMEOUT_MS: u64 = 3000;
/// How many times a thread found inside the tracer is let run a millisecond.
const BUSY_TRIES: u32 = 500;

/// A stopped thread: its id and registers.
#[derive(Clone, Copy)]
pub(crate) struct Stopped {
    pub tid: i32,
    /// A signal the thread was about to take when it stopped, given back when it resumes;
    /// -1: the thread exited while stopped.
    signal: i32,
    pub regs: libc::user_regs_struct,
}

impl Stopped {
    /// Its general-purpose registers, the stack pointer left out: loose words of the scan.
    pub(crate) fn words(&self) -> [u64; 15] {
        let r = &self.regs;
        [
            r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.r8, r.r9, r.r10, r.r11, r.r12,
            r.r13, r.r14, r.r15,
        ]
    }
}

/// The task's progress, a futex word.
const STARTING: u32 = 0;
const GO: u32 = 1;
const STOPPED: u32 = 2;
const FAILED: u32 = 3;
const RESUME: u32 = 4;
const DONE: u32 = 5;

/// Memory the exiting thread and the tracer task share (one anonymous mapping).
#[repr(C)]
struct Shared {
    state: AtomicU32,
    pid: i32,
    /// The exiting thread, not stopped.
    me: i32,
    /// Where each thread's `busy` flag lies below its thread pointer (0: unknown).
    busy_below: u64,
    /// The `errno` of the ptrace call that failed, with the step that made it.
    error: AtomicI32,
    step: AtomicU32,
    /// Threads left running because there was no room, or inside the tracer.
    left: AtomicUsize,
    n: AtomicUsize,
    threads: [Stopped; MAX_THREADS],
}

/// Steps that may fail, named in the report.
const STEP_ATTACH: u32 = 1;
const STEP_BUSY: u32 = 2;
const STEP_TASKS: u32 = 3;

/// Why the world was not stopped.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NotStopped {
    /// The failing call's `errno` (0: none).
    pub errno: i32,
    pub what: &'static str,
}

/// The other threads, stopped until this is dropped.
pub(crate) struct World {
    shared: *mut Shared,
    stack: *mut u8,
    child: i32,
    started: u64,
}

/// Monotonic milliseconds.
fn now_ms() -> u64 {
    crate::clock::monotonic_ns() / 1_000_000
}

fn map(len: usize) -> Option<*mut u8> {
    // SAFETY: a fresh private anonymous mapping touches no existing memory.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

fn futex_wait(word: &AtomicU32, value: u32, ms: u64) {
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: a futex wait on a word of ours, with a relative timeout.
    unsafe {
        raw(
            libc::SYS_futex,
            word.as_ptr() as u64,
            libc::FUTEX_WAIT as u64,
            value as u64,
            &ts as *const libc::timespec as u64,
        )
    };
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: wakes waiters on a word of ours.
    unsafe {
        raw(
            libc::SYS_futex,
            word.as_ptr() as u64,
            libc::FUTEX_WAKE as u64,
            i32::MAX as u64,
            0,
        )
    };
}

impl World {
    /// Stops every thread of the process but the calling one. `busy_below`: where a thread's
    /// `busy` flag lies below its thread pointer, when every thread has it at the same place
    /// (the library in static TLS); without it nothing is stopped, since a thread stopped
    /// inside the tracer could hold a lock the scan takes.
    pub(crate) fn stop(busy_below: Option<u64>) -> Result<World, NotStopped> {
        let Some(busy_below) = busy_below else {
            return Err(NotStopped {
                errno: 0,
                what: "the library's thread state is not in static TLS",
            });
        };
        let fail = |what| NotStopped { errno: 0, what };
        let shared_len = core::mem::size_of::<Shared>().next_multiple_of(4096);
        let shared = map(shared_len).ok_or(fail("no memory"))? as *mut Shared;
        let Some(stack) = map(STACK_BYTES) else {
            // SAFETY: the mapping just made.
            unsafe { libc::munmap(shared.cast(), shared_len) };
            return Err(fail("no memory"));
        };
        // SAFETY: `shared` is a fresh zeroed mapping of the struct's size; all-zero is a valid
        // `Shared` (atomics, integers, plain register structs).
        let sh = unsafe { &mut *shared };
        // SAFETY: getpid and gettid have no preconditions.
        sh.pid = unsafe { libc::getpid() };
        // SAFETY: as above.
        sh.me = unsafe { libc::gettid() };
        sh.busy_below = busy_below;
        let mut world = World {
            shared,
            stack,
            child: 0,
            started: now_ms(),
        };
        // The usual case, a program that ends with one thread: nothing to stop.
        let mut tids = [0i32; MAX_THREADS];
        if list_tasks(sh.pid, &mut tids).is_some_and(|n| tids[..n] == [sh.me]) {
            return Ok(world);
        }
        // SAFETY: pthread_self has no preconditions.
        STOPPER.store(unsafe { libc::pthread_self() } as u64, SeqCst);
        STOPPING.store(1, SeqCst);
        // SAFETY: the task runs `tracer` on its own stack, sharing our memory; `shared`
        // outlives it (unmapped only after it has been reaped, in `drop`).
        let child = unsafe {
            libc::clone(
                tracer,
                stack.add(STACK_BYTES).cast(),
                libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_UNTRACED,
                shared.cast(),
            )
        };
        if child <= 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            world.child = 0;
            drop(world);
            return Err(NotStopped {
                errno,
                what: "clone",
            });
        }
        world.child = child;
        // Under Yama's ptrace_scope 1, only a tracer the process names may attach to it
        // (EINVAL without Yama: nothing to do).
        // SAFETY: sets a process attribute, undone in `drop`.
        unsafe { libc::prctl(libc::PR_SET_PTRACER, child as libc::c_ulong, 0, 0, 0) };
        world.shared().state.store(GO, SeqCst);
        futex_wake(&world.shared().state);
        let deadline = world.started + STOP_TIMEOUT_MS;
        loop {
            let s = world.shared().state.load(SeqCst);
            if s == STOPPED {
                return Ok(world);
            }
            let now = now_ms();
            if s == FAILED || now >= deadline || !world.child_alive() {
                let sh = world.shared();
                let (errno, step) = (sh.error.load(SeqCst), sh.step.load(SeqCst));
                drop(world);
                return Err(NotStopped {
                    errno,
                    what: match step {
                        STEP_ATTACH => "ptrace",
                        STEP_BUSY => "a thread stayed inside the tracer",
                        STEP_TASKS => "/proc/self/task",
                        _ => "timed out",
                    },
                });
            }
            futex_wait(&world.shared().state, s, (deadline - now).min(100));
        }
    }

    fn shared(&self) -> &Shared {
        // SAFETY: mapped in `stop`, unmapped only in `drop`.
        unsafe { &*self.shared }
    }

    fn child_alive(&mut self) -> bool {
        let mut status = 0;
        // SAFETY: polls our own task, no wait.
        let r = unsafe { libc::waitpid(self.child, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == self.child {
            // Reaped: nothing to reap in `drop`.
            self.child = 0;
            return false;
        }
        r == 0
    }

    /// The stopped threads.
    pub(crate) fn threads(&self) -> &[Stopped] {
        let sh = self.shared();
        &sh.threads[..sh.n.load(SeqCst).min(MAX_THREADS)]
    }

    /// Threads left running (no room for them).
    pub(crate) fn left_running(&self) -> usize {
        self.shared().left.load(SeqCst)
    }

    /// Milliseconds since the stop began.
    pub(crate) fn elapsed_ms(&self) -> u64 {
        now_ms() - self.started
    }

    /// The memory this stop mapped, which the scan must not take for the program's.
    pub(crate) fn own_ranges(&self) -> [(u64, u64); 2] {
        let shared_len = core::mem::size_of::<Shared>().next_multiple_of(4096) as u64;
        [
            (self.shared as u64, self.shared as u64 + shared_len),
            (self.stack as u64, self.stack as u64 + STACK_BYTES as u64),
        ]
    }
}

impl Drop for World {
    /// Lets the threads go, reaps the task, and unmaps what was shared.
    fn drop(&mut self) {
        if self.child > 0 {
            self.shared().state.store(RESUME, SeqCst);
            futex_wake(&self.shared().state);
            let deadline = now_ms() + STOP_TIMEOUT_MS;
            loop {
                let mut status = 0;
                // SAFETY: reaps our own task.
                let r =
                    unsafe { libc::waitpid(self.child, &mut status, libc::__WALL | libc::WNOHANG) };
                if r != 0 {
                    break;
                }
                if now_ms() >= deadline {
                    // A task that does not finish is killed: the kernel detaches its tracees,
                    // which run on.
                    // SAFETY: our own task.
                    unsafe {
                        libc::kill(self.child, libc::SIGKILL);
                        libc::waitpid(self.child, &mut status, libc::__WALL);
                    }
                    break;
                }
                let s = self.shared().state.load(SeqCst);
                if s != DONE {
                    futex_wait(&self.shared().state, s, 10);
                } else {
                    let ts = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 100_000,
                    };
                    // SAFETY: sleeps on a local timespec.
                    unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
                }
            }
            // SAFETY: undoes `stop`'s attribute change.
            unsafe { libc::prctl(libc::PR_SET_PTRACER, 0, 0, 0, 0) };
        }
        STOPPING.store(0, SeqCst);
        futex_wake(&STOPPING);
        let shared_len = core::mem::size_of::<Shared>().next_multiple_of(4096);
        // SAFETY: the mappings made in `stop`; the task that used them is gone.
        unsafe {
            libc::munmap(self.stack.cast(), STACK_BYTES);
            libc::munmap(self.shared.cast(), shared_len);
        }
    }
}

/// A raw system call's result: `-errno` on failure, as the kernel returns it. The task shares
/// the thread pointer of the thread that made it, so it leaves `errno` alone.
#[inline(always)]
unsafe fn raw(n: i64, a: u64, b: u64, c: u64, d: u64) -> i64 {
    // SAFETY: forwarded contract.
    unsafe { raw6(n, [a, b, c, d, 0, 0]) }
}

/// [`raw`] with six arguments.
#[inline(always)]
unsafe fn raw6(n: i64, a: [u64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: the caller's system call and arguments; the kernel clobbers rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") n => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2], in("r10") a[3], in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// The tracer task: stops every thread, then waits for `RESUME` and lets them go.
extern "C" fn tracer(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Shared` mapping `World::stop` made, alive until we are reaped.
    let sh = unsafe { &mut *(arg as *mut Shared) };
    while sh.state.load(SeqCst) == STARTING {
        futex_wait(&sh.state, STARTING, 100);
    }
    let ok = stop_all(sh);
    sh.state.store(if ok { STOPPED } else { FAILED }, SeqCst);
    futex_wake(&sh.state);
    if ok {
        while sh.state.load(SeqCst) != RESUME {
            futex_wait(&sh.state, STOPPED, 1000);
        }
    }
    let n = sh.n.load(SeqCst).min(MAX_THREADS);
    for t in sh.threads[..n].iter().filter(|t| t.signal >= 0) {
        // SAFETY: detaches a thread this task attached; it resumes with its pending signal.
        unsafe {
            raw(
                libc::SYS_ptrace,
                libc::PTRACE_DETACH as u64,
                t.tid as u64,
                0,
                t.signal as u64,
            )
        };
    }
    sh.state.store(DONE, SeqCst);
    futex_wake(&sh.state);
    0
}

fn fail(sh: &Shared, step: u32, ret: i64) -> bool {
    sh.error.store((-ret) as i32, SeqCst);
    sh.step.store(step, SeqCst);
    false
}

/// Attaches every thread but the exiting one, until a pass over the task list finds no new
/// one; then lets those inside the tracer out. Whether all are stopped.
fn stop_all(sh: &mut Shared) -> bool {
    let mut tids = [0i32; MAX_THREADS];
    for _pass in 0..64 {
        let Some(listed) = list_tasks(sh.pid, &mut tids) else {
            return fail(sh, STEP_TASKS, -(libc::EIO as i64));
        };
        let mut new = 0;
        for &tid in &tids[..listed] {
            let n = sh.n.load(SeqCst);
            if tid == sh.me || sh.threads[..n].iter().any(|t| t.tid == tid) {
                continue;
            }
            if n == MAX_THREADS {
                sh.left.fetch_add(1, SeqCst);
                continue;
            }
            match seize(tid) {
                Ok(Some(signal)) => {
                    sh.threads[n] = Stopped {
                        tid,
                        signal,
                        // SAFETY: all-zero is a valid register struct; filled below.
                        regs: unsafe { core::mem::zeroed() },
                    };
                    sh.n.store(n + 1, SeqCst);
                    new += 1;
                }
                // Gone meanwhile.
                Ok(None) => {}
                Err(e) => return fail(sh, STEP_ATTACH, e),
            }
        }
        if new == 0 {
            break;
        }
    }
    out_of_tracer(sh)
}

/// Seizes and interrupts `tid`, and waits for it to stop: `Some(signal)` (a signal it was
/// about to take, or 0) once stopped, `None` if it exited meanwhile.
fn seize(tid: i32) -> Result<Option<i32>, i64> {
    // SAFETY: ptrace on a thread of the process that made this task.
    let r = unsafe {
        raw(
            libc::SYS_ptrace,
            libc::PTRACE_SEIZE as u64,
            tid as u64,
            0,
            0,
        )
    };
    if r == -(libc::ESRCH as i64) {
        return Ok(None);
    }
    if r < 0 {
        return Err(r);
    }
    // SAFETY: as above, on a thread this task now traces.
    unsafe {
        raw(
            libc::SYS_ptrace,
            libc::PTRACE_INTERRUPT as u64,
            tid as u64,
            0,
            0,
        )
    };
    wait_stop(tid)
}

/// Waits for the traced thread `tid` to stop (see [`seize`]).
fn wait_stop(tid: i32) -> Result<Option<i32>, i64> {
    loop {
        let mut status = 0i32;
        // SAFETY: waits for a thread this task traces; writes a local.
        let r = unsafe {
            raw(
                libc::SYS_wait4,
                tid as u64,
                &mut status as *mut i32 as u64,
                libc::__WALL as u64,
                0,
            )
        };
        if r == -(libc::EINTR as i64) {
            continue;
        }
        if r < 0 {
            return Ok(None);
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Ok(None);
        }
        if libc::WIFSTOPPED(status) {
            let event = (status >> 16) & 0xff;
            let signal = if event == libc::PTRACE_EVENT_STOP {
                0
            } else {
                libc::WSTOPSIG(status)
            };
            return Ok(Some(signal));
        }
    }
}

/// Reads every stopped thread's registers; while some are inside the tracer (their `busy`
/// flag set: they may hold one of the tracer's locks), lets those run a millisecond together
/// (one may wait for a lock another holds) and stops them again: leaving the tracer, each
/// waits in [`park`] meanwhile. Whether all are stopped outside.
fn out_of_tracer(sh: &mut Shared) -> bool {
    let n = sh.n.load(SeqCst).min(MAX_THREADS);
    let mut busy = [false; MAX_THREADS];
    for _ in 0..BUSY_TRIES {
        let mut any = false;
        for (i, t) in sh.threads[..n].iter_mut().enumerate() {
            busy[i] = false;
            if t.regs.rsp == 0 && t.regs.fs_base == 0 && t.signal < 0 {
                continue;
            }
            // SAFETY: reads the registers of a stopped thread this task traces into its slot.
            let r = unsafe {
                raw(
                    libc::SYS_ptrace,
                    libc::PTRACE_GETREGS as u64,
                    t.tid as u64,
                    0,
                    &mut t.regs as *mut libc::user_regs_struct as u64,
                )
            };
            if r < 0 {
                sh.error.store((-r) as i32, SeqCst);
                return false;
            }
            let mut flag = [0u8; 1];
            let flag_at = t.regs.fs_base.wrapping_sub(sh.busy_below);
            busy[i] = !read_self(sh.pid, flag_at, &mut flag) || flag[0] != 0;
            any |= busy[i];
        }
        if !any {
            return true;
        }
        for (i, t) in sh.threads[..n].iter_mut().enumerate() {
            if busy[i] {
                // SAFETY: resumes a thread this task traces, with the signal it was about
                // to take.
                unsafe {
                    raw(
                        libc::SYS_ptrace,
                        libc::PTRACE_CONT as u64,
                        t.tid as u64,
                        0,
                        t.signal as u64,
                    )
                };
                t.signal = 0;
            }
        }
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        // SAFETY: a sleep on a local timespec.
        unsafe { raw(libc::SYS_nanosleep, &ts as *const _ as u64, 0, 0, 0) };
        for (i, t) in sh.threads[..n].iter_mut().enumerate() {
            if !busy[i] {
                continue;
            }
            // SAFETY: stops it again.
            unsafe {
                raw(
                    libc::SYS_ptrace,
                    libc::PTRACE_INTERRUPT as u64,
                    t.tid as u64,
                    0,
                    0,
                )
            };
            match wait_stop(t.tid) {
                Ok(Some(signal)) => t.signal = signal,
                // It exited: nothing of it to scan, nothing to detach.
                _ => {
                    t.regs.rsp = 0;
                    t.regs.fs_base = 0;
                    t.signal = -1;
                }
            }
        }
    }
    false
}

/// Reads `buf.len()` bytes at `addr` of process `pid` (ours), failing cleanly on unmapped
/// memory.
fn read_self(pid: i32, addr: u64, buf: &mut [u8]) -> bool {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: writes only into `buf`; the kernel checks the remote range.
    let r = unsafe {
        raw6(
            libc::SYS_process_vm_readv,
            [
                pid as u64,
                &local as *const _ as u64,
                1,
                &remote as *const _ as u64,
                1,
                0,
            ],
        )
    };
    r == buf.len() as i64
}

/// Lists `/proc/PID/task` into `tids`; the count, `None` if it cannot be read.
fn list_tasks(pid: i32, tids: &mut [i32; MAX_THREADS]) -> Option<usize> {
    let mut path = [0u8; 32];
    let prefix = b"/proc/";
    path[..prefix.len()].copy_from_slice(prefix);
    let mut at = prefix.len();
    let mut digits = [0u8; 12];
    let mut d = 0;
    let mut v = pid as u32;
    loop {
        digits[d] = b'0' + (v % 10) as u8;
        d += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while d > 0 {
        d -= 1;
        path[at] = digits[d];
        at += 1;
    }
    let suffix = b"/task\0";
    path[at..at + suffix.len()].copy_from_slice(suffix);
    // SAFETY: a NUL-terminated path in a local buffer.
    let fd = unsafe {
        raw(
            libc::SYS_open,
            path.as_ptr() as u64,
            (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
            0,
            0,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut n = 0;
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: fills a local buffer with directory entries.
        let got = unsafe {
            raw(
                libc::SYS_getdents64,
                fd as u64,
                buf.as_mut_ptr() as u64,
                buf.len() as u64,
                0,
            )
        };
        if got <= 0 {
            break;
        }
        let mut off = 0usize;
        while off + 19 < got as usize {
            // No slicing that could panic: a panic here would abort through the thread
            // pointer of the thread that made this task, killing the program.
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            let Some(name) = buf.get(off + 19..(off + reclen).min(got as usize)) else {
                break;
            };
            let mut tid = 0i32;
            let mut digits = 0;
            for &c in name.iter().take_while(|&&c| c != 0) {
                if !c.is_ascii_digit() {
                    digits = 0;
                    break;
                }
                tid = tid.saturating_mul(10).saturating_add((c - b'0') as i32);
                digits += 1;
            }
            if digits > 0 && n < MAX_THREADS {
                tids[n] = tid;
                n += 1;
            }
            if reclen == 0 {
                break;
            }
            off += reclen;
        }
    }
    // SAFETY: closes the descriptor opened above.
    unsafe { raw(libc::SYS_close, fd as u64, 0, 0, 0) };
    Some(n)
}
