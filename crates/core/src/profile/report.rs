//! The text of a report, in the seed's format: stacks numbered `# N: BYTES bytes`, `# 0` the
//! biggest, frames with function and `at file:line`, inlined frames too.
//!
//! A periodic report is the top stacks by `MEM_TRACE_PROFILE_BY`, biggest last (the end of the
//! output is what a terminal shows). A full report (the snapshot signal, and at exit) adds the
//! peaks (global, per thread, and the stacks held at the global peak) and the leak check,
//! whose groups come biggest first, as LSan and memcheck list them.
//!
//! With `MEM_TRACE_OUT`, the report's ranking is also written as folded stacks, `X.folded`
//! beside the report's `X.txt` (one line a stack, its value the ranking's count, symbolized
//! once for both files, and a last `[N other stacks]` line for what the ranking left out, so
//! that the graph keeps the scale of the whole), and drawn as `X.svg` (`svg`); without
//! `mem-trace run`, the process's pprof profile (every stack) goes beside them as `X.pb.gz`
//! (`pprof`).
//!
//! At the end (the exit and final reports), a program that freed (nearly) everything leaves
//! an empty graph of what is live: when what is live is under a tenth of the global peak, the
//! graph is of the stacks live at the global peak instead, and the report says so. A graph
//! with no stack in it is not drawn, and its empty `.folded` not left; a graph the renderer
//! failed to draw is not left either.
//!
//! Everything is computed first (rankings, the leak scan: arena memory, no lock the
//! allocation path waits on for long), then written while symbolizing in the scratch region
//! (`report::frames`), never while holding anything an allocating thread needs. Under
//! `mem-trace run` the exit and final reports are written raw instead (`deferred`: return
//! addresses, the modules, the command line, the graph's title), and `run` symbolizes them
//! and draws their graphs once the program has ended.

use crate::arena::Arena;
use crate::config::{self, RankBy};
use crate::out::Out;
use crate::profile::counters::{Counts, PROFILE};
use crate::profile::leaks::{self, ArenaVec, Total};
use crate::profile::output;
use crate::profile::pprof;
use crate::profile::rank::{self, positive, Ranked};
use crate::profile::svg;
use crate::report::frames::{Printing, StackWriter};
use crate::store::header::header;
use crate::store::{stacks, table, threads};
use allocator_api2::vec::Vec as AVec;
use core::fmt::{self, Write};
use core::sync::atomic::Ordering::Relaxed;

/// Why a report is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Every `MEM_TRACE_PROFILE_INTERVAL`: the top stacks.
    Periodic,
    /// The snapshot signal: everything, leaks so far included.
    Snapshot,
    /// At exit: everything, with the leak check (`MEM_TRACE_LEAKS`).
    Exit,
    /// Asked for by the program (`mem_trace::report`): everything, to where it said.
    Requested,
    /// Asked for by `mem-trace run` when it was told to stop (`requests`): everything, as at
    /// exit, before the signal is passed on to the program.
    Final,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Periodic => "periodic",
            Kind::Snapshot => "snapshot",
            Kind::Exit => "at exit",
            Kind::Requested => "requested",
            Kind::Final => "final",
        }
    }
}

