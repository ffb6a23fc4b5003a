//! The `docs/LAYOUT.md` decoder, over any [`Memory`]: the one every reader uses (the
//! `mem-trace` command, and gdb's commands through `crates/gdb`).
//!
//! It reads what the writer publishes and nothing else, and trusts none of it: a version it
//! does not know, sizes that disagree with the contract, a count or capacity past what the
//! format allows are errors, never a long loop or a huge allocation. Entries are read the way
//! the writer publishes them (docs/LAYOUT.md "Publication"): a slot whose `addr` is above 1 is
//! whole, and a block met twice while it moves is the same block.

use crate::memory::{read_plain, read_words, Memory, Unreadable};
use crate::units::human_bytes;
use core::fmt;
use mem_trace_format::{
    shard_of, Block, CallTree, Freed, FreedHistory, FreedIndex, FreedRecord, Header, IndexGeometry,
    Shard, SlotArray, StackStore, ThreadRecord, ThreadTable, LARGE_SHARD, MAGIC, MAX_STACK_ID,
    MAX_THREAD_INDEX, REGION_SHIFT, SHARD_COUNT, SLOT_MOVING, STACK_CHUNK_BITS, STACK_IN_TREE,
    THREAD_CHUNK_BITS, THREAD_EXITED, TREE_CHUNK_BITS, VERSION,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

mod events;
pub mod freed_index;
mod history;
mod near;
mod relation;
pub mod tags;
#[cfg(test)]
mod tests;

pub use crate::units::HumanBytes;
pub use events::{Event, EventKind, History};
pub use relation::{Match, Relation, DEFAULT_MAX_GAP};

/// The most slots a reader accepts in one array (docs/LAYOUT.md: "reject absurd values").
const MAX_CAPACITY: u64 = 1 << 32;
/// The most frames a reader accepts in one stack record.
const MAX_FRAMES: u64 = 4096;
/// Words read at once from a long array (a slot array: 64Ki slots; the history ring), 1.5 MiB.
const SLOT_READ_WORDS: usize = 3 << 16;

/// `total` words at `addr`, read [`SLOT_READ_WORDS`] at a time, so that the memory allocated
/// grows only with what was really read.
fn read_words_in_pieces(
    mem: &(impl Memory + ?Sized),
    addr: u64,
    total: usize,
) -> Result<Vec<u64>, Unreadable> {
    let mut words = Vec::new();
    while words.len() < total {
        let n = (total - words.len()).min(SLOT_READ_WORDS);
        words.extend(read_words(mem, addr + 8 * words.len() as u64, n)?);
    }
    Ok(words)
}

/// `Ok` when the target has `len` bytes of memory at `addr`; else a `Corrupt` error naming
/// the claim (`what`, e.g. "shard 3's slot array claims 4294967296 slots") and what is
/// really there. Every count or capacity read from the target passes this before it sizes a
/// loop or a read, so that a scribbled table costs one line rather than a read of every page
/// it claims.
pub(crate) fn check_extent(
    mem: &(impl Memory + ?Sized),
    addr: u64,
    len: u64,
    what: impl FnOnce() -> String,
) -> Result<(), Error> {
    mem.extent_holds(addr, len).map_err(|extent| {
        if extent == 0 {
            // A pointer to nothing: what a read there says (and, for a core, why).
            return Error::Unreadable(Unreadable {
                addr,
                len: len.min(8) as usize,
            });
        }
        Error::Corrupt(format!(
            "{} ({}) at {addr:#x}, where the target's memory ends after {}",
            what(),
            human_bytes(len),
            human_bytes(extent)
        ))
    })
}

/// Ranges of the target a reader has claimed for tables, none overlapping another: the chunks
/// of a directory, the counter caches of threads. A scribbled directory that named one chunk
/// many times, or chunks that overlap, would have the same memory read again and again, so
/// that a reader's time no longer followed what the target holds.
#[derive(Default)]
pub(crate) struct Disjoint {
    /// `(start, end)`, sorted.
    taken: Vec<(u64, u64)>,
}

impl Disjoint {
    /// Claims `len` bytes at `addr` for `what`; an error when they overlap an earlier claim.
    pub(crate) fn claim(
        &mut self,
        addr: u64,
        len: u64,
        what: impl FnOnce() -> String,
    ) -> Result<(), Error> {
        let end = addr.saturating_add(len);
        let i = self.taken.partition_point(|&(start, _)| start < addr);
        let before = i.checked_sub(1).map(|i| self.taken[i]);
        let after = self.taken.get(i).copied();
        let overlaps = before.is_some_and(|(_, e)| e > addr) || after.is_some_and(|(s, _)| s < end);
        if overlaps {
            return Err(Error::Corrupt(format!(
                "{} at {addr:#x} overlaps another table's memory",
                what()
            )));
        }
        self.taken.insert(i, (addr, end));
        Ok(())
    }
}

/// How many times `find_containing` reads a changing slot again before it gives up.
const FIND_TRIES: u32 = 8;

/// Why the tables could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum Error {
    /// The header does not start with `MEMTRACE`.
    BadMagic {
        /// Where the header was looked for.
        addr: u64,
        /// The eight bytes found there instead.
        found: [u8; 8],
    },
    /// A layout version this reader does not know.
    Version {
        /// The version the process writes.
        found: u32,
    },
    /// A value the contract rules out.
    Corrupt(String),
    /// The slot of the block containing `addr` changed under every read: a running process
    /// rewrote it each time (or, in a core, it names a stack that was never published).
    Changing {
        /// The address asked about.
        addr: u64,
        /// The reads made.
        tries: u32,
    },
    /// Memory that could not be read.
    Unreadable(Unreadable),
}

