//! What `mem-trace attach` and `detach` check before they touch the process, each refusal one
//! line saying why and what to do. Everything here reads /proc; nothing stops the target.

use super::image::{self, Image, Module};
use super::memory::peek_u32;
use crate::error::Error;
use mem_trace_read::target::{ptrace_scope, scope_advice};
use std::os::unix::fs::MetadataExt;

/// How the library came into the process (`MEM_TRACE_ATTACH_STATE` in src/attach).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ours {
    /// Preloaded, or linked into the program.
    Preloaded,
    /// Loaded by an attach that did not finish.
    Loaded,
    /// Attached.
    Attached,
    /// Detached.
    Detached,
}

impl Ours {
    fn from_state(v: u32) -> Option<Ours> {
        Some(match v {
            0 => Ours::Preloaded,
            1 => Ours::Loaded,
            2 => Ours::Attached,
            3 => Ours::Detached,
            _ => return None,
        })
    }
}

/// A process checked for an attach or a detach.
pub struct Target {
    /// glibc's libc.so.6.
    pub libc: Module,
    /// ld.so.
    pub ld: Option<Module>,
    /// The library, when it is mapped, and its state.
    pub ours: Option<(Module, Ours)>,
    /// The shared library whose `malloc` the program uses instead of glibc's (jemalloc,
    /// tcmalloc, mimalloc), if any: the hooks pass every call on to it.
    pub allocator: Option<Module>,
}

/// The fields of /proc/PID/status the checks read.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// The state letter (`R`, `S`, `T`, ...).
    pub state: char,
    /// The tracer's pid, 0 if none.
    pub tracer: i32,
    /// Real, effective, saved and filesystem uids.
    pub uids: Vec<u32>,
    /// `Seccomp:` 0 none, 1 strict, 2 filter.
    pub seccomp: u32,
    /// The parent's pid.
    pub ppid: i32,
}

/// Parses /proc/PID/status.
pub fn parse_status(text: &str) -> Status {
    let mut s = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "State" => s.state = value.chars().next().unwrap_or('?'),
            "TracerPid" => s.tracer = value.parse().unwrap_or(0),
            "PPid" => s.ppid = value.parse().unwrap_or(0),
            "Seccomp" => s.seccomp = value.parse().unwrap_or(0),
            "Uid" => {
                s.uids = value
                    .split_whitespace()
                    .filter_map(|u| u.parse().ok())
                    .collect()
            }
            _ => {}
        }
    }
    s
}

fn status(pid: i32) -> Result<Status, Error> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|t| parse_status(&t))
        .map_err(|_| {
            Error::new(format!(
                "no process {pid}: it has exited or the PID is wrong (check with `ps -p {pid}`)"
            ))
        })
}

/// The refusal, if any, that the process's status calls for (`me`: this process's pid,
/// `euid` its effective uid, `scope` Yama's ptrace scope, `descendant` whether the target
/// descends from this process, `tracer_name` the tracer's command name).
pub fn refusal(
    pid: i32,
    s: &Status,
    euid: u32,
    scope: Option<u32>,
    descendant: bool,
    tracer_name: &str,
) -> Option<String> {
    match s.state {
        'Z' | 'X' => return Some(format!("process {pid} has exited (it is a zombie): there is nothing to attach to")),
        'T' | 't' => {
            return Some(format!(
                "process {pid} is stopped (state {}: SIGSTOP, SIGTSTP or a debugger): mem-trace never resumes a stopped process; continue it (`kill -CONT {pid}`) and attach again",
                s.state
            ))
        }
        _ => {}
    }
    if s.tracer != 0 {
        return Some(format!(
            "process {pid} is already being traced by process {} ({tracer_name}): a process has one tracer at a time; detach that debugger first",
            s.tracer
        ));
    }
    if s.seccomp == 1 {
        return Some(format!(
            "process {pid} runs under strict seccomp (Seccomp: 1): it may make no system call but read, write and exit, so the tracer cannot run in it"
        ));
    }
    let root = euid == 0;
    if !root && !s.uids.contains(&euid) {
        return Some(format!(
            "process {pid} belongs to another user (uid {}): attaching needs the rights a debugger needs; run mem-trace as that user or as root",
            s.uids.first().copied().unwrap_or(0)
        ));
    }
    let barred = match scope {
        Some(1) => !root && !descendant,
        Some(2) => !root,
        Some(3) => true,
        _ => false,
    };
    if barred {
        return Some(format!(
            "not allowed to attach to process {pid}: attaching needs the rights a debugger needs; {}",
            scope_advice(scope)
        ));
    }
    None
}

