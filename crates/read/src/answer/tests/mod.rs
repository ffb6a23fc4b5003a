//! The answers' lines on synthetic facts, with fake records and symbols.

mod history;
mod info;
mod leaks;
mod profile;
mod why;

use super::frame::Frame;
use super::parts::{stack_lines, Lookups, Records, StackKind};
use crate::layout::{Error, History, Thread};
use crate::memory::Unreadable;
use std::collections::HashMap;

const MAIN: u32 = 1;
const WORKER: u32 = 2;
const ALLOC_STACK: u32 = 1;
const FREE_STACK: u32 = 2;
const DEEP_STACK: u32 = 3;
const EMPTY_STACK: u32 = 4;
const BROKEN_STACK: u32 = 5;
const UNPUBLISHED_STACK: u32 = 6;
const CUT_STACK: u32 = 7;
const BUCKET_STACK: u32 = 8;

const PC_MAKE: u64 = 0x5555_5555_518B;
const PC_MAIN: u64 = 0x5555_5555_51C6;
const PC_FREE: u64 = 0x5555_5555_51F3;
const PC_START: u64 = 0x5555_5555_50D1;
const PC_INLINED: u64 = 0x5555_5555_5300;
const PC_UNKNOWN: u64 = 0x7FFF_F7A0_0010;

fn at(pc: u64, function: &str, file: &str, line: u32) -> Frame {
    Frame {
        pc,
        function: Some(function.into()),
        file: Some(file.into()),
        line,
        ..Frame::raw(pc)
    }
}

/// gdb's symbolizer stand-in; a pc it does not know has no symbol at all.
fn fake_symbolize(pc: u64) -> Vec<Frame> {
    match pc {
        PC_MAKE => vec![at(pc, "new_order", "/src/demo.c", 16)],
        PC_MAIN => vec![at(pc, "main", "/src/demo.c", 30)],
        PC_FREE => vec![at(pc, "release", "/src/demo.c", 40)],
        PC_START => vec![Frame {
            symbol: Some("_start+33".into()),
            module: Some("/bin/demo".into()),
            ..Frame::raw(pc)
        }],
        PC_INLINED => vec![
            Frame {
                inlined: true,
                ..at(pc, "inner", "/src/demo.c", 7)
            },
            at(pc, "outer", "/src/demo.c", 12),
        ],
        0x1000 => vec![at(pc, "hold_site", "/src/p.c", 56)],
        0x2000 => vec![at(pc, "churn_site", "/src/p.c", 64)],
        0x3000 => vec![at(pc, "leak_site", "/src/p.c", 76)],
        _ => vec![Frame::raw(pc)],
    }
}

fn thread(tid: u32, exited: bool, name: &str) -> Thread {
    Thread {
        tid,
        exited,
        name: name.into(),
        live_bytes: 0,
        peak_bytes: 0,
        allocated_bytes: 0,
        counters: 0,
    }
}

/// Stacks and thread records as the tables would give them, or their errors.
struct FakeRecords {
    stacks: HashMap<u32, Vec<u64>>,
    threads: HashMap<u32, Thread>,
}

impl FakeRecords {
    fn new() -> Self {
        FakeRecords {
            stacks: HashMap::from([
                (ALLOC_STACK, vec![PC_MAKE, PC_MAIN]),
                (FREE_STACK, vec![PC_FREE, PC_MAIN]),
                (DEEP_STACK, vec![PC_INLINED, PC_UNKNOWN, PC_MAIN, PC_START]),
                (EMPTY_STACK, vec![]),
                (CUT_STACK, vec![PC_MAKE, mem_trace_format::CUT_MARKER]),
                (BUCKET_STACK, vec![mem_trace_format::CUT_MARKER]),
            ]),
            threads: HashMap::from([
                (MAIN, thread(18786, false, "demo")),
                (WORKER, thread(18790, true, "worker")),
            ]),
        }
    }
}

impl Records for FakeRecords {
    fn stack(&self, id: u32) -> Result<Option<Vec<u64>>, Error> {
        if id == BROKEN_STACK {
            return Err(Error::Unreadable(Unreadable {
                addr: 0x7000,
                len: 16,
            }));
        }
        Ok(self.stacks.get(&id).cloned())
    }

