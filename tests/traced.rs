//! `mem_trace::Traced` in real Rust programs (tests/fixtures/traced_system and
//! traced_jemalloc, built here with cargo): `mtrace-why` and `print_trace` under real gdb, the
//! peaks as numbers across `reset_peaks`, the report on demand, and the `mem-trace` command
//! on the live process and its core. Each also as a statically linked musl binary, and under
//! the preload (the wrapper then hands its records to the preload's tables).

mod common;

use common::{
    manifest_dir, mem_trace_binary, profiler_library, run_with_timeout, target_dir, GDB_TIMEOUT,
    RUN_TIMEOUT,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The target of the statically linked builds.
const MUSL: &str = "x86_64-unknown-linux-musl";

/// How a fixture is built and run.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Built for the host, run as it is.
    Plain,
    /// Built for musl, statically linked.
    Static,
    /// Built for the host, run under `LD_PRELOAD` of the profiler build of the library.
    Preloaded,
}

/// Builds the fixture crate `name` (release, shared target dir) and returns its binary.
fn build(name: &str, mode: Mode) -> PathBuf {
    // The fixtures share a target directory: one cargo at a time.
    static LOCK: Mutex<()> = Mutex::new(());
    let _lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = target_dir().join("traced-fixtures");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--target-dir"])
        .arg(&dir)
        .current_dir(manifest_dir().join("tests/fixtures").join(name));
    if mode == Mode::Static {
        cmd.args(["--target", MUSL]);
    }
    std::fs::create_dir_all(&dir).unwrap();
    let out = run_with_timeout(
        cmd,
        &dir.join(format!("{name}.build")),
        false,
        None,
        RUN_TIMEOUT * 5,
        &format!("cargo build of {name}"),
    );
    assert!(
        out.success(),
        "{}{}",
        out.describe(),
        match mode {
            Mode::Static => format!("(the musl target: rustup target add {MUSL})\n"),
            _ => String::new(),
        }
    );
    let bin = match mode {
        Mode::Static => dir.join(MUSL).join("release").join(name),
        _ => dir.join("release").join(name),
    };
    if mode == Mode::Static {
        assert!(
            is_static(&bin),
            "{} has a program interpreter",
            bin.display()
        );
    }
    bin
}

/// Whether the ELF executable at `path` has no program interpreter (`PT_INTERP`): nothing is
/// loaded into it but itself, so `LD_PRELOAD` could not reach it.
fn is_static(path: &Path) -> bool {
    let elf = std::fs::read(path).unwrap();
    let word = |at: usize, n: usize| {
        let mut v = 0u64;
        for (i, b) in elf[at..at + n].iter().enumerate() {
            v |= u64::from(*b) << (8 * i);
        }
        v as usize
    };
    let (phoff, phentsize, phnum) = (word(0x20, 8), word(0x36, 2), word(0x38, 2));
    const PT_INTERP: usize = 3;
    (0..phnum).all(|i| word(phoff + i * phentsize, 4) != PT_INTERP)
}

/// Log files of the run `what` of `bin` in `mode`.
fn log(bin: &Path, what: &str, mode: Mode) -> PathBuf {
    let mode = match mode {
        Mode::Plain => "",
        Mode::Static => "-static",
        Mode::Preloaded => "-preloaded",
    };
    let name = bin.file_name().unwrap().to_string_lossy();
    bin.with_file_name(format!("{name}{mode}.{what}"))
}

