//! The fast walk (rule cache, take-overs, kept walks, the call tree) against framehop's walk
//! from a fresh cache, on real programs with deep and varied stacks: the benchmark's `deep`
//! workload (C, 40-80 frames, loops of short calls at the bottom), python3 running the
//! benchmark's `py_records.py` and its Rust workload. `MEM_TRACE_CHECK_STACKS=1` makes the
//! preload walk every capture again with the reference and compare it with the stack id the
//! capture was interned as, allocations and frees alike: every one must agree. The unit tests
//! in `capture/tests/accuracy.rs` do the same for the test binary's own frames, and
//! `capture_junctions.rs` for stacks changed under the walk (longjmp, exceptions, signals,
//! swapcontext, fork, dlopen).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{manifest_dir, target_dir, Job, Output};

fn work_dir() -> PathBuf {
    let dir = target_dir().join("mem-trace-tests").join("stack-accuracy");
    std::fs::create_dir_all(&dir).expect("create the work directory");
    dir
}

/// Builds `bench/workloads/deep.c` as the benchmark does (no frame pointers).
fn deep_binary() -> PathBuf {
    let bin = work_dir().join("deep");
    let src = manifest_dir().join("bench/workloads/deep.c");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run gcc");
    assert!(status.success(), "gcc {} failed", src.display());
    bin
}

/// Builds `bench/workloads/rust_alloc` with `System` (no dependency: rustc alone), optimised
/// as the benchmark builds it.
fn rust_binary() -> PathBuf {
    let bin = work_dir().join("rust_alloc");
    let src = manifest_dir().join("bench/workloads/rust_alloc/src/main.rs");
    let status = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .args(["-O", "-g", "--edition", "2021", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run rustc");
    assert!(status.success(), "rustc {} failed", src.display());
    bin
}

/// `(agreed, checked)` from the preload's check line.
fn check_line(out: &Output) -> (u64, u64) {
    let line = out
        .stderr
        .lines()
        .find(|l| l.starts_with("mem-trace: stack check: ") && l.contains(" identical"))
        .unwrap_or_else(|| panic!("no stack check line\n{}", out.describe()));
    let words: Vec<&str> = line.split_whitespace().collect();
    let agreed = words[3].parse().expect("agreed count");
    let checked = words[5].parse().expect("checked count");
    (agreed, checked)
}

/// Runs `job` plain and traced with every stack checked; asserts the same output and at
/// least `min_checked` checks, every one identical.
fn assert_stacks_agree(mut job: Job, min_checked: u64) {
    job.env.push(("MEM_TRACE_CHECK_STACKS".into(), "1".into()));
    job.log_dir = Some(work_dir());
    let traced = job.assert_same_with_preload();
    let (agreed, checked) = check_line(&traced);
    eprintln!("{}: {agreed} of {checked} stacks identical", job.label);
    assert!(
        checked >= min_checked,
        "only {checked} stacks checked\n{}",
        traced.describe()
    );
    assert_eq!(
        agreed,
        checked,
        "{agreed} of {checked} stacks identical\n{}",
        traced.describe()
    );
}

#[test]
fn deep_c_stacks_match_the_reference() {
    let mut job = Job::new(deep_binary(), "deep");
    job.args = vec!["4000".into()];
    // ~390k captures (allocations and frees).
    assert_stacks_agree(job, 300_000);
}

#[test]
fn python_stacks_match_the_reference() {
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.exists(),
        "/usr/bin/python3 is needed (.ci/run installs it)"
    );
    let mut job = Job::new(python, "python3-records");
    job.args = vec![
        manifest_dir()
            .join("bench/workloads/py_records.py")
            .to_string_lossy()
            .into_owned(),
        "300".into(),
    ];
    // Every object through malloc, so that the interpreter's own stacks are captured.
    job.env.push(("PYTHONMALLOC".into(), "malloc".into()));
    // ~140k captures.
    assert_stacks_agree(job, 100_000);
}

#[test]
fn rust_stacks_match_the_reference() {
    let mut job = Job::new(rust_binary(), "rust_alloc");
    job.args = vec!["1".into()];
    // ~230k captures.
    assert_stacks_agree(job, 150_000);
}
