//! The Python side's unit tests (`tests/python/`, the layout decoder and gdb commands) run as
//! part of `cargo test`, so the single test command covers both languages.

mod common;

use std::process::Command;

use common::{manifest_dir, run_with_timeout, target_dir, RUN_TIMEOUT};

#[test]
fn python_unit_tests_pass() {
    let root = manifest_dir();
    let tests = root.join("tests").join("python");
    assert!(
        tests.is_dir(),
        "{} does not exist: the Python unit tests belong there (run by `python3 -m unittest discover -s tests/python -v`)",
        tests.display()
    );
    let logs = target_dir().join("mem-trace-tests").join("python_unit");
    std::fs::create_dir_all(&logs).expect("create log dir");
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "unittest", "discover", "-s", "tests/python", "-v"])
        .current_dir(&root);
    let out = run_with_timeout(
        cmd,
        &logs.join("unittest"),
        false,
        None,
        RUN_TIMEOUT,
        "python3 -m unittest",
    );
    // unittest reports on stderr; "Ran 0 tests" would be a discovery problem, not a pass.
    assert!(
        out.success(),
        "the Python unit tests failed (cd {} && {})\n{}",
        root.display(),
        out.command,
        out.describe()
    );
    assert!(
        !out.stderr.contains("Ran 0 tests"),
        "unittest found no tests in {}\n{}",
        tests.display(),
        out.describe()
    );
}
