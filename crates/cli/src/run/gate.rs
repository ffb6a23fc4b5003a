//! `run --error-exitcode N [--fail-on leaks|possibly]`: the run ends with status N when any of
//! its processes had a double or invalid free or, with `--fail-on`, lost memory, as valgrind's
//! `--error-exitcode` and LeakSanitizer's `exitcode` fail a CI job. The processes themselves
//! keep their own statuses (a program whose child failed goes on as it would), and the summary
//! names each process that failed the run and why. Read from each exit and final report: the
//! leak check's line, and the count of bad frees (`mem-trace: errors: ...`).

use super::outputs::{process, Report};
use super::stop::plural;
use super::worth;
use crate::cli::FailOn;

/// A process that failed the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub pid: u32,
    pub command: Option<String>,
    /// Double and invalid frees.
    pub errors: u64,
    /// Bytes and blocks definitely lost, when that fails the run.
    pub definitely: Option<(u64, u64)>,
    /// Bytes and blocks possibly lost, when that fails the run.
    pub possibly: Option<(u64, u64)>,
}

/// The processes among `reports` (the texts given with them) that fail the run.
pub fn failures<'a>(
    reports: impl IntoIterator<Item = (&'a Report, String)>,
    fail_on: Option<FailOn>,
) -> Vec<Failure> {
    let mut out = Vec::new();
    for (r, text) in reports {
        if r.kind != "at exit" && r.kind != "final" {
            continue;
        }
        let check = worth::leak_check(&text).unwrap_or_default();
        let some = |(bytes, blocks): (u64, u64)| (blocks > 0).then_some((bytes, blocks));
        let failure = Failure {
            pid: r.pid,
            command: r.command.clone(),
            errors: worth::errors(&text),
            definitely: fail_on.and_then(|_| some(check.definitely)),
            possibly: (fail_on == Some(FailOn::Possibly))
                .then(|| some(check.possibly))
                .flatten(),
        };
        if failure.errors > 0 || failure.definitely.is_some() || failure.possibly.is_some() {
            out.push(failure);
        }
    }
    out
}

/// What the summary says of the run's status, then of each process that failed it.
pub fn lines(code: u8, failures: &[Failure]) -> Vec<String> {
    let mut lines = vec![format!(
        "mem-trace: run: exit status {code} (--error-exitcode): {} failed",
        plural(failures.len(), "process", "processes")
    )];
    for f in failures {
        let mut why = Vec::new();
        if f.errors > 0 {
            let errors = f.errors as usize;
            why.push(plural(
                errors,
                "double or invalid free",
                "double or invalid frees",
            ));
        }
        for (what, found) in [("definitely", f.definitely), ("possibly", f.possibly)] {
            if let Some((bytes, blocks)) = found {
                let blocks = plural(blocks as usize, "block", "blocks");
                why.push(format!("{bytes} bytes {what} lost in {blocks}"));
            }
        }
        lines.push(format!(
            "mem-trace:   {}: {}",
            process(f.pid, f.command.as_deref()),
            why.join("; ")
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn report(pid: u32, kind: &str) -> Report {
        Report {
            txt: PathBuf::from(format!("/d/mem-trace.{pid}.1.txt")),
            pid,
            n: 1,
            kind: kind.into(),
            leaks: None,
            svg: None,
            command: Some("prog".into()),
        }
    }

    fn text(lost: (u64, u64), possibly: (u64, u64), errors: u64) -> String {
        let mut t =
            "mem-trace: report 1 (at exit) at 0.1 s: 5 bytes live in 1 block, peak 9 bytes\n"
                .to_string();
        if errors > 0 {
            t += &format!("mem-trace: errors: {errors} double or invalid frees, each reported on stderr when it happened\n");
        }
        t += &format!(
            "mem-trace: leak check: definitely lost: {} bytes in {} blocks (direct: 0 bytes in 0 blocks, indirect: 0 bytes in 0 blocks); possibly lost: {} bytes in {} blocks; still reachable: 5 bytes in 1 block\n",
            lost.0, lost.1, possibly.0, possibly.1
        );
        t
    }

    #[test]
    fn bad_frees_fail_always_leaks_only_when_asked() {
        let (clean, leaky, bad) = (
            report(1, "at exit"),
            report(2, "at exit"),
            report(3, "final"),
        );
        let texts = || {
            vec![
                (&clean, text((0, 0), (0, 0), 0)),
                (&leaky, text((300, 2), (40, 1), 0)),
                (&bad, text((0, 0), (0, 0), 2)),
            ]
        };
        let pids = |f: &[Failure]| f.iter().map(|f| f.pid).collect::<Vec<_>>();
        assert_eq!(pids(&failures(texts(), None)), [3]);
        let leaks = failures(texts(), Some(FailOn::Leaks));
        assert_eq!(pids(&leaks), [2, 3]);
        assert_eq!(leaks[0].possibly, None);
        let possibly = failures(texts(), Some(FailOn::Possibly));
        assert_eq!(possibly[0].possibly, Some((40, 1)));
        assert_eq!(
            lines(3, &possibly),
            [
                "mem-trace: run: exit status 3 (--error-exitcode): 2 processes failed",
                "mem-trace:   process 2 (prog): 300 bytes definitely lost in 2 blocks; 40 bytes possibly lost in 1 block",
                "mem-trace:   process 3 (prog): 2 double or invalid frees",
            ]
        );
        // Periodic reports are moments, not ends.
        let periodic = report(4, "periodic");
        assert!(failures([(&periodic, text((1, 1), (0, 0), 1))], Some(FailOn::Leaks)).is_empty());
    }
}
