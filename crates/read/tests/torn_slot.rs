//! `Tables::find_containing` never shows a torn slot as a block: over a memory whose slot
//! changes between reads (as a running process's may while `process_vm_readv` copies it),
//! the answer is a block both reads agree on, or `Error::Changing`; and a corrupt slot array
//! costs an error, not a huge read.
//!
//! The tables are built by hand from docs/LAYOUT.md: a header, the shard array with one slot
//! array, a stack store with one published stack.

use mem_trace_format::{
    pack_seq_id, pack_size_thread, shard_of, Block, MAGIC, REGION_SHIFT, SHARD_COUNT, VERSION,
};
use mem_trace_read::layout::{Error, Tables};
use mem_trace_read::memory::{Memory, Unreadable};
use std::cell::Cell;

/// The header's size in this layout version.
const HEADER_SIZE: usize = core::mem::size_of::<mem_trace_format::Header>();

const HEADER: u64 = 0x1000;
const SHARDS: u64 = 0x2000;
const STACKS: u64 = 0x10000;
const DIR_CHUNK: u64 = 0x20000;
const RECORD: u64 = 0x21000;
const ARRAY: u64 = 0x30000;
const BLOCK: u64 = 0x5555_0000_1000;

/// Slot contents, as (addr, size, stack).
type Slot = (u64, u64, u32);

/// Fixed regions, and a one-slot array whose slot reads as `slot(n)` on the `n`th read of
/// the array (a scan or a re-read of the slot).
struct Image<F: Fn(u32) -> Slot> {
    regions: Vec<(u64, Vec<u8>)>,
    /// The slot array's capacity word (1: the array holds one slot).
    capacity: u64,
    slot: F,
    reads: Cell<u32>,
}

fn words(ws: &[u64]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

impl<F: Fn(u32) -> Slot> Image<F> {
    fn new(slot: F) -> Self {
        let mut header = Vec::new();
        header.extend_from_slice(&MAGIC);
        for w in [
            VERSION,
            HEADER_SIZE as u32,
            24,
            64,
            SHARD_COUNT as u32,
            REGION_SHIFT,
        ] {
            header.extend_from_slice(&w.to_le_bytes());
        }
        // shards, stacks, threads, freed, then the counters and reserved words.
        header.extend(words(&[SHARDS, STACKS, 0, 0]));
        header.resize(HEADER_SIZE, 0);
        let mut shards = vec![0u8; SHARD_COUNT * 64];
        let shard = shard_of(BLOCK >> REGION_SHIFT) * 64;
        shards[shard + 8..shard + 16].copy_from_slice(&ARRAY.to_le_bytes());
        let mut stacks = words(&[1]);
        stacks.extend_from_slice(&16u32.to_le_bytes());
        stacks.extend_from_slice(&256u32.to_le_bytes());
        stacks.extend(words(&[DIR_CHUNK]));
        stacks.resize(16 + 256 * 8, 0);
        Image {
            regions: vec![
                (HEADER, header),
                (SHARDS, shards),
                (STACKS, stacks),
                // Stack 1 is published; the entry of id 0 is never used.
                (DIR_CHUNK, words(&[0, RECORD])),
                (RECORD, words(&[1, 0x0040_1122])),
            ],
            capacity: 1,
            slot,
            reads: Cell::new(0),
        }
    }
}

impl<F: Fn(u32) -> Slot> Memory for Image<F> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Unreadable> {
        let fail = Unreadable {
            addr,
            len: buf.len(),
        };
        let end = addr.checked_add(buf.len() as u64).ok_or(fail)?;
        // The slot array: capacity 1, a reserved word, the slot.
        if addr >= ARRAY && end <= ARRAY + 40 {
            let n = self.reads.get();
            if addr >= ARRAY + 16 {
                self.reads.set(n + 1);
            }
            let (a, size, stack) = (self.slot)(n);
            let bytes = words(&[
                self.capacity,
                0,
                a,
                pack_size_thread(size, 1),
                pack_seq_id(7, stack),
            ]);
            buf.copy_from_slice(&bytes[(addr - ARRAY) as usize..(end - ARRAY) as usize]);
            return Ok(());
        }
        let (start, bytes) = self
            .regions
            .iter()
            .find(|(start, bytes)| *start <= addr && end <= start + bytes.len() as u64)
            .ok_or(fail)?;
        buf.copy_from_slice(&bytes[(addr - start) as usize..(end - start) as usize]);
        Ok(())
    }
}

fn find<F: Fn(u32) -> Slot>(image: &Image<F>, addr: u64) -> Result<Option<Block>, Error> {
    Tables::open(image, HEADER).unwrap().find_containing(addr)
}

#[test]
fn a_stable_slot_is_found() {
    let image = Image::new(|_| (BLOCK, 64, 1));
    let b = find(&image, BLOCK + 10).unwrap().unwrap();
    assert_eq!((b.addr, b.size, b.stack, b.seq), (BLOCK, 64, 1, 7));
    assert_eq!(find(&image, BLOCK + 64).unwrap(), None);
}

#[test]
fn a_slot_torn_on_the_first_read_is_read_again() {
    // First read: the address of the block, the size and stack of whatever was written over
    // it. Every later read: the block as published.
    let image = Image::new(|n| {
        if n == 0 {
            (BLOCK, 4096, 9)
        } else {
            (BLOCK, 64, 1)
        }
    });
    let b = find(&image, BLOCK + 10).unwrap().unwrap();
    assert_eq!((b.size, b.stack), (64, 1));
    assert!(image.reads.get() >= 3, "scanned again after the mismatch");
    // Torn so that the block seems to hold the address: not shown either.
    let image = Image::new(|n| {
        if n == 0 {
            (BLOCK, 4096, 1)
        } else {
            (BLOCK, 64, 1)
        }
    });
    assert_eq!(find(&image, BLOCK + 1000).unwrap(), None);
}

#[test]
fn a_slot_that_keeps_changing_is_reported_not_shown() {
    let image = Image::new(|n| (BLOCK, 64 + u64::from(n), 1));
    let e = find(&image, BLOCK + 10).unwrap_err();
    assert_eq!(
        e,
        Error::Changing {
            addr: BLOCK + 10,
            tries: 8
        }
    );
    assert_eq!(
        e.to_string(),
        format!(
            "the block containing {:#x} was being changed by the process during each of 8 reads: ask again",
            BLOCK + 10
        )
    );
}

#[test]
fn a_stack_id_not_published_is_not_shown() {
    // Both reads agree, but stack 5 was never handed out: the slot cannot be whole.
    let image = Image::new(|_| (BLOCK, 64, 5));
    assert!(matches!(
        find(&image, BLOCK + 10),
        Err(Error::Changing { .. })
    ));
}

#[test]
fn a_corrupt_capacity_fails_without_reading_it_all_at_once() {
    // 2^32 slots are 96 GiB of words: reading them in one piece would abort on the
    // allocation; read in pieces, the first unreadable one ends it.
    let mut image = Image::new(|_| (BLOCK, 64, 1));
    image.capacity = 1 << 32;
    assert!(matches!(
        find(&image, BLOCK + 10),
        Err(Error::Unreadable(u)) if u.addr == ARRAY + 16
    ));
}
