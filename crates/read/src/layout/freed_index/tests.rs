//! The freed-block index on images built from docs/LAYOUT.md: through the index, the same
//! answers as a scan of the ring, and its corruptions reported.

use super::super::near::tests::{BIG, HEAP};
use super::super::{Error, Tables};
use crate::test_image::{index_bucket, index_link, Built, Free, Image, TraceBuilder};

const SIZES: [u64; 18] = [
    0,
    1,
    16,
    48,
    64,
    65,
    100,
    255,
    256,
    257,
    1024,
    4096,
    5 * 1024,
    65536,
    200 * 1024,
    2 << 20,
    1 << 30,
    (1 << 40) + 5,
];

/// The same heaps on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn freed(addr: u64, size: u64, k: u64) -> Free {
    Free {
        addr,
        size,
        thread: 1,
        seq: 2 * k + 1,
        stack: 0,
        free_seq: 2 * k + 2,
        free_stack: 0,
        free_thread: 1,
        realloc: false,
    }
}

/// `n` frees over a small heap with reuse, of sizes across every level (granule-sized ones
/// included), and huge blocks far away.
fn random_frees(b: &mut TraceBuilder, seed: u64, n: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for k in 0..n {
        let size = match rng.below(SIZES.len() as u64 + 1) as usize {
            i if i < SIZES.len() => SIZES[i],
            _ => 1 << (6 + 2 * rng.below(18)),
        };
        let addr = if size >= 1 << 20 {
            BIG + (rng.below(64) << 16)
        } else {
            HEAP + 16 * (1 + rng.below(4095))
        };
        b.add_freed(freed(addr, size, k));
    }
}

fn free_seqs(built: &Built, addr: u64) -> Vec<u64> {
    Tables::open(&built.image, built.header)
        .expect("header")
        .freed_blocks_containing(addr)
        .unwrap_or_else(|e| panic!("{addr:#x}: {e}"))
        .iter()
        .map(|f| f.free_seq)
        .collect()
}

/// The same history laid out with its index and without.
fn both(b: &mut TraceBuilder) -> (Built, Built) {
    b.index_head_bits = None;
    let scan = b.build();
    b.index_head_bits = Some(5);
    let indexed = b.build();
    assert_ne!(indexed.index, 0);
    assert_eq!(scan.index, 0);
    (indexed, scan)
}

