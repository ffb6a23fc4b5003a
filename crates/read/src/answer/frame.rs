//! One source-level frame and the way a backtrace line shows it, in every reader's answers.

use crate::symbolize::SymFrame;

/// One source-level frame; an inlined call expands one return address into several.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// The return address.
    pub pc: u64,
    /// The function, from debug info.
    pub function: Option<String>,
    /// Inlined into the frame that follows it.
    pub inlined: bool,
    /// Source file, as full a path as the debug info gives.
    pub file: Option<String>,
    /// Source line; 0 when unknown.
    pub line: u32,
    /// Without debug info: `symbol+0xoffset` (from the symbol to the return address) when a
    /// symbol holds the address, else `module+0xoffset` (the return address as the module's
    /// file states it, which `addr2line -e MODULE` takes).
    pub symbol: Option<String>,
    /// With a `symbol+0xoffset`: the file name of the module it is in.
    pub module: Option<String>,
}

impl Frame {
    /// The return address alone, as `--raw` shows it and as an address nothing knows reads.
    pub fn raw(pc: u64) -> Frame {
        Frame {
            pc,
            ..Frame::default()
        }
    }

    /// `0x... in f (inlined) at file:line`, `0x... in sym+0xc from x.so`,
    /// `0x... in x.so+0x1678`: the way gdb's backtrace reads, and `Frame.describe` in
    /// frame.py.
    pub fn describe(&self) -> String {
        let mut text = format!("{:#x}", self.pc);
        if let Some(function) = some(&self.function) {
            text += &format!(" in {function}");
            if self.inlined {
                text += " (inlined)";
            }
        } else if let Some(symbol) = some(&self.symbol) {
            text += &format!(" in {symbol}");
        }
        if let Some(file) = some(&self.file) {
            text += &match self.line {
                0 => format!(" at {file}"),
                line => format!(" at {file}:{line}"),
            };
        } else if let Some(module) = some(&self.module) {
            text += &format!(" from {module}");
        }
        text
    }

    /// The frame the symbolizer's `f` describes, for the return address `pc` (looked up as
    /// `pc - 1`) in the module at path `module`.
    ///
    /// From debug info, the function, file and line, as gdb gives them. From the symbol table,
    /// the symbolizer's `name+0xoff` (counted to `pc`) and the module's file name: gdb names
    /// the module by the path the dynamic linker used (`/lib/x86_64-linux-gnu/libc.so.6`),
    /// the target's mappings by another (`/usr/lib/...` on a merged-/usr system), but both
    /// by the same file name.
    pub fn from_sym(pc: u64, f: &SymFrame, module: Option<&str>) -> Frame {
        if f.file.is_none() {
            if let Some(function) = f.function.as_deref().filter(|n| is_symbol_offset(n)) {
                return Frame {
                    pc,
                    symbol: Some(function.to_string()),
                    module: module.map(|m| file_name(m).to_string()),
                    ..Frame::default()
                };
            }
        }
        Frame {
            pc,
            function: f.function.clone(),
            inlined: f.inlined,
            file: f.file.clone(),
            line: f.line,
            ..Frame::default()
        }
    }

    /// A return address nothing names: `module+0xoffset` in the module at path `path` with
    /// load bias `bias`, or the address alone outside every module.
    pub fn unknown(pc: u64, module: Option<(&str, u64)>) -> Frame {
        Frame {
            pc,
            symbol: module.map(|(path, bias)| module_offset(path, pc.wrapping_sub(bias))),
            ..Frame::default()
        }
    }
}

/// `libc.so.6+0x2724a`: an address as the module's file states it (`addr2line -e` takes it),
/// after the module's file name; every output spells a frame without a name so.
pub fn module_offset(path: &str, stated: u64) -> String {
    format!("{}+{stated:#x}", file_name(path))
}

