//! `mem-trace dhat`: DHAT's JSON (`dhatFileVersion` 2), so that valgrind's own viewer,
//! `dh_view.html`, shows a target's stacks.
//!
//! The format is the one documented at the top of valgrind's `dhat/dh_main.c` and read by
//! `dh_view.js` (`buildTree`, `checkPP`). What is required depends on two flags: every file
//! has `tb`, `tbk` and `fs` per program point; `bklt` (block lifetimes) adds `tg` and `tuth`
//! to the file and `mb mbk gb gbk eb ebk` (and `tl`, read though not checked) to each point;
//! `bkacc` (block accesses) adds `rb` and `wb`.
//!
//! What we have per stack, and where it goes:
//!
//! | DHAT | meaning in DHAT | ours |
//! | --- | --- | --- |
//! | `tb`, `tbk` | bytes, blocks ever allocated ("Total") | the same: `total_bytes`, `total_blocks` |
//! | `gb`, `gbk` | live at the global peak ("At t-gmax") | the same: `peak_bytes`, `peak_blocks` (since the last reset) |
//! | `eb`, `ebk` | live at the end ("At t-end") | live now: `live_bytes`, `live_blocks` (the end, for a core of an exiting process) |
//! | `mb`, `mbk` | the most this point held at once ("Max") | not kept: a lower bound, the most of at-peak, now, and one block of the average size (the largest block was at least that, and was live once) |
//! | `tl` | total lifetime of its blocks | not kept: left out, so the viewer shows "NaN" rather than a made-up 0 |
//! | `rb`, `wb`, `acc` | reads, writes, access histogram | not kept: `bkacc` is false, so the viewer hides them |
//!
//! So `bklt` is true: it is what makes the viewer show (and sort by) "At t-gmax" and
//! "At t-end", our most useful counts; the lifetime-only parts it also turns on are either left
//! out (`tl`) or given their honest lower bound (`mb`). Times are in allocation events
//! (`tu`: the tracer's sequence counter, one per allocation and per free), as DHAT counts
//! instructions: `te` is the counter now, `tg` its value at the global peak.
//!
//! Frames are DHAT's strings, `0xADDR: function (file:line:col)`, one per symbolized frame
//! (inlined frames share their address), innermost first, with `[root]` first in `ftbl`.

use crate::cli::DhatArgs;
use crate::error::Result;
use crate::flamegraph::write_to;
use crate::stacks::{self, Frame, Profile, Stack};
use mem_trace_read::answer::frame::module_offset;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt::Write as _;

/// The file's format version, as `dh_view.js` expects it (`kExpectedFileVersion`).
const FILE_VERSION: u32 = 2;
/// The frame every stack hangs from, index 0 of `ftbl`.
const ROOT: &str = "[root]";
/// The "short-lived" threshold in time units. Required with `bklt`, meaningless without
/// lifetimes: the viewer's "short-lived" view finds nothing (its averages are NaN).
const SHORT_LIVED: u64 = 0;

/// A DHAT file (`dh_main.c`'s format; field names are the format's).
#[derive(Debug, Serialize)]
#[allow(non_snake_case)]
pub struct Dhat {
    /// The format's version: 2.
    dhatFileVersion: u32,
    /// Free-form: how the data was made.
    mode: String,
    /// What happened at the stacks: `<verb> at {`.
    verb: &'static str,
    /// Block lifetimes recorded: true, for `gb`/`eb` (see the module doc).
    bklt: bool,
    /// Block accesses recorded: no.
    bkacc: bool,
    /// The time unit: allocation events.
    tu: &'static str,
    /// A million of them.
    Mtu: &'static str,
    /// The short-lived threshold (see [`SHORT_LIVED`]).
    tuth: u64,
    /// The command.
    cmd: String,
    /// The process id.
    pid: i64,
    /// Time at the end (now): events so far.
    te: u64,
    /// Time at the global peak: the event at the peak.
    tg: u64,
    /// One program point per stack.
    pps: Vec<ProgramPoint>,
    /// Frame strings; `fs` indexes into it.
    ftbl: Vec<String>,
}

/// One stack (a DHAT program point).
#[derive(Debug, Serialize)]
struct ProgramPoint {
    /// Bytes ever allocated.
    tb: u64,
    /// Blocks ever allocated.
    tbk: u64,
    /// The most held at once: not kept; a lower bound (see [`max_lower_bound`]).
    mb: u64,
    /// The blocks that went with `mb`.
    mbk: u64,
    /// Bytes live at the global peak.
    gb: u64,
    /// Blocks live at the global peak.
    gbk: u64,
    /// Bytes live now.
    eb: u64,
    /// Blocks live now.
    ebk: u64,
    /// Frames, innermost first, as indexes into `ftbl`.
    fs: Vec<usize>,
}

