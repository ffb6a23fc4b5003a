//! The `mem-trace` command against what a hostile or unusual machine holds: a process that
//! maps a file only past its start (a memfd pool), read running and from its core.
//!
//! The program is `tests/fixtures/memfd_pool.c`, run under the profiler build of the library.

mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{c_fixture, mem_trace_binary, profiler_library, run_with_timeout, Fixture, Output};

fn memfd_pool() -> Fixture {
    c_fixture("memfd_pool.c", &[])
}

/// The fixture running, killed on drop.
struct Running {
    child: Child,
    pid: u32,
}

impl Running {
    /// Starts `fixture` under `library` with `args`, once it says `ready pid=PID`.
    fn start(fixture: &Fixture, library: &Path, args: &[&Path]) -> Running {
        let mut child = Command::new(&fixture.bin)
            .args(args)
            .env("LD_PRELOAD", library)
            .env("MEM_TRACE_PROFILE_INTERVAL", "0")
            .env("MEM_TRACE_LEAKS", "0")
            .current_dir(&fixture.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", fixture.bin.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let pid = line
            .trim()
            .strip_prefix("ready pid=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no `ready` line from {}: {line:?}", fixture.bin.display()));
        Running { child, pid }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Our own child, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `mem-trace ARGS`, within `timeout`, logs next to the fixture.
fn mem_trace(fixture: &Fixture, label: &str, args: &[&str], timeout: Duration) -> Output {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(args).current_dir(&fixture.dir);
    run_with_timeout(
        cmd,
        &fixture.dir.join(format!("mem-trace.{label}")),
        false,
        None,
        timeout,
        &format!("mem-trace {}", args.join(" ")),
    )
}

/// `mem-trace ARGS` succeeded: its stdout.
fn answer(fixture: &Fixture, label: &str, args: &[&str]) -> String {
    let out = mem_trace(fixture, label, args, Duration::from_secs(120));
    assert!(out.success(), "{}", out.describe());
    out.stdout
}

fn gcore(pid: u32, path: &Path, log: &Path) {
    let _ = fs::remove_file(path);
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", "-ex", "set debuginfod enabled off", "-p"])
        .arg(pid.to_string())
        .arg("-ex")
        .arg(format!("gcore {}", path.display()))
        .env_remove("LD_PRELOAD");
    let out = run_with_timeout(cmd, log, true, None, common::GDB_TIMEOUT, "gcore");
    assert!(
        out.success() && path.is_file(),
        "gcore failed\n{}",
        out.describe()
    );
}

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A memfd pool mapped from its second half (the file at no offset 0, issue 33): every
/// subcommand reads the process, and its core, as any other.
#[test]
fn a_memfd_pool_read_live_and_from_its_core() {
    let f = memfd_pool();
    let library = profiler_library();
    let core = f.dir.join("memfd_pool.core");
    {
        let running = Running::start(&f, library, &[]);
        let pid = running.pid.to_string();
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        assert!(
            maps.lines()
                .any(|l| l.ends_with("/memfd:pool (deleted)") && l.contains(" 00008000 ")),
            "{maps}"
        );
        let top = answer(&f, "top-live", &["top", &pid]);
        assert!(top.contains(" in hold_site at "), "{top}");
        answer(&f, "info-live", &["info", &pid]);
        gcore(running.pid, &core, &f.dir.join("gcore"));
    }
    let top = answer(&f, "top-core", &["top", text(&core)]);
    assert!(top.contains(" in hold_site at "), "{top}");
    answer(&f, "info-core", &["info", text(&core)]);
    let _ = fs::remove_file(&core);
}
