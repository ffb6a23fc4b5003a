//! The frame lines every report prints, in the seed's format:
//!
//! ```text
//!    0: new_order
//!              at /work/main/examples/demo.c:14:23
//!    1: 0x7f0012345678 (libfoo.so+0x1678)
//! ```
//!
//! Writing never allocates, so the same functions serve a process that gdb stopped.

use crate::symbolize::SymFrame;
use core::fmt::{self, Write};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