/// Writes one report. `own_sp`: the calling thread's stack pointer when it is a program thread
/// (at exit), for the leak scan's roots. `printing`: the right to symbolize, if had. `to`:
/// where the program asked for it, else where `MEM_TRACE_OUT` says (`output`).
pub(crate) fn write(kind: Kind, own_sp: Option<u64>, printing: Option<&Printing>, to: Option<Out>) {
    let n = PROFILE.reports.fetch_add(1, Relaxed) + 1;
    let h = header();
    let live = positive(h.live_bytes.load(Relaxed));
    let peak = h.peak_bytes.load(Relaxed);
    let top_n = config::PROFILE_TOP.load(Relaxed);
    let by = RankBy::from_u8(config::PROFILE_BY.load(Relaxed));
    let all = rank::all();
    let empty: &[Counts] = &[];
    let all_ref = all.as_deref().unwrap_or(empty);
    // Tagged blocks are in no table: the stacks' counters count every block.
    let live_blocks = match crate::store::tags::key() {
        0 => table::totals().0,
        _ => all_ref.iter().map(|c| positive(c.live_blocks)).sum(),
    };
    let top = rank::top(all_ref, top_n, |c| rank::key(c, by));
    let full = kind != Kind::Periodic;
    let at_peak = if full {
        rank::top(all_ref, top_n, |c| c.peak_bytes)
    } else {
        AVec::new_in(Arena)
    };
    let graph_by = graph_ranking(kind, by, live, peak);
    // The graph's rows: the ranking it is drawn from, with something in it.
    let graph_rows = if graph_by == by {
        top.len()
    } else {
        at_peak.len()
    };
    let leaks = if full {
        leaks::check(own_sp, kind == Kind::Exit)
    } else {
        None
    };
    let groups = leaks.as_ref().and_then(|l| group(&l.blocks));
    if let (Kind::Exit, Some(l)) = (kind, &leaks) {
        super::gate::leak_check(
            (l.lost.bytes, l.lost.blocks),
            (l.possibly.bytes, l.possibly.blocks),
        );
    }
    let errors = crate::store::freed::HISTORY.errors.load(Relaxed);

    let (mut out, path) = match to {
        Some(out) => (out, None),
        None => output::open(),
    };
    // With a report file, its folded stacks go beside it (then drawn as a flame graph); not
    // for a graph with nothing in it.
    let mut folded = path
        .as_ref()
        .filter(|_| graph_rows > 0)
        .and_then(|p| output::sibling(p, "folded"));
    // Under `mem-trace run`, the exit and final reports leave symbolizing to it.
    let deferred = super::deferred::on(matches!(kind, Kind::Exit | Kind::Final), path.is_some());
    let mut stacks_out = match printing {
        _ if deferred => StackWriter::deferred(),
        Some(p) => p.writer(),
        None => StackWriter::raw("another thread is symbolizing"),
    };
    let _ = (|| -> fmt::Result {
        if deferred {
            super::deferred::write_head(&mut out)?;
            let title = graph_title(graph_by, graph_by != by, kind, n);
            if let (Some(_), Some(title)) = (&folded, title) {
                let by = by_name(graph_by).to_str().unwrap_or("live");
                mem_trace_read::deferred::write_graph(&mut out, by, title.as_str())?;
            }
        }
        writeln!(
            out,
            "mem-trace: report {n} ({}) at {:.3} s: {live} bytes live in {}, peak {peak} bytes",
            kind.name(),
            seconds_since_start(),
            blocks(live_blocks),
        )?;
        if super::python::bypassed_here() {
            writeln!(out, "{}", super::python::LINE)?;
        }
        if errors > 0 {
            // `mem-trace run --error-exitcode` reads this line.
            writeln!(
                out,
                "mem-trace: errors: {}, each reported on stderr when it happened",
                Counted(errors, "double or invalid free")
            )?;
        }
        if let mean @ 1.. = crate::sample::mean() {
            // The same line the readers print: every count below is scaled from samples.
            writeln!(
                out,
                "mem-trace: estimated from sampled allocations: this process samples {} \
                 (MEM_TRACE_SAMPLE)",
                mem_trace_read::sample::Rate(mean)
            )?;
        }
        if graph_by != by && folded.is_some() {
            writeln!(
                out,
                "mem-trace: little is live now ({live} bytes of a {peak}-byte peak): the flame \
                 graph shows the stacks live at the global peak"
            )?;
        }
        writeln!(
            out,
            "mem-trace: top {} stacks by {}, biggest last:",
            top.len(),
            what(by)
        )?;
        for (i, r) in top.iter().enumerate().rev() {
            let c = &r.counts;
            let folded = folded
                .as_mut()
                .filter(|_| graph_by == by)
                .map(|(f, _)| (f, rank::key(c, by)));
            match by {
                RankBy::Allocated => writeln!(
                    out,
                    "# {i}: {} bytes allocated in {}, {} bytes live",
                    c.total_bytes,
                    blocks(c.total_blocks),
                    positive(c.live_bytes)
                )?,
                RankBy::Peak => writeln!(
                    out,
                    "# {i}: {} bytes in {} at the peak, {} bytes live",
                    c.peak_bytes,
                    blocks(c.peak_blocks),
                    positive(c.live_bytes)
                )?,
                _ => writeln!(
                    out,
                    "# {i}: {} bytes in {}",
                    positive(c.live_bytes),
                    blocks(positive(c.live_blocks))
                )?,
            }
            stack_and_folded(&mut out, &mut stacks_out, r, folded)?;
        }
        if let Some((f, _)) = folded.as_mut().filter(|_| graph_by == by) {
            other_stacks(f, all_ref, &top, by)?;
        }
        if !full {
            return stacks_out.write_names_hint(&mut out);
        }
        let peak_folded = folded.as_mut().filter(|_| graph_by != by).map(|(f, _)| f);
        write_peaks(&mut out, &mut stacks_out, &at_peak, all_ref, peak_folded)?;
        match (&leaks, &groups) {
            (Some(l), Some(g)) => write_leaks(&mut out, &mut stacks_out, l, g, top_n)?,
            _ => writeln!(out, "mem-trace: leak check: out of memory, skipped")?,
        }
        stacks_out.write_names_hint(&mut out)?;
        writeln!(out, "mem-trace: end of report {n}")
    })();
    drop(stacks_out);
    drop(out);
    if let Some((f, path)) = folded {
        drop(f);
        if !deferred {
            flame_graph(&path, graph_by, graph_by != by, kind, n);
        }
    }
    if let Some(report) = &path {
        pprof::beside(report);
    }
}

