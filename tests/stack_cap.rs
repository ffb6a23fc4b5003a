//! `MEM_TRACE_MAX_STACKS`: a program with thousands of distinct allocation stacks
//! (`tests/fixtures/stack_cap.c`) under a cap of 200 runs as it does plain, keeps the tracer's
//! stacks within the hard limit, and every block stays explained: whole stacks for blocks
//! whose stack was stored before the cap (or is one of those), the innermost frame and the cut
//! line for the others. Under real gdb (live, `print_trace`) and with the `mem-trace` command
//! on a core of the same process, whose answers must be gdb's line for line.

mod common;

use std::fs;

use common::mtrace::{comparable_with_gdb, gdb, with_entry_script};
use common::{c_fixture, fixture_run, mem_trace_run, Fixture, GdbRun};

/// The cap the scripts set, and the hard limit that follows from it (full stacks, then cut
/// ones: `cap + cap / 16 + 64`, crates/core/src/store/stacks.rs).
const CAP: u64 = 200;
const HARD: u64 = CAP + CAP / 16 + 64;
const CUT_LINE: &str = "(stack cut: the cap on distinct stacks, MEM_TRACE_MAX_STACKS, was reached)";

fn stack_cap() -> Fixture {
    with_entry_script(c_fixture("stack_cap.c", &[]))
}

#[test]
fn a_capped_run_is_the_plain_run_and_keeps_within_the_hard_limit() {
    let out = fixture_run(&stack_cap(), "run").run_same_as_plain();
    let stacks = out.stat("stacks");
    assert!(
        stacks > CAP && stacks <= HARD,
        "{stacks} stacks, expected more than {CAP} (the churn's cut stacks) and at most {HARD}\n{}",
        out.describe()
    );
    assert!(out.stat("cut_captures") > 0, "{}", out.describe());
}

/// The same program under the default cap stores every stack: the cap is what bounds them.
#[test]
fn the_default_cap_keeps_every_stack() {
    let out = fixture_run(&stack_cap(), "uncapped").run_same_as_plain();
    let stacks = out.stat("stacks");
    assert!(stacks > 1000, "{stacks} stacks\n{}", out.describe());
}

#[test]
fn a_bad_value_is_one_line_and_the_default() {
    fixture_run(&stack_cap(), "bad").run_same_as_plain();
}

/// Lines of the gdb output between `=== name` and the next marker.
fn section<'a>(run: &'a GdbRun, name: &str) -> Vec<&'a str> {
    let start = format!("=== {name}");
    let lines: Vec<&str> = run
        .output
        .lines()
        .skip_while(|l| l.trim() != start)
        .skip(1)
        .take_while(|l| !l.starts_with("=== "))
        .collect();
    assert!(!lines.is_empty(), "no `{start}` section\n{}", run.report());
    lines
}

/// `mem-trace ARGS` succeeded: its stdout.
fn mem_trace(fixture: &Fixture, label: &str, args: &[&str]) -> String {
    let out = mem_trace_run(fixture, label, args);
    assert!(out.success() && out.stderr.is_empty(), "{}", out.describe());
    out.stdout
}

#[test]
fn gdb_live_and_mem_trace_on_the_core_name_the_innermost_frame_and_the_cut() {
    let fixture = stack_cap();
    let core = fixture.dir.join("stack_cap.core");
    // A core left by an earlier run must not stand in for one this run failed to write.
    let _ = fs::remove_file(&core);
    let run = gdb(&fixture, "live");

    let distinct: u64 = section(&run, "info")
        .iter()
        .find_map(|l| l.trim().strip_prefix("distinct stacks:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no distinct stacks line\n{}", run.report()));
    assert!(
        distinct > CAP && distinct <= HARD,
        "{distinct} distinct stacks\n{}",
        run.report()
    );

    let addresses: Vec<String> = run
        .output
        .lines()
        .find_map(|l| l.trim().strip_prefix("=== addresses "))
        .unwrap_or_else(|| panic!("no addresses line\n{}", run.report()))
        .split_whitespace()
        .map(|a| format!("0x{a}"))
        .collect();
    let names = ["early", "known", "kept-first", "late", "kept-last"];
    assert_eq!(addresses.len(), names.len(), "{}", run.report());

    let src = fixture.src.to_str().expect("utf-8 path");
    let core_text = core.to_str().expect("utf-8 path");
    for (name, addr) in names.iter().zip(&addresses) {
        let ours = mem_trace(&fixture, name, &["why", core_text, addr]);
        let ours: Vec<String> = ours.lines().map(|l| comparable_with_gdb(l, src)).collect();
        let theirs: Vec<String> = section(&run, name)
            .into_iter()
            .map(|l| comparable_with_gdb(l, src))
            .collect();
        assert_eq!(
            ours,
            theirs,
            "`mem-trace why` on the core differs from mtrace-why live for {name}\n{}",
            run.report()
        );
        // Cut exactly when the stack was new past the cap; the innermost frame either way.
        let cut = ours.iter().any(|l| l.trim() == CUT_LINE);
        assert_eq!(
            cut,
            matches!(*name, "late" | "kept-last"),
            "{name}: {ours:#?}"
        );
        let innermost = match *name {
            "early" => "make_early",
            "known" => "make_known",
            "late" => "make_late",
            _ => "leaf",
        };
        assert!(
            ours.get(1)
                .is_some_and(|l| l.contains(&format!(" in {innermost} at {src}:"))),
            "{name}: {ours:#?}"
        );
        if cut {
            assert_eq!(ours.len(), 3, "{name}: one frame, then the cut: {ours:#?}");
        }
    }
}
