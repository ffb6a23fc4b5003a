//! `mem-trace leaks PID` on a busy program (tests/fixtures/leak_busy.c: four threads relinking
//! lists of blocks all the time): the process is stopped for the scan, so that its answer is
//! the one a core taken right after gives, every time, and the process goes on unchanged.

mod common;

use common::{c_fixture, gcore, library, mem_trace_run, spawn_fixture, waiting_fixture};
use std::io::{BufRead, BufReader, Read};

/// The `SUMMARY:` line of a `leaks` answer.
fn summary(out: &common::Output) -> String {
    out.stdout
        .lines()
        .find(|l| l.starts_with("SUMMARY: "))
        .unwrap_or_else(|| panic!("no SUMMARY\n{}", out.describe()))
        .to_string()
}

#[test]
fn a_stopped_busy_process_answers_as_its_core_every_time() {
    let f = c_fixture("leak_busy.c", &["-pthread"]);
    let mut cmd = waiting_fixture(&f, library());
    let mut child = spawn_fixture(&mut cmd, &f);
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("ready");
    assert_eq!(line, "ready\n");
    let pid = child.id().to_string();
    for run in 0..20 {
        let live = mem_trace_run(&f, &format!("leaks.{run}"), &["leaks", "-n", "1", &pid]);
        assert!(live.success(), "{}", live.describe());
        assert!(
            live.stderr.contains("mem-trace: stopped ")
                && live.stderr.contains(&format!(" of process {pid} for ")),
            "run {run}: the pause is not printed\n{}",
            live.describe()
        );
        let core = f.dir.join(format!("busy.{run}.core"));
        gcore(child.id(), &core, &f.dir.join(format!("gcore.{run}")));
        let dead = mem_trace_run(
            &f,
            &format!("leaks.core.{run}"),
            &["leaks", "-n", "1", &core.to_string_lossy()],
        );
        assert!(dead.success(), "{}", dead.describe());
        let _ = std::fs::remove_file(&core);
        let (l, d) = (summary(&live), summary(&dead));
        assert!(
            l.starts_with("SUMMARY: 4242 bytes definitely lost in 1 block"),
            "run {run}: the running process\n{l}"
        );
        assert!(
            d.starts_with("SUMMARY: 4242 bytes definitely lost in 1 block"),
            "run {run}: its core\n{d}"
        );
    }
    // --no-stop reads it running, and says so.
    let out = mem_trace_run(
        &f,
        "leaks.no-stop",
        &["leaks", "--no-stop", "-n", "1", &pid],
    );
    assert!(out.success(), "{}", out.describe());
    assert!(
        out.stderr
            .contains(&format!("process {pid} read while running (--no-stop)")),
        "{}",
        out.describe()
    );
    assert!(
        !out.stderr.contains("mem-trace: stopped "),
        "{}",
        out.describe()
    );
    // The program went on as it would have: it ends when told, with its own status, and said
    // nothing more.
    drop(child.stdin.take());
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(7), "{status:?}");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("stdout");
    assert_eq!(rest, "");
}
