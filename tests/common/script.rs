//! Fixture-embedded expectations, in the manner of rustc's `tests/debuginfo`.
//!
//! A fixture (C, C++ or Rust: anything with `//` comments) carries what the tests do with it
//! and what they expect, as directive comments at its top, code below:
//!
//! ```text
//! // gdb-command: break break_here
//! // gdb-command: call mem_trace::print_trace(p_malloc)
//! // gdb-check:   Len: 4001
//! // gdb-check:   at {src}:{line:malloc}:[...]
//! ...
//! void *p = malloc(4001);          // @malloc
//! ```
//!
//! Two kinds of scripts use them: a gdb session (the fixture's binary under `gdb -batch`) and
//! a direct run of the binary (under the tracer unless said otherwise).
//!
//! gdb sessions:
//! * `// gdb-command: X` lines form the gdb script, in file order.
//! * `// gdb-check: Y` lines are matched, in order, against gdb's combined output (see
//!   *Matching* below).
//! * `// gdb-not: Y` forbids a line (see *Matching*).
//!
//! Direct runs:
//! * `// run-args: A B` gives the program's arguments, split on whitespace (no quoting);
//!   several `run-args` lines add up.
//! * `// run-env: K=V K2=V2` sets environment variables (values without spaces). The run is
//!   under the tracer (`LD_PRELOAD` set to it) unless the fixture sets `LD_PRELOAD` itself:
//!   `run-env: LD_PRELOAD=` runs the program without the tracer.
//! * `// exit-code: 0`, `// exit-code: SIGABRT`, `// exit-code: SIGABRT or SIGSEGV`: how the
//!   run must end, an exit code or a signal that killed it, any of the alternatives. Without
//!   it the run must exit 0.
//! * `// stdout-check: Y`, `// stderr-check: Y` are matched in order against the program's
//!   stdout, its stderr; `// stdout-not: Y`, `// stderr-not: Y` forbid a line.
//! * `// stdout: Y`, `// stderr: Y` give the whole stream, one directive per line: the stream
//!   must have exactly that many lines, each matching its directive.
//!
//! Every directive may be written `KEYWORD[NAME]:` to belong to the script called `NAME`; a
//! fixture may carry several scripts (the unnamed one is `""`). A script is either a gdb
//! session or a direct run, never both. A comment line whose first word is a hyphenated
//! directive keyword, or looks like one followed by `:` or `[` (`gdb-…`, `run-…`, `exit-…`,
//! `stdout…`, `stderr…`), must be a well-formed directive, so a typo is an error rather than a
//! check silently skipped; `stdout` and `stderr` alone are directives only when a colon or a
//! `[NAME]` follows.
//!
//! Matching:
//! * A check matches a line when, both trimmed, they are equal except that `[...]` in the check
//!   matches any run of characters.
//! * `-check` lines match in order: each must match a later line than the previous check of
//!   its stream (extra lines are allowed between and around them).
//! * A `-not` line holds from where it is written to the end of the output: no line after the
//!   one matched by the last `-check` written before it may match it (no line at all when no
//!   check comes before it). So a `-not` before every check forbids the line anywhere;
//!   `stderr-not: [...]` after the last check says nothing follows it, and alone says stderr
//!   is empty.
//!
//! Substitutions, in every directive:
//! * A marker comment `// @NAME` on a line makes `{line:NAME}` expand to that line's number,
//!   so expectations follow the fixture when it is edited.
//! * `{so}`, `{src}`, `{dir}` and `{bin}` expand to the tracer library, the fixture's source,
//!   the fixture's build directory and the fixture's binary.
//!
//! A failed expectation is reported with the fixture's file:line of the directive and the
//! whole output, numbered.
//!
//! This module is pure (no processes): the harness's own unit tests live in `tests/harness.rs`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

/// One directive line, remembered with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// 1-based line number in the fixture.
    pub line: usize,
    /// The keyword, e.g. `gdb-check` or `stderr-not`.
    pub keyword: &'static str,
    /// The text after the colon, trimmed.
    pub text: String,
}

impl Directive {
    /// Whether this is a `-not` directive (forbids a line) rather than a check.
    pub fn forbids(&self) -> bool {
        self.keyword.ends_with("-not")
    }
}

/// What a stream of a direct run must look like.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stream {
    /// `-check` and `-not` directives, in file order.
    pub checks: Vec<Directive>,
    /// `stdout:` / `stderr:` directives: the whole stream, line for line.
    pub lines: Vec<Directive>,
}

