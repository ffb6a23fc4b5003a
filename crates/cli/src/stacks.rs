//! A target's stacks with their counts, symbolized: what flame graphs and DHAT's JSON are made
//! of.
//!
//! The counts are the profiler's (docs/LAYOUT.md "Profile", summed by
//! `mem_trace_read::profile`): per stack, live bytes and blocks now, bytes and blocks ever
//! allocated, and bytes and blocks at the global peak. With a thread, only live blocks count,
//! from the live-block table (the counters are per stack, not per thread), as `mtrace-top
//! --thread` counts them.

use crate::cli::By;
use crate::error::{Error, Result};
use mem_trace_format::{non_negative as positive, Counts};
use mem_trace_read::addr_map::AddrMap;
use mem_trace_read::answer::{profile, AnswerError};
use mem_trace_read::symbolize::SymFrame;
use mem_trace_read::target::{Symbols, Target};
use mem_trace_read::text::FoldedFrame;
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::rc::Rc;

/// One return address of a stack, symbolized.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// The return address.
    pub ra: u64,
    /// What symbolizing it gave: several frames for inlined code, innermost first; none when
    /// nothing names it.
    pub symbols: Vec<SymFrame>,
    /// The module holding it: its path and load bias.
    pub module: Option<(Vec<u8>, u64)>,
}

impl Frame {
    /// Its frames as a folded line names them (one per symbol, or one raw frame).
    pub fn folded(&self) -> impl DoubleEndedIterator<Item = FoldedFrame<'_>> {
        let module = self.module.as_ref().map(|(p, b)| (&p[..], *b));
        let raw = self.symbols.is_empty().then_some(FoldedFrame {
            ra: self.ra,
            symbol: None,
            module,
        });
        self.symbols
            .iter()
            .map(move |s| FoldedFrame {
                ra: self.ra,
                symbol: Some(s),
                module,
            })
            .chain(raw)
    }
}

/// One stack and its counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stack {
    /// Its id in the stack store (0: blocks recorded without a stack).
    pub id: u32,
    /// Its counts.
    pub counts: Counts,
    /// Its frames, innermost (the caller of `malloc`) first; shared by the stacks that pass
    /// through the same return address (a big program's stacks share most of their frames:
    /// a copy each took 600 MB for a compiler's 34k stacks).
    pub frames: Vec<Rc<Frame>>,
}

impl Stack {
    /// Its frames as a folded line names them, innermost first.
    pub fn folded(&self) -> impl DoubleEndedIterator<Item = FoldedFrame<'_>> {
        self.frames.iter().flat_map(|f| f.folded())
    }
}

/// Frames as a [`Stack`] holds them (for tests that build stacks by hand).
#[cfg(test)]
pub(crate) fn shared(frames: Vec<Frame>) -> Vec<Rc<Frame>> {
    frames.into_iter().map(Rc::new).collect()
}

/// What `by` counts of `c`.
pub fn value(c: &Counts, by: By) -> u64 {
    match by {
        By::Live => positive(c.live_bytes),
        By::Allocated => c.total_bytes,
        By::Blocks => positive(c.live_blocks),
        By::Peak => c.peak_bytes,
    }
}

/// A target's stacks and the global numbers that go with them.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Every stack with a count, by id.
    pub stacks: Vec<Stack>,
    /// Allocation events so far (the sequence counter): the target's "now".
    pub now_seq: u64,
    /// The event at the global peak.
    pub peak_seq: u64,
    /// `MEM_TRACE_SAMPLE` of the process (0: every block recorded; else the counts are
    /// estimates).
    pub sample_mean: u64,
}