/// The refusal of a process that is not dumpable (seen here as a non-root process whose
/// /proc files are root's, or answered by the process itself, `dumpable`).
pub fn not_dumpable(pid: i32) -> String {
    format!(
        "process {pid} is not dumpable (it called prctl(PR_SET_DUMPABLE, 0), or changed credentials): it asked not to be inspected, and mem-trace does not attach to it"
    )
}

/// Whether `pid` descends from this process.
fn descends_from_me(pid: i32) -> bool {
    let me = std::process::id() as i32;
    let mut p = pid;
    for _ in 0..64 {
        if p == me {
            return true;
        }
        if p <= 1 {
            return false;
        }
        p = status(p).map(|s| s.ppid).unwrap_or(0);
    }
    false
}

/// Whether the process can load `library` by its path: in our mount namespace, or in
/// another (a container) where that path names the very same file (seen through
/// `/proc/PID/root`, device and inode alike). A detach needs no such check: the library is
/// mapped in the process already.
pub fn library_reachable(pid: i32, library: &std::path::Path) -> Result<(), Error> {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    if ns("self") == ns(&pid.to_string()) {
        return Ok(());
    }
    let theirs = std::path::Path::new(&format!("/proc/{pid}/root"))
        .join(library.strip_prefix("/").unwrap_or(library));
    let id = |p: &std::path::Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    match (id(library), id(&theirs)) {
        (Some(ours), Some(there)) if ours == there => Ok(()),
        _ => Err(Error::new(format!(
            "process {pid} runs in another mount namespace (a container?) where {} is not this library; run mem-trace inside its namespace (`nsenter -t {pid} -m -p`), with the library at a path it can reach",
            library.display()
        ))),
    }
}

