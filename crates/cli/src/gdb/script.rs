//! The gdb commands as a file gdb can `source` at its start: the script the library carries in
//! its `.debug_gdb_scripts` section, copied into a cache directory.
//!
//! Why the library's copy and not `gdb/mem_trace.py` of a source tree: it is the one built with
//! the library the program runs under, so its decoder knows that library's layout; it is there
//! wherever the library is (an installed pair of binary and library has no source tree); and
//! it needs no Python package on disk. Why not gdb's auto-load of that section: gdb runs it only
//! once the program has loaded the library, so `-ex 'mtrace-why p'` on a core, or a
//! breakpoint's commands defined before `run`, would find no such command.
//!
//! The section holds entries, each a kind byte and a NUL-terminated text; kind 4 (an inline
//! Python script) is `NAME\nSCRIPT` (`src/gdb_script.rs` writes it).

use crate::error::{Error, Result};
use object::{Object, ObjectSection};
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The section gdb auto-loads scripts from.
const SECTION: &str = ".debug_gdb_scripts";
/// An inline Python script's kind byte.
const INLINE_PYTHON: u8 = 4;
/// The name `src/gdb_script.rs` gives the commands' entry.
const NAME: &[u8] = b"mem_trace.py";

/// The path of a file holding the commands the library at `lib` (its bytes: `data`) carries.
pub fn file(lib: &Path, data: &[u8]) -> Result<PathBuf> {
    let script = embedded(data).ok_or_else(|| {
        Error::new(format!(
            "{} carries no gdb commands (no {} entry in its {SECTION} section): rebuild it \
             with `cargo build --release`",
            lib.display(),
            String::from_utf8_lossy(NAME)
        ))
    })?;
    let dir = cache_dir()?;
    // Named by its contents, so that sessions of different builds side by side each keep
    // their own, and a file already there with this name is this script.
    let path = dir.join(format!("gdb-commands-{:016x}.py", fnv1a(script)));
    if fs::read(&path).is_ok_and(|old| old == script) {
        return Ok(path);
    }
    // Written aside and renamed, so that a gdb started meanwhile never sources half a script.
    let temp = dir.join(format!(".gdb-commands.{}.tmp", std::process::id()));
    let cannot = |e: std::io::Error| {
        Error::new(format!(
            "cannot write the gdb commands to {}: {e}",
            path.display()
        ))
    };
    let mut out = fs::File::create(&temp).map_err(cannot)?;
    out.write_all(script).map_err(cannot)?;
    drop(out);
    fs::rename(&temp, &path).map_err(|e| {
        let _ = fs::remove_file(&temp);
        cannot(e)
    })?;
    Ok(path)
}

/// The commands' script in the library's `.debug_gdb_scripts`, if there.
pub fn embedded(data: &[u8]) -> Option<&[u8]> {
    let elf = object::File::parse(data).ok()?;
    let section = elf.section_by_name(SECTION)?.data().ok()?;
    find(section)
}

/// The script named [`NAME`] among a section's entries.
fn find(mut entries: &[u8]) -> Option<&[u8]> {
    while let Some((&kind, rest)) = entries.split_first() {
        // A zero kind byte is padding a linker may put between the entries of two objects.
        if kind == 0 {
            entries = rest;
            continue;
        }
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        let (entry, next) = (&rest[..end], rest.get(end + 1..).unwrap_or_default());
        if kind == INLINE_PYTHON {
            if let Some(script) = entry.strip_prefix(NAME).and_then(|s| s.strip_prefix(b"\n")) {
                return Some(script);
            }
        }
        entries = next;
    }
    None
}

/// `$XDG_CACHE_HOME/mem-trace`, else `~/.cache/mem-trace`, else a directory of this user's own
/// in the temporary directory.
fn cache_dir() -> Result<PathBuf> {
    let home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|d| d.is_absolute())
                .map(|h| h.join(".cache"))
        });
    if let Some(dir) = home.map(|d| d.join("mem-trace")) {
        if fs::create_dir_all(&dir).is_ok() {
            return Ok(dir);
        }
    }
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    let dir = std::env::temp_dir().join(format!("mem-trace-{uid}"));
    let _ = fs::DirBuilder::new().mode(0o700).create(&dir);
    // gdb runs what it sources: in a directory anyone can write to, the file must be in a
    // directory that is ours alone, not one another user made (or linked) there first.
    let meta = fs::symlink_metadata(&dir)
        .map_err(|e| Error::new(format!("cannot create {}: {e}", dir.display())))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(Error::new(format!(
            "{} is not a directory of this user's alone: remove it, or set XDG_CACHE_HOME",
            dir.display()
        )));
    }
    Ok(dir)
}

/// FNV-1a, 64 bits: a name that stays the same across builds of this command (std's hasher
/// does not promise that).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commands_entry_among_others() {
        let mut section = Vec::new();
        section.extend_from_slice(b"\x01/usr/share/other-gdb.py\0");
        section.extend_from_slice(b"\x04other.py\nprint(1)\0\0\0");
        section.extend_from_slice(b"\x04mem_trace.py\nimport sys\n\0");
        assert_eq!(find(&section), Some(&b"import sys\n"[..]));
        assert_eq!(find(b"\x04other.py\nx\0"), None);
        assert_eq!(find(b""), None);
    }

    #[test]
    fn names_are_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