/// The DHAT file of `profile`, for the process `pid` run as `cmd`.
pub fn document(cmd: &str, pid: i64, profile: &Profile) -> Dhat {
    let mut ftbl = vec![ROOT.to_string()];
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut intern = |s: String| {
        *index.entry(s).or_insert_with_key(|s| {
            ftbl.push(s.clone());
            ftbl.len() - 1
        })
    };
    let mut pps = Vec::new();
    for s in &profile.stacks {
        let fs = frame_strings(s).into_iter().map(&mut intern).collect();
        pps.push(program_point(s, fs));
    }
    Dhat {
        dhatFileVersion: FILE_VERSION,
        mode: match profile.sample_mean {
            0 => "heap (mem-trace)".to_string(),
            mean => format!(
                "heap (mem-trace), estimated from samples: {}",
                mem_trace_read::sample::rate(mean)
            ),
        },
        verb: "Allocated",
        bklt: true,
        bkacc: false,
        tu: "events",
        Mtu: "Mevent",
        tuth: SHORT_LIVED,
        cmd: cmd.to_string(),
        pid,
        te: profile.now_seq,
        tg: profile.peak_seq,
        pps,
        ftbl,
    }
}

fn program_point(s: &Stack, fs: Vec<usize>) -> ProgramPoint {
    let c = &s.counts;
    let (gb, gbk) = (c.peak_bytes, c.peak_blocks);
    let (eb, ebk) = (
        mem_trace_format::non_negative(c.live_bytes),
        mem_trace_format::non_negative(c.live_blocks),
    );
    let (mb, mbk) = max_lower_bound(c);
    ProgramPoint {
        tb: c.total_bytes,
        tbk: c.total_blocks,
        mb,
        mbk,
        gb,
        gbk,
        eb,
        ebk,
        fs,
    }
}

/// The most a stack is known to have held at once, with its blocks: what it held at the global
/// peak or holds now, or one block of its average size (its largest block was at least that
/// big, and was live once), whichever is the most bytes.
fn max_lower_bound(c: &mem_trace_format::Counts) -> (u64, u64) {
    let now = (
        mem_trace_format::non_negative(c.live_bytes),
        mem_trace_format::non_negative(c.live_blocks),
    );
    let one_block = match c.total_blocks {
        0 => (0, 0),
        n => (c.total_bytes / n, 1),
    };
    [(c.peak_bytes, c.peak_blocks), now, one_block]
        .into_iter()
        .max_by_key(|&(bytes, _)| bytes)
        .unwrap_or_default()
}

/// A stack's frames as DHAT's strings, innermost first. A stack recorded without frames gets
/// one pseudo-frame, so that it is a program point of its own rather than the root.
fn frame_strings(s: &Stack) -> Vec<String> {
    let mut out = Vec::new();
    for f in &s.frames {
        frame(&mut out, f);
    }
    if out.is_empty() {
        out.push(mem_trace_read::text::NO_STACK.to_string());
    }
    out
}

/// `0xADDR: function (file:line:col)` per symbolized frame; `0xADDR: module+0xoffset (in
/// /path/module)` when nothing names the address, spelled as every other output spells it.
fn frame(out: &mut Vec<String>, f: &Frame) {
    if mem_trace_read::text::is_cut_marker(f.ra) {
        out.push(mem_trace_read::text::CUT_FOLDED.to_string());
        return;
    }
    let module = f
        .module
        .as_ref()
        .map(|(p, _)| String::from_utf8_lossy(p).into_owned());
    if f.symbols.is_empty() {
        out.push(match (&module, &f.module) {
            (Some(m), Some((_, bias))) => format!(
                "{:#x}: {} (in {m})",
                f.ra,
                module_offset(m, f.ra.wrapping_sub(*bias))
            ),
            _ => format!("{:#x}: ???", f.ra),
        });
        return;
    }
    for s in &f.symbols {
        let mut text = format!("{:#x}: {}", f.ra, s.function.as_deref().unwrap_or("???"));
        match (&s.file, s.line, s.column) {
            (Some(file), 0, _) => write!(text, " ({file})"),
            (Some(file), l, 0) => write!(text, " ({file}:{l})"),
            (Some(file), l, c) => write!(text, " ({file}:{l}:{c})"),
            (None, _, _) => match &module {
                Some(m) => write!(text, " (in {m})"),
                None => Ok(()),
            },
        }
        .expect("writing to a String");
        out.push(text);
    }
}

