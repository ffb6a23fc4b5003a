//! Stack records: frames held in the record, and frames named by a call-tree node.

use super::{Error, Tables};
use crate::memory::read_plain;
use crate::test_image::TraceBuilder;
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
