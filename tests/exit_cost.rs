//! Exits that cost nothing the program would notice, on `tests/fixtures/exit_paths.c`: every
//! process a script starts under `mem-trace run` exits through the library, so what it pays
//! there is paid once per process (symbolizing at exit cost each ~55 ms):
//!
//! - under `mem-trace run` the traced process symbolizes nothing at exit (its statistics line
//!   says `symbolized_frames=0`: no debug information read in the dying process), and the
//!   report `run` leaves has the same text, function names and `file:line` included, as one
//!   symbolized in process;
//! - `run`'s summary names each report by its process's command line, and names the
//!   processes that allocated nothing worth a report, leaving no file for them.
//!
//! The time itself (about a millisecond at exit instead of ~55) is measured, not asserted: see
//! docs/FINDINGS.md, "The exit report's cost".

mod common;

use common::{
    c_fixture, files_ending, library, mem_trace_binary, read_text, run_with_timeout, Output,
};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture() -> common::Fixture {
    c_fixture("exit_paths.c", &["-pthread"])
}

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    common::scratch_dir("exit_cost", name)
}

/// `mem-trace run -o out PROGRAM ARGS` in `d`, with the statistics line on.
fn run(d: &Path, program: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(["run", "-o", "out"])
        .arg(program)
        .args(args)
        .current_dir(d)
        .env("MEM_TRACE_STATS", "1")
        .env_remove("LD_PRELOAD")
        .env_remove("MEM_TRACE_LIB")
        .env_remove("MEM_TRACE_PROFILE_INTERVAL")
        .env_remove("MEM_TRACE_PROFILE_BY");
    run_with_timeout(cmd, &d.join("run"), false, None, common::RUN_TIMEOUT, "run")
}

/// The fixture under the library as `run` sets it up, but symbolizing in process (no
/// `MEM_TRACE_DEFER_SYMBOLS`): the report a user saw before.
fn in_process(d: &Path, mode: &str) -> Output {
    let out = d.join("out");
    fs::create_dir_all(&out).unwrap();
    let mut cmd = Command::new(&fixture().bin);
    cmd.arg(mode)
        .env("LD_PRELOAD", library())
        .env("MEM_TRACE_PROFILE", "1")
        .env("MEM_TRACE_OUT", &out)
        .env("MEM_TRACE_LEAKS", "1")
        .env("MEM_TRACE_PROFILE_INTERVAL", "0")
        .env("MEM_TRACE_MODE", "profile")
        .env("MEM_TRACE_STATS", "1")
        .env_remove("MEM_TRACE_DEFER_SYMBOLS")
        .env_remove("MEM_TRACE_PROFILE_BY");
    run_with_timeout(
        cmd,
        &d.join("preloaded"),
        false,
        None,
        common::RUN_TIMEOUT,
        "preloaded",
    )
}

/// A report's text without what differs from one run to the next: its time, thread ids and
/// the absolute addresses of unnamed frames (their `module+0xoffset` stays).
fn normalized(report: &str) -> Vec<String> {
    report
        .lines()
        .skip(1)
        .map(|l| {
            let l = match l.split_once("(tid ") {
                Some((a, b)) => format!("{a}(tid N{}", &b[b.find(',').unwrap_or(0)..]),
                None => l.to_string(),
            };
            match l.trim_start().split_once(": 0x") {
                Some((n, rest)) if n.parse::<u32>().is_ok() => {
                    let module = rest.split_once(' ').map_or("", |(_, m)| m);
                    format!("{}: {module}", &l[..l.find(':').unwrap()])
                }
                _ => l,
            }
        })
        .collect()
}

