//! The exit report reaches the user, and its flame graph is worth looking at, on
//! `tests/fixtures/exit_paths.c` and Debian's own `ls`: a report lost to a closed stderr, or a
//! flame graph of the few blocks left at exit when the memory went elsewhere, answers nothing:
//!
//! - a program that closes fd 2 before it exits (coreutils do) still gets its exit report on
//!   the stderr it started with;
//! - `mem-trace run` told to stop by SIGTERM asks the program for its final report, then
//!   passes the signal on, and the shell sees 143; a SIGINT sent to `run` alone does the same;
//!   a program killed by SIGKILL is said to have no exit report;
//! - a program that freed (nearly) everything gets a flame graph of its global peak, said so;
//!   `MEM_TRACE_PROFILE_BY=peak` ranks by it; a graph with nothing in it is neither written
//!   nor listed;
//! - a full report lists the exited threads with the highest peaks, and sums up the rest.

mod common;

use common::{
    c_fixture, files_ending, mem_trace_binary, profiler_library, read_text, run_with_timeout,
    Output,
};
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn fixture() -> common::Fixture {
    c_fixture("exit_paths.c", &["-pthread"])
}

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    common::scratch_dir("exit_report", name)
}

/// `program args` under the profiler build of the library, reports on.
fn preloaded(program: &Path, args: &[&str], env: &[(&str, &str)], log: &Path) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_PRELOAD", profiler_library())
        .env("MEM_TRACE_PROFILE", "1")
        .env("MEM_TRACE_PROFILE_INTERVAL", "0")
        .env_remove("MEM_TRACE_OUT")
        .env_remove("MEM_TRACE_PROFILE_BY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_with_timeout(cmd, log, false, None, common::RUN_TIMEOUT, "preloaded")
}

/// The exit report in `stderr`, from its first line to its last.
fn exit_report(stderr: &str) -> &str {
    let start = stderr
        .find("mem-trace: report 1 (at exit)")
        .unwrap_or_else(|| panic!("no exit report in:\n{stderr}"));
    let rest = &stderr[start..];
    let end = rest
        .find("mem-trace: end of report 1")
        .unwrap_or_else(|| panic!("the exit report is cut short:\n{rest}"));
    &rest[..end]
}

#[test]
fn a_program_that_closes_stderr_still_gets_its_exit_report() {
    let d = scratch("close-stderr");
    let out = preloaded(&fixture().bin, &["close-stderr"], &[], &d.join("run"));
    assert_eq!(out.status.code(), Some(0), "{}", out.describe());
    let report = exit_report(&out.stderr);
    // The fixture's own blocks, named, and the leak check: the whole report.
    assert!(
        report.contains("# 0: 22220 bytes in 4 blocks") && report.contains("hold_site"),
        "{report}"
    );
    assert!(report.contains("mem-trace: leak check:"), "{report}");
}

/// Debian's `ls` closes stdout and stderr in an `atexit` handler (gnulib's `close_stdout`):
/// `LD_PRELOAD=... ls /usr 2>&1 >/dev/null | wc -l` printed 0.
#[test]
fn ls_gets_its_exit_report_though_it_closes_stderr() {
    let d = scratch("ls");
    let out = preloaded(Path::new("/bin/ls"), &["/usr"], &[], &d.join("ls"));
    assert_eq!(out.status.code(), Some(0), "{}", out.describe());
    assert!(out.stdout.contains("bin\n"), "{}", out.describe());
    let report = exit_report(&out.stderr);
    assert!(report.contains("mem-trace: leak check:"), "{report}");
    assert!(out.stderr.contains("mem-trace: end of report 1\n"));
}

/// `mem-trace run -o out FIXTURE serve` under `sh -c`, stdout piped; returns once the fixture
/// says it serves, with sh and `run`'s pid.
fn serve(d: &Path) -> (Child, u32) {
    serve_mode(d, "serve", &mut String::new())
}

