//! The `mem-trace` command reading targets without gdb: a running process that keeps working
//! at full speed while it is read, a core of the same process giving the same answers, the
//! gdb commands giving the same answers on that core, and every error as one line.
//!
//! The reference program is `tests/fixtures/cli_target.c` (its sites, and the gdb script that
//! answers on the core this file writes).

mod common;
// The WebDriver client of the DHAT viewer test (headless Chromium through chromedriver).
#[path = "../crates/cli/tests/webdriver/mod.rs"]
mod webdriver;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use common::mtrace::{comparable_with_gdb, gdb, with_entry_script};
use common::{
    c_fixture, mem_trace_binary, mem_trace_run, profiler_library, run_with_timeout, spawn_fixture,
    waiting_fixture, Fixture, Output,
};

/// The tests of this file take turns: the speed test compares a program's rate of work in
/// windows with and without reads, and a neighbour writing a core or driving Chromium on one
/// of the machine's two cores meanwhile would load one window and not the other (seen once).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn cli_target() -> Fixture {
    with_entry_script(c_fixture("cli_target.c", &["-pthread"]))
}

/// The fixture running under the profiler build, its stdout read line by line as it comes.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<(Instant, String)>,
    seen: Vec<String>,
}

impl Running {
    fn start(fixture: &Fixture, mode: &str) -> Running {
        let mut cmd = waiting_fixture(fixture, profiler_library());
        let mut child = spawn_fixture(cmd.arg(mode), fixture);
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Running {
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line, within 30 s.
    fn next_line(&mut self) -> (Instant, String) {
        let got = self
            .lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| {
                panic!("no output from the program ({e}); so far: {:?}", self.seen)
            });
        self.seen.push(got.1.clone());
        got
    }

    /// The rest of the first line that starts with `prefix`.
    fn wait_for(&mut self, prefix: &str) -> String {
        loop {
            let (_, line) = self.next_line();
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.trim().to_string();
            }
        }
    }

