//! Sampling by bytes (`MEM_TRACE_SAMPLE`): the estimates of every big site are within 10% of
//! the truth, runs with one seed give the same estimates, an unsampled block says so in every
//! reader, and bad values are one line each.
//!
//! The program is `tests/fixtures/sample_sites.c`: 64 MB live in 64-byte blocks, 100 MB in
//! 1000-byte blocks, 20 MB in 40,000-byte blocks, and 64 MB of 32-byte blocks allocated and
//! freed at once.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use common::{
    c_fixture, fixture_run, mem_trace_within, profiler_library, run_with_timeout, spawn_fixture,
    waiting_fixture, Fixture,
};

const SAMPLE: &str = "64K";
const SEED: &str = "42";

struct Sites {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
    small: Vec<u64>,
}

impl Sites {
    fn start(fixture: &Fixture, env: &[(&str, &str)]) -> Sites {
        let mut cmd = waiting_fixture(fixture, profiler_library());
        cmd.env("MEM_TRACE_MODE", "profile")
            .envs(env.iter().copied())
            // Where print_trace, called in the process, writes.
            .stderr(std::fs::File::create(fixture.dir.join("sites.stderr")).unwrap());
        let mut child = spawn_fixture(&mut cmd, fixture);
        let stdin = child.stdin.take().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let mut words = line.split_whitespace().skip(1);
        let pid = words
            .next()
            .and_then(|w| w.strip_prefix("pid="))
            .unwrap()
            .parse()
            .unwrap();
        let small = words
            .next()
            .and_then(|w| w.strip_prefix("small="))
            .unwrap()
            .split(',')
            .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap())
            .collect();
        Sites {
            child,
            stdin: Some(stdin),
            pid,
            small,
        }
    }
}

impl Sites {
    /// Closes the fixture's stdin, on which it returns from `main`, and waits for it.
    fn exit(&mut self) -> std::process::ExitStatus {
        self.stdin.take();
        self.child.wait().expect("wait for the fixture")
    }
}

impl Drop for Sites {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn answer(fixture: &Fixture, label: &str, args: &[&str]) -> String {
    let out = mem_trace_within(fixture, label, args, Duration::from_secs(120));
    assert!(out.success(), "{}", out.describe());
    out.stdout
}

/// `mem-trace top` entries as (site function, bytes, blocks).
fn sites(top: &str) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    let mut entry: Option<(u64, u64)> = None;
    for line in top.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            entry = Some((words[1].parse().unwrap(), words[4].parse().unwrap()));
        } else if let (Some((bytes, blocks)), Some(at)) = (entry, line.find(" in site_")) {
            let name = line[at + 4..]
                .split_whitespace()
                .next()
                .unwrap()
                .to_string();
            out.push((name, bytes, blocks));
            entry = None;
        }
    }
    out
}

/// A site's bytes and blocks, summed over its stacks (`site_churn` is called from two
/// places).
fn site(rows: &[(String, u64, u64)], name: &str) -> (u64, u64) {
    let mine: Vec<_> = rows.iter().filter(|(n, _, _)| n == name).collect();
    assert!(!mine.is_empty(), "no {name} in {rows:?}");
    mine.iter()
        .fold((0, 0), |(b, k), &&(_, b2, k2)| (b + b2, k + k2))
}

fn within(estimate: u64, truth: u64, what: &str) {
    let error = (estimate as f64 - truth as f64).abs() / truth as f64;
    assert!(
        error <= 0.10,
        "{what}: estimate {estimate}, truth {truth} ({:.1}% off)",
        error * 100.0
    );
}

