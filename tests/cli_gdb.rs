//! `mem-trace gdb`: real `gdb -batch` on a C fixture run under the library, then on the core it
//! dumped, the `mtrace-*` commands there from gdb's start; gdb's status passed on; each error
//! one line and a non-zero status.
//!
//! The binary runs from `target/profiler/release/`, beside the profiler build of the library
//! (`common::mem_trace_binary`). Fixture: `tests/fixtures/why_c.c` (a 1001-byte block in `p`,
//! allocated by `from_malloc`, live at `break_here`).

mod common;

use common::{c_fixture, mem_trace_binary, run_with_timeout, Fixture, Output};
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn why() -> Fixture {
    c_fixture("why_c.c", &[])
}

/// A fresh, empty directory for one test: its logs, its cores, gdb's command cache.
fn scratch(name: &str) -> PathBuf {
    common::scratch_dir("cli_gdb", name)
}

/// `mem-trace gdb ARGS` in `cwd`, logs in `logs` as `LABEL.*`; stdout and stderr together
/// when `combined` (gdb interleaves the program's output with its own).
fn mem_trace_gdb(
    cwd: &Path,
    logs: &Path,
    label: &str,
    args: &[&dyn AsRef<std::ffi::OsStr>],
    env: &[(&str, OsString)],
    combined: bool,
) -> Output {
    let mut cmd = Command::new(mem_trace_binary());
    cmd.arg("gdb")
        .args(args)
        .current_dir(cwd)
        .env_remove("LD_PRELOAD")
        .env_remove("MEM_TRACE_LIB")
        .env("XDG_CACHE_HOME", logs.join("cache"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    common::no_core_dump(&mut cmd);
    run_with_timeout(
        cmd,
        &logs.join(label),
        combined,
        None,
        common::GDB_TIMEOUT,
        "mem-trace gdb",
    )
}

/// The line of `src` carrying `// @TAG`.
fn line_of(src: &Path, tag: &str) -> usize {
    let text = fs::read_to_string(src).unwrap();
    let mark = format!("// @{tag}");
    1 + text
        .lines()
        .position(|l| l.trim_end().ends_with(&mark))
        .unwrap_or_else(|| panic!("no {mark} in {}", src.display()))
}

/// The text between the lines `start` and `end` of `out`.
fn between<'a>(out: &'a Output, start: &str, end: &str) -> &'a str {
    let text = &out.stdout;
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("no {start:?}\n{}", out.describe()))
        + start.len();
    let to = text[from..]
        .find(end)
        .unwrap_or_else(|| panic!("no {end:?} after {start:?}\n{}", out.describe()));
    &text[from..from + to]
}

/// `mtrace-why p` from main's frame: the 1001-byte block and the line that allocated it.
fn assert_why_p(answer: &str, f: &Fixture, out: &Output) {
    assert!(
        answer.contains("is at the start of a 1001-byte block"),
        "{}",
        out.describe()
    );
    let site = format!(
        " in from_malloc at {}:{}",
        f.src.display(),
        line_of(&f.src, "malloc")
    );
    assert!(answer.contains(&site), "no {site:?}\n{}", out.describe());
}

