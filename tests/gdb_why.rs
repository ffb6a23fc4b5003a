//! `mtrace-why` and `mtrace-info` under real gdb against the real `libmem_trace.so`:
//! live C and Rust programs, core files (gdb's `generate-core-file` and the kernel's own), a
//! stripped `.so`, auto-load from the `.so`'s `.debug_gdb_scripts`, and every error case.
//!
//! The gdb scripts and their expectations are the `gdb-command` / `gdb-check` comments in
//! `tests/fixtures/why_*.c` and in the `why` script of `tests/fixtures/rust_frames.rs`, with
//! line numbers taken from their `// @name` markers (see
//! `tests/common/script.rs`); this file says which script runs against what, prepares what a
//! script needs outside gdb (a core file, a stripped copy of the `.so`), and adds the checks a
//! line-by-line match cannot make (no traceback anywhere, values that must agree across lines).
//! Every failure prints the whole gdb output and the command that reruns it.

mod common;

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use common::mtrace::{gdb, with_entry_script};
use common::{c_fixture, library, run_with_timeout, rust_fixture, Fixture, GdbRun, RUN_TIMEOUT};

fn why_c() -> Fixture {
    with_entry_script(c_fixture("why_c.c", &[]))
}

/// Shared with tests/print_trace.rs, which runs its print-trace scripts.
fn rust_frames() -> Fixture {
    with_entry_script(rust_fixture("rust_frames.rs"))
}

fn why_many() -> Fixture {
    with_entry_script(c_fixture("why_many.c", &[]))
}

fn why_crash() -> Fixture {
    with_entry_script(c_fixture("why_crash.c", &[]))
}

/// The hex number after `prefix` on the first output line that has it.
fn hex_after(run: &GdbRun, prefix: &str) -> u64 {
    let text = run
        .output
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting with `{prefix}`\n{}", run.report()));
    let digits: String = text
        .trim_start_matches("0x")
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    u64::from_str_radix(&digits, 16)
        .unwrap_or_else(|e| panic!("`{prefix}{text}`: not hex ({e})\n{}", run.report()))
}

// ----------------------------------------------------------------------------- live C

/// Exact, interior, one-past-the-end and wild addresses; malloc, calloc, realloc and
/// posix_memalign blocks; `p`, `p + 37`, `&arr[3]`, `s->name + 5`, `$rdi`: each answer names
/// the allocating function and its file:line.
#[test]
fn c_every_expression_form_names_the_allocating_line() {
    let run = gdb(&why_c(), "");
    // The one-past-the-end answer's block ends exactly at the address asked about.
    let section = run.between("=== one-past-the-end", "=== wild");
    let first = section.lines().find(|l| l.contains(" is 0 bytes after "));
    let first = first.unwrap_or_else(|| panic!("no answer\n{}", run.report()));
    let addr = first.split_whitespace().next().unwrap();
    assert!(
        first.contains(&format!(", {addr})")),
        "the block should end at {addr}: {first}\n{}",
        run.report()
    );
}

/// A literal hex address, printed by the program itself, is the block it named.
#[test]
fn c_a_literal_address_from_the_programs_output() {
    let run = gdb(&why_c(), "literal");
    let printed = hex_after(&run, "=== literal ");
    let answer = run
        .output
        .lines()
        .find(|l| l.contains("is at the start of a 2048-byte block"))
        .unwrap_or_else(|| panic!("no answer\n{}", run.report()));
    assert!(
        answer.starts_with(&format!("{printed:#x} is at the start of")),
        "answer is not about the printed address {printed:#x}: {answer}\n{}",
        run.report()
    );
}

/// `mtrace-info` on a traced process: loaded, layout version, counts.
#[test]
fn c_info_on_a_traced_process() {
    let run = gdb(&why_c(), "info");
    let line = run
        .output
        .lines()
        .find_map(|l| l.trim().strip_prefix("live blocks:"))
        .unwrap_or_else(|| panic!("no live blocks line\n{}", run.report()));
    let blocks: u64 = line
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("live blocks not a number: {line}\n{}", run.report()));
    // The fixture holds 8 blocks at break_here (and stdio's buffer).
    assert!(blocks >= 8, "{blocks} live blocks\n{}", run.report());
}

/// No `source`: `add-auto-load-safe-path` lets gdb run the copy embedded in the `.so`.
#[test]
fn c_auto_load_from_the_library() {
    gdb(&why_c(), "autoload");
}

// ----------------------------------------------------------------------------- errors

#[test]
fn error_no_process_and_no_core() {
    gdb(&why_c(), "no-process");
}

/// `mtrace-why p` before `run`: `p` is a local, so gdb cannot evaluate it either; the line
/// should name the cause the user can act on (start the program or load a core).
#[test]
fn error_no_process_and_no_core_for_a_local() {
    gdb(&why_c(), "no-process-local");
}

