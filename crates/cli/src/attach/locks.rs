//! Waiting, for a bounded time, until no thread of the target holds a lock that loading
//! the tracer needs, before anything is loaded into it: each of glibc's allocator's arena
//! mutexes, then the loader's `dl_load_lock`.
//!
//! The safe point guarantees that the chosen thread holds no lock of the allocator's, and
//! `loader` that it holds none of the loader's (they are recursive: a probe passes on their
//! owner); another thread may, for as long as it likes: `malloc_stats()` writes to stderr with `fprintf` while it holds each
//! arena's mutex (glibc 2.36 malloc.c), so a full stderr pipe keeps the main arena locked;
//! a library's constructor runs inside `dlopen` with `dl_load_lock` held (glibc 2.36
//! dl-open.c), so one that blocks keeps the loader locked. `dlopen` takes both, and a call
//! to it blocked there could only be abandoned with the loader's lock taken. So the chosen
//! thread first calls, for each lock, a [`Probe`]: a function that takes and releases it and
//! holds nothing while it waits for it. When it returns, no thread held the lock a moment
//! ago. While it waits, the command says which thread holds it and where; past
//! [`LOCK_WAIT`] (or on Ctrl-C) the call is abandoned, but only once the thread is seen
//! blocked in `futex`, that is waiting for a mutex and holding none, and the attach is
//! refused.

use super::call;
use super::image::function_at;
use super::libc_code::LibcCode;
use super::loader::{self, Held, Reach};
use super::memory::Memory;
use super::ptrace::{self, Stop, Threads};
use super::safepoint::{interrupted, SafePoint};
use std::time::{Duration, Instant};

/// How long a thread holding a lock is waited for.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);
/// How long a probe takes when no lock is held long: past this, the command says whom it
/// waits for.
const QUIET: Duration = Duration::from_millis(100);
/// How long the abandoned call is given to reach its `futex` wait or to return.
const ABANDON: Duration = Duration::from_secs(2);
/// `futex`, where a thread waits for a mutex.
const SYS_FUTEX: u64 = 202;
/// How far up a thread's stack its callers are looked for.
const STACK_SCAN: u64 = 64 * 1024;

/// A call that takes and releases one lock, and what the messages say about it.
pub struct Probe<'a> {
    /// The function's name, for the messages.
    pub name: &'static str,
    /// Its address in the target.
    pub func: u64,
    /// Bytes copied to the thread's stack and passed first (see `call::start`), if any.
    pub data: Option<&'a [u8]>,
    /// The arguments after that.
    pub args: &'a [u64],
    /// The lock in words: "the loader's lock".
    pub lock: &'static str,
    /// What a thread holding it is inside: "the loader".
    pub inside: &'static str,
    /// libc's functions that take the lock: a return address into one of them on a
    /// thread's stack names that thread as the holder.
    pub holders: &'static [&'static str],
    /// Where the call holds the lock, when it is asked whether the chosen thread itself
    /// held it before (`loader`).
    pub reach: Option<Reach>,
}

/// libc's functions that take an arena's mutex.
const ALLOCATOR: [&str; 16] = [
    "malloc",
    "free",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "malloc_stats",
    "malloc_info",
    "malloc_trim",
    "mallinfo",
    "mallinfo2",
    "mallopt",
];

/// libc's exported functions (glibc 2.34 moved them from libdl) that run with the loader's
/// `dl_load_lock` held, or inside whose callbacks a thread keeps `dlopen` waiting with it
/// held (`dl_iterate_phdr` holds `dl_load_write_lock`, which `dlopen` takes under
/// `dl_load_lock`).
const LOADER: [&str; 9] = [
    "dlopen",
    "dlmopen",
    "dlclose",
    "dlsym",
    "dlvsym",
    "dladdr",
    "dladdr1",
    "dlinfo",
    "dl_iterate_phdr",
];

/// The allocator's probe: `mallinfo2()` takes and releases each arena's mutex in turn and
/// holds none while it waits for one. It returns its struct of 10 words through a pointer
/// passed first: `buffer`, 80 bytes.
pub fn allocator(mallinfo2: u64, buffer: &[u8; 80]) -> Probe<'_> {
    Probe {
        name: "mallinfo2",
        func: mallinfo2,
        data: Some(buffer),
        args: &[],
        lock: "a lock of glibc's allocator",
        inside: "the allocator",
        holders: &ALLOCATOR,
        reach: None,
    }
}