/// What a report's flame graph counts: what the report ranks by, except at the end of a
/// program that freed nearly everything (live under a tenth of the `peak`), whose graph of
/// live bytes or blocks would be (nearly) empty: then the stacks live at the global peak.
fn graph_ranking(kind: Kind, by: RankBy, live: u64, peak: u64) -> RankBy {
    let at_the_end = matches!(kind, Kind::Exit | Kind::Final);
    let of_live = matches!(by, RankBy::Live | RankBy::Blocks);
    if at_the_end && of_live && peak > 0 && live.saturating_mul(10) < peak {
        RankBy::Peak
    } else {
        by
    }
}

/// Draws the flame graph of the folded stacks at `folded` (`X.svg` beside `X.folded`);
/// `instead` when it is of the peak because little was live.
fn flame_graph(folded: &output::PathBuf, by: RankBy, instead: bool, kind: Kind, n: u64) {
    let Some(svg) = folded.with_extension("svg") else {
        return;
    };
    let drawn = graph_title(by, instead, kind, n)
        .is_some_and(|title| svg::draw(folded, &svg, by_name(by), &title));
    if !drawn {
        // Whatever a failed renderer left is no graph.
        // SAFETY: removes a file of ours by its NUL-terminated path.
        unsafe { libc::unlink(svg.as_c()) };
    }
}

/// The title of a report's flame graph, NUL-terminated; `instead` when it is of the peak
/// because little was live.
fn graph_title(by: RankBy, instead: bool, kind: Kind, n: u64) -> Option<output::PathBuf> {
    let mut title = output::PathBuf::default();
    write!(
        title,
        "{}{}: report {n} ({}) of process {}\0",
        what(by),
        if instead {
            " (little was live at the end)"
        } else {
            ""
        },
        kind.name(),
        // SAFETY: getpid has no preconditions.
        unsafe { libc::getpid() }
    )
    .ok()?;
    Some(title)
}

/// What `mem-trace flamegraph --by` calls a ranking by `by`.
fn by_name(by: RankBy) -> &'static core::ffi::CStr {
    match by {
        RankBy::Live => c"live",
        RankBy::Allocated => c"allocated",
        RankBy::Blocks => c"blocks",
        RankBy::Peak => c"peak",
    }
}

/// What a ranking by `by` counts, in words.
fn what(by: RankBy) -> &'static str {
    match by {
        RankBy::Live => "live bytes",
        RankBy::Allocated => "bytes allocated",
        RankBy::Blocks => "live blocks",
        RankBy::Peak => "bytes live at the global peak",
    }
}

fn stack(out: &mut Out, w: &mut StackWriter<'_>, r: &Ranked) -> fmt::Result {
    stack_and_folded(out, w, r, None)
}

