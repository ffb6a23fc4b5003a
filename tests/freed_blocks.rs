//! Freed blocks against the real `libmem_trace.so` and real gdb (issue 5): a dangling pointer
//! explained by the freed-block history, live and on a core file; the quarantine keeping freed
//! memory from reuse (and reuse when it is off); blocks freed by `realloc`; free stacks turned
//! off; double and invalid frees reported on stderr while the program goes on, or aborting
//! with `MEM_TRACE_ON_ERROR=abort`; a bad `MEM_TRACE_QUARANTINE`.
//!
//! The gdb scripts and their expectations are the `gdb-command` / `gdb-check` comments in
//! `tests/fixtures/freed_dangling.c`. The double and invalid frees need no gdb: the program
//! runs plainly and its stderr is matched here, in order, against lines written the same way
//! (`[...]` wildcard, `{src}`, `{line:NAME}` for the fixture line marked `// @NAME`), so the
//! expected line numbers follow `tests/fixtures/freed_errors.c` when it is edited.
//! Every failure prints the whole output and the command that reruns it.

mod common;

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use common::mtrace::{gdb, with_entry_script};
use common::script::{self, Directive, Substitutions};
use common::{c_fixture, library, run_with_timeout, Fixture, GdbRun, Job, Output, RUN_TIMEOUT};

fn dangling() -> Fixture {
    with_entry_script(c_fixture("freed_dangling.c", &["-pthread"]))
}

fn errors() -> Fixture {
    c_fixture("freed_errors.c", &["-pthread"])
}

// ----------------------------------------------------------------------------- stderr checks

/// Matches `checks` in order against `text` (the harness's rules: each check a later line
/// than the previous one, `[...]` a wildcard), after expanding `{src}` and `{line:NAME}`
/// from `fixture`. Panics with the first missing check and the whole run.
fn assert_lines(fixture: &Fixture, out: &Output, text: &str, checks: &[&str]) {
    let source_text = fs::read_to_string(&fixture.src).expect("read fixture");
    let source = script::parse(&fixture.src, &source_text).unwrap_or_else(|e| panic!("{e}"));
    let subs = Substitutions {
        so: library().display().to_string(),
        src: fixture.src.display().to_string(),
        dir: fixture.dir.display().to_string(),
        bin: fixture.bin.display().to_string(),
    };
    let expanded: Vec<String> = checks
        .iter()
        .map(|c| {
            let d = Directive {
                line: 0,
                keyword: "stderr-check",
                text: c.to_string(),
            };
            source
                .substitute(&d, &subs)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    if let Err(m) = script::match_checks(text, &expanded) {
        let previous = match m.check {
            0 => String::new(),
            i => format!(
                "    (previous check matched line {}: {})\n",
                m.after_line,
                expanded[i - 1]
            ),
        };
        let numbered: String = text
            .lines()
            .enumerate()
            .map(|(i, l)| format!("{:4} | {l}\n", i + 1))
            .collect();
        panic!(
            "check not found after line {}:\n    check:    {}\n    expanded: {}\n{previous}----- the text searched, numbered -----\n{numbered}----- the whole run -----\n{}",
            m.after_line,
            checks[m.check],
            expanded[m.check],
            out.describe()
        );
    }
}

/// The `mem-trace:` lines of stderr that start one of the reports (not the stack lines).
fn report_lines<'a>(out: &'a Output, kind: &str) -> Vec<&'a str> {
    out.stderr
        .lines()
        .filter(|l| l.starts_with(&format!("mem-trace: {kind} of ")))
        .collect()
}