/// Bytes as a byte-string literal, `b'MEMTRACE'`: printable ASCII as it is, the rest
/// escaped, so that a corrupt header's bytes can be told apart in one line.
struct ByteString<'a>(&'a [u8]);

impl fmt::Display for ByteString<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("b'")?;
        for &b in self.0 {
            match b {
                b'\\' | b'\'' => write!(f, "\\{}", b as char)?,
                0x20..=0x7e => write!(f, "{}", b as char)?,
                _ => write!(f, "\\x{b:02x}")?,
            }
        }
        f.write_str("'")
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadMagic { addr, found } => {
                write!(
                    f,
                    "no mem-trace header at {addr:#x} (magic {}, expected {})",
                    ByteString(found),
                    ByteString(&MAGIC)
                )
            }
            Error::Version { found } => write!(
                f,
                "the process writes layout version {found}, this reader knows version {VERSION}: use the mem-trace build that traced it"
            ),
            Error::Corrupt(what) => write!(f, "corrupt mem-trace tables: {what}"),
            Error::Changing { addr, tries } => write!(
                f,
                "the block containing {addr:#x} was being changed by the process during each of {tries} reads: ask again"
            ),
            Error::Unreadable(u) => write!(f, "{u}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<Unreadable> for Error {
    fn from(u: Unreadable) -> Self {
        Error::Unreadable(u)
    }
}

/// Live blocks and bytes, distinct stacks, threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Live blocks.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Distinct stacks interned.
    pub stacks: u64,
    /// Threads that ever allocated.
    pub threads: u64,
    /// The shards' live counts summed past 2^64 or one was below zero, which no consistent
    /// tables hold (see [`SUM_LINE`]); a sum past 2^64 is clamped to `u64::MAX`.
    pub wrapped: bool,
}

/// The line an answer adds when counts it sums went past 2^64 or below zero.
pub const SUM_LINE: &str = "inconsistent tables: live counts sum past 2^64 or below zero";

/// Sums `counts`: the sum clamped to `u64::MAX`, and whether it went past 2^64 or a count
/// was below zero (2^63 or more: a wrapped count; no process holds that much).
pub fn checked_sum(counts: impl IntoIterator<Item = u64>) -> (u64, bool) {
    let (mut sum, mut negative) = (0u128, false);
    for n in counts {
        sum += u128::from(n);
        negative |= (n as i64) < 0;
    }
    match u64::try_from(sum) {
        Ok(sum) if !negative => (sum, false),
        _ => (u64::try_from(sum).unwrap_or(u64::MAX), true),
    }
}

/// A thread's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thread {
    /// Kernel thread id.
    pub tid: u32,
    /// The thread has exited.
    pub exited: bool,
    /// Its name when it first allocated.
    pub name: String,
    /// Profiler builds: live bytes of the blocks it allocated (0 when a racing free makes the
    /// difference negative for an instant).
    pub live_bytes: u64,
    /// Profiler builds: the highest `live_bytes` since start or the last reset.
    pub peak_bytes: u64,
    /// Profiler builds: bytes it ever allocated.
    pub allocated_bytes: u64,
    /// Profiler builds: the address of its cache of counter deltas (0: none).
    pub counters: u64,
}

/// A thread's record as read; `None` while it is not written yet (tid 0).
fn thread_from(r: ThreadRecord) -> Option<Thread> {
    let live_bytes = r.live_bytes();
    let tid = r.tid.into_inner();
    if tid == 0 {
        return None;
    }
    let len = r.name.iter().position(|&c| c == 0).unwrap_or(r.name.len());
    Some(Thread {
        tid,
        exited: r.flags.into_inner() & THREAD_EXITED != 0,
        name: String::from_utf8_lossy(&r.name[..len]).into_owned(),
        live_bytes,
        peak_bytes: r.peak_bytes.into_inner(),
        allocated_bytes: r.allocated_bytes.into_inner(),
        counters: r.counters.into_inner() as u64,
    })
}

/// One search of `find_containing`: a block (or none) read consistently, or a slot that
/// changed while it was read.
enum Found {
    Stable(Option<Block>),
    Changing,
}

