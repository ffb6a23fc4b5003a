//! `mem-trace run` refuses what it cannot do in one line a user can act on: an unknown option
//! before the program is an option error (not a program named `--no-such-flag`), and a file
//! that cannot be executed says why, in words rather than an `errno`.

mod common;

use common::mem_trace_binary;
use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String) {
    let dir = common::scratch_dir("cli_refusals", &args.join("_").replace('/', "_"));
    let out = Command::new(mem_trace_binary())
        .arg("run")
        .arg("-o")
        .arg(dir.join("out"))
        .args(args)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run mem-trace");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_unknown_option_is_refused_as_an_option() {
    let (code, err) = run(&["--no-such-flag", "--", "true"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("unexpected argument '--no-such-flag'"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn words_after_the_program_are_the_programs_own() {
    let (code, err) = run(&["--", "sh", "-c", "test \"$1\" = --foo", "x", "--foo"]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_file_that_cannot_be_executed_says_why_in_one_line() {
    let (code, err) = run(&["--", "/etc/passwd"]);
    assert_eq!(code, Some(126), "{err}");
    assert_eq!(
        err.trim_end(),
        "mem-trace: run: cannot execute /etc/passwd: it is not an executable file (no execute \
         permission)"
    );
    let (code, err) = run(&["--", "/"]);
    assert_eq!(code, Some(126), "{err}");
    assert_eq!(
        err.trim_end(),
        "mem-trace: run: cannot execute /: it is a directory"
    );
}