/// The last component of a path.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// An optional text, empty counting as absent.
fn some(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

/// Whether `function` is the symbolizer's spelling of a symbol-table match, `name+0x1f`.
fn is_symbol_offset(function: &str) -> bool {
    function
        .rsplit_once("+0x")
        .is_some_and(|(name, hex)| !name.is_empty() && u64::from_str_radix(hex, 16).is_ok())
}

/// The frames of return address `pc` from a symbolizer's answer (`symbolize::Symbolizer`
/// looking up `pc - 1` in the module at path `module` with its load bias): the answer's
/// frames, innermost (inlined) first, or [`Frame::unknown`] when it failed or found nothing.
pub fn frames<E>(
    pc: u64,
    found: Result<&[SymFrame], E>,
    module: Option<(&str, u64)>,
) -> Vec<Frame> {
    match found {
        Ok(fs) if !fs.is_empty() => fs
            .iter()
            .map(|f| Frame::from_sym(pc, f, module.map(|(path, _)| path)))
            .collect(),
        _ => vec![Frame::unknown(pc, module)],
    }
}

/// The frames of return address `pc` in `symbols`' target: [`frames`] over its symbolizer,
/// naming the module.
pub fn target_frames(symbols: &mut crate::target::Symbols<'_>, pc: u64) -> Vec<Frame> {
    let module = symbols.module_of(pc.wrapping_sub(1));
    let path = module.map(|m| (m.path.to_string_lossy().into_owned(), m.bias));
    let found = symbols.frames(pc);
    frames(
        pc,
        found.as_deref(),
        path.as_ref().map(|(p, bias)| (p.as_str(), *bias)),
    )
}

/// The symbolizer of `--raw`: the return address alone, no lookup.
pub fn unsymbolized(pc: u64) -> Vec<Frame> {
    vec![Frame::raw(pc)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(function: Option<&str>, file: Option<&str>, line: u32, inlined: bool) -> SymFrame {
        SymFrame {
            function: function.map(String::from),
            file: file.map(String::from),
            line,
            column: 3,
            inlined,
        }
    }

    #[test]
    fn describe_reads_like_frame_py() {
        let f = |function: Option<&str>,
                 file: Option<&str>,
                 line,
                 symbol: Option<&str>,
                 module: Option<&str>| Frame {
            pc: 0x10,
            function: function.map(String::from),
            inlined: false,
            file: file.map(String::from),
            line,
            symbol: symbol.map(String::from),
            module: module.map(String::from),
        };
        assert_eq!(
            f(Some("f"), Some("a.c"), 0, None, None).describe(),
            "0x10 in f at a.c"
        );
        assert_eq!(
            f(None, None, 0, Some("g+0x4"), None).describe(),
            "0x10 in g+0x4"
        );
        assert_eq!(
            f(None, None, 0, Some("x.so+0x10"), None).describe(),
            "0x10 in x.so+0x10"
        );
        assert_eq!(
            f(None, None, 0, Some("_start+0x21"), Some("demo")).describe(),
            "0x10 in _start+0x21 from demo"
        );
        assert_eq!(
            f(Some("main"), Some("/src/demo.c"), 30, None, Some("demo")).describe(),
            "0x10 in main at /src/demo.c:30"
        );
        let mut inlined = f(Some("inner"), Some("/src/demo.c"), 7, None, None);
        inlined.inlined = true;
        assert_eq!(
            inlined.describe(),
            "0x10 in inner (inlined) at /src/demo.c:7"
        );
        assert_eq!(Frame::raw(0x5555_5555_518b).describe(), "0x55555555518b");
    }

    #[test]
    fn symbolizer_frames_become_gdb_frames() {
        let pc = 0x5555_5555_5300;
        let demo = Some(("/bin/demo", 0x5555_5555_0000));
        let found = [
            sym(Some("inner"), Some("/src/demo.c"), 7, true),
            sym(Some("outer"), Some("/src/demo.c"), 12, false),
        ];
        let lines: Vec<String> = frames::<()>(pc, Ok(&found), demo)
            .iter()
            .map(Frame::describe)
            .collect();
        assert_eq!(
            lines,
            [
                "0x555555555300 in inner (inlined) at /src/demo.c:7",
                "0x555555555300 in outer at /src/demo.c:12"
            ]
        );
        // From the symbol table: the symbolizer's offset (to pc) and the module's file name.
        let table = [sym(Some("__libc_start_call_main+0x7a"), None, 0, false)];
        let libc = Some(("/usr/lib/x86_64-linux-gnu/libc.so.6", 0x7fff_f7da_a000));
        assert_eq!(
            frames::<()>(0x7fff_f7dd_124a, Ok(&table), libc)[0].describe(),
            "0x7ffff7dd124a in __libc_start_call_main+0x7a from libc.so.6"
        );
        // Nothing names it: module+0xoffset, the executable too.
        assert_eq!(
            frames(0x7fff_f7db_0010, Err("no symbol"), libc)[0].describe(),
            "0x7ffff7db0010 in libc.so.6+0x6010"
        );
        assert_eq!(
            frames::<()>(0x5555_5555_0010, Ok(&[]), demo)[0].describe(),
            "0x555555550010 in demo+0x10"
        );
        assert_eq!(frames::<()>(0x10, Ok(&[]), None)[0].describe(), "0x10");
        // A debug-info name that merely contains "+0x" stays a function.
        let odd = [sym(Some("operator+0x"), Some("/src/a.cc"), 3, false)];
        assert_eq!(
            frames::<()>(0x20, Ok(&odd), None)[0].describe(),
            "0x20 in operator+0x at /src/a.cc:3"
        );
        assert_eq!(unsymbolized(0x20), [Frame::raw(0x20)]);
    }
}
