//! CPython 3.12 and later count the process's threads in `/proc/self/stat` in the parent just
//! after `fork`, and warn that a multi-threaded process forked: with the profiler thread
//! there, a Python program alone would get the warning (an error where warnings are, as in
//! CPython's own test suite). The thread is joined for the fork and made again once the
//! parent goes on allocating.

mod common;

use common::{profiler_library, run_with_timeout, scratch_dir};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Forks three times; the parent counts its tasks at once after each fork, then allocates for
/// 200 ms and counts them again. Warnings are errors: on 3.12+, a fork with threads fails.
const SCRIPT: &str = r#"
import os, time, warnings
warnings.simplefilter("error")
def tasks():
    return len(os.listdir("/proc/self/task"))
for i in range(3):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    at_fork = tasks()
    os.waitpid(pid, 0)
    end = time.monotonic() + 0.2
    junk = []
    while time.monotonic() < end:
        junk.append([str(j) for j in range(100)])
        time.sleep(0.005)
    print(at_fork, tasks())
"#;

/// Debian's CPython, and the pyenv builds where the machine has them (3.12 warns).
fn pythons() -> Vec<&'static str> {
    let all = [
        "/usr/bin/python3.11",
        "/root/.pyenv/versions/3.12.1/bin/python3.12",
        "/root/.pyenv/versions/3.13.0/bin/python3.13",
    ];
    assert!(
        Path::new(all[0]).exists(),
        "{}: .ci/run installs python3",
        all[0]
    );
    all.into_iter().filter(|p| Path::new(p).exists()).collect()
}

#[test]
fn a_python_program_alone_forks_alone_and_gets_the_thread_back() {
    let dir = scratch_dir("python_fork", "alone");
    let script = dir.join("forks.py");
    std::fs::write(&script, SCRIPT).unwrap();
    for python in pythons() {
        let mut cmd = Command::new(python);
        cmd.arg(&script)
            .env("LD_PRELOAD", profiler_library())
            .env("MEM_TRACE_PROFILE", "1")
            // Reports due past the program's end: a thread writing one is not joined.
            .env("MEM_TRACE_PROFILE_INTERVAL", "30")
            .env("MEM_TRACE_LEAKS", "0")
            .env("PYTHONMALLOC", "malloc")
            .env_remove("MEM_TRACE_OUT");
        let label = Path::new(python).file_name().unwrap().to_str().unwrap();
        let out = run_with_timeout(
            cmd,
            &dir.join(label),
            false,
            None,
            Duration::from_secs(60),
            "python",
        );
        assert!(out.success(), "{}", out.describe());
        // Alone at each fork; two threads again (the program's and ours) soon after.
        assert_eq!(out.stdout, "1 2\n1 2\n1 2\n", "{}", out.describe());
        assert!(!out.stderr.contains("Warning"), "{}", out.describe());
    }
}