/// The stack of `r` in the report, and as a folded line with its value when `folded` is given.
fn stack_and_folded(
    out: &mut Out,
    w: &mut StackWriter<'_>,
    r: &Ranked,
    folded: Option<(&mut Out, u64)>,
) -> fmt::Result {
    let mut buf = [0; stacks::MAX_STACK_FRAMES];
    let frames = match stacks::frames(r.stack, &mut buf) {
        Some(frames) if r.stack != 0 => frames,
        _ => &[],
    };
    w.write_with_folded(out, frames, folded)
}

/// The folded line of what the ranking left out (`[N other stacks] VALUE`), so that a flame
/// graph of the top stacks is drawn to the scale of the whole.
fn other_stacks(f: &mut Out, all: &[Counts], top: &[Ranked], by: RankBy) -> fmt::Result {
    let (mut count, mut total) = (0u64, 0u64);
    for c in all {
        let k = rank::key(c, by);
        if k > 0 {
            count += 1;
            total = total.wrapping_add(k);
        }
    }
    let shown: u64 = top.iter().map(|r| rank::key(&r.counts, by)).sum();
    let others = count.saturating_sub(top.len() as u64);
    if others == 0 || total <= shown {
        return Ok(());
    }
    writeln!(f, "[{}] {}", Counted(others, "other stack"), total - shown)
}

fn seconds_since_start() -> f64 {
    crate::clock::monotonic_ns().saturating_sub(PROFILE.started_ns.load(Relaxed)) as f64 / 1e9
}

/// The global peak, every thread's (running threads all, exited ones, which keep theirs, the
/// [`EXITED_SHOWN`] with the highest peaks and a line for the rest), and the stacks held at
/// the global peak, written as folded stacks too when `folded` is given (the flame graph is
/// of the peak).
fn write_peaks(
    out: &mut Out,
    w: &mut StackWriter<'_>,
    at_peak: &[Ranked],
    all: &[Counts],
    mut folded: Option<&mut Out>,
) -> fmt::Result {
    let h = header();
    writeln!(
        out,
        "mem-trace: global peak: {} bytes (at event {}, {} peak resets so far)",
        h.peak_bytes.load(Relaxed),
        h.peak_seq.load(Relaxed),
        PROFILE.resets.load(Relaxed)
    )?;
    let count = threads::THREADS
        .count
        .load(Relaxed)
        .min(u64::from(u32::MAX)) as u32;
    let exited = |t: &mem_trace_format::ThreadRecord| {
        t.flags.load(Relaxed) & mem_trace_format::THREAD_EXITED != 0
    };
    let mut shown = ExitedShown::default();
    for i in 1..=count {
        if let Some(t) = threads::get(i).filter(|t| exited(t)) {
            shown.offer(t.peak_bytes.load(Relaxed), i);
        }
    }
    writeln!(out, "mem-trace: thread peaks:")?;
    let mut rest = ExitedRest::default();
    for i in 1..=count {
        let Some(t) = threads::get(i) else {
            continue;
        };
        if exited(t) && !shown.has(i) {
            rest.add(t);
            continue;
        }
        writeln!(
            out,
            "   thread {i} (tid {}, {}): peak {} bytes, live {} bytes, allocated {} bytes{}",
            t.tid.load(Relaxed),
            ThreadName(&t.name),
            t.peak_bytes.load(Relaxed),
            t.live_bytes(),
            t.allocated_bytes.load(Relaxed),
            if exited(t) { ", exited" } else { "" }
        )?;
    }
    if rest.threads > 0 {
        writeln!(
            out,
            "   ... and {} more exited {}, each with a peak of at most {} bytes, {} bytes allocated in all",
            rest.threads,
            if rest.threads == 1 { "thread" } else { "threads" },
            rest.max_peak,
            rest.allocated
        )?;
    }
    writeln!(
        out,
        "mem-trace: top {} stacks at the global peak, biggest last:",
        at_peak.len()
    )?;
    for (i, r) in at_peak.iter().enumerate().rev() {
        writeln!(
            out,
            "# {i}: {} bytes in {} at the peak",
            r.counts.peak_bytes,
            blocks(r.counts.peak_blocks)
        )?;
        let f = folded.as_deref_mut().map(|f| (f, r.counts.peak_bytes));
        stack_and_folded(out, w, r, f)?;
    }
    if let Some(f) = folded {
        other_stacks(f, all, at_peak, RankBy::Peak)?;
    }
    Ok(())
}

