//! `mem-trace run PROGRAM`: the program's exit status, its death by a signal, its stdin and
//! stdout pass through untouched; its reports land in the directory with their folded stacks,
//! flame graphs and leak check; each error is one line and a non-zero status.
//!
//! The binary runs from `target/profiler/release/`, beside the profiler build of the library
//! (`common::mem_trace_binary`), as `cargo build --release --features profiler` leaves them;
//! `the_default_build_writes_the_report_too` points it at the default build.
//! Fixtures: `tests/fixtures/run_modes.c` (ways to end) and `profile_sites.c` (known sites).

mod common;

use common::{
    c_fixture, files_ending, library, mem_trace_binary, profiler_library, read_text,
    run_with_timeout, Output,
};
use std::ffi::OsString;
use std::fs;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::Command;

fn modes() -> common::Fixture {
    c_fixture("run_modes.c", &[])
}

fn sites() -> common::Fixture {
    c_fixture("profile_sites.c", &["-lpthread", "-ldl"])
}

/// A fresh, empty directory for one test: its working directory and logs.
fn scratch(name: &str) -> PathBuf {
    common::scratch_dir("cli_run", name)
}

/// How to run `mem-trace` for one test.
struct Run {
    binary: PathBuf,
    args: Vec<OsString>,
    env: Vec<(&'static str, OsString)>,
    stdin: Option<PathBuf>,
    cwd: PathBuf,
}

impl Run {
    /// `mem-trace ARGS` in the test's scratch directory `name`.
    fn new(name: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
        Run {
            binary: mem_trace_binary().to_path_buf(),
            args: args.iter().map(|a| a.as_ref().to_owned()).collect(),
            env: Vec::new(),
            stdin: None,
            cwd: scratch(name),
        }
    }

    /// Runs it, without core dumps (the program's deaths by signal must leave no core).
    fn run(&self) -> Output {
        let mut cmd = Command::new(&self.binary);
        cmd.args(&self.args)
            .current_dir(&self.cwd)
            .env_remove("LD_PRELOAD")
            .env_remove("MEM_TRACE_LIB")
            .env_remove("MEM_TRACE_PROFILE_INTERVAL");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        common::no_core_dump(&mut cmd);
        run_with_timeout(
            cmd,
            &self.cwd.join("mem-trace"),
            false,
            self.stdin.as_deref(),
            common::RUN_TIMEOUT,
            "mem-trace run",
        )
    }