/// `freed_errors <mode>` with the tracer preloaded and `env`; the working directory is the
/// fixture's and core dumps are off, so an abort leaves no `core` file anywhere.
fn run_errors(mode: &str, env: &[(&str, &str)]) -> Output {
    let fixture = errors();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "ulimit -c 0 && exec \"$0\" \"$@\""])
        .arg(&fixture.bin)
        .arg(mode)
        .current_dir(&fixture.dir)
        .env("LD_PRELOAD", library());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let label = if env.is_empty() {
        mode.to_string()
    } else {
        format!("{mode}.env")
    };
    let out = run_with_timeout(
        cmd,
        &fixture.dir.join(label),
        false,
        None,
        RUN_TIMEOUT,
        &format!("freed_errors {mode}"),
    );
    assert!(
        !out.stderr.contains("cannot be preloaded"),
        "the tracer was not preloaded\n{}",
        out.describe()
    );
    out
}

/// Without the tracer glibc itself kills the program at `mode`'s bad free: what the tracer
/// turns into a report is a real error, not something glibc would let pass. (An abort from
/// its checks, or, when the bad free is the process's first call into the allocator, a crash
/// on the uninitialised thread cache, depending on what the stack held.)
fn assert_glibc_aborts(mode: &str) {
    let fixture = errors();
    let mut job = Job::fixture(&fixture);
    job.args = vec![mode.to_string()];
    job.label = format!("glibc-{mode}");
    let plain = job.run(false);
    let killed = match mode {
        "first" => [libc::SIGABRT, libc::SIGSEGV].as_slice(),
        _ => [libc::SIGABRT].as_slice(),
    };
    assert!(
        plain.status.signal().is_some_and(|s| killed.contains(&s)),
        "without the tracer, glibc should kill the program at the bad free of `{mode}`\n{}",
        plain.describe()
    );
}

/// Exit 0, `before` and `after` the bad free on stdout, exactly one report of `kind`.
fn assert_reported_and_continued(mode: &str, kind: &str, out: &Output) {
    assert!(
        out.success(),
        "the program should go on after the {kind} and exit 0\n{}",
        out.describe()
    );
    assert_eq!(
        out.stdout,
        format!("before {mode}\nafter {mode}\n"),
        "stdout\n{}",
        out.describe()
    );
    assert!(
        !out.stderr.contains("mem_trace::"),
        "a stack in the report shows the tracer's own frames (DESIGN.md fact 6)\n{}",
        out.describe()
    );
    let reports = report_lines(out, kind);
    assert_eq!(
        reports.len(),
        1,
        "expected one `mem-trace: {kind} of` line\n{}",
        out.describe()
    );
}

/// The checks of a double free's report: this free, the earlier free, the allocation, each
/// stack naming the function and fixture line.
const DOUBLE_FREE_REPORT: &[&str] = &[
    "mem-trace: double free of 0x[...]: a 48-byte block [0x[...], 0x[...]) already freed by thread 1 (#[...])",
    "mem-trace: this free (thread 1):",
    "0: release",
    "at {src}:{line:release}:[...]",
    "1: main",
    "at {src}:{line:second-free}:[...]",
    "mem-trace: freed by thread 1 (#[...]) here:",
    "0: release",
    "at {src}:{line:release}:[...]",
    "1: main",
    "at {src}:{line:first-free}:[...]",
    "mem-trace: previously allocated by thread 1 (#[...]) here:",
    "0: make_obj",
    "at {src}:{line:make}:[...]",
    "1: main",
    "at {src}:{line:make-call}:[...]",
];

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
    assert_glibc_aborts("double");
    let fixture = errors();
    let out = run_errors("double", &[]);
    assert_reported_and_continued("double", "double free", &out);
    assert_lines(&fixture, &out, &out.stderr, DOUBLE_FREE_REPORT);

    // The address freed twice is the block's start, and the earlier free named in the first
    // line is the one whose stack follows.
    let first = report_lines(&out, "double free")[0];
    let addr = first
        .strip_prefix("mem-trace: double free of ")
        .and_then(|r| r.split(':').next())
        .unwrap();
    assert!(
        first.contains(&format!("block [{addr}, ")),
        "the block should start at the freed address {addr}: {first}\n{}",
        out.describe()
    );
    let freed_by = out
        .stderr
        .lines()
        .find(|l| l.starts_with("mem-trace: freed by thread"))
        .unwrap();
    let allocated_by = out
        .stderr
        .lines()
        .find(|l| l.starts_with("mem-trace: previously allocated by"))
        .unwrap();
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
    let fixture = errors();
    let out = run_errors("double", &[("MEM_TRACE_ON_ERROR", "abort")]);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "MEM_TRACE_ON_ERROR=abort should kill the program with SIGABRT\n{}",
        out.describe()
    );
    assert_eq!(
        out.stdout,
        "before double\n",
        "nothing after the double free should run\n{}",
        out.describe()
    );
    let mut checks = DOUBLE_FREE_REPORT.to_vec();
    checks.push("mem-trace: aborting (MEM_TRACE_ON_ERROR=abort)");
    assert_lines(&fixture, &out, &out.stderr, &checks);
    assert_eq!(
        out.stderr.lines().last(),
        Some("mem-trace: aborting (MEM_TRACE_ON_ERROR=abort)"),
        "the aborting line should be the last thing on stderr\n{}",
        out.describe()
    );
}