fn run(bin: &Path, mode: Mode) -> common::Output {
    let mut cmd = Command::new(bin);
    match mode {
        Mode::Preloaded => cmd.env("LD_PRELOAD", profiler_library()),
        _ => cmd.env_remove("LD_PRELOAD"),
    };
    let out = run_with_timeout(cmd, &log(bin, "run", mode), false, None, RUN_TIMEOUT, "run");
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

fn peaks_and_report(name: &str, mode: Mode) {
    let bin = build(name, mode);
    let out = run(&bin, mode);
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
    // Live before phase 1: the 3 MiB block, the Vec and a few small ones, each counted once
    // (twice, under the preload, would be over 6 MiB).
    assert!(
        (3 << 20..(3 << 20) + (64 << 10)).contains(&before),
        "{line}"
    );
    // Phase 1 holds 8 MiB above what is live (3 MiB and change), phase 2 1 MiB.
    assert!(first >= (11 << 20) && first > before, "{line}");
    assert!(
        reset < before + (1 << 20),
        "the reset forgets phase 1: {line}"
    );
    // What `peaks()` itself allocated was live at the reset and is freed since: a few
    // hundred bytes.
    assert!(
        second >= reset + (1 << 20) - 4096 && second < reset + (2 << 20),
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

fn why_and_print_trace(name: &str, mode: Mode) {
    let bin = build(name, mode);
    let cli = mem_trace_binary();
    let core = log(&bin, "core", mode);
    let _ = std::fs::remove_file(&core);
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch"]);
    let preload = format!(
        "set environment LD_PRELOAD {}",
        profiler_library().display()
    );
    let mut script = vec![
        "set debuginfod enabled off".to_string(),
        "set startup-with-shell off".to_string(),
        format!("source {}/gdb/mem_trace.py", manifest_dir().display()),
    ];
    if mode == Mode::Preloaded {
        script.push(preload);
    }
    // The command reads the process gdb holds stopped, then gdb's core of it.
    let live = format!(
        "python gdb.execute('shell {} top %d 1 --frames 30' % gdb.selected_inferior().pid)",
        cli.display()
    );
    for c in [
        "break break_here",
        "run",
        "up",
        "echo === why\\n",
        "mtrace-why v.buf.inner.ptr.pointer.pointer + 24",
        "echo === print\\n",
        "call mem_trace::print_trace(v.buf.inner.ptr.pointer.pointer + 24)",
        "echo === info\\n",
        "mtrace-info",
        "echo === top\\n",
        "mtrace-top 1 -f 30",
        "echo === live\\n",
        &live,
        &format!("gcore {}", core.display()),
        "echo === core\\n",
        &format!(
            "shell {} top {} 1 --frames 30",
            cli.display(),
            core.display()
        ),
        "echo === core why\\n",
        "python v = int(gdb.parse_and_eval('v.buf.inner.ptr.pointer.pointer + 24'))",
        &format!(
            "python gdb.execute('shell {} why {} %d' % v)",
            cli.display(),
            core.display()
        ),
    ] {
        script.push(c.to_string());
    }
    for c in &script {
        cmd.args(["-ex", c]);
    }
    cmd.arg(&bin).env_remove("LD_PRELOAD");
    let out = run_with_timeout(cmd, &log(&bin, "gdb", mode), true, None, GDB_TIMEOUT, "gdb");
    let _ = std::fs::remove_file(&core);
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
    // gdb's ranking, the command's on the live process and on the core: the 3 MiB block of
    // `hold_big` on top, counted once.
    for (from, to) in [
        ("=== top", "=== live"),
        ("=== live", "=== core"),
        ("=== core", "=== core why"),
    ] {
        let part = text.split(from).nth(1).unwrap_or_default();
        let part = part.split(to).next().unwrap();
        assert!(
            part.contains("# 0: 3145728 bytes in 1 block"),
            "{from}:\n{}",
            out.describe()
        );
        assert!(
            part.lines()
                .any(|l| l.contains("traced_program::hold_big") && l.ends_with(".rs:20")),
            "{from}:\n{}",
            out.describe()
        );
    }
    let core_why = text.split("=== core why").nth(1).unwrap_or_default();
    assert!(
        core_why.contains("is 24 bytes inside a 2664-byte block")
            && core_why
                .lines()
                .any(|l| l.contains("traced_program::make_vec") && l.ends_with(".rs:13")),
        "{}",
        out.describe()
    );
}

#[test]
fn system_peaks_and_report() {
    peaks_and_report("traced_system", Mode::Plain);
}

#[test]
fn jemalloc_peaks_and_report() {
    peaks_and_report("traced_jemalloc", Mode::Plain);
}

#[test]
fn system_why_and_print_trace() {
    why_and_print_trace("traced_system", Mode::Plain);
}

#[test]
fn jemalloc_why_and_print_trace() {
    why_and_print_trace("traced_jemalloc", Mode::Plain);
}

#[test]
fn static_peaks_and_report() {
    peaks_and_report("traced_system", Mode::Static);
}

#[test]
fn static_why_and_print_trace() {
    why_and_print_trace("traced_system", Mode::Static);
}

/// Under the preload, `Traced<Jemalloc>` hands its blocks to the preload's tables (jemalloc
/// gets its memory from `mmap`, which the preload does not see), and the program's peaks,
/// reset and report answer from there.
#[test]
fn preloaded_jemalloc_peaks_and_report() {
    peaks_and_report("traced_jemalloc", Mode::Preloaded);
}

#[test]
fn preloaded_jemalloc_why_and_print_trace() {
    why_and_print_trace("traced_jemalloc", Mode::Preloaded);
}

/// Under the preload, `Traced<System>` records nothing itself: `System` calls `malloc`, which
/// the preload records. Each block once.
#[test]
fn preloaded_system_peaks_and_report() {
    peaks_and_report("traced_system", Mode::Preloaded);
}

#[test]
fn preloaded_system_why_and_print_trace() {
    why_and_print_trace("traced_system", Mode::Preloaded);
}
