//! Unit tests of the test harness itself: check matching, directives (gdb sessions and direct
//! runs), marker substitution, exit codes, timeouts. None of them needs the tracer.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use common::script::{
    self, line_matches, match_checks, match_lines, match_stream, parse_exit, Check, Directive,
    Exit, Mismatch, Substitutions,
};

#[test]
fn a_check_without_wildcard_must_equal_the_trimmed_line() {
    assert!(line_matches("   Len: 4001  ", "Len: 4001"));
    assert!(line_matches("Len: 4001", "  Len: 4001"));
    assert!(!line_matches("Len: 40011", "Len: 4001"));
    assert!(!line_matches("XLen: 4001", "Len: 4001"));
}

#[test]
fn wildcards_match_any_run_of_characters_and_keep_the_anchors() {
    assert!(line_matches("PID: 12345", "PID: [...]"));
    assert!(line_matches("PID:", "PID:[...]"));
    assert!(line_matches(
        "Block: 0x5555 (0x555d is 8 bytes inside it)",
        "Block: 0x[...] (0x[...] is 8 bytes inside it)"
    ));
    assert!(!line_matches(
        "Block: 0x5555 (0x555d is 18 bytes inside it)",
        "Block: 0x[...] (0x[...] is 8 bytes inside it)"
    ));
    assert!(line_matches("at /a/b.c:12:5", "at /a/b.c:12:[...]"));
    assert!(!line_matches("at /a/b.c:123:5", "at /a/b.c:12:[...]"));
    // Anchored at both ends unless a wildcard says otherwise.
    assert!(!line_matches("x mem-trace: busy", "mem-trace: [...]busy"));
    assert!(line_matches(
        "x mem-trace: busy",
        "[...]mem-trace: [...]busy"
    ));
    assert!(!line_matches("mem-trace: busy now", "mem-trace: [...]busy"));
    assert!(line_matches(
        "mem-trace: busy now",
        "mem-trace: [...]busy[...]"
    ));
    // The suffix may not overlap what the prefix or a middle fragment consumed.
    assert!(!line_matches("ab", "ab[...]b"));
    assert!(!line_matches("x", "[...]x[...]x"));
    assert!(line_matches("xx", "[...]x[...]x"));
    assert!(line_matches("anything at all", "[...]"));
}

#[test]
fn checks_match_in_order_with_extra_lines_allowed() {
    let output = "noise\nPID: 1\nLen: 48\nmore noise\n   0: f\n             at a.c:3:1\n";
    let checks = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        match_checks(
            output,
            &checks(&["PID: [...]", "Len: 48", "0: f", "at a.c:3:[...]"])
        ),
        Ok(())
    );
    // Order matters: `PID` cannot be found after `Len`.
    assert_eq!(
        match_checks(output, &checks(&["Len: 48", "PID: [...]"])),
        Err(Mismatch {
            check: 1,
            after_line: 3,
            found: None
        })
    );
    // One output line satisfies one check only.
    assert_eq!(
        match_checks(output, &checks(&["Len: 48", "Len: 48"])),
        Err(Mismatch {
            check: 1,
            after_line: 3,
            found: None
        })
    );
    assert_eq!(
        match_checks(output, &checks(&["Len: 49"])),
        Err(Mismatch {
            check: 0,
            after_line: 0,
            found: None
        })
    );
}

const FIXTURE: &str = r#"#include <stdlib.h>
// gdb-command: break break_here
// gdb-command: run
void *f(void) { return malloc(7); } // @alloc
// gdb-command: call mem_trace::print_trace(p)
// gdb-check:   Len: 7
//   gdb-check: at {src}:{line:alloc}:[...]
// gdb-command[other]: set exec-wrapper env LD_PRELOAD={so}
// gdb-check[other]:   {dir}/{bin} {unknown} {line:alloc}{
int main(void) { return 0; } // @main-line
"#;

fn subs() -> Substitutions {
    Substitutions {
        so: "/t/libmem_trace.so".into(),
        src: "/s/f.c".into(),
        dir: "/d".into(),
        bin: "/d/f".into(),
    }
}