/// Reads `target`'s stacks with their counts (only the live blocks of thread index `thread`
/// when given) and symbolizes them.
pub fn read(target: &Target, thread: Option<u64>) -> Result<Profile> {
    let layout = |e: mem_trace_read::layout::Error| Error::new(format!("{}: {e}", target.name()));
    let answer = |e: AnswerError| Error::new(format!("{}: {e}", target.name()));
    let tables = target.tables().map_err(layout)?;
    let peaks = profile::require_profiler(&tables).map_err(answer)?;
    let counts = match thread {
        None => tables
            .stack_counts()
            .map_err(layout)?
            .ok_or(AnswerError::NotProfiler)
            .map_err(answer)?,
        Some(t) => {
            let index = u32::try_from(t).unwrap_or(u32::MAX);
            let live = profile::thread_live(&tables, index).map_err(answer)?;
            live.into_iter()
                .map(|(stack, bytes, blocks)| {
                    let counts = Counts {
                        live_bytes: bytes,
                        live_blocks: blocks,
                        ..Counts::default()
                    };
                    (stack, counts)
                })
                .collect::<BTreeMap<u32, Counts>>()
        }
    };
    let mut symbols = Symbols::new(target);
    let mut frames: AddrMap<Rc<Frame>> = AddrMap::default();
    let mut stacks = Vec::new();
    for (id, c) in counts {
        if c == Counts::default() {
            continue;
        }
        let ras = match id {
            0 => Vec::new(),
            _ => tables.stack(id).map_err(layout)?.unwrap_or_default(),
        };
        let frames = ras
            .iter()
            .map(|&ra| {
                frames
                    .entry(ra)
                    .or_insert_with(|| Rc::new(frame(&mut symbols, ra)))
                    .clone()
            })
            .collect();
        stacks.push(Stack {
            id,
            counts: c,
            frames,
        });
    }
    Ok(Profile {
        stacks,
        now_seq: tables
            .header()
            .next_seq
            .load(core::sync::atomic::Ordering::Relaxed),
        peak_seq: peaks.peak_seq,
        sample_mean: tables.sample_mean(),
    })
}

/// Return address `ra` symbolized through the readers' one symbolizer (which caches each
/// address, and reads each module from the file checked against its loaded build id).
fn frame(symbols: &mut Symbols<'_>, ra: u64) -> Frame {
    // The marker of a cut stack is no address: `write_folded` names it.
    if mem_trace_read::text::is_cut_marker(ra) {
        return Frame {
            ra,
            ..Frame::default()
        };
    }
    // The module of the call instruction, one byte before where the call returns.
    let module = symbols.module_of(ra.saturating_sub(1));
    Frame {
        ra,
        symbols: symbols.frames(ra).unwrap_or_default(),
        module: module.map(|m| (m.path.as_os_str().as_bytes().to_vec(), m.bias)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str) -> SymFrame {
        SymFrame {
            function: Some(name.into()),
            ..SymFrame::default()
        }
    }

    #[test]
    fn a_stack_folds_its_inlined_and_raw_frames_in_order() {
        let s = Stack {
            id: 1,
            counts: Counts::default(),
            frames: vec![
                Rc::new(Frame {
                    ra: 0x10,
                    symbols: vec![sym("inner"), sym("outer")],
                    module: None,
                }),
                Rc::new(Frame {
                    ra: 0x7f00_0000_1678,
                    symbols: vec![],
                    module: Some((b"/lib/libx.so".to_vec(), 0x7f00_0000_0000)),
                }),
                Rc::new(Frame {
                    ra: 0x30,
                    symbols: vec![sym("main")],
                    module: None,
                }),
            ],
        };
        let mut line = String::new();
        mem_trace_read::text::write_folded(&mut line, s.folded(), 7).unwrap();
        assert_eq!(line, "main;libx.so+0x1678;outer;inner 7\n");
    }

    #[test]
    fn a_cut_stack_folds_under_the_cut_frame() {
        let s = Stack {
            id: 9,
            counts: Counts::default(),
            frames: vec![
                Rc::new(Frame {
                    ra: 0x10,
                    symbols: vec![sym("site")],
                    module: None,
                }),
                Rc::new(Frame {
                    ra: mem_trace_format::CUT_MARKER,
                    ..Frame::default()
                }),
            ],
        };
        let mut line = String::new();
        mem_trace_read::text::write_folded(&mut line, s.folded(), 3).unwrap();
        assert_eq!(line, "[stack cut: MEM_TRACE_MAX_STACKS];site 3\n");
    }

    #[test]
    fn values_by_what_is_counted() {
        let c = Counts {
            live_bytes: 10,
            live_blocks: u64::MAX, // a racing update, read as 0
            total_bytes: 30,
            total_blocks: 3,
            peak_bytes: 20,
            peak_blocks: 2,
        };
        assert_eq!(value(&c, By::Live), 10);
        assert_eq!(value(&c, By::Blocks), 0);
        assert_eq!(value(&c, By::Allocated), 30);
        assert_eq!(value(&c, By::Peak), 20);
    }
}