/// The tables of one process, read through `mem`.
pub struct Tables<'m, M: Memory + ?Sized> {
    mem: &'m M,
    header: Header,
    /// The target's mappings, for the tagged blocks' scans; `None` when not given, and then
    /// no tagged block is enumerated and the backward scan ends where reads fail.
    regions: Option<Vec<tags::Region>>,
    /// Directory chunks read whole (see [`Chunks`]).
    chunks: Chunks,
}

/// The chunks of the stack directory and of the call tree, read whole the first time one of
/// their entries is needed and kept for the reader's life. A stack is a record and tens of
/// call-tree nodes, and a profile reads every stack: entry by entry, that was four reads a
/// frame from another process (`pprof` of a stopped compiler, 34k stacks: 35 s where `top`
/// took 0.4 s). A chunk is at most 2^16 entries (1 MiB of nodes), read only up to the ids
/// handed out, so what is kept is bounded by what the tables really hold.
#[derive(Default)]
struct Chunks {
    /// Stack directory chunk → its slots (record addresses).
    stacks: RefCell<HashMap<u32, Vec<u64>>>,
    /// Call-tree chunk → its nodes (pc, parent), indexed by chunk (empty: not read): looked
    /// up once a frame, millions of times for a profile.
    tree: RefCell<Vec<Vec<(u64, u32)>>>,
    /// The call tree's node count when last read: read again only for a node past it.
    tree_count: core::cell::Cell<u64>,
    /// Pages of the stack records' memory, by address / [`RECORD_WINDOW`]: records are handed
    /// out one after the other, so a profile's tens of thousands of them are a few hundred
    /// reads rather than one each (a compiler's 62k records: 625 pages; the reads one by one
    /// were a quarter of `pprof`'s time).
    records: RefCell<HashMap<u64, Vec<u64>>>,
}

/// Record pages kept before the cache starts again: 16 MiB.
const RECORD_WINDOWS_KEPT: usize = 4096;
/// Bytes of stack records read at once: a page, which a mapping never ends inside (64 KiB
/// windows often crossed one, and read more than the records' worth besides).
const RECORD_WINDOW: u64 = 4096;

impl Chunks {
    /// The two words at `record`, from its window, read whole the first time; `None` when the
    /// window cannot be read whole (the end of a mapping), or the words were not written yet
    /// when it was read (a record is published after its words are written).
    fn record_words(&self, mem: &(impl Memory + ?Sized), record: u64) -> Option<[u64; 2]> {
        let (window, at) = (record / RECORD_WINDOW, (record % RECORD_WINDOW) as usize);
        if at % 8 != 0 || at + 16 > RECORD_WINDOW as usize {
            return None;
        }
        let mut windows = self.records.borrow_mut();
        if !windows.contains_key(&window) {
            // Scribbled slots could name a page each: what is kept stays bounded.
            if windows.len() >= RECORD_WINDOWS_KEPT {
                windows.clear();
            }
            let words = read_words(mem, window * RECORD_WINDOW, RECORD_WINDOW as usize / 8).ok()?;
            windows.insert(window, words);
        }
        let words = &windows[&window][at / 8..at / 8 + 2];
        (words[0] != 0).then(|| [words[0], words[1]])
    }
}

impl<'m, M: Memory + ?Sized> Tables<'m, M> {
    /// Reads and checks the header at `addr` (the address of `MEM_TRACE_HEADER`).
    pub fn open(mem: &'m M, addr: u64) -> Result<Self, Error> {
        // The magic and version first: another version's header may be shorter than ours,
        // and its reader's error must name the version, not a short read past it.
        let mut head = [0u8; 12];
        mem.read(addr, &mut head)?;
        if head[..8] != MAGIC {
            let mut found = [0u8; 8];
            found.copy_from_slice(&head[..8]);
            return Err(Error::BadMagic { addr, found });
        }
        let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if version != VERSION {
            return Err(Error::Version { found: version });
        }
        let header: Header = read_plain(mem, addr)?;
        if header.magic != MAGIC || header.version != VERSION {
            return Err(Error::Corrupt(
                "the header changed while it was read".into(),
            ));
        }
        let sizes = (
            header.header_size as usize,
            header.slot_size as usize,
            header.shard_size as usize,
            header.shard_count as usize,
            header.region_shift,
        );
        let expected = (
            core::mem::size_of::<Header>(),
            core::mem::size_of::<mem_trace_format::Slot>(),
            core::mem::size_of::<Shard>(),
            SHARD_COUNT,
            REGION_SHIFT,
        );
        if sizes != expected {
            return Err(Error::Corrupt(format!(
                "header sizes {sizes:?}, expected {expected:?}"
            )));
        }
        let key = header.tag_key.load(core::sync::atomic::Ordering::Relaxed);
        if key != 0 && !tags::key_is_valid(key) {
            // A key the tracer never makes: its check words would look like pointers or
            // small integers, the values a heap holds most.
            return Err(Error::Corrupt(format!(
                "tag_key {key:#x} is no key the tracer makes (its top 16 bits are all {})",
                if key >> 48 == 0 { "zero" } else { "one" }
            )));
        }
        Ok(Tables {
            mem,
            header,
            regions: None,
            chunks: Chunks::default(),
        })
    }

