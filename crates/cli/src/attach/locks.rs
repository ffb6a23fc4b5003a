//! Waiting, for a bounded time, until no thread of the target holds a lock of glibc's
//! allocator, before anything is loaded into it.
//!
//! The safe point guarantees that the chosen thread holds no lock; another thread may, for
//! as long as it likes: `malloc_stats()` writes to stderr with `fprintf` while it holds each
//! arena's mutex (glibc 2.36 malloc.c), so a full stderr pipe keeps the main arena locked.
//! `dlopen` allocates, and a call to it blocked there could only be abandoned with the
//! loader's lock taken. So the chosen thread first calls `mallinfo2()`, which takes and
//! releases each arena's mutex in turn and holds nothing while it waits for one: when it
//! returns, no thread was inside the allocator's locked part a moment ago. While it waits,
//! the command says which thread is inside the allocator and where; past
//! [`LOCK_WAIT`] (or on Ctrl-C) the call is abandoned, but only once the thread is seen
//! blocked in `futex`, that is waiting for a mutex and holding none, and the attach is
//! refused.

use super::call;
use super::image::function_at;
use super::memory::Memory;
use super::ptrace::{self, Stop, Threads};
use super::safepoint::{interrupted, SafePoint};
use std::time::{Duration, Instant};

/// How long a thread inside the allocator is waited for.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);
/// How long `mallinfo2` takes when no lock is held long: past this, the command says whom it
/// waits for.
const QUIET: Duration = Duration::from_millis(100);
/// How long the abandoned call is given to reach its `futex` wait or to return.
const ABANDON: Duration = Duration::from_secs(2);
/// `futex`, where a thread waits for a mutex.
const SYS_FUTEX: u64 = 202;
/// How far up a thread's stack its callers are looked for.
const STACK_SCAN: u64 = 64 * 1024;

/// libc's functions that take an arena's mutex: a return address into one of them on a
/// thread's stack says the thread is inside the allocator.
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

/// Returns once no arena's mutex is held (see the module documentation); an error, the
/// thread stopped with the call abandoned and holding nothing, when one stays held past the
/// wait. `libc` are libc's exported functions, `mallinfo2` its address.
pub fn wait_unlocked(
    threads: &mut Threads,
    mem: &Memory,
    point: &SafePoint,
    mallinfo2: u64,
    libc: &[(String, u64, u64)],
) -> Result<(), String> {
    let tid = point.tid;
    // `MEM_TRACE_ATTACH_LOCK_WAIT_MS`: another wait, for the tests of both outcomes.
    let limit = std::env::var("MEM_TRACE_ATTACH_LOCK_WAIT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(LOCK_WAIT, Duration::from_millis);
    let started = Instant::now();
    // mallinfo2 returns its struct of 10 words through a pointer passed first.
    call::start(
        threads,
        mem,
        tid,
        &point.regs,
        mallinfo2,
        Some(&[0; 80]),
        &[],
    )?;
    if call::wait(threads, tid, mallinfo2, started + QUIET)?.is_some() {
        return Ok(());
    }
    let who = inside_allocator(threads, mem, tid, libc);
    eprintln!(
        "mem-trace: {} holding a lock of glibc's allocator that loading the tracer needs: \
         waiting up to {} for it to leave",
        who.as_deref().map_or_else(
            || "a thread is inside the allocator,".to_string(),
            |w| format!("{w},")
        ),
        seconds(limit)
    );
    ptrace::cut_short_by_signals(true);
    let waited = call::wait(threads, tid, mallinfo2, started + limit);
    ptrace::cut_short_by_signals(false);
    let why = match waited {
        Ok(Some(_)) => return Ok(()),
        Ok(None) => None,
        Err(e) => Some(e),
    };
    if abandon(threads, tid, mallinfo2)? {
        return match why {
            None => Ok(()),
            Some(e) => Err(e),
        };
    }
    Err(why.unwrap_or_else(|| {
        let who = who.map_or_else(
            || "a thread stayed inside the allocator".to_string(),
            |w| w.replacen(" is inside", " stayed inside", 1),
        );
        format!(
            "{who} for {}, holding a lock of glibc's allocator that loading the tracer needs: \
             nothing was loaded and the process runs on as it was; attach again once it has \
             left (MEM_TRACE_ATTACH_LOCK_WAIT_MS=N waits N ms)",
            seconds(limit)
        )
    }))
}

fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// Stops the call to `func` on `tid` where it holds nothing: `Ok(true)` if it returned
/// meanwhile, `Ok(false)` if it is stopped waiting in `futex` (for a mutex, and so holding
/// none of the arenas': mallinfo2 releases each before it takes the next). While it runs
/// between the two, it is let run.
fn abandon(threads: &mut Threads, tid: i32, func: u64) -> Result<bool, String> {
    let deadline = Instant::now() + ABANDON;
    loop {
        threads.interrupt(tid);
        let stop = threads
            .wait_for(tid, deadline)
            .map_err(|e| format!("while stopping thread {tid}'s call to mallinfo2: {e}"))?;
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
                    super::inject::debug(format_args!("mallinfo2 abandoned in futex"));
                    return Ok(false);
                }
                resume(threads, true)?;
            }
            Stop::Exited => return Err(format!("thread {tid} exited during mallinfo2")),
            Stop::Signal(_) => resume(threads, false)?,
            Stop::Breakpoint(_) | Stop::Stepped => resume(threads, true)?,
        }
    }
}

