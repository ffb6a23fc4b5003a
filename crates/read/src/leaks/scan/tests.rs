//! The scan on synthetic memory: hand-made cases, and on random heaps the same classes as a
//! plain two-pass scan (below), the definition the scan's single pass must agree with.

use super::super::{Class, Live, Outcome, Root};
use super::Scan;
use crate::test_image::Image;

struct Heap {
    img: Image,
    heap: u64,
    data: u64,
}

fn heap() -> Heap {
    let mut img = Image::new();
    let heap = img.map(0x10000);
    let data = img.map(0x100);
    Heap { img, heap, data }
}

fn block(addr: u64, size: u64) -> Live {
    Live::new(addr, size, 1)
}

/// Scans `blocks` (any order) from `roots` and `registers`: each block's class, by address.
fn classes(
    img: &Image,
    blocks: &[Live],
    roots: &[Root],
    registers: &[u64],
) -> (Vec<(u64, Class)>, Outcome) {
    let mut v = blocks.to_vec();
    v.sort_by_key(|b| b.addr);
    let mut scan = Scan::new(img, &mut v).expect("memory");
    scan.words(registers);
    for r in roots {
        scan.root(*r);
    }
    let outcome = scan.finish();
    (v.iter().map(|b| (b.addr, b.class())).collect(), outcome)
}

impl Heap {
    fn roots(&self) -> Vec<Root> {
        vec![Root::range(self.data, self.data + 0x100)]
    }
}

use Class::{Lost, Possibly, Reachable};

#[test]
fn start_chains_reachable_interior_possibly_and_lost() {
    let mut h = heap();
    let (a, b, c, d) = (
        block(h.heap, 64),
        block(h.heap + 0x100, 1000),
        block(h.heap + 0x800, 32),
        block(h.heap + 0x900, 48),
    );
    h.img.write_u64(h.data + 8, a.addr); // root -> a (start)
    h.img.write_u64(a.addr + 8, d.addr); // a -> d (start): a chain of starts
    h.img.write_u64(a.addr + 16, b.addr + 500); // a -> inside b: possibly lost
    h.img.write_u64(c.addr, a.addr); // c -> a: does not reach c
    let (got, outcome) = classes(&h.img, &[c, b, a, d], &h.roots(), &[]);
    assert_eq!(
        got,
        [
            (a.addr, Reachable),
            (b.addr, Possibly),
            (c.addr, Lost),
            (d.addr, Reachable)
        ]
    );
    assert_eq!(outcome.root_bytes, 0x100);
    assert_eq!(
        (outcome.reachable.bytes, outcome.reachable.blocks),
        (112, 2)
    );
    assert_eq!((outcome.possibly.bytes, outcome.lost.bytes), (1000, 32));
    assert_eq!(outcome.unreadable, 0);
}

#[test]
fn an_interior_root_pointer_is_possibly_lost() {
    let mut h = heap();
    let a = block(h.heap, 64);
    h.img.write_u64(h.data, a.addr + 24);
    assert_eq!(classes(&h.img, &[a], &h.roots(), &[]).0[0].1, Possibly);
}

#[test]
fn a_start_pointer_from_a_possibly_lost_block_gives_possibly() {
    let mut h = heap();
    let (a, b, c) = (
        block(h.heap, 64),
        block(h.heap + 0x100, 64),
        block(h.heap + 0x200, 64),
    );
    h.img.write_u64(h.data, a.addr + 8); // root -> inside a
    h.img.write_u64(a.addr + 16, b.addr); // a -> b (start)
    h.img.write_u64(b.addr, c.addr + 8); // b -> inside c
    let got = classes(&h.img, &[a, b, c], &h.roots(), &[]).0;
    assert!(got.iter().all(|&(_, c)| c == Possibly), "{got:?}");
}

#[test]
fn a_start_pointer_from_reachable_memory_wins_over_interior_ones() {
    let mut h = heap();
    let (a, b, c, x) = (
        block(h.heap, 64),
        block(h.heap + 0x100, 64),
        block(h.heap + 0x200, 64),
        block(h.heap + 0x300, 64),
    );
    h.img.write_u64(h.data, b.addr + 8); // root -> inside b
    h.img.write_u64(h.data + 8, x.addr); // root -> x -> a -> b (starts)
    h.img.write_u64(x.addr, a.addr);
    h.img.write_u64(a.addr, b.addr);
    h.img.write_u64(b.addr + 8, c.addr); // b -> c (start)
    let got = classes(&h.img, &[a, b, c, x], &h.roots(), &[]).0;
    assert!(got.iter().all(|&(_, c)| c == Reachable), "{got:?}");
}

