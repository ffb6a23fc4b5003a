//! The history answer's lines, and its facts read from tables.

use super::super::history::{lines, HistoryFacts};
use super::*;
use crate::layout::{Event, EventKind, Tables};
use crate::test_image::{Free, TraceBuilder};
use mem_trace_format::{Block, Freed};

const OLD: Block = Block {
    addr: 0x5555_5555_B600,
    size: 300,
    thread: MAIN,
    seq: 14,
    stack: ALLOC_STACK,
};
const LIVE: Block = Block {
    addr: 0x5555_5555_B600,
    size: 200,
    thread: MAIN,
    seq: 20,
    stack: ALLOC_STACK,
};

fn record(realloc: bool) -> Freed {
    Freed {
        block: OLD,
        free_seq: 17,
        free_stack: FREE_STACK,
        free_thread: MAIN,
        by_realloc: realloc,
    }
}

fn events() -> Vec<Event> {
    let r = record(false);
    vec![
        Event {
            kind: EventKind::Allocation,
            seq: 20,
            thread: MAIN,
            stack: ALLOC_STACK,
            block: LIVE,
            freed: None,
        },
        Event {
            kind: EventKind::Free,
            seq: 17,
            thread: MAIN,
            stack: FREE_STACK,
            block: OLD,
            freed: Some(r),
        },
        Event {
            kind: EventKind::Allocation,
            seq: 14,
            thread: MAIN,
            stack: ALLOC_STACK,
            block: OLD,
            freed: Some(r),
        },
    ]
}

fn history_lines(
    events: Vec<Event>,
    history: Option<History>,
    max: Option<usize>,
    stacks: bool,
    address: u64,
) -> Vec<String> {
    let facts = HistoryFacts {
        address,
        events,
        history,
    };
    with_lookups(&FakeRecords::new(), |l| lines(&facts, l, max, stacks))
}

#[test]
fn newest_first_with_stacks() {
    let tid = ", tid 18786 \"demo\"";
    let mut want = vec![
        "0x55555555b601: 3 events, newest first".to_string(),
        format!("#20 allocation of a 200-byte block [0x55555555b600, 0x55555555b6c8) by thread 1 (live){tid}"),
    ];
    want.extend(ALLOC_FRAMES.map(String::from));
    want.push(format!(
        "#17 free of a 300-byte block [0x55555555b600, 0x55555555b72c) by thread 1{tid}"
    ));
    want.extend(FREE_FRAMES.map(String::from));
    want.push(format!(
        "#14 allocation of a 300-byte block [0x55555555b600, 0x55555555b72c) by thread 1 (freed at #17){tid}"
    ));
    want.extend(ALLOC_FRAMES.map(String::from));
    assert_eq!(
        history_lines(events(), Some(HISTORY_ON), None, true, OLD.addr + 1),
        want
    );
}

#[test]
fn no_stacks_and_cut_stacks() {
    let address = OLD.addr + 1;
    assert_eq!(
        history_lines(events(), Some(HISTORY_ON), None, false, address).len(),
        4
    );
    let lines = history_lines(events(), Some(HISTORY_ON), Some(1), true, address);
    assert_eq!(
        lines
            .iter()
            .filter(|l| *l == "    ... (--frames 1)")
            .count(),
        3
    );
}

#[test]
fn a_free_by_realloc_as_the_one_event() {
    let one = vec![Event {
        kind: EventKind::Free,
        seq: 17,
        thread: 0,
        stack: 0,
        block: OLD,
        freed: Some(record(true)),
    }];
    let lines = history_lines(one, Some(HISTORY_ON), None, true, OLD.addr + 1);
    assert_eq!(lines[0], "0x55555555b601: 1 event, newest first");
    assert_eq!(
        lines[1],
        "#17 free (by realloc) of a 300-byte block [0x55555555b600, 0x55555555b72c) by an unknown thread"
    );
    assert_eq!(lines[2], "    (no free stack recorded)");
}

#[test]
fn what_the_history_cannot_know() {
    assert_eq!(
        history_lines(vec![], Some(HISTORY_ON), None, true, 0x10),
        ["no remembered allocation or free touches 0x10"]
    );
    assert_eq!(
        history_lines(vec![], None, None, true, 0x10),
        [
            "no remembered allocation or free touches 0x10",
            "(this process keeps no freed-block history)"
        ]
    );
    let off = history_lines(vec![], Some(history(1, 0, 0)), None, true, 0x10);
    assert_eq!(
        off.last().unwrap(),
        "(the freed-block history is off: MEM_TRACE_FREED=0)"
    );
    let wrapped = history_lines(events(), Some(history(0, 2, 6)), None, true, 0x10);
    assert_eq!(
        wrapped.last().unwrap(),
        "(history keeps the last 2 frees; older events are gone)"
    );
}

#[test]
fn facts_read_from_the_tables() {
    let mut b = TraceBuilder::new();
    b.add_block(0x5555_5555_A2A0, 100, 1, 0, 5);
    b.add_freed(Free {
        addr: 0x5555_5555_A2A0,
        size: 48,
        thread: 1,
        seq: 1,
        stack: 0,
        free_seq: 2,
        free_stack: 0,
        free_thread: 1,
        realloc: false,
    });
    let built = b.build();
    let tables = Tables::open(&built.image, built.header).unwrap();
    let facts = HistoryFacts::read(&tables, 0x5555_5555_A2A0).unwrap();
    let got: Vec<_> = facts.events.iter().map(|e| (e.kind, e.seq)).collect();
    assert_eq!(
        got,
        [
            (EventKind::Allocation, 5),
            (EventKind::Free, 2),
            (EventKind::Allocation, 1)
        ]
    );
    assert_eq!(facts.history.unwrap().capacity, 8);
}
