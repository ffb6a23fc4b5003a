//! Under memory pressure the tracer keeps the program's semantics: programs that run out of
//! address space (each fixture sets its own `RLIMIT_AS`) exit as they do without it, their
//! mallocs return NULL no more often, and when the tracer's own memory runs out it stops
//! recording, says so on stderr once, and counts the blocks it no longer records
//! (`untracked`, in the statistics line and `mtrace-info`). Each fixture's directives say what
//! its stdout must be, plain and traced alike (see `tests/common/script.rs`).

mod common;

use common::mtrace::{gdb, with_entry_script};
use common::{c_fixture, fixture_run, Output};

/// The line the tracer writes when it degrades (`record::lifecycle`).
const DEGRADED: &str = "mem-trace: out of memory for the tracer's own tables: from now on new blocks are not recorded (counted as untracked), stacks are not captured and freed blocks are not held in quarantine";

/// How many times the degradation note is on stderr.
fn notes(out: &Output) -> usize {
    out.stderr.lines().filter(|l| *l == DEGRADED).count()
}

/// The note is written at most once, and exactly when blocks went unrecorded: a degraded
/// tracer says so, a tracer that said so counted what it missed.
fn assert_degraded_consistently(out: &Output) -> bool {
    let (notes, untracked) = (notes(out), out.stat("untracked"));
    assert!(
        notes <= 1,
        "the note is written {notes} times\n{}",
        out.describe()
    );
    assert_eq!(
        notes == 1,
        untracked > 0,
        "note {notes} times, {untracked} blocks untracked\n{}",
        out.describe()
    );
    notes == 1
}

/// A program fills the address space with blocks of one size, frees them and allocates as
/// many again: exit 0, one NULL and the second round whole, as without the tracer, whatever
/// the size (small blocks grow the tracer's table and quarantine queue the most; 200,000
/// bytes is past glibc's mmap threshold). With nothing left while the blocks are freed, the
/// quarantine's queue cannot grow: the tracer must degrade, and then not abort.
#[test]
fn filling_memory_then_freeing_and_refilling_exits_as_without_the_tracer() {
    fill_free_refill("", &[16, 100, 1000, 4000, 20_000, 200_000]);
}

/// Runs `oom_fill.c`'s script `script` for each block size: the tracer's memory runs out and
/// it degrades, consistently (the plain run is compared where the script runs the tracer).
fn fill_free_refill(script: &str, sizes: &[usize]) {
    let fixture = c_fixture("oom_fill.c", &[]);
    for size in sizes {
        let mut run = fixture_run(&fixture, script).labelled(&format!("oom_fill.{script}{size}"));
        run.job.args.push(size.to_string());
        let traced = match script {
            "" => run.run_same_as_plain(),
            _ => run.run(),
        };
        assert!(
            assert_degraded_consistently(&traced),
            "size {size}: the tracer's memory ran out, yet it did not degrade\n{}",
            traced.describe()
        );
    }
}

/// The profiler build under the same pressure: its per-stack counters and its report at exit
/// need memory too. It runs to the end as the plain program does, and degrades as the tracer
/// does.
#[test]
fn the_profiler_build_fills_memory_then_frees_and_refills_as_without_it() {
    fill_free_refill("profiler", &[16, 1000, 200_000]);
}

/// `MEM_TRACE_QUARANTINE=1G` under a limit: the quarantine holds freed blocks until glibc runs
/// out, then gives them all back and glibc is asked again. No NULL, as without the tracer
/// (before the quarantine gave way: 260,572 NULLs of 400,000 mallocs).
#[test]
fn a_quarantine_larger_than_memory_gives_way_when_glibc_runs_out() {
    let traced = fixture_run(&c_fixture("oom_quarantine.c", &[]), "").run_same_as_plain();
    assert_eq!(notes(&traced), 0, "{}", traced.describe());
}

/// A thread whose first allocation comes after memory ran out: its unwinder state cannot be
/// made, and the fallback allocated through Rust's global allocator, which aborted the
/// program. The tracer degrades instead, and the thread's blocks are counted untracked.
#[test]
fn a_thread_that_first_allocates_when_memory_is_gone_does_not_abort() {
    let traced =
        fixture_run(&c_fixture("oom_late_thread.c", &["-pthread"]), "").run_same_as_plain();
    assert!(
        assert_degraded_consistently(&traced),
        "no memory was left for the tracer, yet it did not degrade\n{}",
        traced.describe()
    );
    assert!(traced.stat("untracked") >= 1000, "{}", traced.describe());
}

/// mtrace-info shows the blocks a degraded tracer did not record.
#[test]
fn mtrace_info_counts_the_untracked_blocks() {
    gdb(
        &with_entry_script(c_fixture("oom_late_thread.c", &["-pthread"])),
        "info",
    );
}

/// Threads that never allocate get no glibc arena under the tracer (they did: 64 MiB of
/// address space each), and two threads allocating under a limit 16 MiB above the process's
/// size get no NULL, as without the tracer.
#[test]
fn threads_get_no_extra_arena_and_no_null_under_a_tight_limit() {
    let traced = fixture_run(&c_fixture("oom_threads.c", &["-pthread"]), "").run_same_as_plain();
    assert_eq!(notes(&traced), 0, "{}", traced.describe());
}

/// The same under sampling, where the hooks' entries pass most calls to glibc themselves:
/// a call made while the thread is busy in the tracer (a new thread's `pthread_getattr_np`)
/// must still be served by the tracer, not passed on (which gave the thread a glibc arena).
#[test]
fn threads_get_no_extra_arena_under_sampling() {
    let traced = fixture_run(&c_fixture("oom_threads.c", &["-pthread"]), "")
        .labelled("sampled")
        .with_env(&[("MEM_TRACE_SAMPLE", "512K")])
        .run_same_as_plain();
    assert_eq!(notes(&traced), 0, "{}", traced.describe());
}