#[test]
fn directives_are_collected_per_script_with_their_line_numbers() {
    let f = script::parse(Path::new("f.c"), FIXTURE).unwrap();
    let main = f.script("").unwrap();
    let texts = |v: &[Directive]| {
        v.iter()
            .map(|d| (d.line, d.text.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        texts(&main.commands),
        vec![
            (2, "break break_here".to_string()),
            (3, "run".to_string()),
            (5, "call mem_trace::print_trace(p)".to_string())
        ]
    );
    assert_eq!(
        texts(&main.checks),
        vec![
            (6, "Len: 7".to_string()),
            (7, "at {src}:{line:alloc}:[...]".to_string())
        ]
    );
    let other = f.script("other").unwrap();
    assert_eq!(other.commands.len(), 1);
    assert_eq!(other.checks.len(), 1);
    let missing = f.script("nope").unwrap_err();
    assert!(missing.contains("no script named \"nope\""), "{missing}");
}

#[test]
fn markers_and_paths_are_substituted_and_other_braces_kept() {
    let f = script::parse(Path::new("f.c"), FIXTURE).unwrap();
    assert_eq!(f.markers.get("alloc"), Some(&4));
    assert_eq!(f.markers.get("main-line"), Some(&10));
    let main = f.script("").unwrap();
    assert_eq!(
        f.substitute(&main.checks[1], &subs()).unwrap(),
        "at /s/f.c:4:[...]"
    );
    let other = f.script("other").unwrap();
    assert_eq!(
        f.substitute(&other.commands[0], &subs()).unwrap(),
        "set exec-wrapper env LD_PRELOAD=/t/libmem_trace.so"
    );
    assert_eq!(
        f.substitute(&other.checks[0], &subs()).unwrap(),
        "/d//d/f {unknown} 4{"
    );
}

#[test]
fn an_unknown_marker_is_an_error_citing_the_directive() {
    let text = "x\n// gdb-check: at {line:nowhere}\n";
    let f = script::parse(Path::new("g.c"), text).unwrap();
    let err = f
        .substitute(&f.script("").unwrap().checks[0], &subs())
        .unwrap_err();
    assert!(err.starts_with("g.c:2:"), "{err}");
    assert!(err.contains("// @nowhere"), "{err}");
}

#[test]
fn malformed_directives_and_duplicate_markers_are_errors() {
    let dup = script::parse(Path::new("d.c"), "a // @m\nb // @m\n").unwrap_err();
    assert!(dup.starts_with("d.c:2:") && dup.contains("line 1"), "{dup}");
    let bad = script::parse(Path::new("d.c"), "// gdb-check Len: 3\n").unwrap_err();
    assert!(bad.starts_with("d.c:1:"), "{bad}");
    let open = script::parse(Path::new("d.c"), "// gdb-command[x: run\n").unwrap_err();
    assert!(open.contains("unterminated"), "{open}");
}

#[test]
fn a_mismatch_report_cites_the_fixture_line_and_shows_all_output() {
    let f = script::parse(Path::new("f.c"), FIXTURE).unwrap();
    let s = f.script("").unwrap();
    let expanded: Vec<String> = s
        .checks
        .iter()
        .map(|d| f.substitute(d, &subs()).unwrap())
        .collect();
    let output = "Len: 7\n   0: f\n      at /s/f.c:5:1\n";
    let mismatch = match_checks(output, &expanded).unwrap_err();
    let report =
        script::describe_mismatch(&f, &s.checks, &expanded, &mismatch, "gdb output", output);
    assert!(report.starts_with("f.c:7: gdb-check not found"), "{report}");
    assert!(report.contains("expanded: at /s/f.c:4:[...]"), "{report}");
    assert!(report.contains("f.c:6, matched output line 1"), "{report}");
    assert!(report.contains("   3 |       at /s/f.c:5:1"), "{report}");
}

/// A fixture with direct runs: one unnamed, one named, and a gdb session beside them.
const RUNS: &str = r#"/* What the fixture shows. */
// run-args:    double {bin}
// run-args:    more
// run-env:     MEM_TRACE_QUARANTINE=256K  MEM_TRACE_FREED=0
// exit-code:   0
// stdout:      before double
// stdout:      after double
// stderr-not:  [...]invalid free[...]
// stderr-check: mem-trace: double free of 0x[...]
// stderr-check: at {src}:{line:free}:[...]
// stderr-not:  [...]
// run-env[glibc]:    LD_PRELOAD=
// exit-code[glibc]:  SIGABRT or SIGSEGV
// stdout-check[glibc]: before[...]
// stdout-not[glibc]:   after[...]
// gdb-command[live]: run
// gdb-not[live]:     [...]signaled[...]
// gdb-check[live]:   exited normally
int main(void) { free(p); } // @free
"#;

#[test]
fn run_directives_are_collected_per_script_with_their_keywords() {
    let f = script::parse(Path::new("r.c"), RUNS).unwrap();
    let run = f.run_script("").unwrap();
    let texts = |v: &[Directive]| {
        v.iter()
            .map(|d| (d.line, d.keyword, d.text.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        texts(&run.args),
        vec![
            (2, "run-args", "double {bin}".to_string()),
            (3, "run-args", "more".to_string())
        ]
    );
    assert_eq!(run.env.len(), 1);
    assert_eq!(run.exit.as_ref().map(|d| d.line), Some(5));
    assert_eq!(
        texts(&run.stdout.lines),
        vec![
            (6, "stdout", "before double".to_string()),
            (7, "stdout", "after double".to_string())
        ]
    );
    assert!(run.stdout.checks.is_empty());
    // Checks and nots keep their file order, which gives a not its place.
    assert_eq!(
        run.stderr
            .checks
            .iter()
            .map(|d| (d.line, d.forbids()))
            .collect::<Vec<_>>(),
        vec![(8, true), (9, false), (10, false), (11, true)]
    );
    let glibc = f.run_script("glibc").unwrap();
    assert_eq!(glibc.env[0].text, "LD_PRELOAD=");
    assert_eq!(
        texts(&glibc.stdout.checks),
        vec![
            (14, "stdout-check", "before[...]".to_string()),
            (15, "stdout-not", "after[...]".to_string())
        ]
    );
    let live = f.gdb_script("live").unwrap();
    assert_eq!(
        live.checks
            .iter()
            .map(|d| (d.keyword, d.forbids()))
            .collect::<Vec<_>>(),
        vec![("gdb-not", true), ("gdb-check", false)]
    );
    let expanded = f.substitute(&run.stderr.checks[2], &subs()).unwrap();
    assert_eq!(expanded, "at /s/f.c:19:[...]");
    assert_eq!(f.substitute(&run.args[0], &subs()).unwrap(), "double /d/f");
}

#[test]
fn a_script_is_a_gdb_session_or_a_direct_run_never_both() {
    let f = script::parse(Path::new("r.c"), RUNS).unwrap();
    let err = f.gdb_script("").unwrap_err();
    assert!(err.contains("no gdb-command"), "{err}");
    let err = f.run_script("live").unwrap_err();
    assert!(
        err.starts_with("r.c:16:") && err.contains("gdb session"),
        "{err}"
    );
    let mixed = "// gdb-command[x]: run\n// stderr-check[x]: boom\n";
    let f = script::parse(Path::new("m.c"), mixed).unwrap();
    for err in [
        f.gdb_script("x").unwrap_err(),
        f.run_script("x").unwrap_err(),
    ] {
        assert!(
            err.contains("m.c:1: gdb-command") && err.contains("m.c:2: stderr-check"),
            "{err}"
        );
    }
}

#[test]
fn exit_codes_name_codes_or_signals_and_alternatives() {
    assert_eq!(parse_exit("0"), Ok(vec![Exit::Code(0)]));
    assert_eq!(parse_exit("3"), Ok(vec![Exit::Code(3)]));
    assert_eq!(
        parse_exit("SIGABRT or SIGSEGV"),
        Ok(vec![
            Exit::Signal(libc::SIGABRT),
            Exit::Signal(libc::SIGSEGV)
        ])
    );
    assert!(parse_exit("SIGFOO").unwrap_err().contains("SIGFOO"));
    assert!(parse_exit("").is_err());
    // Wait statuses: exit code in the high byte, the signal in the low bits.
    let exited = |code: i32| ExitStatus::from_raw(code << 8);
    let killed = ExitStatus::from_raw(libc::SIGABRT);
    assert!(Exit::Code(0).matches(exited(0)));
    assert!(!Exit::Code(0).matches(exited(1)));
    assert!(!Exit::Code(0).matches(killed));
    assert!(Exit::Signal(libc::SIGABRT).matches(killed));
    assert!(!Exit::Signal(libc::SIGSEGV).matches(killed));
    assert!(!Exit::Signal(libc::SIGABRT).matches(exited(libc::SIGABRT)));
    assert_eq!(
        Exit::Signal(libc::SIGABRT).to_string(),
        "killed by signal 6 (SIGABRT)"
    );
}

#[test]
fn a_not_holds_from_where_it_is_written_to_the_end() {
    let output = "before\nreport\n  frame\nafter\n";
    let ok = |checks: &[Check]| match_stream(output, checks);
    // Before every check: anywhere.
    assert_eq!(
        ok(&[Check::absent("[...]double[...]"), Check::present("report")]),
        Ok(())
    );
    assert_eq!(
        ok(&[Check::absent("after"), Check::present("report")]),
        Err(Mismatch {
            check: 0,
            after_line: 0,
            found: Some(4)
        })
    );
    // After a check: from the line it matched on, to the end.
    assert_eq!(
        ok(&[Check::present("report"), Check::absent("before")]),
        Ok(())
    );
    assert_eq!(
        ok(&[
            Check::present("report"),
            Check::absent("after"),
            Check::present("frame")
        ]),
        Err(Mismatch {
            check: 1,
            after_line: 2,
            found: Some(4)
        })
    );
    // `[...]` after the last check: nothing follows it; alone: no output at all.
    assert_eq!(
        ok(&[Check::present("after"), Check::absent("[...]")]),
        Ok(())
    );
    assert_eq!(
        ok(&[Check::present("frame"), Check::absent("[...]")]),
        Err(Mismatch {
            check: 1,
            after_line: 3,
            found: Some(4)
        })
    );
    assert_eq!(match_stream("", &[Check::absent("[...]")]), Ok(()));
    assert!(match_stream("\n", &[Check::absent("[...]")]).is_err());
}

#[test]
fn whole_stream_lines_match_one_for_one() {
    let lines = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let want = lines(&["before double", "after [...]"]);
    assert_eq!(match_lines("before double\nafter double\n", &want), Ok(()));
    assert_eq!(match_lines("before double\nafter double", &want), Ok(()));
    assert_eq!(match_lines("before double\nbefore\n", &want), Err(1));
    assert_eq!(match_lines("before double\n", &want), Err(1));
    assert_eq!(
        match_lines("before double\nafter double\nmore\n", &want),
        Err(2)
    );
    assert_eq!(
        match_lines("x\nbefore double\nafter double\n", &want),
        Err(0)
    );
    assert_eq!(match_lines("", &[]), Ok(()));
}

#[test]
fn malformed_run_directives_are_errors_citing_the_line() {
    let err = |text: &str| script::parse(Path::new("e.c"), text).unwrap_err();
    let e = err("x\n// run-env: QUARANTINE\n");
    assert!(e.starts_with("e.c:2:") && e.contains("NAME=VALUE"), "{e}");
    let e = err("// run-env: =3\n");
    assert!(e.contains("`=3`"), "{e}");
    let e = err("// exit-code: SIGNOPE\n");
    assert!(e.starts_with("e.c:1:") && e.contains("SIGNOPE"), "{e}");
    let e = err("// exit-code: 0\n// exit-code: 1\n");
    assert!(e.starts_with("e.c:2:") && e.contains("line 1"), "{e}");
    let e = err("// exit-code[a]: 0\n// stderr-chek[a]: boom\n");
    assert!(
        e.starts_with("e.c:2:") && e.contains("unknown directive `stderr-chek`"),
        "{e}"
    );
    // A hyphenated keyword is never prose: without its colon it is a typo.
    let e = err("// stderr-check mem-trace: boom\n");
    assert!(
        e.starts_with("e.c:1:") && e.contains("`stderr-check:`"),
        "{e}"
    );
    // Prose, even when it starts with `stdout` or `stderr` or like a directive family, is
    // left alone.
    let prose =
        "// gdb 13 resolves it\n// run it twice\n// stderr, then SIGABRT\n// stdout is a file\n";
    let ok = script::parse(Path::new("e.c"), prose);
    assert!(ok.unwrap().scripts.is_empty());
}

#[test]
fn a_stream_mismatch_report_cites_the_fixture_line_and_shows_the_stream() {
    let f = script::parse(Path::new("r.c"), RUNS).unwrap();
    let run = f.run_script("").unwrap();
    let expanded: Vec<String> = run
        .stderr
        .checks
        .iter()
        .map(|d| f.substitute(d, &subs()).unwrap())
        .collect();
    let checks: Vec<Check> = run
        .stderr
        .checks
        .iter()
        .zip(&expanded)
        .map(|(d, t)| Check {
            text: t.clone(),
            forbid: d.forbids(),
        })
        .collect();

    // A missing check.
    let stderr = "mem-trace: double free of 0x10\n   0: release\n      at /s/f.c:18:5\n";
    let m = match_stream(stderr, &checks).unwrap_err();
    let report = script::describe_mismatch(&f, &run.stderr.checks, &expanded, &m, "stderr", stderr);
    assert!(
        report.starts_with("r.c:10: stderr-check not found in stderr after output line 1"),
        "{report}"
    );
    assert!(report.contains("expanded: at /s/f.c:19:[...]"), "{report}");
    assert!(
        report.contains("(previous check, r.c:9, matched output line 1"),
        "{report}"
    );
    assert!(report.contains("----- stderr, numbered -----"), "{report}");
    assert!(report.contains("   3 |       at /s/f.c:18:5"), "{report}");

    // A forbidden line: the report names it.
    let stderr = "mem-trace: double free of 0x10\n   0: release\n      at /s/f.c:19:5\nmore\n";
    let m = match_stream(stderr, &checks).unwrap_err();
    let report = script::describe_mismatch(&f, &run.stderr.checks, &expanded, &m, "stderr", stderr);
    assert!(
        report.starts_with("r.c:11: stderr-not matched stderr line 4"),
        "{report}"
    );
    assert!(report.contains("line 4: more"), "{report}");
    assert!(
        report.contains("(previous check, r.c:10, matched output line 3"),
        "{report}"
    );

    // Whole-stream lines: a differing line, a missing one, an extra one.
    let lines: Vec<String> = run.stdout.lines.iter().map(|d| d.text.clone()).collect();
    let describe = |out: &str| {
        let index = match_lines(out, &lines).unwrap_err();
        script::describe_lines_mismatch(&f, &run.stdout.lines, &lines, index, "stdout", out)
    };
    let report = describe("before double\nafter single\n");
    assert!(
        report.starts_with("r.c:7: stdout line 2 differs"),
        "{report}"
    );
    assert!(report.contains("got:      after single"), "{report}");
    let report = describe("before double\n");
    assert!(
        report.starts_with("r.c:7: stdout has 1 lines, the fixture expects 2: line 2 is missing"),
        "{report}"
    );
    let report = describe("before double\nafter double\nextra\n");
    assert!(report.starts_with("r.c:7: stdout has 3 lines"), "{report}");
    assert!(report.contains("line 3 is extra"), "{report}");
    assert!(report.contains("   3 | extra"), "{report}");
}

#[test]
fn a_hung_child_is_killed_with_its_process_group_and_reported() {
    let dir = common::target_dir().join("mem-trace-tests").join("harness");
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new("sh");
    // The grandchild `sleep` must die with the group, or the wait would outlive the test.
    cmd.args(["-c", "echo started; sleep 300 & wait"]);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        common::run_with_timeout(
            cmd,
            &dir.join("hang"),
            true,
            None,
            Duration::from_millis(500),
            "the hanging program",
        )
    }));
    let message = *result.unwrap_err().downcast::<String>().unwrap();
    assert!(
        message.starts_with("the hanging program did not return within 0.5 s"),
        "{message}"
    );
    assert!(message.contains("started"), "{message}");
}

#[test]
fn commands_render_as_shell_lines() {
    let mut cmd = Command::new("gdb");
    cmd.args(["-nx", "-x", "a b.gdb"])
        .env("LD_PRELOAD", "/x/lib.so");
    assert_eq!(
        common::render(&cmd),
        "env LD_PRELOAD=/x/lib.so gdb -nx -x 'a b.gdb'"
    );
    assert_eq!(common::quote("it's"), r"'it'\''s'");
    // A working directory is part of the line, so it reruns from anywhere.
    let mut cmd = Command::new("gdb");
    cmd.arg("-nx").current_dir("/t/my dir");
    assert_eq!(common::render(&cmd), "cd '/t/my dir' && gdb -nx");
}
