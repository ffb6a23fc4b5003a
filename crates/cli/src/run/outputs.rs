//! What `mem-trace run` leaves in its directory once the program has ended, and the lines on
//! stderr saying where.
//!
//! The library writes each report as `mem-trace.<pid>.<n>.txt` with its folded stacks beside it
//! (`.folded`). The exit and final reports it writes raw, return addresses only, which we
//! symbolize here and draw as flame graphs (`symbolize`); the others it symbolizes and draws
//! itself, through this binary. Here we draw any `.svg` still missing (the library could not
//! run us), drop the exit reports not worth keeping (`worth`), and copy each exit report's
//! leak check into a file of its own (`.leaks.txt`). Every process of the run (the program's
//! children too, whose reports carry their own pid) is accounted for, by its command line
//! (`names`): a process that ended with no exit report (killed, or `_exit`) is named
//! (`stop::unfinished`), and so are those whose report was not kept.

use super::stop::Unfinished;
use super::worth::{self, Verdict};
use crate::cli::By;
use crate::flamegraph;
use mem_trace_read::deferred;
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
    /// Its kind, from its first line: `periodic`, `snapshot`, `at exit`, `final`.
    pub kind: String,
    /// Its leak check, copied into a file of its own.
    pub leaks: Option<PathBuf>,
    /// Its flame graph.
    pub svg: Option<PathBuf>,
    /// The process's command line, when the report carried it.
    pub command: Option<String>,
}

/// An exit report not kept ([`worth`]), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub pid: u32,
    pub command: Option<String>,
    pub verdict: Verdict,
}

/// How the run's processes ended, as far as `run` knows.
#[derive(Debug, Clone, Default)]
pub struct Ended {
    /// The program's pid.
    pub program: u32,
    /// The signal it died of, if it did.
    pub signal: Option<i32>,
    /// The processes that wrote no exit report.
    pub unfinished: Vec<Unfinished>,
    /// The signal `run` was told to stop by, when the program had ended before `run` could
    /// pass it on (it reached the program directly, sent to the whole group).
    pub ended_first: Option<i32>,
    /// The program ran in profile mode, which keeps no record of frees.
    pub profile_mode: bool,
}

/// Completes the directory's files and says on stderr where they are. `by` is what the reports
/// rank by (`MEM_TRACE_PROFILE_BY`); `keep_all`: every report is kept (`--all-reports`).
pub fn finish(dir: &Path, by: By, ended: &Ended, keep_all: bool) -> Vec<Report> {
    let (reports, dropped) = complete(dir, by, ended.program, keep_all);
    for line in summary(dir, &reports, &dropped, ended) {
        eprintln!("{line}");
    }
    reports
}

/// Every report in `dir`, by pid and number, symbolized if raw, with its `.svg` and
/// `.leaks.txt` made if missing; and the exit reports not kept (of processes other than
/// `program` that allocated nothing worth one), whose files are removed unless `keep_all`.
pub fn complete(dir: &Path, by: By, program: u32, keep_all: bool) -> (Vec<Report>, Vec<Dropped>) {
    let mut found: BTreeMap<(u32, u64), PathBuf> = BTreeMap::new();
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some((pid, n)) = name.to_str().and_then(report_name) else {
            continue;
        };
        found.insert((pid, n), entry.path());
    }
    let mut cache = deferred::Cache::new();
    let mut reports = Vec::new();
    let mut dropped = Vec::new();
    for ((pid, n), txt) in found {
        let text = fs::read_to_string(&txt).unwrap_or_default();
        let command = deferred::argv(&text).and_then(|argv| super::names::command_line(&argv));
        // Judged before it is symbolized: a report not kept costs no symbolizing.
        let body = deferred::body(&text);
        let kind = kind(body).to_string();
        // Only a file of ours is removed; anything else in the directory stays.
        let verdict = match super::symbolize::ours(&txt) {
            true => worth::verdict(body, &kind, pid == program),
            false => Verdict::Keep,
        };
        let text = if deferred::is_raw(&text) && (verdict == Verdict::Keep || keep_all) {
            super::symbolize::report(&txt, &text, &mut cache);
            fs::read_to_string(&txt).unwrap_or_default()
        } else {
            text
        };
        if verdict != Verdict::Keep && !keep_all {
            for ext in ["txt", "folded", "svg"] {
                remove_file(&txt.with_extension(ext));
            }
            dropped.push(Dropped {
                pid,
                command,
                verdict,
            });
            continue;
        }
        reports.push({
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
                command,
            }
        });
    }
    (reports, dropped)
}