    /// Ends the program (end of its input) and checks it exits 0.
    fn finish(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "the program ended with {status}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the program did not exit at end of input"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `mem-trace ARGS`, with a timeout, logs next to the fixture.
fn mem_trace(fixture: &Fixture, label: &str, args: &[&str]) -> Output {
    mem_trace_run(fixture, label, args)
}

/// `mem-trace ARGS` succeeded: its stdout.
fn answer(fixture: &Fixture, label: &str, args: &[&str]) -> String {
    let out = mem_trace(fixture, label, args);
    assert!(
        out.status.success()
            && out
                .stderr
                .lines()
                .all(|l| l.starts_with("mem-trace: note: ")
                    && l.contains(" ran on while it was read")
                    // `leaks` stops the process for its scan, and says for how long.
                    || l.starts_with("mem-trace: stopped ") && l.contains(" of process ")),
        "`{}`: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.command,
        out.status,
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// `(ns, total)` of a `count NS TOTAL` line.
fn count_line(line: &str) -> Option<(u64, u64)> {
    let mut words = line.strip_prefix("count ")?.split_whitespace();
    Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
}

/// Batches per second the program did while `during` ran, from the `count NS TOTAL` lines it
/// printed (its own clock, so the reader's speed does not enter), with what `during` returned.
fn rate_during<T>(run: &mut Running, during: impl FnOnce() -> T) -> (f64, T) {
    let mut first = None;
    while let Ok((_, line)) = run.lines.try_recv() {
        first = count_line(&line).or(first);
    }
    let first = match first {
        Some(f) => f,
        None => loop {
            if let Some(c) = count_line(&run.next_line().1) {
                break c;
            }
        },
    };
    let value = during();
    // The newest line queued when `during` returned closes the window.
    let mut last = None;
    while let Ok((_, line)) = run.lines.try_recv() {
        last = count_line(&line).or(last);
    }
    let last = match last {
        Some(l) => l,
        None => loop {
            if let Some(c) = count_line(&run.next_line().1) {
                break c;
            }
        },
    };
    let seconds = (last.0 - first.0) as f64 / 1e9;
    assert!(seconds > 1.0, "too short a window: {seconds} s");
    ((last.1 - first.1) as f64 / seconds, value)
}

/// Runs `f` again and again for `seconds`; how many times.
fn repeat_for(seconds: f64, mut f: impl FnMut()) -> usize {
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed().as_secs_f64() < seconds {
        f();
        n += 1;
    }
    n
}

/// `mem-trace top PID` on a program whose two threads allocate and free all the time: the
/// top stack is the hold, and the program works as fast while it is read as without (its rate
/// of batches within 10%, the median of three windows of each), because nothing stops it.
#[test]
fn top_of_a_running_process_keeps_it_at_full_speed() {
    let _turn = one_at_a_time();
    let fixture = cli_target();
    let mut run = Running::start(&fixture, "steady");
    let pid = run.pid().to_string();
    // Warm up: the hold is done and both threads are going.
    for _ in 0..5 {
        run.wait_for("count ");
    }
    let mut idle = Vec::new();
    let mut reading = Vec::new();
    let mut reads = 0;
    for round in 0..3 {
        idle.push(rate_during(&mut run, || std::thread::sleep(Duration::from_secs(2))).0);
        let (rate, n) = rate_during(&mut run, || {
            repeat_for(2.0, || {
                let top = answer(&fixture, &format!("top.{round}"), &["top", &pid, "1"]);
                let first_frame = top
                    .lines()
                    .skip_while(|l| !l.starts_with("# 0:"))
                    .nth(1)
                    .unwrap_or_else(|| panic!("no stack in\n{top}"));
                assert!(
                    top.contains("# 0: 16777216 bytes in 4096 blocks")
                        && first_frame.contains(" in hold_site at "),
                    "the top stack is not the hold:\n{top}"
                );
            })
        });
        reading.push(rate);
        reads += n;
    }
    idle.sort_by(f64::total_cmp);
    reading.sort_by(f64::total_cmp);
    let (idle, reading) = (idle[1], reading[1]);
    eprintln!("batches/s: {idle:.0} idle, {reading:.0} while read ({reads} reads of `top`)");
    assert!(reads >= 3, "only {reads} reads in 6 s");
    assert!(
        reading >= idle * 0.9,
        "the program slowed down while read: {reading:.0} batches/s against {idle:.0}"
    );
    run.finish();
}

/// Lines of the gdb output between `=== name` and the next marker.
fn section<'a>(gdb_output: &'a str, name: &str) -> Vec<&'a str> {
    let start = format!("=== {name}");
    gdb_output
        .lines()
        .skip_while(|l| l.trim() != start)
        .skip(1)
        .take_while(|l| !l.starts_with("=== "))
        .collect()
}

/// The same program read running (by pid) and from its core (written by gdb's `gcore`,
/// which stops it only while it writes) gives the same answers for every subcommand, and
/// the gdb commands on that core give the same answers again.
#[test]
fn a_process_and_its_core_answer_as_the_gdb_commands() {
    let _turn = one_at_a_time();
    let fixture = cli_target();
    let mut run = Running::start(&fixture, "wait");
    let pid = run.pid().to_string();
    let held = run.wait_for("held ");
    let freed = run.wait_for("freed ");
    run.wait_for("ready");

    let subcommands: Vec<(&str, Vec<&str>)> = vec![
        ("info", vec!["info"]),
        ("top", vec!["top"]),
        ("peaks", vec!["peaks"]),
        ("leaks", vec!["leaks"]),
        ("why-held", vec!["why", &held]),
        ("why-freed", vec!["why", &freed]),
        ("history", vec!["history", &freed]),
    ];
    let ask = |target: &str, label: &str| -> Vec<String> {
        subcommands
            .iter()
            .map(|(name, args)| {
                // TARGET first, then the subcommand's own arguments.
                let mut all: Vec<&str> = vec![args[0], target];
                all.extend(&args[1..]);
                answer(&fixture, &format!("{name}.{label}"), &all)
            })
            .collect()
    };
    let live = ask(&pid, "pid");

    let core = fixture.dir.join("cli_target.core");
    let _ = std::fs::remove_file(&core);
    let gcore = run_with_timeout(
        {
            let mut c = Command::new("gdb");
            c.args(["-nx", "-batch", "-p", &pid, "-ex"])
                .arg(format!("gcore {}", core.display()));
            c
        },
        &fixture.dir.join("gcore"),
        true,
        None,
        Duration::from_secs(90),
        "gcore",
    );
    assert!(core.is_file(), "gcore wrote no core:\n{}", gcore.stdout);
    let core_path = core.to_str().expect("utf-8 path");
    let from_core = ask(core_path, "core");
    run.finish();

    let gdb_run = gdb(&fixture, "core");
    for (((name, _), live), from_core) in subcommands.iter().zip(&live).zip(&from_core) {
        // The roots differ, and say so in the leaks answer's first line: a running process
        // is never stopped, so its registers are not read and its stacks are scanned whole,
        // where a core has registers and stack pointers. The classes must be the same.
        let roots_aside = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| !l.starts_with("scanned "))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            roots_aside(live),
            roots_aside(from_core),
            "`mem-trace {name}`: the process and its core differ"
        );
        let src = fixture.src.to_str().expect("utf-8 path");
        let ours: Vec<String> = from_core
            .lines()
            .map(|l| comparable_with_gdb(l, src))
            .collect();
        let theirs: Vec<String> = section(&gdb_run.output, name)
            .into_iter()
            .map(|l| comparable_with_gdb(l, src))
            .collect();
        assert_eq!(
            ours,
            theirs,
            "`mem-trace {name}` on the core differs from the gdb command on it\n{}",
            gdb_run.report()
        );
    }
    // And the answers are the right ones, not merely the same.
    let why = &from_core[4];
    assert!(
        why.starts_with(&format!("{held} is 100 bytes inside a 4096-byte block")),
        "{why}"
    );
    assert!(why.contains(" in hold_site at "), "{why}");
    let freed_answer = &from_core[5];
    assert!(
        freed_answer.contains(" is 16 bytes inside a 48-byte block"),
        "{freed_answer}"
    );
    assert!(
        freed_answer.contains(" in release_site at "),
        "{freed_answer}"
    );
    assert!(
        freed_answer.contains(" in freed_site at "),
        "{freed_answer}"
    );
    let leaks = &from_core[3];
    assert!(leaks.contains("50000 bytes in 50 blocks"), "{leaks}");
    assert!(leaks.contains(" in leak_site at "), "{leaks}");
}

