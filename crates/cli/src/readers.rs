//! The subcommands that answer as the gdb commands do: `top`, `peaks`, `leaks`, `why`,
//! `history`, `info`.
//!
//! COORDINATOR: this is the dispatch point to wire. Each function gets the parsed options of
//! its subcommand (`crate::cli`, the same names and defaults as the gdb command's argparse
//! parser) and is to open the target (`mem_trace_read::target::Target::open(&args.target.source())`,
//! whose `TargetError` displays as the one-line message) and print the answer's lines
//! (`mem_trace_read::answer`) on stdout. Until then each says so in one line and fails.

use crate::cli::{HistoryArgs, InfoArgs, LeaksArgs, PeaksArgs, TopArgs, WhyArgs};
use crate::error::{Error, Result};

/// The line every unwired subcommand fails with.
fn not_yet(command: &str, gdb: &str) -> Error {
    Error::new(format!(
        "`mem-trace {command}` is not wired to the readers yet: use `{gdb}` in gdb for now"
    ))
}

/// `mem-trace top TARGET [N] [--by ...] [--thread T] [-f N] [-r]`.
pub fn top(args: &TopArgs) -> Result<()> {
    let _ = args;
    Err(not_yet("top", "mtrace-top"))
}

/// `mem-trace peaks TARGET [-n N] [-f N] [-r]`.
pub fn peaks(args: &PeaksArgs) -> Result<()> {
    let _ = args;
    Err(not_yet("peaks", "mtrace-peaks"))
}

/// `mem-trace leaks TARGET [-n N] [--no-reachable] [-f N] [-r]`.
pub fn leaks(args: &LeaksArgs) -> Result<()> {
    let _ = args;
    Err(not_yet("leaks", "mtrace-leaks"))
}

/// `mem-trace why TARGET ADDR [-n N] [--gap BYTES] [-r]`.
pub fn why(args: &WhyArgs) -> Result<()> {
    let _ = args;
    Err(not_yet("why", "mtrace-why"))
}

/// `mem-trace history TARGET ADDR [-n N] [--no-stacks] [-r]`.
pub fn history(args: &HistoryArgs) -> Result<()> {
    let _ = args;
    Err(not_yet("history", "mtrace-history"))
}

/// `mem-trace info TARGET`.
pub fn info(args: &InfoArgs) -> Result<()> {
    let _ = args;
    Err(not_yet("info", "mtrace-info"))
}