    /// The same tables, told the target's mappings: the backward scan for a tagged block then
    /// stops at the start of the mapping holding the address, and [`Tables::blocks`] finds the
    /// tagged blocks of its heap mappings (docs/LAYOUT.md "Block tags").
    pub fn with_regions(mut self, regions: Vec<tags::Region>) -> Self {
        self.regions = Some(regions);
        self
    }

    /// The mappings given with [`Tables::with_regions`].
    pub fn regions(&self) -> Option<&[tags::Region]> {
        self.regions.as_deref()
    }

    /// The key of the process's block tags; 0 when every live block is in the table.
    pub fn tag_key(&self) -> u64 {
        self.header
            .tag_key
            .load(core::sync::atomic::Ordering::Relaxed)
    }

    /// How the process tags its blocks: the key and whether tags carry sequence numbers.
    pub fn tag_format(&self) -> tags::TagFormat {
        let flags = self
            .header
            .flags
            .load(core::sync::atomic::Ordering::Relaxed);
        tags::TagFormat::new(self.tag_key(), flags)
    }

    /// The header as read.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// `MEM_TRACE_SAMPLE` of the process: the mean bytes between its sampled allocations, 0
    /// when it records every block.
    pub fn sample_mean(&self) -> u64 {
        self.header
            .sample_mean
            .load(core::sync::atomic::Ordering::Relaxed)
    }

    /// What a live block counts for: itself, or under sampling the bytes and blocks its
    /// sample stands for (`sample::weight`).
    pub fn counted(&self, block: &Block) -> (u64, u64) {
        crate::sample::weight(block.addr, block.size, self.sample_mean())
    }

