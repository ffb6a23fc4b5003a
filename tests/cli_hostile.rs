//! The `mem-trace` command against what a hostile or unusual machine holds: a process that
//! maps a file only past its start (a memfd pool), read running and from its core; a core
//! whose mapped files have become FIFOs since.
//!
//! The program is `tests/fixtures/memfd_pool.c`, run under a copy of the profiler build of the
//! library (so that the copy can be replaced after the core is written).

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

/// Replaces the file at `path` by a FIFO.
fn make_fifo(path: &Path) {
    let _ = fs::remove_file(path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A memfd pool mapped from its second half (the file at no offset 0, issue 33): every
/// subcommand reads the process, and its core, as any other; then the core, once the data file
/// it maps (left out of the core) and then the library have become FIFOs, answers or refuses
/// in one line within a second instead of waiting for a writer.
#[test]
fn a_memfd_pool_read_live_and_from_its_core_then_fifos() {
    let f = memfd_pool();
    let library = f.dir.join("libmem_trace.so");
    let data = f.dir.join("mapped.dat");
    // The FIFOs of an earlier run: writing to them would wait for a reader.
    let _ = fs::remove_file(&library);
    let _ = fs::remove_file(&data);
    fs::copy(profiler_library(), &library).expect("copy the library");
    fs::write(&data, vec![7u8; 8192]).expect("write the data file");
    let core = f.dir.join("memfd_pool.core");
    {
        let running = Running::start(&f, &library, &[&data]);
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
    let info = answer(&f, "info-core", &["info", text(&core)]);

    make_fifo(&data);
    let out = mem_trace(
        &f,
        "info-fifo-data",
        &["info", text(&core)],
        Duration::from_secs(10),
    );
    assert!(
        out.success() && out.stdout == info && out.elapsed < Duration::from_secs(1),
        "{}",
        out.describe()
    );

    make_fifo(&library);
    let out = mem_trace(
        &f,
        "info-fifo-lib",
        &["info", text(&core)],
        Duration::from_secs(10),
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert!(
        !out.success()
            && out.stdout.is_empty()
            && lines.len() == 1
            && lines[0].starts_with("mem-trace: ")
            && lines[0].contains(text(&library))
            && lines[0].contains("not a regular")
            && out.elapsed < Duration::from_secs(1),
        "{}",
        out.describe()
    );
    let _ = fs::remove_file(&core);
}