#[test]
fn registers_are_roots() {
    let h = heap();
    let a = block(h.heap, 64);
    let class = |r: u64| classes(&h.img, &[a], &[], &[r]).0[0].1;
    assert_eq!(class(a.addr), Reachable);
    assert_eq!(class(a.addr + 63), Possibly);
    assert_eq!(class(a.addr + 64), Lost); // one past the end
}

#[test]
fn a_lost_cycle_stays_lost() {
    let mut h = heap();
    let (a, b) = (block(h.heap, 64), block(h.heap + 0x200, 64));
    h.img.write_u64(a.addr, b.addr);
    h.img.write_u64(b.addr, a.addr);
    let (_, outcome) = classes(&h.img, &[a, b], &h.roots(), &[]);
    assert_eq!(outcome.lost.blocks, 2);
}

#[test]
fn glibc_next_header_lies_inside_only_for_sizes_1_to_8_past_16k() {
    use super::super::glibc_next_header as at;
    // Chunk = max(32, size + 8 rounded up to 16); the next header starts chunk - 16 bytes
    // after the block's start.
    for size in 0..=16 {
        assert_eq!(at(size), None, "size {size}");
    }
    for size in 17..=24 {
        assert_eq!(at(size), Some(16), "size {size}");
    }
    for size in 25..=32 {
        assert_eq!(at(size), None, "size {size}");
    }
    assert_eq!(at(33), Some(32));
    assert_eq!(at(40), Some(32));
    assert_eq!(at(41), None);
    assert_eq!(at(100), Some(96));
    assert_eq!(at(1000), Some(992));
    assert_eq!(at(1008), None);
    assert_eq!(at(u64::MAX), None);
    // Every size: the header is inside exactly when size % 16 is 1..=8 and size > 16, and
    // then it is at size rounded down to 16.
    for size in 0..4096u64 {
        let inside = size > 16 && (1..=8).contains(&(size % 16));
        assert_eq!(at(size), inside.then_some(size & !15), "size {size}");
    }
}

#[test]
fn a_pointer_to_glibc_next_header_is_not_a_pointer_into_the_block() {
    // glibc's bins and `top` point at the next chunk's header: inside a block of 1000 bytes
    // (at +992), 100 bytes (+96) or 20 bytes (+16). Neither reachable nor possibly lost.
    let mut h = heap();
    let roots = [Root::range(h.data, h.data + 8)];
    let mut class_with = |b: Live, p: u64| {
        h.img.write_u64(h.data, p);
        classes(&h.img, &[b], &roots, &[]).0[0].1
    };
    let a = block(h.heap, 1000);
    assert_eq!(class_with(a, a.addr + 992), Lost);
    assert_eq!(class_with(a, a.addr + 984), Possibly);
    let c = block(h.heap + 0x1000, 100);
    assert_eq!(class_with(c, c.addr + 96), Lost);
    assert_eq!(class_with(c, c.addr + 88), Possibly);
    let d = block(h.heap + 0x1800, 20);
    assert_eq!(class_with(d, d.addr + 16), Lost);
    // A 16-byte or a 64-byte block has no header inside: `p + 1` of a 16-byte block (8
    // bytes before its end) is a real interior pointer.
    let e = block(h.heap + 0x2000, 16);
    assert_eq!(class_with(e, e.addr + 8), Possibly);
    let b = block(h.heap + 0x2800, 64);
    assert_eq!(class_with(b, b.addr + 56), Possibly);
    // An 8-byte block: its start counts as its start.
    let f = block(h.heap + 0x3000, 8);
    assert_eq!(class_with(f, f.addr), Reachable);
}

#[test]
fn definitely_lost_splits_into_direct_and_indirect() {
    // A lost tree: root r -> children x, y (y through an interior pointer) -> grandchild z;
    // a lost cycle p <-> q (p first in address order: its leader, directly lost); and a lost
    // block w at a lower address than the block v that points to it.
    let mut h = heap();
    let at = |k: u64| h.heap + k * 0x100;
    let (w, r, x, y, z, p, q, v) = (
        block(at(0), 64),
        block(at(1), 64),
        block(at(2), 64),
        block(at(3), 64),
        block(at(4), 64),
        block(at(5), 64),
        block(at(6), 64),
        block(at(7), 64),
    );
    h.img.write_u64(r.addr, x.addr);
    h.img.write_u64(r.addr + 8, y.addr + 24);
    h.img.write_u64(y.addr, z.addr);
    h.img.write_u64(p.addr, q.addr);
    h.img.write_u64(q.addr, p.addr);
    h.img.write_u64(v.addr + 16, w.addr);
    let mut blocks = vec![w, r, x, y, z, p, q, v];
    let mut scan = Scan::new(&h.img, &mut blocks).expect("memory");
    scan.root(Root::range(h.data, h.data + 0x100));
    let outcome = scan.finish();
    let indirect: Vec<bool> = blocks.iter().map(|b| b.indirect()).collect();
    assert_eq!(
        indirect,
        [true, false, true, true, true, false, true, false],
        "w r x y z p q v"
    );
    assert_eq!(outcome.lost.blocks, 8);
    assert_eq!(outcome.indirect.blocks, 5);
    assert_eq!(outcome.indirect.bytes, 5 * 64);
    assert!(blocks.iter().all(|b| b.class() == Lost));
}