    /// The memory the tables are read from.
    pub fn memory(&self) -> &'m M {
        self.mem
    }

    fn shard(&self, index: usize) -> Result<Shard, Error> {
        let at = self.header.shards as u64 + (index * core::mem::size_of::<Shard>()) as u64;
        Ok(read_plain(self.mem, at)?)
    }

    /// Live blocks and bytes (summed over the shards' counters, plus the tagged blocks of the
    /// heap mappings given with [`Tables::with_regions`]), stacks and threads.
    pub fn totals(&self) -> Result<Totals, Error> {
        // The shard array in one read rather than one per shard.
        let per_shard = core::mem::size_of::<Shard>() / 8;
        let words = read_words(self.mem, self.header.shards as u64, SHARD_COUNT * per_shard)?;
        let (live, bytes) = (
            core::mem::offset_of!(Shard, live) / 8,
            core::mem::offset_of!(Shard, live_bytes) / 8,
        );
        let shards = || words.chunks_exact(per_shard);
        let (blocks, blocks_wrapped) = checked_sum(shards().map(|s| s[live]));
        let (bytes, bytes_wrapped) = checked_sum(shards().map(|s| s[bytes]));
        let mut t = Totals {
            blocks,
            bytes,
            wrapped: blocks_wrapped || bytes_wrapped,
            ..Totals::default()
        };
        // Tagged blocks are in no shard's count (docs/LAYOUT.md "Block tags").
        let (mut blocks, mut bytes) = (0u64, 0u64);
        self.for_each_tagged(&mut |b| {
            blocks += 1;
            bytes += b.size;
        });
        t.blocks = t.blocks.saturating_add(blocks);
        t.bytes = t.bytes.saturating_add(bytes);
        t.stacks = self.stack_count()?;
        t.threads = self.thread_count()?;
        Ok(t)
    }

    /// The slot array of shard `index`: where its first slot is, and its slots' words, three
    /// per slot; `None` while the shard has never held a block.
    fn slots(&self, index: usize) -> Result<Option<(u64, Vec<u64>)>, Error> {
        let array = self.shard(index)?.array.into_inner() as u64;
        if array == 0 {
            return Ok(None);
        }
        let head: SlotArray = read_plain(self.mem, array)?;
        if head.capacity == 0 || head.capacity > MAX_CAPACITY {
            return Err(Error::Corrupt(format!(
                "shard {index} has a slot array of {} slots",
                head.capacity
            )));
        }
        let first = array + core::mem::size_of::<SlotArray>() as u64;
        let slot = core::mem::size_of::<mem_trace_format::Slot>() as u64;
        check_extent(self.mem, first, head.capacity * slot, || {
            format!("shard {index}'s slot array claims {} slots", head.capacity)
        })?;
        // In pieces: a corrupt capacity then costs what the memory really holds before the
        // first unreadable piece, not an allocation of 2^32 slots up front.
        let words = read_words_in_pieces(self.mem, first, head.capacity as usize * 3)?;
        Ok(Some((first, words)))
    }

    /// Every block in shard `index`, in slot order.
    pub fn shard_blocks(&self, index: usize) -> Result<Vec<Block>, Error> {
        let Some((_, words)) = self.slots(index)? else {
            return Ok(Vec::new());
        };
        let mut blocks: Vec<Block> = words
            .chunks_exact(3)
            .filter(|s| s[0] > SLOT_MOVING)
            .map(|s| Block::unpack(s[0], s[1], s[2]))
            .collect();
        // A block caught in the middle of a move appears twice: once is enough.
        blocks.sort_by_key(|b| b.addr);
        blocks.dedup_by_key(|b| b.addr);
        Ok(blocks)
    }

    /// The live block that contains `addr`, reading only the shards it can be in: its region's,
    /// the region before's, and the large-block shard; then, if none holds it, the tagged
    /// block that does (docs/LAYOUT.md "Block tags"; found only when the mappings were given,
    /// [`Tables::with_regions`], or its tag is within reach of the memory that can be read).
    ///
    /// A running process may rewrite a slot while `process_vm_readv` copies its three words
    /// (they are not copied at once), so the copy could join one block's address to another's
    /// size or stack. The slot found is read again, and the block is accepted only when both
    /// reads agree and its stack id is published (docs/LAYOUT.md "Publication": an id is
    /// stored only after its stack); otherwise the search starts over, up to `FIND_TRIES`
    /// times, then fails with [`Error::Changing`] rather than show a torn block.
    pub fn find_containing(&self, addr: u64) -> Result<Option<Block>, Error> {
        for _ in 0..FIND_TRIES {
            match self.find_containing_once(addr)? {
                Found::Stable(None) => return Ok(self.tagged_containing(addr)),
                Found::Stable(block) => return Ok(block),
                Found::Changing => continue,
            }
        }
        Err(Error::Changing {
            addr,
            tries: FIND_TRIES,
        })
    }

    fn find_containing_once(&self, addr: u64) -> Result<Found, Error> {
        let region = addr >> REGION_SHIFT;
        let mut shards = vec![shard_of(region), LARGE_SHARD];
        if region > 0 {
            shards.push(shard_of(region - 1));
        }
        shards.sort_unstable();
        shards.dedup();
        for i in shards {
            let Some((first, words)) = self.slots(i)? else {
                continue;
            };
            let hit = words.chunks_exact(3).enumerate().find(|(_, s)| {
                s[0] > SLOT_MOVING && Block::unpack(s[0], s[1], s[2]).contains(addr)
            });
            if let Some((slot, seen)) = hit {
                let size = core::mem::size_of::<mem_trace_format::Slot>() as u64;
                let again = read_words(self.mem, first + size * slot as u64, 3)?;
                let block = Block::unpack(seen[0], seen[1], seen[2]);
                let published = block.stack == 0 || self.stack_record(block.stack)?.is_some();
                return Ok(if again == seen && published {
                    Found::Stable(Some(block))
                } else {
                    Found::Changing
                });
            }
        }
        Ok(Found::Stable(None))
    }
    /// The address of entry `index` in a chunked directory at `dir` (the stack store's and the
    /// thread table's: chunk `index >> bits` holds entries of `size` bytes); `None` while its
    /// chunk is not published.
    fn directory_entry(
        &self,
        dir: u64,
        index: u32,
        bits: u32,
        size: u64,
    ) -> Result<Option<u64>, Error> {
        let chunk = read_plain::<u64>(self.mem, dir + 8 * u64::from(index >> bits))?;
        Ok((chunk != 0).then(|| chunk + size * u64::from(index & ((1 << bits) - 1))))
    }

    /// Stack ids handed out.
    pub fn stack_count(&self) -> Result<u64, Error> {
        let n = read_plain::<u64>(self.mem, self.header.stacks as u64)?;
        if n > MAX_STACK_ID {
            return Err(Error::Corrupt(format!("{n} stacks")));
        }
        Ok(n)
    }

    /// The address of stack `id`'s record; `None` for id 0 or an id not published yet.
    fn stack_record(&self, id: u32) -> Result<Option<u64>, Error> {
        if id == 0 {
            return Ok(None);
        }
        let dir = self.header.stacks as u64 + core::mem::offset_of!(StackStore, dir) as u64;
        let cached = |id: u32| {
            let chunks = self.chunks.stacks.borrow();
            let slots = chunks.get(&(id >> STACK_CHUNK_BITS))?;
            slots
                .get((id & ((1 << STACK_CHUNK_BITS) - 1)) as usize)
                .copied()
                .filter(|&r| r != 0)
        };
        if let Some(record) = cached(id) {
            return Ok(Some(record));
        }
        // Not read yet, or not published when its chunk was read: the chunk again, up to the
        // ids handed out now.
        let count = self.stack_count()?;
        if u64::from(id) > count {
            return Ok(None);
        }
        let Some(slots) = self.read_chunk(dir, id, STACK_CHUNK_BITS, count, 1)? else {
            return Ok(None);
        };
        self.chunks
            .stacks
            .borrow_mut()
            .insert(id >> STACK_CHUNK_BITS, slots);
        Ok(cached(id))
    }

    /// The entries of the directory chunk holding `index` (`bits` per chunk, `words` words an
    /// entry), from the chunk's first entry up to index `count` (the last handed out), in one
    /// read; `None` when the chunk is not there.
    fn read_chunk(
        &self,
        dir: u64,
        index: u32,
        bits: u32,
        count: u64,
        words: usize,
    ) -> Result<Option<Vec<u64>>, Error> {
        let chunk = index >> bits;
        let base = read_plain::<u64>(self.mem, dir + 8 * u64::from(chunk))?;
        if base == 0 {
            return Ok(None);
        }
        let first = u64::from(chunk) << bits;
        let len = (count + 1).saturating_sub(first).min(1 << bits) as usize;
        Ok(Some(read_words(self.mem, base, len * words)?))
    }

    /// The return addresses of stack `id`, innermost first; `None` for id 0 or an id not
    /// published yet.
    pub fn stack(&self, id: u32) -> Result<Option<Vec<u64>>, Error> {
        let Some(record) = self.stack_record(id)? else {
            return Ok(None);
        };
        // The count and, for a stack in the call tree, its node: one read where the record
        // has both words.
        let (n, node) = match self.chunks.record_words(self.mem, record) {
            Some(w) => (w[0], Some(w[1])),
            None => match read_words(self.mem, record, 2) {
                Ok(w) => (w[0], Some(w[1])),
                Err(_) => (read_plain::<u64>(self.mem, record)?, None),
            },
        };
        if n & STACK_IN_TREE != 0 {
            let node = match node {
                Some(node) => node,
                None => read_plain::<u64>(self.mem, record + 8)?,
            };
            return self.tree_stack(id, n & !STACK_IN_TREE, node).map(Some);
        }
        if n > MAX_FRAMES {
            return Err(Error::Corrupt(format!("stack {id} has {n} frames")));
        }
        Ok(Some(read_words(self.mem, record + 8, n as usize)?))
    }

    /// The `n` frames of stack `id` named by the call-tree node in its record's second word
    /// (docs/LAYOUT.md "Call tree"): the node's pc, its parent's, ... Each parent has a
    /// smaller id, so the walk ends; a path shorter than `n` is corrupt.
    fn tree_stack(&self, id: u32, n: u64, first: u64) -> Result<Vec<u64>, Error> {
        if n > MAX_FRAMES {
            return Err(Error::Corrupt(format!("stack {id} has {n} frames")));
        }
        if self.header.tree.is_null() {
            return Err(Error::Corrupt(format!(
                "stack {id} names the call tree, and the header has none"
            )));
        }
        let tree = self.header.tree as u64;
        let mut count = self.chunks.tree_count.get();
        if first > count {
            count = read_plain::<u64>(self.mem, tree)?;
            self.chunks.tree_count.set(count);
        }
        let dir = tree + core::mem::offset_of!(CallTree, dir) as u64;
        let mut node = first;
        let mut frames = Vec::with_capacity(n as usize);
        while (frames.len() as u64) < n {
            let bad =
                |why: &str| Error::Corrupt(format!("stack {id}: call-tree node {node} {why}"));
            if node == 0 || node > count || node > u64::from(u32::MAX) {
                return Err(bad(&format!("is not one of the {count} handed out")));
            }
            let Some((pc, parent)) = self.tree_node(dir, node as u32, count)? else {
                return Err(bad("is in no chunk"));
            };
            frames.push(pc);
            if (frames.len() as u64) < n && u64::from(parent) >= node {
                return Err(bad(&format!("has parent {parent}, not a smaller id")));
            }
            node = u64::from(parent);
        }
        Ok(frames)
    }

    /// Call-tree node `node` (pc, parent), from its chunk read whole (see [`Chunks`]); `None`
    /// when its chunk is not there.
    fn tree_node(&self, dir: u64, node: u32, count: u64) -> Result<Option<(u64, u32)>, Error> {
        let (chunk, i) = (
            node >> TREE_CHUNK_BITS,
            (node & ((1 << TREE_CHUNK_BITS) - 1)) as usize,
        );
        if let Some(&found) = self
            .chunks
            .tree
            .borrow()
            .get(chunk as usize)
            .and_then(|c| c.get(i))
        {
            // A node not yet written when its chunk was read is read again.
            if found != (0, 0) {
                return Ok(Some(found));
            }
        }
        let Some(words) = self.read_chunk(dir, node, TREE_CHUNK_BITS, count, 2)? else {
            return Ok(None);
        };
        // The parent is the low half of a node's second word (the writer's own `stack` field
        // is the high half).
        let nodes: Vec<(u64, u32)> = words.chunks_exact(2).map(|w| (w[0], w[1] as u32)).collect();
        let found = nodes.get(i).copied();
        let mut tree = self.chunks.tree.borrow_mut();
        if tree.len() <= chunk as usize {
            tree.resize_with(chunk as usize + 1, Vec::new);
        }
        tree[chunk as usize] = nodes;
        Ok(found)
    }

    /// Thread indexes handed out.
    pub fn thread_count(&self) -> Result<u64, Error> {
        let n = read_plain::<u64>(self.mem, self.header.threads as u64)?;
        if n > MAX_THREAD_INDEX {
            return Err(Error::Corrupt(format!("{n} threads")));
        }
        Ok(n)
    }

    /// Thread `index`'s record; `None` for index 0 or one not written yet.
    pub fn thread(&self, index: u32) -> Result<Option<Thread>, Error> {
        if index == 0 || u64::from(index) > self.thread_count()? {
            return Ok(None);
        }
        let dir = self.header.threads as u64 + core::mem::offset_of!(ThreadTable, dir) as u64;
        let size = core::mem::size_of::<ThreadRecord>() as u64;
        let Some(at) = self.directory_entry(dir, index, THREAD_CHUNK_BITS, size)? else {
            return Ok(None);
        };
        let r: ThreadRecord = read_plain(self.mem, at)?;
        Ok(thread_from(r))
    }

    /// Every thread's record, by index, read a directory chunk at a time: one read per chunk
    /// the table has published, however many threads its count claims. A chunk must be
    /// memory the target has, and no two chunks may overlap ([`Disjoint`]).
    pub fn thread_records(&self) -> Result<Vec<(u32, Thread)>, Error> {
        let count = self.thread_count()?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let size = core::mem::size_of::<ThreadRecord>();
        let per_chunk = 1u64 << THREAD_CHUNK_BITS;
        let chunks = (count >> THREAD_CHUNK_BITS) as usize + 1;
        let dir = self.header.threads as u64 + core::mem::offset_of!(ThreadTable, dir) as u64;
        let pointers = read_words(self.mem, dir, chunks)?;
        let mut taken = Disjoint::default();
        let mut out = Vec::new();
        for (k, &chunk) in pointers.iter().enumerate() {
            if chunk == 0 {
                continue;
            }
            let first = k as u64 * per_chunk;
            // Index 0 is never handed out; the last chunk holds up to `count`.
            let n = per_chunk.min(count + 1 - first);
            let what = || format!("chunk {k} of the thread table, which claims {count} threads");
            check_extent(self.mem, chunk, n * size as u64, what)?;
            taken.claim(chunk, n * size as u64, what)?;
            let mut bytes = vec![0u8; n as usize * size];
            self.mem.read(chunk, &mut bytes)?;
            for (i, record) in bytes.chunks_exact(size).enumerate() {
                let index = first + i as u64;
                if index == 0 {
                    continue;
                }
                // SAFETY: `ThreadRecord` is `Plain` (any bytes are a valid value) and
                // `record` is exactly its size; the read is unaligned.
                let r =
                    unsafe { core::ptr::read_unaligned(record.as_ptr().cast::<ThreadRecord>()) };
                if let Some(t) = thread_from(r) {
                    out.push((index as u32, t));
                }
            }
        }
        Ok(out)
    }

    /// The freed-block history's header.
    pub fn history(&self) -> Result<FreedHistory, Error> {
        Ok(read_plain(self.mem, self.header.freed as u64)?)
    }

    /// The remembered frees of blocks that contained `addr`, newest first: through the
    /// history's address index when it has one, else by a pass over the ring.
    pub fn frees_containing(&self, addr: u64) -> Result<Vec<Freed>, Error> {
        let h = self.history()?;
        let cap = h.capacity.into_inner();
        let ring = h.records.into_inner() as u64;
        if cap == 0 || ring == 0 {
            return Ok(Vec::new());
        }
        if cap > MAX_CAPACITY {
            return Err(Error::Corrupt(format!("a history of {cap} records")));
        }
        let written = h.written.into_inner();
        let index = h.index.into_inner() as u64;
        let mut found: Vec<Freed> = if index != 0 {
            self.frees_by_index(index, ring, cap, written, addr)?
        } else {
            let n = written.min(cap) as usize;
            let per = core::mem::size_of::<FreedRecord>() / 8;
            check_extent(self.mem, ring, (n * per * 8) as u64, || {
                format!("the freed-block history claims {n} records")
            })?;
            // A piece at a time, keeping only the hits: a reader's memory follows what it
            // prints, not the ring's size.
            let mut hits = Vec::new();
            let piece = SLOT_READ_WORDS / per;
            let mut at = 0;
            while at < n {
                let k = piece.min(n - at);
                let words = read_words(self.mem, ring + (at * per * 8) as u64, k * per)?;
                hits.extend(
                    words
                        .chunks_exact(per)
                        .filter(|r| r[0] != 0)
                        .map(|r| Freed::unpack(r.try_into().expect("five words")))
                        .filter(|f| f.block.contains(addr)),
                );
                at += k;
            }
            hits
        };
        // Threads write the ring in claimed runs: order by the free's sequence number.
        found.sort_by_key(|f| core::cmp::Reverse(f.free_seq));
        Ok(found)
    }

    /// [`Tables::frees_containing`] through the index whose header is at `at`.
    fn frees_by_index(
        &self,
        at: u64,
        ring: u64,
        capacity: u64,
        written: u64,
        addr: u64,
    ) -> Result<Vec<Freed>, Error> {
        let h: FreedIndex = read_plain(self.mem, at)?;
        let geometry = IndexGeometry {
            granule_shift: h.granule_shift,
            level_shift: h.level_shift,
            levels: h.levels,
            head_bits: h.head_bits.into_inner(),
            multiplier: h.multiplier,
        };
        let (heads, links) = (h.heads.into_inner() as u64, h.links.into_inner() as u64);
        if !geometry.valid() || heads == 0 || links == 0 {
            return Err(Error::Corrupt(format!(
                "the freed-block index at {at:#x}: {geometry:?}, heads {heads:#x}, links {links:#x}"
            )));
        }
        let buckets = 1u64 << geometry.head_bits;
        check_extent(self.mem, heads, 8 * buckets, || {
            format!("the freed-block index claims {buckets} heads")
        })?;
        check_extent(self.mem, links, 8 * capacity, || {
            format!("the freed-block index claims {capacity} links")
        })?;
        check_extent(
            self.mem,
            ring,
            capacity * core::mem::size_of::<FreedRecord>() as u64,
            || format!("the freed-block history claims {capacity} records"),
        )?;
        let index = freed_index::Index {
            geometry,
            capacity,
            written,
            disorder: h.disorder.into_inner(),
        };
        let mut source = IndexReads {
            mem: self.mem,
            history: self.header.freed as u64,
            heads,
            links,
            ring,
            capacity,
            links_read: HashMap::new(),
            records_read: HashMap::new(),
        };
        // A running process may show a record twice (rewritten between two reads): once.
        let mut hits = BTreeMap::new();
        freed_index::walk(
            &mut source,
            &index,
            freed_index::Wanted::Containing(addr),
            |slot, words| {
                hits.insert(slot, words);
            },
        )
        .map_err(|e| match e {
            freed_index::WalkError::Source(u) => Error::Unreadable(u),
            freed_index::WalkError::Broken(b) => Error::Corrupt(b.to_string()),
        })?;
        Ok(hits.values().map(Freed::unpack).collect())
    }
}