/// Removes the regular file at `p`, if there is one (never what a symlink points to).
fn remove_file(p: &Path) {
    if fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file()) {
        let _ = fs::remove_file(p);
    }
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

/// Where the files are, in a few lines: every process's exit report in full (or its final
/// report, asked for when `run` was stopped), the others counted, and the processes that
/// ended with neither.
pub fn summary(dir: &Path, reports: &[Report], dropped: &[Dropped], ended: &Ended) -> Vec<String> {
    let shown = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut lines = Vec::new();
    if reports.is_empty() && !dropped.is_empty() {
        lines.push(format!(
            "mem-trace: no report kept in {}: no process allocated anything worth one",
            dir.display()
        ));
    } else if reports.is_empty() {
        lines.push(format!(
            "mem-trace: no report in {}: the program ended without calling exit (killed, or \
             _exit), which is when the exit report is written",
            dir.display()
        ));
    } else {
        lines.push(format!(
            "mem-trace: {} in {}",
            match reports.len() {
                1 => "1 report".to_string(),
                n => format!("{n} reports"),
            },
            dir.display()
        ));
    }
    let has_exit = |pid: u32| reports.iter().any(|r| r.pid == pid && r.kind == "at exit");
    let the_end = |r: &&Report| r.kind == "at exit" || (r.kind == "final" && !has_exit(r.pid));
    for r in reports.iter().filter(the_end) {
        let who = process(r.pid, r.command.as_deref());
        let mut line = match r.kind.as_str() {
            "final" => format!(
                "mem-trace:   final report of {who} (asked for when run was stopped): {}",
                shown(&r.txt)
            ),
            _ => format!("mem-trace:   exit report of {who}: {}", shown(&r.txt)),
        };
        if let Some(svg) = &r.svg {
            line.push_str(&format!(", flame graph {}", shown(svg)));
            if fs::read_to_string(&r.txt).is_ok_and(|t| t.contains(AT_PEAK)) {
                line.push_str(" (of the global peak: little was live at the end)");
            }
        }
        if let Some(leaks) = &r.leaks {
            line.push_str(&format!(", leaks {}", shown(leaks)));
        }
        lines.push(line);
    }
    lines.extend(not_kept(dropped, ended.program));
    lines.extend(missing(reports, ended));
    lines.extend(crash_without_frees(ended));
    let others = reports.iter().filter(|r| !the_end(r)).count();
    if others > 0 {
        lines.push(format!(
            "mem-trace:   {others} other report{} (periodic, snapshot or final), each .txt with its .folded and .svg",
            if others == 1 { "" } else { "s" }
        ));
    }
    lines
}

/// `process PID (COMMAND)`, or `process PID` when the command line is not known.
pub(super) fn process(pid: u32, command: Option<&str>) -> String {
    match command {
        Some(c) => format!("process {pid} ({c})"),
        None => format!("process {pid}"),
    }
}

/// Why a sampled process with a peak of 0 has no report: not that it allocated nothing.
const NONE_SAMPLED: &str =
    "none of its allocations was sampled (MEM_TRACE_SAMPLE): it may have allocated less than the sampling rate";

/// Processes listed one by one before they are summed up by command line.
const LISTED: usize = 4;
/// Command lines named when processes are summed up.
const COMMANDS_NAMED: usize = 8;