/// The directives of one named script.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Script {
    /// `gdb-command`.
    pub commands: Vec<Directive>,
    /// `gdb-check` and `gdb-not`, in file order.
    pub checks: Vec<Directive>,
    /// `run-args`.
    pub args: Vec<Directive>,
    /// `run-env`.
    pub env: Vec<Directive>,
    /// `exit-code`.
    pub exit: Option<Directive>,
    pub stdout: Stream,
    pub stderr: Stream,
}

impl Script {
    /// The first gdb directive and the first direct-run directive, if any.
    fn first_of_each(&self) -> (Option<&Directive>, Option<&Directive>) {
        let gdb = self
            .commands
            .iter()
            .chain(&self.checks)
            .min_by_key(|d| d.line);
        let run = self
            .args
            .iter()
            .chain(&self.env)
            .chain(&self.exit)
            .chain(&self.stdout.checks)
            .chain(&self.stdout.lines)
            .chain(&self.stderr.checks)
            .chain(&self.stderr.lines)
            .min_by_key(|d| d.line);
        (gdb, run)
    }
}

/// Everything the harness reads out of a fixture's comments.
#[derive(Debug, Clone)]
pub struct FixtureSource {
    pub path: PathBuf,
    /// `// @NAME` markers: NAME -> 1-based line number.
    pub markers: HashMap<String, usize>,
    /// Script name (`""` for the unnamed one) -> script.
    pub scripts: BTreeMap<String, Script>,
}

/// Values substituted for `{so}`, `{src}`, `{dir}` and `{bin}` (`{profiler_so}` is built on
/// demand).
#[derive(Debug, Clone)]
pub struct Substitutions {
    pub so: String,
    pub src: String,
    pub dir: String,
    pub bin: String,
}

const MARKER: &str = "// @";

/// Where a directive goes in its script.
#[derive(Clone, Copy)]
enum Slot {
    GdbCommand,
    GdbCheck,
    Args,
    Env,
    Exit,
    StdoutCheck,
    StdoutLine,
    StderrCheck,
    StderrLine,
}

const KEYWORDS: &[(&str, Slot)] = &[
    ("gdb-command", Slot::GdbCommand),
    ("gdb-check", Slot::GdbCheck),
    ("gdb-not", Slot::GdbCheck),
    ("run-args", Slot::Args),
    ("run-env", Slot::Env),
    ("exit-code", Slot::Exit),
    ("stdout-check", Slot::StdoutCheck),
    ("stdout-not", Slot::StdoutCheck),
    ("stdout", Slot::StdoutLine),
    ("stderr-check", Slot::StderrCheck),
    ("stderr-not", Slot::StderrCheck),
    ("stderr", Slot::StderrLine),
];

/// First words that can only be meant as directives: unknown ones are typos.
const DIRECTIVE_PREFIXES: &[&str] = &["gdb-", "run-", "exit-", "stdout", "stderr"];