/// As [`serve`], with the fixture's `mode`; what it printed before "serving" in `before`.
fn serve_mode(d: &Path, mode: &str, before: &mut String) -> (Child, u32) {
    let script = format!(
        "'{}' run -o out '{}' {mode} 2>run.stderr; echo \"status $?\"",
        mem_trace_binary().display(),
        fixture().bin.display()
    );
    let mut sh = Command::new("sh")
        .args(["-c", &script])
        .current_dir(d)
        .env_remove("LD_PRELOAD")
        .env_remove("MEM_TRACE_LIB")
        .env_remove("MEM_TRACE_PROFILE_INTERVAL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(sh.stdout.take().unwrap());
    loop {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "the server did not start: {before}");
        if line == "serving\n" {
            break;
        }
        before.push_str(&line);
    }
    sh.stdout = Some(stdout.into_inner());
    let children = fs::read_to_string(format!("/proc/{0}/task/{0}/children", sh.id())).unwrap();
    let run: u32 = children.trim().parse().expect("sh runs mem-trace");
    (sh, run)
}

/// The rest of sh's output, once it has ended (within 30 s).
fn finish(mut sh: Child) -> String {
    wait_for(&mut sh);
    rest(sh)
}

/// What sh wrote after the fixture's "serving": once every writer of the pipe has ended.
fn rest(mut sh: Child) -> String {
    let mut rest = String::new();
    std::io::Read::read_to_string(sh.stdout.as_mut().unwrap(), &mut rest).unwrap();
    rest
}