#[test]
fn estimates_are_within_ten_percent_and_unsampled_blocks_say_so() {
    let fixture = c_fixture("sample_sites.c", &[]);
    let sites_run = Sites::start(
        &fixture,
        &[
            ("MEM_TRACE_SAMPLE", SAMPLE),
            ("MEM_TRACE_SAMPLE_SEED", SEED),
        ],
    );
    let pid = sites_run.pid.to_string();
    let live = answer(&fixture, "top-live", &["top", &pid, "10"]);
    assert!(
        live.lines().nth(1).unwrap().starts_with(
            "estimated from sampled allocations: this process samples one allocation per ~64 KiB"
        ),
        "{live}"
    );
    let rows = sites(&live);
    let (bytes, blocks) = site(&rows, "site_small");
    within(bytes, 64_000_000, "site_small live bytes");
    within(blocks, 1_000_000, "site_small live blocks");
    let (bytes, blocks) = site(&rows, "site_medium");
    within(bytes, 100_000_000, "site_medium live bytes");
    within(blocks, 100_000, "site_medium live blocks");
    let (bytes, blocks) = site(&rows, "site_large");
    within(bytes, 20_000_000, "site_large live bytes");
    within(blocks, 500, "site_large live blocks");

    let allocated = answer(
        &fixture,
        "top-allocated",
        &["top", &pid, "10", "--by", "allocated"],
    );
    let rows = sites(&allocated);
    within(
        site(&rows, "site_churn").0,
        64_000_000,
        "site_churn allocated bytes",
    );
    within(
        site(&rows, "site_small").0,
        64_000_000,
        "site_small allocated bytes",
    );

    // A 64-byte block is sampled with probability 1/1024: of ten, some are not.
    let unsampled: Vec<String> = sites_run
        .small
        .iter()
        .map(|a| answer(&fixture, "why", &["why", &pid, &format!("{a:#x}")]))
        .filter(|w| w.contains("not sampled"))
        .collect();
    assert!(!unsampled.is_empty());
    assert!(
        unsampled[0].ends_with(
            "is in no sampled block: not sampled, this process samples one allocation per ~64 KiB (MEM_TRACE_SAMPLE)\n"
        ),
        "{}",
        unsampled[0]
    );
    let address = unsampled[0].split_whitespace().next().unwrap().to_string();

    let leaks = answer(&fixture, "leaks", &["leaks", &pid]);
    assert!(
        leaks.contains("(sampled: this process samples one allocation per ~64 KiB"),
        "{leaks}"
    );
    // Drawn and exported answers say they are estimates too.
    let svg = fixture.dir.join("sampled.svg");
    answer(
        &fixture,
        "svg",
        &["flamegraph", &pid, "-o", svg.to_str().unwrap()],
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("estimated from samples (one allocation per ~64 KiB)"));
    let json = fixture.dir.join("sampled.json");
    answer(
        &fixture,
        "dhat",
        &["dhat", &pid, "-o", json.to_str().unwrap()],
    );
    let dhat: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(
        dhat["mode"],
        "heap (mem-trace), estimated from samples: one allocation per ~64 KiB"
    );
    let info = answer(&fixture, "info", &["info", &pid]);
    assert!(
        info.contains("  sampling:        one allocation per ~64 KiB (MEM_TRACE_SAMPLE)"),
        "{info}"
    );

    // gdb says the same.
    let script = common::manifest_dir().join("gdb").join("mem_trace.py");
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-batch", "-ex", "set debuginfod enabled off", "-p"])
        .arg(&pid)
        .arg("-ex")
        .arg(format!("source {}", script.display()))
        .args(["-ex", &format!("mtrace-why {address}")])
        .args(["-ex", "mtrace-top 3"])
        .args(["-ex", &format!("call (void)print_trace({address})")])
        // gdb 13 needs it to finish the call on CPUs with AMX (tests/fixtures/gdb_xstate.c).
        .env("LD_PRELOAD", &common::c_shared_library("gdb_xstate.c").bin)
        .current_dir(&fixture.dir);
    let gdb = run_with_timeout(
        cmd,
        &fixture.dir.join("gdb"),
        true,
        None,
        Duration::from_secs(120),
        "gdb",
    );
    assert!(gdb.stdout.contains(&format!(
        "{address} is in no sampled block: not sampled, this process samples one allocation per ~64 KiB (MEM_TRACE_SAMPLE)"
    )), "{}", gdb.stdout);
    assert!(
        gdb.stdout.contains(
            "estimated from sampled allocations: this process samples one allocation per ~64 KiB"
        ),
        "{}",
        gdb.stdout
    );
    // print_trace, called in the process, says so on the process's stderr.
    let printed = std::fs::read_to_string(fixture.dir.join("sites.stderr")).unwrap();
    assert!(printed.contains(&format!(
        "mem-trace: {address} is in no sampled block: not sampled, this process samples one allocation per ~64 KiB (MEM_TRACE_SAMPLE)"
    )), "{printed}\n{}", gdb.stdout);
    // gdb's ranking is the command's.
    let gdb_rows = sites(&gdb.stdout);
    let rows = sites(&live);
    assert!(!gdb_rows.is_empty(), "{}", gdb.stdout);
    for (name, _, _) in &gdb_rows {
        assert_eq!(site(&rows, name).0, site(&gdb_rows, name).0, "{name}");
    }
    drop(sites_run);

    // The same seed, the same samples: the same estimated bytes. With an exit report (off
    // with `MEM_TRACE_LEAKS=0`), read below.
    let mut again = Sites::start(
        &fixture,
        &[
            ("MEM_TRACE_SAMPLE", SAMPLE),
            ("MEM_TRACE_SAMPLE_SEED", SEED),
            ("MEM_TRACE_LEAKS", "1"),
        ],
    );
    let rows_again = sites(&answer(
        &fixture,
        "top-again",
        &["top", &again.pid.to_string(), "10"],
    ));
    for name in ["site_small", "site_medium", "site_large"] {
        assert_eq!(site(&rows_again, name).0, site(&rows, name).0, "{name}");
    }

    // Its exit report (stdin closed: the fixture returns) says its numbers are estimates.
    let status = again.exit();
    assert!(status.success(), "{status}");
    let report = std::fs::read_to_string(fixture.dir.join("sites.stderr")).unwrap();
    let head: Vec<&str> = report.lines().take(2).collect();
    assert!(
        head[0].starts_with("mem-trace: report 1 (at exit)"),
        "{report}"
    );
    assert_eq!(
        head[1],
        "mem-trace: estimated from sampled allocations: this process samples one allocation \
         per ~64 KiB (MEM_TRACE_SAMPLE)",
        "{report}"
    );
}

