//! What `mem-trace run` leaves in its directory once the program has ended, and the lines on
//! stderr saying where.
//!
//! The library writes each report as `mem-trace.<pid>.<n>.txt` with its folded stacks beside it
//! (`.folded`) and normally draws its flame graph (`.svg`) itself, through this binary. Here we
//! draw any `.svg` still missing (the library could not run us), and copy the exit report's
//! leak check into a file of its own (`.leaks.txt`). Every process of the run (the program's
//! children too, whose reports carry their own pid) is accounted for.

use crate::cli::By;
use crate::flamegraph;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The line that starts a report's leak check, and the one that ends a report.
const LEAK_CHECK: &str = "mem-trace: leak check:";
const END: &str = "mem-trace: end of report";

/// One report file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// `DIR/mem-trace.<pid>.<n>.txt`.
    pub txt: PathBuf,
    /// The process that wrote it.
    pub pid: u32,
    /// Its number in that process.
    pub n: u64,
    /// Its kind, from its first line: `periodic`, `snapshot`, `at exit`.
    pub kind: String,
    /// Its leak check, copied into a file of its own.
    pub leaks: Option<PathBuf>,
    /// Its flame graph.
    pub svg: Option<PathBuf>,
}

/// Completes the directory's files and says on stderr where they are. `by` is what the reports
/// rank by (`MEM_TRACE_PROFILE_BY`).
pub fn finish(dir: &Path, by: By) -> Vec<Report> {
    let reports = complete(dir, by);
    for line in summary(dir, &reports) {
        eprintln!("{line}");
    }
    reports
}

/// Every report in `dir`, by pid and number, with its `.svg` and `.leaks.txt` made if missing.
pub fn complete(dir: &Path, by: By) -> Vec<Report> {
    let mut found: BTreeMap<(u32, u64), PathBuf> = BTreeMap::new();
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some((pid, n)) = name.to_str().and_then(report_name) else {
            continue;
        };
        found.insert((pid, n), entry.path());
    }
    found
        .into_iter()
        .map(|((pid, n), txt)| {
            let text = fs::read_to_string(&txt).unwrap_or_default();
            let kind = kind(&text).to_string();
            let leaks = leak_section(&text).and_then(|section| {
                let path = txt.with_extension("leaks.txt");
                // Never through a symlink someone left in the directory: only a new file.
                let there = fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file());
                (there || flamegraph::write_new(&path, section.as_bytes())).then_some(path)
            });
            let svg = draw_if_missing(&txt, by);
            Report {
                txt,
                pid,
                n,
                kind,
                leaks,
                svg,
            }
        })
        .collect()
}

/// `(pid, n)` of `mem-trace.<pid>.<n>.txt`.
fn report_name(name: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix("mem-trace.")?.strip_suffix(".txt")?;
    let (pid, n) = rest.split_once('.')?;
    Some((pid.parse().ok()?, n.parse().ok()?))
}

/// `periodic` of `mem-trace: report 3 (periodic) at ...`.
fn kind(text: &str) -> &str {
    let first = text.lines().next().unwrap_or("");
    first
        .split_once('(')
        .and_then(|(_, r)| r.split_once(')'))
        .map_or("", |(k, _)| k)
}

/// The leak check of a report: from its `leak check:` line to the end of the report.
fn leak_section(text: &str) -> Option<String> {
    let start = text.find(LEAK_CHECK)?;
    let section = &text[start..];
    let end = section.find(END).unwrap_or(section.len());
    Some(section[..end].to_string())
}

/// The `.svg` beside `txt`, drawn from its `.folded` if the library did not draw it.
fn draw_if_missing(txt: &Path, by: By) -> Option<PathBuf> {
    let svg = txt.with_extension("svg");
    if fs::symlink_metadata(&svg).is_ok_and(|m| m.file_type().is_file()) {
        return Some(svg);
    }
    let folded_path = txt.with_extension("folded");
    let folded = fs::read_to_string(&folded_path).ok()?;
    if folded.trim().is_empty() {
        return None;
    }
    let stem = txt.file_stem().map(|s| s.to_string_lossy().into_owned());
    let title = format!("{} ({})", by.what(), stem.unwrap_or_default());
    match flamegraph::write_to(&svg, |w| flamegraph::svg(&folded, &title, by, w)) {
        Ok(()) => Some(svg),
        Err(e) => {
            eprintln!("mem-trace: {e}");
            None
        }
    }
}

/// Where the files are, in a few lines: every process's exit report in full, the others
/// counted.
pub fn summary(dir: &Path, reports: &[Report]) -> Vec<String> {
    let shown = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    if reports.is_empty() {
        return vec![format!(
            "mem-trace: no report in {}: the program ended without calling exit (killed, or \
             _exit), which is when the exit report is written",
            dir.display()
        )];
    }
    let mut lines = vec![format!(
        "mem-trace: {} in {}",
        match reports.len() {
            1 => "1 report".to_string(),
            n => format!("{n} reports"),
        },
        dir.display()
    )];
    for r in reports.iter().filter(|r| r.kind == "at exit") {
        let mut line = format!(
            "mem-trace:   exit report of process {}: {}",
            r.pid,
            shown(&r.txt)
        );
        if let Some(svg) = &r.svg {
            line.push_str(&format!(", flame graph {}", shown(svg)));
        }
        if let Some(leaks) = &r.leaks {
            line.push_str(&format!(", leaks {}", shown(leaks)));
        }
        lines.push(line);
    }
    let others = reports.iter().filter(|r| r.kind != "at exit").count();
    if others > 0 {
        lines.push(format!(
            "mem-trace:   {others} other report{} (periodic or snapshot), each .txt with its .folded and .svg",
            if others == 1 { "" } else { "s" }
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_kinds_and_leak_sections() {
        assert_eq!(report_name("mem-trace.123.4.txt"), Some((123, 4)));
        assert_eq!(report_name("mem-trace.123.4.leaks.txt"), None);
        assert_eq!(report_name("mem-trace.123.4.folded"), None);
        let text = "mem-trace: report 2 (at exit) at 0.1 s: ...\n\
                    # 0: 5 bytes in 1 block\n\
                    mem-trace: leak check: definitely lost: 5 bytes in 1 block; ...\n\
                    # 0: 5 bytes in 1 block definitely lost\n\
                    mem-trace: end of report 2\n";
        assert_eq!(kind(text), "at exit");
        assert_eq!(
            leak_section(text).unwrap(),
            "mem-trace: leak check: definitely lost: 5 bytes in 1 block; ...\n\
             # 0: 5 bytes in 1 block definitely lost\n"
        );
        assert_eq!(leak_section("mem-trace: report 1 (periodic)\n"), None);
    }
}
