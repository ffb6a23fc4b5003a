//! Tagged blocks on images built from docs/LAYOUT.md "Block tags": found from any of their
//! bytes and from nothing else, and enumerated from memory full of other words.

use super::super::{Relation, Tables};
use super::*;
use crate::test_image::{Built, Free, Image, TraceBuilder};

/// A key as the writer makes them: top 16 bits neither all zero nor all one.
const KEY: u64 = 0x9c3e_1f2a_5b6d_7e81;
const HEAP: u64 = 0x1000_0000;
const HEAP_SIZE: usize = 3 << 20;

/// A process with tag key [`KEY`], a heap mapping at [`HEAP`] (given as a region) and one
/// table block of 1 MiB elsewhere.
fn tagged_process(tags: &[(u64, u64, u32, u32)]) -> Built {
    let mut img = Image::new();
    img.map_at(HEAP, HEAP_SIZE);
    for &(q, size, thread, stack) in tags {
        img.write_tag(KEY, q, size, thread, stack);
    }
    let mut b = TraceBuilder::new();
    b.tag_key = KEY;
    b.add_block(0x7fff_f000_0000, 1 << 20, 1, 0, 5);
    b.build_into(img)
}

fn tables(built: &Built) -> Tables<'_, Image> {
    Tables::open(&built.image, built.header)
        .expect("header")
        .with_regions(built.image.regions())
}

/// `find_block(addr, 0)`: the block's start and offset, when one holds `addr`.
fn holder(built: &Built, addr: u64) -> Option<(u64, u64)> {
    let m = tables(built).find_block(addr, 0).expect("readable")?;
    assert_eq!(m.relation, Relation::Inside);
    Some((m.block.addr, m.offset))
}

#[test]
fn a_tagged_block_is_found_from_each_of_its_bytes_and_no_other() {
    let q = HEAP + 0x1230;
    let built = tagged_process(&[(q, 100, 3, 77)]);
    let t = tables(&built);
    let m = t.find_block(q + 37, 0).unwrap().unwrap();
    assert_eq!(
        m.block,
        Block {
            addr: q,
            size: 100,
            thread: 3,
            seq: NO_SEQ,
            stack: 77
        }
    );
    assert!(is_tagged(&m.block));
    assert_eq!(holder(&built, q), Some((q, 0)));
    assert_eq!(holder(&built, q + 37), Some((q, 37)));
    assert_eq!(holder(&built, q + 99), Some((q, 99)));
    // One past its end, and the 16 bytes of its own tag, belong to no block.
    assert_eq!(holder(&built, q + 100), None);
    for a in q - 16..q {
        assert_eq!(holder(&built, a), None, "{a:#x}");
    }
    assert_eq!(t.live_blocks_containing(q + 50).unwrap(), vec![m.block]);
    assert_eq!(t.live_blocks_containing(q + 100).unwrap(), vec![]);
}

#[test]
fn stale_and_copied_tags_are_no_blocks() {
    let q = HEAP + 0x4000;
    let mut built = tagged_process(&[(q, 64, 1, 2)]);
    // A copy of the whole tag 32 bytes further on (the program copying memory, glibc moving
    // the chunk): bound to the address, it is no tag there.
    built
        .image
        .write_u64s(q + 0x100 - 16, &[q ^ KEY, 64 | 1 << 16]);
    assert_eq!(holder(&built, q + 0x100), None);
    assert_eq!(holder(&built, q + 0x100 + 8), None);
    assert_eq!(holder(&built, q + 8), Some((q, 8)));
    // A freed block: the writer zeroed its check word; the size word left behind is nothing.
    built.image.write_u64(q - 16, 0);
    assert_eq!(holder(&built, q + 8), None);
    assert_eq!(holder(&built, q), None);
}

