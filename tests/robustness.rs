//! What real programs do, under the preload: contention, fork (with other threads allocating),
//! dlopen/dlclose, thread churn, allocation before and after `main`. Each program checks
//! itself and prints a deterministic summary that must equal the plain run's; what the
//! summary must say is the directive block at the top of each fixture (`stdout:` lines, and
//! `run-env` where a run needs one; see `tests/common/script.rs`).

mod common;

use common::{c_fixture, c_shared_library, fixture_run};

#[test]
fn eight_threads_of_mixed_malloc_realloc_free() {
    fixture_run(&c_fixture("stress.c", &["-pthread"]), "").run_same_as_plain();
}

#[test]
fn fork_children_allocate_free_and_exit_zero() {
    fixture_run(&c_fixture("fork.c", &["-pthread"]), "").run_same_as_plain();
}

#[test]
fn dlopen_and_dlclose_in_a_loop_while_allocating() {
    let lib = c_shared_library("dl_lib.c");
    let mut run = fixture_run(&c_fixture("dlopen_loop.c", &[]), "");
    run.job.args.push(lib.bin.display().to_string());
    run.run_same_as_plain();
}

#[test]
fn threads_created_and_joined_in_a_loop() {
    fixture_run(&c_fixture("threads_loop.c", &["-pthread"]), "").run_same_as_plain();
}

/// Waves of short-lived threads, each freeing the blocks a thread of the previous wave left:
/// with a 256 KiB quarantine, quarantines are orphaned and adopted with every wave.
#[test]
fn thread_waves_free_each_others_blocks() {
    fixture_run(&c_fixture("thread_waves.c", &["-pthread"]), "").run_same_as_plain();
}

#[test]
fn allocation_before_and_after_main() {
    fixture_run(&c_fixture("ctor_dtor.c", &[]), "").run_same_as_plain();
}
