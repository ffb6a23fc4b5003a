//! Small blocks of a profile-mode process (`MEM_TRACE_MODE=profile MEM_TRACE_TAGS=1`), which carry their
//! record in a 16-byte tag in front of them instead of a table slot (docs/LAYOUT.md "Block
//! tags"), against the real library and real gdb: `mtrace-why` on an interior pointer, the
//! start, the last byte and just past the end of blocks from `malloc`, `calloc`, `realloc`,
//! the largest a tag holds and one in the table; `mtrace-history`; `mtrace-leaks` finding a
//! leaked small block with its stack; live and on a core (the fixture's scripts,
//! `tests/fixtures/tagged_blocks.c`). Then the `mem-trace` command: `why` and `leaks` on that
//! core say what gdb says, and `why PID` on the running program names the same block; and
//! the profiler's exit report finds the leaked tagged blocks in-process.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Command;

use common::mtrace::{comparable_with_gdb, gdb, with_entry_script};
use common::{
    c_fixture, fixture_run, library, line_of, mem_trace_binary, run_with_timeout, spawn_fixture,
    waiting_fixture, Fixture, GdbRun, Output, RUN_TIMEOUT,
};

fn fixture() -> Fixture {
    with_entry_script(c_fixture("tagged_blocks.c", &[]))
}

/// `mem-trace ARGS` in the fixture's directory; asserts it succeeded.
fn mem_trace(fixture: &Fixture, label: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(args).current_dir(&fixture.dir);
    let out = run_with_timeout(
        cmd,
        &fixture.dir.join(label),
        false,
        None,
        RUN_TIMEOUT,
        label,
    );
    assert!(out.success(), "{}", out.describe());
    out
}

/// The lines of `run` between the markers `=== start` and `=== end`, trimmed.
fn section(run: &GdbRun, start: &str, end: &str) -> Vec<String> {
    run.between(&format!("=== {start}\n"), &format!("=== {end}"))
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn small_blocks_are_answered_live_on_a_core_and_by_the_command() {
    let fixture = fixture();
    // The fixture's checks: every answer live, then the same from the core it wrote.
    gdb(&fixture, "");
    let dead = gdb(&fixture, "core");
    let src = fixture.src.to_str().expect("utf-8 path");
    let core = fixture.dir.join("tagged_blocks.core");
    let core = core.to_str().expect("utf-8 path");

    // `mem-trace why CORE ADDR` gives gdb's answer on the core, line for line.
    for (start, end) in [
        ("kept", "kept-start"),
        ("kept-start", "kept-last"),
        ("kept-last", "kept-past"),
        ("zeroed", "grown"),
        ("grown", "largest"),
        ("largest", "big"),
        ("big", "history"),
    ] {
        let theirs: Vec<String> = section(&dead, start, end)
            .iter()
            .map(|l| comparable_with_gdb(l, src))
            .collect();
        let address = theirs[0].split(' ').next().expect("an address").to_string();
        let out = mem_trace(
            &fixture,
            &format!("mem-trace-why-{start}"),
            &["why", core, &address],
        );
        let ours: Vec<String> = out
            .stdout
            .lines()
            .map(|l| comparable_with_gdb(l.trim(), src))
            .collect();
        assert_eq!(
            ours,
            theirs,
            "`mem-trace why {core} {address}` differs from gdb's answer\n{}",
            dead.report()
        );
    }

    // `mem-trace leaks CORE`: the leaked small block, definitely lost, with its stack.
    let leaks = mem_trace(&fixture, "mem-trace-leaks", &["leaks", core, "-n", "0"]).stdout;
    let lost = leaks
        .split_once("definitely lost: 224 bytes in 4 blocks, allocated from:")
        .unwrap_or_else(|| panic!("no four 56-byte blocks definitely lost in:\n{leaks}"))
        .1;
    let first = lost.lines().nth(1).unwrap_or_default();
    let want = format!("in make_leaked at {src}:{}", line_of(&fixture, "leak"));
    assert!(first.contains(&want), "`{first}` is not `{want}`:\n{leaks}");
}

#[test]
fn mem_trace_why_names_a_small_block_of_a_running_process() {
    let fixture = fixture();
    let mut cmd = waiting_fixture(&fixture, library());
    cmd.env("MEM_TRACE_MODE", "profile")
        .env("MEM_TRACE_TAGS", "1")
        .arg("wait");
    let mut child = spawn_fixture(&mut cmd, &fixture);
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut address = |name: &str| {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the program's output");
        let hex = line
            .trim()
            .strip_prefix(&format!("{name} 0x"))
            .unwrap_or_else(|| panic!("`{line}` is not `{name} 0x...`"));
        u64::from_str_radix(hex, 16).expect("a hex address")
    };
    let (kept, largest) = (address("kept"), address("largest"));
    let pid = child.id().to_string();
    let src = fixture.src.display().to_string();
    for (addr, first, frame) in [
        (
            kept + 5,
            format!(
                "{:#x} is 5 bytes inside a 40-byte block [{kept:#x}, {:#x}) allocated by thread 1, tid {pid} \"tagged_blocks\"",
                kept + 5,
                kept + 40
            ),
            format!("in make_kept at {src}:{}", line_of(&fixture, "kept")),
        ),
        (
            largest + 65534,
            format!(
                "{:#x} is 65534 bytes inside a 65535-byte block [{largest:#x}, {:#x}) allocated by thread 1, tid {pid} \"tagged_blocks\"",
                largest + 65534,
                largest + 65535
            ),
            format!("in make_largest at {src}:{}", line_of(&fixture, "largest")),
        ),
    ] {
        let hex = format!("{addr:#x}");
        let out = mem_trace(&fixture, "mem-trace-why-live", &["why", &pid, &hex]);
        let lines: Vec<&str> = out.stdout.lines().map(str::trim).collect();
        assert_eq!(lines.first().copied(), Some(first.as_str()), "{}", out.stdout);
        assert!(
            lines.get(1).is_some_and(|l| l.ends_with(&frame)),
            "no `{frame}` as frame #0:\n{}",
            out.stdout
        );
    }
    drop(child.stdin.take());
    let status = child.wait().expect("wait");
    assert!(status.success(), "the program ended with {status}");
}

/// The profiler build's exit report: the in-process leak check (crates/core/src/profile/
/// leaks.rs) scans the process's own heap for tagged blocks and finds the leaked ones with
/// their stack (the fixture's run `exit-leaks`).
#[test]
fn the_exit_report_finds_leaked_tagged_blocks() {
    fixture_run(&fixture(), "exit-leaks").run();
}