/// A double free found in the quarantine itself (the history is off, so nothing else knows
/// the block): once it has left the FIFO for the list it would be recycled from, and when the
/// thread that freed it has exited (its quarantine orphaned, still held).
#[test]
fn double_free_is_found_in_recycling_lists_and_in_an_exited_threads_quarantine() {
    let fixture = errors();
    for (mode, quarantine, call) in [
        ("double-recycled", "64K", "recycled-second-free"),
        ("double-thread", "4M", "thread-second-free"),
    ] {
        let out = run_errors(
            mode,
            &[
                ("MEM_TRACE_FREED", "0"),
                ("MEM_TRACE_QUARANTINE", quarantine),
            ],
        );
        assert_reported_and_continued(mode, "double free", &out);
        let call = format!("at {{src}}:{{line:{call}}}:[...]");
        assert_lines(
            &fixture,
            &out,
            &out.stderr,
            &[
                "mem-trace: double free of 0x[...]: the block is already freed (held in quarantine; MEM_TRACE_FREED=0 keeps no history)",
                "mem-trace: this free (thread 1):",
                "0: release",
                "at {src}:{line:release}:[...]",
                "1: main",
                &call,
            ],
        );
    }
}

/// `free(p + 16)` of a live 100-byte block: reported with the offset, this free's stack and the
/// block's allocation; the block itself stays live (main frees it properly afterwards, with
/// no second report).
#[test]
fn invalid_free_inside_a_block_is_reported_and_the_program_goes_on() {
    assert_glibc_aborts("interior");
    let fixture = errors();
    let out = run_errors("interior", &[]);
    assert_reported_and_continued("interior", "invalid free", &out);
    assert_lines(
        &fixture,
        &out,
        &out.stderr,
        &[
            "mem-trace: invalid free of 0x[...]: it is 16 bytes inside a 100-byte block [0x[...], 0x[...]) allocated by thread 1 (#[...]), not its start",
            "mem-trace: this free (thread 1):",
            "0: free_inside",
            "at {src}:{line:free-inside}:[...]",
            "1: main",
            "at {src}:{line:interior-call}:[...]",
            "mem-trace: the block was allocated by thread 1 (#[...]) here:",
            "0: main",
            "at {src}:{line:interior-alloc}:[...]",
        ],
    );
    assert!(
        !out.stderr.contains("double free"),
        "the proper free after the invalid one is not a double free\n{}",
        out.describe()
    );
}

