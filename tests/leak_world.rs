//! The exit report's leak check where only a scan of the whole stopped process is right
//! (tests/fixtures/leak_world.c): a lone leaked block of every small size, a thousand dropped
//! blocks, a pointer held only by a thread that never allocates, only in another thread's
//! register, only in the TLS of a thread still running its thread-specific-data destructors,
//! a thread allocating while `main` exits, and a pool in an anonymous mapping of the
//! program's. Each ends by `exit` and by a return from `main`.

mod common;

use common::leaks::{self, Classes};
use common::{c_fixture, gcore_at_exit_group, mem_trace_binary, run_with_timeout, Fixture};
use std::process::Command;
use std::time::Duration;

fn fixture() -> Fixture {
    c_fixture("leak_world.c", &["-pthread"])
}

/// The exit report's classes, and its `leak check:` lines, in `mode`.
fn exit_report(f: &Fixture, args: &[&str], mode: &str, run: usize) -> (Classes, String) {
    let label = format!("exit.{mode}.{}.{run}", args.join("."));
    leaks::exit_report(f, args, &[("MEM_TRACE_MODE", mode)], &label)
}

const ENDS: [&str; 2] = ["exit", "return"];

#[test]
fn a_lone_small_leak_is_lost_at_every_size() {
    let f = fixture();
    for (mode, largest) in [("profile", 64), ("debug", 40)] {
        for n in 1..=largest {
            let size = n.to_string();
            let end = ENDS[n as usize % 2];
            let (got, lines) = exit_report(&f, &["tiny", &size, end], mode, 0);
            assert_eq!(
                got,
                [(n, 1), (0, 0), (0, 0), (0, 0)],
                "{mode} mode, a lone {n}-byte leak ({end}): not definitely lost\n{lines}"
            );
        }
    }
}

#[test]
fn a_thousand_dropped_blocks_are_all_lost() {
    let f = fixture();
    for end in ENDS {
        let (got, lines) = exit_report(&f, &["trivial", end], "debug", 0);
        assert_eq!(got[0], (11000, 1000), "{end}\n{lines}");
        assert_eq!(got[3], (0, 0), "{end}\n{lines}");
    }
}

/// The 1337-byte block one other thread holds is reachable, and that thread was stopped.
fn held_by_another_thread(mode: &str) {
    let f = fixture();
    for end in ENDS {
        for run in 0..2 {
            let (got, lines) = exit_report(&f, &[mode, end], "profile", run);
            assert_eq!(
                (got[0], got[2]),
                ((0, 0), (0, 0)),
                "{mode} {end}: something lost\n{lines}"
            );
            assert!(got[3].0 >= 1337, "{mode} {end}\n{lines}");
            assert!(
                lines.contains("leak check: stopped 1 other thread for "),
                "{mode} {end}: the other thread was not stopped\n{lines}"
            );
        }
    }
}

#[test]
fn a_thread_that_never_allocated_is_a_root() {
    held_by_another_thread("quiet");
}

#[test]
fn another_threads_registers_are_roots() {
    held_by_another_thread("register");
}

#[test]
fn a_thread_in_its_second_round_of_tsd_destructors_is_a_root() {
    held_by_another_thread("tsd");
}

#[test]
fn a_thread_allocating_while_main_exits_loses_nothing_in_twenty_runs() {
    let f = fixture();
    for run in 0..20 {
        let end = ENDS[run % 2];
        let (got, lines) = exit_report(&f, &["busy", end], "profile", run);
        assert_eq!(
            (got[0], got[2]),
            ((0, 0), (0, 0)),
            "run {run} ({end}): blocks on a reachable list called lost\n{lines}"
        );
        assert!(lines.contains("stopped 1 other thread"), "{lines}");
    }
}

#[test]
fn a_pool_in_the_programs_own_mapping_keeps_its_blocks() {
    let f = fixture();
    for end in ENDS {
        for mode in ["profile", "debug"] {
            let (got, lines) = exit_report(&f, &["pool", end], mode, 0);
            assert_eq!(
                got,
                [(0, 0), (0, 0), (0, 0), (777, 1)],
                "{mode} {end}\n{lines}"
            );
        }
    }
}

/// Read from outside, from a core taken as the program exits: the pool's block is reached
/// through the program's own mapping, not "definitely lost", and the tracer's own memory
/// (whose tables hold every block's address) is not taken for the program's.
#[test]
fn a_pool_in_the_programs_own_mapping_keeps_its_blocks_read_from_a_core() {
    let f = fixture();
    let core = f.dir.join("pool.core");
    gcore_at_exit_group(&f, &["pool", "exit"], &core, &f.dir.join("pool.gcore-log"));
    let mut cmd = Command::new(mem_trace_binary());
    cmd.arg("leaks").arg(&core).args(["-n", "0", "-f", "2"]);
    let out = run_with_timeout(
        cmd,
        &f.dir.join("pool.leaks"),
        false,
        None,
        Duration::from_secs(60),
        "mem-trace leaks CORE",
    );
    assert!(out.success(), "{}", out.describe());
    let text = out.stdout;
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.contains(" program mapping")),
        "the program's mappings were not scanned\n{text}"
    );
    assert!(
        text.contains("still reachable: 777 bytes in 1 block, allocated from:"),
        "{text}"
    );
    assert!(
        text.contains("no block is definitely lost")
            || !text.contains("definitely lost: 777 bytes"),
        "{text}"
    );
}