/// Under `run` the exiting process reads no debug information, and the report `run` makes of
/// its return addresses is the one the process would have written itself.
#[test]
fn under_run_the_exit_report_is_symbolized_by_run_with_the_same_text() {
    let f = fixture();
    let d = scratch("same-text");
    let out = run(&d, &f.bin, &["free-all"]);
    assert_eq!(out.status.code(), Some(0), "{}", out.describe());
    assert_eq!(out.stat("symbolized_frames"), 0, "{}", out.describe());
    let txt = files_ending(&d.join("out"), ".1.txt");
    assert_eq!(txt.len(), 1, "{}", out.describe());
    let report = read_text(&txt[0]);
    // Names and lines, as before: the fixture's site with its file and line.
    let site = report
        .split_once(": peak_site\n")
        .unwrap_or_else(|| panic!("{report}"))
        .1;
    assert!(
        site.trim_start().starts_with("at ")
            && site.lines().next().unwrap().contains("exit_paths.c:"),
        "{report}"
    );
    assert!(
        report.contains("mem-trace: leak check: definitely lost:"),
        "{report}"
    );
    assert!(!report.contains("\n@"), "{report}");
    let folded = read_text(&txt[0].with_extension("folded"));
    assert!(
        folded.lines().any(|l| l.ends_with(";peak_site 4194304")),
        "{folded}"
    );
    let svg = read_text(&txt[0].with_extension("svg"));
    assert!(svg.contains("bytes live at the global peak (little was live at the end)"));
    assert!(svg.contains("peak_site"));

    // The same fixture symbolizing in process: it did symbolize, and wrote the same text.
    let d2 = scratch("same-text-in-process");
    let plain = in_process(&d2, "free-all");
    assert_eq!(plain.status.code(), Some(0), "{}", plain.describe());
    assert!(plain.stat("symbolized_frames") > 0, "{}", plain.describe());
    let theirs = files_ending(&d2.join("out"), ".1.txt");
    assert_eq!(theirs.len(), 1);
    assert_eq!(normalized(&read_text(&theirs[0])), normalized(&report));
    assert_eq!(read_text(&theirs[0].with_extension("folded")), folded);
}

/// The pid in a summary line `... process PID (COMMAND)...` that contains `command`.
fn pid_of(stderr: &str, what: &str) -> u32 {
    let line = stderr
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line with {what:?} in:\n{stderr}"));
    line.split("process ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"))
}

/// Several processes under one `run`: each report named by its command line, and those that
/// allocated nothing worth a report named, with no file left for them: one that allocated
/// nothing, and two (`cat`, two threads of a few KiB) with a small peak and nothing lost.
#[test]
fn the_summary_names_reports_by_command_line_and_the_processes_not_worth_one() {
    let f = fixture();
    let d = scratch("names");
    let script = r#""$0" free-all; "$0" nothing; cat </dev/null; "$0" threads 2; true"#;
    let out = run(
        &d,
        Path::new("sh"),
        &["-c", script, &f.bin.to_string_lossy()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.describe());
    let e = &out.stderr;
    let kept = pid_of(e, "(exit_paths free-all): mem-trace.");
    let nothing = pid_of(e, "(exit_paths nothing): it allocated nothing");
    let threads = pid_of(e, "(exit_paths threads 2): it allocated nothing worth one");
    assert!(
        e.contains(&format!(
            "no report kept for process {nothing} (exit_paths nothing): it allocated nothing\n"
        )),
        "{}",
        out.describe()
    );
    let cat = pid_of(e, "(cat): it allocated nothing worth one");
    assert!(
        e.contains(&format!(
            "no report kept for process {cat} (cat): it allocated nothing worth one (nothing lost and a peak under 1 MiB; `run --all-reports` keeps them)"
        )),
        "{}",
        out.describe()
    );
    let dir = d.join("out");
    assert_eq!(
        files_ending(&dir, &format!(".{kept}.1.txt")).len(),
        1,
        "{}",
        out.describe()
    );
    for pid in [nothing, cat, threads] {
        let left: Vec<PathBuf> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(&format!("mem-trace.{pid}.")))
            .collect();
        assert!(left.is_empty(), "{left:?}\n{}", out.describe());
    }
    // Every process of the run read no debug information at exit.
    for l in e.lines().filter(|l| l.starts_with("mem-trace: stats: ")) {
        assert!(l.ends_with(" symbolized_frames=0"), "{l}");
    }
    // `--all-reports` keeps them all.
    let d = scratch("names-all");
    let out = {
        let mut cmd = Command::new(mem_trace_binary());
        cmd.args(["run", "--all-reports", "-o", "out", "sh", "-c", script])
            .arg(&f.bin)
            .current_dir(&d)
            .env_remove("LD_PRELOAD")
            .env_remove("MEM_TRACE_LIB");
        run_with_timeout(cmd, &d.join("run"), false, None, common::RUN_TIMEOUT, "run")
    };
    assert_eq!(out.status.code(), Some(0), "{}", out.describe());
    assert!(!out.stderr.contains("no report kept"), "{}", out.describe());
    assert!(
        out.stderr.contains(" (cat): mem-trace."),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr.contains(" (exit_paths nothing): mem-trace."),
        "{}",
        out.describe()
    );
}