/// `free()` of a local array: reported as a stack address with this free's stack.
#[test]
fn invalid_free_of_a_stack_address_is_reported_and_the_program_goes_on() {
    assert_glibc_aborts("stack");
    let fixture = errors();
    let out = run_errors("stack", &[]);
    assert_reported_and_continued("stack", "invalid free", &out);
    assert_lines(
        &fixture,
        &out,
        &out.stderr,
        &[
            "mem-trace: invalid free of 0x7[...]: it points into this thread's stack",
            "mem-trace: this free (thread 1):",
            "0: free_local",
            "at {src}:{line:free-local}:[...]",
            "1: main",
            "at {src}:{line:stack-call}:[...]",
        ],
    );
}

/// The same from a new thread, and as the main thread's very first call into the allocator:
/// the report names the thread (registered before reporting, which also takes the main
/// thread's stack bounds, without which the address would not be known as a stack address)
/// and shows its stack.
#[test]
fn invalid_free_as_a_threads_first_allocator_call_names_the_thread() {
    let fixture = errors();
    for (mode, thread, caller, call) in [
        ("thread", 2, "thread_main", "thread-call"),
        ("first", 1, "main", "first-call"),
    ] {
        assert_glibc_aborts(mode);
        let out = run_errors(mode, &[]);
        assert_reported_and_continued(mode, "invalid free", &out);
        let this = format!("mem-trace: this free (thread {thread}):");
        let caller = format!("1: {caller}");
        let call = format!("at {{src}}:{{line:{call}}}:[...]");
        assert_lines(
            &fixture,
            &out,
            &out.stderr,
            &[
                "mem-trace: invalid free of 0x7[...]: it points into this thread's stack",
                &this,
                "0: free_local",
                "at {src}:{line:free-local}:[...]",
                &caller,
                &call,
            ],
        );
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
    // A core left by an earlier run must not stand in for one this run failed to write.
    let core = fixture.dir.join("freed_dangling.core");
    let _ = fs::remove_file(&core);
    let live = gdb(&fixture, "");
    assert!(
        core.is_file(),
        "no core at {}\n{}",
        core.display(),
        live.report()
    );
    let dead = gdb(&fixture, "core");
    for (start, end) in [
        ("dangling", "dangling+16"),
        ("dangling+16", "history"),
        ("history", "realloc"),
        ("realloc", "orphan"),
        ("orphan", "answers-end"),
    ] {
        let (a, b) = (section(&live, start, end), section(&dead, start, end));
        assert!(
            a == b,
            "`=== {start}`: live and core answers differ\n----- live -----\n{}\n----- core -----\n{}",
            live.report(),
            dead.report()
        );
    }
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

// ----------------------------------------------------------------------------- configuration

/// `MEM_TRACE_QUARANTINE=lots`: one stderr line naming the variable and the value, and the
/// program runs as with the default (so the quarantine is on: no reuse).
#[test]
fn bad_quarantine_value_is_one_line_and_the_default_is_used() {
    let fixture = dangling();
    let mut job = Job::fixture(&fixture);
    job.label = "default".into();
    let default = job.run(true);
    assert!(default.success(), "{}", default.describe());
    assert!(
        default.stderr.is_empty(),
        "a clean run should print nothing on stderr\n{}",
        default.describe()
    );
    assert_eq!(
        default.stdout,
        "realloc moved the buffer\nnone of the 2000 new blocks has the dangling address\ndone\n",
        "{}",
        default.describe()
    );

    job.label = "bad-quarantine".into();
    job.env = vec![("MEM_TRACE_QUARANTINE".into(), "lots".into())];
    let bad = job.run(true);
    assert!(bad.success(), "{}", bad.describe());
    assert_eq!(
        bad.stdout,
        default.stdout,
        "a bad value should leave the default in force\n{}",
        bad.describe()
    );
    let lines: Vec<&str> = bad.stderr.lines().collect();
    assert!(
        lines.len() == 1
            && lines[0].starts_with("mem-trace: ")
            && lines[0].contains("MEM_TRACE_QUARANTINE")
            && lines[0].contains("lots"),
        "expected one `mem-trace: ` line naming MEM_TRACE_QUARANTINE and `lots`\n{}",
        bad.describe()
    );
}