#[test]
fn the_largest_tagged_block_is_found_from_its_last_byte() {
    let q = HEAP + 0x2_0000;
    let size = TAG_MAX_SIZE - 1;
    let built = tagged_process(&[(q, size, 1, 9)]);
    assert_eq!(holder(&built, q + size - 1), Some((q, size - 1)));
    assert_eq!(holder(&built, q + size), None);
    // The scan went back no further than 64 KiB: one read of the window.
    let reads = built.image.reads.borrow();
    let widest = reads.iter().map(|r| r.1).max().unwrap();
    assert!(widest as u64 <= TAG_MAX_SIZE, "{widest}");
}

#[test]
fn the_backward_scan_stops_at_the_start_of_the_mapping() {
    let below = HEAP + HEAP_SIZE as u64;
    let mut built = tagged_process(&[]);
    built.image.map_at(below, 0x1000);
    // A tag near the end of the heap whose size reaches past the heap's end: the memory
    // past it is another mapping, where no block of the heap can be.
    let q = below - 0x100;
    built.image.write_tag(KEY, q, 0x1000, 1, 1);
    assert_eq!(holder(&built, q + 0x80), Some((q, 0x80)));
    assert_eq!(holder(&built, below + 8), None);
    // Without the mappings the scan reads on into the heap and finds it there: which is why
    // every reader gives them.
    let t = Tables::open(&built.image, built.header).unwrap();
    assert_eq!(t.tagged_containing(below + 8).map(|b| b.addr), Some(q));
}

#[test]
fn table_blocks_are_still_found_first() {
    let mut img = Image::new();
    img.map_at(HEAP, HEAP_SIZE);
    let mut b = TraceBuilder::new();
    b.tag_key = KEY;
    // A large block in the table, and a tagged one just after it.
    b.add_block(HEAP + 0x1_0000, 1 << 17, 1, 0, 42);
    img.write_tag(KEY, HEAP + 0x3_0010, 24, 2, 3);
    let built = b.build_into(img);
    let t = tables(&built);
    let m = t.find_block(HEAP + 0x1_0000 + 5000, 0).unwrap().unwrap();
    assert_eq!((m.block.seq, m.offset), (42, 5000));
    assert_eq!(
        holder(&built, HEAP + 0x3_0010 + 23),
        Some((HEAP + 0x3_0010, 23))
    );
}

#[test]
fn near_misses_name_the_nearest_tagged_block() {
    let (a, b) = (HEAP + 0x1000, HEAP + 0x1100);
    let built = tagged_process(&[(a, 40, 1, 1), (b, 8, 1, 2)]);
    let t = tables(&built);
    let near = |addr| {
        t.find_block(addr, 4096)
            .unwrap()
            .map(|m| (m.block.addr, m.relation, m.offset))
    };
    assert_eq!(near(a + 40), Some((a, Relation::After, 0)));
    assert_eq!(near(a + 100), Some((a, Relation::After, 60)));
    // Nearer the next block's start than the first one's end.
    assert_eq!(near(b - 8), Some((b, Relation::Before, 8)));
    assert_eq!(near(a - 100), Some((a, Relation::Before, 100)));
    assert_eq!(near(b + 5000), None);
}

