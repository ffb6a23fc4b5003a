//! Why a target could not be opened, each as one line that says what to do about it.

use crate::layout;
use std::fmt;
use std::path::{Path, PathBuf};

/// Yama's switch for who may read another process (absent without the Yama LSM).
const PTRACE_SCOPE: &str = "/proc/sys/kernel/yama/ptrace_scope";

/// Why a target could not be opened; each displays as one line saying what to do.
#[derive(Debug)]
pub enum TargetError {
    /// No process has that pid.
    NoSuchProcess(i32),
    /// Not allowed to read the process (ptrace access rules).
    PermissionDenied {
        /// The process.
        pid: i32,
        /// `/proc/sys/kernel/yama/ptrace_scope` when the error was met; `None` without Yama.
        ptrace_scope: Option<u32>,
    },
    /// The target has no `MEM_TRACE_HEADER`: the library is not loaded in it.
    NotLoaded {
        /// How the target was named ("process 1234", "core file core.1234").
        target: String,
    },
    /// The file is not an x86_64 ELF core file.
    NotACore {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The core file is shorter than its own headers say.
    TruncatedCore {
        /// The file.
        path: PathBuf,
        /// What is missing.
        why: String,
    },
    /// The core names no executable and none was given.
    ExeUnknown {
        /// The core file.
        core: PathBuf,
    },
    /// A file on disk is not the one that was loaded when the core was dumped.
    OtherBuild {
        /// The file.
        path: PathBuf,
        /// What differs (build ids, sizes).
        why: String,
    },
    /// The tables are there but cannot be read (version, corruption, unreadable memory).
    Layout(layout::Error),
    /// Any other I/O failure on a named file.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

impl TargetError {
    /// Permission denied on `pid`, with the system's ptrace scope read now (the message
    /// explains the value actually in force).
    pub(super) fn permission_denied(pid: i32) -> Self {
        TargetError::PermissionDenied {
            pid,
            ptrace_scope: ptrace_scope(),
        }
    }

    /// An I/O error on `path`.
    pub(super) fn io(path: impl AsRef<Path>, error: std::io::Error) -> Self {
        TargetError::Io {
            path: path.as_ref().to_path_buf(),
            error,
        }
    }
}

/// Yama's ptrace scope in force (`None` without Yama).
pub fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string(PTRACE_SCOPE)
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// What the ptrace scope in force means, and what to do under it (the same words for
/// `mem-trace attach`, which needs the same right).
pub fn scope_advice(scope: Option<u32>) -> String {
    let what = match scope {
        None => {
            return "this system has no Yama ptrace_scope, so the rule is: the process's own user, or root (CAP_SYS_PTRACE): run mem-trace as one of them".into()
        }
        Some(0) => "0: any process of the same user may be read; run mem-trace as the process's user, or as root",
        Some(1) => "1: only the user's own descendants may be read, unless the process allows it with prctl(PR_SET_PTRACER) or the reader has CAP_SYS_PTRACE; run mem-trace as root (sudo), or allow same-user reads with `sudo sysctl kernel.yama.ptrace_scope=0`",
        Some(2) => "2: only a reader with CAP_SYS_PTRACE may read a process; run mem-trace as root (sudo)",
        Some(3) => "3: no process may be read, not even by root, until the next reboot; read a core dump of the process instead",
        Some(n) => return format!("{PTRACE_SCOPE} is {n}, a value this mem-trace does not know; run mem-trace as root or read a core dump instead"),
    };
    format!("{PTRACE_SCOPE} is {what}")
}

/// The pid of a target named `process PID (...)`, as a running process is.
fn running_pid(target: &str) -> Option<&str> {
    let pid = target.strip_prefix("process ")?.split(' ').next()?;
    (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then_some(pid)
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetError::NoSuchProcess(pid) => write!(
                f,
                "no process {pid}: it has exited or the PID is wrong (check with `ps -p {pid}`); to read a program that has ended, give its core file"
            ),
            TargetError::PermissionDenied { pid, ptrace_scope } => write!(
                f,
                "not allowed to read process {pid}: reading a process needs the rights a debugger needs (the same user, or root); {}",
                scope_advice(*ptrace_scope)
            ),
            TargetError::NotLoaded { target } => {
                write!(
                    f,
                    "{target} has no MEM_TRACE_HEADER, so libmem_trace.so is not loaded in it: "
                )?;
                // A running process can take the library now; a core cannot.
                match running_pid(target) {
                    Some(pid) => write!(
                        f,
                        "load it into the running process with `mem-trace attach {pid}`, or start the program with `LD_PRELOAD=/path/to/libmem_trace.so PROGRAM` or `mem-trace run PROGRAM`"
                    ),
                    None => write!(
                        f,
                        "start the program with `LD_PRELOAD=/path/to/libmem_trace.so PROGRAM` or `mem-trace run PROGRAM`"
                    ),
                }
            }
            TargetError::NotACore { path, why } => write!(
                f,
                "{} is not an x86_64 ELF core file ({why}): give a core dump (from `gcore PID` or the kernel) or the PID of a running process",
                path.display()
            ),
            TargetError::TruncatedCore { path, why } => write!(
                f,
                "{} is a truncated core file ({why}): the dump was cut short (a full disk, a core size limit such as `ulimit -c`, an interrupted copy); dump or copy it again",
                path.display()
            ),
            TargetError::ExeUnknown { core } => write!(
                f,
                "{} does not say which executable dumped it: pass the executable with --exe PATH",
                core.display()
            ),
            TargetError::OtherBuild { path, why } => write!(
                f,
                "{} is not the file the process had loaded ({why}): use the exact build that ran (--exe for the executable), or read the core on the machine that dumped it",
                path.display()
            ),
            TargetError::Layout(layout::Error::Version { found }) => write!(
                f,
                "the target's libmem_trace.so writes layout version {found}, this mem-trace reads version {}: use the mem-trace that came with that libmem_trace.so",
                mem_trace_format::VERSION
            ),
            TargetError::Layout(e @ layout::Error::BadMagic { .. }) => write!(
                f,
                "{e}: the symbol MEM_TRACE_HEADER does not point at mem-trace's tables (a corrupt core, or a program defining its own MEM_TRACE_HEADER)"
            ),
            TargetError::Layout(e) => write!(f, "cannot read the mem-trace tables: {e}"),
            TargetError::Io { path, error } => write!(f, "cannot read {}: {error}", path.display()),
        }
    }
}

impl std::error::Error for TargetError {}

impl From<layout::Error> for TargetError {
    fn from(e: layout::Error) -> Self {
        TargetError::Layout(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_line(e: &TargetError) -> String {
        let s = e.to_string();
        assert!(!s.contains('\n'), "not one line: {s}");
        s
    }

    #[test]
    fn permission_denied_explains_the_scope_in_force() {
        let with = |scope| {
            one_line(&TargetError::PermissionDenied {
                pid: 42,
                ptrace_scope: scope,
            })
        };
        let s = with(Some(1));
        assert!(s.starts_with("not allowed to read process 42: "), "{s}");
        assert!(
            s.contains("ptrace_scope is 1: only the user's own descendants"),
            "{s}"
        );
        assert!(
            s.contains("PR_SET_PTRACER") && s.contains("CAP_SYS_PTRACE"),
            "{s}"
        );
        assert!(s.contains("kernel.yama.ptrace_scope=0"), "{s}");
        assert!(with(Some(0)).contains("ptrace_scope is 0: any process of the same user"));
        assert!(with(Some(2)).contains("ptrace_scope is 2: only a reader with CAP_SYS_PTRACE"));
        assert!(with(Some(3)).contains("ptrace_scope is 3: no process may be read"));
        assert!(with(Some(3)).contains("core dump"));
        assert!(with(Some(7)).contains("ptrace_scope is 7, a value"));
        assert!(with(None).contains("no Yama ptrace_scope"));
    }

    #[test]
    fn permission_denied_reads_the_actual_scope() {
        let actual = std::fs::read_to_string(PTRACE_SCOPE)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        match TargetError::permission_denied(7) {
            TargetError::PermissionDenied { pid, ptrace_scope } => {
                assert_eq!((pid, ptrace_scope), (7, actual));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_message_is_one_line_saying_what_to_do() {
        let cases = [
            (TargetError::NoSuchProcess(99), "no process 99: it has exited or the PID is wrong (check with `ps -p 99`); to read a program that has ended, give its core file"),
            (
                TargetError::NotLoaded { target: "process 7 (sleep)".into() },
                "process 7 (sleep) has no MEM_TRACE_HEADER, so libmem_trace.so is not loaded in it: load it into the running process with `mem-trace attach 7`, or start the program with `LD_PRELOAD=/path/to/libmem_trace.so PROGRAM` or `mem-trace run PROGRAM`",
            ),
            (
                TargetError::NotACore { path: "/bin/true".into(), why: "an ELF executable, not a core".into() },
                "/bin/true is not an x86_64 ELF core file (an ELF executable, not a core): give a core dump (from `gcore PID` or the kernel) or the PID of a running process",
            ),
            (
                TargetError::TruncatedCore { path: "core.1".into(), why: "12 bytes missing".into() },
                "core.1 is a truncated core file (12 bytes missing): the dump was cut short (a full disk, a core size limit such as `ulimit -c`, an interrupted copy); dump or copy it again",
            ),
            (
                TargetError::ExeUnknown { core: "core.1".into() },
                "core.1 does not say which executable dumped it: pass the executable with --exe PATH",
            ),
            (
                TargetError::OtherBuild { path: "/lib/x.so".into(), why: "build id 01 in the core, 02 on disk".into() },
                "/lib/x.so is not the file the process had loaded (build id 01 in the core, 02 on disk): use the exact build that ran (--exe for the executable), or read the core on the machine that dumped it",
            ),
            (
                TargetError::Layout(layout::Error::Version { found: 2 }),
                "the target's libmem_trace.so writes layout version 2, this mem-trace reads version 7: use the mem-trace that came with that libmem_trace.so",
            ),
            (
                TargetError::Layout(layout::Error::Corrupt("5 stacks".into())),
                "cannot read the mem-trace tables: corrupt mem-trace tables: 5 stacks",
            ),
            (
                TargetError::io("/x", std::io::Error::from_raw_os_error(libc::ENOENT)),
                "cannot read /x: No such file or directory (os error 2)",
            ),
        ];
        for (e, want) in cases {
            assert_eq!(one_line(&e), want);
        }
        let magic = one_line(&TargetError::Layout(layout::Error::BadMagic {
            addr: 0x10,
            found: *b"XEMT\0\x01'\\",
        }));
        assert!(
            magic.starts_with(
                "no mem-trace header at 0x10 (magic b'XEMT\\x00\\x01\\'\\\\', expected b'MEMTRACE'): "
            ),
            "{magic}"
        );
    }
}