fn assert_one_line_error(out: &Output, expect: &str) {
    assert!(
        !out.status.success(),
        "`{}` succeeded:\n{}",
        out.command,
        out.stdout
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("mem-trace: ") && lines[0].contains(expect),
        "`{}`: expected one line containing {expect:?}, got:\n{}",
        out.command,
        out.stderr
    );
    assert!(
        out.stdout.is_empty(),
        "`{}` printed:\n{}",
        out.command,
        out.stdout
    );
}

/// Every way a target can be wrong is one line saying so, and a non-zero exit. (A layout
/// version from another build and a library file replaced since the core was written are
/// produced in tests/target.rs, which checks the same messages the command prints.)
#[test]
fn bad_targets_are_one_line_errors() {
    let _turn = one_at_a_time();
    let fixture = cli_target();
    let dir = &fixture.dir;
    let err = |label: &str, args: &[&str], expect: &str| {
        assert_one_line_error(&mem_trace(&fixture, label, args), expect);
    };
    // A pid no process has (above the kernel's pid_max limit of 2^22).
    err("no-process", &["top", "4194304"], "no process");
    // A process without the library, and its core, whole and cut in half.
    let mut sleeper = Command::new("sleep").arg("60").spawn().expect("sleep");
    let sleeper_pid = sleeper.id().to_string();
    err("not-loaded", &["top", &sleeper_pid], "LD_PRELOAD");
    // Another user may not read it (the same rule as a debugger's).
    let binary = mem_trace_binary().to_str().expect("utf-8 path");
    let mut as_nobody = Command::new("setpriv");
    as_nobody
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            binary,
        ])
        .args(["top", &sleeper_pid]);
    let out = run_with_timeout(
        as_nobody,
        &dir.join("mem-trace.as-nobody"),
        false,
        None,
        Duration::from_secs(60),
        "mem-trace as nobody",
    );
    assert_one_line_error(&out, "not allowed to read process");
    let core = dir.join("sleep.core");
    let gcore = {
        let mut c = Command::new("gdb");
        c.args(["-nx", "-batch", "-p", &sleeper_pid, "-ex"])
            .arg(format!("gcore {}", core.display()));
        run_with_timeout(
            c,
            &dir.join("gcore-sleep"),
            true,
            None,
            Duration::from_secs(90),
            "gcore",
        )
    };
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let core_text = core.to_str().expect("utf-8 path");
    assert!(core.is_file(), "gcore wrote no core:\n{}", gcore.stdout);
    err("core-not-loaded", &["top", core_text], "LD_PRELOAD");
    let bytes = std::fs::read(&core).expect("read the core");
    let cut = dir.join("sleep.core.cut");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    err("truncated", &["top", cut.to_str().unwrap()], "truncated");
    let _ = std::fs::remove_file(&core);
    let _ = std::fs::remove_file(&cut);
    // Files that are not cores.
    let text = dir.join("not-a-core.txt");
    std::fs::write(&text, "hello\n").expect("write");
    err("not-elf", &["top", text.to_str().unwrap()], "not an ELF");
    err("not-core", &["top", "/bin/true"], "not a core");
    // An address that is not a number.
    err("bad-address", &["why", "1", "nonsense"], "nonsense");
}

