//! The subcommands that answer as the gdb commands do: `top`, `peaks`, `leaks`, `why`,
//! `history`, `info`. Each opens its target, reads the answer with `mem_trace_read::answer`
//! (which gdb's commands print too, through `crates/gdb`) and prints it.
//!
//! A running process is read while it runs: a line it changes between two reads is retried
//! by the decoder, and when allocations happened during the read, a note on stderr says how
//! many, so the answer is known for what it is (a snapshot over the read's duration).

use crate::attach::pause::Pause;
use crate::cli::{HistoryArgs, InfoArgs, LeaksArgs, PeaksArgs, StackOptions, TopArgs, WhyArgs};
use crate::error::{Error, Result};
use crate::progress::Progress;
use mem_trace_read::answer::{
    self, AnswerError, Asked, HistoryOptions, LeakTarget, LeaksOptions, Lookups, PeaksOptions,
    TopOptions, WhyOptions,
};
use mem_trace_read::layout::Tables;
use mem_trace_read::memory::Memory;
use mem_trace_read::target::{Source, Target};
use std::io::Write;

/// `mem-trace top TARGET [-n N] [--by ...] [--thread T] [-f N] [-r]`.
pub fn top(args: &TopArgs) -> Result<()> {
    let options = TopOptions {
        count: usize::try_from(args.count()).unwrap_or(usize::MAX),
        by: args.by.into(),
        thread: args.thread.map(|t| u32::try_from(t).unwrap_or(u32::MAX)),
        frames: answer::all_if_zero(args.stacks.frames),
    };
    answer_with(
        &args.target.open()?,
        &args.stacks,
        false,
        "reading the counters",
        |t, l| answer::top(t, l, &options),
    )
}

/// `mem-trace peaks TARGET [-n N] [-f N] [-r]`.
pub fn peaks(args: &PeaksArgs) -> Result<()> {
    let options = PeaksOptions {
        count: usize::try_from(args.count).unwrap_or(usize::MAX),
        frames: answer::all_if_zero(args.stacks.frames),
    };
    answer_with(
        &args.target.open()?,
        &args.stacks,
        false,
        "reading the peaks",
        |t, l| answer::peaks(t, l, &options),
    )
}

/// `mem-trace leaks TARGET [-n N] [--no-reachable] [-f N] [-r]`.
pub fn leaks(args: &LeaksArgs) -> Result<()> {
    let options = LeaksOptions {
        count: answer::all_if_zero(usize::try_from(args.count).unwrap_or(usize::MAX)),
        frames: answer::all_if_zero(args.stacks.frames),
        no_reachable: args.no_reachable,
    };
    let pause = match args.target.source() {
        Source::Pid(pid) if !args.no_stop => Some(Pause::stop(pid).map_err(|e| {
            Error::new(format!(
                "cannot stop process {pid} for the leak scan ({e}); mem-trace leaks --no-stop {pid} reads it running, where blocks it changes meanwhile may be misclassified"
            ))
        })?),
        Source::Pid(pid) => {
            eprintln!(
                "mem-trace: process {pid} read while running (--no-stop): blocks it changed during the read may be misclassified, and its threads' registers are not roots"
            );
            None
        }
        _ => None,
    };
    let mut target = args.target.open()?;
    if let Some(p) = &pause {
        target.set_stopped_threads(p.thread_states());
    }
    let target = target;
    let roots = LeakTarget {
        header: target.header(),
        modules: target.modules(),
        mappings: target.mappings(),
        threads: target.threads(),
    };
    // Let go as soon as the scan is done: symbolizing needs only what the process never
    // rewrites (see `answer::leaks_then`).
    let mut pause = pause;
    let mut paused = None;
    let stopped = pause.is_some();
    let answered = answer_with(
        &target,
        &args.stacks,
        stopped,
        "scanning for leaks",
        |t, l| {
            answer::leaks_then(t, l, &roots, &options, || {
                paused = pause.take().map(Pause::resume);
            })
        },
    );
    // Resumed either way; the pause is worth a line only beside an answer (a failure says
    // one line, its own).
    let paused = paused.or_else(|| pause.take().map(Pause::resume));
    if let (Some((threads, took)), Some(pid)) = (paused, target.pid()) {
        if answered.is_ok() {
            eprintln!(
                "mem-trace: stopped {threads} thread{} of process {pid} for {} ms",
                if threads == 1 { "" } else { "s" },
                took.as_millis()
            );
        }
    }
    answered
}

/// `mem-trace why TARGET ADDR [-f N] [--gap BYTES] [-r]`.
pub fn why(args: &WhyArgs) -> Result<()> {
    let options = WhyOptions {
        // 0 is all, as for every frames option (and for mtrace-why).
        max_frames: answer::all_if_zero(args.frames),
        gap: args.gap,
    };
    let stacks = StackOptions {
        frames: 0,
        raw: args.raw,
    };
    answer_with(
        &args.target.open()?,
        &stacks,
        false,
        "finding the block",
        |t, l| answer::why(t, l, args.address, &options),
    )
}

/// `mem-trace history TARGET ADDR [-f N] [--no-stacks] [-r]`.
pub fn history(args: &HistoryArgs) -> Result<()> {
    let options = HistoryOptions {
        frames: answer::all_if_zero(args.frames),
        no_stacks: args.no_stacks,
    };
    let stacks = StackOptions {
        frames: args.frames,
        raw: args.raw,
    };
    answer_with(
        &args.target.open()?,
        &stacks,
        false,
        "reading the history",
        |t, l| answer::history(t, l, args.address, &options),
    )
}

/// `mem-trace info TARGET`.
pub fn info(args: &InfoArgs) -> Result<()> {
    let target = args.target.open()?;
    let stacks = StackOptions {
        frames: 0,
        raw: true,
    };
    answer_with(&target, &stacks, false, "reading the tables", |t, _| {
        answer::info(t, target.header())
    })
}

/// Opens `target`'s tables, gives `read` them and a frame lookup (symbolized over the
/// target's modules, or raw addresses with `--raw`), and prints the lines it returns.
/// `stopped`: the process was held stopped while `read` needed it (see `Asked::stopped`).
fn answer_with<'t>(
    target: &'t Target,
    stacks: &StackOptions,
    stopped: bool,
    what: &str,
    read: impl FnOnce(
        &Tables<'t, dyn Memory + 't>,
        &mut Lookups<'_>,
    ) -> std::result::Result<Vec<String>, AnswerError>,
) -> Result<()> {
    let progress = Progress::start(what);
    let asked = Asked {
        raw: stacks.raw,
        stopped,
        ..Asked::default()
    };
    let answered = answer::ask(target, &asked, read).map_err(Error::new)?;
    progress.finish();
    let mut out = std::io::stdout().lock();
    for line in &answered.lines {
        // A closed pipe (`| head`) ends the answer quietly, as other tools do.
        if writeln!(out, "{line}").is_err() {
            return Ok(());
        }
    }
    let _ = out.flush();
    eprint!("{}", answered.hint);
    if let Some(note) = answered.ran_on_note(target) {
        eprintln!("{note}");
    }
    Ok(())
}
