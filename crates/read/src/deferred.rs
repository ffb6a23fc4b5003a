//! Reports whose frames are symbolized after the process that wrote them has gone: under
//! `mem-trace run` (`MEM_TRACE_DEFER_SYMBOLS=1`) the exit and final reports are written with
//! return addresses only, and `run` turns them into the text a report symbolized in process
//! has, with one cache for every process of the run.
//!
//! Symbolizing in the dying process cost each traced process about 50 ms at exit (glibc's
//! debug file decompressed and its units parsed, every time: docs/FINDINGS.md, "The exit
//! report's cost"), enough to make a shell loop of short pipelines 50 times slower. Writing
//! addresses costs well under a millisecond, and the parent parses each debug file once.
//!
//! A raw report is the report's text with these lines, each starting with `@` (no line of a
//! report does):
//!
//! - first, [`FIRST_LINE`], saying what the file is should nothing convert it;
//! - `@cmdline HEX`: the process's `/proc/self/cmdline`, NUL-separated arguments, in hex;
//! - `@module START END BIAS NAME PATH`: a loaded module (hex numbers; its file's name and
//!   path in hex), as the process's unwinder knew it;
//! - `@graph BY TITLE`: the report's flame graph, of `BY` (`live`, `peak`, ...) under `TITLE`;
//! - `@ RA RA ...`: a stack, innermost return address first (hex), where the frames go;
//! - `@hint`: where the line saying how to get names goes, if most frames have none.
//!
//! Its folded stacks (`X.folded`) are raw too: `@ VALUE RA RA ...` lines, and literal lines
//! (`[N other stacks] VALUE`) as they are. The writing side allocates nothing (the library
//! writes it at exit); the converting side is the readers'.

use crate::symbolize::{ModuleRef, SymError, SymFrame, Symbolizer};
use crate::text::{self, FoldedFrame, NamesTally};
use core::fmt::{self, Write};
use std::collections::HashMap;

/// The first line of a raw report.
pub const FIRST_LINE: &str = "mem-trace: raw report: its frames are not symbolized yet \
     (`mem-trace run` symbolizes them once the program has ended)";

const STACK: &str = "@ ";
const MODULE: &str = "@module ";
const CMDLINE: &str = "@cmdline ";
const GRAPH: &str = "@graph ";
const HINT: &str = "@hint";

/// Writes [`FIRST_LINE`].
pub fn write_first_line(out: &mut impl Write) -> fmt::Result {
    writeln!(out, "{FIRST_LINE}")
}

fn write_hex(out: &mut impl Write, bytes: &[u8]) -> fmt::Result {
    if bytes.is_empty() {
        return out.write_char('-');
    }
    for b in bytes {
        write!(out, "{b:02x}")?;
    }
    Ok(())
}

/// The process's command line, `/proc/self/cmdline`'s bytes.
pub fn write_cmdline(out: &mut impl Write, cmdline: &[u8]) -> fmt::Result {
    out.write_str(CMDLINE)?;
    write_hex(out, cmdline)?;
    writeln!(out)
}

/// A loaded module: its executable range, load bias, file name and path.
pub fn write_module(
    out: &mut impl Write,
    range: (u64, u64),
    bias: u64,
    name: &[u8],
    path: &[u8],
) -> fmt::Result {
    write!(out, "{MODULE}{:x} {:x} {bias:x} ", range.0, range.1)?;
    write_hex(out, name)?;
    out.write_char(' ')?;
    write_hex(out, path)?;
    writeln!(out)
}

/// The report's flame graph: what it counts (`by`) and its title, one line of text.
pub fn write_graph(out: &mut impl Write, by: &str, title: &str) -> fmt::Result {
    writeln!(out, "{GRAPH}{by} {title}")
}

/// A stack of the report (not empty), innermost return address first.
pub fn write_stack(out: &mut impl Write, frames: &[u64]) -> fmt::Result {
    out.write_char('@')?;
    for ra in frames {
        write!(out, " {ra:x}")?;
    }
    writeln!(out)
}

/// A stack's line of folded stacks, with its value.
pub fn write_folded_stack(out: &mut impl Write, frames: &[u64], value: u64) -> fmt::Result {
    write!(out, "@ {value}")?;
    for ra in frames {
        write!(out, " {ra:x}")?;
    }
    writeln!(out)
}

/// Where the names hint goes.
pub fn write_hint(out: &mut impl Write) -> fmt::Result {
    writeln!(out, "{HINT}")
}

/// Whether `text` is a raw report.
pub fn is_raw(text: &str) -> bool {
    text.lines().next() == Some(FIRST_LINE)
}

