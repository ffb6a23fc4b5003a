//! The library this binary carries when built with the `bundle` feature (`cargo install
//! --path crates/cli --features bundle`), for a `mem-trace` installed with no library beside
//! it: written on first use to `$XDG_CACHE_HOME/mem-trace/<id>/libmem_trace.so` (else
//! `~/.cache/...`), where `<id>` is a hash of the files' bytes taken when this binary was
//! built, so two installed versions never share a file. The reader gdb's commands answer
//! through, `libmem_trace_reader.so`, is carried too and written beside it, where the
//! commands look for it.
//!
//! The file is compared with the carried bytes on every use (a few milliseconds) and written
//! again if it differs; it is written to a temporary name in the same directory and renamed
//! over, so a concurrent `mem-trace` sees the old file or the new one, never half of one.

use crate::error::Result;
use std::path::PathBuf;

/// The bundled library's path in the cache, under the file name `name` (`library::NAME`),
/// written there if needed; `None` without the `bundle` feature.
pub fn path(name: &str) -> Result<Option<PathBuf>> {
    #[cfg(feature = "bundle")]
    return write::cached(name).map(Some);
    #[cfg(not(feature = "bundle"))]
    {
        let _ = name;
        Ok(None)
    }
}

#[cfg(feature = "bundle")]
mod write {
    use crate::error::{Error, Result};
    use std::io::Write as _;
    use std::path::{Path, PathBuf};

    /// The library, as `build.rs` built it.
    static BYTES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libmem_trace.so"));
    /// The reader gdb's commands load, as `build.rs` built it, and its file name.
    static READER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libmem_trace_reader.so"));
    const READER_NAME: &str = "libmem_trace_reader.so";
    /// Its hash, from `build.rs`.
    const ID: &str = env!("MEM_TRACE_BUNDLE_ID");

    /// The cached library, named `name`, with the reader beside it, each written when absent
    /// or not the carried bytes.
    pub fn cached(name: &str) -> Result<PathBuf> {
        let dir = cache_dir()?.join("mem-trace").join(ID);
        let path = dir.join(name);
        for (path, bytes) in [(path.clone(), BYTES), (dir.join(READER_NAME), READER)] {
            if std::fs::read(&path).is_ok_and(|b| b == bytes) {
                continue;
            }
            write_atomically(&dir, &path, bytes).map_err(|e| {
                Error::new(format!(
                    "cannot write the bundled library to {}: {e}: set XDG_CACHE_HOME to a \
                     writable directory, or MEM_TRACE_LIB to a libmem_trace.so",
                    path.display()
                ))
            })?;
        }
        Ok(path)
    }

    fn cache_dir() -> Result<PathBuf> {
        let var = |name| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        // XDG: a relative XDG_CACHE_HOME is to be ignored.
        if let Some(dir) = var("XDG_CACHE_HOME").filter(|d| d.is_absolute()) {
            return Ok(dir);
        }
        match var("HOME") {
            Some(home) => Ok(home.join(".cache")),
            None => Err(Error::new(
                "no cache directory for the bundled library: neither XDG_CACHE_HOME nor HOME is \
                 set (or set MEM_TRACE_LIB to a libmem_trace.so)",
            )),
        }
    }

    fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let written = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}
