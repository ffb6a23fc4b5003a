//! The history at an address, and its corruptions reported, on images built from
//! docs/LAYOUT.md.

use super::super::events::EventKind::{Allocation, Free};
use super::super::near::tests::{standard, BIG, HEAP};
use super::super::{Error, Tables};
use crate::test_image::{Built, Free as Freed, ThreadSpec, TraceBuilder};

const MAIN: u32 = 1;
const OTHER: u32 = 2;
const ALLOC: u32 = 1;
const FREE: u32 = 2;

fn freed(addr: u64, size: u64, thread: u32, stack: u32, seq: u64, free_seq: u64) -> Freed {
    Freed {
        addr,
        size,
        thread,
        seq,
        stack,
        free_seq,
        free_stack: 0,
        free_thread: thread,
        realloc: false,
    }
}

/// The same 48 bytes allocated and freed twice, then reused by a live block; a neighbour
/// freed with no free stack, and a zero-size one.
fn history_fixture(capacity: u64) -> TraceBuilder {
    let mut b = TraceBuilder::new();
    for (tid, name) in [(4242, "prog"), (4243, "other")] {
        b.add_thread(ThreadSpec {
            tid,
            name: name.into(),
            ..ThreadSpec::default()
        });
    }
    b.add_stack(&[0x5555_5555_5100]);
    b.add_stack(&[0x5555_5555_5200, 0x5555_5555_5300]);
    b.history_capacity = Some(capacity);
    (b.quarantine_limit, b.quarantined_bytes, b.errors) = (1 << 20, 4096, 3);
    b.add_freed(Freed {
        free_stack: FREE,
        free_thread: OTHER,
        ..freed(HEAP, 48, MAIN, ALLOC, 10, 11)
    });
    b.add_freed(Freed {
        free_stack: FREE,
        realloc: true,
        ..freed(HEAP, 48, MAIN, ALLOC, 20, 25)
    });
    b.add_freed(freed(HEAP + 0x100, 64, OTHER, 0, 30, 31));
    b.add_freed(freed(HEAP + 0x200, 0, MAIN, 0, 32, 33));
    b.add_block(HEAP, 32, OTHER, ALLOC, 40);
    b
}

fn tables(built: &Built) -> Tables<'_, crate::test_image::Image> {
    Tables::open(&built.image, built.header).expect("header")
}

fn free_seqs(built: &Built, addr: u64) -> Vec<u64> {
    tables(built)
        .freed_blocks_containing(addr)
        .unwrap()
        .iter()
        .map(|f| f.free_seq)
        .collect()
}

#[test]
fn header() {
    let built = history_fixture(8).build();
    let h = tables(&built).history_header().unwrap().unwrap();
    assert_eq!(
        (h.capacity, h.written, h.held(), h.wrapped()),
        (8, 4, 4, false)
    );
    assert_eq!(h.records, built.ring);
    assert_eq!(
        (h.quarantine_limit, h.quarantined_bytes, h.errors),
        (1 << 20, 4096, 3)
    );
    assert!(h.free_stacks() && h.enabled());
    let mut b = history_fixture(8);
    b.history_flags = 0;
    assert!(!tables(&b.build())
        .history_header()
        .unwrap()
        .unwrap()
        .free_stacks());
}

#[test]
fn records_newest_free_first_and_containment_bounds() {
    let built = history_fixture(8).build();
    let r = tables(&built).freed_blocks_containing(HEAP + 40).unwrap();
    assert_eq!(r.iter().map(|f| f.free_seq).collect::<Vec<_>>(), [25, 11]);
    let newest = r[0];
    assert_eq!((newest.block.addr, newest.block.size), (HEAP, 48));
    assert_eq!(
        (newest.block.thread, newest.block.seq, newest.block.stack),
        (MAIN, 20, ALLOC)
    );
    assert_eq!(
        (newest.free_stack, newest.free_thread, newest.by_realloc),
        (FREE, MAIN, true)
    );
    assert_eq!((r[1].free_thread, r[1].by_realloc), (OTHER, false));
    assert_eq!(free_seqs(&built, HEAP).len(), 2);
    assert_eq!(free_seqs(&built, HEAP + 47).len(), 2);
    assert!(free_seqs(&built, HEAP + 48).is_empty());
    assert!(free_seqs(&built, HEAP - 1).is_empty());
    assert_eq!(free_seqs(&built, HEAP + 0x13F), [31]);
    assert!(free_seqs(&built, HEAP + 0x140).is_empty());
    // Zero size: only its start.
    assert_eq!(free_seqs(&built, HEAP + 0x200), [33]);
    assert!(free_seqs(&built, HEAP + 0x201).is_empty());
    assert!(free_seqs(&built, 0).is_empty());
    assert!(free_seqs(&built, u64::MAX).is_empty());
}