/// The lines naming the processes whose exit report was not kept: each, when few; else
/// counted by command line.
fn not_kept(dropped: &[Dropped], program: u32) -> Vec<String> {
    let mut lines = Vec::new();
    let (nothing, small): (Vec<&Dropped>, Vec<&Dropped>) = dropped
        .iter()
        .partition(|d| matches!(d.verdict, Verdict::Nothing | Verdict::NoneSampled));
    let why_small = format!(
        "nothing lost and a peak under {}; `run --all-reports` keeps them",
        worth::SMALL_PEAK_SHOWN
    );
    for (group, why) in [
        (nothing, "it allocated nothing".to_string()),
        (small, why_small),
    ] {
        if group.is_empty() {
            continue;
        }
        if group.len() <= LISTED {
            for d in group {
                let the_program = if d.pid == program {
                    ", the program"
                } else {
                    ""
                };
                let why = match d.verdict {
                    Verdict::Nothing => why.clone(),
                    Verdict::NoneSampled => NONE_SAMPLED.to_string(),
                    _ => format!("it allocated nothing worth one ({why})"),
                };
                lines.push(format!(
                    "mem-trace:   no report kept for {}{the_program}: {why}",
                    process(d.pid, d.command.as_deref())
                ));
            }
            continue;
        }
        let mut by_command: BTreeMap<&str, usize> = BTreeMap::new();
        for d in &group {
            *by_command
                .entry(d.command.as_deref().unwrap_or("?"))
                .or_default() += 1;
        }
        let mut counted: Vec<(&str, usize)> = by_command.into_iter().collect();
        counted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut named: Vec<String> = counted
            .iter()
            .take(COMMANDS_NAMED)
            .map(|(c, n)| format!("{n} × {c}"))
            .collect();
        if counted.len() > COMMANDS_NAMED {
            named.push(format!("{} more commands", counted.len() - COMMANDS_NAMED));
        }
        let what = match group[0].verdict {
            Verdict::Nothing | Verdict::NoneSampled
                if group.iter().any(|d| d.verdict == Verdict::NoneSampled) =>
            {
                "allocated nothing, or nothing that was sampled".to_string()
            }
            Verdict::Nothing => "allocated nothing".to_string(),
            _ => format!("allocated nothing worth one ({why})"),
        };
        lines.push(format!(
            "mem-trace:   no report kept for {} processes that {what}: {}",
            group.len(),
            named.join(", ")
        ));
    }
    lines
}

/// The line of a report whose flame graph is of the global peak.
const AT_PEAK: &str = "the flame graph shows the stacks live at the global peak";

/// A line for each process of the run with no exit report (nor final report): killed, ended
/// by `_exit`, or still running.
fn missing(reports: &[Report], ended: &Ended) -> Vec<String> {
    let reported = |pid: u32| {
        reports
            .iter()
            .any(|r| r.pid == pid && (r.kind == "at exit" || r.kind == "final"))
    };
    let mut lines = Vec::new();
    let mut program_said = false;
    // Other processes by reason: a shell's forked subshells end with `_exit` by the dozen.
    let mut others: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for u in ended.unfinished.iter().filter(|u| !reported(u.pid)) {
        let program = u.pid == ended.program;
        program_said |= program;
        let why = match (u.running, program.then_some(ended.signal).flatten()) {
            (true, _) => "it is still running".to_string(),
            (false, Some(sig)) => killed(sig, ended.ended_first),
            (false, None) => {
                "it ended without calling exit (killed by a signal, or _exit)".to_string()
            }
        };
        if program {
            lines.push(format!(
                "mem-trace:   no exit report from process {} (the program): {why}",
                u.pid
            ));
        } else {
            others.entry(why).or_default().push(u.pid);
        }
    }
    for (why, pids) in others {
        if pids.len() <= LISTED {
            for pid in pids {
                lines.push(format!(
                    "mem-trace:   no exit report from process {pid}: {why}"
                ));
            }
            continue;
        }
        let shown: Vec<String> = pids.iter().take(LISTED).map(u32::to_string).collect();
        let why = why.strip_prefix("it ").unwrap_or(&why);
        let why = why
            .strip_prefix("is ")
            .map(|rest| format!("are {rest}"))
            .unwrap_or_else(|| why.to_string());
        lines.push(format!(
            "mem-trace:   no exit report from {} processes, which {why}: {} and {} more",
            pids.len(),
            shown.join(", "),
            pids.len() - LISTED
        ));
    }
    if let (false, Some(sig)) = (program_said || reported(ended.program), ended.signal) {
        lines.push(format!(
            "mem-trace:   no exit report from process {} (the program): {}",
            ended.program,
            killed(sig, ended.ended_first)
        ));
    }
    lines
}

