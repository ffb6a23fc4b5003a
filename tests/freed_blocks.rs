//! Freed blocks against the real `libmem_trace.so` and real gdb: a dangling pointer explained
//! by the freed-block history, live and on a core file; the quarantine keeping freed memory
//! from reuse (and reuse when it is off); blocks freed by `realloc`; free stacks turned off;
//! double and invalid frees reported on stderr while the program goes on, or aborting with
//! `MEM_TRACE_ON_ERROR=abort`; a bad `MEM_TRACE_QUARANTINE`; a ring large enough to be indexed
//! by address, answered through its index by gdb and by the `mem-trace` command; frees still
//! in a thread's batch, and a thread's batch recorded at its exit.
//!
//! What runs and what it must print are the directive comments at the top of the fixtures
//! (see `tests/common/script.rs`): gdb scripts and direct runs in
//! `tests/fixtures/freed_dangling.c` and `tests/fixtures/freed_index.c`, direct runs (stderr
//! matched with `{line:NAME}` from the fixture's `// @NAME` markers, exit code, stdout) in
//! `tests/fixtures/freed_errors.c`. This
//! file says which script runs for what and adds the checks a line-by-line match cannot make
//! (values that must agree across lines, live and core answers that must be the same).
//! Every failure prints the whole output and the command that reruns it.

mod common;

use std::fs;
use std::process::Command;

use common::mtrace::{comparable_with_gdb, gdb, with_entry_script};
use common::{
    c_fixture, fixture_run, mem_trace_binary, run_with_timeout, Fixture, GdbRun, Output,
    RUN_TIMEOUT,
};

fn dangling() -> Fixture {
    with_entry_script(c_fixture("freed_dangling.c", &["-pthread"]))
}

fn errors() -> Fixture {
    c_fixture("freed_errors.c", &["-pthread"])
}

// ----------------------------------------------------------------------------- stderr reports

/// Whether a report line shows one of the tracer's own frames: a path in one of its crates
/// (`mem_trace::`, `mem_trace_core::`, ...) anywhere, or a frame line (`N: name`) naming
/// something of the tracer's, such as a raw `libmem_trace.so+0x...` frame.
fn shows_tracer_frame(line: &str) -> bool {
    let frame_name = line
        .trim()
        .split_once(": ")
        .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        .map(|(_, name)| name);
    line.contains("mem_trace::") || frame_name.is_some_and(|n| n.contains("mem_trace"))
}

/// Runs `freed_errors`'s direct run `name`: the fixture's directives check its exit code,
/// stdout and stderr. Then what holds for every bad free: one report, and no stack in it
/// showing the tracer's own frames (the tracer skips them when it captures a stack, so
/// frame 0 is the program's call into the allocator).
fn report(name: &str) -> Output {
    reports(name, 1)
}

/// [`report`] for a run that makes `count` bad calls.
fn reports(name: &str, count: usize) -> Output {
    let out = fixture_run(&errors(), name).run();
    let reports = out
        .stderr
        .lines()
        .filter(|l| {
            ["double free", "invalid free", "invalid realloc"]
                .iter()
                .any(|what| l.starts_with(&format!("mem-trace: {what} of ")))
        })
        .count();
    assert_eq!(
        reports,
        count,
        "expected {count} `mem-trace: double free of` or `mem-trace: invalid free of` lines\n{}",
        out.describe()
    );
    assert!(
        !out.stderr.lines().any(shows_tracer_frame),
        "a stack in the report shows the tracer's own frames\n{}",
        out.describe()
    );
    out
}

/// Without the tracer glibc itself kills the program at `mode`'s bad free (the fixture's
/// `glibc-<mode>` run says how).
fn glibc_kills(mode: &str) {
    fixture_run(&errors(), &format!("glibc-{mode}")).run();
}

