//! `mem-trace flamegraph`: a target's stacks as folded stacks (`main;f;g 4096`, one line a
//! stack, written by `mem_trace_read::text::write_folded` as the profiler's reports write
//! theirs), and those drawn as an SVG flame graph by `inferno`.
//!
//! `--from-folded FILE` draws a file of folded stacks instead of reading a target: the
//! profiler's reports run it to draw the `.svg` beside each report's `.folded`
//! (`crates/core/src/profile/svg.rs`), and `mem-trace run` for any `.folded` left without one.

use crate::cli::{By, FlamegraphArgs};
use crate::error::{Error, Result};
use crate::stacks::{self, Frame, Stack};
use inferno::flamegraph::color::{BasicPalette, Palette};
use inferno::flamegraph::{self as inferno_fg, Options};
use mem_trace_read::text;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// `mem-trace flamegraph`.
pub fn command(args: &FlamegraphArgs) -> Result<()> {
    if let Some(from) = &args.from_folded {
        // The profiler's reports start us with every signal blocked (crates/core/src/profile/
        // unseen.rs): a renderer must still stop on SIGTERM and SIGINT.
        unblock_signals();
        let folded = fs::read_to_string(from)
            .map_err(|e| Error::new(format!("cannot read {}: {e}", from.display())))?;
        let title = match &args.title {
            Some(t) => t.clone(),
            None => format!("{} ({})", args.by.what(), from.display()),
        };
        return write_to(&args.output, |w| svg(&folded, &title, args.by, w));
    }
    let Some(target_args) = args.target() else {
        return Err(Error::new(
            "no TARGET: name a PID or a core file, or --from-folded FILE",
        ));
    };
    if args.thread.is_some() {
        mem_trace_read::answer::profile::thread_counts_by(args.by.into())
            .map_err(|e| Error::new(e.to_string()))?;
    }
    let target = target_args.open()?;
    let progress = crate::progress::Progress::start("reading and symbolizing the stacks");
    let profile = stacks::read(&target, args.thread);
    progress.finish();
    let profile = profile?;
    let folded = folded_lines(&profile.stacks, args.by);
    if args.folded {
        return write_to(&args.output, |w| w.write_all(folded.as_bytes()));
    }
    if folded.is_empty() {
        return Err(Error::new(format!(
            "{}: no stack has any {}: nothing to draw",
            target.name(),
            args.by.what()
        )));
    }
    let mut title = format!("{} of {}", args.by.what(), target.name());
    if let Some(t) = args.thread {
        title.push_str(&format!(", thread {t}"));
    }
    if profile.sample_mean != 0 {
        title.push_str(&format!(
            ", estimated from samples ({})",
            mem_trace_read::sample::rate(profile.sample_mean)
        ));
    }
    write_to(&args.output, |w| svg(&folded, &title, args.by, w))
}

/// The folded lines of every stack with a nonzero `by`, biggest first.
pub fn folded_lines(stacks: &[Stack], by: By) -> String {
    let mut ranked: Vec<(u64, &Stack)> = stacks
        .iter()
        .map(|s| (stacks::value(&s.counts, by), s))
        .filter(|&(v, _)| v > 0)
        .collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
    // Each frame's names are written once and copied into every line it is in: a big
    // program's stacks share most of their frames (a compiler's 62k stacks, 2.5M frames).
    let mut names: HashMap<*const Frame, String> = HashMap::new();
    let mut out = String::new();
    for (v, s) in ranked {
        let mut any = false;
        for f in s.frames.iter().rev() {
            let text = names.entry(Rc::as_ptr(f)).or_insert_with(|| {
                let mut t = String::new();
                // Writing to a String cannot fail.
                let _ = text::write_folded_names(&mut t, f.folded());
                t
            });
            if any {
                out.push(';');
            }
            out.push_str(text);
            any = true;
        }
        if !any {
            out.push_str(text::NO_STACK);
        }
        let _ = writeln!(out, " {v}");
    }
    out
}

/// Draws `folded` (folded stack lines whose counts are `by`) as an SVG flame graph.
pub fn svg(folded: &str, title: &str, by: By, out: impl Write) -> io::Result<()> {
    let mut opt = Options::default();
    opt.title = title.to_string();
    opt.count_name = by.unit().to_string();
    opt.colors = Palette::Basic(BasicPalette::Mem);
    // A function keeps its colour from one graph to the next.
    opt.hash = true;
    inferno_fg::from_lines(&mut opt, folded.lines(), out)
}

/// Writes to `path` (`-`: standard output) through `write`; a failure is one line naming it.
///
/// A file is written whole under a new name beside `path`, then renamed over it: an existing
/// file is replaced, never truncated in place, so a symlink planted at `path` (on a shared
/// machine, where this may run as root) cannot make us write through it. A `path` that is a
/// symlink is refused outright.
pub fn write_to(path: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<()> {
    let cannot =
        |e: &dyn std::fmt::Display| Error::new(format!("cannot write {}: {e}", path.display()));
    if path == Path::new("-") {
        let stdout = io::stdout();
        let mut lock = stdout.lock();
        return write(&mut lock)
            .and_then(|()| lock.flush())
            .map_err(|e| cannot(&e));
    }
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(cannot(&"it is a symbolic link"));
    }
    let (tmp, file) = new_file_beside(path).map_err(|e| cannot(&e))?;
    let mut w = io::BufWriter::new(file);
    let written = write(&mut w)
        .and_then(|()| w.flush())
        .and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(cannot(&e));
    }
    Ok(())
}

/// A file made for `path`'s contents in its directory, under a name no other file has
/// (`O_CREAT | O_EXCL`, which follows no symlink either), and its path.
fn new_file_beside(path: &Path) -> io::Result<(PathBuf, fs::File)> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("not a file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tries = 0;
    loop {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.{tries}.tmp", std::process::id()));
        let tmp = dir.join(tmp_name);
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 100 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Writes `bytes` to a new file at `path`; false if a file (or a symlink) is there already or
/// it cannot be made.
pub fn write_new(path: &Path, bytes: &[u8]) -> bool {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .is_ok()
}

/// Empties the signal mask: the profiler's reports start the binary with every signal blocked
/// (crates/core/src/profile/unseen.rs), and it must still stop on SIGTERM and SIGINT.
pub(crate) fn unblock_signals() {
    // SAFETY: an empty set, filled by sigemptyset before use.
    unsafe {
        let mut none: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, core::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::Frame;
    use mem_trace_format::Counts;
    use mem_trace_read::symbolize::SymFrame;

    fn stack(id: u32, names: &[&str], live: u64, total: u64) -> Stack {
        Stack {
            id,
            counts: Counts {
                live_bytes: live,
                live_blocks: 1,
                total_bytes: total,
                total_blocks: 1,
                ..Counts::default()
            },
            frames: names
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    std::rc::Rc::new(Frame {
                        ra: 0x1000 + i as u64,
                        symbols: vec![SymFrame {
                            function: Some(n.to_string()),
                            ..SymFrame::default()
                        }],
                        module: None,
                    })
                })
                .collect(),
        }
    }

    #[test]
    fn folded_lines_rank_by_the_count_asked_for() {
        let stacks = [
            stack(1, &["hold_site", "main"], 4096, 4096),
            stack(2, &["churn_site", "main"], 0, 1 << 20),
        ];
        assert_eq!(folded_lines(&stacks, By::Live), "main;hold_site 4096\n");
        assert_eq!(
            folded_lines(&stacks, By::Allocated),
            "main;churn_site 1048576\nmain;hold_site 4096\n"
        );
    }
}
