//! CPython's own small-object allocator (pymalloc) bypasses `malloc`: `mem-trace run` sets
//! `PYTHONMALLOC=malloc` (and says so) unless the user chose, so a Python program is counted
//! whole; a CPython preloaded without it is told, at start and in every report, that its
//! figures miss those objects and how to count them.

mod common;

use common::{files_ending, mem_trace_binary, profiler_library, read_text, run_with_timeout};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const PYTHON: &str = "/usr/bin/python3.11";

/// 200,000 dict entries of small lists and strings, and 20,000 small lists.
const SCRIPT: &str = "d = {}\n\
for i in range(200000):\n    d['k%d' % i] = [i, str(i)]\n\
lists = [list(range(10)) for _ in range(20000)]\n\
print(len(d), len(lists))\n";

const SAID: &str = "mem-trace: run: PYTHONMALLOC=malloc for the program, so that CPython's \
                    small objects go through malloc and are counted";
const MISSING: &str = "mem-trace: this is CPython with its own small-object allocator \
                       (pymalloc): objects of up to 512 bytes bypass malloc";

fn python() -> &'static Path {
    let p = Path::new(PYTHON);
    assert!(p.exists(), "{PYTHON} is missing: .ci/run installs python3");
    p
}

/// `mem-trace run` on the script, with `PYTHONMALLOC` as given; its stderr, and the global
/// peak of its exit report.
fn run(dir: &Path, label: &str, pythonmalloc: Option<&str>) -> (String, u64) {
    let out_dir = dir.join(label);
    let mut cmd = Command::new(mem_trace_binary());
    cmd.args(["run", "-o"])
        .arg(&out_dir)
        .arg("--")
        .arg(python())
        .arg(dir.join("dicts.py"))
        .env_remove("PYTHONMALLOC")
        .env_remove("LD_PRELOAD");
    if let Some(v) = pythonmalloc {
        cmd.env("PYTHONMALLOC", v);
    }
    let out = run_with_timeout(
        cmd,
        &dir.join(label),
        false,
        None,
        Duration::from_secs(120),
        "mem-trace run",
    );
    assert!(out.success(), "{}", out.describe());
    assert_eq!(out.stdout, "200000 20000\n");
    let report = files_ending(&out_dir, ".1.txt");
    let text = read_text(&report[0]);
    let peak = text
        .lines()
        .find_map(|l| l.strip_prefix("mem-trace: global peak: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no global peak\n{text}"));
    (out.stderr, peak)
}

#[test]
fn run_counts_a_python_program_whole_and_says_why() {
    let dir = common::scratch_dir("python_counted", "run");
    std::fs::write(dir.join("dicts.py"), SCRIPT).unwrap();
    let (said, unset) = run(&dir, "unset", None);
    assert!(said.contains(SAID), "{said}");
    let (chosen, set) = run(&dir, "set", Some("malloc"));
    assert!(
        !chosen.contains(SAID),
        "the user chose: nothing to say\n{chosen}"
    );
    let ratio = unset as f64 / set as f64;
    assert!(
        (0.95..=1.05).contains(&ratio),
        "peak without PYTHONMALLOC {unset}, with it {set}: not within 5%"
    );
}

#[test]
fn a_preloaded_cpython_with_pymalloc_is_told_its_figures_miss_objects() {
    let dir = common::scratch_dir("python_counted", "preload");
    std::fs::write(dir.join("dicts.py"), SCRIPT).unwrap();
    let mut cmd = Command::new(python());
    cmd.arg(dir.join("dicts.py"))
        .env("LD_PRELOAD", profiler_library())
        .env("MEM_TRACE_LEAKS", "1")
        .env_remove("PYTHONMALLOC");
    let out = run_with_timeout(
        cmd,
        &dir.join("pymalloc"),
        false,
        None,
        Duration::from_secs(120),
        "python3.11",
    );
    assert!(out.success(), "{}", out.describe());
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert!(lines[0].starts_with(MISSING), "{}", out.stderr);
    let report = lines
        .iter()
        .position(|l| l.starts_with("mem-trace: report 1 (at exit)"))
        .unwrap_or_else(|| panic!("no exit report\n{}", out.stderr));
    assert!(lines[report + 1].starts_with(MISSING), "{}", out.stderr);

    // Without reports, nothing of ours on the program's stderr, which it may read itself.
    let mut cmd = Command::new(python());
    cmd.arg(dir.join("dicts.py"))
        .env("LD_PRELOAD", profiler_library())
        .env("MEM_TRACE_PROFILE", "0")
        .env_remove("PYTHONMALLOC");
    let out = run_with_timeout(
        cmd,
        &dir.join("quiet"),
        false,
        None,
        Duration::from_secs(120),
        "python3.11",
    );
    assert!(out.success(), "{}", out.describe());
    assert_eq!(out.stderr, "", "{}", out.describe());

    let mut cmd = Command::new(python());
    cmd.arg(dir.join("dicts.py"))
        .env("LD_PRELOAD", profiler_library())
        .env("PYTHONMALLOC", "malloc");
    let out = run_with_timeout(
        cmd,
        &dir.join("malloc"),
        false,
        None,
        Duration::from_secs(120),
        "python3.11",
    );
    assert!(out.success(), "{}", out.describe());
    assert!(!out.stderr.contains(MISSING), "{}", out.stderr);
}