    fn thread(&self, index: u32) -> Result<Option<Thread>, Error> {
        if index == 99 {
            return Err(Error::Corrupt(
                "thread index 99 is beyond the 2 handed out".into(),
            ));
        }
        Ok(self.threads.get(&index).cloned())
    }
}

/// Runs `f` with lookups over `records` and the fake symbolizer.
fn with_lookups<T>(records: &dyn Records, f: impl FnOnce(&mut Lookups<'_>) -> T) -> T {
    let mut symbolize = fake_symbolize;
    let mut lookups = Lookups::new(records, &mut symbolize);
    f(&mut lookups)
}

const ALLOC_FRAMES: [&str; 2] = [
    "    #0 0x55555555518b in new_order at /src/demo.c:16",
    "    #1 0x5555555551c6 in main at /src/demo.c:30",
];
const FREE_FRAMES: [&str; 2] = [
    "    #0 0x5555555551f3 in release at /src/demo.c:40",
    "    #1 0x5555555551c6 in main at /src/demo.c:30",
];

fn history(flags: u32, capacity: u64, written: u64) -> History {
    History {
        address: 0x6000,
        flags,
        capacity,
        records: 0x7000,
        written,
        quarantine_limit: 0,
        quarantined_bytes: 0,
        errors: 0,
        index: 0,
    }
}

const HISTORY_ON: History = History {
    address: 0x6000,
    flags: 1,
    capacity: 4096,
    records: 0x7000,
    written: 3,
    quarantine_limit: 0,
    quarantined_bytes: 0,
    errors: 0,
    index: 0,
};

fn stack(id: u32, max: Option<usize>, kind: StackKind) -> Vec<String> {
    with_lookups(&FakeRecords::new(), |l| stack_lines(l, id, max, kind, None))
}

#[test]
fn inlined_frames_and_frames_without_symbols() {
    assert_eq!(
        stack(DEEP_STACK, None, StackKind::Allocation),
        [
            "    #0 0x555555555300 in inner (inlined) at /src/demo.c:7",
            "    #1 0x555555555300 in outer at /src/demo.c:12",
            "    #2 0x7ffff7a00010",
            "    #3 0x5555555551c6 in main at /src/demo.c:30",
            "    #4 0x5555555550d1 in _start+33 from /bin/demo",
        ]
    );
}

/// The lines of `ALLOC_STACK`, whole.
fn allocation_stack(lookups: &mut Lookups<'_>) -> Vec<String> {
    stack_lines(lookups, ALLOC_STACK, None, StackKind::Allocation, None)
}

#[test]
fn raw_stacks() {
    let records = FakeRecords::new();
    let mut raw = super::frame::unsymbolized;
    let mut lookups = Lookups::new(&records, &mut raw);
    assert_eq!(
        allocation_stack(&mut lookups),
        ["    #0 0x55555555518b", "    #1 0x5555555551c6"]
    );
}

#[test]
fn cut_at_max_frames_counting_inlined_frames() {
    assert_eq!(
        stack(DEEP_STACK, Some(1), StackKind::Allocation),
        [
            "    #0 0x555555555300 in inner (inlined) at /src/demo.c:7",
            "    ... (--frames 1)",
        ]
    );
    assert_eq!(stack(DEEP_STACK, Some(5), StackKind::Allocation).len(), 5);
    assert_eq!(
        stack(DEEP_STACK, Some(0), StackKind::Allocation),
        ["    ... (--frames 0)"]
    );
}

/// The case of test_text.py's `test_a_recursion_is_shown_once_then_counted`.
#[test]
fn a_recursion_is_shown_once_then_counted() {
    let mut records = FakeRecords::new();
    let mut deep = vec![PC_MAKE];
    deep.extend([PC_FREE; 40]);
    deep.extend([PC_MAIN, PC_START]);
    records.stacks.insert(9, deep);
    let mut mutual = [PC_INLINED, PC_UNKNOWN].repeat(6);
    mutual.push(PC_MAIN);
    records.stacks.insert(10, mutual);
    records.stacks.insert(
        11,
        vec![PC_FREE, PC_FREE, PC_FREE, PC_FREE, PC_FREE, PC_MAIN],
    );
    let lines = |id, max| {
        with_lookups(&records, |l| {
            stack_lines(l, id, max, StackKind::Allocation, None)
        })
    };
    let got = lines(9, None);
    assert_eq!(
        got,
        [
            "    #0 0x55555555518b in new_order at /src/demo.c:16",
            "    #1 0x5555555551f3 in release at /src/demo.c:40",
            "    #2 0x5555555551f3 in release at /src/demo.c:40",
            "    #3 0x5555555551f3 in release at /src/demo.c:40",
            "    ... 37 more frames of the same recursion (release at /src/demo.c:40)",
            "    #41 0x5555555551c6 in main at /src/demo.c:30",
            "    #42 0x5555555550d1 in _start+33 from /bin/demo",
        ]
    );
    let mut cut = got[..6].to_vec();
    cut.push("    ... (--frames 5)".into());
    assert_eq!(lines(9, Some(5)), cut);
    assert_eq!(
        lines(10, None)[3..5],
        [
            "    ... 15 more frames of the same recursion (inner (inlined) at /src/demo.c:7, \
             outer at /src/demo.c:12, 0x7ffff7a00010)",
            "    #18 0x5555555551c6 in main at /src/demo.c:30",
        ]
    );
    assert_eq!(lines(11, None).len(), 6);
}

#[test]
fn missing_empty_unreadable_unpublished_stacks() {
    for (id, kind, want) in [
        (
            0,
            StackKind::Allocation,
            "    (no allocation stack was recorded)",
        ),
        (
            EMPTY_STACK,
            StackKind::Allocation,
            "    (empty allocation stack)",
        ),
        // Python quotes its own error: "cannot read stack 5 (16 bytes at 0x7000)".
        (
            BROKEN_STACK,
            StackKind::Allocation,
            "    (allocation stack 5 unreadable: cannot read 16 bytes at 0x7000)",
        ),
        (
            UNPUBLISHED_STACK,
            StackKind::Allocation,
            "    (allocation stack 6 is not published yet)",
        ),
        (EMPTY_STACK, StackKind::Free, "    (empty free stack)"),
    ] {
        assert_eq!(stack(id, None, kind), [want]);
    }
}

/// A stack cut by MEM_TRACE_MAX_STACKS: its kept frame, then one line in place of the
/// marker, which is never symbolized (even by `--raw`, which shows every other address).
#[test]
fn cut_stacks_end_with_the_cut_line() {
    const CUT: &str =
        "    (stack cut: the cap on distinct stacks, MEM_TRACE_MAX_STACKS, was reached)";
    let records = FakeRecords::new();
    let mut asked = Vec::new();
    let mut symbolize = |pc| {
        asked.push(pc);
        fake_symbolize(pc)
    };
    let mut lookups = Lookups::new(&records, &mut symbolize);
    let mut lines = |id, max| stack_lines(&mut lookups, id, max, StackKind::Allocation, None);
    assert_eq!(
        lines(CUT_STACK, None),
        ["    #0 0x55555555518b in new_order at /src/demo.c:16", CUT]
    );
    assert_eq!(lines(BUCKET_STACK, None), [CUT]);
    assert_eq!(
        lines(CUT_STACK, Some(1)),
        ["    #0 0x55555555518b in new_order at /src/demo.c:16", CUT]
    );
    drop(lookups);
    assert_eq!(asked, [PC_MAKE]);
    let mut raw = super::frame::unsymbolized;
    let mut lookups = Lookups::new(&records, &mut raw);
    assert_eq!(
        stack_lines(&mut lookups, CUT_STACK, None, StackKind::Free, None),
        ["    #0 0x55555555518b", CUT]
    );
}

#[test]
fn each_return_address_is_symbolized_once() {
    let records = FakeRecords::new();
    let mut calls = Vec::new();
    let mut counting = |pc| {
        calls.push(pc);
        fake_symbolize(pc)
    };
    let mut lookups = Lookups::new(&records, &mut counting);
    for _ in 0..3 {
        allocation_stack(&mut lookups);
    }
    drop(lookups);
    assert_eq!(calls, [PC_MAKE, PC_MAIN]);
}
