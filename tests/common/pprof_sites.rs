//! `tests/fixtures/pprof_sites.c` running under the profiler build, and `go tool pprof`
//! reading what it gives: shared by the pprof and push tests.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command};
use std::time::Duration;

use super::{profiler_library, run_with_timeout, spawn_fixture, waiting_fixture, Fixture};

/// The fixture running, its stdin and stdout held; killed on drop.
pub struct Sites {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Its pid.
    pub pid: u32,
}

impl Sites {
    /// Starts it, once it says `ready pid=PID`.
    pub fn start(fixture: &Fixture) -> Sites {
        let mut child = spawn_fixture(&mut waiting_fixture(fixture, profiler_library()), fixture);
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("the fixture's first line");
        let pid = line
            .trim()
            .strip_prefix("ready pid=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no `ready pid=` line: {line:?}"));
        Sites {
            child,
            stdin,
            stdout,
            pid,
        }
    }

    /// Has the program allocate 512 KiB more from `site_more`.
    pub fn more(&mut self) {
        writeln!(self.stdin).expect("write to the fixture");
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .expect("the fixture's answer");
        assert_eq!(answer.trim(), "ok");
    }
}

impl Drop for Sites {
    fn drop(&mut self) {
        // Our own child, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `go tool pprof ARGS` (Debian's golang-go), which must succeed: its stdout.
pub fn go_pprof(fixture: &Fixture, label: &str, args: &[&str]) -> String {
    let mut cmd = Command::new("go");
    cmd.args(["tool", "pprof"])
        .args(args)
        .current_dir(&fixture.dir)
        // go keeps a cache and looks for symbols; neither must leave the test's directory.
        .env("HOME", &fixture.dir)
        .env("PPROF_BINARY_PATH", &fixture.dir)
        .env("PPROF_TMPDIR", &fixture.dir);
    let out = run_with_timeout(
        cmd,
        &fixture.dir.join(format!("go-pprof.{label}")),
        false,
        None,
        Duration::from_secs(120),
        "go tool pprof",
    );
    assert!(out.success(), "{}", out.describe());
    out.stdout
}

/// `-top -unit=B` lines as (function, flat bytes).
pub fn top(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let flat = words.next()?.strip_suffix('B')?.parse().ok()?;
            let name = words.nth(4)?;
            Some((name.to_string(), flat))
        })
        .collect()
}

pub fn flat(rows: &[(String, u64)], function: &str) -> u64 {
    rows.iter()
        .find(|(name, _)| name == function)
        .map_or(0, |&(_, bytes)| bytes)
}