/// The line for a program that crashed (SIGSEGV, SIGBUS, SIGABRT: a dangling pointer is a
/// usual cause) in a run that kept no record of frees, which could not answer for it.
fn crash_without_frees(ended: &Ended) -> Option<String> {
    let crashed = matches!(
        ended.signal,
        Some(libc::SIGSEGV | libc::SIGBUS | libc::SIGABRT)
    );
    (crashed && ended.profile_mode).then(|| {
        "mem-trace:   this run kept no record of frees (profile mode): if the crash is a \
         use after free, run with --mode debug to have mem-trace why name the free"
            .to_string()
    })
}

/// Why the program killed by `sig` has no report; `ended_first`: the signal `run` was told to
/// stop by, which had ended the program before `run` passed it on: sent to `run` and the
/// program together (to their process group), it killed the program before `run` could ask
/// for its final report (`stop`).
fn killed(sig: i32, ended_first: Option<i32>) -> String {
    if ended_first != Some(sig) {
        return format!("it was killed by {}", signal_name(sig));
    }
    format!(
        "it was killed by {0}, which reached it at the same time as run (sent to the whole \
         process group, as systemd's default KillMode=control-group does), before run could \
         ask for its final report: send {0} to run alone (`kill -{1} {2}`; systemd: \
         KillMode=mixed)",
        signal_name(sig),
        signal_name(sig).trim_start_matches("SIG"),
        std::process::id()
    )
}