/// Exited threads listed one a line in a full report: a server that made a thread per
/// request would otherwise list hundreds.
const EXITED_SHOWN: usize = 10;

/// The exited threads with the highest peaks (ties: the first made), kept without allocating.
#[derive(Default)]
struct ExitedShown {
    /// (peak, index), the highest first; index 0: an empty place.
    top: [(u64, u32); EXITED_SHOWN],
}

impl ExitedShown {
    fn offer(&mut self, peak: u64, index: u32) {
        let Some(at) = self.top.iter().position(|&(p, i)| i == 0 || peak > p) else {
            return;
        };
        self.top.copy_within(at..EXITED_SHOWN - 1, at + 1);
        self.top[at] = (peak, index);
    }

    fn has(&self, index: u32) -> bool {
        self.top.iter().any(|&(_, i)| i == index)
    }
}

/// The exited threads not listed, summed.
#[derive(Default)]
struct ExitedRest {
    threads: u64,
    max_peak: u64,
    allocated: u64,
}

impl ExitedRest {
    fn add(&mut self, t: &mem_trace_format::ThreadRecord) {
        self.threads += 1;
        self.max_peak = self.max_peak.max(t.peak_bytes.load(Relaxed));
        self.allocated = self.allocated.wrapping_add(t.allocated_bytes.load(Relaxed));
    }
}

/// Per class (lost, possibly lost, reachable), the bytes and blocks of each stack id.
struct Groups {
    by_class: [ArenaVec<Counts>; 3],
}

fn group(blocks: &[leaks::Live]) -> Option<Groups> {
    let n = blocks.iter().map(|b| b.stack).max().unwrap_or(0) as usize + 1;
    let mut g = Groups {
        by_class: [
            AVec::new_in(Arena),
            AVec::new_in(Arena),
            AVec::new_in(Arena),
        ],
    };
    for v in &mut g.by_class {
        v.try_reserve_exact(n).ok()?;
        v.resize(n, Counts::default());
    }
    for b in blocks {
        // Reuses the `live_*` fields of `Counts` for the class's bytes and blocks.
        let c = &mut g.by_class[b.class() as usize][b.stack as usize];
        c.live_bytes += b.size;
        c.live_blocks += 1;
    }
    Some(g)
}