/// "thread TID is inside FUNCTION (in FUNCTION)" for the first thread other than `probe`
/// found inside one of libc's [`ALLOCATOR`] functions: each stopped for a moment, its stack
/// read up to [`STACK_SCAN`] bytes for a return address into one (a guess that a stale
/// word may mislead; it only names the thread to the user). `None` if none is.
fn inside_allocator(
    threads: &mut Threads,
    mem: &Memory,
    probe: i32,
    libc: &[(String, u64, u64)],
) -> Option<String> {
    let allocator: Vec<_> = libc
        .iter()
        .filter(|(name, _, _)| ALLOCATOR.contains(&name.as_str()))
        .cloned()
        .collect();
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
                .and_then(|r| caller_in(mem, &r, &allocator).map(|f| (f, r.rip))),
        };
        let suppress = !matches!(stop, Ok(Stop::Signal(_)));
        let _ = threads.resume(tid, suppress);
        if let Some((function, rip)) = found {
            let here = match function_at(libc, rip) {
                Some(f) if f == function => String::new(),
                Some(f) => format!(" (in {f})"),
                None => format!(" (at {rip:#x})"),
            };
            return Some(format!("thread {tid} is inside {function}{here}"));
        }
    }
    None
}

/// The innermost of `functions` that a word of the stack at `r.rsp` returns into, or the one
/// `r.rip` is in.
fn caller_in(
    mem: &Memory,
    r: &libc::user_regs_struct,
    functions: &[(String, u64, u64)],
) -> Option<String> {
    if let Some(f) = function_at(functions, r.rip) {
        return Some(f.to_string());
    }
    let mut page = [0u8; 4096];
    let mut at = r.rsp & !7;
    while at < r.rsp + STACK_SCAN {
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

    #[test]
    fn a_return_address_up_the_stack_names_its_function() {
        let mem = Memory::open(std::process::id() as i32).unwrap();
        let mut stack = vec![0u64; 1024];
        stack[300] = FAKE.0 + 0x42;
        assert_eq!(
            caller_in(&mem, &at(&stack), &fake()).as_deref(),
            Some("malloc_stats")
        );
        // The function's own first byte is no return address into it.
        stack[300] = FAKE.0;
        assert_eq!(caller_in(&mem, &at(&stack), &fake()), None);
        // rip inside the function names it without a look at the stack.
        let mut r = at(&stack);
        r.rip = FAKE.0;
        assert_eq!(
            caller_in(&mem, &r, &fake()).as_deref(),
            Some("malloc_stats")
        );
    }

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
