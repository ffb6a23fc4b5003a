//! Synthetic process images in the mem-trace layout, version 6, for the unit tests, written
//! from docs/LAYOUT.md with their own offsets, not with the decoder's, so that a misreading of
//! the contract in one does not hide in both.

use crate::memory::{read_plain, Memory, Unreadable};
use mem_trace_format::{STACK_IN_TREE, VERSION};
use std::cell::RefCell;
use std::collections::BTreeMap;

/// Sparse memory: separate mappings with unmapped gaps between them.
pub(crate) struct Image {
    maps: Vec<(u64, Vec<u8>)>,
    next: u64,
    /// `(addr, len)` of every read, for tests on what was read.
    pub(crate) reads: RefCell<Vec<(u64, usize)>>,
}

impl Image {
    pub(crate) fn new() -> Self {
        Image {
            maps: Vec::new(),
            next: 0x5000_0000,
            reads: RefCell::new(Vec::new()),
        }
    }

    /// A fresh zeroed mapping, 16-byte aligned; a 64 KiB hole follows it so overreads fail.
    pub(crate) fn map(&mut self, size: usize) -> u64 {
        let addr = (self.next + 15) & !15;
        self.maps.push((addr, vec![0; size]));
        self.next = addr + size.max(1) as u64 + 0x10000;
        addr
    }

    /// A zeroed mapping at `addr` (16-byte aligned), for a heap at a chosen place; it must not
    /// overlap another.
    pub(crate) fn map_at(&mut self, addr: u64, size: usize) -> u64 {
        assert!(addr.is_multiple_of(16));
        assert!(
            self.maps
                .iter()
                .all(|(s, b)| addr + size as u64 <= *s || *s + b.len() as u64 <= addr),
            "overlapping mapping at {addr:#x}"
        );
        self.maps.push((addr, vec![0; size]));
        addr
    }

    /// Every mapping as a heap region (anonymous writable memory), by address.
    pub(crate) fn regions(&self) -> Vec<crate::layout::tags::Region> {
        let mut out: Vec<_> = self
            .maps
            .iter()
            .map(|(start, buf)| crate::layout::tags::Region {
                start: *start,
                end: start + buf.len() as u64,
                heap: true,
            })
            .collect();
        out.sort_by_key(|r| r.start);
        out
    }

    /// Writes a live tag for a block of `size` bytes at `q` (docs/LAYOUT.md "Block tags").
    pub(crate) fn write_tag(&mut self, key: u64, q: u64, size: u64, thread: u32, stack: u32) {
        let word = size | u64::from(thread) << 16 | u64::from(stack) << 40;
        self.write_u64s(q - 16, &[q ^ key, word]);
    }

    /// Removes the mapping that starts at `addr`.
    pub(crate) fn unmap(&mut self, addr: u64) {
        self.maps.retain(|(start, _)| *start != addr);
    }

    fn find(&self, addr: u64, n: usize) -> Option<(usize, usize)> {
        self.maps.iter().enumerate().find_map(|(i, (start, buf))| {
            let off = addr.checked_sub(*start)? as usize;
            (off + n <= buf.len()).then_some((i, off))
        })
    }

    pub(crate) fn write(&mut self, addr: u64, data: &[u8]) {
        let (i, off) = self
            .find(addr, data.len())
            .unwrap_or_else(|| panic!("write outside mappings at {addr:#x}"));
        self.maps[i].1[off..off + data.len()].copy_from_slice(data);
    }

    pub(crate) fn write_u64(&mut self, addr: u64, value: u64) {
        self.write(addr, &value.to_le_bytes());
    }

    pub(crate) fn write_u64s(&mut self, addr: u64, values: &[u64]) {
        for (k, v) in values.iter().enumerate() {
            self.write_u64(addr + 8 * k as u64, *v);
        }
    }
}