#[test]
fn error_library_not_loaded() {
    gdb(&why_c(), "not-loaded");
}

#[test]
fn error_expression_gdb_cannot_evaluate() {
    gdb(&why_c(), "no-symbol");
}

#[test]
fn error_a_struct_is_not_an_address() {
    gdb(&why_c(), "struct");
}

#[test]
fn error_a_float_is_not_an_address() {
    gdb(&why_c(), "float");
}

#[test]
fn error_no_expression() {
    gdb(&why_c(), "no-argument");
}

/// `-n` means what it means in `mtrace-history` and the other commands: a negative count is
/// a usage error (it used to print no frames), and so is a negative `--gap`.
#[test]
fn error_negative_counts() {
    gdb(&why_c(), "negative-frames");
    gdb(&why_c(), "negative-gap");
}

#[test]
fn help_prints_usage() {
    gdb(&why_c(), "help");
}

/// A header from another build (version rewritten in the process): both versions named, the
/// reader's being the one the process had before the rewrite.
#[test]
fn error_layout_version_from_another_build() {
    let run = gdb(&why_c(), "version");
    let reader = run
        .output
        .lines()
        .find_map(|l| l.trim().strip_prefix("=== reader version "))
        .unwrap_or_else(|| panic!("no version line\n{}", run.report()))
        .to_string();
    let expected = format!("this gdb script reads version {reader}:");
    assert!(
        run.output.contains(&expected),
        "the reader should name version {reader}\n{}",
        run.report()
    );
}

#[test]
fn error_bad_magic() {
    gdb(&why_c(), "magic");
}

// ----------------------------------------------------------------------------- live Rust

/// From a Rust frame: a `Vec<u64>` through a raw-pointer local with pointer arithmetic and
/// through its field path, a `Box`, a `String`; Rust function paths and file:line.
#[test]
fn rust_vec_box_and_string_from_a_rust_frame() {
    gdb(&rust_frames(), "why");
}

// ----------------------------------------------------------------------------- cores

/// The first line of the answer after `=== marker`, up to " allocated by": address, offset,
/// size and bounds, which must be the same live and in the core of the same process.
fn answer_after(run: &GdbRun, marker: &str) -> String {
    let start = run
        .output
        .find(marker)
        .unwrap_or_else(|| panic!("no `{marker}` in gdb output\n{}", run.report()));
    let line = run.output[start..]
        .lines()
        .find(|l| l.contains(" allocated by "))
        .unwrap_or_else(|| panic!("no answer after `{marker}`\n{}", run.report()));
    line.split(" allocated by ")
        .next()
        .unwrap()
        .trim()
        .to_string()
}

/// Runs the script `live` (which writes `core_file` into the fixture's directory), then the
/// script `core` on it; the answers after their markers must agree.
fn live_then_core(
    fixture: &Fixture,
    (live, live_marker): (&str, &str),
    core: &str,
    core_file: &str,
) {
    // A core left by an earlier run must not stand in for one this run failed to write.
    let _ = fs::remove_file(fixture.dir.join(core_file));
    let live_run = gdb(fixture, live);
    let core_run = gdb(fixture, core);
    let (a, b) = (
        answer_after(&live_run, live_marker),
        answer_after(&core_run, &format!("=== {core}")),
    );
    assert_eq!(
        a,
        b,
        "live and core answers differ\n----- live -----\n{}\n----- core -----\n{}",
        live_run.report(),
        core_run.report()
    );
}

/// SIGSEGV under the preload: `mtrace-why localptr` in the crashing frame, live, then on the
/// core gdb writes of the same process (`generate-core-file`), with the same answer.
#[test]
fn crash_live_and_on_its_core() {
    live_then_core(
        &why_crash(),
        ("crash", "=== live"),
        "core",
        "why_crash.core",
    );
}

/// The same with `strip -o` applied to the `.so`: the dynamic symbol is enough.
#[test]
fn crash_live_and_on_its_core_with_a_stripped_library() {
    let fixture = why_crash();
    let dir = fixture.dir.join("stripped");
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let stripped = dir.join("libmem_trace.so");
    let mut cmd = Command::new("strip");
    cmd.arg("-o").arg(&stripped).arg(library());
    let out = run_with_timeout(cmd, &dir.join("strip"), true, None, RUN_TIMEOUT, "strip");
    assert!(out.success(), "strip failed\n{}", out.describe());
    live_then_core(
        &fixture,
        ("crash-stripped", "=== live-stripped"),
        "core-stripped",
        "why_crash.stripped.core",
    );
}

