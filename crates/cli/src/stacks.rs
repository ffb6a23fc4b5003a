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
use mem_trace_format::{non_negative as positive, Counts, SHARD_COUNT};
use mem_trace_read::layout::Tables;
use mem_trace_read::memory::Memory;
use mem_trace_read::symbolize::SymFrame;
use mem_trace_read::target::Target;
use mem_trace_read::text::FoldedFrame;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::ffi::OsStrExt;

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
    /// Its frames, innermost (the caller of `malloc`) first.
    pub frames: Vec<Frame>,
}

impl Stack {
    /// Its frames as a folded line names them, innermost first.
    pub fn folded(&self) -> impl DoubleEndedIterator<Item = FoldedFrame<'_>> {
        self.frames.iter().flat_map(Frame::folded)
    }
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
}

/// The line for a library without the profiler's counters.
pub fn not_profiler() -> Error {
    Error::new(
        "this libmem_trace.so was built without the `profiler` feature (header flag bit 1 is \
         clear), so it keeps no per-stack counters or peaks: build it with `cargo build \
         --release --features profiler` and run the program under that library",
    )
}

/// Reads `target`'s stacks with their counts (only the live blocks of thread index `thread`
/// when given) and symbolizes them.
pub fn read(target: &Target, thread: Option<u64>) -> Result<Profile> {
    let layout = |e: mem_trace_read::layout::Error| Error::new(format!("{}: {e}", target.name()));
    let tables = Tables::open(target.memory(), target.header()).map_err(layout)?;
    let Some(peaks) = tables.peaks().map_err(layout)? else {
        return Err(not_profiler());
    };
    let counts = match thread {
        None => tables
            .stack_counts()
            .map_err(layout)?
            .ok_or_else(not_profiler)?,
        Some(t) => thread_counts(&tables, t).map_err(|e| match e {
            ThreadError::Layout(e) => layout(e),
            ThreadError::Unknown(n) => Error::new(format!(
                "no thread {t}: the tracer has seen threads 1..{n} (mem-trace peaks lists them)"
            )),
        })?,
    };
    let mut symbolizer = Symbols::new(target);
    let mut stacks = Vec::new();
    for (id, c) in counts {
        if c == Counts::default() {
            continue;
        }
        let ras = match id {
            0 => Vec::new(),
            _ => tables.stack(id).map_err(layout)?.unwrap_or_default(),
        };
        let frames = ras.iter().map(|&ra| symbolizer.frame(ra)).collect();
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
    })
}

enum ThreadError {
    Layout(mem_trace_read::layout::Error),
    /// No such thread; the number of threads the tracer has seen.
    Unknown(u64),
}

/// The live bytes and blocks per stack of the blocks thread `t` allocated.
fn thread_counts<M: Memory + ?Sized>(
    tables: &Tables<'_, M>,
    t: u64,
) -> std::result::Result<BTreeMap<u32, Counts>, ThreadError> {
    let n = tables.thread_count().map_err(ThreadError::Layout)?;
    if t > n {
        return Err(ThreadError::Unknown(n));
    }
    let mut counts: BTreeMap<u32, Counts> = BTreeMap::new();
    for shard in 0..SHARD_COUNT {
        for b in tables.shard_blocks(shard).map_err(ThreadError::Layout)? {
            if u64::from(b.thread) == t {
                let c = counts.entry(b.stack).or_default();
                c.live_bytes += b.size;
                c.live_blocks += 1;
            }
        }
    }
    Ok(counts)
}

/// Symbolizes return addresses over the target's modules (through the readers' one
/// symbolizer, which reads each module from the file checked against its loaded build id),
/// each address once.
struct Symbols<'t> {
    symbols: mem_trace_read::target::Symbols<'t>,
    cache: HashMap<u64, Frame>,
}

impl<'t> Symbols<'t> {
    fn new(target: &'t Target) -> Self {
        Symbols {
            symbols: mem_trace_read::target::Symbols::new(target),
            cache: HashMap::new(),
        }
    }

    fn frame(&mut self, ra: u64) -> Frame {
        if let Some(f) = self.cache.get(&ra) {
            return f.clone();
        }
        // The module of the call instruction, one byte before where the call returns.
        let module = self.symbols.module_of(ra.saturating_sub(1));
        let f = Frame {
            ra,
            symbols: self.symbols.frames(ra).unwrap_or_default(),
            module: module.map(|m| (m.path.as_os_str().as_bytes().to_vec(), m.bias)),
        };
        self.cache.insert(ra, f.clone());
        f
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
                Frame {
                    ra: 0x10,
                    symbols: vec![sym("inner"), sym("outer")],
                    module: None,
                },
                Frame {
                    ra: 0x7f00_0000_1678,
                    symbols: vec![],
                    module: Some((b"/lib/libx.so".to_vec(), 0x7f00_0000_0000)),
                },
                Frame {
                    ra: 0x30,
                    symbols: vec![sym("main")],
                    module: None,
                },
            ],
        };
        let mut line = String::new();
        mem_trace_read::text::write_folded(&mut line, s.folded(), 7).unwrap();
        assert_eq!(line, "main;libx.so+0x1678;outer;inner 7\n");
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
