//! The why answer: live and freed blocks, threads, and its facts read from tables.

use super::super::why::{lines, WhyFacts};
use super::*;
use crate::layout::{Match, Relation, Tables};
use crate::test_image::{Free, ThreadSpec, TraceBuilder};
use mem_trace_format::{Block, Freed};

const BLOCK: Block = Block {
    addr: 0x5555_5555_92C0,
    size: 24,
    thread: MAIN,
    seq: 2,
    stack: ALLOC_STACK,
};
const OLD: Block = Block {
    addr: 0x5555_5555_B4E0,
    size: 72,
    thread: MAIN,
    seq: 6,
    stack: ALLOC_STACK,
};
const NOTE: &str = "    (not inside any live block nor any remembered freed block: an overflow, \
                    or a pointer to an untracked or long-freed block)";

fn found(address: u64, block: Block, relation: Relation, offset: u64) -> Option<Match> {
    Some(Match {
        address,
        block,
        relation,
        offset,
    })
}

fn freed(block: Block, free_seq: u64, free_stack: u32, free_thread: u32, realloc: bool) -> Freed {
    Freed {
        block,
        free_seq,
        free_stack,
        free_thread,
        by_realloc: realloc,
    }
}

fn facts(address: u64, found: Option<Match>, freed: Vec<Freed>) -> WhyFacts {
    WhyFacts {
        address,
        found,
        freed,
        freed_error: None,
        history: Some(HISTORY_ON),
        untracked: 0,
        sample_mean: 0,
        attached_at: None,
        no_frees_kept: false,
    }
}

fn why(f: &WhyFacts) -> Vec<String> {
    why_with(f, &FakeRecords::new())
}

fn why_with(f: &WhyFacts, records: &dyn Records) -> Vec<String> {
    with_lookups(records, |l| lines(f, l, None))
}

const DEMO: &str = ", tid 18786 \"demo\"";

#[test]
fn live_block_inside_at_the_start_and_one_byte_in() {
    let a = BLOCK.addr + 4;
    let mut want = vec![format!(
        "0x5555555592c4 is 4 bytes inside a 24-byte block [0x5555555592c0, 0x5555555592d8) \
         allocated by thread 1 (#2){DEMO}"
    )];
    want.extend(ALLOC_FRAMES.map(String::from));
    assert_eq!(
        why(&facts(a, found(a, BLOCK, Relation::Inside, 4), vec![])),
        want
    );
    let start = why(&facts(
        BLOCK.addr,
        found(BLOCK.addr, BLOCK, Relation::Inside, 0),
        vec![],
    ));
    assert_eq!(
        start[0],
        format!(
            "0x5555555592c0 is at the start of a 24-byte block [0x5555555592c0, 0x5555555592d8) \
             allocated by thread 1 (#2){DEMO}"
        )
    );
    let one = why(&facts(
        BLOCK.addr + 1,
        found(BLOCK.addr + 1, BLOCK, Relation::Inside, 1),
        vec![],
    ));
    assert!(one[0].starts_with("0x5555555592c1 is 1 byte inside a 24-byte block"));
}

#[test]
fn one_past_the_end_after_and_before() {
    let end = BLOCK.addr + 24;
    let mut want = vec![
        format!(
            "0x5555555592d8 is 0 bytes after a 24-byte block [0x5555555592c0, 0x5555555592d8) \
             allocated by thread 1 (#2){DEMO}"
        ),
        NOTE.to_string(),
    ];
    want.extend(ALLOC_FRAMES.map(String::from));
    assert_eq!(
        why(&facts(end, found(end, BLOCK, Relation::After, 0), vec![])),
        want
    );
    let after = why(&facts(
        end + 4,
        found(end + 4, BLOCK, Relation::After, 4),
        vec![],
    ));
    assert!(after[0].starts_with("0x5555555592dc is 4 bytes after a 24-byte block"));
    let before = why(&facts(
        BLOCK.addr - 1,
        found(BLOCK.addr - 1, BLOCK, Relation::Before, 1),
        vec![],
    ));
    assert!(before[0].starts_with("0x5555555592bf is 1 byte before a 24-byte block"));
}

#[test]
fn nothing_tracked() {
    assert_eq!(
        why(&facts(0x10, None, vec![])),
        ["0x10 is not inside any block tracked by mem-trace"]
    );
    let mut f = facts(0x10, None, vec![]);
    f.untracked = 3;
    assert_eq!(
        why(&f),
        [
            "0x10 is not inside any block tracked by mem-trace",
            "(3 blocks could not be tracked; it may be one of them)"
        ]
    );
}

#[test]
fn nothing_tracked_in_an_attached_process_says_when_it_was_attached() {
    let mut f = facts(0x10, None, vec![]);
    f.attached_at = Some(4321);
    assert_eq!(
        why(&f),
        [
            "0x10 is not inside any block tracked by mem-trace",
            "(mem-trace was attached to this process at event #4321: blocks allocated before \
             that are unknown to it; it may be one of them)"
        ]
    );
}