/// The loader's probe: glibc 2.36's `dladdr` is `_dl_addr`, which takes `dl_load_lock`
/// before it looks the address up and releases it after. The address is the probe's own
/// data on the thread's stack, in no loaded object: it returns 0 without writing `info`,
/// which is NULL. `reach`: `_dl_find_dso_for_object`, which `_dl_addr` calls with the lock
/// taken.
pub fn loader(dladdr: u64, reach: Option<Reach>) -> Probe<'static> {
    Probe {
        name: "dladdr",
        func: dladdr,
        data: Some(&[0; 8]),
        args: &[0],
        lock: "the loader's lock",
        inside: "the loader",
        holders: &LOADER,
        reach,
    }
}

/// The loader's list lock: glibc 2.36's `dl_iterate_phdr` holds `dl_load_write_lock`
/// while it calls its callback for each loaded object, and `dlopen` takes that lock, under
/// `dl_load_lock`, to add the new object to the list; `dladdr` does not take it. The
/// callback is `getpid`, which ignores its arguments and returns non-zero: the walk stops
/// at the first object. `rtld_global`: where the loader's locks are, to ask whether the
/// chosen thread held this one (`loader`): the callback runs with it taken.
pub fn loader_list(
    dl_iterate_phdr: u64,
    getpid: &[u64; 2],
    rtld_global: Option<(u64, usize)>,
) -> Probe<'_> {
    Probe {
        name: "dl_iterate_phdr",
        func: dl_iterate_phdr,
        data: None,
        args: getpid,
        lock: "the loader's list lock",
        inside: "the loader",
        holders: &["dl_iterate_phdr"],
        reach: rtld_global.map(|data| Reach {
            code: (getpid[0], getpid[0] + 1),
            data,
        }),
    }
}

