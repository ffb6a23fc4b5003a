//! One source-level frame and the way a backtrace line shows it: the Rust twin of
//! `python/mem_trace_gdb/frame.py`, so that both sides print the same line for the same
//! return address.

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
    /// Without debug info: `symbol+offset` (decimal, from the symbol to the return address).
    pub symbol: Option<String>,
    /// Without debug info: the module the address is in.
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

    /// `0x... in f (inlined) at file:line`, `0x... in sym+12 from /lib/x.so`: the way gdb's
    /// backtrace reads, and `Frame.describe` in frame.py.
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
    /// From debug info, the function, file and line, as gdb gives them. From the symbol table
    /// (the symbolizer's `name+0xoff`, `off` counted from the symbol to `pc - 1`), gdb's
    /// `symbol+offset` instead, with the offset counted to `pc` in decimal and the module
    /// named; where gdb names the module by the path the dynamic linker used
    /// (`/lib/x86_64-linux-gnu/libc.so.6`), this names it by the path the target's mappings
    /// give (`/usr/lib/x86_64-linux-gnu/libc.so.6` on a merged-/usr system), and gdb's nearest
    /// symbol can differ from the symbolizer's where symbols have no size or overlap.
    pub fn from_sym(pc: u64, f: &SymFrame, module: Option<&str>) -> Frame {
        if f.file.is_none() {
            if let Some((name, off)) = f.function.as_deref().and_then(split_offset) {
                return Frame {
                    pc,
                    symbol: Some(format!("{name}+{}", off + 1)),
                    module: module.map(str::to_string),
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

    /// What gdb shows for a return address nothing symbolizes: the address, and the module it
    /// is in unless that is the main executable (gdb's `solib_name` knows shared objects only).
    pub fn unknown(pc: u64, module: Option<&str>, main_executable: bool) -> Frame {
        Frame {
            pc,
            module: module.filter(|_| !main_executable).map(str::to_string),
            ..Frame::default()
        }
    }
}

/// An optional text, empty counting as absent (as in Python).
fn some(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

/// `name+0x1f` → (`name`, 0x1f): the symbolizer's spelling of a symbol-table match.
fn split_offset(function: &str) -> Option<(&str, u64)> {
    let (name, hex) = function.rsplit_once("+0x")?;
    let off = u64::from_str_radix(hex, 16).ok()?;
    (!name.is_empty()).then_some((name, off))
}

/// The frames of return address `pc` from a symbolizer's answer (`symbolize::Symbolizer`
/// looking up `pc - 1` in the module at path `module`): the answer's frames, innermost
/// (inlined) first, or [`Frame::unknown`] when it failed or found nothing.
pub fn frames<E>(
    pc: u64,
    found: Result<&[SymFrame], E>,
    module: Option<&str>,
    main_executable: bool,
) -> Vec<Frame> {
    match found {
        Ok(fs) if !fs.is_empty() => fs.iter().map(|f| Frame::from_sym(pc, f, module)).collect(),
        _ => vec![Frame::unknown(pc, module, main_executable)],
    }
}

/// The frames of return address `pc` in `symbols`' target: [`frames`] over its symbolizer,
/// naming the module, and telling the executable from shared objects as gdb does.
pub fn target_frames(symbols: &mut crate::target::Symbols<'_>, pc: u64) -> Vec<Frame> {
    let module = symbols.module_of(pc.wrapping_sub(1));
    let path = module.map(|m| m.path.to_string_lossy().into_owned());
    let main = module.is_some_and(|m| symbols.target().is_executable(m));
    let found = symbols.frames(pc);
    frames(pc, found.as_deref(), path.as_deref(), main)
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
            f(None, None, 0, Some("g+4"), None).describe(),
            "0x10 in g+4"
        );
        assert_eq!(
            f(None, None, 0, None, Some("/lib/x.so")).describe(),
            "0x10 from /lib/x.so"
        );
        assert_eq!(
            f(None, None, 0, Some("_start+33"), Some("/bin/demo")).describe(),
            "0x10 in _start+33 from /bin/demo"
        );
        assert_eq!(
            f(
                Some("main"),
                Some("/src/demo.c"),
                30,
                None,
                Some("/bin/demo")
            )
            .describe(),
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
        let found = [
            sym(Some("inner"), Some("/src/demo.c"), 7, true),
            sym(Some("outer"), Some("/src/demo.c"), 12, false),
        ];
        let lines: Vec<String> = frames::<()>(pc, Ok(&found), Some("/bin/demo"), true)
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
        // From the symbol table: the offset of pc - 1, in hex, becomes gdb's offset of pc.
        let table = [sym(Some("__libc_start_call_main+0x79"), None, 0, false)];
        let libc = Some("/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(
            frames::<()>(0x7fff_f7dd_124a, Ok(&table), libc, false)[0].describe(),
            "0x7ffff7dd124a in __libc_start_call_main+122 from /usr/lib/x86_64-linux-gnu/libc.so.6"
        );
        // Nothing known: the module, unless it is the main executable.
        assert_eq!(
            frames(0x7fff_f7a0_0010, Err("no symbol"), libc, false)[0].describe(),
            "0x7ffff7a00010 from /usr/lib/x86_64-linux-gnu/libc.so.6"
        );
        assert_eq!(
            frames::<()>(0x5555_5555_0010, Ok(&[]), Some("/bin/demo"), true)[0].describe(),
            "0x555555550010"
        );
        // A debug-info name that merely contains "+0x" stays a function.
        let odd = [sym(Some("operator+0x"), Some("/src/a.cc"), 3, false)];
        assert_eq!(
            frames::<()>(0x20, Ok(&odd), None, true)[0].describe(),
            "0x20 in operator+0x at /src/a.cc:3"
        );
        assert_eq!(unsymbolized(0x20), [Frame::raw(0x20)]);
    }
}