#[test]
fn saturated_size() {
    let big = Block {
        addr: 0x7F00_0000_0000,
        size: (1 << 40) - 1,
        thread: MAIN,
        seq: 9,
        stack: ALLOC_STACK,
    };
    let line = &why(&facts(
        big.addr + 8,
        found(big.addr + 8, big, Relation::Inside, 8),
        vec![],
    ))[0];
    assert!(
        line.contains("8 bytes inside a block of at least 1099511627775 bytes [0x7f0000000000, ")
    );
}

#[test]
fn live_block_over_freed_memory_and_an_unreadable_history() {
    let old = Block {
        size: 48,
        seq: 1,
        ..BLOCK
    };
    let lines = why(&facts(
        BLOCK.addr,
        found(BLOCK.addr, BLOCK, Relation::Inside, 0),
        vec![freed(old, 7, FREE_STACK, MAIN, false)],
    ));
    assert!(lines[0].contains("allocated by thread 1 (#2)"));
    assert_eq!(
        lines.last().unwrap(),
        "    (older freed blocks covered this address too: 1; see mtrace-history)"
    );
    let mut f = facts(
        BLOCK.addr,
        found(BLOCK.addr, BLOCK, Relation::Inside, 0),
        vec![],
    );
    f.freed_error = Some("cannot read 40 bytes at 0x7000".into());
    let lines = why(&f);
    assert_eq!(lines[1..3], ALLOC_FRAMES);
    assert_eq!(
        lines.last().unwrap(),
        "    (freed-block history unreadable: cannot read 40 bytes at 0x7000)"
    );
}

#[test]
fn freed_with_and_without_a_free_stack_and_by_realloc() {
    let a = OLD.addr + 16;
    let mut want = vec![format!(
        "0x55555555b4f0 is 16 bytes inside a 72-byte block [0x55555555b4e0, 0x55555555b528) \
         freed by thread 1 (#7){DEMO}"
    )];
    want.extend(FREE_FRAMES.map(String::from));
    want.push(format!("previously allocated by thread 1 (#6){DEMO}"));
    want.extend(ALLOC_FRAMES.map(String::from));
    assert_eq!(
        why(&facts(
            a,
            None,
            vec![freed(OLD, 7, FREE_STACK, MAIN, false)]
        )),
        want
    );
    let record = freed(OLD, 7, 0, MAIN, false);
    let mut f = facts(OLD.addr, None, vec![record]);
    f.history = Some(history(0, 4096, 3));
    let lines = why(&f);
    assert!(lines[0].starts_with("0x55555555b4e0 is at the start of a 72-byte block "));
    assert_eq!(
        lines[1],
        "    (no free stack was recorded: MEM_TRACE_FREE_STACKS=0)"
    );
    assert_eq!(
        lines[2],
        format!("previously allocated by thread 1 (#6){DEMO}")
    );
    // Free stacks on, but this one missing: no reason to give.
    for history in [Some(HISTORY_ON), None] {
        f.history = history;
        assert_eq!(why(&f)[1], "    (no free stack recorded)");
    }
    let realloc = why(&facts(
        OLD.addr,
        None,
        vec![freed(OLD, 7, FREE_STACK, MAIN, true)],
    ));
    assert_eq!(
        realloc[0],
        format!(
            "0x55555555b4e0 is at the start of a 72-byte block [0x55555555b4e0, 0x55555555b528) \
             freed (by realloc) by thread 1 (#7){DEMO}"
        )
    );
}

#[test]
fn the_newest_of_several_frees_and_the_count_of_older_ones() {
    let lines = why(&facts(
        OLD.addr,
        None,
        vec![
            freed(OLD, 12, FREE_STACK, WORKER, false),
            freed(OLD, 7, FREE_STACK, MAIN, false),
            freed(OLD, 3, FREE_STACK, MAIN, false),
        ],
    ));
    assert!(lines[0].contains("freed by thread 2 (#12), tid 18790 \"worker\", exited"));
    assert_eq!(
        lines.last().unwrap(),
        "    (older freed blocks covered this address too: 2; see mtrace-history)"
    );
}

#[test]
fn a_freed_block_beats_a_nearby_live_one() {
    let a = OLD.addr + 2;
    let lines = why(&facts(
        a,
        found(a, BLOCK, Relation::After, 2),
        vec![freed(OLD, 7, FREE_STACK, MAIN, false)],
    ));
    assert!(lines[0].contains("is 2 bytes inside a 72-byte block"));
    assert!(lines[0].contains(" freed by thread 1 "));
}

