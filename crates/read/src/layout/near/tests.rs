//! Finding blocks by address, and checking the header, on images built from
//! docs/LAYOUT.md.

use super::super::relation::{Match, Relation, DEFAULT_MAX_GAP};
use super::super::Tables;
use crate::test_image::{Built, Image, ThreadSpec, TraceBuilder};
use mem_trace_format::{shard_of, VERSION};

pub(crate) const HEAP: u64 = 0x5555_5555_A000;
pub(crate) const BIG: u64 = 0x7FFF_F000_0000;

/// Two threads, two stacks, two small blocks and a large one (`Fixture.standard`).
pub(crate) fn standard() -> TraceBuilder {
    let mut b = TraceBuilder::new();
    let main = b.add_thread(ThreadSpec {
        tid: 4242,
        name: "prog".into(),
        ..ThreadSpec::default()
    });
    let worker = b.add_thread(ThreadSpec {
        tid: 4243,
        name: "worker-with-a-long-name".into(),
        exited: true,
        ..ThreadSpec::default()
    });
    let s1 = b.add_stack(&[0x5555_5555_516D, 0x5555_5555_5200, 0x7FFF_F7DF_0D90]);
    let s2 = b.add_stack(&[0x5555_5555_5300]);
    b.add_block(HEAP + 0x2A0, 100, main, s1, 1234);
    b.add_block(HEAP + 0x310, 32, worker, s2, 1235);
    b.add_block(BIG, 1 << 20, main, s2, 7);
    b.untracked = 2;
    b
}

/// `find_block(addr, gap)` on `built`: (relation, offset, the block's seq).
fn find(built: &Built, addr: u64, gap: u64) -> Option<(Relation, u64, u64)> {
    let t = Tables::open(&built.image, built.header).expect("header");
    t.find_block(addr, gap)
        .expect("readable")
        .map(|m: Match| (m.relation, m.offset, m.block.seq))
}

/// A region start `r << 16` above `base` with `shard_of(r) != shard_of(r - 1)`.
fn region_start_in_other_shard(base: u64) -> u64 {
    let mut r = (base >> 16) + 1;
    while shard_of(r) == shard_of(r - 1) {
        r += 1;
    }
    r << 16
}

use Relation::{After, Before, Inside};

#[test]
fn inside_after_before_and_the_nearest_in_a_gap() {
    let built = standard().build();
    let f = |addr| find(&built, addr, DEFAULT_MAX_GAP);
    assert_eq!(f(HEAP + 0x2A0), Some((Inside, 0, 1234)));
    assert_eq!(f(HEAP + 0x2A0 + 37), Some((Inside, 37, 1234)));
    assert_eq!(f(HEAP + 0x2A0 + 99), Some((Inside, 99, 1234)));
    assert_eq!(f(HEAP + 0x2A0 + 100), Some((After, 0, 1234)));
    assert_eq!(f(HEAP + 0x2A0 + 104), Some((After, 4, 1234)));
    assert_eq!(f(HEAP + 0x2A0 - 8), Some((Before, 8, 1234)));
    // Block 1 ends at +0x304, block 2 starts at +0x310.
    assert_eq!(f(HEAP + 0x30C), Some((Before, 4, 1235)));
    assert_eq!(f(HEAP + 0x306), Some((After, 2, 1234)));
    let whole = Tables::open(&built.image, built.header)
        .unwrap()
        .find_block(HEAP + 0x2A5, 0)
        .unwrap()
        .unwrap();
    assert_eq!(
        (whole.address, whole.block.size, whole.block.thread),
        (HEAP + 0x2A5, 100, 1)
    );
}

#[test]
fn a_tie_prefers_after() {
    let mut b = TraceBuilder::new();
    b.add_block(HEAP, 16, 1, 0, 1);
    b.add_block(HEAP + 24, 16, 1, 0, 2);
    assert_eq!(
        find(&b.build(), HEAP + 20, DEFAULT_MAX_GAP),
        Some((After, 4, 1))
    );
}

