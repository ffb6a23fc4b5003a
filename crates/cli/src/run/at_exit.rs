//! What `run` does with each traced process held at the end of `exit` (`--pprof`, `--push`):
//! its pprof profile beside its report, and for the program itself a last push.
//!
//! The library, told to hold at exit (`MEM_TRACE_HOLD_AT_EXIT=1`), names each exiting process
//! on `DIR/mem-trace.exits` once its exit report is written, and waits on its own
//! `DIR/mem-trace.<pid>.held` (crates/core/src/profile/hold.rs). This side reads the process
//! as `mem-trace pprof PID` does and lets it go. The tables are final by then, and go with the
//! process: a report has only the top stacks, a profile every stack's four counts, for `go
//! tool pprof`, Pyroscope or Parca; and what the program allocated since the last push would
//! otherwise never be sent.
//!
//! A process that cannot be read is let go at once, with one line saying why; one this side
//! never answers goes on by itself after 10 s.

use crate::cli::TargetArgs;
use crate::push::Control;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The FIFO exiting processes name themselves on.
fn exits(dir: &Path) -> PathBuf {
    dir.join("mem-trace.exits")
}

/// The profile written for process `pid`.
pub fn profile_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("mem-trace.{pid}.pb.gz"))
}

/// Serves `dir`'s exits FIFO until `stop` is set, then (`finish`) removes it.
pub struct Server {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(u32, PathBuf)>>,
    fifo: PathBuf,
}

impl Server {
    /// Makes the FIFO and starts listening: before the program starts, so that no exit is
    /// missed. `jobs`: what to do with each process.
    pub fn start(dir: &Path, jobs: Jobs) -> std::io::Result<Server> {
        let fifo = exits(dir);
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: NUL-terminated path; mkfifo only creates a node.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Read-write: the open does not wait for a writer, and reads never see end-of-file
        // between two exits.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&fifo)?;
        let stop = Arc::new(AtomicBool::new(false));
        let dir = dir.to_path_buf();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || serve(file, &dir, &flag, &jobs));
        Ok(Server { stop, thread, fifo })
    }

    /// Stops listening once the program has ended; the profiles written, by pid.
    pub fn finish(self) -> Vec<(u32, PathBuf)> {
        self.stop.store(true, Ordering::Relaxed);
        let written = self.thread.join().unwrap_or_default();
        let _ = std::fs::remove_file(&self.fifo);
        written
    }
}

/// What to do with each process held at exit.
pub struct Jobs {
    /// Write its pprof profile (`--pprof`).
    pub pprof: bool,
    /// The program's pid (set once it runs) and its push loop (`--push`): the program gets a
    /// last push before it is let go.
    pub last_push: Option<(Arc<AtomicU32>, Arc<Control>)>,
}

/// How long the program is held for its last push at most (the library's own deadline is
/// 10 s).
const LAST_PUSH_WAIT: Duration = Duration::from_secs(7);

/// Reads `PID` lines until `stop`, doing `jobs` with each process named.
fn serve(file: std::fs::File, dir: &Path, stop: &AtomicBool, jobs: &Jobs) -> Vec<(u32, PathBuf)> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let mut reader = BufReader::new(file);
    let mut written = Vec::new();
    let mut line = String::new();
    loop {
        // Every line already there first: a process may have exited just before `stop`.
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(n) if n > 0 && line.ends_with('\n') => {}
                _ => break,
            }
            if let Ok(pid) = line.trim().parse::<u32>() {
                if jobs.pprof {
                    if let Some(p) = profile(dir, pid) {
                        written.push((pid, p));
                    }
                }
                if let Some((program, control)) = &jobs.last_push {
                    if program.load(Ordering::Relaxed) == pid {
                        control.last_push(LAST_PUSH_WAIT);
                    }
                }
                release(dir, pid);
            }
        }
        if stop.load(Ordering::Relaxed) {
            return written;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of ours, on a descriptor `reader` keeps open.
        unsafe { libc::poll(&mut p, 1, 50) };
    }
}

/// Writes process `pid`'s profile; its path, or `None` (said in one line).
fn profile(dir: &Path, pid: u32) -> Option<PathBuf> {
    let target = TargetArgs {
        target: pid.to_string(),
        exe: None,
    };
    let bytes = match target.open().and_then(|t| crate::pprof::of_target(&t)) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("mem-trace: run: no pprof profile of process {pid}: {e}");
            return None;
        }
    };
    let path = profile_path(dir, pid);
    // A new file, never through a link someone left there (as the library's reports).
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .and_then(|mut f| f.write_all(&bytes));
    match written {
        Ok(()) => Some(path),
        Err(e) => {
            eprintln!("mem-trace: run: cannot write {}: {e}", path.display());
            None
        }
    }
}

/// Lets process `pid` finish exiting: a byte on its FIFO.
fn release(dir: &Path, pid: u32) {
    let held = dir.join(format!("mem-trace.{pid}.held"));
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(&held)
    {
        let _ = f.write_all(b"x");
    }
}

/// Keeps the profiles of the processes whose reports were kept (`kept`: their pids), as
/// `run` keeps reports, and says where they are; removes the others unless `keep_all`.
pub fn keep_and_say(written: &[(u32, PathBuf)], kept: &[u32], keep_all: bool) {
    let mut left = Vec::new();
    for (pid, path) in written {
        if keep_all || kept.contains(pid) {
            left.push(path);
        } else {
            let _ = std::fs::remove_file(path);
        }
    }
    match left.as_slice() {
        [] if written.is_empty() => {
            eprintln!("mem-trace:   no pprof profile: no process could be read at its exit")
        }
        [] => {}
        [one] => eprintln!(
            "mem-trace:   pprof profile: {} (go tool pprof -top FILE)",
            one.display()
        ),
        many => eprintln!(
            "mem-trace:   pprof profiles beside {} of the reports: mem-trace.<pid>.pb.gz (go tool pprof -top FILE)",
            many.len()
        ),
    }
}

/// How long after the program's end the last profiles may still be coming (processes it left
/// running that exit later are not waited for).
pub const GRACE: Duration = Duration::from_millis(200);