#[test]
fn reachable_and_possibly_lost_blocks_are_never_indirect() {
    let mut h = heap();
    let (a, b, c) = (
        block(h.heap, 64),
        block(h.heap + 0x100, 64),
        block(h.heap + 0x200, 64),
    );
    // A lost a points at the reachable b and the possibly lost c.
    h.img.write_u64(a.addr, b.addr);
    h.img.write_u64(a.addr + 8, c.addr);
    h.img.write_u64(h.data, b.addr);
    h.img.write_u64(h.data + 8, c.addr + 8);
    let mut blocks = vec![a, b, c];
    let mut scan = Scan::new(&h.img, &mut blocks).expect("memory");
    scan.root(Root::range(h.data, h.data + 0x100));
    let outcome = scan.finish();
    assert_eq!(outcome.indirect, Default::default());
    assert_eq!(outcome.lost.blocks, 1);
    assert!(blocks.iter().all(|b| !b.indirect()));
}

#[test]
fn zero_size_block_is_reached_by_its_start() {
    let h = heap();
    let (z, a) = (block(h.heap + 0x100, 0), block(h.heap + 0x110, 64));
    let got = classes(&h.img, &[z, a], &[], &[z.addr]).0;
    assert_eq!(got, [(z.addr, Reachable), (a.addr, Lost)]);
}

#[test]
fn unaligned_words_and_tail_bytes_are_not_pointers() {
    let mut h = heap();
    let (a, b) = (block(h.heap, 12), block(h.heap + 0x200, 64));
    // b's address at offset 4 (unaligned), in the 4 tail bytes that make no word.
    h.img.write(a.addr + 4, &b.addr.to_le_bytes());
    let got = classes(&h.img, &[a, b], &[], &[a.addr]).0;
    assert_eq!(got, [(a.addr, Reachable), (b.addr, Lost)]);
}

#[test]
fn unreadable_roots_and_blocks_are_counted_not_fatal() {
    let mut h = heap();
    let a = block(h.heap, 64);
    let gone = block(0x7000_0000_0000, 64); // not mapped in the image
    h.img.write_u64(a.addr, gone.addr);
    let missing = Root::range(0x6000_0000_0000, 0x6000_0000_2000);
    let (got, outcome) = classes(&h.img, &[a, gone], &[missing], &[a.addr]);
    assert!(got.iter().all(|&(_, c)| c == Reachable), "{got:?}");
    assert_eq!(outcome.unreadable, 0x2000 + 64);
    assert_eq!(outcome.root_bytes, 0x2000);
}

#[test]
fn a_downward_root_stops_at_its_first_unreadable_page() {
    // The main thread's stack as the process sees it: bounds far below what is mapped.
    let mut h = heap();
    let a = block(h.heap, 64);
    h.img.write_u64(h.data + 0x80, a.addr);
    let stack = Root {
        lo: h.data - 0x100000,
        hi: h.data + 0x100,
        downward: true,
    };
    let (got, outcome) = classes(&h.img, &[a], &[stack], &[]);
    assert_eq!(got[0].1, Reachable);
    assert_eq!(outcome.unreadable, 0);
}

#[test]
fn each_reached_block_is_read_once_and_gaps_never() {
    let mut h = heap();
    let blocks: Vec<Live> = (0..64).map(|i| block(h.heap + 0x100 * i, 0x40)).collect();
    // A stale pointer in a gap between blocks must not count.
    h.img.write_u64(h.heap + 0x80, h.heap + 0x100 * 63);
    for i in 0..62 {
        h.img.write_u64(blocks[i].addr, blocks[i + 1].addr);
    }
    h.img.reads.borrow_mut().clear();
    let (got, outcome) = classes(&h.img, &blocks, &[], &[blocks[0].addr]);
    assert_eq!(outcome.reachable.blocks, 63);
    assert_eq!(got[63], (blocks[63].addr, Lost));
    let mut reads = h.img.reads.borrow().clone();
    reads.sort_unstable();
    // The lost one too, once, to split the lost blocks into direct and indirect.
    let want: Vec<(u64, usize)> = blocks.iter().map(|b| (b.addr, 0x40)).collect();
    assert_eq!(reads, want);
}

