//! Whether a process is still there, from `/proc/PID/stat`: for `run`'s wait for final reports
//! and for a read that failed because its process exited meanwhile.

use crate::cli::Command;
use crate::error::Error;
use mem_trace_read::target::Source;

/// Whether the process `pid` is still running (a zombie has ended: its memory is gone).
pub fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command's closing parenthesis.
    let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start());
    state.is_some_and(|s| !s.starts_with('Z') && !s.starts_with('X'))
}

/// The process a reading command reads, if it reads one.
pub fn target_pid(command: &Command) -> Option<u32> {
    let target = match command {
        Command::Top(a) => a.target.clone(),
        Command::Peaks(a) => a.target.clone(),
        Command::Leaks(a) => a.target.clone(),
        Command::Why(a) => a.target.clone(),
        Command::History(a) => a.target.clone(),
        Command::Info(a) => a.target.clone(),
        Command::Dhat(a) => a.target.clone(),
        Command::Pprof(a) => a.target.clone(),
        Command::Flamegraph(a) => a.target()?,
        _ => return None,
    };
    match target.source() {
        Source::Pid(pid) => u32::try_from(pid).ok(),
        Source::Core { .. } => None,
    }
}

/// The error of a read of `pid`, which was running when the read began: when it has exited
/// since, that is what went wrong (not the address a read then failed at).
pub fn explain(e: Error, pid: u32, was_alive: bool) -> Error {
    if !was_alive || alive(pid) {
        return e;
    }
    Error::with_code(
        format!(
            "process {pid} exited while it was being read: nothing more to read (read a core \
             of it instead: `gcore PID` while it runs, or let it dump one)"
        ),
        e.code(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_of_a_process_that_exited_says_so() {
        assert!(alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!alive(pid));
        let e = explain(Error::new("cannot read 8 bytes at 0x10"), pid, true);
        assert_eq!(
            e.to_string(),
            format!(
                "process {pid} exited while it was being read: nothing more to read (read a \
                 core of it instead: `gcore PID` while it runs, or let it dump one)"
            )
        );
        // A process that was not there to begin with keeps the reader's own error.
        let e = explain(Error::new("no process 1"), pid, false);
        assert_eq!(e.to_string(), "no process 1");
        // Nor does a running process's failure change.
        let me = std::process::id();
        let e = explain(Error::new("cannot read 8 bytes at 0x10"), me, true);
        assert_eq!(e.to_string(), "cannot read 8 bytes at 0x10");
    }
}
