//! In-process symbolization for `print_trace` (and the profiler's reports).
//!
//! gdb may call `print_trace` while any other thread is stopped anywhere, holding any lock
//! (docs/FINDINGS.md, "Calling into a stopped process" and "Unwinding and
//! symbolizing inside an allocator"). So this module takes no lock at all: it does not ask the
//! dynamic linker for the module list (`dl_iterate_phdr` takes the loader lock), does not
//! use the `backtrace` crate (global mutex) and does not touch stdio. The caller hands in
//! the module (path, load bias, mapped range) from its own unwinder registry, and this
//! module maps the ELF file read-only with plain `open`/`mmap` and reads DWARF and symbol
//! tables straight out of the mapping with `object` and `addr2line`.
//!
//! Lookup order for one address:
//! 1. DWARF of the file itself, else of its separate debug file
//!    (`/usr/lib/debug/.build-id/xx/yyyy.debug`, then `.gnu_debuglink` next to the file,
//!    in `.debug/` or under `/usr/lib/debug/<dir>`), with a dwz supplementary file from
//!    `.gnu_debugaltlink` when there is one. Inlined frames come first.
//! 2. The ELF symbol table (`.symtab`, the debug file's `.symtab`, else `.dynsym`): the
//!    nearest function symbol at or below the address, as `name+0xoff` (`off` counted to
//!    the return address, `probe + 1`), but only when the symbol reaches the address: within
//!    its `st_size`, or for a symbol without a size, when the unwind tables' function holding
//!    the address starts at it (`bounds`).
//!
//! Anything that fails becomes a [`SymError`]; the caller then prints `module+0xoffset`.

mod bounds;
mod cpp_names;
mod debug_files;
mod demangle;
mod dwarf;
mod loaded;
pub(crate) mod mapping;
#[cfg(test)]
mod tests;
mod types;

use demangle::demangle;
use loaded::Loaded;
pub use types::{SymError, SymFrame};

/// One loaded module as the unwinder registry knows it.
#[derive(Debug, Clone, Copy)]
pub struct ModuleRef<'a> {
    /// File the module was loaded from; empty for the main executable (read through
    /// `/proc/self/exe`). A name without `/` (such as `linux-vdso.so.1`) has no file.
    pub path: &'a [u8],
    /// Load bias: actual address = address stated in the file + `bias`.
    pub bias: u64,
    /// First actual address of the module's mappings.
    pub start: u64,
    /// One past the last actual address of the module's mappings.
    pub end: u64,
}

/// Per-call cache of opened/parsed files.
///
/// A `print_trace` call symbolizes ~20-60 addresses, usually in a few modules, so each file
/// is mapped and parsed once per `Symbolizer`; failures are cached too, so a missing file
/// costs one `open`. Dropping it unmaps everything.
pub struct Symbolizer {
    files: Vec<CachedFile>,
    /// Separate debug files are looked up only when set; tests clear it to reach the
    /// symbol-table fallback on files whose debug package is installed.
    separate_debug: bool,
    /// Bytes still allowed for decompressed debug sections across all files.
    decompress_budget: u64,
}

/// Default cap on decompressed debug sections per [`Symbolizer`]: glibc's compressed
/// debug file needs 8.6 MB; a file needing more than this falls back to its symbol table.
pub const DEFAULT_DECOMPRESS_LIMIT: u64 = 64 << 20;

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// An empty cache; nothing is opened until the first [`Symbolizer::symbolize`].
    pub fn new() -> Self {
        Symbolizer {
            files: Vec::new(),
            separate_debug: true,
            decompress_budget: DEFAULT_DECOMPRESS_LIMIT,
        }
    }

    /// Caps the heap spent on decompressing `SHF_COMPRESSED` debug sections by the files
    /// opened from now on (default [`DEFAULT_DECOMPRESS_LIMIT`]). Files over the budget
    /// are symbolized from their symbol table only.
    pub fn set_decompress_limit(&mut self, bytes: u64) {
        self.decompress_budget = bytes;
    }

    /// Appends the frames for `probe` to `out`: inlined functions innermost first
    /// (`inlined: true`), then the function they were inlined into (`inlined: false`).
    ///
    /// `probe` is an actual address inside the module; callers pass `return_address - 1`
    /// so that the call instruction, not the one after it, is looked up. On error `out` is
    /// left as it was.
    pub fn symbolize(
        &mut self,
        module: &ModuleRef<'_>,
        probe: u64,
        out: &mut Vec<SymFrame>,
    ) -> Result<(), SymError> {
        if probe < module.start || probe >= module.end {
            return Err(SymError::NotInModule);
        }
        let separate_debug = self.separate_debug;
        let budget = &mut self.decompress_budget;
        let index = match self.files.iter().position(|f| f.path == module.path) {
            Some(i) => i,
            None => {
                let loaded = Loaded::open(module.path, separate_debug, budget).map(Box::new);
                self.files.push(CachedFile {
                    path: module.path.to_vec(),
                    loaded,
                });
                self.files.len() - 1
            }
        };
        let loaded = match &mut self.files[index].loaded {
            Ok(loaded) => loaded,
            Err(e) => return Err(*e),
        };
        // Wrapping: a bogus bias must give a wrong answer, never an overflow panic.
        let svma = probe.wrapping_sub(module.bias);
        let first = out.len();
        loaded.dwarf_frames(svma, out);
        let found_dwarf = out.len() > first;
        if found_dwarf {
            let last = out.len() - 1;
            for frame in &mut out[first..last] {
                frame.inlined = true;
            }
            if out[last].function.is_none() {
                // Line tables without a subprogram entry (assembly, some C objects): the
                // symbol table still knows the function.
                out[last].function = loaded.symbol_for(svma).map(|(name, _)| demangle(name));
            }
            return Ok(());
        }
        match loaded.symbol_for(svma) {
            Some((name, offset)) => {
                // Counted to the return address (`probe + 1`), as `module+0xoffset` and gdb's
                // `info symbol $pc` count it, so one frame reads the same everywhere.
                out.push(SymFrame {
                    function: Some(format!("{}+{:#x}", demangle(name), offset.wrapping_add(1))),
                    ..SymFrame::default()
                });
                Ok(())
            }
            None => Err(SymError::NoSymbol),
        }
    }
}

/// One module path and what opening it gave.
struct CachedFile {
    path: Vec<u8>,
    loaded: Result<Box<Loaded>, SymError>,
}