/// The classes by definition, in two passes: the still reachable blocks are the closure of the
/// roots under start pointers; the possibly lost ones, the closure under any pointer of what
/// interior pointers met on the way hit.
fn two_passes(img: &Image, blocks: &[Live], roots: &[Root], registers: &[u64]) -> Vec<Class> {
    let n = blocks.len();
    let words = |lo: u64, hi: u64| -> Vec<u64> {
        let (lo, hi) = ((lo + 7) & !7, hi & !7);
        if hi <= lo {
            return Vec::new();
        }
        let mut buf = vec![0u8; (hi - lo) as usize];
        crate::memory::Memory::read(img, lo, &mut buf).expect("readable");
        buf.chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect()
    };
    let hits = |values: &[u64]| {
        let (mut start, mut inside) = (Vec::new(), Vec::new());
        let hi = blocks.last().map_or(0, |b| b.addr + b.size);
        for &v in values {
            if v < blocks[0].addr || v >= hi {
                continue;
            }
            let i = blocks.partition_point(|b| b.addr <= v) - 1;
            if v == blocks[i].addr {
                start.push(i);
            } else if v < blocks[i].addr + blocks[i].size
                && super::super::glibc_next_header(blocks[i].size) != Some(v - blocks[i].addr)
            {
                inside.push(i);
            }
        }
        (start, inside)
    };
    let contents = |set: &[usize]| -> Vec<u64> {
        set.iter()
            .flat_map(|&i| words(blocks[i].addr, blocks[i].addr + blocks[i].size))
            .collect()
    };
    let mut level = vec![Lost; n];
    let mut values: Vec<u64> = registers.to_vec();
    for r in roots {
        values.extend(words(r.lo, r.hi));
    }
    let (mut frontier, mut interior) = hits(&values);
    while !frontier.is_empty() {
        frontier.retain(|&i| level[i] == Lost);
        frontier.sort_unstable();
        frontier.dedup();
        for &i in &frontier {
            level[i] = Reachable;
        }
        let (start, inside) = hits(&contents(&frontier));
        interior.extend(inside);
        frontier = start.into_iter().filter(|&i| level[i] == Lost).collect();
    }
    let mut frontier: Vec<usize> = interior.into_iter().filter(|&i| level[i] == Lost).collect();
    while !frontier.is_empty() {
        frontier.sort_unstable();
        frontier.dedup();
        for &i in &frontier {
            level[i] = Possibly;
        }
        let (start, inside) = hits(&contents(&frontier));
        frontier = start
            .into_iter()
            .chain(inside)
            .filter(|&i| level[i] == Lost)
            .collect();
    }
    level
}

#[test]
fn same_classes_as_the_two_passes_of_the_gdb_command() {
    // Random heaps of start pointers, interior ones, ones 8 bytes before an end, zero-size
    // blocks and cycles (a small xorshift: the same heaps on every run).
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut rng = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    for _ in 0..300 {
        let mut img = Image::new();
        let n = 1 + rng(12) as usize;
        let sizes: Vec<u64> = (0..n)
            .map(|_| [0, 8, 16, 24, 40, 64, 1000][rng(7) as usize])
            .collect();
        let heap = img.map(sizes.iter().map(|s| s.max(&16) + 16).sum::<u64>() as usize);
        let mut blocks = Vec::new();
        let mut at = heap;
        for (k, &size) in sizes.iter().enumerate() {
            blocks.push(Live::new(at, size, k as u32));
            at += size.max(16) + 16;
        }
        let data = img.map(64);
        let target = |rng: &mut dyn FnMut(u64) -> u64| {
            let b = blocks[rng(n as u64) as usize];
            b.addr + [0, 0, 8, b.size.saturating_sub(8), b.size, 16][rng(6) as usize]
        };
        for _ in 0..rng(5) {
            let t = target(&mut rng);
            img.write_u64(data + 8 * rng(8), t);
        }
        for b in blocks.clone() {
            for off in (0..b.size - b.size % 8).step_by(8) {
                if rng(10) < 3 {
                    let t = target(&mut rng);
                    img.write_u64(b.addr + off, t);
                }
            }
        }
        let roots = [Root::range(data, data + 64)];
        let registers: Vec<u64> = if rng(10) < 3 {
            vec![target(&mut rng)]
        } else {
            Vec::new()
        };
        let want = two_passes(&img, &blocks, &roots, &registers);
        let got: Vec<Class> = classes(&img, &blocks, &roots, &registers)
            .0
            .into_iter()
            .map(|(_, c)| c)
            .collect();
        assert_eq!(got, want);
    }
}
