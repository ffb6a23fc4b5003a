//! The answers of the reading commands, read from outside the process: `mem-trace why`,
//! `history`, `info`, `top`, `peaks` and `leaks`, and gdb's `mtrace-why`, `-history`, `-info`,
//! `-top`, `-peaks` and `-leaks`, which print these same lines (through `crates/gdb`), so
//! that `mem-trace why ADDR` on a core says what `mtrace-why ADDR` says on it in gdb. gdb adds
//! what only it knows: its own thread numbers (`, gdb thread N`, see [`Lookups`]).
//!
//! Each answer is facts read from the [`Tables`] (a `*Facts::read`) rendered into lines (a
//! `lines` function) with [`Lookups`]: the stacks' and threads' records and a function from a
//! return address to its frames ([`frame::frames`] over the target's symbolizer, or
//! [`frame::unsymbolized`] for `--raw`). The functions below do both for a command, with its
//! options; [`ask`] opens the tables and symbolizes for them.

mod ask;
mod error;
pub mod frame;
pub mod history;
pub mod info;
pub mod leaks;
mod parts;
pub mod profile;
pub mod why;

pub use ask::{ask, Answered, Asked};
pub use error::AnswerError;
pub use frame::Frame;
pub use parts::{Lookups, Records};

use crate::layout::{Tables, DEFAULT_MAX_GAP};
use crate::memory::Memory;
use crate::target::{Mapping, Module, ThreadState};
use profile::By;

/// Frames per stack when the user does not say.
pub const DEFAULT_FRAMES: usize = 8;

/// A count where 0 means "all", as every `-n`/`-f` option takes it: `None` for 0.
pub fn all_if_zero(n: usize) -> Option<usize> {
    (n != 0).then_some(n)
}

/// The options of `why` (`mtrace-why`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WhyOptions {
    /// Frames per stack (`-f`/`--frames`; `None`, the default: all).
    pub max_frames: Option<usize>,
    /// How far outside a block an address still names it (`--gap`, default 4096, 0: off).
    pub gap: u64,
}

impl Default for WhyOptions {
    fn default() -> Self {
        WhyOptions {
            max_frames: None,
            gap: DEFAULT_MAX_GAP,
        }
    }
}

/// The options of `history` (`mtrace-history`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryOptions {
    /// Frames per stack (`-f`/`--frames`, default 8; `None`: all).
    pub frames: Option<usize>,
    /// One line per event, no stacks (`--no-stacks`).
    pub no_stacks: bool,
}

impl Default for HistoryOptions {
    fn default() -> Self {
        HistoryOptions {
            frames: Some(DEFAULT_FRAMES),
            no_stacks: false,
        }
    }
}

/// The options of `top` (`mtrace-top`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopOptions {
    /// How many stacks (`-n`/`--count`, default 10, at least 1).
    pub count: usize,
    /// What to rank by (`--by`, default live).
    pub by: By,
    /// Only live blocks allocated by this thread index (`--thread`).
    pub thread: Option<u32>,
    /// Frames per stack (`-f`/`--frames`, default 8; `None`: all).
    pub frames: Option<usize>,
}

impl Default for TopOptions {
    fn default() -> Self {
        TopOptions {
            count: 10,
            by: By::Live,
            thread: None,
            frames: Some(DEFAULT_FRAMES),
        }
    }
}

/// The options of `peaks` (`mtrace-peaks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeaksOptions {
    /// Stacks at the peak to show (`-n`, default 5, at least 1).
    pub count: usize,
    /// Frames per stack (`-f`/`--frames`, default 8; `None`: all).
    pub frames: Option<usize>,
}

impl Default for PeaksOptions {
    fn default() -> Self {
        PeaksOptions {
            count: 5,
            frames: Some(DEFAULT_FRAMES),
        }
    }
}

/// The options of `leaks` (`mtrace-leaks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaksOptions {
    /// Stacks of each class to show (`-n`, default 10; `None`: all).
    pub count: Option<usize>,
    /// Frames per stack (`-f`/`--frames`, default 8; `None`: all).
    pub frames: Option<usize>,
    /// Do not list the still reachable blocks (`--no-reachable`; the summary counts them).
    pub no_reachable: bool,
}

impl Default for LeaksOptions {
    fn default() -> Self {
        LeaksOptions {
            count: Some(10),
            frames: Some(DEFAULT_FRAMES),
            no_reachable: false,
        }
    }
}