/// The flame graph and DHAT's JSON of a real process: the folded stacks' totals are `top`'s
/// numbers (the same counters), the SVG is XML naming the fixture's sites, and valgrind's own
/// viewer, loading the JSON in headless Chromium, shows the hold as the top stack with its
/// bytes, function and `file:line`.
#[test]
fn flame_graph_and_dhat_of_a_running_process() {
    let _turn = one_at_a_time();
    let fixture = cli_target();
    let mut run = Running::start(&fixture, "wait");
    let pid = run.pid().to_string();
    run.wait_for("ready");
    let dir = fixture.dir.display().to_string();
    let folded_path = format!("{dir}/live.folded");
    let svg_path = format!("{dir}/live.svg");
    let json_path = format!("{dir}/live.dhat.json");
    answer(
        &fixture,
        "folded",
        &["flamegraph", &pid, "--folded", "-o", &folded_path],
    );
    answer(&fixture, "svg", &["flamegraph", &pid, "-o", &svg_path]);
    answer(&fixture, "dhat", &["dhat", &pid, "-o", &json_path]);
    let top = answer(&fixture, "top-all", &["top", &pid, "1000"]);
    run.finish();

    // Each folded line's value is its stack's live bytes; their sum is the live total `top`
    // gives, and the hold's line carries the hold's bytes.
    let folded = std::fs::read_to_string(&folded_path).expect("folded");
    let value = |l: &str| -> u64 { l.rsplit(' ').next().unwrap().parse().expect("a count") };
    let total: u64 = folded.lines().map(value).sum();
    let ranked: u64 = top
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .map(|l| {
            let bytes = l.split_once(": ").expect("# N: B bytes").1;
            bytes
                .split(' ')
                .next()
                .unwrap()
                .parse::<u64>()
                .expect("bytes")
        })
        .sum();
    assert_eq!(total, ranked, "folded:\n{folded}\ntop:\n{top}");
    let hold = folded
        .lines()
        .find(|l| l.contains("hold_site"))
        .unwrap_or_else(|| panic!("no hold_site in\n{folded}"));
    assert!(
        hold.starts_with("_start;") || hold.contains(";main;"),
        "{hold}"
    );
    assert_eq!(value(hold), 16_777_216, "{hold}");

    let svg = std::fs::read_to_string(&svg_path).expect("svg");
    // inferno's SVG starts with the SVG 1.1 DOCTYPE.
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    let doc = roxmltree::Document::parse_with_options(&svg, options)
        .unwrap_or_else(|e| panic!("not XML ({e})"));
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    for site in ["hold_site", "leak_site", "hold_array_site", "main"] {
        assert!(
            titles.iter().any(|t| t.starts_with(site)),
            "no {site} in the SVG's frames: {titles:?}"
        );
    }

    let browser = webdriver::Browser::start();
    browser.open("file:///usr/libexec/valgrind/dh_view.html");
    browser.choose_file(&json_path);
    let text = browser.text_when(Duration::from_secs(30), |t| {
        t.contains("PP 1.1/") || t.contains("Error")
    });
    assert!(!text.contains("Error"), "the viewer says:\n{text}");
    let top_pp = &text[text.find("PP 1.1/").expect("PP 1.1")..];
    let top_pp = &top_pp[..top_pp.find("\n}").unwrap_or(top_pp.len())];
    let hold_line = format!("hold_site ({}:", fixture.src.display());
    for expected in ["Total:     16,777,216 bytes", "in 4,096 blocks", &hold_line] {
        assert!(
            top_pp.contains(expected),
            "no {expected:?} in the viewer's top stack:\n{top_pp}"
        );
    }
}
