//! `mtrace-top`, `mtrace-peaks` and `mtrace-leaks` under real gdb against the profiler build
//! of `libmem_trace.so` (`{profiler_so}`) and the plain one (`{so}`): the reference program
//! `tests/fixtures/profile_sites.c`, whose sites hold, churn, leak and keep known bytes, live
//! and from a core of the same process, and `mtrace-leaks`'s classes against the in-process
//! leak check of the same program; its `phases` mode (a peak reset); Rust frames; every
//! error case.
//!
//! The gdb scripts and their line-by-line expectations are the `gdb-command[NAME]` /
//! `gdb-check[NAME]` comments in the fixtures (see `tests/common/script.rs`); this file adds
//! the checks a line match cannot make: numbers within 1%, sections that must not name a
//! site, and live and core answers that must be the same.

mod common;

use std::fs;

use common::mtrace::{gdb, with_entry_script};
use common::{c_fixture, fixture_run, rust_fixture, Fixture, GdbRun};

fn profile_sites() -> Fixture {
    with_entry_script(c_fixture("profile_sites.c", &[]))
}

/// The number after `prefix` on the first line (trimmed) that starts with it.
fn number_after(text: &str, prefix: &str, run: &GdbRun) -> u64 {
    let rest = text
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting with `{prefix}`\n{}", run.report()));
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse()
        .unwrap_or_else(|e| panic!("`{prefix}{rest}`: not a number ({e})\n{}", run.report()))
}

fn assert_within_1_percent(got: u64, want: u64, what: &str, run: &GdbRun) {
    let diff = got.abs_diff(want) as f64;
    assert!(
        diff <= want as f64 / 100.0,
        "{what}: {got}, expected {want} within 1%\n{}",
        run.report()
    );
}

const MIB: u64 = 1 << 20;
/// profile_sites.c's global peak: the hold (64 MiB), its pointer array (128 KiB) and the
/// thread's 8 MiB, plus leak's and kept's bytes as its comment counts them (the thread runs
/// before those sites, so the measured peak is ~0.2% lower; the 1% margin covers both).
const GLOBAL_PEAK: u64 = 64 * MIB + 128 * 1024 + 8 * MIB + 100 * 1000 + 10 * 5000;

/// The numbers of the first line (trimmed) that starts with `prefix`, in order.
fn numbers_on(text: &str, prefix: &str, report: &dyn Fn() -> String) -> Vec<u64> {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with `{prefix}`\n{}", report()));
    line.split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().expect("digits"))
        .collect()
}

/// The sections of the answers, `=== top` to `=== end`, as both scripts print them.
fn answers(run: &GdbRun) -> &str {
    run.between("=== top", "=== end")
}

/// Live at `break_here`: hold_site is `# 0` by live bytes (64 MiB in 16384 blocks), churn_site
/// by bytes allocated (2 GiB) and absent from the live ranking; the global peak and the
/// thread's; leak_site's blocks definitely lost, kept and hold reachable. Then the same
/// commands on a core of that process must print the same answers, and the program's own
/// leak check at exit (the `leaks` run of profile_sites.c) the same bytes and blocks in each
/// class as `mtrace-leaks`'s SUMMARY: both classify as memcheck does, with the same rules.
#[test]
fn sites_live_and_on_their_core() {
    let fixture = profile_sites();
    let core = fixture.dir.join("profile_sites.core");
    // A core left by an earlier run must not stand in for one this run failed to write.
    let _ = fs::remove_file(&core);
    let live = gdb(&fixture, "live");

    let top = live.between("=== top", "=== allocated");
    assert!(
        !top.contains("churn_site"),
        "churn_site holds nothing live but is ranked by live bytes\n{}",
        live.report()
    );
    let peaks = live.between("=== peaks", "=== leaks");
    let peak = number_after(peaks, "peak: ", &live);
    assert_within_1_percent(peak, GLOBAL_PEAK, "global peak", &live);
    let thread = peaks
        .lines()
        .find(|l| l.trim().starts_with("thread 2,"))
        .unwrap_or_else(|| panic!("no line for thread 2\n{}", live.report()));
    let thread_peak = number_after(thread.split(", peak ").nth(1).unwrap_or(""), "", &live);
    assert_within_1_percent(thread_peak, 8 * MIB, "the thread's peak", &live);
    assert_eq!(thread_peak, 8 * MIB, "the thread's peak\n{}", live.report());
    let leaks = live.between("=== leaks", "=== end");
    for reachable in ["kept_site", "hold_site", "hold_array_site"] {
        let lost = leaks.split("still reachable:").next().unwrap_or_default();
        assert!(
            !lost.contains(reachable),
            "{reachable} reported lost\n{}",
            live.report()
        );
    }

    let from_core = gdb(&fixture, "core");
    assert_eq!(
        answers(&live),
        answers(&from_core),
        "live and core answers differ\n----- live -----\n{}\n----- core -----\n{}",
        live.report(),
        from_core.report()
    );

    // Definitely lost (all, direct, indirect), possibly lost, still reachable: bytes and
    // blocks of each, in that order on both lines.
    let from_gdb = numbers_on(leaks, "SUMMARY: ", &|| live.report());
    let exit = fixture_run(&fixture, "leaks").run();
    let in_process = numbers_on(&exit.stderr, "mem-trace: leak check: ", &|| exit.describe());
    assert_eq!(from_gdb.len(), 10, "{}", live.report());
    assert_eq!(
        from_gdb,
        in_process,
        "mtrace-leaks and the exit report's leak check classify differently\n----- gdb -----\n{}\n----- exit report -----\n{}",
        live.report(),
        exit.describe()
    );
}

/// `phases`: after `mem_trace_reset_peaks()`, the peak is phase 2's (~8 MiB), not phase 1's
/// 32 MiB.
#[test]
fn phases_peak_is_the_last_phase() {
    let run = gdb(&profile_sites(), "phases");
    let peaks = run.between("=== peaks", "=== end");
    let peak = number_after(peaks, "peak: ", &run);
    // Phase 2: 8 MiB in 4 KiB blocks plus their pointer array (16 KiB) and stdio's buffer.
    assert_within_1_percent(peak, 8 * MIB + 16 * 1024, "phase 2's peak", &run);
}

/// Rust frames: paths such as `rust_frames::make_vec` with file:line, from the profiler's
/// counters.
#[test]
fn rust_frames_in_the_ranking() {
    gdb(&with_entry_script(rust_fixture("rust_frames.rs")), "top");
}

#[test]
fn error_bad_count() {
    gdb(&profile_sites(), "bad-count");
}

#[test]
fn error_bad_by() {
    gdb(&profile_sites(), "bad-by");
}

#[test]
fn error_thread_with_by_allocated() {
    gdb(&profile_sites(), "thread-allocated");
}

#[test]
fn error_no_such_thread() {
    gdb(&profile_sites(), "no-thread");
}

/// Under the default build, which writes no report unless asked: mtrace-top and
/// mtrace-peaks answer from the counters it keeps anyway, as mtrace-leaks does.
#[test]
fn default_build_keeps_the_counters() {
    gdb(&profile_sites(), "default-build");
}

#[test]
fn error_library_not_loaded() {
    gdb(&profile_sites(), "not-loaded");
}
