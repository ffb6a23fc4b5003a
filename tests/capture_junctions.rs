//! Captures that join an earlier walk after the stack changed under it
//! (`tests/fixtures/junctions.cpp`): after `longjmp`, after a C++ exception unwound through
//! many frames, in signal handlers on the thread's stack and on an alternate one, after
//! `swapcontext` to another stack and back, in forked children, and across `dlclose` and
//! `dlopen` of other code at the same address, and below outer frames that changed past the
//! frames a capture keeps. A capture taken over from stale frames of an
//! earlier walk records a stack the thread no longer has; these runs check every capture
//! (`MEM_TRACE_CHECK_STACKS=1`) against framehop's walk from a fresh cache, in both modes
//! (debug captures a stack at each free too, which changes what the next capture joins).

mod common;

use common::mtrace::{gdb, with_entry_script};
use common::{c_fixture, c_shared_library, cpp_fixture, fixture_run, Fixture, Output};

fn fixture() -> Fixture {
    cpp_fixture("junctions.cpp")
}

/// Asserts that every process of the run (a forked child prints its own line) checked
/// `at_least` stacks in all and found each identical to the reference; returns how many
/// processes reported.
fn assert_every_stack_identical(out: &Output, at_least: u64) -> usize {
    let mut total = 0;
    let mut processes = 0;
    for line in out.stderr.lines() {
        let Some(rest) = line.strip_prefix("mem-trace: stack check: ") else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        assert!(
            words.len() > 3 && words[1] == "of" && words[3] == "stacks",
            "a stack differs from the reference: {line}\n{}",
            out.describe()
        );
        let agreed: u64 = words[0].parse().expect("agreed count");
        let checked: u64 = words[2].parse().expect("checked count");
        assert_eq!(agreed, checked, "{line}\n{}", out.describe());
        total += checked;
        processes += 1;
    }
    assert!(
        total >= at_least,
        "{total} stacks checked, expected at least {at_least}\n{}",
        out.describe()
    );
    processes
}

/// The fixture's run `name` in both modes, plain and traced alike, every capture checked.
fn every_capture_matches(name: &str, extra_args: &[String], at_least: u64) -> Vec<Output> {
    ["debug", "profile"]
        .into_iter()
        .map(|mode| {
            let mut run = fixture_run(&fixture(), name)
                .labelled(&format!("{name}-{mode}"))
                .with_env(&[("MEM_TRACE_MODE", mode)]);
            run.job.args.extend(extra_args.iter().cloned());
            let out = run.run_same_as_plain();
            assert_every_stack_identical(&out, at_least);
            out
        })
        .collect()
}

#[test]
fn after_longjmp() {
    every_capture_matches("longjmp", &[], 20_000);
}

#[test]
fn after_an_exception_unwound_through_many_frames() {
    every_capture_matches("throw", &[], 20_000);
}

#[test]
fn in_a_signal_handler_on_the_threads_stack() {
    every_capture_matches("signal", &[], 20_000);
}

#[test]
fn in_a_signal_handler_on_an_alternate_stack() {
    every_capture_matches("altstack", &[], 20_000);
}

#[test]
fn after_swapcontext_to_another_stack_and_back() {
    every_capture_matches("swapcontext", &[], 20_000);
}

#[test]
fn in_forked_children() {
    for out in every_capture_matches("fork", &[], 10_000) {
        // The parent and each of its 20 children.
        assert_eq!(
            assert_every_stack_identical(&out, 0),
            21,
            "{}",
            out.describe()
        );
    }
}

/// Frames past the 64 a capture keeps change (another caller of a descent of 100 levels)
/// while the inner ones stay: a capture that takes the kept frames from the last walk must
/// not let its stale outer steps name a later, shallower stack.
#[test]
fn after_the_frames_past_those_kept_changed() {
    every_capture_matches("phantom", &[], 7_000);
}

#[test]
fn after_dlclose_and_dlopen_of_other_code_at_the_same_address() {
    let libs: Vec<String> = ["junction_lib_a.c", "junction_lib_b.c"]
        .into_iter()
        .map(|f| c_shared_library(f).bin.to_string_lossy().into_owned())
        .collect();
    for out in every_capture_matches("dlopen", &libs, 20_000) {
        // The scenario means something only if the libraries did share a base.
        let same: u32 = out
            .stderr
            .lines()
            .find_map(|l| l.strip_prefix("dlopen: the other library at the same base "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(
            same > 100,
            "the libraries rarely shared a base\n{}",
            out.describe()
        );
    }
}

#[test]
fn blocks_after_each_junction_name_the_frames_the_thread_has_then() {
    gdb(&with_entry_script(fixture()), "");
}

/// Stacks twice as deep as the frames kept, with 8 frames kept (`tests/fixtures/few_frames.c`):
/// a capture checks only the words that reach its 8 frames, so the last walk's outer steps go
/// stale when the next descent starts. Naming new steps under them made a call-tree node for
/// every pairing of an old descent's outer part with a new one's inner part: 109k nodes
/// against 54k with 128 frames kept, and 3x the time on the `deep` benchmark. A node is now
/// made only under steps the capture checked, so keeping fewer frames costs no more nodes.
#[test]
fn few_frames_kept_make_no_more_call_tree_nodes() {
    let fixture = c_fixture("few_frames.c", &[]);
    // Debug mode captures each free's stack too: twice the captures.
    for (mode, captures) in [("profile", 24_000), ("debug", 48_000)] {
        let nodes = |name: &str| {
            let run = fixture_run(&fixture, name).with_env(&[("MEM_TRACE_MODE", mode)]);
            let out = run.run_same_as_plain();
            assert_every_stack_identical(&out, captures);
            (out.stat("call_nodes"), out)
        };
        let (few, out) = nodes("few");
        let (all, _) = nodes("all");
        assert!(
            few <= all + all / 10,
            "{mode} mode: {few} call-tree nodes with 8 frames kept, {all} with 128\n{}",
            out.describe()
        );
    }
}
