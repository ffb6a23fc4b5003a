//! The frame lines every report prints, in the seed's format:
//!
//! ```text
//!    0: new_order
//!              at /work/main/examples/demo.c:14:23
//!    1: 0x7f0012345678 (libfoo.so+0x1678)
//! ```
//!
//! and the folded stacks flame graphs are drawn from (one line a stack, outermost frame first,
//! then the stack's count), written by the profiler's reports and by `mem-trace flamegraph`
//! through the same [`write_folded`]:
//!
//! ```text
//! main;sites;hold_site 67108864
//! ```
//!
//! Writing never allocates, so the same functions serve a process that gdb stopped.

use crate::symbolize::SymFrame;
use core::fmt::{self, Write};
use mem_trace_format::CUT_MARKER;

/// What a stack cut by the cap on distinct stacks shows in place of its last frame, the
/// marker (docs/LAYOUT.md "Stack store"), in every report and answer.
pub const CUT_TEXT: &str =
    "(stack cut: the cap on distinct stacks, MEM_TRACE_MAX_STACKS, was reached)";

/// The name a folded line gives the marker of a cut stack: the root of every cut stack in a
/// flame graph.
pub const CUT_FOLDED: &str = "[stack cut: MEM_TRACE_MAX_STACKS]";

/// Whether return address `ra` is the marker that ends a cut stack (never symbolize it).
pub fn is_cut_marker(ra: u64) -> bool {
    ra == CUT_MARKER
}

/// The line that stands for the marker of a cut stack among frame lines.
pub fn write_cut(out: &mut impl Write) -> fmt::Result {
    writeln!(out, "   {CUT_TEXT}")
}

/// Frame `n`, return address `ra`, symbolized as `f` (an inlined frame says so).
pub fn write_frame(out: &mut impl Write, n: usize, ra: u64, f: &SymFrame) -> fmt::Result {
    match &f.function {
        Some(name) => write!(out, "{n:4}: {name}")?,
        None => write!(out, "{n:4}: {ra:#x}")?,
    }
    if f.inlined {
        write!(out, " (inlined)")?;
    }
    writeln!(out)?;
    if let Some(file) = &f.file {
        match (f.line, f.column) {
            (0, _) => writeln!(out, "             at {file}")?,
            (l, 0) => writeln!(out, "             at {file}:{l}")?,
            (l, c) => writeln!(out, "             at {file}:{l}:{c}")?,
        }
    }
    Ok(())
}

/// Frame `n` unsymbolized: the address, and `file+offset` within the module (its path and
/// load bias) when one holds it.
pub fn write_raw_frame(
    out: &mut impl Write,
    n: usize,
    ra: u64,
    module: Option<(&[u8], u64)>,
) -> fmt::Result {
    match module {
        Some((path, bias)) => {
            let base = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
            let base = core::str::from_utf8(base).unwrap_or("?");
            writeln!(out, "{n:4}: {ra:#x} ({base}+{:#x})", ra - bias)
        }
        None => writeln!(out, "{n:4}: {ra:#x}"),
    }
}

/// One frame of a stack as a folded line names it: by its function when one is known, else by
/// `file+offset` within the module holding `ra` (its path and load bias), else by address.
#[derive(Clone, Copy, Debug)]
pub struct FoldedFrame<'a> {
    /// The return address the frame comes from (an inlined frame shares its caller's).
    pub ra: u64,
    /// What symbolizing `ra` gave for this frame, if anything.
    pub symbol: Option<&'a SymFrame>,
    /// The module holding `ra`: its path and load bias.
    pub module: Option<(&'a [u8], u64)>,
}

/// The name a folded line gives a stack that was recorded without frames.
pub const NO_STACK: &str = "[no stack recorded]";