/// Waits for sh to end, 30 s at most.
fn wait_for(sh: &mut Child) {
    let start = Instant::now();
    while sh.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            // SAFETY: the process group this test started.
            unsafe { libc::kill(-(sh.id() as i32), libc::SIGKILL) };
            panic!("sh did not end within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_server_stopped_by_sigterm_writes_its_final_report_and_exits_143() {
    let d = scratch("sigterm");
    let (sh, run) = serve(&d);
    let start = Instant::now();
    // SAFETY: signals the mem-trace this test started (through sh).
    unsafe { libc::kill(run as i32, libc::SIGTERM) };
    let rest = finish(sh);
    let took = start.elapsed();
    assert_eq!(rest, "status 143\n");
    let stderr = read_text(&d.join("run.stderr"));
    let txt = files_ending(&d.join("out"), ".txt");
    let reports: Vec<String> = txt
        .iter()
        .filter(|p| !p.to_string_lossy().ends_with(".leaks.txt"))
        .map(|p| read_text(p))
        .collect();
    assert_eq!(reports.len(), 1, "{stderr}");
    let report = &reports[0];
    assert!(
        report.starts_with("mem-trace: report 1 (final)"),
        "{report}"
    );
    assert!(
        report.contains("# 0: 22220 bytes in 4 blocks") && report.contains("hold_site"),
        "{report}"
    );
    assert!(report.contains("mem-trace: leak check:"), "{report}");
    assert!(report.contains("mem-trace: end of report 1"), "{report}");
    assert!(
        stderr.contains("mem-trace: run: SIGTERM: asking 1 process for its final report")
            && stderr.contains("final report of process")
            && stderr.contains("flame graph"),
        "{stderr}"
    );
    // The report was waited for, not the whole allowance.
    assert!(took < Duration::from_secs(4), "{took:?}\n{stderr}");
    // No FIFO left behind.
    assert!(files_ending(&d.join("out"), ".request").is_empty());
}

#[test]
fn a_sigint_sent_to_run_alone_gets_the_final_report_then_reaches_the_program() {
    let d = scratch("sigint");
    let (sh, run) = serve(&d);
    // SAFETY: signals the mem-trace this test started (through sh).
    unsafe { libc::kill(run as i32, libc::SIGINT) };
    let rest = finish(sh);
    assert_eq!(rest, "status 130\n");
    let stderr = read_text(&d.join("run.stderr"));
    assert!(
        stderr.contains("mem-trace: run: SIGINT: asking 1 process")
            && stderr.contains("final report of process"),
        "{stderr}"
    );
}

/// SIGTERM to `run` and the program at once (a signal to their process group, as systemd
/// sends by default): the program, which does not handle it, dies before any report can be
/// asked for; the summary says so, and how to send the signal so that it gets one.
#[test]
fn a_sigterm_to_the_whole_group_is_said_to_have_come_before_the_report() {
    let d = scratch("sigterm-group");
    let (sh, run) = serve(&d);
    let children = fs::read_to_string(format!("/proc/{run}/task/{run}/children")).unwrap();
    let program: i32 = children.trim().parse().expect("mem-trace runs the fixture");
    // SAFETY: signals the mem-trace and the fixture this test started (through sh), as a
    // signal to their group would (sh, their parent, is left to print the status).
    unsafe {
        libc::kill(run as i32, libc::SIGTERM);
        libc::kill(program, libc::SIGTERM);
    }
    let rest = finish(sh);
    assert_eq!(rest, "status 143\n");
    let stderr = read_text(&d.join("run.stderr"));
    assert!(
        stderr.contains(&format!(
            "mem-trace:   no exit report from process {program} (the program): it was killed by \
             SIGTERM, which reached it at the same time as run (sent to the whole process group, \
             as systemd's default KillMode=control-group does), before run could ask for its \
             final report: send SIGTERM to run alone (`kill -TERM {run}`; systemd: \
             KillMode=mixed)"
        )),
        "{stderr}"
    );
}

#[test]
fn a_program_killed_by_sigkill_is_said_to_have_no_exit_report() {
    let d = scratch("sigkill");
    let (sh, run) = serve(&d);
    let children = fs::read_to_string(format!("/proc/{run}/task/{run}/children")).unwrap();
    let program: i32 = children.trim().parse().expect("mem-trace runs the fixture");
    // SAFETY: kills the fixture this test started (through sh and mem-trace).
    unsafe { libc::kill(program, libc::SIGKILL) };
    let rest = finish(sh);
    assert_eq!(rest, "status 137\n");
    let stderr = read_text(&d.join("run.stderr"));
    assert!(
        stderr.contains(&format!(
            "mem-trace:   no exit report from process {program} (the program): it was killed by SIGKILL"
        )),
        "{stderr}"
    );
    assert!(files_ending(&d.join("out"), ".request").is_empty());
}

/// `mem-trace run -o out FIXTURE MODE` with `env`; the run's output.
fn run(d: &Path, mode: &str, env: &[(&str, &str)]) -> Output {
    run_with(d, &[], mode, env)
}

/// As [`run`], with `options` of `run`'s own.
fn run_with(d: &Path, options: &[&str], mode: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(["run", "-o", "out"])
        .args(options)
        .arg(&fixture().bin)
        .arg(mode)
        .current_dir(d)
        .env_remove("LD_PRELOAD")
        .env_remove("MEM_TRACE_LIB")
        .env_remove("MEM_TRACE_PROFILE_INTERVAL")
        .env_remove("MEM_TRACE_PROFILE_BY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_with_timeout(
        cmd,
        &d.join("run"),
        false,
        None,
        common::RUN_TIMEOUT,
        "mem-trace run",
    )
}

#[test]
fn a_program_that_freed_everything_gets_the_flame_graph_of_its_peak() {
    let d = scratch("free-all");
    let out = run(&d, "free-all", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", out.describe());
    let out_dir = d.join("out");
    let folded = files_ending(&out_dir, ".folded");
    assert_eq!(folded.len(), 1, "{}", out.describe());
    // The peak's 64 blocks of 64 KiB, not the 48 bytes left live.
    let lines = read_text(&folded[0]);
    assert!(
        lines.lines().any(|l| l.ends_with(";peak_site 4194304")),
        "{lines}"
    );
    assert!(!lines.contains("small_site"), "{lines}");
    let txt = folded[0].with_extension("txt");
    let report = read_text(&txt);
    assert!(
        report.contains(
            "mem-trace: little is live now (48 bytes of a 4194304-byte peak): the flame graph \
             shows the stacks live at the global peak"
        ),
        "{report}"
    );
    let svg = read_text(&folded[0].with_extension("svg"));
    assert!(svg.contains("bytes live at the global peak (little was live at the end)"));
    assert!(svg.contains("peak_site"));
    assert!(
        out.stderr
            .contains("(of the global peak: little was live at the end)"),
        "{}",
        out.describe()
    );
}

#[test]
fn profile_by_peak_is_accepted_and_ranks_by_the_peak() {
    let d = scratch("by-peak");
    let out = preloaded(
        &fixture().bin,
        &["free-all"],
        &[("MEM_TRACE_PROFILE_BY", "peak")],
        &d.join("run"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.describe());
    assert!(!out.stderr.contains("is not valid"), "{}", out.describe());
    let report = exit_report(&out.stderr);
    let ranking = report
        .split("mem-trace: top ")
        .nth(1)
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        ranking
            .lines()
            .next()
            .is_some_and(|l| l.ends_with(" stacks by bytes live at the global peak, biggest last:")),
        "{report}"
    );
    // The biggest (# 0, written last) is the peak's site, with its bytes at the peak.
    let first = ranking
        .split("# 0: ")
        .nth(1)
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        first.starts_with("4194304 bytes in 64 blocks at the peak, 0 bytes live"),
        "{report}"
    );
    assert!(
        first.lines().take(8).any(|l| l.contains("peak_site")),
        "{report}"
    );
}

/// A program that allocated nothing, its report kept (`--all-reports`): no graph to draw, so
/// no `.folded` or `.svg` is left, and the summary lists none.
#[test]
fn an_empty_flame_graph_is_neither_written_nor_listed() {
    let d = scratch("nothing");
    let out = run_with(&d, &["--all-reports"], "nothing", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", out.describe());
    let out_dir = d.join("out");
    let txt = files_ending(&out_dir, ".1.txt");
    assert_eq!(txt.len(), 1, "{}", out.describe());
    assert!(read_text(&txt[0]).contains("(at exit)"));
    assert!(
        files_ending(&out_dir, ".folded").is_empty(),
        "{}",
        out.describe()
    );
    assert!(
        files_ending(&out_dir, ".svg").is_empty(),
        "{}",
        out.describe()
    );
    assert!(!out.stderr.contains("flame graph"), "{}", out.describe());
    assert!(
        out.stderr.contains("exit report of process"),
        "{}",
        out.describe()
    );
    // And the flame graph command refuses what has nothing to draw, writing nothing.
    let empty = d.join("empty.folded");
    fs::write(&empty, "").unwrap();
    let svg = d.join("empty.svg");
    let drawn = Command::new(mem_trace_binary())
        .args(["flamegraph", "--from-folded"])
        .arg(&empty)
        .arg("-o")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(!drawn.status.success());
    assert!(!svg.exists());
    assert_eq!(drawn.status.signal(), None);
}

/// 40 threads made and ended: the report lists the 10 with the highest peaks (threads 31 to
/// 40 of the fixture: 31 to 40 KiB), and one line for the other 30.
#[test]
fn a_report_lists_ten_exited_threads_and_sums_up_the_rest() {
    let d = scratch("threads");
    let out = preloaded(&fixture().bin, &["threads", "40"], &[], &d.join("run"));
    assert_eq!(out.status.code(), Some(0), "{}", out.describe());
    let report = exit_report(&out.stderr);
    let peaks = report
        .split("mem-trace: thread peaks:\n")
        .nth(1)
        .and_then(|r| r.split("mem-trace: top ").next())
        .unwrap_or_else(|| panic!("{report}"));
    let exited: Vec<&str> = peaks.lines().filter(|l| l.ends_with(", exited")).collect();
    assert_eq!(exited.len(), 10, "{peaks}");
    // The main thread is listed, running; each exited one shown held at least 31 KiB.
    assert!(
        peaks.lines().next().unwrap().starts_with("   thread 1 "),
        "{peaks}"
    );
    for l in &exited {
        let peak: u64 = l
            .split("peak ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{l}"));
        assert!(peak >= 31 * 1024, "{peaks}");
    }
    let last = peaks.lines().last().unwrap();
    // Threads 2 to 31 held 1 to 30 KiB; 465 KiB in all.
    assert_eq!(
        last,
        "   ... and 30 more exited threads, each with a peak of at most 30720 bytes, 476160 \
         bytes allocated in all"
    );
}

/// A program that forked (no exec): each process listens on its own FIFO, and both write a
/// final report when `run` is stopped; the signal goes to the program only.
#[test]
fn a_forked_child_writes_its_own_final_report() {
    let d = scratch("sigterm-fork");
    let mut before = String::new();
    let (sh, run) = serve_mode(&d, "serve-fork", &mut before);
    let child: i32 = before
        .trim()
        .strip_prefix("child ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{before}"));
    // SAFETY: signals the mem-trace this test started (through sh).
    unsafe { libc::kill(run as i32, libc::SIGTERM) };
    let mut sh = sh;
    wait_for(&mut sh);
    // SAFETY: the fixture's child, which this test made; the signal went to its parent only.
    // It holds sh's stdout open: gone, the rest can be read.
    unsafe { libc::kill(child, libc::SIGKILL) };
    let rest = rest(sh);
    assert_eq!(rest, "status 143\n");
    let stderr = read_text(&d.join("run.stderr"));
    assert!(
        stderr.contains("asking 2 processes for their final report"),
        "{stderr}"
    );
    let report = read_text(&d.join(format!("out/mem-trace.{child}.1.txt")));
    assert!(
        report.starts_with("mem-trace: report 1 (final)"),
        "{report}"
    );
    // The child's own block, and its parent's four inherited.
    assert!(
        report
            .lines()
            .next()
            .is_some_and(|l| l.ends_with(": 27775 bytes live in 5 blocks, peak 27775 bytes")),
        "{report}"
    );
    assert_eq!(
        stderr.matches("final report of process").count(),
        2,
        "{stderr}"
    );
}