/// xorshift64*: the same "random" words on every run.
fn random_words(seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed;
    core::iter::repeat_with(move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

#[test]
fn enumeration_finds_every_tagged_block_and_nothing_else() {
    let mut img = Image::new();
    img.map_at(HEAP, HEAP_SIZE);
    // Random words, pointers into the heap, small integers and copies of tag words at the
    // wrong place: everything a heap holds besides the tags.
    let mut rng = random_words(0x1234_5678);
    for (k, at) in (HEAP..HEAP + HEAP_SIZE as u64).step_by(8).enumerate() {
        let r = rng.next().unwrap();
        let word = match k % 4 {
            0 => r,
            1 => (HEAP + (r % HEAP_SIZE as u64)) & !7,
            2 => r & 0xffff,
            _ => (HEAP + (r % HEAP_SIZE as u64)) ^ KEY,
        };
        img.write_u64(at, word);
    }
    // Tagged blocks all over the heap, across piece boundaries, at the first and the last
    // place a tag can be.
    let mut want = Vec::new();
    let mut q = HEAP + 16;
    let mut size = 0;
    while q < HEAP + HEAP_SIZE as u64 {
        img.write_tag(KEY, q, size, 7, size as u32 + 1);
        want.push((q, size));
        size = (size * 7 + 13) % 3000;
        q += 16 + ((size + 15) & !15) + 16 * (rng.next().unwrap() % 300);
    }
    let last = HEAP + HEAP_SIZE as u64 - 16;
    if want.last().map(|w| w.0 + w.1 + 16 <= last) == Some(true) {
        img.write_tag(KEY, last, 0, 7, 1);
        want.push((last, 0));
    }
    let mut b = TraceBuilder::new();
    b.tag_key = KEY;
    let built = b.build_into(img);
    built.image.reads.borrow_mut().clear();
    let t = tables(&built);
    let mut got = Vec::new();
    let scanned = t.for_each_tagged(&mut |b| got.push((b.addr, b.size)));
    assert_eq!(got, want);
    assert!(want.len() > 500, "{}", want.len());
    assert_eq!(scanned.unreadable, 0);
    assert!(scanned.bytes >= HEAP_SIZE as u64);
    let reads = built.image.reads.borrow();
    assert!(reads.iter().all(|r| r.1 as u64 <= SCAN_PIECE));
    // Every tagged block is one of the live blocks, with no number; the table adds none.
    drop(reads);
    let blocks = t.blocks().unwrap();
    assert_eq!(blocks.len(), want.len());
    assert!(blocks.iter().all(is_tagged));
    let totals = t.totals().unwrap();
    assert_eq!(totals.blocks, want.len() as u64);
    assert_eq!(totals.bytes, want.iter().map(|w| w.1).sum::<u64>());
}

#[test]
fn a_tag_across_a_piece_boundary_is_found_once() {
    let q = HEAP + SCAN_PIECE;
    let built = tagged_process(&[(q, 32, 1, 1), (q + 64, 16, 1, 1)]);
    let mut got = Vec::new();
    tables(&built).for_each_tagged(&mut |b| got.push(b.addr));
    assert_eq!(got, vec![q, q + 64]);
}

#[test]
fn unreadable_memory_is_counted_and_the_rest_scanned() {
    let built = tagged_process(&[(HEAP + 0x100, 8, 1, 1)]);
    // The region claims 1 MiB more than the image holds.
    let mut regions = built.image.regions();
    let heap = regions.iter_mut().find(|r| r.start == HEAP).unwrap();
    heap.end += SCAN_PIECE;
    let mut got = Vec::new();
    let format = TagFormat {
        key: KEY,
        seq: false,
    };
    let scanned = for_each_tagged(&built.image, format, &regions, &mut |b| got.push(b.addr));
    assert_eq!(got, vec![HEAP + 0x100]);
    assert_eq!(scanned.unreadable, SCAN_PIECE);
}

#[test]
fn no_key_no_tags() {
    let mut built = tagged_process(&[(HEAP + 0x100, 8, 1, 1)]);
    built.image.write_u64(built.header + 136, 0);
    let t = tables(&built);
    assert_eq!(t.tag_key(), 0);
    assert_eq!(t.find_block(HEAP + 0x100, 0).unwrap(), None);
    assert_eq!(t.blocks().unwrap().len(), 1);
}

#[test]
fn regions_are_the_readable_mappings_with_the_heap_marked() {
    let m = |start, name: &str, write| Mapping {
        start,
        end: start + 0x1000,
        read: true,
        write,
        exec: false,
        offset: 0,
        name: name.into(),
    };
    let mut unreadable = m(0x9000, "", true);
    unreadable.read = false;
    let r = regions(&[
        m(0x5000, "/lib/libc.so.6", true),
        m(0x1000, "[heap]", true),
        m(0x3000, "", true),
        m(0x7000, "", false),
        m(0x8000, "[stack]", true),
        unreadable,
    ]);
    let heap: Vec<(u64, bool)> = r.iter().map(|r| (r.start, r.heap)).collect();
    assert_eq!(
        heap,
        [
            (0x1000, true),
            (0x3000, true),
            (0x5000, false),
            (0x7000, false),
            (0x8000, false)
        ]
    );
    assert_eq!(region_of(&r, 0x3fff).map(|r| r.start), Some(0x3000));
    assert_eq!(region_of(&r, 0x4000), None);
}

/// A version 5 process wrote word 136 as reserved and every live block in the table: this
/// reader refuses it as it refuses every version it does not know (the contract's rule),
/// rather than read tags it would never find.
#[test]
fn version_5_is_refused() {
    let mut built = tagged_process(&[]);
    built.image.write(built.header + 8, &5u32.to_le_bytes());
    let err = Tables::open(&built.image, built.header).err().unwrap();
    assert_eq!(err, super::super::Error::Version { found: 5 });
    assert_eq!(
        err.to_string(),
        "the process writes layout version 5, this reader knows version 7: use the mem-trace build that traced it"
    );
}

/// A live tagged block over memory freed before: its allocation, which has no number, is
/// the newest event.
#[test]
fn a_tagged_block_is_the_newest_event_of_its_memory() {
    let q = HEAP + 0x500;
    let mut img = Image::new();
    img.map_at(HEAP, HEAP_SIZE);
    img.write_tag(KEY, q, 48, 1, 2);
    let mut b = TraceBuilder::new();
    b.tag_key = KEY;
    b.add_freed(crate::test_image::Free {
        addr: q,
        size: 32,
        thread: 1,
        seq: 10,
        stack: 1,
        free_seq: 11,
        free_stack: 0,
        free_thread: 1,
        realloc: false,
    });
    let built = b.build_into(img);
    let events = tables(&built).history_events(q + 8).unwrap();
    let got: Vec<(super::super::EventKind, u64)> = events.iter().map(|e| (e.kind, e.seq)).collect();
    use super::super::EventKind::{Allocation, Free};
    assert_eq!(got, [(Allocation, NO_SEQ), (Free, 11), (Allocation, 10)]);
}

/// A key the tracer never makes (top 16 bits all zero or all one) is a corrupt header, one
/// line, rather than a scan that takes every pointer for a candidate.
#[test]
fn a_key_the_tracer_never_makes_is_corrupt() {
    let mut built = tagged_process(&[]);
    for (key, all) in [(0x0000_7fff_1234_5678, "zero"), (u64::MAX, "one")] {
        built.image.write_u64(built.header + 136, key);
        let err = Tables::open(&built.image, built.header).err().unwrap();
        assert_eq!(
            err.to_string(),
            format!(
                "corrupt mem-trace tables: tag_key {key:#x} is no key the tracer makes (its top 16 bits are all {all})"
            )
        );
    }
    assert!(key_is_valid(KEY) && key_is_valid(mem_trace_format::tag_key(0)));
}

/// With `FLAG_TAG_SEQ` (debug mode), tags are 32 bytes and carry the block's sequence number
/// at `q - 24`: found from inside the block, from above it, and in an enumeration, even when
/// that word is the last of the piece before.
#[test]
fn long_tags_give_their_sequence_numbers() {
    let mut img = Image::new();
    img.map_at(HEAP, HEAP_SIZE);
    let blocks = [(HEAP + 0x1020, 40, 901), (HEAP + SCAN_PIECE + 16, 64, 902)];
    for &(q, size, seq) in &blocks {
        img.write_tag(KEY, q, size, 2, 9);
        img.write_u64s(q - 32, &[0, seq]);
    }
    let mut b = TraceBuilder::new();
    b.tag_key = KEY;
    b.flags |= mem_trace_format::FLAG_TAG_SEQ;
    let built = b.build_into(img);
    let t = tables(&built);
    assert_eq!(
        t.tag_format(),
        TagFormat {
            key: KEY,
            seq: true
        }
    );
    for &(q, size, seq) in &blocks {
        let m = t.find_block(q + size - 1, 0).unwrap().unwrap();
        assert_eq!((m.block.addr, m.block.seq), (q, seq));
        assert!(!is_tagged(&m.block));
    }
    let above = t.find_block(HEAP + 0x1000, 64).unwrap().unwrap();
    assert_eq!((above.block.addr, above.block.seq), (HEAP + 0x1020, 901));
    let mut got = Vec::new();
    t.for_each_tagged(&mut |b| got.push((b.addr, b.seq)));
    assert_eq!(
        got,
        vec![(HEAP + 0x1020, 901), (HEAP + SCAN_PIECE + 16, 902)]
    );
}

/// The four words of a freed tag (docs/LAYOUT.md "Freed tags") of the block `f` describes.
fn freed_tag_words(f: &Freed) -> [u64; 4] {
    let [free, seq] = mem_trace_format::pack_freed_tag(f);
    let record = mem_trace_format::pack_tag(f.block.size, f.block.thread, f.block.stack);
    [free, seq, freed_check(f.block.addr, KEY), record]
}

fn freed_at(addr: u64, size: u64, seq: u64, free_seq: u64) -> Freed {
    Freed {
        block: Block {
            addr,
            size,
            thread: 2,
            seq,
            stack: 9,
        },
        free_seq,
        free_stack: 11,
        free_thread: 3,
        by_realloc: false,
    }
}

/// A freed tag answers for its block's bytes only, is no live block, and a free the history
/// also holds is listed once; a copy of its words elsewhere is bound to its own address.
#[test]
fn a_held_freed_block_is_answered_from_its_tag_once() {
    let mut img = Image::new();
    img.map_at(HEAP, HEAP_SIZE);
    let (live, held, both) = (HEAP + 0x1020, HEAP + 0x1060, HEAP + 0x2000);
    img.write_tag(KEY, live, 40, 2, 9);
    img.write_u64s(live - 32, &[0, 905]);
    let (f_held, f_both) = (freed_at(held, 48, 910, 930), freed_at(both, 100, 940, 950));
    img.write_u64s(held - 32, &freed_tag_words(&f_held));
    img.write_u64s(both - 32, &freed_tag_words(&f_both));
    img.write_u64s(HEAP + 0x3020 - 32, &freed_tag_words(&f_held));
    let mut b = TraceBuilder::new();
    b.tag_key = KEY;
    b.flags |= mem_trace_format::FLAG_TAG_SEQ;
    b.add_freed(Free {
        addr: both,
        size: 100,
        thread: 2,
        seq: 940,
        stack: 9,
        free_seq: 950,
        free_stack: 11,
        free_thread: 3,
        realloc: false,
    });
    let built = b.build_into(img);
    let t = tables(&built);

    assert_eq!(t.freed_blocks_containing(held + 47).unwrap(), vec![f_held]);
    assert_eq!(t.freed_blocks_containing(held + 48).unwrap(), vec![]);
    assert_eq!(t.freed_blocks_containing(live + 3).unwrap(), vec![]);
    assert_eq!(t.freed_blocks_containing(HEAP + 0x3020).unwrap(), vec![]);
    assert_eq!(t.freed_blocks_containing(both + 99).unwrap(), vec![f_both]);
    assert_eq!(holder(&built, held), None, "no live block");
    let mut got = Vec::new();
    t.for_each_tagged(&mut |b| got.push(b.addr));
    assert_eq!(got, vec![live]);
    let events: Vec<(u64, bool)> = t
        .history_events(held)
        .unwrap()
        .iter()
        .map(|e| (e.seq, e.freed.is_some()))
        .collect();
    assert_eq!(events, vec![(930, true), (910, true)]);
}

/// Without `FLAG_TAG_SEQ` no tag is freed: the words are not read as one.
#[test]
fn short_tags_are_never_read_as_freed() {
    let mut img = Image::new();
    img.map_at(HEAP, HEAP_SIZE);
    let q = HEAP + 0x1060;
    img.write_u64s(q - 32, &freed_tag_words(&freed_at(q, 48, 910, 930)));
    let mut b = TraceBuilder::new();
    b.tag_key = KEY;
    let built = b.build_into(img);
    assert_eq!(tables(&built).freed_blocks_containing(q).unwrap(), vec![]);
}