/// One line of folded stacks: `frames` as stored (innermost first, as reports print them)
/// written outermost first, `;` between frames, then a space and `value`. Frame names are kept
/// to what the format can carry: a `;` (which would split the frame) becomes `:`, and a line
/// break a space. No frames at all: [`NO_STACK`].
pub fn write_folded<'a>(
    out: &mut impl Write,
    frames: impl DoubleEndedIterator<Item = FoldedFrame<'a>>,
    value: u64,
) -> fmt::Result {
    if !write_folded_names(out, frames)? {
        out.write_str(NO_STACK)?;
    }
    writeln!(out, " {value}")
}

/// The frames' part of a folded line ([`write_folded`]): `frames` outermost first, `;`
/// between them; whether there was any. Written once per frame, it can be reused in every
/// line the frame is in.
pub fn write_folded_names<'a>(
    out: &mut impl Write,
    frames: impl DoubleEndedIterator<Item = FoldedFrame<'a>>,
) -> Result<bool, fmt::Error> {
    let mut any = false;
    for f in frames.rev() {
        if any {
            out.write_char(';')?;
        }
        any = true;
        let mut name = FoldedName(out);
        if is_cut_marker(f.ra) {
            name.write_str(CUT_FOLDED)?;
            continue;
        }
        match (f.symbol.and_then(|s| s.function.as_deref()), f.module) {
            (Some(function), _) => name.write_str(function)?,
            (None, Some((path, bias))) => {
                let base = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
                let base = core::str::from_utf8(base).unwrap_or("?");
                write!(name, "{base}+{:#x}", f.ra.wrapping_sub(bias))?
            }
            (None, None) => write!(name, "{:#x}", f.ra)?,
        }
    }
    Ok(any)
}

/// Writes a frame name with the characters a folded line cannot carry replaced.
struct FoldedName<'w, W: Write>(&'w mut W);

impl<W: Write> Write for FoldedName<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for part in s.split_inclusive([';', '\n', '\r']) {
            match part.char_indices().last() {
                Some((i, ';')) => {
                    self.0.write_str(&part[..i])?;
                    self.0.write_char(':')?
                }
                Some((i, '\n' | '\r')) => {
                    self.0.write_str(&part[..i])?;
                    self.0.write_char(' ')?
                }
                _ => self.0.write_str(part)?,
            }
        }
        Ok(())
    }
}

/// How many frames an output showed and how many had no name, and the first few modules
/// those were in: for the one line ([`NamesTally::write_hint`]) that says how to get names
/// when most frames have none. Fixed size, so the in-process reports keep it without
/// allocating.
#[derive(Clone, Copy, Debug, Default)]
pub struct NamesTally {
    /// Frames shown.
    pub frames: u64,
    /// Of them, frames no debug info or symbol named (`module+0xoffset`).
    pub unnamed: u64,
    modules: [ModuleName; NamesTally::MODULES],
    /// Modules noted; past [`NamesTally::MODULES`] only counted.
    modules_seen: usize,
    /// Whether a module without names lies where the system's packages put files, and
    /// whether one lies elsewhere (`/usr/local`, a home, a build tree): a package's debug
    /// symbols come from its -dbgsym package, the others' from building with `-g`.
    packaged: bool,
    own: bool,
}

/// Whether `path` lies where a distribution's packages install files (`/usr` but
/// `/usr/local`, `/lib*`, `/bin`, `/sbin`).
fn installed_by_a_package(path: &[u8]) -> bool {
    (path.starts_with(b"/usr/") && !path.starts_with(b"/usr/local/"))
        || path.starts_with(b"/lib")
        || path.starts_with(b"/bin/")
        || path.starts_with(b"/sbin/")
}

/// A module's file name, cut to what a hint line needs.
#[derive(Clone, Copy, Debug)]
struct ModuleName {
    bytes: [u8; 48],
    len: u8,
}

impl Default for ModuleName {
    fn default() -> Self {
        ModuleName {
            bytes: [0; 48],
            len: 0,
        }
    }
}