/// Records (and links) read at once by an index walk, 10 KiB of records: chains often visit
/// neighbours (a program frees nearby blocks one after the other), and the window of the ring
/// a walk may end with is read in order.
const INDEX_CHUNK: u64 = 256;
/// Chunks kept per array before the cache starts again, 40 MiB of records.
const INDEX_CHUNKS_KEPT: usize = 4096;

/// The index walk's reads from another process or a core, by chunks of [`INDEX_CHUNK`].
struct IndexReads<'a, M: Memory + ?Sized> {
    mem: &'a M,
    history: u64,
    heads: u64,
    links: u64,
    ring: u64,
    capacity: u64,
    links_read: HashMap<u64, Vec<u64>>,
    records_read: HashMap<u64, Vec<u64>>,
}

impl<M: Memory + ?Sized> IndexReads<'_, M> {
    /// The `per` words of entry `slot` of an array of `per`-word entries at `base`.
    fn entry<'c>(
        mem: &M,
        cache: &'c mut HashMap<u64, Vec<u64>>,
        base: u64,
        capacity: u64,
        per: u64,
        slot: u64,
    ) -> Result<&'c [u64], Unreadable> {
        let chunk = slot / INDEX_CHUNK;
        if !cache.contains_key(&chunk) {
            if cache.len() >= INDEX_CHUNKS_KEPT {
                cache.clear();
            }
            let first = chunk * INDEX_CHUNK;
            let n = INDEX_CHUNK.min(capacity - first);
            let words = read_words(mem, base + 8 * per * first, (n * per) as usize)?;
            cache.insert(chunk, words);
        }
        let at = ((slot % INDEX_CHUNK) * per) as usize;
        Ok(&cache[&chunk][at..at + per as usize])
    }
}

impl<M: Memory + ?Sized> freed_index::Source for IndexReads<'_, M> {
    type Error = Unreadable;

    fn head(&mut self, bucket: u64) -> Result<u64, Unreadable> {
        read_plain(self.mem, self.heads + 8 * bucket)
    }

    fn link(&mut self, slot: u64) -> Result<u64, Unreadable> {
        let words = Self::entry(
            self.mem,
            &mut self.links_read,
            self.links,
            self.capacity,
            1,
            slot,
        )?;
        Ok(words[0])
    }

    fn record(&mut self, slot: u64) -> Result<[u64; 5], Unreadable> {
        let per = (core::mem::size_of::<FreedRecord>() / 8) as u64;
        let words = Self::entry(
            self.mem,
            &mut self.records_read,
            self.ring,
            self.capacity,
            per,
            slot,
        )?;
        Ok(words.try_into().expect("five words"))
    }

    fn written(&mut self) -> Result<u64, Unreadable> {
        read_plain(
            self.mem,
            self.history + core::mem::offset_of!(FreedHistory, written) as u64,
        )
    }
}