/// The `#N` in the first `(#N)` of `line`.
fn seq_in(line: &str) -> u64 {
    let start = line.find("(#").map(|i| i + 2);
    start
        .and_then(|s| {
            let digits: String = line[s..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .unwrap_or_else(|| panic!("no (#N) in {line:?}"))
}

/// A double free: reported with this free's stack, the earlier free's stack and the
/// allocation stack, not passed to glibc, and the program goes on to exit 0.
#[test]
fn double_free_is_reported_with_both_free_stacks_and_the_program_goes_on() {
    glibc_kills("double");
    let out = report("double");

    // The address freed twice is the block's start, and the earlier free named in the first
    // line is the one whose stack follows.
    let line = |prefix: &str| {
        out.stderr
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line\n{}", out.describe()))
    };
    let first = line("mem-trace: double free of ");
    let addr = first
        .strip_prefix("mem-trace: double free of ")
        .and_then(|r| r.split(':').next())
        .unwrap();
    assert!(
        first.contains(&format!("block [{addr}, ")),
        "the block should start at the freed address {addr}: {first}\n{}",
        out.describe()
    );
    let freed_by = line("mem-trace: freed by thread");
    let allocated_by = line("mem-trace: previously allocated by");
    assert_eq!(
        seq_in(first),
        seq_in(freed_by),
        "the first line and the free stack name different frees\n{}",
        out.describe()
    );
    assert!(
        seq_in(allocated_by) < seq_in(freed_by),
        "the allocation should come before the free\n{}",
        out.describe()
    );
}

/// `MEM_TRACE_ON_ERROR=abort`: the same report, then one `aborting` line, then SIGABRT before
/// the program prints anything more.
#[test]
fn double_free_aborts_after_the_report_with_on_error_abort() {
    report("double-abort");
}

/// A double free found in the quarantine itself (the history is off, so nothing else knows
/// the block): once it has left the FIFO for the list it would be recycled from, and when the
/// thread that freed it has exited (its quarantine orphaned, still held).
#[test]
fn double_free_is_found_in_recycling_lists_and_in_an_exited_threads_quarantine() {
    report("double-recycled");
    report("double-thread");
}

/// `free(p + 16)` of a live 100-byte block: reported with the offset, this free's stack and the
/// block's allocation; the block itself stays live (main frees it properly afterwards, with
/// no second report).
#[test]
fn invalid_free_inside_a_block_is_reported_and_the_program_goes_on() {
    glibc_kills("interior");
    report("interior");
}

/// `free()` of a local array: reported as a stack address with this free's stack.
#[test]
fn invalid_free_of_a_stack_address_is_reported_and_the_program_goes_on() {
    glibc_kills("stack");
    report("stack");
}

/// The same from a new thread, and as the main thread's very first call into the allocator:
/// the report names the thread and shows its stack.
#[test]
fn invalid_free_as_a_threads_first_allocator_call_names_the_thread() {
    for mode in ["thread", "first"] {
        glibc_kills(mode);
        report(mode);
    }
}

/// `free(0x10)` and a wild pointer into unmapped memory, which glibc would crash on: reported
/// as wild pointers and kept from glibc; `realloc` of one returns null.
#[test]
fn wild_pointers_are_reported_not_passed_to_glibc() {
    glibc_kills("wild");
    reports("wild", 2);
    report("realloc-wild");
}

/// Pointers into memory glibc's heap has no block at: zeroed anonymous memory from `mmap`
/// (no chunk header), a file mapping, and just past the end of a live block, where the report
/// also names that block and its allocation stack, as ASan does.
#[test]
fn pointers_into_mappings_without_blocks_are_reported_with_the_nearest_block() {
    for mode in ["mmap", "file", "past-end"] {
        glibc_kills(mode);
        report(mode);
    }
}

// ----------------------------------------------------------------------------- gdb

/// The lines of `run`'s output from `=== start` up to (not including) `=== end`, trimmed.
fn section(run: &GdbRun, start: &str, end: &str) -> Vec<String> {
    run.between(&format!("=== {start}\n"), &format!("=== {end}\n"))
        .lines()
        .map(|l| l.trim().to_string())
        .collect()
}

/// At the stop, holding the dangling pointer: `mtrace-why` names the helper that freed it and
/// the function that allocated it, with their lines; `dangling + 16` is 16 bytes inside;
/// `mtrace-history` lists the free, then the allocation; the buffer `realloc` moved away from
/// is `freed (by realloc)` at the realloc call; a node another thread freed has that
/// thread's free stack. Then the same answers, line for line, from a
/// core file written at that stop, with no process.
#[test]
fn dangling_pointer_live_and_on_a_core() {
    let fixture = dangling();
    let (live, dead) = live_then_core(&fixture, "freed_dangling.core");
    for (start, end) in [
        ("dangling", "dangling+16"),
        ("dangling+16", "history"),
        ("history", "realloc"),
        ("realloc", "orphan"),
        ("orphan", "answers-end"),
    ] {
        same_live_and_core(&live, &dead, start, end);
    }
}

/// Runs `fixture`'s unnamed gdb script, which writes the core `core` (in the fixture's
/// directory) at its stop, then its script `core` on that core.
fn live_then_core(fixture: &Fixture, core: &str) -> (GdbRun, GdbRun) {
    // A core left by an earlier run must not stand in for one this run failed to write.
    let core = fixture.dir.join(core);
    let _ = fs::remove_file(&core);
    let live = gdb(fixture, "");
    assert!(
        core.is_file(),
        "no core at {}\n{}",
        core.display(),
        live.report()
    );
    (live, gdb(fixture, "core"))
}

/// The answer between `=== start` and `=== end`, the same live and on the core.
fn same_live_and_core(live: &GdbRun, dead: &GdbRun, start: &str, end: &str) -> Vec<String> {
    let (a, b) = (section(live, start, end), section(dead, start, end));
    assert!(
        a == b,
        "`=== {start}`: live and core answers differ\n----- live -----\n{}\n----- core -----\n{}",
        live.report(),
        dead.report()
    );
    b
}

/// Default quarantine: 2000 new blocks of the freed node's size, none at its address (the
/// program checks), and `mtrace-why` still explains the dangling pointer by the freed node.
#[test]
fn quarantine_keeps_the_dangling_pointer_in_its_freed_block() {
    let run = gdb(&dangling(), "quarantine");
    // The answer is the freed node and only that: no live block took its place.
    let answer = section(&run, "quarantine", "end");
    assert!(
        answer[0].contains(" freed by ") && !answer.iter().any(|l| l.contains("older freed")),
        "the answer should be the freed node alone\n{}",
        run.report()
    );
}

/// `MEM_TRACE_QUARANTINE=0`: the first new block of the node's size gets its address (the
/// program checks), and `mtrace-why` answers with that live block, allocated in refill, plus
/// the note that an older freed block covered the address; `mtrace-history` shows all three
/// events.
#[test]
fn without_quarantine_the_address_is_reused_by_a_live_block() {
    gdb(&dangling(), "no-quarantine");
}

/// `MEM_TRACE_FREE_STACKS=0`: the freed node is still explained (freeing thread, allocation
/// stack), and where the free stack would be, one line says none was recorded.
#[test]
fn without_free_stacks_the_freed_block_is_still_explained() {
    let run = gdb(&dangling(), "no-free-stacks");
    let answer = section(&run, "no-free-stacks", "end");
    assert!(
        !answer.iter().any(|l| l.contains("destroy_node")),
        "no free stack should be shown with MEM_TRACE_FREE_STACKS=0\n{}",
        run.report()
    );
}

/// Profile mode keeps no record of frees: `mtrace-why` and `print_trace` on the dangling
/// pointer say so and name `--mode debug` (the fixture's checks), rather than explaining a
/// neighbour.
#[test]
fn without_a_record_of_frees_the_answers_say_so() {
    let run = gdb(&dangling(), "profile");
    let answer = section(&run, "profile", "end");
    assert!(
        !answer.iter().any(|l| l.contains("destroy_node")),
        "no free can be named in profile mode\n{}",
        run.report()
    );
}

/// A ring of 2097152 records (`MEM_TRACE_FREED=2097152`), wrapped by 2.5 million frees of small
/// blocks whose addresses glibc hands out again and again, then blocks of 48 bytes, 5 KiB,
/// 200 KiB and 2 MiB (mmapped) freed: `mtrace-why` inside each names its free and allocation
/// (the fixture's checks), found through the ring's address index; the same answers from a
/// core written at that stop, and from the `mem-trace` command on that core. A second free of
/// the 48-byte block is reported with both stacks, which the tracer finds through the index.
#[test]
fn an_indexed_history_answers_live_on_a_core_and_from_the_command() {
    let fixture = with_entry_script(c_fixture("freed_index.c", &[]));
    let (live, dead) = live_then_core(&fixture, "freed_index.core");
    let src = fixture.src.to_str().expect("utf-8 path");
    let core = fixture.dir.join("freed_index.core");
    let core_path = core.to_str().expect("utf-8 path");
    for (start, end, command) in [
        ("small", "page", "why"),
        ("page", "medium", "why"),
        ("medium", "large", "why"),
        ("large", "history", "why"),
        ("history", "answers-end", "history"),
    ] {
        let b = same_live_and_core(&live, &dead, start, end);
        // The address the answer is about, as gdb evaluated it: its first word (`mtrace-why`),
        // or the first word before `:` (`mtrace-history`).
        let address = b[0]
            .split([' ', ':'])
            .next()
            .expect("a first word")
            .to_string();
        let mut cmd = Command::new(mem_trace_binary());
        cmd.args([command, core_path, &address])
            .current_dir(&fixture.dir);
        let label = format!("mem-trace-{start}");
        let out = run_with_timeout(
            cmd,
            &fixture.dir.join(&label),
            false,
            None,
            RUN_TIMEOUT,
            &label,
        );
        assert!(out.success(), "{}", out.describe());
        let ours: Vec<String> = out
            .stdout
            .lines()
            .map(|l| comparable_with_gdb(l.trim(), src))
            .collect();
        let theirs: Vec<String> = b.iter().map(|l| comparable_with_gdb(l, src)).collect();
        assert_eq!(
            ours,
            theirs,
            "`mem-trace {command} {address}` on the core differs from gdb's answer\n{}",
            dead.report()
        );
    }
    fixture_run(&fixture, "double").run();
}

// ----------------------------------------------------------------------------- batches

/// Debug mode records and holds a run of frees of small blocks in batches
/// (`record::deferred`). At a stop after a thread that freed three blocks in a row exited,
/// the two frees of its batch are in the history (recorded at its exit, their tags erased)
/// and its three chunks held (432 bytes); main's last free, still in its batch, is explained
/// from the block's freed tag alone. The same answers from a core written at the stop. A
/// second free of that block while the first is in the batch is reported with the first
/// free's stack, and glibc never sees it.
#[test]
fn frees_still_in_a_batch_are_answered_and_a_threads_batch_is_recorded_at_its_exit() {
    let fixture = with_entry_script(c_fixture("freed_batches.c", &["-pthread"]));
    let (live, dead) = live_then_core(&fixture, "freed_batches.core");
    for (start, end) in [("thread", "own"), ("own", "answers-end")] {
        same_live_and_core(&live, &dead, start, end);
    }
    fixture_run(&fixture, "double").run();
}

// ----------------------------------------------------------------------------- configuration

/// `MEM_TRACE_QUARANTINE=lots`: one stderr line naming the variable and the value, and the
/// program runs as with the default (so the quarantine is on: no reuse).
#[test]
fn bad_quarantine_value_is_one_line_and_the_default_is_used() {
    let fixture = dangling();
    fixture_run(&fixture, "default").run();
    fixture_run(&fixture, "bad-quarantine").run();
}

/// One rule for every value: a sign is refused like any bad value, `1T` is a size, and an
/// empty value is an unset variable (no line on stderr).
#[test]
fn values_follow_one_rule() {
    let fixture = dangling();
    fixture_run(&fixture, "signed").run();
    fixture_run(&fixture, "terabyte").run();
}
