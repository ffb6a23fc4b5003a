//! The info answer's lines.

use super::super::info::{lines, InfoFacts};
use crate::layout::Tables;
use crate::test_image::{Built, Free, ThreadSpec, TraceBuilder};

/// One thread, one live block, one free; `change` adjusts the builder first.
fn info(change: impl FnOnce(&mut TraceBuilder)) -> (InfoFacts, Vec<String>) {
    let mut b = TraceBuilder::new();
    b.add_thread(ThreadSpec {
        tid: 4242,
        name: "prog".into(),
        ..ThreadSpec::default()
    });
    let s = b.add_stack(&[0x1234]);
    b.add_block(0x5555_5555_A2A0, 100, 1, s, 0);
    let seq = b.next_seq;
    b.add_freed(Free {
        addr: 0x5555_5555_B000,
        size: 48,
        thread: 1,
        seq,
        stack: 0,
        free_seq: seq + 1,
        free_stack: 0,
        free_thread: 1,
        realloc: false,
    });
    change(&mut b);
    facts_and_lines(&b.build())
}

/// The facts and the answer of `built`.
fn facts_and_lines(built: &Built) -> (InfoFacts, Vec<String>) {
    let tables = Tables::open(&built.image, built.header).unwrap();
    let facts = InfoFacts::read(&tables, built.header).unwrap();
    let out = lines(&facts);
    (facts, out)
}

#[test]
fn loaded() {
    let (facts, out) = info(|_| {});
    assert_eq!(
        out,
        [
            format!(
                "mem-trace is loaded: header at {:#x}, layout version 7",
                facts.header
            )
            .as_str(),
            "  live blocks:     1 (100 bytes)",
            "  distinct stacks: 1",
            "  threads seen:    1",
            "  untracked:       0",
            "  next sequence:   4",
            "  flags:           initialised",
            "  freed history:   8 records, 1 claimed by freeing threads (in runs of up to 8 per thread)",
            "  free stacks:     on",
            "  quarantine:      off (MEM_TRACE_QUARANTINE=0)",
            "  errors reported: 0 (double or invalid frees)",
        ]
    );
}

/// Shards' live bytes that sum past 2^64: the sum clamped and the tables flagged, right
/// below it; then one shard's below zero.
#[test]
fn live_bytes_summed_past_2_64_are_flagged() {
    let mut b = TraceBuilder::new();
    let s = b.add_stack(&[0x1234]);
    b.add_block(0x5555_5555_A2A0, 100, 0, s, 0);
    let mut built = b.build();
    for shard in 0..3 {
        built.set_shard_bytes(shard, 3 << 61);
    }
    let (_, out) = facts_and_lines(&built);
    let flag = "  inconsistent tables: live counts sum past 2^64 or below zero";
    assert_eq!(
        out[1..4],
        [
            "  live blocks:     1 (18446744073709551615 bytes)",
            flag,
            "  distinct stacks: 1",
        ]
    );
    let mut built = b.build();
    built.set_shard_bytes(7, 0u64.wrapping_sub(200));
    let (_, out) = facts_and_lines(&built);
    assert_eq!(
        out[1..3],
        ["  live blocks:     1 (18446744073709551516 bytes)", flag]
    );
    let (_, honest) = info(|_| {});
    assert!(
        honest.iter().all(|l| !l.contains("inconsistent")),
        "{honest:?}"
    );
}

#[test]
fn history_variants() {
    let (_, out) = info(|b| {
        b.history_capacity = None;
        b.flags = 7;
    });
    assert_eq!(
        out[6..],
        [
            "  flags:           initialised, profiler, free stacks",
            "  freed history:   none (header.freed is 0)",
        ]
    );
    let (_, out) = info(|b| {
        b.history_capacity = Some(0);
        b.history_flags = 0;
        (b.quarantine_limit, b.quarantined_bytes, b.errors, b.flags) = (4096, 100, 2, 8);
    });
    assert_eq!(
        out[6..],
        [
            "  flags:           profile mode",
            "  freed history:   off (MEM_TRACE_FREED=0)",
            "  free stacks:     off (MEM_TRACE_FREE_STACKS=0)",
            "  quarantine:      100 of 4096 bytes held",
            "  errors reported: 2 (double or invalid frees)",
        ]
    );
    let (_, out) = info(|b| {
        b.history_capacity = Some(2);
        b.written = Some(6);
    });
    assert!(out.contains(
        &"  freed history:   2 records, 6 claimed by freeing threads (wrapped: keeps the last 2)"
            .to_string()
    ));
}

#[test]
fn an_unreadable_history_is_one_line() {
    let (mut facts, _) = info(|_| {});
    facts.history = None;
    facts.history_error = Some("cannot read 64 bytes at 0x6000".into());
    assert_eq!(
        lines(&facts).last().unwrap(),
        "  freed history:   unreadable (cannot read 64 bytes at 0x6000)"
    );
}
