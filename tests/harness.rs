//! Unit tests of the test harness itself: check matching, directives, marker substitution,
//! timeouts. None of them needs the tracer.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::script::{self, line_matches, match_checks, Directive, Mismatch, Substitutions};

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
            after_line: 3
        })
    );
    // One output line satisfies one check only.
    assert_eq!(
        match_checks(output, &checks(&["Len: 48", "Len: 48"])),
        Err(Mismatch {
            check: 1,
            after_line: 3
        })
    );
    assert_eq!(
        match_checks(output, &checks(&["Len: 49"])),
        Err(Mismatch {
            check: 0,
            after_line: 0
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
    assert!(
        missing.contains("no gdb script named \"nope\""),
        "{missing}"
    );
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
    let report = script::describe_mismatch(&f, s, &expanded, &mismatch, output);
    assert!(report.starts_with("f.c:7: gdb-check not found"), "{report}");
    assert!(report.contains("expanded: at /s/f.c:4:[...]"), "{report}");
    assert!(report.contains("f.c:6, matched output line 1"), "{report}");
    assert!(report.contains("   3 |       at /s/f.c:5:1"), "{report}");
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
}