/// glibc ends a process whose last thread returns or calls `pthread_exit` with `exit(0)`, and
/// counts the profiler thread among its threads: `main` leaving by `pthread_exit` while a
/// thread of its own keeps the blocks, and a child forked from a thread that then leaves,
/// end as they do plain, with their exit reports, whether or not periodic reports are on.
/// (Before, each lived on with only the profiler thread, and took no signal but SIGKILL.)
#[test]
fn a_process_whose_last_thread_leaves_ends_with_its_exit_report() {
    for (mode, processes) in [("main-leaves", 1), ("fork-leaves", 2)] {
        for interval in ["0", "1000"] {
            let d = scratch(&format!("{mode}-{interval}"));
            let env = [("MEM_TRACE_PROFILE_INTERVAL", interval)];
            let out = preloaded(&fixture().bin, &[mode], &env, &d.join("run"));
            assert_eq!(out.status.code(), Some(0), "{}", out.describe());
            assert_eq!(
                out.stderr.matches("(at exit)").count(),
                processes,
                "{}",
                out.describe()
            );
            let report = exit_report(&out.stderr);
            assert!(
                report.contains("22220 bytes in 4 blocks") && report.contains("hold_site"),
                "{report}"
            );
        }
    }
}

/// The same under `mem-trace run`, where every process listens for a final report and so
/// has a profiler thread from the start.
#[test]
fn under_run_a_process_whose_last_thread_leaves_ends() {
    for (mode, processes) in [("main-leaves", 1), ("fork-leaves", 2)] {
        let d = scratch(&format!("run-{mode}"));
        let out = run_with(&d, &["--all-reports"], mode, &[]);
        assert_eq!(out.status.code(), Some(0), "{}", out.describe());
        assert_eq!(
            out.stderr.matches("exit report of process").count(),
            processes,
            "{}",
            out.describe()
        );
    }
}