/// Parses the directives and markers of a fixture.
pub fn parse(path: &Path, text: &str) -> Result<FixtureSource, String> {
    let mut markers = HashMap::new();
    let mut scripts: BTreeMap<String, Script> = BTreeMap::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let here = || format!("{}:{number}", path.display());
        if let Some(at) = line.find(MARKER) {
            let name: String = line[at + MARKER.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
                .collect();
            if name.is_empty() {
                return Err(format!("{}: empty marker name after `{MARKER}`", here()));
            }
            if let Some(previous) = markers.insert(name.clone(), number) {
                return Err(format!(
                    "{}: marker `@{name}` already defined on line {previous}",
                    here()
                ));
            }
        }
        let Some(comment) = line.trim_start().strip_prefix("//") else {
            continue;
        };
        let comment = comment.trim_start();
        let word_len = comment
            .find(|c: char| !(c.is_ascii_lowercase() || c == '-'))
            .unwrap_or(comment.len());
        let (word, rest) = comment.split_at(word_len);
        let known = KEYWORDS.iter().find(|(k, _)| *k == word);
        // `stdout` and `stderr` are also words of prose: only a colon or a name makes them a
        // directive. The hyphenated keywords are never prose, so a missing colon is a typo.
        let prose = !(word.contains('-') || rest.starts_with(':') || rest.starts_with('['));
        let Some(&(keyword, slot)) = known.filter(|_| !prose) else {
            if DIRECTIVE_PREFIXES.iter().any(|p| word.starts_with(p))
                && (rest.starts_with(':') || rest.starts_with('['))
            {
                return Err(format!(
                    "{}: unknown directive `{word}` (known: {})",
                    here(),
                    KEYWORDS
                        .iter()
                        .map(|(k, _)| *k)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            continue;
        };
        let (name, rest) = match rest.strip_prefix('[') {
            Some(named) => match named.split_once(']') {
                Some((name, rest)) => (name.to_string(), rest),
                None => return Err(format!("{}: unterminated `{keyword}[`", here())),
            },
            None => (String::new(), rest),
        };
        let Some(body) = rest.strip_prefix(':') else {
            return Err(format!(
                "{}: expected `{keyword}:` or `{keyword}[name]:`",
                here()
            ));
        };
        let directive = Directive {
            line: number,
            keyword,
            text: body.trim().to_string(),
        };
        let script = scripts.entry(name).or_default();
        match slot {
            Slot::GdbCommand => script.commands.push(directive),
            Slot::GdbCheck => script.checks.push(directive),
            Slot::Args => script.args.push(directive),
            Slot::Env => {
                if let Some(bad) = directive
                    .text
                    .split_whitespace()
                    .find(|w| w.split_once('=').is_none_or(|(k, _)| k.is_empty()))
                {
                    return Err(format!("{}: `{bad}` in run-env is not NAME=VALUE", here()));
                }
                script.env.push(directive);
            }
            Slot::Exit => {
                parse_exit(&directive.text).map_err(|e| format!("{}: {e}", here()))?;
                if let Some(first) = &script.exit {
                    return Err(format!(
                        "{}: a second exit-code (the first is on line {})",
                        here(),
                        first.line
                    ));
                }
                script.exit = Some(directive);
            }
            Slot::StdoutCheck => script.stdout.checks.push(directive),
            Slot::StdoutLine => script.stdout.lines.push(directive),
            Slot::StderrCheck => script.stderr.checks.push(directive),
            Slot::StderrLine => script.stderr.lines.push(directive),
        }
    }
    Ok(FixtureSource {
        path: path.to_path_buf(),
        markers,
        scripts,
    })
}

impl FixtureSource {
    /// The script called `name`, or an error listing the scripts the fixture has.
    pub fn script(&self, name: &str) -> Result<&Script, String> {
        self.scripts.get(name).ok_or_else(|| {
            format!(
                "{}: no script named {name:?} (it has: {:?})",
                self.path.display(),
                self.scripts.keys().collect::<Vec<_>>()
            )
        })
    }

    /// The gdb session called `name`: it has commands and no direct-run directive.
    pub fn gdb_script(&self, name: &str) -> Result<&Script, String> {
        let script = self.script(name)?;
        if let (Some(gdb), Some(run)) = script.first_of_each() {
            return Err(self.mixed(name, gdb, run));
        }
        if script.commands.is_empty() {
            return Err(format!(
                "{}: script {name:?} has no gdb-command",
                self.path.display()
            ));
        }
        Ok(script)
    }

    /// The direct run called `name`: it has no gdb directive.
    pub fn run_script(&self, name: &str) -> Result<&Script, String> {
        let script = self.script(name)?;
        match script.first_of_each() {
            (Some(gdb), Some(run)) => Err(self.mixed(name, gdb, run)),
            (Some(gdb), None) => Err(format!(
                "{}:{}: script {name:?} is a gdb session, not a direct run",
                self.path.display(),
                gdb.line
            )),
            _ => Ok(script),
        }
    }

    fn mixed(&self, name: &str, gdb: &Directive, run: &Directive) -> String {
        format!(
            "{path}: script {name:?} mixes a gdb session ({path}:{}: {}) with a direct run ({path}:{}: {}): give them different names",
            gdb.line,
            gdb.keyword,
            run.line,
            run.keyword,
            path = self.path.display(),
        )
    }

    /// Expands `{line:NAME}`, `{so}`, `{profiler_so}`, `{src}`, `{dir}` and `{bin}` in a
    /// directive's text.
    /// Other braces are left alone (gdb expressions may contain them).
    pub fn substitute(&self, d: &Directive, subs: &Substitutions) -> Result<String, String> {
        let mut out = String::new();
        let mut rest = d.text.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open..];
            let close = after.find('}');
            let token = close.map(|c| &after[1..c]);
            let value = match token {
                Some("so") => Some(subs.so.clone()),
                // Built only when a script asks for it.
                Some("profiler_so") => Some(super::profiler_library().display().to_string()),
                Some("src") => Some(subs.src.clone()),
                Some("dir") => Some(subs.dir.clone()),
                Some("bin") => Some(subs.bin.clone()),
                Some(t) if t.starts_with("line:") => {
                    let name = &t["line:".len()..];
                    match self.markers.get(name) {
                        Some(n) => Some(n.to_string()),
                        None => {
                            return Err(format!(
                            "{}:{}: `{{line:{name}}}` but no line carries the marker `// @{name}`",
                            self.path.display(),
                            d.line
                        ))
                        }
                    }
                }
                _ => None,
            };
            match (value, close) {
                (Some(v), Some(c)) => {
                    out.push_str(&v);
                    rest = &after[c + 1..];
                }
                _ => {
                    out.push('{');
                    rest = &after[1..];
                }
            }
        }
        out.push_str(rest);
        Ok(out)
    }
}

// ----------------------------------------------------------------------------- exit codes

/// One way a run may end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

const SIGNALS: &[(&str, i32)] = &[
    ("SIGABRT", libc::SIGABRT),
    ("SIGBUS", libc::SIGBUS),
    ("SIGFPE", libc::SIGFPE),
    ("SIGILL", libc::SIGILL),
    ("SIGKILL", libc::SIGKILL),
    ("SIGSEGV", libc::SIGSEGV),
    ("SIGTERM", libc::SIGTERM),
    ("SIGTRAP", libc::SIGTRAP),
];

/// Parses an `exit-code` body: alternatives separated by `or`, each a number or a signal name.
pub fn parse_exit(text: &str) -> Result<Vec<Exit>, String> {
    text.split(" or ")
        .map(|alt| {
            let alt = alt.trim();
            if let Ok(code) = alt.parse::<i32>() {
                return Ok(Exit::Code(code));
            }
            SIGNALS
                .iter()
                .find(|(name, _)| *name == alt)
                .map(|&(_, signal)| Exit::Signal(signal))
                .ok_or_else(|| {
                    format!(
                        "exit-code `{alt}` is neither an exit code nor one of {}",
                        SIGNALS
                            .iter()
                            .map(|(n, _)| *n)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        })
        .collect()
}

impl Exit {
    pub fn matches(self, status: ExitStatus) -> bool {
        match self {
            Exit::Code(code) => status.code() == Some(code),
            Exit::Signal(signal) => status.signal() == Some(signal),
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Exit::Code(code) => write!(f, "exit code {code}"),
            Exit::Signal(signal) => match SIGNALS.iter().find(|(_, s)| *s == signal) {
                Some((name, _)) => write!(f, "killed by signal {signal} ({name})"),
                None => write!(f, "killed by signal {signal}"),
            },
        }
    }
}

// ----------------------------------------------------------------------------- matching

/// Whether one output line matches one check (both trimmed; `[...]` matches anything).
pub fn line_matches(line: &str, check: &str) -> bool {
    const WILD: &str = "[...]";
    let line = line.trim();
    let check = check.trim();
    let fragments: Vec<&str> = check.split(WILD).collect();
    // `split` yields the text before the first wildcard and after the last one even when
    // empty, so an anchored check keeps its anchors.
    let (first, last) = (fragments[0], fragments[fragments.len() - 1]);
    if fragments.len() == 1 {
        return line == check;
    }
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    for middle in &fragments[1..fragments.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// An expanded `-check` or `-not`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub text: String,
    /// A `-not`: no line from here on may match.
    pub forbid: bool,
}

impl Check {
    /// A `-check`: a line must match.
    pub fn present(text: impl Into<String>) -> Self {
        Check {
            text: text.into(),
            forbid: false,
        }
    }

    /// A `-not`: no line from here on may match.
    pub fn absent(text: impl Into<String>) -> Self {
        Check {
            text: text.into(),
            forbid: true,
        }
    }
}

/// Where the checks stopped matching.
#[derive(Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Index (in the checks) of the first check that failed.
    pub check: usize,
    /// 1-based output line the previous check matched (0: none).
    pub after_line: usize,
    /// For a `-not`: the 1-based output line that matched what it forbids.
    pub found: Option<usize>,
}

/// Matches `checks` in order against `output`; see the module doc.
pub fn match_stream(output: &str, checks: &[Check]) -> Result<(), Mismatch> {
    let lines: Vec<&str> = output.lines().collect();
    let mut next = 0;
    for (index, check) in checks.iter().enumerate() {
        let position = lines[next..]
            .iter()
            .position(|l| line_matches(l, &check.text));
        match (check.forbid, position) {
            (false, Some(offset)) => next += offset + 1,
            (true, None) => {}
            (false, None) => {
                return Err(Mismatch {
                    check: index,
                    after_line: next,
                    found: None,
                })
            }
            (true, Some(offset)) => {
                return Err(Mismatch {
                    check: index,
                    after_line: next,
                    found: Some(next + offset + 1),
                })
            }
        }
    }
    Ok(())
}

/// Matches `checks`, all of them `-check`s, in order against `output`.
pub fn match_checks(output: &str, checks: &[String]) -> Result<(), Mismatch> {
    let checks: Vec<Check> = checks.iter().map(Check::present).collect();
    match_stream(output, &checks)
}

/// Matches the whole of `output` against `lines`, one for one: `Err(i)` names the first
/// 0-based line that differs, is missing from the output (`i >= output lines`) or is extra
/// (`i >= lines.len()`).
pub fn match_lines(output: &str, lines: &[String]) -> Result<(), usize> {
    let got: Vec<&str> = output.lines().collect();
    for i in 0..got.len().max(lines.len()) {
        match (got.get(i), lines.get(i)) {
            (Some(line), Some(want)) if line_matches(line, want) => {}
            _ => return Err(i),
        }
    }
    Ok(())
}

fn numbered(title: &str, output: &str) -> String {
    let mut msg = format!("----- {title}, numbered -----\n");
    for (i, line) in output.lines().enumerate() {
        let _ = writeln!(msg, "{:4} | {line}", i + 1);
    }
    let _ = writeln!(msg, "----- end of {title} -----");
    msg
}

/// The explanation printed when a `-check` or `-not` fails: cites the fixture line and shows
/// the output (`stream` names it, e.g. `stderr`).
pub fn describe_mismatch(
    fixture: &FixtureSource,
    checks: &[Directive],
    expanded: &[String],
    mismatch: &Mismatch,
    stream: &str,
    output: &str,
) -> String {
    let path = fixture.path.display();
    let d = &checks[mismatch.check];
    let mut msg = match mismatch.found {
        None => format!(
            "{path}:{}: {} not found in {stream} after output line {}:\n    check:    {}\n    expanded: {}\n",
            d.line, d.keyword, mismatch.after_line, d.text, expanded[mismatch.check],
        ),
        Some(found) => format!(
            "{path}:{}: {} matched {stream} line {found}, which it forbids after output line {}:\n    forbidden: {}\n    expanded:  {}\n    line {found}: {}\n",
            d.line,
            d.keyword,
            mismatch.after_line,
            d.text,
            expanded[mismatch.check],
            output.lines().nth(found - 1).unwrap_or_default(),
        ),
    };
    if let Some(prev) = (0..mismatch.check).rev().find(|&i| !checks[i].forbids()) {
        let _ = writeln!(
            msg,
            "    (previous check, {path}:{}, matched output line {}: {})",
            checks[prev].line, mismatch.after_line, expanded[prev]
        );
    }
    msg.push_str(&numbered(stream, output));
    msg
}

/// The explanation printed when a whole-stream match (`stdout:` / `stderr:`) fails at the
/// 0-based output line `index` (see [`match_lines`]).
pub fn describe_lines_mismatch(
    fixture: &FixtureSource,
    lines: &[Directive],
    expanded: &[String],
    index: usize,
    stream: &str,
    output: &str,
) -> String {
    let path = fixture.path.display();
    let got: Vec<&str> = output.lines().collect();
    let mut msg = match (lines.get(index), got.get(index)) {
        (Some(d), Some(line)) => format!(
            "{path}:{}: {stream} line {} differs:\n    expected: {}\n    expanded: {}\n    got:      {line}\n",
            d.line,
            index + 1,
            d.text,
            expanded[index]
        ),
        (Some(d), None) => format!(
            "{path}:{}: {stream} has {} lines, the fixture expects {}: line {} is missing:\n    expected: {}\n    expanded: {}\n",
            d.line,
            got.len(),
            lines.len(),
            index + 1,
            d.text,
            expanded[index]
        ),
        (None, _) => {
            let last = lines.last().map_or(0, |d| d.line);
            format!(
                "{path}:{last}: {stream} has {} lines, the fixture's `{stream}:` lines give {}: line {} is extra:\n    got:      {}\n",
                got.len(),
                lines.len(),
                index + 1,
                got.get(index).unwrap_or(&"")
            )
        }
    };
    msg.push_str(&numbered(stream, output));
    msg
}