/// A signal's name, as `kill -l` gives it.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "HUP",
        libc::SIGINT => "INT",
        libc::SIGQUIT => "QUIT",
        libc::SIGILL => "ILL",
        libc::SIGTRAP => "TRAP",
        libc::SIGABRT => "ABRT",
        libc::SIGBUS => "BUS",
        libc::SIGFPE => "FPE",
        libc::SIGKILL => "KILL",
        libc::SIGUSR1 => "USR1",
        libc::SIGSEGV => "SEGV",
        libc::SIGUSR2 => "USR2",
        libc::SIGPIPE => "PIPE",
        libc::SIGALRM => "ALRM",
        libc::SIGTERM => "TERM",
        libc::SIGXCPU => "XCPU",
        libc::SIGXFSZ => "XFSZ",
        libc::SIGSYS => "SYS",
        _ => return format!("signal {sig}"),
    };
    format!("SIG{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(pid: u32, kind: &str) -> Report {
        Report {
            txt: PathBuf::from(format!("/nonexistent/mem-trace.{pid}.1.txt")),
            pid,
            n: 1,
            kind: kind.to_string(),
            leaks: None,
            svg: None,
            command: None,
        }
    }

    #[test]
    fn a_crash_in_profile_mode_says_no_frees_were_kept() {
        let ended = |signal, profile_mode| Ended {
            program: 10,
            signal: Some(signal),
            ended_first: None,
            profile_mode,
            unfinished: Vec::new(),
        };
        let line = "mem-trace:   this run kept no record of frees (profile mode): if the crash \
                    is a use after free, run with --mode debug to have mem-trace why name the free";
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT] {
            assert_eq!(
                crash_without_frees(&ended(sig, true)).as_deref(),
                Some(line)
            );
            assert_eq!(crash_without_frees(&ended(sig, false)), None);
        }
        assert_eq!(crash_without_frees(&ended(libc::SIGTERM, true)), None);
    }

    #[test]
    fn processes_without_an_exit_report_are_named() {
        let dir = Path::new("/d");
        let ended = Ended {
            program: 10,
            signal: Some(libc::SIGKILL),
            ended_first: None,
            profile_mode: false,
            unfinished: vec![
                Unfinished {
                    pid: 10,
                    running: false,
                },
                Unfinished {
                    pid: 11,
                    running: false,
                },
                Unfinished {
                    pid: 12,
                    running: true,
                },
            ],
        };
        let lines = summary(dir, &[report(13, "at exit")], &[], &ended);
        assert_eq!(
            lines[1..],
            [
                "mem-trace:   exit report of process 13: mem-trace.13.1.txt",
                "mem-trace:   no exit report from process 10 (the program): it was killed by SIGKILL",
                "mem-trace:   no exit report from process 11: it ended without calling exit (killed by a signal, or _exit)",
                "mem-trace:   no exit report from process 12: it is still running",
            ]
        );
        // A final report stands for the exit report; the program killed with no request file left
        // (the library never loaded) is named too.
        let ended = Ended {
            program: 20,
            signal: Some(libc::SIGTERM),
            unfinished: vec![],
            ended_first: None,
            profile_mode: false,
        };
        let lines = summary(
            dir,
            &[report(21, "final"), report(21, "periodic")],
            &[],
            &ended,
        );
        assert_eq!(
            lines[1..],
            [
                "mem-trace:   final report of process 21 (asked for when run was stopped): mem-trace.21.1.txt",
                "mem-trace:   no exit report from process 20 (the program): it was killed by SIGTERM",
                "mem-trace:   1 other report (periodic, snapshot or final), each .txt with its .folded and .svg",
            ]
        );
    }

    #[test]
    fn reports_are_named_by_command_line_and_the_ones_not_kept_are_said() {
        let dir = Path::new("/d");
        let mut r = report(30, "at exit");
        r.command = Some("git upload-pack .".into());
        let drop = |pid, command: &str, verdict| Dropped {
            pid,
            command: Some(command.into()),
            verdict,
        };
        let mut dropped = vec![
            drop(31, "exit_paths nothing", Verdict::Nothing),
            drop(32, "gcc -v", Verdict::NoneSampled),
        ];
        for pid in 40..46 {
            dropped.push(drop(
                pid,
                if pid % 3 == 0 { "cat" } else { "wc -c" },
                Verdict::Small,
            ));
        }
        let ended = Ended {
            program: 31,
            signal: None,
            ended_first: None,
            profile_mode: false,
            unfinished: (50..56)
                .map(|pid| Unfinished {
                    pid,
                    running: false,
                })
                .collect(),
        };
        let lines = summary(dir, &[r], &dropped, &ended);
        assert_eq!(
            lines[1..],
            [
                "mem-trace:   exit report of process 30 (git upload-pack .): mem-trace.30.1.txt",
                "mem-trace:   no report kept for process 31 (exit_paths nothing), the program: it allocated nothing",
                "mem-trace:   no report kept for process 32 (gcc -v): none of its allocations was sampled (MEM_TRACE_SAMPLE): it may have allocated less than the sampling rate",
                "mem-trace:   no report kept for 6 processes that allocated nothing worth one (nothing lost and a peak under 1 MiB; `run --all-reports` keeps them): 4 × wc -c, 2 × cat",
                "mem-trace:   no exit report from 6 processes, which ended without calling exit (killed by a signal, or _exit): 50, 51, 52, 53 and 2 more",
            ]
        );
        // A few are named one by one; nothing kept at all is said first.
        let lines = summary(dir, &[], &dropped[2..4], &Ended::default());
        assert_eq!(
            lines,
            [
                "mem-trace: no report kept in /d: no process allocated anything worth one",
                "mem-trace:   no report kept for process 40 (wc -c): it allocated nothing worth one (nothing lost and a peak under 1 MiB; `run --all-reports` keeps them)",
                "mem-trace:   no report kept for process 41 (wc -c): it allocated nothing worth one (nothing lost and a peak under 1 MiB; `run --all-reports` keeps them)",
            ]
        );
    }

    #[test]
    fn a_signal_to_the_whole_group_is_said_to_have_come_before_the_report() {
        let ended = Ended {
            program: 20,
            signal: Some(libc::SIGTERM),
            unfinished: vec![],
            ended_first: Some(libc::SIGTERM),
            profile_mode: false,
        };
        let lines = summary(Path::new("/d"), &[], &[], &ended);
        assert_eq!(
            lines[1],
            format!(
                "mem-trace:   no exit report from process 20 (the program): it was killed by \
                 SIGTERM, which reached it at the same time as run (sent to the whole process \
                 group, as systemd's default KillMode=control-group does), before run could ask \
                 for its final report: send SIGTERM to run alone (`kill -TERM {}`; systemd: \
                 KillMode=mixed)",
                std::process::id()
            )
        );
    }

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