/// `MEM_TRACE_ATTACH_LOCK_WAIT_MS`, or [`LOCK_WAIT`]: how long a thread holding a lock, or
/// inside the loader, is waited for.
pub fn lock_wait() -> Duration {
    std::env::var("MEM_TRACE_ATTACH_LOCK_WAIT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(LOCK_WAIT, Duration::from_millis)
}

/// Returns once the probe's lock is free (see the module documentation), with whether the
/// chosen thread itself held it before (when the probe has a `reach`); an error, the thread
/// stopped with the call abandoned and holding nothing, when it stays held past the wait.
/// `libc` is libc's code.
pub fn wait_unlocked(
    threads: &mut Threads,
    mem: &Memory,
    point: &SafePoint,
    probe: &Probe,
    libc: &LibcCode,
) -> Result<Held, String> {
    let tid = point.tid;
    let func = probe.func;
    // `MEM_TRACE_ATTACH_LOCK_WAIT_MS`: another wait, for the tests of both outcomes.
    let limit = lock_wait();
    let started = Instant::now();
    // A failure to tell is reported once the call has returned: stopped midway, it may
    // hold the lock.
    let mut untold = None;
    let held = match &probe.reach {
        None => {
            call::start(threads, mem, tid, &point.regs, func, probe.data, probe.args)?;
            Held::Unknown
        }
        Some(reach) => {
            call::prepare(mem, tid, &point.regs, func, probe.data, probe.args)?;
            let held = loader::held_before(threads, mem, tid, reach, probe.name);
            threads
                .resume(tid, false)
                .map_err(|e| format!("cannot resume thread {tid}: {e}"))?;
            held.unwrap_or_else(|e| {
                untold = Some(e);
                Held::Unknown
            })
        }
    };
    let done = |untold: Option<String>| untold.map_or(Ok(held), Err);
    // Quiet from here: the steps take their own time, nothing to do with a lock's holder.
    if call::wait(threads, tid, func, Instant::now() + QUIET)?.is_some() {
        return done(untold);
    }
    let who = holder(threads, mem, tid, libc, probe.holders);
    eprintln!(
        "mem-trace: {} holding {} that loading the tracer needs: waiting up to {} for it to \
         leave",
        who.as_deref().map_or_else(
            || format!("a thread is inside {},", probe.inside),
            |w| format!("{w},")
        ),
        probe.lock,
        seconds(limit)
    );
    ptrace::cut_short_by_signals(true);
    let waited = call::wait(threads, tid, func, started + limit);
    ptrace::cut_short_by_signals(false);
    let why = match waited {
        Ok(Some(_)) => return done(untold),
        Ok(None) => None,
        Err(e) => Some(e),
    };
    if abandon(threads, tid, probe)? {
        return match why {
            None => done(untold),
            Some(e) => Err(e),
        };
    }
    Err(why.unwrap_or_else(|| {
        let who = who.map_or_else(
            || format!("a thread stayed inside {}", probe.inside),
            |w| w.replacen(" is inside", " stayed inside", 1),
        );
        format!(
            "{who} for {}, holding {} that loading the tracer needs: nothing was loaded and \
             the process runs on as it was; attach again once it has left \
             (MEM_TRACE_ATTACH_LOCK_WAIT_MS=N waits N ms)",
            seconds(limit),
            probe.lock
        )
    }))
}

fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// Stops the probe's call on `tid` where it holds nothing: `Ok(true)` if it returned
/// meanwhile, `Ok(false)` if it is stopped waiting in `futex` (for a mutex, and so holding
/// none: mallinfo2 releases each arena's before it takes the next, dladdr takes only one).
/// While it runs between the two, it is let run.
fn abandon(threads: &mut Threads, tid: i32, probe: &Probe) -> Result<bool, String> {
    let (name, func) = (probe.name, probe.func);
    let deadline = Instant::now() + ABANDON;
    loop {
        threads.interrupt(tid);
        let stop = threads
            .wait_for(tid, deadline)
            .map_err(|e| format!("while stopping thread {tid}'s call to {name}: {e}"))?;
        let resume = |threads: &mut Threads, suppress| {
            threads
                .resume(tid, suppress)
                .map_err(|e| format!("cannot resume thread {tid}: {e}"))
        };
        match stop {
            Stop::Signal(libc::SIGSEGV) => return call::ended(threads, tid, func).map(|_| true),
            Stop::Interrupted => {
                let r = ptrace::regs(tid).map_err(|e| format!("thread {tid}: {e}"))?;
                // Cut short while still queued on the futex: not woken, so no wake-up is
                // lost with it, and the mutex never became its.
                if r.orig_rax == SYS_FUTEX && interrupted(r.rax) {
                    super::debug::debug(format_args!("{name} abandoned in futex"));
                    return Ok(false);
                }
                resume(threads, true)?;
            }
            Stop::Exited => return Err(format!("thread {tid} exited during {name}")),
            Stop::Signal(_) => resume(threads, false)?,
            Stop::Breakpoint(_) | Stop::Stepped => resume(threads, true)?,
        }
    }
}

/// "thread TID is inside FUNCTION (in FUNCTION)" for the first thread other than `probe`
/// found inside one of libc's functions named in `holders`: each stopped for a moment and
/// its callers found ([`caller_in`]). `None` if none is.
fn holder(
    threads: &mut Threads,
    mem: &Memory,
    probe: i32,
    libc: &LibcCode,
    holders: &[&str],
) -> Option<String> {
    let holding = named(libc, holders);
    for tid in threads.tids() {
        if tid == probe {
            continue;
        }
        threads.interrupt(tid);
        let stop = threads.wait_for(tid, Instant::now() + Duration::from_secs(1));
        let found = match stop {
            Ok(Stop::Exited) | Err(_) => continue,
            Ok(_) => ptrace::regs(tid)
                .ok()
                .and_then(|r| caller_in(mem, &r, libc, &holding).map(|f| (f, r.rip))),
        };
        let suppress = !matches!(stop, Ok(Stop::Signal(_)));
        let _ = threads.resume(tid, suppress);
        if let Some((function, rip)) = found {
            return Some(format!(
                "thread {tid} is inside {}",
                in_function(&function, rip, libc)
            ));
        }
    }
    None
}

/// "dlopen (in read)": the innermost of the probe's `holders` that the thread stopped with
/// registers `r` is inside ([`caller_in`]), or the probe's `inside`, and the function its
/// rip is in.
pub fn place(mem: &Memory, r: &libc::user_regs_struct, libc: &LibcCode, probe: &Probe) -> String {
    let holding = named(libc, probe.holders);
    let function = caller_in(mem, r, libc, &holding).unwrap_or_else(|| probe.inside.to_string());
    in_function(&function, r.rip, libc)
}

/// libc's functions named in `names`.
fn named(libc: &LibcCode, names: &[&str]) -> Vec<(String, u64, u64)> {
    libc.functions
        .iter()
        .filter(|(name, _, _)| names.contains(&name.as_str()))
        .cloned()
        .collect()
}

/// "FUNCTION (in WHERE)", WHERE the function of `libc` that `rip` is in, unless the same.
fn in_function(function: &str, rip: u64, libc: &LibcCode) -> String {
    match libc.function_at(rip) {
        Some(f) if f == function => function.to_string(),
        Some(f) => format!("{function} (in {f})"),
        None => format!("{function} (at {rip:#x})"),
    }
}

/// The innermost of `functions` the thread stopped with registers `r` is inside: its libc
/// frames, walked by their CFI, then, beyond them, the first word up the stack that returns
/// into one (a guess that a stale word may mislead; it only names the thread to the user),
/// up to [`STACK_SCAN`] bytes.
fn caller_in(
    mem: &Memory,
    r: &libc::user_regs_struct,
    libc: &LibcCode,
    functions: &[(String, u64, u64)],
) -> Option<String> {
    let walk = libc.walk(mem, r);
    if let Some(f) = walk.frames.iter().find_map(|&a| function_at(functions, a)) {
        return Some(f.to_string());
    }
    if let Some(f) = function_at(functions, r.rip) {
        return Some(f.to_string());
    }
    scan_up(mem, walk.beyond.unwrap_or(r.rsp), functions)
}

/// The first of `functions` that a word of the stack from `sp` up returns into.
fn scan_up(mem: &Memory, sp: u64, functions: &[(String, u64, u64)]) -> Option<String> {
    let mut page = [0u8; 4096];
    let mut at = sp & !7;
    while at < sp + STACK_SCAN {
        // Read to the end of the page, then page by page, until the stack's mapping ends.
        let n = (4096 - (at & 4095)) as usize;
        mem.read(at, &mut page[..n]).ok()?;
        for word in page[..n].chunks_exact(8) {
            let w = u64::from_le_bytes(word.try_into().ok()?);
            // A return address lies past its function's first byte.
            if let Some(f) = function_at(functions, w.wrapping_sub(1)) {
                return Some(f.to_string());
            }
        }
        at += n as u64;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function range no real code of this process is at.
    const FAKE: (u64, u64) = (0x1234_5678_9000, 0x1234_5678_9100);

    fn fake() -> Vec<(String, u64, u64)> {
        vec![("malloc_stats".to_string(), FAKE.0, FAKE.1)]
    }

    /// Registers with rip nowhere and rsp at `stack`.
    fn at(stack: &[u64]) -> libc::user_regs_struct {
        // SAFETY: an all-zero register set is a valid value.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        r.rsp = stack.as_ptr() as u64;
        r
    }

    /// This process's libc.
    fn own_libc() -> LibcCode {
        use super::super::image::{find, modules, Image};
        let me = std::process::id() as i32;
        let m = modules(me).unwrap();
        LibcCode::new(&Image::read(me, find(&m, "libc.so.6").expect("libc mapped")).unwrap())
    }

    #[test]
    fn a_return_address_up_the_stack_names_its_function() {
        let mem = Memory::open(std::process::id() as i32).unwrap();
        let libc = own_libc();
        let mut stack = vec![0u64; 1024];
        stack[300] = FAKE.0 + 0x42;
        assert_eq!(
            caller_in(&mem, &at(&stack), &libc, &fake()).as_deref(),
            Some("malloc_stats")
        );
        // The function's own first byte is no return address into it.
        stack[300] = FAKE.0;
        assert_eq!(caller_in(&mem, &at(&stack), &libc, &fake()), None);
        // rip inside the function names it without a look at the stack.
        let mut r = at(&stack);
        r.rip = FAKE.0;
        assert_eq!(
            caller_in(&mem, &r, &libc, &fake()).as_deref(),
            Some("malloc_stats")
        );
    }

    /// A thread in libc's `getpid`, called from outside libc: the CFI walk ends at its
    /// caller, so a stale return address below the caller's stack pointer (in no live frame)
    /// is never taken, while one in the caller's frame, beyond libc, is found by the scan.
    #[test]
    fn a_stale_word_inside_a_walked_libc_frame_is_not_taken() {
        let mem = Memory::open(std::process::id() as i32).unwrap();
        let libc = own_libc();
        let getpid = libc
            .functions
            .iter()
            .find(|(n, _, _)| n == "getpid")
            .map(|&(_, lo, _)| lo)
            .unwrap();
        let outside = fake_caller as *const () as u64 + 1;
        // rip at getpid's first byte: its return address is the word at rsp.
        let mut stack = vec![0u64; 64];
        stack[0] = outside;
        let mut r = at(&stack);
        r.rip = getpid;
        assert_eq!(caller_in(&mem, &r, &libc, &fake()), None);
        // A stale word at rsp - 8 is below every live frame: the scan starts above it.
        let mut stack = vec![0u64; 64];
        stack[0] = FAKE.0 + 0x42;
        stack[1] = outside;
        let mut r = at(&stack[1..]);
        r.rip = getpid;
        assert_eq!(caller_in(&mem, &r, &libc, &fake()), None);
        // Beyond the libc frames, the caller's frame is searched.
        stack[5] = FAKE.0 + 0x42;
        assert_eq!(
            caller_in(&mem, &r, &libc, &fake()).as_deref(),
            Some("malloc_stats")
        );
    }

    fn fake_caller() {}

    #[test]
    fn the_alias_without_underscores_is_the_name() {
        let functions = vec![
            ("__libc_write".to_string(), 0x10, 0x20),
            ("write".to_string(), 0x10, 0x20),
            ("__write".to_string(), 0x10, 0x20),
            ("__write_nocancel".to_string(), 0x30, 0x40),
        ];
        assert_eq!(function_at(&functions, 0x15), Some("write"));
        assert_eq!(function_at(&functions, 0x30), Some("__write_nocancel"));
        assert_eq!(function_at(&functions, 0x20), None);
    }
}
