//! What tests of the gdb commands (`mtrace-why`, `mtrace-history`, `mtrace-info`) share:
//! fixtures that can `source` the entry script, and the checks every command's output must
//! pass whatever the fixture asks.

use std::fs;

use super::{manifest_dir, run_gdb_script, Fixture, GdbRun};

/// Makes `{dir}/mem_trace.py` a symlink to the source tree's `gdb/mem_trace.py`, so fixtures
/// can `source {dir}/mem_trace.py` wherever the target directory is (the entry script follows
/// symlinks to find `python/`, as a user's symlink to it would).
pub fn with_entry_script(fixture: Fixture) -> Fixture {
    let link = fixture.dir.join("mem_trace.py");
    let entry = manifest_dir().join("gdb").join("mem_trace.py");
    // Tests of one binary run in parallel: a symlink already there is the same one.
    if fs::read_link(&link).ok().as_deref() != Some(entry.as_path()) {
        let _ = fs::remove_file(&link);
        if let Err(e) = std::os::unix::fs::symlink(&entry, &link) {
            assert!(
                fs::read_link(&link).ok().as_deref() == Some(entry.as_path()),
                "symlink {} -> {}: {e}",
                link.display(),
                entry.display()
            );
        }
    }
    fixture
}

/// Runs a fixture's script (its checks are matched by the harness) and asserts what holds for
/// every mem-trace command: errors are one `gdb.GdbError` line, never a Python traceback, and
/// captured stacks start at the program's caller of malloc or free, never in the tracer (a
/// captured stack begins with the tracer's own frames, which the tracer must skip, or every
/// answer would start with them instead of the line the user wants).
pub fn gdb(fixture: &Fixture, script: &str) -> GdbRun {
    let run = run_gdb_script(fixture, script);
    for bad in ["Traceback", "Python Exception", "internal error"] {
        assert!(
            !run.output.contains(bad),
            "{}: script {script:?}: `{bad}` in the gdb output\n{}",
            fixture.src.display(),
            run.report()
        );
    }
    // Any of the tracer's crates (`mem_trace::`, `mem_trace_core::`, ...).
    assert!(
        !run.output.contains(" in mem_trace"),
        "{}: script {script:?}: a stack shows the tracer's own frames\n{}",
        fixture.src.display(),
        run.report()
    );
    run
}

/// A gdb command's line without what only gdb knows (`, gdb thread N`), to compare it with the
/// `mem-trace` command's line for the same facts.
pub fn without_gdb_thread(line: &str) -> String {
    match line.find(", gdb thread ") {
        Some(at) => {
            let rest = &line[at + ", gdb thread ".len()..];
            let digits = rest.chars().take_while(char::is_ascii_digit).count();
            format!("{}{}", &line[..at], &rest[digits..])
        }
        None => line.to_string(),
    }
}

/// A line of an answer as the `mem-trace` command and a gdb command must both give it, for a
/// fixture whose source is `src`: without gdb's thread numbers, and with frames in the
/// fixture's own source compared whole but frames in other files (glibc's) without their
/// `at file:line`. Where several line-table rows share an address gdb takes the first and the
/// `addr2line` crate the last (`libioP.h:947` against `genops.c:347`), and gdb joins glibc's
/// relative directory to its relative file name (`./libio/./libio/genops.c`) where the crate
/// does not (`./libio/genops.c`): the same frame, function and address, spelt by two DWARF
/// readers.
pub fn comparable_with_gdb(line: &str, src: &str) -> String {
    let line = without_gdb_thread(line);
    match line.split_once(" at ") {
        Some((frame, file)) if line.trim_start().starts_with('#') && !file.starts_with(src) => {
            frame.to_string()
        }
        _ => line,
    }
}
