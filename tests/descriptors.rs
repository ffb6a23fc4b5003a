//! The tracer keeps no descriptor the program can see, and its output still reaches the
//! stderr the program started with, on `tests/fixtures/descriptors.c`:
//!
//! - `/proc/self/fd` lists the same with the tracer as without it, reports on or off, and
//!   under `mem-trace run`; `/proc/self/task` too while reports are off (with them on, the
//!   profiler thread is there to write them);
//! - a daemon that closes every descriptor from 3 up (`closefrom(3)`), puts `/dev/null` at
//!   fd 1000 and at fd 2, then frees a block twice, still gets the double free on the stderr
//!   it started with (a pipe, `run`'s own stderr) and its exit report under `mem-trace run`.

mod common;

use common::{c_fixture, library, mem_trace_binary, read_text, run_with_timeout, Job};
use std::process::{Command, Stdio};
use std::time::Duration;

fn fixture() -> common::Fixture {
    c_fixture("descriptors.c", &["-pthread"])
}

/// The fixture's `list` run plain and preloaded with `env`: both succeed, with the same
/// stdout unless `tasks_may_differ`, in which case the `fd` lines alone are compared.
fn same_listing(label: &str, env: &[(&str, &str)], tasks_may_differ: bool) {
    let f = fixture();
    let mut job = Job::fixture(&f);
    job.label = label.to_string();
    job.args = vec!["list".into()];
    job.env = env
        .iter()
        .map(|&(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let plain = job.run(false);
    let traced = job.run(true);
    assert!(plain.success(), "{}", plain.describe());
    assert!(traced.success(), "{}", traced.describe());
    let fds = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with("fd "))
            .map(str::to_string)
            .collect()
    };
    assert!(plain.stdout.contains("fd 2\n"), "{}", plain.describe());
    assert_eq!(
        fds(&traced.stdout),
        fds(&plain.stdout),
        "descriptors differ under the tracer\n{}\n----- plain -----\n{}",
        traced.describe(),
        plain.describe()
    );
    if !tasks_may_differ {
        assert_eq!(traced.stdout, plain.stdout, "{}", traced.describe());
    }
}

#[test]
fn the_program_lists_the_same_descriptors_and_threads_with_the_tracer() {
    same_listing("list", &[("MEM_TRACE_PROFILE", "0")], false);
}

#[test]
fn the_program_lists_the_same_descriptors_with_reports_on() {
    same_listing(
        "list-profile",
        &[
            ("MEM_TRACE_PROFILE", "1"),
            ("MEM_TRACE_SNAPSHOT_SIGNAL", "SIGUSR2"),
        ],
        true,
    );
}

#[test]
fn the_program_lists_the_same_descriptors_under_run() {
    let f = fixture();
    let plain = Command::new(&f.bin).arg("list").output().expect("run");
    let dir = common::scratch_dir("descriptors", "list-run");
    let out = Command::new(mem_trace_binary())
        .args(["run", "-o"])
        .arg(dir.join("out"))
        .arg(&f.bin)
        .arg("list")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run mem-trace run");
    let fds = |s: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(s)
            .lines()
            .filter(|l| l.starts_with("fd "))
            .map(str::to_string)
            .collect()
    };
    assert!(out.status.success(), "{out:?}");
    assert_eq!(fds(&out.stdout), fds(&plain.stdout), "{out:?}");
}

/// Reads a pipe to its end within a timeout: the daemon must neither hang nor lose output.
fn daemon_under_run(mode: &str) -> (String, String, std::path::PathBuf) {
    let f = fixture();
    let dir = common::scratch_dir("descriptors", &format!("daemon-{mode}"));
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(["run", "--mode", mode, "-o"])
        .arg(dir.join("out"))
        .arg(&f.bin)
        .arg("daemon")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn mem-trace run");
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        // SAFETY: signals the `mem-trace run` this test started, if it still runs by then.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let out = child.wait_with_output().expect("wait for mem-trace run");
    drop(watchdog);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{:?}\n{stdout}\n----- stderr -----\n{stderr}",
        out.status
    );
    (stdout, stderr, dir.join("out"))
}

#[test]
fn a_daemon_that_closes_and_reuses_descriptors_still_gets_its_reports_under_run() {
    let (stdout, stderr, out) = daemon_under_run("debug");
    assert!(stdout.contains("daemon done"), "{stdout}\n{stderr}");
    // fd 2 was /dev/null by then: this reached the pipe through `run`'s own stderr.
    assert!(
        stderr.contains("mem-trace: double free of "),
        "no double free report on the start-up stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("exit report of process"),
        "no exit report named:\n{stderr}"
    );
    let reports = common::files_ending(&out, ".1.txt");
    assert_eq!(reports.len(), 1, "{reports:?}\n{stderr}");
    let report = read_text(&reports[0]);
    assert!(
        report.contains("7777 bytes") && report.contains("leak_site"),
        "{report}"
    );
    // No request file left: the process wrote its exit report and said so.
    assert!(
        common::files_ending(&out, ".request").is_empty(),
        "{stderr}"
    );
}

#[test]
fn a_daemon_run_directly_gets_the_double_free_on_its_start_up_stderr() {
    let f = fixture();
    let dir = common::scratch_dir("descriptors", "daemon-direct");
    let mut cmd = Command::new(&f.bin);
    cmd.arg("daemon")
        .env("LD_PRELOAD", library())
        .env("MEM_TRACE_PROFILE", "0");
    // stderr is a file here: opened again by its path once fd 2 is /dev/null.
    let out = run_with_timeout(
        cmd,
        &dir.join("daemon"),
        false,
        None,
        common::RUN_TIMEOUT,
        "daemon",
    );
    assert!(out.success(), "{}", out.describe());
    assert!(
        out.stderr.contains("mem-trace: double free of "),
        "{}",
        out.describe()
    );
}