#[test]
fn a_program_under_gdb_then_its_core() {
    let f = why();
    let logs = scratch("session");
    let core = logs.join("why_c.core");
    let generate = format!("generate-core-file {}", core.display());
    // A relative program, found from gdb's working directory, as a user types it.
    let out = mem_trace_gdb(
        &f.dir,
        &logs,
        "live",
        &[
            &"-nx",
            &"-batch",
            &"-ex",
            &"break break_here",
            &"-ex",
            &"run",
            &"-ex",
            &"frame function main",
            &"-ex",
            &"echo === why\\n",
            &"-ex",
            &"mtrace-why p",
            &"-ex",
            &"echo === info 1\\n",
            &"-ex",
            &"mtrace-info",
            &"-ex",
            &generate,
            &"-ex",
            &"echo === run 2\\n",
            &"-ex",
            &"run",
            &"-ex",
            &"echo === info 2\\n",
            &"-ex",
            &"mtrace-info",
            &"-ex",
            &"echo === end\\n",
            &"--",
            &"./why_c",
        ],
        &[],
        true,
    );
    assert!(out.success(), "{}", out.describe());
    assert_why_p(between(&out, "=== why\n", "=== info 1"), &f, &out);
    // The preload on both runs: a second `run` goes through the exec-wrapper again.
    for (start, end) in [("=== info 1\n", "=== run 2"), ("=== info 2\n", "=== end")] {
        assert!(
            between(&out, start, end).contains("mem-trace is loaded"),
            "{start}\n{}",
            out.describe()
        );
    }
    // The library carries the commands: gdb, told it is safe, auto-loads them quietly.
    assert!(
        !out.stdout.contains("auto-loading has been declined"),
        "{}",
        out.describe()
    );
    assert!(core.is_file(), "no core\n{}", out.describe());

    // The core, in every form, with the commands there before anything is loaded; alone, with
    // the executable its notes name, as `mem-trace top CORE` finds it.
    let forms: [&[&dyn AsRef<std::ffi::OsStr>]; 3] =
        [&[&core, &"--exe", &f.bin], &[&f.bin, &core], &[&core]];
    for (i, form) in forms.iter().enumerate() {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
            &"-nx",
            &"-batch",
            &"-ex",
            &"frame function main",
            &"-ex",
            &"echo === why\\n",
            &"-ex",
            &"mtrace-why p",
            &"-ex",
            &"echo === end\\n",
        ];
        args.extend_from_slice(form);
        let out = mem_trace_gdb(&logs, &logs, &format!("core{i}"), &args, &[], true);
        assert!(out.success(), "{}", out.describe());
        assert_why_p(between(&out, "=== why\n", "=== end"), &f, &out);
    }
}

#[test]
fn the_status_is_gdbs() {
    let f = why();
    let logs = scratch("status");
    let out = mem_trace_gdb(
        &logs,
        &logs,
        "quit",
        &[&"-nx", &"-batch", &"-ex", &"quit 3", &"--", &f.bin],
        &[],
        false,
    );
    assert_eq!(out.status.code(), Some(3), "{}", out.describe());
}

/// An error case: its label, the arguments, the environment, the status, how stderr starts.
type Case<'a> = (
    &'a str,
    &'a [&'a dyn AsRef<std::ffi::OsStr>],
    Vec<(&'a str, OsString)>,
    i32,
    &'a str,
);

#[test]
fn errors_are_one_line() {
    let f = why();
    let logs = scratch("errors");
    // Enough of an ELF core's header for what is read of it before gdb starts.
    let fake_core = logs.join("fake.core");
    let mut header = vec![0u8; 64];
    header[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    header[16] = 4;
    fs::write(&fake_core, header).unwrap();
    let no_gdb = logs.join("empty-path");
    fs::create_dir_all(&no_gdb).unwrap();

    let cases: [Case; 6] = [
        ("none", &[], vec![], 1, "mem-trace: gdb: no program given: "),
        (
            "missing",
            &[&"--", &"./nothing"],
            vec![],
            127,
            "mem-trace: gdb: ./nothing: no such file",
        ),
        (
            "not-in-path",
            &[&"-batch", &"--", &"no-such-program-here"],
            vec![],
            127,
            "mem-trace: gdb: no-such-program-here: command not found",
        ),
        (
            "core-alone",
            &[&"-batch", &fake_core],
            vec![],
            1,
            "mem-trace: gdb: ",
        ),
        (
            "attach",
            &[&"-p", &"123"],
            vec![],
            1,
            "mem-trace: gdb: attaching is not supported yet: start the program under mem-trace \
             gdb, or read it with mem-trace top PID",
        ),
        (
            "no-gdb",
            &[&"--", &f.bin],
            vec![("PATH", no_gdb.into_os_string())],
            127,
            "mem-trace: gdb: no gdb in PATH",
        ),
    ];
    for (label, args, env, code, starts) in cases {
        let out = mem_trace_gdb(&logs, &logs, label, args, &env, false);
        assert_eq!(out.status.code(), Some(code), "{label}\n{}", out.describe());
        assert_eq!(out.stderr.lines().count(), 1, "{label}\n{}", out.describe());
        assert!(
            out.stderr.starts_with(starts),
            "{label}\n{}",
            out.describe()
        );
        assert!(out.stdout.is_empty(), "{label}\n{}", out.describe());
    }
    // A core whose notes cannot be read names no program: --exe is the way out.
    let out = mem_trace_gdb(&logs, &logs, "core-alone", &[&fake_core], &[], false);
    assert!(
        out.stderr.contains("cannot tell which program dumped")
            && out.stderr.contains("name it with --exe PROGRAM"),
        "{}",
        out.describe()
    );
}