#[test]
fn events_newest_first() {
    let built = history_fixture(8).build();
    let t = tables(&built);
    let events = t.history_events(HEAP + 8).unwrap();
    let got: Vec<_> = events
        .iter()
        .map(|e| (e.kind, e.seq, e.freed.is_none()))
        .collect();
    assert_eq!(
        got,
        [
            (Allocation, 40, true),
            (Free, 25, false),
            (Allocation, 20, false),
            (Free, 11, false),
            (Allocation, 10, false),
        ]
    );
    assert_eq!(
        (events[0].thread, events[0].stack, events[0].block.size),
        (OTHER, ALLOC, 32)
    );
    assert_eq!((events[1].thread, events[1].stack), (MAIN, FREE));
    assert!(events[1].freed.unwrap().by_realloc);
    assert_eq!(events[2].freed.unwrap().free_seq, 25);
    // Past the live block's 32 bytes, only the freed 48-byte blocks remain.
    let seqs = |a| -> Vec<u64> { t.history_events(a).unwrap().iter().map(|e| e.seq).collect() };
    assert_eq!(seqs(HEAP + 40), [25, 20, 11, 10]);
    assert!(seqs(HEAP + 0x1000).is_empty());
    let built = standard().build();
    let t = tables(&built);
    let live: Vec<_> = t
        .history_events(HEAP + 0x2A5)
        .unwrap()
        .iter()
        .map(|e| (e.kind, e.seq, e.freed.is_none()))
        .collect();
    assert_eq!(live, [(Allocation, 1234, true)]);
    assert_eq!(
        t.history_events(BIG + 77)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect::<Vec<_>>(),
        [7]
    );
}

#[test]
fn a_wrapped_ring_keeps_the_newest() {
    let mut b = TraceBuilder::new();
    b.history_capacity = Some(4);
    for k in 0..10u64 {
        // Record k lands at k % 4: 6..9 survive.
        b.add_freed(freed(
            HEAP + 0x40 * (k % 3),
            16,
            1,
            0,
            100 + 2 * k,
            101 + 2 * k,
        ));
    }
    let built = b.build();
    let t = tables(&built);
    let h = t.history_header().unwrap().unwrap();
    assert_eq!((h.written, h.held(), h.wrapped()), (10, 4, true));
    // k = 6 and 9 are at HEAP (k % 3 == 0); 0 and 3 were overwritten.
    assert_eq!(free_seqs(&built, HEAP + 3), [119, 113]);
    let seqs: Vec<u64> = t
        .history_events(HEAP)
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [119, 118, 113, 112]);
}

#[test]
fn empty_records_no_ring_yet_history_off_and_none() {
    let mut built = history_fixture(8).build();
    // Record 1 (free #25) is being rewritten: addr cleared first, the rest stale.
    built.image.write_u64(built.ring + 40, 0);
    assert_eq!(free_seqs(&built, HEAP), [11]);
    let mut b = TraceBuilder::new();
    b.add_block(HEAP, 16, 1, 0, 1);
    let built = b.build();
    let h = tables(&built).history_header().unwrap().unwrap();
    assert_eq!((h.records, h.written, h.held()), (0, 0, 0));
    assert!(free_seqs(&built, HEAP).is_empty());
    let mut b = TraceBuilder::new();
    b.history_capacity = Some(0);
    b.add_freed(freed(HEAP, 16, 1, 0, 1, 2));
    let built = b.build();
    assert!(!tables(&built).history_header().unwrap().unwrap().enabled());
    assert!(free_seqs(&built, HEAP).is_empty());
    let mut b = TraceBuilder::new();
    b.history_capacity = None;
    let built = b.build();
    assert_eq!(tables(&built).history_header().unwrap(), None);
}

#[test]
fn a_corrupt_history_header_is_an_error() {
    let corrupt = |offset: u64, bytes: &[u8]| {
        let mut built = history_fixture(8).build();
        let freed = tables(&built).header().freed as u64;
        built.image.write(freed + offset, bytes);
        let t = tables(&built);
        match t.freed_blocks_containing(HEAP) {
            Err(Error::Corrupt(what)) => what,
            other => panic!("{other:?}"),
        }
    };
    assert!(corrupt(0, &48u32.to_le_bytes()).contains("record_size is 48"));
    assert!(corrupt(8, &((1u64 << 26) + 1).to_le_bytes()).contains("is absurd"));
    assert!(corrupt(24, &(1u64 << 50).to_le_bytes()).contains("is absurd"));
    // A ring larger than what is mapped: refused by its claim, before it is read.
    let mut built = history_fixture(8).build();
    let freed = tables(&built).header().freed as u64;
    built.image.write_u64(freed + 8, 4096);
    built.image.write_u64(freed + 24, 5000);
    match tables(&built).freed_blocks_containing(HEAP) {
        Err(Error::Corrupt(why)) => assert!(
            why.contains("the freed-block history claims 4096 records (160 KiB)"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
}
