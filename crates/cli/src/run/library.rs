//! Which `libmem_trace.so` `mem-trace run` preloads, and whether it can write reports.
//!
//! The library is `$MEM_TRACE_LIB` when set, else `libmem_trace.so` in this binary's directory
//! (where `cargo build --release` puts both). Reports need its profiler build, which exports
//! `mem_trace_reset_peaks` (a tracer-only build does not: its header flag bit 1 is clear and it
//! keeps no counters); that is checked in the file's dynamic symbols before the program runs,
//! so that a run never ends with nothing written and no word why.

use crate::error::{Error, Result};
use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSymbol};
use std::path::{Path, PathBuf};

/// The library's file name, beside the binary.
const NAME: &str = "libmem_trace.so";
/// Exported by every build of the library.
const HEADER_SYMBOL: &str = "MEM_TRACE_HEADER";
/// Exported by profiler builds only.
const PROFILER_SYMBOL: &str = "mem_trace_reset_peaks";
/// What to do about a missing or tracer-only library.
const BUILD_IT: &str = "build it with `cargo build --release --features profiler`";

/// The library to preload, checked to be a profiler build.
pub fn find() -> Result<PathBuf> {
    let path = match std::env::var_os("MEM_TRACE_LIB").filter(|v| !v.is_empty()) {
        Some(lib) => {
            let path = PathBuf::from(lib);
            if !path.is_file() {
                return Err(Error::new(format!(
                    "MEM_TRACE_LIB={}: no such file: set it to the profiler build of {NAME}, or \
                     unset it to use the one beside mem-trace",
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
                return Err(Error::new(format!(
                    "no {NAME} beside {} (looked for {}): {BUILD_IT} (it goes beside the \
                     binary), or set MEM_TRACE_LIB to its path",
                    exe.display(),
                    path.display()
                )));
            }
            path
        }
    };
    // An absolute path: the program may change directory before it loads anything else, and
    // its own children inherit LD_PRELOAD.
    let path = path
        .canonicalize()
        .map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
    check(&path)?;
    Ok(path)
}

/// Whether `path` is a profiler build of the library.
pub fn check(path: &Path) -> Result<()> {
    let data = std::fs::read(path)
        .map_err(|e| Error::new(format!("cannot read {}: {e}", path.display())))?;
    let elf = ElfFile64::<Endianness>::parse(&*data).map_err(|e| {
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
    if !exported(PROFILER_SYMBOL) {
        return Err(Error::new(format!(
            "{} was built without the `profiler` feature, so it writes no reports: {BUILD_IT}",
            path.display()
        )));
    }
    Ok(())
}