impl Memory for Image {
    fn extent_holds(&self, addr: u64, len: u64) -> Result<(), u64> {
        let runs = crate::memory::extent::merge(
            self.maps
                .iter()
                .map(|(start, buf)| (*start, start + buf.len() as u64))
                .collect(),
        );
        crate::memory::extent::holds_in(&runs, addr, len)
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Unreadable> {
        self.reads.borrow_mut().push((addr, buf.len()));
        let (i, off) = self.find(addr, buf.len()).ok_or(Unreadable {
            addr,
            len: buf.len(),
        })?;
        buf.copy_from_slice(&self.maps[i].1[off..off + buf.len()]);
        Ok(())
    }
}

fn shard_of(region: u64) -> usize {
    (region.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as usize
}

const LOW40: u64 = (1 << 40) - 1;

/// A live block: (addr, size, thread, seq, stack).
type Slot = (u64, u64, u32, u64, u32);
/// A counter record's seven words (live bytes and blocks, total bytes and blocks, peak bytes
/// and blocks, last sequence number).
pub(crate) type Words = [u64; 7];

/// A free in the history ring.
#[derive(Clone, Copy)]
pub(crate) struct Free {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) thread: u32,
    pub(crate) seq: u64,
    pub(crate) stack: u32,
    pub(crate) free_seq: u64,
    pub(crate) free_stack: u32,
    pub(crate) free_thread: u32,
    pub(crate) realloc: bool,
}

/// A thread record's fields.
#[derive(Clone, Default)]
pub(crate) struct ThreadSpec {
    pub(crate) tid: u32,
    pub(crate) name: String,
    pub(crate) exited: bool,
    pub(crate) own_live: u64,
    pub(crate) freed_elsewhere: u64,
    pub(crate) peak_bytes: u64,
    pub(crate) allocated_bytes: u64,
}

/// Collects blocks, stacks and threads, then lays them out like the tracer.
pub(crate) struct TraceBuilder {
    pub(crate) blocks: Vec<Slot>,
    pub(crate) stacks: Vec<Vec<u64>>,
    /// Which stacks are stored as a reference into the call tree (the rest as frames).
    pub(crate) in_tree: Vec<bool>,
    pub(crate) threads: Vec<ThreadSpec>,
    pub(crate) next_seq: u64,
    pub(crate) flags: u64,
    pub(crate) untracked: u64,
    pub(crate) live_bytes: u64,
    pub(crate) peak_bytes: u64,
    pub(crate) peak_seq: u64,
    /// `MEM_TRACE_SAMPLE` (0: every block recorded).
    pub(crate) sample_mean: u64,
    /// The block tags' key (0: no block is tagged).
    pub(crate) tag_key: u64,
    /// `Some(resets)`: a profiler build.
    pub(crate) profile: Option<u64>,
    pub(crate) counters: BTreeMap<u32, Words>,
    /// Thread index → (cache slot, stack id, words).
    pub(crate) caches: BTreeMap<u32, Vec<(usize, u32, Words)>>,
    /// `None` leaves `header.freed` at 0.
    pub(crate) history_capacity: Option<u64>,
    pub(crate) history_flags: u32,
    pub(crate) frees: Vec<Free>,
    /// `None`: as many as `frees`.
    pub(crate) written: Option<u64>,
    pub(crate) quarantine_limit: u64,
    pub(crate) quarantined_bytes: u64,
    pub(crate) errors: u64,
    /// The freed-block index's head bits; `None`: no index (`history.index` is 0).
    pub(crate) index_head_bits: Option<u32>,
    /// The order in which the frees joined their chains, as indexes into `frees` (`None`: in
    /// ring order). A free that joins late is one whose thread was behind the claims.
    pub(crate) insert_order: Option<Vec<usize>>,
    /// The index's `disorder`; `None`: what the writer would have measured.
    pub(crate) disorder: Option<u64>,
}

/// Where the builder put things.
pub(crate) struct Built {
    pub(crate) image: Image,
    pub(crate) header: u64,
    pub(crate) ring: u64,
    /// The index's header, heads and links (0 without an index).
    pub(crate) index: u64,
    pub(crate) heads: u64,
    pub(crate) links: u64,
}

impl Built {
    /// Sets shard `index`'s live bytes to `bytes`, as a program scribbling over its tables can.
    pub(crate) fn set_shard_bytes(&mut self, index: u64, bytes: u64) {
        let shards = read_plain::<u64>(
            &self.image,
            self.header + core::mem::offset_of!(mem_trace_format::Header, shards) as u64,
        )
        .expect("the header");
        let at = shards
            + index * core::mem::size_of::<mem_trace_format::Shard>() as u64
            + core::mem::offset_of!(mem_trace_format::Shard, live_bytes) as u64;
        self.image.write_u64(at, bytes);
    }
}

/// The index's geometry as docs/LAYOUT.md gives it: 64-byte granules at level 0, each level 4
/// times the one below, 18 levels.
const GRANULE_SHIFT: u32 = 6;
const LEVEL_SHIFT: u32 = 2;
const LEVELS: u32 = 18;
const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// The level of a block of `size` bytes: the smallest whose granule holds it.
pub(crate) fn index_level(size: u64) -> u32 {
    (0..LEVELS)
        .find(|&l| size.min(LOW40) <= 1 << (GRANULE_SHIFT + LEVEL_SHIFT * l))
        .expect("the last level holds every size")
}

/// The head a block of `size` bytes starting at `addr` hangs from.
pub(crate) fn index_bucket(addr: u64, size: u64, head_bits: u32) -> u64 {
    let level = index_level(size);
    let granule = addr >> (GRANULE_SHIFT + LEVEL_SHIFT * level);
    let line =
        ((granule >> 3) * 32 + u64::from(level)).wrapping_mul(MULTIPLIER) >> (67 - head_bits);
    line * 8 + granule % 8
}

/// The node of `frames`' innermost frame, made in `nodes` from the outermost frame in,
/// sharing the nodes of a path already there.
fn tree_path(nodes: &mut Vec<(u64, u32)>, frames: &[u64]) -> u32 {
    let mut parent = 0u32;
    for &pc in frames.iter().rev() {
        parent = match nodes.iter().position(|&n| n == (pc, parent)) {
            Some(k) => k as u32 + 1,
            None => {
                nodes.push((pc, parent));
                nodes.len() as u32
            }
        };
    }
    parent
}

/// Record `k`'s link word: its lap in the high 24 bits, the next record plus one below.
pub(crate) fn index_link(k: u64, cap: u64, next_plus_one: u64) -> u64 {
    ((k / cap) & 0xff_ffff) << 40 | next_plus_one
}

impl TraceBuilder {
    pub(crate) fn new() -> Self {
        TraceBuilder {
            blocks: Vec::new(),
            stacks: Vec::new(),
            in_tree: Vec::new(),
            threads: Vec::new(),
            next_seq: 1,
            flags: 1,
            untracked: 0,
            live_bytes: 0,
            peak_bytes: 0,
            peak_seq: 0,
            sample_mean: 0,
            tag_key: 0,
            profile: None,
            counters: BTreeMap::new(),
            caches: BTreeMap::new(),
            history_capacity: Some(8),
            history_flags: 1,
            frees: Vec::new(),
            written: None,
            quarantine_limit: 0,
            quarantined_bytes: 0,
            errors: 0,
            index_head_bits: None,
            insert_order: None,
            disorder: None,
        }
    }