impl ModuleName {
    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl NamesTally {
    /// Modules a hint names; more are summed up as "and N more".
    pub const MODULES: usize = 4;

    /// Counts one frame shown: named, or not and in the module at `path` (if any).
    pub fn note(&mut self, named: bool, path: Option<&[u8]>) {
        self.frames += 1;
        if named {
            return;
        }
        self.unnamed += 1;
        let Some(path) = path else { return };
        match installed_by_a_package(path) {
            true => self.packaged = true,
            false => self.own = true,
        }
        let base = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
        let base = &base[..base.len().min(48)];
        let kept = self.modules_seen.min(Self::MODULES);
        if self.modules[..kept].iter().any(|m| m.as_bytes() == base) {
            return;
        }
        if kept < Self::MODULES {
            let m = &mut self.modules[kept];
            m.bytes[..base.len()].copy_from_slice(base);
            m.len = base.len() as u8;
        }
        self.modules_seen += 1;
    }

    /// Whether most frames shown had no name.
    pub fn mostly_unnamed(&self) -> bool {
        self.unnamed * 2 > self.frames
    }

    /// One line, when most frames had no name, saying which modules lack symbols and how a
    /// Debian-like system gets them; nothing otherwise.
    pub fn write_hint(&self, out: &mut impl Write) -> fmt::Result {
        if !self.mostly_unnamed() {
            return Ok(());
        }
        write!(
            out,
            "mem-trace: {} of {} frames have no name; install the debug symbols of ",
            self.unnamed, self.frames
        )?;
        let kept = self.modules_seen.min(Self::MODULES);
        for (i, m) in self.modules[..kept].iter().enumerate() {
            if i > 0 {
                out.write_str(", ")?;
            }
            for chunk in m.as_bytes().utf8_chunks() {
                out.write_str(chunk.valid())?;
                if !chunk.invalid().is_empty() {
                    out.write_char(char::REPLACEMENT_CHARACTER)?;
                }
            }
        }
        if self.modules_seen > kept {
            write!(out, " and {} more", self.modules_seen - kept)?;
        }
        const PACKAGED: &str = "Debian: the -dbgsym package of the package `dpkg -S FILE` names";
        const OWN: &str = "built here: build with -g, and keep the debug files";
        match (self.packaged, self.own) {
            (true, true) => writeln!(out, " ({PACKAGED}; {OWN})"),
            (false, true) => writeln!(out, " ({OWN})"),
            _ => writeln!(out, " ({PACKAGED})"),
        }
    }
}

/// Text the traced process wrote (a thread's name), in double quotes, with what a terminal
/// would act on or hide escaped, as the gdb side's `quoted` does: a newline would forge a line
/// of the answer, an escape sequence would drive the terminal, a quote would end the name
/// early. Python escapes every character `str.isprintable()` rejects; without Unicode's
/// tables, this escapes controls, separators other than the space, format characters and
/// private use ones, and keeps unassigned code points (Python escapes those). Writes without
/// allocating, so the in-process reports use it too.
pub struct Quoted<'a>(pub &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_quoted(f, self.0.chars())
    }
}

/// Bytes the traced process wrote, decoded as `String::from_utf8_lossy` does (each invalid
/// sequence one U+FFFD, as the readers decode a thread's name), then shown as [`Quoted`].
pub struct QuotedBytes<'a>(pub &'a [u8]);

impl fmt::Display for QuotedBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let chars = self.0.utf8_chunks().flat_map(|chunk| {
            let bad = (!chunk.invalid().is_empty()).then_some(char::REPLACEMENT_CHARACTER);
            chunk.valid().chars().chain(bad)
        });
        write_quoted(f, chars)
    }
}

fn write_quoted(f: &mut impl Write, chars: impl Iterator<Item = char>) -> fmt::Result {
    f.write_char('"')?;
    for ch in chars {
        match ch {
            '\\' => f.write_str("\\\\")?,
            '"' => f.write_str("\\\"")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            c if printable(c) => f.write_char(c)?,
            c if (c as u32) < 0x100 => write!(f, "\\x{:02x}", c as u32)?,
            c if (c as u32) < 0x10000 => write!(f, "\\u{:04x}", c as u32)?,
            c => write!(f, "\\U{:08x}", c as u32)?,
        }
    }
    f.write_char('"')
}