/// `why ADDR`.
pub fn why<M: Memory + ?Sized>(
    tables: &Tables<'_, M>,
    lookups: &mut Lookups<'_>,
    address: u64,
    options: &WhyOptions,
) -> Result<Vec<String>, AnswerError> {
    let facts = why::WhyFacts::read(tables, address, options.gap)?;
    Ok(why::lines(&facts, lookups, options.max_frames))
}

/// `history ADDR`.
pub fn history<M: Memory + ?Sized>(
    tables: &Tables<'_, M>,
    lookups: &mut Lookups<'_>,
    address: u64,
    options: &HistoryOptions,
) -> Result<Vec<String>, AnswerError> {
    let facts = history::HistoryFacts::read(tables, address)?;
    Ok(history::lines(
        &facts,
        lookups,
        options.frames,
        !options.no_stacks,
    ))
}

/// `info`, for the tables whose header is at `header`.
pub fn info<M: Memory + ?Sized>(
    tables: &Tables<'_, M>,
    header: u64,
) -> Result<Vec<String>, AnswerError> {
    Ok(info::lines(&info::InfoFacts::read(tables, header)?))
}

/// `top`.
pub fn top<M: Memory + ?Sized>(
    tables: &Tables<'_, M>,
    lookups: &mut Lookups<'_>,
    options: &TopOptions,
) -> Result<Vec<String>, AnswerError> {
    let facts = profile::TopFacts::read(tables, options.by, options.thread)?;
    Ok(profile::top_lines(
        &facts,
        lookups,
        options.count,
        options.frames,
    ))
}

/// `peaks`.
pub fn peaks<M: Memory + ?Sized>(
    tables: &Tables<'_, M>,
    lookups: &mut Lookups<'_>,
    options: &PeaksOptions,
) -> Result<Vec<String>, AnswerError> {
    let facts = profile::PeaksFacts::read(tables)?;
    Ok(profile::peaks_lines(
        &facts,
        lookups,
        options.count,
        options.frames,
    ))
}

/// What `leaks` scans besides the tables: the target's parts that give the roots
/// ([`crate::leaks::roots`]).
#[derive(Clone, Copy, Debug)]
pub struct LeakTarget<'a> {
    /// Where `MEM_TRACE_HEADER` is (its library's data is not a root).
    pub header: u64,
    /// The loaded modules.
    pub modules: &'a [Module],
    /// The mappings.
    pub mappings: &'a [Mapping],
    /// The threads.
    pub threads: &'a [ThreadState],
}

/// `leaks`.
pub fn leaks<M: Memory + ?Sized>(
    tables: &Tables<'_, M>,
    lookups: &mut Lookups<'_>,
    target: &LeakTarget<'_>,
    options: &LeaksOptions,
) -> Result<Vec<String>, AnswerError> {
    leaks_then(tables, lookups, target, options, || {})
}

/// [`leaks`], calling `scanned` once the scan is done, before the answer is written: a
/// reader that stopped the process lets it go there, since what follows reads only stacks
/// and thread records, which a running process never rewrites, and symbolizing can take
/// seconds of a big program's debug information.
pub fn leaks_then<M: Memory + ?Sized>(
    tables: &Tables<'_, M>,
    lookups: &mut Lookups<'_>,
    target: &LeakTarget<'_>,
    options: &LeaksOptions,
    scanned: impl FnOnce(),
) -> Result<Vec<String>, AnswerError> {
    let facts = leaks::LeakFacts::read(
        tables,
        target.header,
        target.modules,
        target.mappings,
        target.threads,
    );
    scanned();
    let facts = facts?;
    let mut out = leaks::lines(
        &facts,
        lookups,
        options.count,
        options.frames,
        !options.no_reachable,
    );
    out.extend(sampled_leaks_line(tables.sample_mean()));
    Ok(out)
}

/// What a leak check can claim when the process samples: it knows only the sampled blocks,
/// counts each once, and cannot follow pointers held in blocks it never saw.
pub fn sampled_leaks_line(mean: u64) -> Option<String> {
    (mean != 0).then(|| {
        format!(
            "(sampled: this process samples {} (MEM_TRACE_SAMPLE), so only sampled blocks were \
             checked, each counted once; a block reachable only through unsampled blocks shows \
             as lost, so \"definitely lost\" is an upper bound and misses unsampled leaks)",
            crate::sample::rate(mean)
        )
    })
}

#[cfg(test)]
mod tests;
