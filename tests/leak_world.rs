//! The exit report's leak check where only a scan of the whole stopped process is right
//! (tests/fixtures/leak_world.c): a lone leaked block of every small size, a thousand dropped
//! blocks, a pointer held only by a thread that never allocates, only in another thread's
//! register, only in the TLS of a thread still running its thread-specific-data destructors,
//! a thread allocating while `main` exits, and a pool in an anonymous mapping of the
//! program's. Each ends by `exit` and by a return from `main`.

mod common;

use common::leaks::{self, Classes};
use common::{c_fixture, Fixture};

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