#[test]
fn nothing_near() {
    let built = standard().build();
    assert_eq!(find(&built, 0x10, DEFAULT_MAX_GAP), None);
    assert_eq!(
        find(&built, HEAP + 0x310 + 32 + 5000, DEFAULT_MAX_GAP),
        None
    );
    assert_eq!(find(&built, HEAP + 0x2A0 + 100, 0), None);
    assert_eq!(find(&built, u64::MAX, DEFAULT_MAX_GAP), None);
}

#[test]
fn large_blocks_and_blocks_across_regions() {
    let built = standard().build();
    for off in [0, 12345, (1 << 20) - 1] {
        assert_eq!(
            find(&built, BIG + off, DEFAULT_MAX_GAP),
            Some((Inside, off, 7))
        );
    }
    assert_eq!(
        find(&built, BIG + (1 << 20) + 3, DEFAULT_MAX_GAP),
        Some((After, 3, 7))
    );
    // In the next region, found through shard_of(r - 1).
    let start = region_start_in_other_shard(HEAP) - 40;
    let mut b = TraceBuilder::new();
    b.add_block(start, 100, 1, 0, 9);
    assert_eq!(
        find(&b.build(), start + 60, DEFAULT_MAX_GAP),
        Some((Inside, 60, 9))
    );
    // A 64 KiB block starting just below a region boundary ends in the next region; an
    // address a little past its end is two regions above its start.
    let r = region_start_in_other_shard(HEAP + 0x20000);
    let start = r - 0x10000 - 16;
    let mut b = TraceBuilder::new();
    b.add_block(start, 0x10000, 1, 0, 3);
    assert_eq!(
        find(&b.build(), start + 0x10020, DEFAULT_MAX_GAP),
        Some((After, 0x20, 3))
    );
}

#[test]
fn a_zero_size_block_holds_its_start_only() {
    let mut b = TraceBuilder::new();
    b.add_block(HEAP, 0, 1, 0, 5);
    let built = b.build();
    assert_eq!(find(&built, HEAP, DEFAULT_MAX_GAP), Some((Inside, 0, 5)));
    assert_eq!(find(&built, HEAP + 1, DEFAULT_MAX_GAP), Some((After, 1, 5)));
}

#[test]
fn blocks_and_the_live_ones_at_an_address() {
    let built = standard().build();
    let t = Tables::open(&built.image, built.header).unwrap();
    let mut all: Vec<(u64, u64, u64)> = t
        .blocks()
        .unwrap()
        .iter()
        .map(|b| (b.addr, b.size, b.seq))
        .collect();
    all.sort_unstable();
    assert_eq!(
        all,
        [
            (HEAP + 0x2A0, 100, 1234),
            (HEAP + 0x310, 32, 1235),
            (BIG, 1 << 20, 7)
        ]
    );
    let at = |a| -> Vec<u64> {
        t.live_blocks_containing(a)
            .unwrap()
            .iter()
            .map(|b| b.seq)
            .collect()
    };
    assert_eq!(at(HEAP + 0x2A5), [1234]);
    assert_eq!(at(BIG + 77), [7]);
    assert!(at(HEAP + 0x304).is_empty());
}

#[test]
fn an_uninitialised_header_has_no_blocks() {
    // Every table pointer 0, as before the tracer's constructor ran.
    let mut img = Image::new();
    let size = core::mem::size_of::<mem_trace_format::Header>() as u32;
    let h = img.map(size as usize);
    img.write(h, b"MEMTRACE");
    for (k, v) in [VERSION, size, 24, 64, 129, 16].iter().enumerate() {
        img.write(h + 8 + 4 * k as u64, &v.to_le_bytes());
    }
    let t = Tables::open(&img, h).unwrap();
    assert_eq!(t.find_block(HEAP, DEFAULT_MAX_GAP).unwrap(), None);
    assert!(t.blocks().unwrap().is_empty());
    assert!(t.live_blocks_containing(HEAP).unwrap().is_empty());
    assert_eq!(t.history_header().unwrap(), None);
    assert!(t.freed_blocks_containing(HEAP).unwrap().is_empty());
    assert!(t.history_events(HEAP).unwrap().is_empty());
}