/// Addresses around every block's ends and middle, and the extremes.
fn probes(b: &TraceBuilder) -> Vec<u64> {
    let mut out = vec![0, 1, u64::MAX, HEAP, BIG];
    for f in &b.frees {
        let (a, size) = (f.addr, f.size.min((1 << 40) - 1));
        out.extend([
            a - 1,
            a,
            a + 1,
            a + size.saturating_sub(1),
            a + size,
            a + size / 2,
        ]);
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn assert_same(indexed: &Built, scan: &Built, addrs: &[u64]) {
    for &a in addrs {
        assert_eq!(free_seqs(indexed, a), free_seqs(scan, a), "address {a:#x}");
    }
}

#[test]
fn same_answers_as_a_scan_wrapped_or_not() {
    for (seed, cap, n) in [(1, 64, 40), (2, 64, 300), (3, 97, 1000)] {
        let mut b = TraceBuilder::new();
        b.history_capacity = Some(cap);
        random_frees(&mut b, seed, n);
        let (indexed, scan) = both(&mut b);
        assert_same(&indexed, &scan, &probes(&b));
    }
}

#[test]
fn chains_across_levels_and_blocks_of_exactly_a_granule() {
    let mut b = TraceBuilder::new();
    b.history_capacity = Some(64);
    // 64 bytes (level 0) and 256 bytes (level 1) ending one byte into the next granule;
    // 5 KiB, 200 KiB and 2 MiB blocks over the same bytes.
    b.add_freed(freed(HEAP + 0x40 * 5 + 1, 64, 0));
    b.add_freed(freed(HEAP + 0x100 * 9 + 1, 256, 1));
    b.add_freed(freed(HEAP, 5 * 1024, 2));
    b.add_freed(freed(HEAP - 0x1000, 200 * 1024, 3));
    b.add_freed(freed(HEAP - 0x10000, 2 << 20, 4));
    let (indexed, scan) = both(&mut b);
    assert_eq!(free_seqs(&indexed, HEAP + 0x180), [10, 8, 6, 2]);
    assert_eq!(free_seqs(&indexed, HEAP + 0xA00), [10, 8, 6, 4]);
    assert_eq!(free_seqs(&indexed, HEAP + 0xA01), [10, 8, 6]);
    assert_same(&indexed, &scan, &probes(&b));
}

#[test]
fn a_chain_stops_at_a_slot_reused_since() {
    let mut b = TraceBuilder::new();
    b.history_capacity = Some(4);
    b.add_freed(freed(HEAP, 48, 0));
    for k in 1..5 {
        // Record 4 takes record 0's slot.
        b.add_freed(freed(BIG + 0x1000 * k, 48, k));
    }
    let (indexed, scan) = both(&mut b);
    assert!(free_seqs(&indexed, HEAP + 8).is_empty());
    assert_eq!(free_seqs(&indexed, BIG + 0x4000), [10]);
    assert_same(&indexed, &scan, &probes(&b));
}

/// Record 3 joined its chain after 4..9 (its thread was behind the claims), in front of
/// record 5 of the same granule; record 11 then took its slot. Record 5 is still in the ring,
/// behind a chain cut at 3: the window of `disorder` records after 3 finds it.
#[test]
fn a_record_that_joined_late_uncovers_the_window() {
    let mut b = TraceBuilder::new();
    b.history_capacity = Some(8);
    for k in 0..12 {
        let addr = if k == 3 || k == 5 {
            HEAP + 0x20
        } else {
            BIG + 0x1000 * k
        };
        b.add_freed(freed(addr, 16, k));
    }
    b.insert_order = Some(vec![0, 1, 2, 4, 5, 6, 7, 8, 9, 3, 10, 11]);
    let (indexed, scan) = both(&mut b);
    assert_eq!(free_seqs(&indexed, HEAP + 0x20), [12]);
    assert_same(&indexed, &scan, &probes(&b));
    // Without the window the chain alone would lose record 5.
    b.disorder = Some(1);
    assert!(free_seqs(&b.build(), HEAP + 0x20).is_empty());
}

#[test]
fn reads_a_few_chunks_not_the_ring() {
    let mut b = TraceBuilder::new();
    let cap = 65536;
    b.history_capacity = Some(cap);
    random_frees(&mut b, 4, cap + 1000);
    // Four heads per record: few chains of other granules share a head with these.
    b.index_head_bits = Some(18);
    let built = b.build();
    // Addresses no block is near: what is read is the chains that share their heads.
    for a in [0x1234, HEAP + (16 << 20)] {
        built.image.reads.borrow_mut().clear();
        assert!(free_seqs(&built, a).is_empty());
        let reads = built.image.reads.borrow();
        assert!(reads.iter().all(|&(_, n)| n <= 40 * 256), "{reads:?}");
        let ring: usize = reads
            .iter()
            .filter(|&&(at, _)| (built.ring..built.ring + 40 * cap).contains(&at))
            .map(|&(_, n)| n)
            .sum();
        assert!(
            ring < 40 * cap as usize / 4,
            "{a:#x}: {ring} bytes of the ring"
        );
    }
}

/// Frees of 48 bytes over 7 neighbouring granules in a ring of 16, with 16 heads.
fn indexed() -> Built {
    let mut b = TraceBuilder::new();
    b.history_capacity = Some(16);
    for k in 0..40 {
        b.add_freed(freed(HEAP + 0x40 * (k % 7), 48, k));
    }
    b.index_head_bits = Some(4);
    b.build()
}

fn read_u64(image: &Image, at: u64) -> u64 {
    crate::memory::read_plain(image, at).expect("mapped")
}

/// The records on HEAP's chain, newest first, and where its head is.
fn chain(built: &Built) -> (Vec<u64>, u64) {
    let head = built.heads + 8 * index_bucket(HEAP, 48, 4);
    let (mut out, mut next) = (Vec::new(), read_u64(&built.image, head));
    while next != 0 {
        let k = next - 1;
        let link = read_u64(&built.image, built.links + 8 * (k % 16));
        if link >> 40 != k / 16 {
            break;
        }
        out.push(k);
        next = link & ((1 << 40) - 1);
    }
    (out, head)
}

fn corrupt(built: &Built) -> String {
    let t = Tables::open(&built.image, built.header).expect("header");
    match t.freed_blocks_containing(HEAP) {
        Err(Error::Corrupt(what)) => {
            assert!(!what.contains('\n'));
            what
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_looping_chain_is_an_error() {
    // The newest record back to itself; the oldest to the newest.
    for at in [0, usize::MAX] {
        let mut built = indexed();
        let (records, _) = chain(&built);
        assert!(records.len() > 1);
        let k = records[at.min(records.len() - 1)];
        let links = built.links;
        built
            .image
            .write_u64(links + 8 * (k % 16), index_link(k, 16, records[0] + 1));
        assert!(corrupt(&built).contains("loops"));
    }
}

#[test]
fn a_chain_naming_a_record_never_written_is_an_error() {
    let mut built = indexed();
    let (_, head) = chain(&built);
    built.image.write_u64(head, 41);
    assert!(corrupt(&built).contains("only 40 were written"));
}

#[test]
fn a_geometry_that_cannot_be_read_is_an_error() {
    for (offset, value) in [(0u64, 40u32), (8, 0), (8, 33), (12, 3), (12, 40)] {
        let mut built = indexed();
        let at = built.index + offset;
        built.image.write(at, &value.to_le_bytes());
        corrupt(&built);
    }
}

#[test]
fn an_unreadable_index_is_an_error() {
    for at in [24, 32] {
        let mut built = indexed();
        let index = built.index;
        built.image.write_u64(index + at, 0xDEAD_0000);
        let t = Tables::open(&built.image, built.header).expect("header");
        assert!(matches!(
            t.freed_blocks_containing(HEAP),
            Err(Error::Unreadable(_))
        ));
    }
}

/// Random bytes in the index's header, heads and links: an answer or an error, never a
/// panic or a hang.
#[test]
fn random_corruption_is_an_answer_or_an_error() {
    let mut rng = Rng(7);
    for _ in 0..300 {
        let mut built = indexed();
        let targets = [(built.index, 64), (built.heads, 128), (built.links, 128)];
        for _ in 0..=rng.below(6) {
            let (base, n) = targets[rng.below(3) as usize];
            let at = base + rng.below(n);
            let byte = rng.below(256) as u8;
            built.image.write(at, &[byte]);
        }
        let t = Tables::open(&built.image, built.header).expect("header");
        for a in [HEAP, HEAP + 40, HEAP + 0x100, 0x10, u64::MAX] {
            if let Err(e) = t.freed_blocks_containing(a) {
                assert!(!e.to_string().contains('\n'));
            }
        }
    }
}