fn write_leaks(
    out: &mut Out,
    w: &mut StackWriter<'_>,
    l: &leaks::Leaks,
    g: &Groups,
    top_n: usize,
) -> fmt::Result {
    let t = |t: &Total| (t.bytes, t.blocks);
    writeln!(
        out,
        "mem-trace: leak check: definitely lost: {} bytes in {} (direct: {} bytes in {}, indirect: {} bytes in {}); possibly lost: {} bytes in {}; still reachable: {} bytes in {}",
        t(&l.lost).0,
        blocks(t(&l.lost).1),
        l.lost.bytes - l.indirect.bytes,
        blocks(l.lost.blocks - l.indirect.blocks),
        l.indirect.bytes,
        blocks(l.indirect.blocks),
        t(&l.possibly).0,
        blocks(t(&l.possibly).1),
        t(&l.reachable).0,
        blocks(t(&l.reachable).1)
    )?;
    match l.stop {
        Some(Ok(p)) if p.left > 0 => writeln!(
            out,
            "mem-trace: leak check: stopped {} other threads for {} ms; {} more ran on (no room to stop them): blocks they changed meanwhile may be misclassified",
            p.threads, p.ms, p.left
        )?,
        Some(Ok(p)) if p.threads == 0 => {}
        Some(Ok(p)) => writeln!(
            out,
            "mem-trace: leak check: stopped {} for {} ms",
            Counted(p.threads as u64, "other thread"),
            p.ms
        )?,
        Some(Err(e)) => {
            write!(out, "mem-trace: leak check: other threads not stopped ({}", e.what)?;
            if e.errno != 0 {
                write!(out, ": {}", std::io::Error::from_raw_os_error(e.errno))?;
            }
            writeln!(
                out,
                "): blocks they changed during the scan may be misclassified, and their registers and the dead part of their stacks are not told apart"
            )?;
        }
        None => {}
    }
    for (class, name) in [
        (0, "definitely lost"),
        (1, "possibly lost"),
        (2, "still reachable"),
    ] {
        let all = &g.by_class[class];
        let stacks_with = all.iter().filter(|c| c.live_blocks > 0).count();
        if stacks_with == 0 {
            continue;
        }
        let top = rank::top(all, top_n, |c| c.live_bytes);
        writeln!(
            out,
            "mem-trace: {name}: {}, biggest first:",
            Counted(stacks_with as u64, "stack")
        )?;
        for (i, r) in top.iter().enumerate() {
            writeln!(
                out,
                "# {i}: {} bytes in {} {name}",
                r.counts.live_bytes,
                blocks(r.counts.live_blocks)
            )?;
            stack(out, w, r)?;
        }
        if stacks_with > top.len() {
            let shown: u64 = top.iter().map(|r| r.counts.live_bytes).sum();
            let total: u64 = all.iter().map(|c| c.live_bytes).sum();
            writeln!(
                out,
                "mem-trace: ... and {} more stacks, {} bytes {name}",
                stacks_with - top.len(),
                total - shown
            )?;
        }
    }
    Ok(())
}

/// A thread's name as the gdb commands and `mem-trace` show it (`read::text::Quoted`). The
/// name is whatever the program set with `prctl`, up to 16 bytes, NUL-padded.
struct ThreadName<'a>(&'a [u8; 16]);

impl fmt::Display for ThreadName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = &self.0[..self.0.iter().position(|&b| b == 0).unwrap_or(16)];
        write!(f, "{}", mem_trace_read::text::QuotedBytes(name))
    }
}

/// A count with its noun: "1 block", "2 blocks".
struct Counted(u64, &'static str);

impl fmt::Display for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            1 => write!(f, "1 {}", self.1),
            n => write!(f, "{n} {}s", self.1),
        }
    }
}

/// A block count with its noun.
fn blocks(n: u64) -> Counted {
    Counted(n, "block")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_names_cannot_forge_lines_or_drive_the_terminal() {
        let mut name = [0u8; 16];
        name[..14].copy_from_slice(b"x\n\x1b[31mRED\r\"ab");
        assert_eq!(ThreadName(&name).to_string(), r#""x\n\x1b[31mRED\r\"ab""#);
        let mut bytes = [0u8; 16];
        bytes[..3].copy_from_slice(b"a\xff\n");
        assert_eq!(ThreadName(&bytes).to_string(), "\"a\u{fffd}\\n\"");
        let mut plain = [0u8; 16];
        plain[..7].copy_from_slice("worker1".as_bytes());
        assert_eq!(ThreadName(&plain).to_string(), "\"worker1\"");
    }

    #[test]
    fn the_exited_threads_shown_are_those_with_the_highest_peaks() {
        let mut shown = ExitedShown::default();
        for i in 1..=30u32 {
            // Peaks 0, 10, ..., 290, with thread 5's the highest.
            let peak = if i == 5 {
                10_000
            } else {
                u64::from(i - 1) * 10
            };
            shown.offer(peak, i);
        }
        assert!(shown.has(5) && shown.has(30) && shown.has(22));
        assert!(!shown.has(21) && !shown.has(1));
        assert_eq!(shown.top[0], (10_000, 5));
        // Ties: the first made stays.
        let mut ties = ExitedShown::default();
        for i in 1..=12u32 {
            ties.offer(7, i);
        }
        assert!(ties.has(1) && ties.has(10) && !ties.has(11));
    }

    #[test]
    fn counts_take_their_noun() {
        assert_eq!(blocks(1).to_string(), "1 block");
        assert_eq!(blocks(0).to_string(), "0 blocks");
        assert_eq!(Counted(3, "stack").to_string(), "3 stacks");
    }
}
