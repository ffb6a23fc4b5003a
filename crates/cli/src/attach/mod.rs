//! `mem-trace attach PID` and `mem-trace detach PID`: the tracer loaded into a process that
//! is already running, and taken out again, with ptrace and no debugger.
//!
//! - `checks`: the refusals, made before anything is done to the process;
//! - `image`: what is mapped there, and where a module's functions are;
//! - `memory`: the process's memory, through /proc/PID/mem;
//! - `ptrace`: every thread traced, the waits, and letting them all go;
//! - `safepoint`: the thread and moment where a call cannot wait on the allocator's or the
//!   loader's locks;
//! - `dumpable`: whether the process asked not to be inspected, asked of it;
//! - `locks`: the wait until no thread holds a lock of the allocator or the loader;
//! - `loader`: whether the chosen thread is itself inside the loader (its locks' owner);
//! - `call`: one function called on a stopped thread;
//! - `inject`: calling `dlopen` and the library's entry points on that thread;
//! - `supervise`: the command split in two before it touches the process, so that killing
//!   either half does not leave a breakpoint in its allocator.
//!
//! An attach: the checks; every thread seized; the process asked whether it is dumpable; one
//! thread stopped at a safe point, and held there until no thread holds an arena's lock or
//! the loader's (one found inside the loader itself is not used); there, `dlopen(LIBRARY, RTLD_NOW)` (glibc >= 2.34 exports it from
//! libc.so.6; not `RTLD_GLOBAL`, and not `dlmopen`, whose new namespace would bring a second
//! libc and heap) and `mem_trace_attach(SETTINGS)`, which starts the tracer and redirects
//! the malloc family by rewriting GOT entries (src/attach); the thread's registers put back;
//! every thread let go. A detach calls `mem_trace_detach()` the same way.

mod call;
mod checks;
mod debug;
mod dumpable;
mod image;
mod inject;
mod libc_code;
mod loader;
mod locks;
mod memory;
pub mod pause;
mod ptrace;
mod safepoint;
mod supervise;

use crate::cli::{AttachArgs, DetachArgs};
use crate::error::{Error, Result};
use checks::{Ours, Target};
use image::Image;
use inject::Session;

/// `RTLD_NOW`: every symbol bound before `dlopen` returns, so no lazy binding runs later
/// inside a hook.
const RTLD_NOW: u64 = 2;

/// `mem-trace attach PID`.
pub fn attach(a: &AttachArgs) -> Result<()> {
    let pid = a.pid;
    let target = checks::inspect(pid)?;
    let library = match &target.ours {
        Some((_, Ours::Preloaded)) => {
            return Err(Error::new(format!(
                "process {pid} is already traced: libmem_trace.so was preloaded into it (or linked); read it with `mem-trace top {pid}` and the other readers"
            )))
        }
        Some((_, Ours::Attached)) => {
            return Err(Error::new(format!(
                "process {pid} is already traced: mem-trace attach loaded the tracer into it earlier; `mem-trace detach {pid}` stops that"
            )))
        }
        // Loaded before: `dlopen` of the same path returns the same handle, where another
        // path would load a second copy.
        Some((m, _)) => m.path.clone(),
        None => crate::run::library::find()?,
    };
    checks::library_reachable(pid, std::path::Path::new(&library))?;
    let settings = settings(a);
    let mut session = begin(pid, &target, true)?;
    let place = session.place().to_string();
    let libc = Image::read(pid, &target.libc).map_err(|e| Error::new(e.to_string()))?;
    let dlopen = libc.symbol("dlopen").map_err(|_| {
        Error::new(format!(
            "{}'s libc exports no dlopen: glibc 2.34 or later is needed",
            target.libc.path.display()
        ))
    })?;
    let path = library.to_string_lossy().into_owned();
    let handle = session
        .call(dlopen, Some(path.as_bytes()), &[RTLD_NOW])
        .map_err(Error::new)?;
    if handle == 0 {
        let why = match libc.symbol("dlerror") {
            Ok(dlerror) => match session.call(dlerror, None, &[]) {
                Ok(0) | Err(_) => "no reason given".to_string(),
                Ok(s) => session.string_at(s),
            },
            Err(_) => "no reason given".to_string(),
        };
        session.finish().map_err(Error::new)?;
        return Err(Error::new(format!(
            "process {pid} could not load {path}: {why}; the process runs on as it was"
        )));
    }
    let entry = entry_point(pid, &path, "mem_trace_attach")?;
    let rc = session.call(entry, Some(settings.as_bytes()), &[]);
    session.finish().map_err(Error::new)?;
    let rc = rc.map_err(Error::new)? as i64;
    if rc < 0 {
        return Err(Error::new(format!(
            "process {pid} loaded {path}, but the tracer did not start: {}; the process runs on untraced",
            failure(rc)
        )));
    }
    let again = matches!(target.ours, Some((_, Ours::Detached)));
    println!(
        "mem-trace: attached to process {pid} ({place}): {rc} GOT entries now call the tracer{}; blocks allocated before now are unknown to it; `mem-trace detach {pid}` stops it",
        if again { ", with the first attach's settings" } else { "" }
    );
    Ok(())
}

