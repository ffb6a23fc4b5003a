//! Why an answer could not be given: [`AnswerError`], which every answer returns. A leaf of
//! `answer`: the answers (`ask`, `leaks`, `profile`) import it, it imports none of them.

use crate::layout;
use core::fmt;

/// The refusal of the `top` and `peaks` answers under an old tracer-only library, which kept
/// no counters (every build keeps them now).
pub const NOT_PROFILER: &str = "this libmem_trace.so is an old tracer-only build (header flag \
    bit 1 is clear), so it keeps no per-stack counters or peaks: rebuild it with \
    `cargo build --release` and run the program under that library";

/// Why an answer could not be given; each displays as one line saying what to do.
#[derive(Debug)]
pub enum AnswerError {
    /// The library was built without the profiler: no counters to rank (`top`, `peaks`).
    NotProfiler,
    /// The options ask for something the tables cannot answer.
    Usage(String),
    /// Not enough memory for the leak scan of this many live blocks.
    OutOfMemory(usize),
    /// The tables could not be read.
    Layout(layout::Error),
}

impl fmt::Display for AnswerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnswerError::NotProfiler => f.write_str(NOT_PROFILER),
            AnswerError::Usage(what) => f.write_str(what),
            AnswerError::OutOfMemory(n) => write!(
                f,
                "not enough memory for the leak scan of {n} live blocks: free some, or scan a core on a bigger machine"
            ),
            AnswerError::Layout(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for AnswerError {}

impl From<layout::Error> for AnswerError {
    fn from(e: layout::Error) -> Self {
        AnswerError::Layout(e)
    }
}
