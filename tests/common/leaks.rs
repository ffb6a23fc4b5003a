//! The leak check's exit report, as the leak tests read it: the program under the profiler
//! build, its `mem-trace: leak check:` lines, and the four classes they give.

use super::{profiler_library, run_with_timeout, Fixture};
use std::process::Command;
use std::time::Duration;

/// Directly lost, indirectly lost, possibly lost, still reachable: (bytes, blocks) each.
pub type Classes = [(u64, u64); 4];

/// The numbers of `text` (digits, commas inside them dropped), in order.
pub fn numbers(text: &str) -> Vec<u64> {
    text.replace(',', "")
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().expect("digits"))
        .collect()
}

/// The classes of a `SUMMARY:` or `leak check:` line: definitely lost (all, direct,
/// indirect), possibly lost, still reachable, as ten numbers.
pub fn classes(line: &str) -> Classes {
    let n = numbers(line);
    assert_eq!(n.len(), 10, "{line}");
    assert_eq!((n[0], n[1]), (n[2] + n[4], n[3] + n[5]), "{line}");
    [(n[2], n[3]), (n[4], n[5]), (n[6], n[7]), (n[8], n[9])]
}

/// `fixture` run with `args` under the profiler build, `env` added; the classes of its exit
/// report, and its `leak check:` lines. `label` names its logs.
pub fn exit_report(
    f: &Fixture,
    args: &[&str],
    env: &[(&str, &str)],
    label: &str,
) -> (Classes, String) {
    let mut cmd = Command::new(&f.bin);
    cmd.args(args)
        .env("LD_PRELOAD", profiler_library())
        .env("MEM_TRACE_LEAKS", "1")
        .envs(env.iter().copied());
    let out = run_with_timeout(
        cmd,
        &f.dir.join(label),
        false,
        None,
        Duration::from_secs(60),
        "the program",
    );
    assert!(out.success(), "{}", out.describe());
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("mem-trace: leak check: "))
        .collect();
    let first = lines
        .first()
        .unwrap_or_else(|| panic!("no leak check\n{}", out.describe()));
    (classes(first), lines.join("\n"))
}
