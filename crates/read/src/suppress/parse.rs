//! Reading suppression files: valgrind's blocks and LeakSanitizer's `type:pattern` lines,
//! told apart line by line (a file holds one kind or the other). Only what concerns leaks is
//! kept: memcheck's other kinds (`Memcheck:Addr4`, `Memcheck:Param` ...) and LSan's other
//! types (`called_from_lib:` ...) are read, checked and left out.

use super::rules::{FramePattern, LeakKind, Rule, Suppression};
use std::fmt;

/// A line that is no suppression, named by file and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// The leak suppressions of the file `name`, whose text is `text`.
pub fn parse(name: &str, text: &str) -> Result<Vec<Suppression>, ParseError> {
    let mut out = Vec::new();
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let error = |line, message: String| ParseError {
        file: name.to_string(),
        line,
        message,
    };
    while let Some((n, line)) = lines.next() {
        if line == "{" {
            if let Some(s) = valgrind_block(name, n, &mut lines).map_err(|(l, m)| error(l, m))? {
                out.push(s);
            }
            continue;
        }
        let Some((kind, pattern)) = line.split_once(':') else {
            return Err(error(
                n,
                format!("`{line}` is neither a valgrind suppression (`{{ ... }}`) nor LeakSanitizer's `leak:PATTERN`"),
            ));
        };
        if kind.is_empty() || !kind.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(error(
                n,
                format!("`{kind}` is no LeakSanitizer suppression type"),
            ));
        }
        if kind == "leak" {
            out.push(Suppression {
                name: pattern.trim().to_string(),
                source: format!("{name}:{n}"),
                rule: Rule::Lsan(pattern.trim().to_string()),
            });
        }
    }
    Ok(out)
}

/// The rest of a valgrind block whose `{` was line `start`; `None` for one that is not
/// memcheck's leak suppression.
fn valgrind_block<'t>(
    file: &str,
    start: usize,
    lines: &mut impl Iterator<Item = (usize, &'t str)>,
) -> Result<Option<Suppression>, (usize, String)> {
    let unclosed = || {
        (
            start,
            "a suppression opened here is never closed with `}`".to_string(),
        )
    };
    let (_, name) = lines.next().ok_or_else(unclosed)?;
    let (n, kind_line) = lines.next().ok_or_else(unclosed)?;
    let Some((tools, kind)) = kind_line.split_once(':') else {
        return Err((
            n,
            format!("`{kind_line}` names no tool and kind (`Memcheck:Leak`)"),
        ));
    };
    let leak = tools.split(',').any(|t| t.trim() == "Memcheck") && kind.trim() == "Leak";
    let mut kinds = LeakKind::ALL.to_vec();
    let mut frames = Vec::new();
    for (n, line) in lines.by_ref() {
        if line == "}" {
            return Ok(leak.then(|| Suppression {
                name: name.to_string(),
                source: format!("{file}:{start}"),
                rule: Rule::Valgrind { kinds, frames },
            }));
        }
        if let Some(list) = line.strip_prefix("match-leak-kinds:") {
            kinds = leak_kinds(list).map_err(|e| (n, e))?;
        } else if line == "..." {
            frames.push(FramePattern::Any);
        } else if let Some(p) = line.strip_prefix("fun:") {
            frames.push(FramePattern::Fun(p.to_string()));
        } else if let Some(p) = line.strip_prefix("obj:") {
            frames.push(FramePattern::Obj(p.to_string()));
        } else if line.starts_with("src:") {
            // A source line: not kept by a leak's stack here; such a suppression matches no
            // leak rather than too many.
            frames.push(FramePattern::Fun(String::new()));
        } else if leak || !frames.is_empty() {
            // Other kinds have one line of their own before the frames (`Param`'s `write(buf)`).
            return Err((n, format!("`{line}` is no frame (`fun:`, `obj:`, `...`)")));
        }
    }
    Err(unclosed())
}

/// memcheck's `match-leak-kinds:` list.
fn leak_kinds(list: &str) -> Result<Vec<LeakKind>, String> {
    let mut kinds = Vec::new();
    for word in list.split(',').map(str::trim) {
        match word {
            "all" => kinds.extend(LeakKind::ALL),
            "none" => {}
            _ => match LeakKind::ALL.into_iter().find(|k| k.name() == word) {
                Some(k) => kinds.push(k),
                None => {
                    return Err(format!(
                    "`{word}` is no leak kind (definite, indirect, possible, reachable, all, none)"
                ))
                }
            },
        }
    }
    Ok(kinds)
}