/// `mem-trace dhat TARGET -o FILE`.
pub fn command(args: &DhatArgs) -> Result<()> {
    let target = args.target.open()?;
    let progress = crate::progress::Progress::start("reading and symbolizing the stacks");
    let profile = stacks::read(&target, None);
    progress.finish();
    let profile = profile?;
    // A running process's /proc/PID/cmdline, a core's NT_PRPSINFO (cut to 79 bytes by the
    // kernel) and its main thread's id.
    let cmd = target
        .command()
        .filter(|c| !c.is_empty())
        .unwrap_or(target.name())
        .to_string();
    let pid = target.pid().unwrap_or(0);
    let doc = document(&cmd, i64::from(pid), &profile);
    write_to(&args.output, |w| {
        serde_json::to_writer(&mut *w, &doc)?;
        w.write_all(b"\n")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mem_trace_format::Counts;
    use mem_trace_read::symbolize::SymFrame;

    fn sym(name: &str, file: Option<&str>, line: u32, column: u32) -> SymFrame {
        SymFrame {
            function: Some(name.into()),
            file: file.map(String::from),
            line,
            column,
            inlined: false,
        }
    }

    #[test]
    fn a_cut_stack_ends_with_the_cut_frame() {
        let s = Stack {
            id: 3,
            counts: Counts::default(),
            frames: crate::stacks::shared(vec![
                Frame {
                    ra: 0x401234,
                    symbols: vec![sym("site", Some("/src/p.c"), 3, 0)],
                    module: None,
                },
                Frame {
                    ra: mem_trace_format::CUT_MARKER,
                    ..Frame::default()
                },
            ]),
        };
        assert_eq!(
            frame_strings(&s),
            [
                "0x401234: site (/src/p.c:3)",
                "[stack cut: MEM_TRACE_MAX_STACKS]"
            ]
        );
    }

    #[test]
    fn stacks_become_program_points_with_shared_frames() {
        let main = Frame {
            ra: 0x401000,
            symbols: vec![sym("main", Some("/src/p.c"), 9, 5)],
            module: Some((b"/bin/p".to_vec(), 0)),
        };
        let profile = Profile {
            stacks: vec![
                Stack {
                    id: 0,
                    counts: Counts {
                        live_bytes: 8,
                        live_blocks: 1,
                        total_bytes: 8,
                        total_blocks: 1,
                        ..Counts::default()
                    },
                    frames: crate::stacks::shared(vec![]),
                },
                Stack {
                    id: 1,
                    counts: Counts {
                        live_bytes: 100,
                        live_blocks: 2,
                        total_bytes: 300,
                        total_blocks: 6,
                        peak_bytes: 200,
                        peak_blocks: 4,
                    },
                    frames: crate::stacks::shared(vec![
                        Frame {
                            ra: 0x401234,
                            symbols: vec![
                                sym("inner", Some("/src/p.c"), 3, 0),
                                sym("outer", None, 0, 0),
                            ],
                            module: Some((b"/bin/p".to_vec(), 0)),
                        },
                        main.clone(),
                    ]),
                },
                Stack {
                    id: 2,
                    counts: Counts {
                        live_bytes: 50,
                        live_blocks: 1,
                        total_bytes: 50,
                        total_blocks: 1,
                        ..Counts::default()
                    },
                    frames: crate::stacks::shared(vec![
                        Frame {
                            ra: 0x7f00_0000_1000,
                            symbols: vec![],
                            module: Some((b"/lib/libx.so".to_vec(), 0x7f00_0000_0000)),
                        },
                        main,
                    ]),
                },
            ],
            now_seq: 1000,
            peak_seq: 700,
            sample_mean: 0,
        };
        let v = serde_json::to_value(document("p 1 2", 42, &profile)).unwrap();
        assert_eq!(v["dhatFileVersion"], 2);
        assert_eq!(
            (v["bklt"].as_bool(), v["bkacc"].as_bool()),
            (Some(true), Some(false))
        );
        assert_eq!(
            (v["te"].as_u64(), v["tg"].as_u64()),
            (Some(1000), Some(700))
        );
        assert_eq!(v["cmd"], "p 1 2");
        assert_eq!(v["pid"], 42);
        let ftbl: Vec<&str> = v["ftbl"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert_eq!(
            ftbl,
            [
                "[root]",
                "[no stack recorded]",
                "0x401234: inner (/src/p.c:3)",
                "0x401234: outer (in /bin/p)",
                "0x401000: main (/src/p.c:9:5)",
                "0x7f0000001000: libx.so+0x1000 (in /lib/libx.so)",
            ]
        );
        let pp = &v["pps"][1];
        assert_eq!(pp["fs"], serde_json::json!([2, 3, 4]));
        assert_eq!(v["pps"][2]["fs"], serde_json::json!([5, 4]));
        assert_eq!(
            (pp["tb"].as_u64(), pp["tbk"].as_u64()),
            (Some(300), Some(6))
        );
        assert_eq!(
            (pp["gb"].as_u64(), pp["gbk"].as_u64()),
            (Some(200), Some(4))
        );
        assert_eq!(
            (pp["eb"].as_u64(), pp["ebk"].as_u64()),
            (Some(100), Some(2))
        );
        // No per-stack maximum: the most of at-peak, now, and one block of the average size.
        assert_eq!(
            (pp["mb"].as_u64(), pp["mbk"].as_u64()),
            (Some(200), Some(4))
        );
        assert_eq!(v["pps"][2]["mb"].as_u64(), Some(50));
        let churn = Counts {
            total_bytes: 3 << 20,
            total_blocks: 3,
            ..Counts::default()
        };
        assert_eq!(max_lower_bound(&churn), (1 << 20, 1));
        // No lifetimes: left out, not a made-up 0.
        assert!(pp.get("tl").is_none());
    }
}
