//! `print_trace` never hangs: a thread stopped by gdb may hold a lock the call needs, and with
//! scheduler-locking on it cannot run to release it, so a call that waited would hang gdb.
//! A thread stopped inside the tracer holding a lock, a call from gdb — from another thread or
//! from that very thread — must come back within 5 s with the block or with a
//! `mem-trace: ... busy` line. The scripts are in `tests/fixtures/locked.c`; their checks
//! prove the lock was held (the breakpoint hit), the calls came back in time, none was left
//! stopped or signalled, and the program still finished normally. This file checks what each
//! call printed, which may be one of several right answers.

mod common;

use common::{c_fixture, run_gdb_script, GdbRun};

/// What a call may print when it cannot take a lock: a busy line.
fn busy_line(text: &str) -> Option<&str> {
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with("mem-trace: ") && l.contains("busy"))
}

/// Either the block with its stack (symbolized, or raw `module+0xoffset` frames after a busy
/// line), or a busy line.
fn check_main_block(call: &str, answer: &str, report: &str) {
    let shows_block = answer.lines().any(|l| l.trim() == "Len: 4093");
    assert!(
        shows_block || busy_line(answer).is_some(),
        "`{call}` printed neither `Len: 4093` nor a `mem-trace: ... busy` line\n{report}"
    );
    if shows_block {
        let symbolized = answer
            .lines()
            .any(|l| l.trim().ends_with(": alloc_main_block"));
        let raw = busy_line(answer).is_some() && answer.contains("+0x");
        assert!(
            symbolized || raw,
            "`{call}` printed the block but neither its allocating function nor raw frames after a busy line\n{report}"
        );
    }
}

fn check(script: &str) {
    let run: GdbRun = run_gdb_script(&c_fixture("locked.c", &["-pthread"]), script);
    let report = run.report();
    // p_main: a live block whose shard is the one held (same 64 KiB region as the worker's
    // block; the fixture checks that), asked with the documented spelling and the C fallback.
    check_main_block(
        "call mem_trace::print_trace($main_block)",
        run.between("=== call\n", "=== predicted\n"),
        &report,
    );
    check_main_block(
        "call (void)print_trace(p_main)",
        run.between("=== fallback\n", "=== returned\n"),
        &report,
    );

    // predicted: the address of the block being inserted right now. Any of the three answers
    // is right (not yet published, busy, or the block); what matters is that one came back.
    let predicted_call = run.between("=== predicted\n", "=== fallback\n");
    assert!(
        predicted_call
            .lines()
            .any(|l| l.starts_with("PID: ") || l.starts_with("mem-trace: ")),
        "print_trace(predicted) printed nothing recognisable\n{report}"
    );
}

#[test]
fn shard_lock_held_by_another_thread() {
    check("insert-other");
}

#[test]
fn shard_lock_held_by_the_calling_thread() {
    check("insert-same");
}

#[test]
fn interner_lock_held_by_another_thread() {
    check("intern-other");
}

#[test]
fn interner_lock_held_by_the_calling_thread() {
    check("intern-same");
}