    pub(crate) fn add_stack(&mut self, frames: &[u64]) -> u32 {
        self.stacks.push(frames.to_vec());
        self.in_tree.push(false);
        self.stacks.len() as u32
    }

    /// A stack whose record names its frames in the call tree, whose nodes stacks added this
    /// way share where their outer frames agree (as the tracer's do).
    pub(crate) fn add_tree_stack(&mut self, frames: &[u64]) -> u32 {
        let id = self.add_stack(frames);
        self.in_tree[id as usize - 1] = true;
        id
    }

    pub(crate) fn add_thread(&mut self, spec: ThreadSpec) -> u32 {
        self.threads.push(spec);
        self.threads.len() as u32
    }

    /// A block; `seq` 0 takes the next sequence number.
    pub(crate) fn add_block(&mut self, addr: u64, size: u64, thread: u32, stack: u32, seq: u64) {
        let seq = if seq == 0 { self.next_seq } else { seq };
        self.next_seq = self.next_seq.max(seq + 1);
        self.blocks.push((addr, size, thread, seq, stack));
    }

    /// A free, in ring order: the k-th is record k (at index k % capacity).
    pub(crate) fn add_freed(&mut self, f: Free) {
        self.next_seq = self.next_seq.max(f.seq + 1).max(f.free_seq + 1);
        self.frees.push(f);
    }

    /// A counter record of thread `thread`'s cache naming `stack` (slot `stack % 128`).
    pub(crate) fn add_cached(&mut self, thread: u32, stack: u32, words: Words) {
        self.caches
            .entry(thread)
            .or_default()
            .push((stack as usize % 128, stack, words));
    }

    /// Lays everything out in a new image.
    pub(crate) fn build(&self) -> Built {
        self.build_into(Image::new())
    }

