//! Stack records: frames held in the record, and frames named by a call-tree node.

use super::{Error, Tables};
use crate::memory::read_plain;
use crate::test_image::{ThreadSpec, TraceBuilder};
use mem_trace_format::STACK_IN_TREE;

#[test]
fn stacks_named_in_the_tree_read_like_stacks_held_in_their_record() {
    let mut b = TraceBuilder::new();
    let flat = b.add_stack(&[0x1010, 0x2020, 0x3030]);
    // Two stacks sharing their two outer frames, and one that is a path's middle.
    let deep = b.add_tree_stack(&[0x1111, 0x2222, 0x3333, 0x4444]);
    let sibling = b.add_tree_stack(&[0x5555, 0x3333, 0x4444]);
    let short = b.add_tree_stack(&[0x4444]);
    let built = b.build();
    let t = Tables::open(&built.image, built.header).unwrap();
    assert_eq!(t.stack(flat).unwrap(), Some(vec![0x1010, 0x2020, 0x3030]));
    assert_eq!(
        t.stack(deep).unwrap(),
        Some(vec![0x1111, 0x2222, 0x3333, 0x4444])
    );
    assert_eq!(
        t.stack(sibling).unwrap(),
        Some(vec![0x5555, 0x3333, 0x4444])
    );
    assert_eq!(t.stack(short).unwrap(), Some(vec![0x4444]));
}

/// A record or node that does not hold together is one `Corrupt` line, never a loop: a
/// count past the path, a node id past those handed out, a parent that is no smaller id.
#[test]
fn a_broken_tree_path_is_corrupt() {
    let mut b = TraceBuilder::new();
    let id = b.add_tree_stack(&[0x1111, 0x2222]);
    let mut built = b.build();
    let header = built.header;
    let (record, chunk) = {
        let t = Tables::open(&built.image, header).unwrap();
        let record = t.stack_record(id).unwrap().unwrap();
        let tree = read_plain::<u64>(&built.image, header + 120).unwrap();
        (record, read_plain::<u64>(&built.image, tree + 16).unwrap())
    };
    let mut corrupt = |at: u64, value: u64, restore: u64| {
        built.image.write_u64(at, value);
        let why = match Tables::open(&built.image, header).unwrap().stack(id) {
            Err(Error::Corrupt(why)) => why,
            other => panic!("{other:?}"),
        };
        built.image.write_u64(at, restore);
        why
    };
    // Three frames asked of a path of two.
    let why = corrupt(record, STACK_IN_TREE | 3, STACK_IN_TREE | 2);
    assert!(
        why.contains("node 0 is not one of the 2 handed out"),
        "{why}"
    );
    // A node id past the count.
    let why = corrupt(record + 8, 9, 2);
    assert!(why.contains("node 9 is not one of the 2"), "{why}");
    // The inner frame's node made its own parent: a loop.
    let why = corrupt(chunk + 16 * 2 + 8, 2, 1);
    assert!(why.contains("has parent 2, not a smaller id"), "{why}");
}

/// Counts and capacities are checked against the memory the target has before they size a
/// read: a claim past it is one `Corrupt` line naming the field, after small reads only.
#[test]
fn a_capacity_past_its_mapping_is_refused_before_it_is_read() {
    let mut b = TraceBuilder::new();
    let heap = 0x5555_0000_0000u64;
    b.add_block(heap + 0x40, 100, 0, 0, 1);
    let built = b.build();
    let shards = read_plain::<u64>(&built.image, built.header + 32).unwrap();
    let shard = shards
        + (mem_trace_format::shard_of(heap >> 16) * core::mem::size_of::<mem_trace_format::Shard>())
            as u64;
    let array = read_plain::<u64>(
        &built.image,
        shard + core::mem::offset_of!(mem_trace_format::Shard, array) as u64,
    )
    .unwrap();
    let mut image = built.image;
    image.write_u64(array, 1 << 32);
    image.reads.borrow_mut().clear();
    let t = Tables::open(&image, built.header).unwrap();
    let why = match t.find_containing(heap + 0x50) {
        Err(Error::Corrupt(why)) => why,
        other => panic!("{other:?}"),
    };
    assert!(
        why.contains("slot array claims 4294967296 slots (96 GiB) at"),
        "{why}"
    );
    assert!(
        why.contains("where the target's memory ends after"),
        "{why}"
    );
    let largest = image.reads.borrow().iter().map(|&(_, n)| n).max();
    assert!(largest < Some(4096), "{largest:?}");
}

/// Two chunks of the thread directory that overlap would have the same records read
/// again and again: refused.
#[test]
fn thread_chunks_that_overlap_are_refused() {
    let mut b = TraceBuilder::new();
    b.add_thread(ThreadSpec {
        tid: 7,
        name: "main".into(),
        ..ThreadSpec::default()
    });
    let built = b.build();
    let threads = read_plain::<u64>(&built.image, built.header + 48).unwrap();
    let chunk = read_plain::<u64>(&built.image, threads + 16).unwrap();
    let mut image = built.image;
    let t = Tables::open(&image, built.header).unwrap();
    assert_eq!(t.thread_records().unwrap().len(), 1);
    image.write_u64(threads, 8191);
    image.write_u64(threads + 24, chunk);
    let t = Tables::open(&image, built.header).unwrap();
    let why = match t.thread_records() {
        Err(Error::Corrupt(why)) => why,
        other => panic!("{other:?}"),
    };
    assert!(
        why.contains("chunk 1 of the thread table, which claims 8191 threads"),
        "{why}"
    );
    assert!(why.contains("overlaps another table's memory"), "{why}");
}

#[test]
fn sums_past_2_64_or_below_zero_are_clamped_and_said() {
    use super::checked_sum;
    assert_eq!(checked_sum([]), (0, false));
    assert_eq!(checked_sum([1, 2, u64::MAX / 2 - 3]), (u64::MAX / 2, false));
    assert_eq!(checked_sum([1 << 62; 4]), (u64::MAX, true));
    assert_eq!(checked_sum([u64::MAX, 0]), (u64::MAX, true));
    // A count below zero (a wrapped one) is said even when the sum still fits.
    assert_eq!(checked_sum([0u64.wrapping_sub(5)]), (u64::MAX - 4, true));
}

#[test]
fn shard_sums_past_2_64_are_clamped_in_the_totals() {
    let mut b = TraceBuilder::new();
    let s = b.add_stack(&[0x1234]);
    b.add_block(0x5555_5555_0000, 100, 0, s, 0);
    let mut built = b.build();
    // Three shards' counts that each fit, and their sum that does not.
    for shard in 0..3 {
        built.set_shard_bytes(shard, 3 << 61);
    }
    let t = Tables::open(&built.image, built.header).unwrap();
    let totals = t.totals().unwrap();
    assert_eq!(
        (totals.blocks, totals.bytes, totals.wrapped),
        (1, u64::MAX, true)
    );
}
