//! The reports the run's processes left raw (`MEM_TRACE_DEFER_SYMBOLS`: the exit and final
//! reports' frames as return addresses, `mem_trace_read::deferred`), symbolized here once the
//! program has ended, with one cache for the whole run, and their flame graphs drawn: the
//! files then read as if the process had written them symbolized.
//!
//! Each file is replaced whole (a new file renamed over it, never written through a symlink
//! someone left in the directory), so a report is either raw or complete.

use crate::cli::By;
use crate::flamegraph;
use mem_trace_read::deferred::{self, Cache};
use std::fs;
use std::path::Path;

/// Symbolizes the raw report `txt`, whose text is `text` (and its `.folded`), and draws its
/// flame graph. A report that cannot be converted stays as it is, said on stderr; so does one
/// that is no regular file of ours: its module table names the files read, which someone else
/// could have pointed at files they cannot read, to have their names written here.
pub fn report(txt: &Path, text: &str, cache: &mut Cache) {
    if !ours(txt) {
        eprintln!(
            "mem-trace: run: {} stays unsymbolized: not a regular file of this user's",
            txt.display()
        );
        return;
    }
    let folded_path = txt.with_extension("folded");
    let folded = regular(&folded_path)
        .then(|| fs::read_to_string(&folded_path).ok())
        .flatten();
    let converted = match deferred::convert(text, folded.as_deref(), cache) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mem-trace: run: {} stays unsymbolized: {e}", txt.display());
            return;
        }
    };
    if let Err(e) = replace(txt, converted.text.as_bytes()) {
        eprintln!("mem-trace: run: {e}");
        return;
    }
    if let Some(f) = &converted.folded {
        if let Err(e) = replace(&folded_path, f.as_bytes()) {
            eprintln!("mem-trace: run: {e}");
        } else if let Some((by, title)) = &converted.graph {
            draw(txt, f, by, title);
        }
    }
}

/// Whether `p` is a regular file (not a symlink) owned by this process's user.
pub fn ours(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file() && m.uid() == me)
}

/// Whether `p` is a regular file (not a symlink).
fn regular(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file())
}

/// `path`'s contents replaced by `bytes` (`flamegraph::write_to`: a new file renamed over it).
fn replace(path: &Path, bytes: &[u8]) -> crate::error::Result<()> {
    flamegraph::write_to(path, |w| w.write_all(bytes))
}

/// The report's flame graph, `X.svg` beside `X.txt`, as the library would have drawn it;
/// nothing (and no file) when the graph has nothing in it or cannot be drawn.
fn draw(txt: &Path, folded: &str, by: &str, title: &str) {
    if folded.trim().is_empty() {
        return;
    }
    let by = match by {
        "allocated" => By::Allocated,
        "blocks" => By::Blocks,
        "peak" => By::Peak,
        _ => By::Live,
    };
    let svg = txt.with_extension("svg");
    if fs::symlink_metadata(&svg).is_ok() {
        return;
    }
    if let Err(e) = flamegraph::write_to(&svg, |w| flamegraph::svg(folded, title, by, w)) {
        eprintln!("mem-trace: {e}");
        let _ = fs::remove_file(&svg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_of_ours_are_symbolized() {
        let dir = std::env::temp_dir().join(format!("mem-trace-symbolize-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let txt = dir.join("mem-trace.1.1.txt");
        let raw = format!("{}\nmem-trace: report 1 (at exit)\n", deferred::FIRST_LINE);
        fs::write(&txt, &raw).unwrap();
        let link = dir.join("mem-trace.1.2.txt");
        std::os::unix::fs::symlink(&txt, &link).unwrap();
        assert!(ours(&txt) && !ours(&link) && !ours(&dir.join("none")));
        let mut cache = Cache::new();
        report(&link, &raw, &mut cache);
        assert_eq!(fs::read_to_string(&txt).unwrap(), raw);
        report(&txt, &raw, &mut cache);
        assert_eq!(
            fs::read_to_string(&txt).unwrap(),
            "mem-trace: report 1 (at exit)\n"
        );
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        fs::remove_dir_all(&dir).unwrap();
    }
}