#[test]
fn threads_unknown_unpublished_unreadable_exited_nameless_escaped() {
    let first_line = |index: u32, records: &FakeRecords| {
        let b = Block {
            addr: 0x1000,
            size: 16,
            thread: index,
            seq: 5,
            stack: ALLOC_STACK,
        };
        why_with(
            &facts(0x1000, found(0x1000, b, Relation::Inside, 0), vec![]),
            records,
        )[0]
        .clone()
    };
    let mut records = FakeRecords::new();
    assert_eq!(
        first_line(0, &records),
        "0x1000 is at the start of a 16-byte block [0x1000, 0x1010) allocated by an unknown thread (#5)"
    );
    assert!(first_line(7, &records).ends_with("allocated by thread 7 (#5)"));
    assert!(first_line(99, &records).ends_with(
        "allocated by thread 99 (#5) (thread record unreadable: thread index 99 is beyond the 2 handed out)"
    ));
    assert!(first_line(WORKER, &records)
        .ends_with("allocated by thread 2 (#5), tid 18790 \"worker\", exited"));
    records.threads.insert(3, thread(555, false, ""));
    assert!(first_line(3, &records).ends_with("allocated by thread 3 (#5), tid 555"));
    records
        .threads
        .insert(3, thread(555, false, "a\nb\x1b[31m\"\\\t\x7f\u{202e}\0"));
    let line = first_line(3, &records);
    assert!(!line.contains('\n') && !line.contains('\x1b'));
    assert!(line.ends_with(
        "allocated by thread 3 (#5), tid 555 \"a\\nb\\x1b[31m\\\"\\\\\\t\\x7f\\u202e\\x00\""
    ));
}

#[test]
fn facts_read_from_the_tables() {
    let mut b = TraceBuilder::new();
    let t = b.add_thread(ThreadSpec {
        tid: 4242,
        name: "prog".into(),
        ..ThreadSpec::default()
    });
    let s = b.add_stack(&[PC_MAKE, PC_MAIN]);
    b.add_block(0x5555_5555_A2A0, 100, t, s, 1);
    b.add_freed(Free {
        addr: 0x5555_5555_B000,
        size: 48,
        thread: t,
        seq: 2,
        stack: s,
        free_seq: 3,
        free_stack: s,
        free_thread: t,
        realloc: false,
    });
    b.untracked = 4;
    let mut built = b.build();
    let tables = Tables::open(&built.image, built.header).unwrap();
    let f = WhyFacts::read(&tables, 0x5555_5555_A2A0 + 37, 4096).unwrap();
    let m = f.found.unwrap();
    assert_eq!((m.relation, m.offset), (Relation::Inside, 37));
    assert_eq!(
        (f.freed.len(), f.freed_error.as_deref(), f.untracked),
        (0, None, 4)
    );
    let mut want = vec![
        "0x55555555a2c5 is 37 bytes inside a 100-byte block [0x55555555a2a0, 0x55555555a304) \
         allocated by thread 1 (#1), tid 4242 \"prog\""
            .to_string(),
    ];
    want.extend(ALLOC_FRAMES.map(String::from));
    assert_eq!(with_lookups(&tables, |l| lines(&f, l, None)), want);
    let f = WhyFacts::read(&tables, 0x5555_5555_B000 + 8, 4096).unwrap();
    assert_eq!(f.freed.iter().map(|r| r.free_seq).collect::<Vec<_>>(), [3]);
    // The ring unreadable: the live answer stands, with one line saying why.
    built.image.unmap(built.ring);
    let tables = Tables::open(&built.image, built.header).unwrap();
    let f = WhyFacts::read(&tables, 0x5555_5555_A2A0, 4096).unwrap();
    assert!(f.freed_error.unwrap().starts_with("cannot read "));
}

/// Under sampling, an address in no sampled block is "not sampled", even beside a sampled
/// block: most blocks go unrecorded, so a neighbour says nothing of it.
#[test]
fn an_unsampled_address_says_so() {
    let mut f = facts(0x5555_0100, None, vec![]);
    f.sample_mean = 512 << 10;
    assert_eq!(
        why(&f),
        ["0x55550100 is in no sampled block: not sampled, this process samples one allocation per ~512 KiB (MEM_TRACE_SAMPLE)"]
    );
}

/// A tagged block (docs/LAYOUT.md "Block tags") has no sequence number: the answer says
/// nothing of one rather than "#0".
#[test]
fn a_tagged_block_has_no_event_number() {
    let tagged = Block {
        seq: crate::layout::tags::NO_SEQ,
        ..BLOCK
    };
    let a = tagged.addr + 4;
    let mut want = vec![format!(
        "0x5555555592c4 is 4 bytes inside a 24-byte block [0x5555555592c0, 0x5555555592d8) \
         allocated by thread 1{DEMO}"
    )];
    want.extend(ALLOC_FRAMES.map(String::from));
    assert_eq!(
        why(&facts(a, found(a, tagged, Relation::Inside, 4), vec![])),
        want
    );
}

#[test]
fn without_a_record_of_frees_an_unknown_address_says_so_and_names_debug_mode() {
    let mut f = facts(0x10, None, vec![]);
    f.history = None;
    f.no_frees_kept = true;
    assert_eq!(
        why(&f),
        [
            "0x10 is not inside any block tracked by mem-trace",
            "(this process kept no record of frees (profile mode): the address may be a \
             dangling pointer; run with --mode debug to have frees answered)",
        ]
    );
}