/// Checks `pid` for an attach or a detach (see the module documentation).
pub fn inspect(pid: i32) -> Result<Target, Error> {
    let s = status(pid)?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let tracer_name = std::fs::read_to_string(format!("/proc/{}/comm", s.tracer))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    if let Some(why) = refusal(
        pid,
        &s,
        euid,
        ptrace_scope(),
        descends_from_me(pid),
        &tracer_name,
    ) {
        return Err(Error::new(why));
    }
    // A process that made itself non-dumpable has its /proc files owned by root.
    let owner = std::fs::metadata(format!("/proc/{pid}/status"))
        .map(|m| m.uid())
        .unwrap_or(0);
    if owner == 0 && s.uids.get(1).is_some_and(|&u| u != 0) {
        return Err(Error::new(not_dumpable(pid)));
    }
    let modules = image::modules(pid)
        .map_err(|e| Error::new(format!("cannot read /proc/{pid}/maps: {e}")))?;
    let Some(libc) = image::find(&modules, "libc.so.6").cloned() else {
        let musl = modules.iter().any(|m| m.file_name().contains("musl"));
        return Err(Error::new(if musl {
            format!("process {pid} runs on musl, not glibc: mem-trace attaches only to programs using glibc's malloc")
        } else {
            format!("process {pid} has no libc.so.6 mapped: a statically linked program, whose malloc calls are bound at link time and cannot be redirected; start it under `mem-trace run` instead")
        }));
    };
    let ld = image::find(&modules, "ld-linux").cloned();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let mut ours = None;
    let mut allocator: Option<Module> = None;
    for m in &modules {
        if m.path == libc.path || ld.as_ref().is_some_and(|l| l.path == m.path) {
            continue;
        }
        let Ok(img) = Image::read(pid, m) else {
            continue;
        };
        if let Some(at) = img.defined("MEM_TRACE_ATTACH_STATE") {
            let state = peek_u32(pid, at)
                .ok()
                .and_then(Ours::from_state)
                .unwrap_or(Ours::Preloaded);
            ours = Some((m.clone(), state));
            continue;
        }
        if img.defined("MEM_TRACE_HEADER").is_some() && img.defined("malloc").is_some() {
            // An older library, or one without attach: preloaded.
            ours = Some((m.clone(), Ours::Preloaded));
            continue;
        }
        if img.defined("malloc").is_none() {
            continue;
        }
        // The executable's own malloc is called directly from inside it, where no GOT entry
        // can send the calls to the hooks.
        if exe.as_deref() == Some(m.path.as_path()) {
            return Err(Error::new(format!(
                "process {pid} defines malloc in its executable {}: its calls to it cannot be redirected, so mem-trace does not attach there",
                m.path.display()
            )));
        }
        if let Some(first) = &allocator {
            return Err(Error::new(format!(
                "process {pid} has two libraries defining malloc, {} and {}: which one serves its blocks cannot be told, so mem-trace does not attach there",
                first.path.display(),
                m.path.display()
            )));
        }
        allocator = Some(m.clone());
    }
    Ok(Target {
        libc,
        ld,
        ours,
        allocator,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tcat\nState:\tS (sleeping)\nPPid:\t10\nTracerPid:\t0\nUid:\t1000\t1000\t1000\t1000\nSeccomp:\t0\n";

    #[test]
    fn status_fields() {
        let s = parse_status(STATUS);
        assert_eq!(
            s,
            Status {
                state: 'S',
                tracer: 0,
                uids: vec![1000; 4],
                seccomp: 0,
                ppid: 10
            }
        );
        assert_eq!(refusal(7, &s, 1000, Some(0), false, ""), None);
    }

    #[test]
    fn each_refusal_is_one_line_naming_its_cause() {
        let base = parse_status(STATUS);
        let cases: Vec<(Status, u32, Option<u32>, &str)> = vec![
            (
                Status {
                    state: 'T',
                    ..parse_status(STATUS)
                },
                1000,
                Some(0),
                "is stopped (state T",
            ),
            (
                Status {
                    state: 'Z',
                    ..parse_status(STATUS)
                },
                1000,
                Some(0),
                "has exited",
            ),
            (
                Status {
                    tracer: 99,
                    ..parse_status(STATUS)
                },
                1000,
                Some(0),
                "already being traced by process 99 (gdb)",
            ),
            (
                Status {
                    seccomp: 1,
                    ..parse_status(STATUS)
                },
                1000,
                Some(0),
                "strict seccomp",
            ),
            (
                parse_status(STATUS),
                1001,
                Some(0),
                "belongs to another user (uid 1000)",
            ),
            (
                parse_status(STATUS),
                1000,
                Some(1),
                "ptrace_scope is 1: only the user's own descendants",
            ),
            (parse_status(STATUS), 0, Some(3), "ptrace_scope is 3"),
        ];
        for (s, euid, scope, says) in cases {
            let why = refusal(7, &s, euid, scope, false, "gdb").expect("a refusal");
            assert!(why.contains(says), "{why}");
            assert!(!why.contains('\n'));
        }
        // Root passes scope 1 and 2; a descendant passes scope 1.
        assert_eq!(refusal(7, &base, 0, Some(2), false, ""), None);
        assert_eq!(refusal(7, &base, 1000, Some(1), true, ""), None);
    }
}