/// Python's `str.isprintable()`, but for unassigned code points (see [`Quoted`]).
fn printable(c: char) -> bool {
    const FORMAT: &[(u32, u32)] = &[
        (0xAD, 0xAD),
        (0x600, 0x605),
        (0x61C, 0x61C),
        (0x6DD, 0x6DD),
        (0x70F, 0x70F),
        (0x890, 0x891),
        (0x8E2, 0x8E2),
        (0x180E, 0x180E),
        (0x200B, 0x200F),
        (0x202A, 0x202E),
        (0x2060, 0x2064),
        (0x2066, 0x206F),
        (0xFEFF, 0xFEFF),
        (0xFFF9, 0xFFFB),
        (0x110BD, 0x110BD),
        (0x110CD, 0x110CD),
        (0x13430, 0x1343F),
        (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A),
        (0xE0001, 0xE0001),
        (0xE0020, 0xE007F),
    ];
    const PRIVATE: &[(u32, u32)] = &[(0xE000, 0xF8FF), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD)];
    let code = c as u32;
    let within = |ranges: &[(u32, u32)]| ranges.iter().any(|&(lo, hi)| lo <= code && code <= hi);
    c == ' ' || !(c.is_control() || c.is_whitespace() || within(FORMAT) || within(PRIVATE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_with_what_a_terminal_acts_on_escaped() {
        assert_eq!(
            Quoted("a\nb\x1b[31m\"\\\t\x7f\u{202e}\0").to_string(),
            "\"a\\nb\\x1b[31m\\\"\\\\\\t\\x7f\\u202e\\x00\""
        );
        assert_eq!(Quoted("wörker ✓").to_string(), "\"wörker ✓\"");
        assert_eq!(Quoted("\u{fffd}").to_string(), "\"\u{fffd}\"");
        assert_eq!(
            Quoted("a\u{2028}b\u{e000}").to_string(),
            "\"a\\u2028b\\ue000\""
        );
        assert_eq!(Quoted("\u{e0041}").to_string(), "\"\\U000e0041\"");
    }

    fn frame(function: Option<&str>, file: Option<&str>, line: u32, column: u32) -> SymFrame {
        SymFrame {
            function: function.map(String::from),
            file: file.map(String::from),
            line,
            column,
            inlined: false,
        }
    }

    #[test]
    fn lines_in_the_seed_format() {
        let mut s = String::new();
        write_frame(
            &mut s,
            0,
            0x1234,
            &frame(Some("main"), Some("/a/b.c"), 14, 23),
        )
        .unwrap();
        let mut inl = frame(Some("helper"), Some("/a/b.c"), 3, 0);
        inl.inlined = true;
        write_frame(&mut s, 1, 0x1234, &inl).unwrap();
        write_frame(&mut s, 2, 0x5678, &frame(None, Some("/a/c.c"), 0, 0)).unwrap();
        write_raw_frame(
            &mut s,
            3,
            0x7f00_0000_1678,
            Some((b"/usr/lib/libfoo.so", 0x7f00_0000_0000)),
        )
        .unwrap();
        write_raw_frame(&mut s, 4, 0x10, None).unwrap();
        assert_eq!(
            s,
            "   0: main\n             at /a/b.c:14:23\n\
             \x20  1: helper (inlined)\n             at /a/b.c:3\n\
             \x20  2: 0x5678\n             at /a/c.c\n\
             \x20  3: 0x7f0000001678 (libfoo.so+0x1678)\n\
             \x20  4: 0x10\n"
        );
    }

    #[test]
    fn a_cut_stack_shows_one_line_for_its_marker() {
        let mut s = String::new();
        write_frame(&mut s, 0, 0x1234, &frame(Some("site"), None, 0, 0)).unwrap();
        write_cut(&mut s).unwrap();
        assert_eq!(
            s,
            "   0: site\n   (stack cut: the cap on distinct stacks, MEM_TRACE_MAX_STACKS, was reached)\n"
        );
        let site = frame(Some("site"), None, 0, 0);
        let frames = [
            FoldedFrame {
                ra: 0x1234,
                symbol: Some(&site),
                module: None,
            },
            FoldedFrame {
                ra: CUT_MARKER,
                symbol: None,
                module: None,
            },
        ];
        let mut line = String::new();
        write_folded(&mut line, frames.into_iter(), 5).unwrap();
        assert_eq!(line, "[stack cut: MEM_TRACE_MAX_STACKS];site 5\n");
        assert!(is_cut_marker(CUT_MARKER) && !is_cut_marker(0x1234));
    }

    #[test]
    fn folded_lines_go_outermost_first_and_carry_only_frame_names() {
        let inner = frame(Some("hold_site"), Some("/a/b.c"), 3, 4);
        let mut inlined = frame(Some("helper<a;b>"), None, 0, 0);
        inlined.inlined = true;
        let outer = frame(Some("main"), None, 0, 0);
        let lib: &[u8] = b"/usr/lib/libfoo.so";
        let frames = [
            FoldedFrame {
                ra: 0x10,
                symbol: Some(&inner),
                module: None,
            },
            FoldedFrame {
                ra: 0x7f00_0000_1678,
                symbol: None,
                module: Some((lib, 0x7f00_0000_0000)),
            },
            FoldedFrame {
                ra: 0x20,
                symbol: Some(&inlined),
                module: None,
            },
            FoldedFrame {
                ra: 0x20,
                symbol: Some(&outer),
                module: None,
            },
            FoldedFrame {
                ra: 0x30,
                symbol: Some(&frame(None, Some("/a/c.c"), 1, 0)),
                module: None,
            },
        ];
        let mut s = String::new();
        write_folded(&mut s, frames.iter().copied(), 67108864).unwrap();
        write_folded(&mut s, [].into_iter(), 5).unwrap();
        let mut odd = frame(Some("a\nb\rc;d"), None, 0, 0);
        odd.line = 1;
        write_folded(
            &mut s,
            [FoldedFrame {
                ra: 1,
                symbol: Some(&odd),
                module: None,
            }]
            .into_iter(),
            0,
        )
        .unwrap();
        assert_eq!(
            s,
            "0x30;main;helper<a:b>;libfoo.so+0x1678;hold_site 67108864\n\
             [no stack recorded] 5\n\
             a b c:d 0\n"
        );
    }

    #[test]
    fn a_hint_only_when_most_frames_have_no_name() {
        let mut t = NamesTally::default();
        t.note(true, None);
        t.note(
            false,
            Some(b"/usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6"),
        );
        let mut s = String::new();
        t.write_hint(&mut s).unwrap();
        assert_eq!(s, "", "half is not most");
        t.note(false, Some(b"/usr/bin/sqlite3"));
        t.note(
            false,
            Some(b"/usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6"),
        );
        t.write_hint(&mut s).unwrap();
        assert_eq!(
            s,
            "mem-trace: 3 of 4 frames have no name; install the debug symbols of \
             libsqlite3.so.0.8.6, sqlite3 (Debian: the -dbgsym package of the package \
             `dpkg -S FILE` names)\n"
        );
        for name in ["a", "b", "c", "d", "e"] {
            t.note(false, Some(name.as_bytes()));
        }
        let mut s = String::new();
        t.write_hint(&mut s).unwrap();
        assert!(
            s.contains("of libsqlite3.so.0.8.6, sqlite3, a, b and 3 more (Debian"),
            "{s}"
        );
        assert!(s.ends_with("; built here: build with -g, and keep the debug files)\n"));
        // A program installed by hand is no package's: no -dbgsym hint for it.
        let mut t = NamesTally::default();
        t.note(false, Some(b"/usr/local/bin/git"));
        let mut s = String::new();
        t.write_hint(&mut s).unwrap();
        assert_eq!(
            s,
            "mem-trace: 1 of 1 frames have no name; install the debug symbols of git \
             (built here: build with -g, and keep the debug files)\n"
        );
    }
}
