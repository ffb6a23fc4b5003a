//! `mem_trace::Traced` in real Rust programs (tests/fixtures/traced_system and
//! traced_jemalloc, built here with cargo): `mtrace-why` and `print_trace` under real gdb, the
//! peaks as numbers across `reset_peaks`, and the report on demand.

mod common;

use common::{manifest_dir, run_with_timeout, target_dir, GDB_TIMEOUT, RUN_TIMEOUT};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// Builds the fixture crate `name` (release, shared target dir) and returns its binary.
fn build(name: &str) -> PathBuf {
    // The two fixtures share a target directory: one cargo at a time.
    static LOCK: Mutex<()> = Mutex::new(());
    let _lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = target_dir().join("traced-fixtures");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--target-dir"])
        .arg(&dir)
        .current_dir(manifest_dir().join("tests/fixtures").join(name));
    std::fs::create_dir_all(&dir).unwrap();
    let out = run_with_timeout(
        cmd,
        &dir.join(format!("{name}.build")),
        false,
        None,
        RUN_TIMEOUT * 5,
        &format!("cargo build of {name}"),
    );
    assert!(out.success(), "{}", out.describe());
    dir.join("release").join(name)
}

fn run(bin: &PathBuf, name: &str) -> common::Output {
    let out = run_with_timeout(
        Command::new(bin),
        &bin.with_file_name(format!("{name}.run")),
        false,
        None,
        RUN_TIMEOUT,
        name,
    );
    assert!(out.success(), "{}", out.describe());
    out
}

/// The number after `word ` in `line`.
fn number(line: &str, word: &str) -> u64 {
    let mut words = line.split_whitespace();
    words.find(|w| *w == word);
    words
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {word:?} in {line:?}"))
}

fn peaks_and_report(name: &str) {
    let bin = build(name);
    let out = run(&bin, name);
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("peaks "))
        .unwrap_or_else(|| panic!("no peaks line\n{}", out.describe()));
    let (before, first, reset, second, live) = (
        number(line, "before"),
        number(line, "first"),
        number(line, "reset"),
        number(line, "second"),
        number(line, "live"),
    );
    // Phase 1 holds 8 MiB above what is live (3 MiB and change), phase 2 1 MiB.
    assert!(first >= (11 << 20) && first > before, "{line}");
    assert!(
        reset < before + (1 << 20),
        "the reset forgets phase 1: {line}"
    );
    assert!(
        second >= reset + (1 << 20) && second < reset + (2 << 20),
        "{line}"
    );
    assert!(
        live < second && live >= 3 << 20,
        "phase 2 freed its block: {line}"
    );
    // The report on demand ranks the 3 MiB block first, made in hold_big.
    let report = &out.stderr;
    assert!(
        report.contains("mem-trace: report 1 (requested)"),
        "{report}"
    );
    let top = report
        .split("# 0: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no top stack\n{report}"));
    assert!(top.starts_with("3145728 bytes in 1 block"), "{report}");
    assert!(
        top.contains("traced_program::hold_big") && top.contains("traced_program.rs:20"),
        "{report}"
    );
}

fn why_and_print_trace(name: &str) {
    let bin = build(name);
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch"]);
    for c in [
        "set debuginfod enabled off",
        &format!("source {}/gdb/mem_trace.py", manifest_dir().display()),
        "break break_here",
        "run",
        "up",
        "echo === why\\n",
        "mtrace-why v.buf.inner.ptr.pointer.pointer + 24",
        "echo === print\\n",
        "call mem_trace::print_trace(v.buf.inner.ptr.pointer.pointer + 24)",
        "echo === info\\n",
        "mtrace-info",
    ] {
        cmd.args(["-ex", c]);
    }
    cmd.arg(&bin).env_remove("LD_PRELOAD");
    let out = run_with_timeout(
        cmd,
        &bin.with_file_name(format!("{name}.gdb")),
        true,
        None,
        GDB_TIMEOUT,
        "gdb",
    );
    let text = &out.stdout;
    let why = text.split("=== why").nth(1).unwrap_or(text);
    let why = why.split("=== print").next().unwrap();
    assert!(
        why.contains("is 24 bytes inside a 2664-byte block"),
        "{}",
        out.describe()
    );
    assert!(
        why.lines().any(|l| l.contains("in ")
            && l.contains("traced_program::make_vec at ")
            && l.ends_with("traced_program.rs:13")),
        "{}",
        out.describe()
    );
    // The stack starts at the program's call into the allocator: none of the wrapper's
    // frames (read where `__rust_alloc` calls it), no `__rust_alloc`.
    let first = why
        .lines()
        .find(|l| l.trim_start().starts_with("#0 "))
        .unwrap_or_else(|| panic!("no frames\n{}", out.describe()));
    assert!(
        first.contains(" alloc::alloc::alloc "),
        "{}",
        out.describe()
    );
    for own in ["mem_trace::", "mem_trace_core::", "__rust_alloc"] {
        assert!(!text.contains(own), "{own} in\n{}", out.describe());
    }
    let print = text.split("=== print").nth(1).unwrap_or(text);
    assert!(print.contains("Len: 2664"), "{}", out.describe());
    assert!(
        print.contains("traced_program::make_vec"),
        "{}",
        out.describe()
    );
    assert!(!text.contains("Traceback"), "{}", out.describe());
}

#[test]
fn system_peaks_and_report() {
    peaks_and_report("traced_system");
}

#[test]
fn jemalloc_peaks_and_report() {
    peaks_and_report("traced_jemalloc");
}

#[test]
fn system_why_and_print_trace() {
    why_and_print_trace("traced_system");
}

#[test]
fn jemalloc_why_and_print_trace() {
    why_and_print_trace("traced_jemalloc");
}
