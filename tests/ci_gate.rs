//! What makes a CI job fail: `mem-trace run --error-exitcode N [--fail-on leaks|possibly]`
//! ends with N when any process of the run had a double or invalid free or (with `--fail-on`)
//! lost memory, and passes the program's own status on otherwise; a program preloaded by hand
//! ends with `MEM_TRACE_ERROR_EXITCODE` itself, its buffered output intact
//! (tests/fixtures/ci_gate.c).

mod common;

use common::{c_fixture, library, mem_trace_run, run_with_timeout, Fixture, Output};
use std::process::Command;
use std::time::Duration;

fn fixture() -> Fixture {
    c_fixture("ci_gate.c", &[])
}

/// `mem-trace run -o out-LABEL OPTIONS -- ci_gate MODE STATUS`.
fn run(f: &Fixture, label: &str, options: &[&str], mode: &str, status: &str) -> Output {
    let out = format!("out-{label}");
    let _ = std::fs::remove_dir_all(f.dir.join(&out));
    let bin = f.bin.to_str().unwrap();
    let mut args = vec!["run", "-o", &out];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--", bin, mode, status]);
    mem_trace_run(f, label, &args)
}

#[test]
fn run_fails_on_leaks_when_asked_and_passes_the_program_status_otherwise() {
    let f = fixture();
    let gate = ["--error-exitcode", "3", "--fail-on", "leaks"];
    let leaky = run(&f, "leak", &gate, "leak", "0");
    assert_eq!(leaky.status.code(), Some(3), "{}", leaky.describe());
    assert_eq!(leaky.stdout, "done\n");
    assert!(
        leaky.stderr.contains(
            "mem-trace: run: exit status 3 (--error-exitcode): 1 process failed\n\
             mem-trace:   process "
        ) && leaky
            .stderr
            .contains("(ci_gate leak 0): 300 bytes definitely lost in 2 blocks\n"),
        "{}",
        leaky.describe()
    );
    // Clean: the program's own status, and nothing said.
    let clean = run(&f, "clean", &gate, "clean", "7");
    assert_eq!(clean.status.code(), Some(7), "{}", clean.describe());
    assert!(
        !clean.stderr.contains("--error-exitcode"),
        "{}",
        clean.describe()
    );
    // Leaks fail the run only when asked.
    let unasked = run(&f, "leak-unasked", &["--error-exitcode", "3"], "leak", "0");
    assert_eq!(unasked.status.code(), Some(0), "{}", unasked.describe());
    // Possibly lost fails only `--fail-on possibly`.
    let possibly = run(&f, "possibly-leaks", &gate, "possibly", "0");
    assert_eq!(possibly.status.code(), Some(0), "{}", possibly.describe());
    let gate = ["--error-exitcode", "3", "--fail-on", "possibly"];
    let possibly = run(&f, "possibly", &gate, "possibly", "0");
    assert_eq!(possibly.status.code(), Some(3), "{}", possibly.describe());
    assert!(
        possibly
            .stderr
            .contains(": 4000 bytes possibly lost in 1 block\n"),
        "{}",
        possibly.describe()
    );
}

#[test]
fn run_fails_on_a_bad_free_and_on_a_child_that_leaks() {
    let f = fixture();
    let bad = run(
        &f,
        "double-free",
        &["--error-exitcode", "3"],
        "double-free",
        "0",
    );
    assert_eq!(bad.status.code(), Some(3), "{}", bad.describe());
    assert!(
        bad.stderr
            .contains("(ci_gate double-free 0): 1 double or invalid free\n"),
        "{}",
        bad.describe()
    );
    // The child failed the run; the program, its parent, went on as it would.
    let gate = ["--error-exitcode", "3", "--fail-on", "leaks"];
    let child = run(&f, "child-leak", &gate, "child-leak", "0");
    assert_eq!(child.status.code(), Some(3), "{}", child.describe());
    assert_eq!(child.stdout, "done\n");
    assert!(
        child
            .stderr
            .contains(": 300 bytes definitely lost in 2 blocks\n"),
        "{}",
        child.describe()
    );
}

#[test]
fn fail_on_without_an_exit_code_is_refused() {
    let f = fixture();
    let out = run(&f, "refused", &["--fail-on", "leaks"], "leak", "0");
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains("--error-exitcode"),
        "{}",
        out.describe()
    );
}

/// The fixture preloaded by hand with `env`, stdout a pipe (fully buffered).
fn preloaded(f: &Fixture, label: &str, mode: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(&f.bin);
    cmd.args([mode, "7"])
        .env("LD_PRELOAD", library())
        .env_remove("MEM_TRACE_PROFILE")
        .env_remove("MEM_TRACE_OUT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_with_timeout(
        cmd,
        &f.dir.join(label),
        false,
        None,
        Duration::from_secs(60),
        "ci_gate",
    )
}

#[test]
fn a_preloaded_program_ends_with_the_error_exit_code_its_output_kept() {
    let f = fixture();
    let gate = [
        ("MEM_TRACE_ERROR_EXITCODE", "5"),
        ("MEM_TRACE_FAIL_ON", "leaks"),
    ];
    let leaky = preloaded(&f, "preloaded-leak", "leak", &gate);
    assert_eq!(leaky.status.code(), Some(5), "{}", leaky.describe());
    assert_eq!(leaky.stdout, "done\n", "{}", leaky.describe());
    // The leak check ran though reports are off, and says what failed the process.
    assert!(
        leaky.stderr.contains("lose_site")
            && leaky.stderr.contains(
                "mem-trace: exit status 5 (MEM_TRACE_ERROR_EXITCODE): 300 bytes definitely lost in 2 blocks\n"
            ),
        "{}",
        leaky.describe()
    );
    let bad = preloaded(&f, "preloaded-double-free", "double-free", &gate[..1]);
    assert_eq!(bad.status.code(), Some(5), "{}", bad.describe());
    assert!(
        bad.stderr.contains(
            "mem-trace: exit status 5 (MEM_TRACE_ERROR_EXITCODE): 1 double or invalid free\n"
        ),
        "{}",
        bad.describe()
    );
    let clean = preloaded(&f, "preloaded-clean", "clean", &gate);
    assert_eq!(clean.status.code(), Some(7), "{}", clean.describe());
    assert_eq!(clean.stdout, "done\n");
    // A bad value is named, with what it falls back to, and the program runs as ever.
    let bad_value = preloaded(
        &f,
        "preloaded-bad",
        "leak",
        &[("MEM_TRACE_ERROR_EXITCODE", "300")],
    );
    assert_eq!(bad_value.status.code(), Some(7), "{}", bad_value.describe());
    assert!(
        bad_value.stderr.contains("MEM_TRACE_ERROR_EXITCODE"),
        "{}",
        bad_value.describe()
    );
}