/// The report's own text in a raw report, after the lines of its head ([`FIRST_LINE`] and
/// those that say what its process was); `raw` itself if it is not one.
pub fn body(raw: &str) -> &str {
    let Some(mut rest) = raw
        .strip_prefix(FIRST_LINE)
        .and_then(|r| r.strip_prefix('\n'))
    else {
        return raw;
    };
    while [MODULE, CMDLINE, GRAPH].iter().any(|p| rest.starts_with(p)) {
        rest = rest.split_once('\n').map_or("", |(_, r)| r);
    }
    rest
}

/// The `argv` a raw report's head carries.
pub fn argv(raw: &str) -> Option<Vec<Vec<u8>>> {
    let line = raw
        .lines()
        .take_while(|l| l.starts_with('@') || *l == FIRST_LINE)
        .find_map(|l| l.strip_prefix(CMDLINE))?;
    unhex(line).map(|b| split_args(&b))
}

/// A raw report made into the text of a symbolized one.
#[derive(Debug, Default)]
pub struct Converted {
    /// The report, as written in process.
    pub text: String,
    /// Its folded stacks, if it had any.
    pub folded: Option<String>,
    /// The process's arguments (`argv`), if the report carried them.
    pub argv: Option<Vec<Vec<u8>>>,
    /// The flame graph to draw: what it counts, and its title.
    pub graph: Option<(String, String)>,
}

/// A module of one raw report.
#[derive(Debug, Clone)]
struct Module {
    start: u64,
    end: u64,
    bias: u64,
    name: Vec<u8>,
    path: Vec<u8>,
}

/// The symbolizer and every answer it gave, across the reports of a run: the processes of one
/// run load the same files, each parsed once.
#[derive(Default)]
pub struct Cache {
    symbolizer: Symbolizer,
    /// By module path and address in the file: the frames, or why there are none.
    frames: HashMap<(Vec<u8>, u64), Result<Vec<SymFrame>, SymError>>,
}

impl Cache {
    /// An empty cache.
    pub fn new() -> Self {
        Cache::default()
    }

    fn frames(&mut self, m: &Module, probe: u64) -> Result<Vec<SymFrame>, SymError> {
        // `/proc/self/exe` (the process could not resolve its own path) would be our own.
        if m.path.starts_with(b"/proc/self/") {
            return Err(SymError::NoFile);
        }
        let key = (m.path.clone(), probe.wrapping_sub(m.bias));
        if let Some(known) = self.frames.get(&key) {
            return known.clone();
        }
        let module = ModuleRef {
            path: &m.path,
            bias: m.bias,
            start: m.start,
            end: m.end,
        };
        let mut found = Vec::new();
        let answer = self
            .symbolizer
            .symbolize(&module, probe, &mut found)
            .and_then(|()| {
                (!found.is_empty())
                    .then_some(found)
                    .ok_or(SymError::NoSymbol)
            });
        self.frames.insert(key, answer.clone());
        answer
    }
}

/// Why a raw report could not be converted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The report `raw` (and its folded stacks `folded`), symbolized with `cache`.
pub fn convert(raw: &str, folded: Option<&str>, cache: &mut Cache) -> Result<Converted, Malformed> {
    let mut lines = raw.lines();
    if lines.next() != Some(FIRST_LINE) {
        return Err(Malformed("not a raw report".into()));
    }
    let mut c = Converted::default();
    let mut modules = Vec::new();
    let mut tally = NamesTally::default();
    let mut body = Vec::new();
    for (i, line) in lines.enumerate() {
        let bad = |what: &str| Malformed(format!("line {}: {what}: {line:?}", i + 2));
        if let Some(rest) = line.strip_prefix(MODULE) {
            modules.push(parse_module(rest).ok_or_else(|| bad("bad module"))?);
        } else if let Some(rest) = line.strip_prefix(CMDLINE) {
            let bytes = unhex(rest).ok_or_else(|| bad("bad command line"))?;
            c.argv = Some(split_args(&bytes));
        } else if let Some(rest) = line.strip_prefix(GRAPH) {
            let (by, title) = rest.split_once(' ').unwrap_or((rest, ""));
            c.graph = Some((by.to_string(), title.to_string()));
        } else {
            body.push((i, line));
        }
    }
    modules.sort_by_key(|m| m.start);
    let set = Modules(modules);
    let mut text = String::with_capacity(raw.len() * 2);
    for (i, line) in body {
        if line == HINT {
            let _ = tally.write_hint(&mut text);
        } else if let Some(rest) = line.strip_prefix(STACK).or((line == "@").then_some("")) {
            let frames = parse_addresses(rest)
                .ok_or_else(|| Malformed(format!("line {}: bad stack: {line:?}", i + 2)))?;
            let _ = write_stack_text(&mut text, &frames, &set, cache, &mut tally);
        } else {
            text.push_str(line);
            text.push('\n');
        }
    }
    c.text = text;
    if let Some(folded) = folded {
        let mut out = String::with_capacity(folded.len() * 4);
        for (i, line) in folded.lines().enumerate() {
            let Some(rest) = line.strip_prefix(STACK) else {
                out.push_str(line);
                out.push('\n');
                continue;
            };
            let bad = || Malformed(format!("folded line {}: {line:?}", i + 1));
            let (value, ras) = rest.split_once(' ').unwrap_or((rest, ""));
            let value: u64 = value.parse().map_err(|_| bad())?;
            let frames = parse_addresses(ras).ok_or_else(bad)?;
            let _ = write_folded_line(&mut out, &frames, value, &set, cache);
        }
        c.folded = Some(out);
    }
    Ok(c)
}