    /// Lays everything out in `img`, beside what it holds.
    pub(crate) fn build_into(&self, mut img: Image) -> Built {
        let header = img.map(160);

        let mut per_shard: BTreeMap<usize, Vec<Slot>> = BTreeMap::new();
        for &b in &self.blocks {
            let shard = if b.1 > 65536 {
                128
            } else {
                shard_of(b.0 >> 16)
            };
            per_shard.entry(shard).or_default().push(b);
        }
        let shards = img.map(129 * 64);
        for (&index, entries) in &per_shard {
            let mut cap = 16usize;
            while cap < 2 * entries.len() {
                cap *= 2;
            }
            let array = img.map(16 + 24 * cap);
            img.write_u64(array, cap as u64);
            let mut used = vec![false; cap];
            let mut live_bytes = 0;
            for &(addr, size, thread, seq, stack) in entries {
                let mut pos =
                    ((addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize) & (cap - 1);
                while used[pos] {
                    pos = (pos + 1) & (cap - 1);
                }
                used[pos] = true;
                img.write_u64s(
                    array + 16 + 24 * pos as u64,
                    &[
                        addr,
                        size.min(LOW40) | u64::from(thread) << 40,
                        seq | u64::from(stack) << 40,
                    ],
                );
                live_bytes += size;
            }
            let at = shards + 64 * index as u64;
            img.write_u64s(at + 8, &[array, entries.len() as u64, 0, live_bytes]);
        }

        // The call tree's nodes, `(pc, parent)`, id k + 1 at index k.
        let mut nodes: Vec<(u64, u32)> = Vec::new();
        let stacks = img.map(16 + 8 * 256);
        img.write_u64(stacks, self.stacks.len() as u64);
        img.write(stacks + 8, &[16, 0, 0, 0, 0, 1, 0, 0]);
        if !self.stacks.is_empty() {
            let chunk = img.map(8 * 65536);
            img.write_u64(stacks + 16, chunk);
            for (i, frames) in self.stacks.iter().enumerate() {
                let rec = match self.in_tree[i] {
                    true => {
                        let rec = img.map(16);
                        let node = tree_path(&mut nodes, frames);
                        img.write_u64s(rec, &[STACK_IN_TREE | frames.len() as u64, node.into()]);
                        rec
                    }
                    false => {
                        let rec = img.map(8 + 8 * frames.len());
                        img.write_u64(rec, frames.len() as u64);
                        img.write_u64s(rec + 8, frames);
                        rec
                    }
                };
                img.write_u64(chunk + 8 * (i as u64 + 1), rec);
            }
        }
        let tree = img.map(16 + 8 * 256);
        img.write_u64(tree, nodes.len() as u64);
        img.write(tree + 8, &[16, 0, 0, 0, 0, 1, 0, 0]);
        if !nodes.is_empty() {
            let chunk = img.map(16 * 65536);
            img.write_u64(tree + 16, chunk);
            for (k, &(pc, parent)) in nodes.iter().enumerate() {
                img.write_u64s(chunk + 16 * (k as u64 + 1), &[pc, parent.into()]);
            }
        }

        let threads = img.map(16 + 8 * 4096);
        img.write_u64(threads, self.threads.len() as u64);
        img.write(threads + 8, &[12, 0, 0, 0, 0, 16, 0, 0]);
        if !self.threads.is_empty() {
            let chunk = img.map(64 * 4096);
            img.write_u64(threads + 16, chunk);
            for (k, t) in self.threads.iter().enumerate() {
                let i = k as u32 + 1;
                let mut cache = 0;
                if let Some(records) = self.caches.get(&i) {
                    cache = img.map(64 * 128);
                    for &(slot, stack, words) in records {
                        let at = cache + 64 * slot as u64;
                        img.write_u64s(at, &words);
                        img.write_u64(at + 56, u64::from(stack + 1) << 32);
                    }
                }
                let at = chunk + 64 * u64::from(i);
                img.write(at, &t.tid.to_le_bytes());
                img.write(at + 4, &u32::from(t.exited).to_le_bytes());
                let name = t.name.as_bytes();
                img.write(at + 8, &name[..name.len().min(16)]);
                img.write_u64s(
                    at + 24,
                    &[
                        cache,
                        t.own_live,
                        t.freed_elsewhere,
                        t.peak_bytes,
                        t.allocated_bytes,
                    ],
                );
            }
        }

        let mut profile = 0;
        if let Some(resets) = self.profile {
            profile = img.map(64 + 8 * 4096);
            img.write(profile, &[64, 0, 0, 0, 12, 0, 0, 0]);
            img.write(profile + 8, &[0, 16, 0, 0]);
            img.write_u64(profile + 24, resets);
            let mut chunks: BTreeMap<u32, u64> = BTreeMap::new();
            for (&stack, words) in &self.counters {
                let k = stack >> 12;
                let chunk = *chunks.entry(k).or_insert_with(|| img.map(64 * 4096));
                img.write_u64(profile + 64 + 8 * u64::from(k), chunk);
                img.write_u64s(chunk + 64 * u64::from(stack & 4095), words);
            }
        }

        let mut freed = 0;
        let mut ring = 0;
        let (mut index, mut heads, mut links) = (0, 0, 0);
        if let Some(cap) = self.history_capacity {
            freed = img.map(64);
            if !self.frees.is_empty() && cap > 0 {
                ring = img.map(40 * cap as usize);
                for (k, f) in self.frees.iter().enumerate() {
                    let at = ring + 40 * (k as u64 % cap);
                    img.write_u64s(
                        at,
                        &[
                            f.addr,
                            f.size.min(LOW40) | u64::from(f.thread) << 40,
                            f.seq | u64::from(f.stack) << 40,
                            f.free_seq | u64::from(f.free_stack) << 40,
                            u64::from(f.free_thread) | u64::from(f.realloc) << 32,
                        ],
                    );
                }
            }
            if let (Some(bits), true) = (self.index_head_bits, ring != 0) {
                (index, heads, links) = self.lay_out_index(&mut img, cap, bits);
            }
            let written = self.written.unwrap_or(self.frees.len() as u64);
            img.write(freed, &40u32.to_le_bytes());
            img.write(freed + 4, &self.history_flags.to_le_bytes());
            img.write_u64s(
                freed + 8,
                &[
                    cap,
                    ring,
                    written,
                    self.quarantine_limit,
                    self.quarantined_bytes,
                    self.errors,
                    index,
                ],
            );
        }

        img.write(header, b"MEMTRACE");
        for (k, v) in [VERSION, 160, 24, 64, 129, 16].iter().enumerate() {
            img.write(header + 8 + 4 * k as u64, &v.to_le_bytes());
        }
        img.write_u64s(
            header + 32,
            &[
                shards,
                stacks,
                threads,
                freed,
                self.next_seq,
                self.live_bytes,
                self.flags,
                self.untracked,
                profile,
                self.peak_bytes,
                self.peak_seq,
                tree,
                self.sample_mean,
                self.tag_key,
            ],
        );
        Built {
            image: img,
            header,
            ring,
            index,
            heads,
            links,
        }
    }

    /// The freed-block index over the ring: each free joins the chain of its level's granule
    /// in `insert_order`, its link written before the head names it, as the writer does.
    fn lay_out_index(&self, img: &mut Image, cap: u64, bits: u32) -> (u64, u64, u64) {
        let index = img.map(64);
        let heads = img.map(8 << bits);
        let links = img.map(8 * cap as usize);
        let order: Vec<usize> = match &self.insert_order {
            Some(o) => o.clone(),
            None => (0..self.frees.len()).collect(),
        };
        let mut head = vec![0u64; 1 << bits];
        let (mut claimed, mut disorder) = (0u64, 0u64);
        for &k in &order {
            let f = &self.frees[k];
            let k = k as u64;
            let b = index_bucket(f.addr, f.size, bits) as usize;
            img.write_u64(links + 8 * (k % cap), index_link(k, cap, head[b]));
            head[b] = k + 1;
            // At least every record that joined a chain before was claimed by then.
            claimed = claimed.max(k + 1);
            disorder = disorder.max(claimed - k);
        }
        img.write_u64s(heads, &head);
        img.write(index, &GRANULE_SHIFT.to_le_bytes());
        img.write(index + 4, &LEVEL_SHIFT.to_le_bytes());
        img.write(index + 8, &LEVELS.to_le_bytes());
        img.write(index + 12, &bits.to_le_bytes());
        img.write_u64s(
            index + 16,
            &[MULTIPLIER, heads, links, self.disorder.unwrap_or(disorder)],
        );
        (index, heads, links)
    }
}
