//! What real programs do, under the preload: contention, fork (with other threads allocating),
//! dlopen/dlclose, thread churn, allocation before and after `main`. Each program checks
//! itself and prints a deterministic summary that must equal the plain run's.

mod common;

use common::{c_fixture, c_shared_library, Job};

fn line<'a>(stdout: &'a str, prefix: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with `{prefix}` in:\n{stdout}"))
}

#[test]
fn eight_threads_of_mixed_malloc_realloc_free() {
    let traced = Job::fixture(&c_fixture("stress.c", &["-pthread"])).assert_same_with_preload();
    assert_eq!(
        line(&traced.stdout, "stress: "),
        "stress: ok",
        "{}",
        traced.describe()
    );
    assert_eq!(
        traced
            .stdout
            .lines()
            .filter(|l| l.ends_with("corrupt 0"))
            .count(),
        8,
        "{}",
        traced.describe()
    );
}

#[test]
fn fork_children_allocate_free_and_exit_zero() {
    let traced = Job::fixture(&c_fixture("fork.c", &["-pthread"])).assert_same_with_preload();
    assert_eq!(
        line(&traced.stdout, "fork: "),
        "fork: 60 children, 0 bad",
        "{}",
        traced.describe()
    );
}

#[test]
fn dlopen_and_dlclose_in_a_loop_while_allocating() {
    let lib = c_shared_library("dl_lib.c");
    let mut job = Job::fixture(&c_fixture("dlopen_loop.c", &[]));
    job.args.push(lib.bin.display().to_string());
    let traced = job.assert_same_with_preload();
    assert!(
        line(&traced.stdout, "dlopen: ").starts_with("dlopen: 300 rounds, 300 blocks intact"),
        "{}",
        traced.describe()
    );
}

#[test]
fn threads_created_and_joined_in_a_loop() {
    let traced =
        Job::fixture(&c_fixture("threads_loop.c", &["-pthread"])).assert_same_with_preload();
    assert_eq!(
        line(&traced.stdout, "threads: "),
        "threads: 1600 joined, sum 1279200, 40 detached done",
        "{}",
        traced.describe()
    );
}

/// Waves of short-lived threads, each freeing the blocks a thread of the previous wave left:
/// with a 256 KiB quarantine, quarantines are orphaned and adopted with every wave.
#[test]
fn thread_waves_free_each_others_blocks() {
    let mut job = Job::fixture(&c_fixture("thread_waves.c", &["-pthread"]));
    job.env = vec![("MEM_TRACE_QUARANTINE".into(), "256K".into())];
    let traced = job.assert_same_with_preload();
    assert_eq!(
        line(&traced.stdout, "waves: "),
        "waves: bad 0",
        "{}",
        traced.describe()
    );
}

#[test]
fn allocation_before_and_after_main() {
    let traced = Job::fixture(&c_fixture("ctor_dtor.c", &[])).assert_same_with_preload();
    for expected in [
        "main sees early and constructor",
        "atexit 1 sees early",
        "atexit 2",
        "destructor",
    ] {
        assert!(
            traced.stdout.lines().any(|l| l == expected),
            "missing `{expected}`\n{}",
            traced.describe()
        );
    }
}
