//! Which `libmem_trace.so` `mem-trace run` and `mem-trace gdb` preload, and whether it can
//! write reports.
//!
//! The library is `$MEM_TRACE_LIB` when set, else `libmem_trace.so` in this binary's directory
//! (where `cargo build --release` puts both), else the copy this binary carries when built
//! with the `bundle` feature (`cargo install`), written out to the cache directory
//! (`bundled`). Reports need per-stack counters, which every build since the one-build change
//! keeps and marks by exporting `mem_trace_reset_peaks` (an older tracer-only build does
//! not); that is checked in the file's dynamic symbols before the program runs, so that a run
//! never ends with nothing written and no word why.

use crate::error::{Error, Result};
use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSymbol};
use std::path::{Path, PathBuf};

/// The library's file name, beside the binary.
pub(crate) const NAME: &str = "libmem_trace.so";
/// Exported by every build of the library.
const HEADER_SYMBOL: &str = "MEM_TRACE_HEADER";
/// Exported by every build that keeps the per-stack counters.
const PROFILER_SYMBOL: &str = "mem_trace_reset_peaks";
/// What to do about a missing or old library.
const BUILD_IT: &str = "build it with `cargo build --release`";

/// The library to preload, checked to keep the counters reports are made of.
pub fn find() -> Result<PathBuf> {
    let path = locate(BUILD_IT)?;
    check(&path)?;
    Ok(path)
}

/// The library to preload, of any build: `mem-trace gdb` needs only the tables, which an old
/// tracer-only build has too.
pub fn find_any() -> Result<PathBuf> {
    let path = locate(BUILD_IT)?;
    let data = read(&path)?;
    exports(&path, &data, HEADER_SYMBOL).map(|_| path)
}

/// `$MEM_TRACE_LIB`, the library beside this binary or the bundled one, absolute; `build_it`
/// says how to get one when there is none.
fn locate(build_it: &str) -> Result<PathBuf> {
    let path = match std::env::var_os("MEM_TRACE_LIB").filter(|v| !v.is_empty()) {
        Some(lib) => {
            let path = PathBuf::from(lib);
            if !path.is_file() {
                return Err(Error::new(format!(
                    "MEM_TRACE_LIB={}: no such file: set it to the path of {NAME} ({build_it}), \
                     or unset it to use the one beside mem-trace",
                    path.display()
                )));
            }
            path
        }
        None => {
            let exe = std::env::current_exe()
                .map_err(|e| Error::new(format!("cannot find this binary's path: {e}")))?;
            let path = exe.with_file_name(NAME);
            if !path.is_file() {
                if let Some(bundled) = super::bundled::path(NAME)? {
                    return Ok(bundled);
                }
                return Err(Error::new(format!(
                    "no {NAME} beside {} (looked for {}): {build_it} (it goes beside the \
                     binary), set MEM_TRACE_LIB to its path, or install mem-trace with its \
                     library: `cargo install --path crates/cli --features bundle`",
                    exe.display(),
                    path.display()
                )));
            }
            path
        }
    };
    // An absolute path: the program may change directory before it loads anything else, and
    // its own children inherit LD_PRELOAD.
    path.canonicalize()
        .map_err(|e| Error::new(format!("{}: {e}", path.display())))
}

/// The library file's bytes.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::new(format!("cannot read {}: {e}", path.display())))
}

/// Whether the library at `path` (its bytes: `data`) exports `symbol`; an error if it is no
/// ELF file or not mem-trace's library at all.
fn exports(path: &Path, data: &[u8], symbol: &str) -> Result<bool> {
    let elf = ElfFile64::<Endianness>::parse(data).map_err(|e| {
        Error::new(format!(
            "{} is not a 64-bit ELF shared library ({e}): point MEM_TRACE_LIB at {NAME}",
            path.display()
        ))
    })?;
    let exported = |name: &str| {
        elf.dynamic_symbols()
            .any(|s| s.is_definition() && s.name() == Ok(name))
    };
    if !exported(HEADER_SYMBOL) {
        return Err(Error::new(format!(
            "{} is not mem-trace's library (it exports no {HEADER_SYMBOL}): point MEM_TRACE_LIB \
             at {NAME}",
            path.display()
        )));
    }
    Ok(exported(symbol))
}

/// Whether `path` keeps the per-stack counters.
pub fn check(path: &Path) -> Result<()> {
    let data = read(path)?;
    if !exports(path, &data, PROFILER_SYMBOL)? {
        return Err(Error::new(format!(
            "{} is an old tracer-only build, which keeps no counters to report: rebuild it with \
             `cargo build --release`",
            path.display()
        )));
    }
    Ok(())
}