/// 200,000 live blocks: every shard's slot array has grown (and been replaced) many times;
/// the reader still finds a block in the middle, live and on the core.
#[test]
fn many_blocks_live_and_on_a_core() {
    live_then_core(&why_many(), ("live", "=== live"), "core", "why_many.core");
}

/// A block allocated 41 calls deep in a recursion: `mtrace-why` shows the recursion once and
/// counts the frames it repeats, as `mtrace-top` does within its 8 frames, live and on the
/// core; `mem-trace why` on that core gives the same stack, line for line.
#[test]
fn a_recursion_is_shown_once_then_counted() {
    let fixture = with_entry_script(c_fixture("why_recursion.c", &[]));
    let core = fixture.dir.join("why_recursion.core");
    let _ = fs::remove_file(&core);
    let live = gdb(&fixture, "live");
    gdb(&fixture, "core");
    let stack = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .skip_while(|l| !l.starts_with("#0 "))
            .take_while(|l| l.starts_with('#') || l.starts_with("... "))
            .map(String::from)
            .collect()
    };
    let after = |marker: &str| {
        let at = live
            .output
            .find(marker)
            .unwrap_or_else(|| panic!("no {marker}\n{}", live.report()));
        live.output[at..].to_string()
    };
    let gdb_stack = stack(&after("=== live"));
    // Five frames, the line for 37, then main and glibc's start: 41 frames in 10 lines.
    assert_eq!(gdb_stack.len(), 10, "{}", live.report());
    assert!(
        gdb_stack[5].starts_with("... 37 more frames of the same recursion (descend at "),
        "{}",
        live.report()
    );
    let probe = after("=== live")
        .lines()
        .find(|l| l.contains(" is at the start of a 100-byte block"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no answer\n{}", live.report()))
        .to_string();
    let mut cmd = Command::new(common::mem_trace_binary());
    cmd.arg("why").arg(&core).arg(&probe);
    let out = run_with_timeout(
        cmd,
        &fixture.dir.join("why_recursion.why"),
        false,
        None,
        RUN_TIMEOUT,
        "mem-trace why",
    );
    assert!(out.success(), "{}", out.describe());
    assert_eq!(stack(&out.stdout), gdb_stack, "{}", out.describe());
    let _ = fs::remove_file(&core);
}

/// Sampled, the same block answers with the same 41 frames, though its stack is kept by its
/// frames: sampling makes no call-tree node (captures too far apart to share walks made ~60
/// nodes per sampled stack on a deep workload).
#[test]
fn a_sampled_recursion_is_kept_by_its_frames_and_answers_the_same() {
    let fixture = with_entry_script(c_fixture("why_recursion.c", &[]));
    gdb(&fixture, "sampled");
}

/// What `/proc/sys/kernel/core_pattern` says, if it makes the kernel write a file named
/// `core` into the crashing process's working directory (the pattern this suite relies on).
fn kernel_writes_plain_core() -> Result<(), String> {
    let pattern = fs::read_to_string("/proc/sys/kernel/core_pattern")
        .map_err(|e| format!("cannot read /proc/sys/kernel/core_pattern: {e}"))?;
    let pattern = pattern.trim();
    let uses_pid = fs::read_to_string("/proc/sys/kernel/core_uses_pid").unwrap_or_default();
    if pattern != "core" || uses_pid.trim() != "0" {
        return Err(format!(
            "core_pattern is {pattern:?} (core_uses_pid {}), not a plain `core` file",
            uses_pid.trim()
        ));
    }
    Ok(())
}

/// A core dumped by the kernel (`ulimit -c unlimited`, the process run outside gdb).
///
/// Needs `core_pattern` = `core`. Where the kernel pipes cores to a handler (apport,
/// systemd-coredump) a test cannot get the file without changing the machine, so there it
/// checks only that the program dies of SIGSEGV under the preload, and says so on stderr.
#[test]
fn crash_on_a_kernel_core_dump() {
    let fixture = why_crash();
    let dir = fixture.dir.join("kernel");
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let core = dir.join("core");
    let _ = fs::remove_file(&core);
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "ulimit -c unlimited && exec \"$0\""])
        .arg(&fixture.bin)
        .env("LD_PRELOAD", library())
        .current_dir(&dir);
    let out = run_with_timeout(cmd, &dir.join("run"), false, None, RUN_TIMEOUT, "why_crash");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "why_crash should die of SIGSEGV\n{}",
        out.describe()
    );
    if let Err(why) = kernel_writes_plain_core() {
        eprintln!("crash_on_a_kernel_core_dump: kernel core not testable here: {why}");
        return;
    }
    assert!(
        out.status.core_dumped() && core.is_file(),
        "the kernel reported no core dump (core_dumped: {}) or {} is missing\n{}",
        out.status.core_dumped(),
        core.display(),
        out.describe()
    );
    gdb(&fixture, "kernel-core");
}
