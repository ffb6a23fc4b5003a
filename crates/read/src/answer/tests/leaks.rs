//! The leak answer's lines, and the whole answer read from a synthetic process: tables, a
//! stack and registers.

use super::super::leaks::{group_by_stack, lines, LeakFacts};
use super::profile::sites;
use super::*;
use crate::layout::Tables;
use crate::leaks::{Class, Live, Outcome, Roots};
use crate::target::{Mapping, ThreadState};
use crate::test_image::{Image, TraceBuilder};

/// The blocks of `sites()`: the two hold blocks in `hold`, the leak block in `leak`.
fn facts(hold: Class, leak: Class) -> LeakFacts {
    let blocks = [
        Live::of_class(0x5555_0000_0000, 4096, 1, hold),
        Live::of_class(0x5555_0000_2000, 4096, 1, hold),
        Live::of_class(0x5555_0000_4000, 1000, 3, leak),
    ];
    let outcome = Outcome {
        root_bytes: 4096,
        ..Outcome::default()
    };
    let roots = Roots {
        objects: 3,
        stacks: 1,
        register_sets: 1,
        program: 0,
        ..Roots::default()
    };
    LeakFacts::from_scan(&blocks, &outcome, &roots, 0)
}

fn leak_lines(facts: &LeakFacts, limit: Option<usize>, reachable: bool) -> Vec<String> {
    let built = sites(true);
    let tables = Tables::open(&built.image, built.header).unwrap();
    with_lookups(&tables, |l| lines(facts, l, limit, None, reachable))
}

#[test]
fn lost_or_possibly_lost_and_reachable() {
    let roots = "scanned 4096 bytes of roots (3 objects' data, 1 thread stack, 1 register set), ";
    let held = [
        "still reachable: 1 stack, biggest first:",
        "still reachable: 8192 bytes in 2 blocks, allocated from:",
        "    #0 0x1000 in hold_site at /src/p.c:56",
    ];
    for (class, reached, header, leak, summary) in [
        (
            Class::Lost,
            "reached 2 of 3 live blocks",
            "definitely lost: 1 stack, biggest first:",
            "definitely lost: 1000 bytes in 1 block, allocated from:",
            "1000 bytes definitely lost in 1 block (direct: 1000 bytes in 1 block, indirect: 0 bytes \
             in 0 blocks); 0 bytes possibly lost in 0 blocks",
        ),
        (
            Class::Possibly,
            "reached 3 of 3 live blocks (1 only through interior pointers)",
            "possibly lost: 1 stack, biggest first:",
            "possibly lost: 1000 bytes in 1 block, allocated from:",
            "0 bytes definitely lost in 0 blocks (direct: 0 bytes in 0 blocks, indirect: 0 bytes in 0 \
             blocks); 1000 bytes possibly lost in 1 block",
        ),
    ] {
        let f = facts(Class::Reachable, class);
        let mut want = vec![format!("{roots}{reached}")];
        if class == Class::Possibly {
            want.push("no block is definitely lost".to_string());
        }
        want.push(header.to_string());
        want.push(leak.to_string());
        want.push("    #0 0x3000 in leak_site at /src/p.c:76".to_string());
        want.extend(held.map(String::from));
        want.push(format!(
            "SUMMARY: {summary}; 8192 bytes still reachable in 2 blocks"
        ));
        assert_eq!(leak_lines(&f, None, true), want);
        // --no-reachable hides only the still reachable groups.
        let out = leak_lines(&f, None, false);
        assert!(out.contains(&leak.to_string()));
        assert!(!out.contains(&held[0].to_string()));
        assert!(!out.contains(&held[1].to_string()));
    }
}