/// The modules of one report, sorted by start.
struct Modules(Vec<Module>);

impl Modules {
    fn find(&self, pc: u64) -> Option<&Module> {
        let i = self.0.partition_point(|m| m.start <= pc);
        let m = self.0.get(i.checked_sub(1)?)?;
        (pc < m.end).then_some(m)
    }
}

/// Each return address of `frames` with what it symbolized to (several frames for inlined
/// code; `None`: nothing named it, or the cut marker).
fn symbolize_all(
    frames: &[u64],
    set: &Modules,
    cache: &mut Cache,
    mut tally: Option<&mut NamesTally>,
) -> Vec<(u64, Option<SymFrame>)> {
    let mut all = Vec::new();
    for &ra in frames {
        if text::is_cut_marker(ra) {
            all.push((ra, None));
            continue;
        }
        // Return addresses point after the call; the call itself is one byte earlier.
        let probe = ra.saturating_sub(1);
        let module = set.find(probe);
        let found = module.and_then(|m| cache.frames(m, probe).ok());
        if let Some(t) = tally.as_deref_mut() {
            t.note(found.is_some(), module.map(|m| &m.name[..]));
        }
        match found {
            Some(found) => all.extend(found.into_iter().map(|f| (ra, Some(f)))),
            None => all.push((ra, None)),
        }
    }
    all
}

/// The frame lines of one stack, as the library writes them in process
/// (`crates/core/src/report/frames.rs`).
fn write_stack_text(
    out: &mut String,
    frames: &[u64],
    set: &Modules,
    cache: &mut Cache,
    tally: &mut NamesTally,
) -> fmt::Result {
    if frames.is_empty() {
        return writeln!(out, "   (no stack recorded)");
    }
    let all = symbolize_all(frames, set, cache, Some(tally));
    for (n, (ra, f)) in all.iter().enumerate() {
        match f {
            Some(f) => text::write_frame(out, n, *ra, f)?,
            None if text::is_cut_marker(*ra) => text::write_cut(out)?,
            None => {
                let module = set
                    .find(ra.saturating_sub(1))
                    .map(|m| (&m.name[..], m.bias));
                text::write_raw_frame(out, n, *ra, module)?
            }
        }
    }
    Ok(())
}

fn write_folded_line(
    out: &mut String,
    frames: &[u64],
    value: u64,
    set: &Modules,
    cache: &mut Cache,
) -> fmt::Result {
    let all = symbolize_all(frames, set, cache, None);
    let named = all.iter().map(|(ra, sym)| FoldedFrame {
        ra: *ra,
        symbol: sym.as_ref(),
        module: set
            .find(ra.saturating_sub(1))
            .map(|m| (&m.name[..], m.bias)),
    });
    text::write_folded(out, named, value)
}

fn parse_module(rest: &str) -> Option<Module> {
    let mut it = rest.split(' ');
    let mut num = || u64::from_str_radix(it.next()?, 16).ok();
    let (start, end, bias) = (num()?, num()?, num()?);
    let name = unhex(it.next()?)?;
    let path = unhex(it.next()?)?;
    Some(Module {
        start,
        end,
        bias,
        name,
        path,
    })
}

fn parse_addresses(s: &str) -> Option<Vec<u64>> {
    s.split_ascii_whitespace()
        .map(|w| u64::from_str_radix(w, 16).ok())
        .collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s == "-" {
        return Some(Vec::new());
    }
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `argv` from `/proc/PID/cmdline`'s NUL-separated (and NUL-terminated) bytes.
pub fn split_args(bytes: &[u8]) -> Vec<Vec<u8>> {
    let bytes = bytes.strip_suffix(b"\0").unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes.split(|&b| b == 0).map(<[u8]>::to_vec).collect()
}

#[cfg(test)]
mod tests;