    /// The directory the reports went to (`-o out`).
    fn out(&self) -> PathBuf {
        self.cwd.join("out")
    }
}

#[test]
fn the_exit_code_is_passed_through() {
    let f = modes();
    let r = Run::new("exit-code", &[&"run", &"-o", &"out", &f.bin, &"exit", &"3"]);
    let out = r.run();
    assert_eq!(out.status.code(), Some(3), "{}", out.describe());
    // Its report is there, and says where it is.
    let txt = files_ending(&r.out(), ".txt");
    assert!(
        out.stderr.contains(&format!(
            "mem-trace: 1 report in {}",
            r.out().canonicalize().unwrap().display()
        )),
        "{}",
        out.describe()
    );
    assert!(
        txt.iter().any(|t| read_text(t).contains("(at exit)")),
        "{txt:?}"
    );
}

#[test]
fn a_death_by_signal_is_passed_through() {
    let f = modes();
    for (mode, sig) in [("abort", libc::SIGABRT), ("segv", libc::SIGSEGV)] {
        let r = Run::new(
            &format!("signal-{mode}"),
            &[&"run", &"-o", &"out", &f.bin, &mode],
        );
        let out = r.run();
        assert_eq!(out.status.signal(), Some(sig), "{mode}: {}", out.describe());
        assert!(!out.status.core_dumped(), "{mode}: {}", out.describe());
        // No exit report: the program never called exit. Said so.
        assert!(
            out.stderr.contains("mem-trace: no report in"),
            "{mode}: {}",
            out.describe()
        );
        assert!(
            files_ending(&r.cwd, "core").is_empty(),
            "{mode}: a core was left"
        );
    }
}

/// A SIGINT to the whole process group (as a Ctrl-C at the terminal sends it) reaches the
/// program at once: it dies of it, `mem-trace` with it, and says the program had no exit
/// report. (A SIGINT to `mem-trace` alone first asks for the final report: tests/exit_report.rs.)
#[test]
fn ctrl_c_goes_to_the_program() {
    let d = scratch("ctrl-c");
    let mut child = Command::new(mem_trace_binary())
        .args(["run", "-o", "out", "sleep", "30"])
        .current_dir(&d)
        .env_remove("LD_PRELOAD")
        .env_remove("MEM_TRACE_LIB")
        .stderr(fs::File::create(d.join("stderr")).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let wait = |child: &mut std::process::Child, ms: u64| {
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if start.elapsed() > std::time::Duration::from_millis(ms) {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    // Wait until the program runs (its report directory is made just before).
    assert!(wait(&mut child, 500).is_none(), "mem-trace ended early");
    // SAFETY: signals the process group this test started (mem-trace and the program).
    unsafe { libc::kill(-pid, libc::SIGINT) };
    let status = wait(&mut child, 30_000);
    if status.is_none() {
        // SAFETY: as above; the test has failed, nothing is left behind.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = child.wait();
    }
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(libc::SIGINT),
        "{status:?}"
    );
    let stderr = read_text(&d.join("stderr"));
    assert!(
        stderr.contains("(the program): it was killed by SIGINT"),
        "{stderr}"
    );
}

/// Bytes of every value, piped through `cat` under the tracer: stdout is stdin, byte for byte,
/// and nothing of mem-trace's is on it.
#[test]
fn stdin_and_stdout_are_untouched() {
    let mut r = Run::new("cat", &[&"run", &"-o", &"out", &"cat"]);
    let input: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let stdin = r.cwd.join("input.bin");
    fs::write(&stdin, &input).unwrap();
    r.stdin = Some(stdin);
    let out = r.run();
    assert!(out.success(), "{}", out.stderr);
    let stdout = fs::read(r.cwd.join("mem-trace.stdout")).unwrap();
    assert!(
        stdout == input,
        "stdout differs from stdin: {} bytes of {}\n{}",
        stdout.len(),
        input.len(),
        out.stderr
    );
    // cat was traced: its exit report is in the directory.
    assert_eq!(files_ending(&r.out(), ".folded").len(), 1, "{}", out.stderr);
}

/// The exit report of `profile_sites`, its folded stacks (the same counts as the report's
/// ranking), its flame graph (naming the fixture's functions) and its leak check.
#[test]
fn the_report_its_folded_stacks_flame_graph_and_leaks_are_in_the_directory() {
    let f = sites();
    let r = Run::new("sites", &[&"run", &"-o", &"out", &f.bin]);
    let out = r.run();
    assert!(out.success(), "{}", out.describe());
    assert_eq!(out.stdout, "sites done\n", "{}", out.describe());
    let txt = files_ending(&r.out(), ".txt");
    let report = txt
        .iter()
        .find(|t| !t.to_string_lossy().ends_with(".leaks.txt"))
        .expect("a report");
    let text = read_text(report);
    assert!(text.starts_with("mem-trace: report 1 (at exit)"), "{text}");

    // The ranking's counts, `# i: N bytes in ...`, up to the peaks.
    let ranking = &text[..text.find("mem-trace: global peak").unwrap()];
    let mut ranked: Vec<u64> = ranking
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .map(|l| l.split(' ').nth(1).unwrap().parse().unwrap())
        .collect();
    let folded = read_text(&report.with_extension("folded"));
    let mut values: Vec<u64> = folded
        .lines()
        .filter(|l| !l.starts_with('['))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
        .collect();
    ranked.sort();
    values.sort();
    assert_eq!(values, ranked, "folded:\n{folded}\nreport:\n{ranking}");
    assert!(
        folded
            .lines()
            .any(|l| l.ends_with(";sites;hold_site 67108864")),
        "{folded}"
    );

    let svg = read_text(&report.with_extension("svg"));
    assert!(svg.starts_with("<?xml"), "{svg}");
    for function in ["hold_site", "sites", "main"] {
        assert!(
            svg.contains(&format!("<title>{function} (")),
            "no {function} in the svg"
        );
    }

    let leaks = read_text(&report.with_extension("leaks.txt"));
    assert!(
        leaks.starts_with("mem-trace: leak check: definitely lost: "),
        "{leaks}"
    );
    let lost = "# 0: 100000 bytes in 100 blocks definitely lost\n   0: leak_site\n";
    assert!(leaks.contains(lost), "{leaks}");
    assert!(!leaks.contains("end of report"), "{leaks}");
    assert!(
        out.stderr.contains(&format!(
            "exit report of process {}",
            report
                .file_name()
                .unwrap()
                .to_string_lossy()
                .split('.')
                .nth(1)
                .unwrap()
        )),
        "{}",
        out.describe()
    );
}

/// `mem-trace run --profile -o out run_modes quiet-children MS`, a report every 0.2 s.
fn profiled_quiet_children(name: &str, ms: &str) -> Run {
    let f = modes();
    let args: [&dyn AsRef<std::ffi::OsStr>; 7] = [
        &"run",
        &"--profile",
        &"-o",
        &"out",
        &f.bin,
        &"quiet-children",
        &ms,
    ];
    let mut r = Run::new(name, &args);
    r.env.push(("MEM_TRACE_PROFILE_INTERVAL", "0.2".into()));
    r
}

/// With `--profile`, periodic reports too, each drawn by the library in a child process the
/// program cannot see: no SIGCHLD, nothing for its `waitpid(-1)` to reap (a child of its own,
/// the control, is seen both ways).
#[test]
fn periodic_flame_graphs_are_drawn_unseen_by_the_program() {
    let r = profiled_quiet_children("periodic", "1200");
    let out = r.run();
    assert!(out.success(), "{}", out.describe());
    assert_eq!(
        out.stdout,
        common::QUIET_CHILDREN_UNSEEN,
        "{}",
        out.describe()
    );
    let txt = files_ending(&r.out(), ".txt");
    let periodic: Vec<_> = txt
        .iter()
        .filter(|t| {
            read_text(t).starts_with("mem-trace: report") && read_text(t).contains("(periodic)")
        })
        .collect();
    assert!(periodic.len() >= 3, "{txt:?}\n{}", out.describe());
    for t in &periodic {
        let svg = t.with_extension("svg");
        assert!(read_text(&svg).contains("keep_site"), "{}", svg.display());
    }
    assert!(
        !out.stderr.contains("mem-trace: no flame graph"),
        "{}",
        out.describe()
    );
}

/// A library whose directory has no `mem-trace` binary: one note, the folded stacks stay, and
/// `run` draws the flame graphs afterwards.
#[test]
fn without_the_binary_beside_the_library_the_folded_stacks_stay() {
    let mut r = profiled_quiet_children("lib-alone", "700");
    let lib_dir = r.cwd.join("lib");
    fs::create_dir_all(&lib_dir).unwrap();
    let lib = lib_dir.join("libmem_trace.so");
    fs::copy(profiler_library(), &lib).unwrap();
    r.env.push(("MEM_TRACE_LIB", lib.into()));
    let out = r.run();
    assert!(out.success(), "{}", out.describe());
    let notes = out.stderr.matches("mem-trace: no flame graphs: ").count();
    assert_eq!(notes, 1, "{}", out.describe());
    let folded = files_ending(&r.out(), ".folded");
    assert!(folded.len() >= 2, "{folded:?}");
    for fo in folded {
        assert!(
            read_text(&fo.with_extension("svg")).contains("keep_site"),
            "{}",
            fo.display()
        );
    }
}

/// One line on stderr starting `mem-trace: `, the status, and no report directory made.
fn assert_one_line_error(r: &Run, code: i32, starts: &str) {
    let out = r.run();
    assert_eq!(out.status.code(), Some(code), "{}", out.describe());
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.describe());
    assert!(out.stderr.starts_with(starts), "{}", out.describe());
    let left: Vec<_> = fs::read_dir(&r.cwd)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("mem-trace.") && !n.starts_with("mem-trace.std"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The default build (no `profiler` feature) serves `run`: its counters are always kept, and
/// `run` switches its reports on.
#[test]
fn the_default_build_writes_the_report_too() {
    let f = sites();
    let mut r = Run::new("default-build", &[&"run", &"-o", &"out", &f.bin]);
    r.env.push(("MEM_TRACE_LIB", library().into()));
    let out = r.run();
    assert!(out.success(), "{}", out.describe());
    let leaks = files_ending(&r.out(), ".leaks.txt");
    assert_eq!(leaks.len(), 1, "{}", out.describe());
    let text = read_text(&leaks[0]);
    assert!(
        text.contains("# 0: 100000 bytes in 100 blocks definitely lost"),
        "{text}"
    );
}

#[test]
fn errors_are_one_line() {
    let f = modes();
    assert_one_line_error(
        &Run::new("err-no-program", &[&"run"]),
        1,
        "mem-trace: run: no program given: mem-trace run [--mode MODE] [--profile] [-o DIR] [--] PROGRAM",
    );
    assert_one_line_error(
        &Run::new("err-not-found", &[&"run", &"no-such-program-here"]),
        127,
        "mem-trace: run: no-such-program-here: command not found",
    );
    assert_one_line_error(
        &Run::new("err-no-file", &[&"run", &"./nothing"]),
        127,
        "mem-trace: run: ./nothing: no such file",
    );

    let mut r = Run::new("err-lib-var", &[&"run", &f.bin]);
    r.env
        .push(("MEM_TRACE_LIB", "/nonexistent/libmem_trace.so".into()));
    assert_one_line_error(
        &r,
        1,
        "mem-trace: MEM_TRACE_LIB=/nonexistent/libmem_trace.so: no such file",
    );

    // The binary alone, no library beside it.
    let mut r = Run::new("err-no-lib", &[&"run", &f.bin]);
    let alone = r.cwd.join("bin");
    fs::create_dir_all(&alone).unwrap();
    r.binary = alone.join("mem-trace");
    fs::copy(mem_trace_binary(), &r.binary).unwrap();
    assert_one_line_error(
        &r,
        1,
        &format!(
            "mem-trace: no libmem_trace.so beside {}",
            r.binary.display()
        ),
    );
}