#[test]
fn more_stacks_than_shown_unreadable_and_untracked() {
    let mut f = facts(Class::Lost, Class::Lost);
    f.unreadable = 64;
    f.untracked = 1;
    assert_eq!(
        leak_lines(&f, Some(1), true),
        [
            "scanned 4096 bytes of roots (3 objects' data, 1 thread stack, 1 register set), \
             reached 0 of 3 live blocks",
            "(64 bytes of roots or blocks could not be read and were not scanned: blocks they \
             point to may be reported lost)",
            "definitely lost: 2 stacks, biggest first:",
            "definitely lost: 8192 bytes in 2 blocks, allocated from:",
            "    #0 0x1000 in hold_site at /src/p.c:56",
            "(definitely lost: 1 more stack with 1000 bytes in 1 block; -n 0 shows all)",
            "SUMMARY: 9192 bytes definitely lost in 3 blocks (direct: 9192 bytes in 3 blocks, \
             indirect: 0 bytes in 0 blocks); 0 bytes possibly lost in 0 blocks; \
             0 bytes still reachable in 0 blocks",
            "(1 block could not be tracked and are not counted)",
        ]
    );
}

#[test]
fn groups_biggest_first_then_more_blocks() {
    let b = |addr, size, stack| Live::of_class(addr, size, stack, Class::Lost);
    let groups = group_by_stack(
        &[b(1, 10, 1), b(2, 10, 1), b(3, 30, 2), b(4, 20, 3)],
        Class::Lost,
    );
    let got: Vec<_> = groups
        .iter()
        .map(|g| (g.stack, g.bytes, g.blocks))
        .collect();
    assert_eq!(got, [(2, 30, 1), (1, 20, 2), (3, 20, 1)]);
}

#[test]
fn read_from_a_process_image_with_a_stopped_thread() {
    // A heap of three blocks, a stack pointing at the first, a register at the second's
    // middle; the third is pointed at by nothing.
    let mut img = Image::new();
    let heap = img.map(0x1000);
    let stack = img.map(0x1000);
    let sp = stack + 0x800;
    img.write_u64(sp + 8, heap);
    // Below the red zone: a stale slot, not scanned.
    img.write_u64(sp - 0x100, heap + 0x200);
    let mut b = TraceBuilder::new();
    let s = b.add_stack(&[0x3000]);
    b.add_block(heap, 64, 1, s, 0);
    b.add_block(heap + 0x100, 64, 1, s, 0);
    b.add_block(heap + 0x200, 64, 1, s, 0);
    let built = b.build_into(img);
    let tables = Tables::open(&built.image, built.header).unwrap();
    let mappings = [Mapping {
        start: stack,
        end: stack + 0x1000,
        read: true,
        write: true,
        exec: false,
        offset: 0,
        name: "[stack]".into(),
    }];
    let threads = [ThreadState {
        tid: 7,
        sp: Some(sp),
        registers: vec![heap + 0x108, sp],
    }];
    let facts = LeakFacts::read(&tables, built.header, &[], &mappings, &threads).unwrap();
    assert_eq!(
        with_lookups(&tables, |l| lines(&facts, l, None, None, true)),
        [
            "scanned 2176 bytes of roots (0 objects' data, 1 thread stack, 1 register set), \
             reached 2 of 3 live blocks (1 only through interior pointers)",
            "definitely lost: 1 stack, biggest first:",
            "definitely lost: 64 bytes in 1 block, allocated from:",
            "    #0 0x3000 in leak_site at /src/p.c:76",
            "possibly lost: 1 stack, biggest first:",
            "possibly lost: 64 bytes in 1 block, allocated from:",
            "    #0 0x3000 in leak_site at /src/p.c:76",
            "still reachable: 1 stack, biggest first:",
            "still reachable: 64 bytes in 1 block, allocated from:",
            "    #0 0x3000 in leak_site at /src/p.c:76",
            "SUMMARY: 64 bytes definitely lost in 1 block (direct: 64 bytes in 1 block, indirect: 0 \
             bytes in 0 blocks); 64 bytes possibly lost in 1 block; \
             64 bytes still reachable in 1 block",
        ]
    );
}