/// `mem-trace detach PID`.
pub fn detach(a: &DetachArgs) -> Result<()> {
    let pid = a.pid;
    let target = checks::inspect(pid)?;
    let path = match &target.ours {
        Some((m, Ours::Attached)) => m.path.to_string_lossy().into_owned(),
        Some((_, Ours::Preloaded)) => {
            return Err(Error::new(format!(
                "process {pid} was started with the tracer preloaded, not attached to: there is nothing to detach (it records until it exits)"
            )))
        }
        _ => {
            return Err(Error::new(format!(
                "process {pid} is not attached: `mem-trace attach {pid}` first"
            )))
        }
    };
    let entry = entry_point(pid, &path, "mem_trace_detach")?;
    // A detach takes our hooks out of a process that became non-dumpable since.
    let mut session = begin(pid, &target, false)?;
    let rc = session.call(entry, None, &[]);
    session.finish().map_err(Error::new)?;
    let rc = rc.map_err(Error::new)? as i64;
    if rc < 0 {
        return Err(Error::new(format!("process {pid}: {}", failure(rc))));
    }
    println!(
        "mem-trace: detached from process {pid}: {rc} GOT entries restored, the live blocks forgotten (their frees are no longer seen); the library stays loaded, idle"
    );
    Ok(())
}

/// Forks (the parent waits for the child and ends as it does, `supervise`); in the child,
/// seizes the process (refusing it if it is not dumpable, when `refuse_undumpable`) and
/// stops a thread at a safe point.
fn begin(pid: i32, target: &Target, refuse_undumpable: bool) -> Result<Session> {
    let libc = Image::read(pid, &target.libc).map_err(|e| Error::new(e.to_string()))?;
    // The safe point is at the entry of the malloc the program calls: jemalloc's, say, in a
    // program linked with it, whose threads never enter glibc's; the hooks', while attached
    // (to detach), whose calls into the allocator come from the tracer and are no safe point.
    let attached = match &target.ours {
        Some((m, Ours::Attached)) => {
            let image = Image::read(pid, m).map_err(|e| Error::new(e.to_string()))?;
            attached_entries(pid, &image).map(|entries| (image, entries))
        }
        _ => None,
    };
    let (allocator, (malloc, free)) = match attached {
        Some(found) => found,
        None => {
            let called = target.allocator.as_ref().unwrap_or(&target.libc);
            let image = Image::read(pid, called).map_err(|e| Error::new(e.to_string()))?;
            let malloc = image
                .symbol("malloc")
                .map_err(|e| Error::new(e.to_string()))?;
            let free = image
                .symbol("free")
                .map_err(|e| Error::new(e.to_string()))?;
            (image, (malloc, free))
        }
    };
    // A thread at the allocator's malloc called from the tracer's hooks is inside the
    // tracer, its guard held: no safe point either.
    let entry = |at| allocator.file_bytes(at, supervise::ENTRY);
    supervise::split(
        pid,
        &[
            (malloc, "malloc", entry(malloc)),
            (free, "free", entry(free)),
        ],
    )
    .map_err(Error::new)?;
    let ld = target
        .ld
        .as_ref()
        .ok_or_else(|| Error::new(format!("process {pid} has no ld.so mapped")))?;
    let ld_image = Image::read(pid, ld).map_err(|e| Error::new(e.to_string()))?;
    let mut unsafe_callers = vec![&target.libc, ld];
    unsafe_callers.extend(target.ours.as_ref().map(|(m, _)| m));
    unsafe_callers.extend(target.allocator.as_ref());
    Session::begin(
        pid,
        &libc,
        &ld_image,
        (malloc, free),
        &unsafe_callers,
        refuse_undumpable,
    )
}

/// The entries of the hooks' `malloc` and `free` that the GOT entries of an attached process
/// point at (`MEM_TRACE_ATTACHED_ENTRIES`, two code addresses), if the library has them.
fn attached_entries(pid: i32, ours: &Image) -> Option<(u64, u64)> {
    let at = ours.defined("MEM_TRACE_ATTACHED_ENTRIES")?;
    let mem = memory::Memory::open(pid).ok()?;
    Some((mem.read_u64(at).ok()?, mem.read_u64(at + 8).ok()?))
}

/// Where the library's exported `name` is in the process, the library mapped from `path`.
fn entry_point(pid: i32, path: &str, name: &str) -> Result<u64> {
    let modules = image::modules(pid).map_err(|e| Error::new(e.to_string()))?;
    let m = modules
        .iter()
        .find(|m| m.path.to_string_lossy() == path)
        .ok_or_else(|| Error::new(format!("process {pid}: {path} is not mapped after dlopen")))?;
    Image::read(pid, m)
        .and_then(|img| img.symbol(name))
        .map_err(|e| {
            Error::new(format!(
                "{e}: {path} is not a mem-trace library with attach (build it with `cargo build --release`)"
            ))
        })
}

/// The library's settings from the options: `NAME=VALUE` lines, the environment's names.
fn settings(a: &AttachArgs) -> String {
    let mut s = String::new();
    if let Some(mode) = a.mode {
        s += &format!("MEM_TRACE_MODE={}\n", mode.as_env());
    }
    if let Some(n) = a.sample {
        s += &format!("MEM_TRACE_SAMPLE={n}\n");
    }
    if let Some(n) = a.frames {
        s += &format!("MEM_TRACE_FRAMES={n}\n");
    }
    match &a.out {
        Some(dir) => {
            let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
            s += &format!("MEM_TRACE_PROFILE=1\nMEM_TRACE_OUT={}\n", dir.display());
        }
        // Unasked, nothing is written to the process's stderr: no report at exit.
        None => s += "MEM_TRACE_PROFILE=0\n",
    }
    s
}

/// The library's negative return values (src/attach `error`).
fn failure(rc: i64) -> &'static str {
    match rc {
        -1 => "the library in it was preloaded, not loaded by mem-trace attach",
        -2 => "the tracer could not start (out of memory for its tables)",
        -3 => "it is not attached",
        -4 => "the settings did not reach it intact",
        _ => "an unknown error",
    }
}
