//! What the traced program wrote is escaped wherever it is printed: a thread named with a
//! newline, an escape sequence, a carriage return and a double quote
//! (`tests/fixtures/hostile_names.c`) reaches no terminal raw — not through `mtrace-why` and
//! `mtrace-history` (live and on a core), nor the `mem-trace` command, nor the profiler's exit
//! report. The fixture's directives check each answer's escaped line; this file adds the
//! check no line match can make: no control character but the newline in any output.

mod common;

use std::fs;
use std::process::Command;

use common::mtrace::{gdb, with_entry_script};
use common::{c_fixture, fixture_run, mem_trace_binary, run_with_timeout, Fixture, RUN_TIMEOUT};

fn fixture() -> Fixture {
    with_entry_script(c_fixture("hostile_names.c", &["-pthread"]))
}

/// Panics when `text` holds a control character other than a line break or a tab (gdb's own
/// warnings indent with tabs; the thread's name carries ESC and CR), naming where.
fn assert_no_control(text: &str, what: &str) {
    if let Some((at, c)) = text
        .char_indices()
        .find(|&(_, c)| c.is_control() && c != '\n' && c != '\t')
    {
        let line = text[..at].lines().count();
        panic!("{what}: raw {c:?} on line {line}\n{text}");
    }
}

#[test]
fn thread_names_are_escaped_live_on_a_core_and_in_the_command() {
    let fixture = fixture();
    let core = fixture.dir.join("hostile_names.core");
    let _ = fs::remove_file(&core);
    let live = gdb(&fixture, "");
    assert_no_control(&live.output, "gdb, live");
    assert!(core.is_file(), "no core\n{}", live.report());
    let dead = gdb(&fixture, "core");
    assert_no_control(&dead.output, "gdb, core");

    // The command, on the same core: the block's address from gdb's answer.
    let addr = live
        .output
        .lines()
        .find(|l| l.contains("is at the start of a 64-byte block"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no answer for `named`\n{}", live.report()))
        .to_string();
    let mut cmd = Command::new(mem_trace_binary());
    cmd.arg("why").arg(&core).arg(&addr);
    let out = run_with_timeout(
        cmd,
        &fixture.dir.join("hostile_names.why"),
        false,
        None,
        RUN_TIMEOUT,
        "mem-trace why",
    );
    assert!(out.success(), "{}", out.describe());
    assert_no_control(&out.stdout, "mem-trace why");
    assert!(
        out.stdout.contains(r#""x\n\x1b[31m\"RED\r""#),
        "{}",
        out.describe()
    );
    let _ = fs::remove_file(&core);
}

#[test]
fn thread_names_are_escaped_in_the_profiler_report() {
    let out = fixture_run(&fixture(), "report").run();
    assert_no_control(&out.stderr, "the exit report");
}
