//! Fixture-embedded gdb scripts, in the manner of rustc's `tests/debuginfo`.
//!
//! A fixture (C or Rust, anything with `//` comments) carries its own gdb script:
//!
//! ```text
//! void *p = malloc(4001);          // @malloc
//! // gdb-command: break break_here
//! // gdb-command: call mem_trace::print_trace(p_malloc)
//! // gdb-check:   Len: 4001
//! // gdb-check:   at {src}:{line:malloc}:[...]
//! ```
//!
//! * `// gdb-command: X` lines form the script, in file order.
//! * `// gdb-check: Y` lines are matched, in order, against gdb's combined output: each check
//!   must match a later output line than the previous one (extra output lines are allowed).
//!   A check matches a line when, both trimmed, they are equal except that `[...]` in the check
//!   matches any run of characters.
//! * `gdb-command[NAME]:` / `gdb-check[NAME]:` belong to the script called `NAME`; a fixture
//!   may carry several scripts (the unnamed one is `""`).
//! * A marker comment `// @NAME` on a line makes `{line:NAME}` expand to that line's number,
//!   so expectations follow the fixture when it is edited.
//! * `{so}`, `{src}`, `{dir}` and `{bin}` expand to the tracer library, the fixture's source,
//!   the fixture's build directory and the fixture's binary.
//!
//! This module is pure (no processes): the harness's own unit tests live in `tests/harness.rs`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One `gdb-command` or `gdb-check` line, remembered with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// 1-based line number in the fixture.
    pub line: usize,
    /// The text after the colon, trimmed.
    pub text: String,
}

/// The commands and checks of one named script.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Script {
    pub commands: Vec<Directive>,
    pub checks: Vec<Directive>,
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

/// Values substituted for `{so}`, `{src}`, `{dir}` and `{bin}`.
#[derive(Debug, Clone)]
pub struct Substitutions {
    pub so: String,
    pub src: String,
    pub dir: String,
    pub bin: String,
}

const MARKER: &str = "// @";

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
        for (keyword, is_check) in [("gdb-command", false), ("gdb-check", true)] {
            let Some(rest) = comment.strip_prefix(keyword) else {
                continue;
            };
            let (name, rest) = match rest.strip_prefix('[') {
                Some(named) => match named.split_once("]") {
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
                text: body.trim().to_string(),
            };
            let script = scripts.entry(name).or_default();
            if is_check {
                script.checks.push(directive);
            } else {
                script.commands.push(directive);
            }
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
                "{}: no gdb script named {name:?} (it has: {:?})",
                self.path.display(),
                self.scripts.keys().collect::<Vec<_>>()
            )
        })
    }

    /// Expands `{line:NAME}`, `{so}`, `{src}`, `{dir}` and `{bin}` in a directive's text.
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

/// Where the checks stopped matching.
#[derive(Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Index (in the `checks` slice) of the first check with no matching line.
    pub check: usize,
    /// 1-based output line the previous check matched (0: none).
    pub after_line: usize,
}

/// Matches `checks` in order against `output`; each must match a line after the previous one.
pub fn match_checks(output: &str, checks: &[String]) -> Result<(), Mismatch> {
    let lines: Vec<&str> = output.lines().collect();
    let mut next = 0;
    for (index, check) in checks.iter().enumerate() {
        match lines[next..].iter().position(|l| line_matches(l, check)) {
            Some(offset) => next += offset + 1,
            None => {
                return Err(Mismatch {
                    check: index,
                    after_line: next,
                })
            }
        }
    }
    Ok(())
}

/// The explanation printed when a check is missing: cites the fixture line and shows the output.
pub fn describe_mismatch(
    fixture: &FixtureSource,
    script: &Script,
    expanded: &[String],
    mismatch: &Mismatch,
    output: &str,
) -> String {
    let d = &script.checks[mismatch.check];
    let mut msg = format!(
        "{}:{}: gdb-check not found in gdb output after output line {}:\n    check:    {}\n    expanded: {}\n",
        fixture.path.display(),
        d.line,
        mismatch.after_line,
        d.text,
        expanded[mismatch.check],
    );
    if mismatch.check > 0 {
        let prev = &script.checks[mismatch.check - 1];
        let _ = writeln!(
            msg,
            "    (previous check, {}:{}, matched output line {}: {})",
            fixture.path.display(),
            prev.line,
            mismatch.after_line,
            expanded[mismatch.check - 1]
        );
    }
    msg.push_str("----- gdb output (stdout and stderr interleaved), numbered -----\n");
    for (i, line) in output.lines().enumerate() {
        let _ = writeln!(msg, "{:4} | {line}", i + 1);
    }
    msg.push_str("----- end of gdb output -----\n");
    msg
}