#[test]
fn bad_sampling_values_are_one_line_and_exact_is_used() {
    let fixture = c_fixture("sample_sites.c", &[]);
    // Each line names the value used instead, not only that it is "the default".
    const EVERY_BLOCK: &str = "; using the default, 0 (every block recorded)";
    const NEW_SEED: &str = "; using the default, none (a new seed each run)";
    for (var, value, used) in [
        ("MEM_TRACE_SAMPLE", "lots", EVERY_BLOCK),
        ("MEM_TRACE_SAMPLE", "banana", EVERY_BLOCK),
        ("MEM_TRACE_SAMPLE", "-5", EVERY_BLOCK),
        ("MEM_TRACE_SAMPLE", "2T", EVERY_BLOCK),
        ("MEM_TRACE_SAMPLE_SEED", "x", NEW_SEED),
        ("MEM_TRACE_SAMPLE_SEED", "-1", NEW_SEED),
    ] {
        let child = Command::new(&fixture.bin)
            .env("LD_PRELOAD", profiler_library())
            .env("MEM_TRACE_PROFILE_INTERVAL", "0")
            .env("MEM_TRACE_LEAKS", "0")
            .env(var, value)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{var}={value}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(var)).collect();
        assert_eq!(lines.len(), 1, "{var}={value}: {stderr}");
        assert!(
            lines[0].starts_with(&format!(
                "mem-trace: {var}={value:?} is not valid (expected"
            )) && lines[0].ends_with(used),
            "{}",
            lines[0]
        );
    }
}

/// The library needs no libm: its two functions of it (the sampler's `ln`, the weights'
/// `expm1`) are its own, because loading libm.so.6 added ~800 KiB to the resident size of
/// every traced process (measured on a small program under `MEM_TRACE_SAMPLE=512K`).
#[test]
fn the_preloaded_library_loads_no_libm() {
    let out = Command::new("readelf")
        .arg("-dW")
        .arg(common::library())
        .output()
        .expect("run readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = text.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(needed.iter().any(|l| l.contains("libc.so.6")), "{text}");
    assert!(!needed.iter().any(|l| l.contains("libm.so")), "{text}");
}

/// Four threads sampled at once (`tests/fixtures/sample_threads.c`): thread k keeps k * 20 MB
/// live in blocks of k * 1000 bytes and allocates k * 1 GB. The exit report's estimates per
/// thread are within 10% of those, and the program's checks pass as without the tracer:
/// every thread's untouched path found its own countdown. Which thread gets which seed
/// follows the order of their first allocations, which varies, so the mean is 16K: thread
/// 1's live estimate then rests on ~1,200 samples (a standard deviation of 2.8%, 10% is 3.5
/// of them); at 64K, ~300 samples, it was 11.5% off in one run of the suite.
#[test]
fn every_threads_estimates_are_within_ten_percent() {
    let out = fixture_run(&c_fixture("sample_threads.c", &["-pthread"]), "")
        .with_env(&[
            ("MEM_TRACE_MODE", "profile"),
            ("MEM_TRACE_SAMPLE", "16K"),
            ("MEM_TRACE_SAMPLE_SEED", SEED),
            ("MEM_TRACE_PROFILE", "1"),
        ])
        .run_same_as_plain();
    // "   thread 2 (tid 31421, "st"): peak ... bytes, live L bytes, allocated A bytes, exited"
    let mut threads: Vec<(u64, u64)> = out
        .stderr
        .lines()
        .filter(|l| l.trim_start().starts_with("thread ") && l.contains(", exited"))
        .map(|l| {
            let number = |key: &str| -> u64 {
                let rest = &l[l.find(key).unwrap_or_else(|| panic!("{key} in {l}")) + key.len()..];
                rest.split_whitespace().next().unwrap().parse().unwrap()
            };
            (number("allocated "), number("live "))
        })
        .collect();
    threads.sort();
    assert_eq!(threads.len(), 4, "{}", out.describe());
    for (k, &(allocated, live)) in (1u64..).zip(&threads) {
        within(
            allocated,
            k * 1_000_000_000,
            &format!("thread {k}'s allocated bytes"),
        );
        within(live, k * 20_000_000, &format!("thread {k}'s live bytes"));
    }
}
