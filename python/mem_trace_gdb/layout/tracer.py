"""The reader: one process's mem-trace tables, read lazily through a memory reader."""

from __future__ import annotations

import bisect
import struct
import sys
from typing import Dict, Iterable, Iterator, List, Optional, Protocol, Sequence, Tuple

from .contract import (
    COUNTER_CACHE,
    COUNTER_CHUNK_BITS,
    COUNTER_CHUNKS,
    COUNTER_SIZE,
    COUNTER_WORDS,
    DIRECTORY_HEADER_STRUCT,
    FLAG_TAG_SEQ,
    FIELD_BITS,
    FIELD_MASK,
    FREED_INDEX_SIZE,
    FREED_INDEX_STRUCT,
    FREED_RECORD_SIZE,
    FREED_RECORD_WORDS,
    HEADER_SIZE,
    HEADER_STRUCT,
    HISTORY_HEADER_SIZE,
    HISTORY_STRUCT,
    INDEX_LAP_MASK,
    INDEX_MAX_LEVELS,
    INDEX_NEXT_BITS,
    LARGE_SHARD,
    LAYOUT_VERSION,
    MAGIC,
    MASK64,
    PROFILE_HEADER,
    PROFILE_STRUCT,
    REGION_SHIFT,
    REGION_SIZE,
    SHARD_COUNT,
    SHARD_SIZE,
    SHARD_STRUCT,
    SLOT_ARRAY_HEADER,
    SLOT_SIZE,
    SLOT_TOMBSTONE,
    CALL_TREE_HEADER,
    STACK_CHUNK_BITS,
    STACK_CHUNKS,
    STACK_IN_TREE,
    STACK_STORE_HEADER,
    TREE_CHUNK_BITS,
    TREE_NODE_SIZE,
    THREAD_CHUNK_BITS,
    THREAD_CHUNKS,
    THREAD_EXITED,
    THREAD_RECORD_SIZE,
    THREAD_STRUCT,
    THREAD_TABLE_HEADER,
    candidate_shards,
    shard_of,
)
from . import tags
from .errors import BadMagic, Corrupt, Inaccessible, NotLoaded, VersionMismatch
from .limits import (
    DEFAULT_MAX_GAP,
    INDEX_CHUNK,
    INDEX_CHUNKS_KEPT,
    MAX_CAPACITY,
    MAX_FRAMES,
    MAX_HISTORY_CAPACITY,
    MAX_LIVE,
    MAX_STACK_ID,
    MAX_THREAD_INDEX,
    MAX_WRITTEN,
    RING_CHUNK,
)
from .records import (
    Block,
    Counter,
    Counts,
    Event,
    FreedBlock,
    FreedIndex,
    Header,
    History,
    Match,
    Profile,
    Shard,
    Stack,
    Thread,
    Totals,
    checked_sum,
    decode_counter,
    decode_freed,
    decode_slot,
)


class MemoryReader(Protocol):
    """What the decoder needs from memory: exact reads or :class:`Inaccessible`."""

    def read(self, addr: int, n: int) -> bytes:  # pragma: no cover - protocol
        ...


def _u64s(data: bytes) -> Sequence[int]:
    """The bytes as little-endian u64s; memoryview.cast is ~50x faster than struct."""
    if sys.byteorder == "little":
        return memoryview(data).cast("Q")
    return struct.unpack(f"<{len(data) // 8}Q", data)


def _as_list(column: Sequence[int]) -> List[int]:
    """A column as a list (memoryview.tolist() is one C call)."""
    return column.tolist() if hasattr(column, "tolist") else list(column)


def _containing(cols: Sequence[Sequence[int]], addr: int) -> List[Tuple[int, FreedBlock]]:
    """(index, record) of every record of a part of the ring (five word columns) whose
    block contains ``addr``."""
    # One pass in a comprehension: 262144 records take ~40 ms (see the tests).
    hits = [
        i
        for i, (a, st) in enumerate(zip(cols[0], cols[1]))
        if 0 < a <= addr and (a == addr or addr < a + (st & FIELD_MASK))
    ]
    return [(i, decode_freed([c[i] for c in cols])) for i in hits]


def _slot_ranges(first: int, end: int, capacity: int) -> List[Tuple[int, int]]:
    """Records ``first..end`` as (first slot, count) ranges of a ring of ``capacity``."""
    if end <= first:
        return []
    start, n = first % capacity, min(end - first, capacity)
    if start + n <= capacity:
        return [(start, n)]
    return [(start, capacity - start), (0, start + n - capacity)]


# Reads longer than this are checked against the target's mappings first (see Tracer._read).
EXTENT_CHECKED = 1 << 16


def human_bytes(n: int) -> str:
    """``n`` bytes for a message: "96 GiB", "4 KiB", "24 bytes"."""
    if n < 1024:
        return f"{n} bytes"
    value, unit = n / 1024, 0
    units = ("KiB", "MiB", "GiB", "TiB", "PiB")
    while value >= 1024 and unit + 1 < len(units):
        value, unit = value / 1024, unit + 1
    if value == int(value) or value >= 100:
        return f"{value:.0f} {units[unit]}"
    return f"{value:.1f} {units[unit]}"


class _Disjoint:
    """Ranges claimed for tables (directory chunks, counter caches), none overlapping: a
    scribbled directory naming one chunk many times would have it read again and again."""

    def __init__(self) -> None:
        self.starts: List[int] = []
        self.ends: List[int] = []

    def claim(self, addr: int, n: int, what: str) -> None:
        end = addr + n
        i = bisect.bisect_left(self.starts, addr)
        if (i > 0 and self.ends[i - 1] > addr) or (i < len(self.starts) and self.starts[i] < end):
            raise Corrupt(f"{what} at {addr:#x} overlaps another table's memory")
        self.starts.insert(i, addr)
        self.ends.insert(i, end)


def _decode_thread(index: int, raw: bytes) -> Optional[Thread]:
    """A 64-byte thread record; None while unpublished (tid 0)."""
    tid, flags, name, counters, own_live, freed_elsewhere, peak, allocated = (
        THREAD_STRUCT.unpack(raw)
    )
    if tid == 0:
        # The tracer stores tid last (release): 0 is a record still being
        # written when the process stopped, and never a real kernel tid.
        return None
    return Thread(
        index=index, tid=tid, exited=bool(flags & THREAD_EXITED),
        name=name.split(b"\0", 1)[0].decode("utf-8", "replace"),
        counters=counters, own_live=own_live, freed_elsewhere=freed_elsewhere,
        peak_bytes=peak, allocated_bytes=allocated,
    )


def _holds(b: Block, addr: int) -> bool:
    """Whether ``b`` contains ``addr`` (a zero-sized block only its start)."""
    return b.addr == addr or b.addr < addr < b.end


def _better(m: Match, best: Optional[Match]) -> bool:
    """A nearer match than ``best``; on a tie, "after" wins: overflows are more common
    than underflows."""
    return best is None or m.offset < best.offset or (
        m.offset == best.offset and m.relation == "after" and best.relation == "before")


class Tracer:
    """A view of one process's mem-trace state, read lazily through ``reader``.

    Instances cache what they read, so create a fresh one per command: a live
    process changes between commands.
    """


    def __init__(self, reader: MemoryReader, header: Header):
        self.reader = reader
        self.header = header
        self._shards: Optional[List[Shard]] = None
        self._slots: Dict[int, Tuple[Sequence[int], Sequence[int], Sequence[int]]] = {}
        self._dirs: Dict[int, Tuple[int, int]] = {}
        self._history: Optional[History] = None
        self._ring: Optional[List[Tuple[Sequence[int], ...]]] = None
        self._index: Optional[FreedIndex] = None
        # Chunks of INDEX_CHUNK links or records read by index walks: (array, chunk) -> words.
        self._index_chunks: Dict[Tuple[int, int], Sequence[int]] = {}
        self._profile: Optional[Profile] = None
        self._regions: Optional[List[tags.Region]] = None

    # -- reading

    def _read(self, addr: int, n: int, what: str) -> bytes:
        """Exactly ``n`` bytes at ``addr`` or a typed error naming ``what``.

        A read longer than EXTENT_CHECKED is first checked against the memory the target
        has there (when the reader can tell): a count or capacity the program scribbled
        over then costs one line, not a read of every page it claims."""
        if addr <= 0 or addr + n > MASK64 + 1:
            raise Corrupt(f"{what}: pointer {addr:#x} is not a valid address")
        extent = getattr(self.reader, "extent", None)
        if n > EXTENT_CHECKED and extent is not None:
            have = extent(addr, n)
            # Nothing at all there (0) is left to the read, which says so for a core too.
            if have:
                raise Corrupt(
                    f"{what} claims {human_bytes(n)} at {addr:#x}, "
                    f"where the target's memory ends after {human_bytes(have)}"
                )
        try:
            data = self.reader.read(addr, n)
        except Inaccessible as e:
            raise Inaccessible(addr, n, what, e.detail) from e
        if len(data) < n:
            raise Inaccessible(addr, n, what, f"only {len(data)} bytes readable")
        return bytes(data[:n])

    @classmethod
    def open(cls, reader: MemoryReader, address: int) -> "Tracer":
        """Decode and validate the header at ``address``.

        Raises NotLoaded for a null address, BadMagic, VersionMismatch, Corrupt for
        sizes that differ from the contract, Inaccessible if the header is unreadable.
        """
        if not address:
            raise NotLoaded("mem-trace header address is null")
        probe = cls(reader, None)  # type: ignore[arg-type]
        # Magic and version first: a different version may have a different size.
        head = probe._read(address, 16, "the mem-trace header")
        magic, version = head[:8], struct.unpack_from("<I", head, 8)[0]
        if magic != MAGIC:
            raise BadMagic(address, magic)
        if version != LAYOUT_VERSION:
            raise VersionMismatch(version)
        raw = probe._read(address, HEADER_SIZE, "the mem-trace header")
        (
            _magic, version, header_size, slot_size, shard_size, shard_count, region_shift,
            shards, stacks, threads, freed, next_seq, live_bytes, flags, untracked, profile,
            peak_bytes, peak_seq, tree, sample_mean, tag_key, attached_at,
        ) = HEADER_STRUCT.unpack(raw)
        expected = {
            "header_size": (header_size, HEADER_SIZE),
            "slot_size": (slot_size, SLOT_SIZE),
            "shard_size": (shard_size, SHARD_SIZE),
            "shard_count": (shard_count, SHARD_COUNT),
            "region_shift": (region_shift, REGION_SHIFT),
        }
        for name, (got, want) in expected.items():
            if got != want:
                raise Corrupt(
                    f"mem-trace header: {name} is {got}, version {LAYOUT_VERSION} says {want}"
                )
        if tag_key and tag_key >> 48 in (0, 0xFFFF):
            # A key the tracer never makes: its check words would look like pointers or
            # small integers, the values a heap holds most.
            raise Corrupt(
                f"mem-trace header: tag_key {tag_key:#x} is no key the tracer makes (its top "
                f"16 bits are all {'zero' if tag_key >> 48 == 0 else 'one'})"
            )
        header = Header(
            address=address, version=version, shard_count=shard_count,
            region_shift=region_shift, shards=shards, stacks=stacks, threads=threads,
            freed=freed, next_seq=next_seq, flags=flags, untracked=untracked,
            live_bytes=live_bytes, profile=profile, peak_bytes=peak_bytes, peak_seq=peak_seq,
            tree=tree, sample_mean=sample_mean, tag_key=tag_key, attached_at=attached_at,
        )
        return cls(reader, header)

    # -- shards and slots

    def shards(self) -> List[Shard]:
        """All shards, read in one go (8 KiB); empty before initialisation."""
        if self._shards is None:
            if not self.header.shards:
                self._shards = []
            else:
                raw = self._read(self.header.shards, SHARD_COUNT * SHARD_SIZE, "the shard array")
                out = []
                for i in range(SHARD_COUNT):
                    _lock, _res, array, live, tomb, live_bytes = SHARD_STRUCT.unpack_from(
                        raw, i * SHARD_SIZE
                    )
                    if live > MAX_LIVE or tomb > MAX_LIVE:
                        raise Corrupt(
                            f"shard {i}: absurd counts (live {live}, tombstones {tomb})"
                        )
                    out.append(Shard(i, array, live, tomb, live_bytes))
                self._shards = out
        return self._shards

    def _slot_columns(self, index: int) -> Tuple[Sequence[int], Sequence[int], Sequence[int]]:
        """The (addr, size_thread, seq_stack) columns of a shard's slot array."""
        cached = self._slots.get(index)
        if cached is not None:
            return cached
        shards = self.shards()
        if index >= len(shards) or not shards[index].array:
            cols: Tuple[Sequence[int], Sequence[int], Sequence[int]] = ((), (), ())
        else:
            array = shards[index].array
            what = f"the slot array of shard {index}"
            capacity = struct.unpack("<Q", self._read(array, 8, what))[0]
            # Any capacity is valid since the table grows by quarters (docs/LAYOUT.md); an
            # array is never published empty.
            if capacity == 0:
                raise Corrupt(f"{what} at {array:#x}: capacity 0")
            if capacity > MAX_CAPACITY:
                raise Corrupt(f"{what} at {array:#x}: capacity {capacity} is absurd")
            words = _u64s(self._read(array + SLOT_ARRAY_HEADER, capacity * SLOT_SIZE, what))
            cols = (words[0::3], words[1::3], words[2::3])
        self._slots[index] = cols
        return cols

    def shard_blocks(self, index: int) -> Iterator[Block]:
        """Live blocks of one shard, in slot order (tombstones and empties skipped)."""
        addrs, st, ss = self._slot_columns(index)
        for i, a in enumerate(addrs):
            if a > SLOT_TOMBSTONE:
                yield decode_slot(a, st[i], ss[i])

    def blocks(self) -> Iterator[Block]:
        """Every live block, shard by shard, then the tagged blocks of the heap mappings
        (docs/LAYOUT.md "Block tags"; none when the reader cannot list mappings)."""
        for shard in self.shards():
            yield from self.shard_blocks(shard.index)
        if self.shards():
            yield from self.tagged_blocks()

    # -- tagged blocks (version 6)

    def regions(self) -> List[tags.Region]:
        """The target's mappings as the reader lists them (``regions()``), else none."""
        if self._regions is None:
            lister = getattr(self.reader, "regions", None)
            self._regions = list(lister() or []) if lister is not None else []
        return self._regions

    def tagged_blocks(self, scanned: Optional[tags.Scanned] = None) -> Iterator[Block]:
        """Every live tagged block of the heap mappings, in address order per mapping."""
        if self.header.tag_key:
            yield from tags.tagged_blocks(self.reader, self.header.tag_key, self.regions(),
                                          scanned, self._long_tags())

    def _long_tags(self) -> bool:
        """Whether tags carry sequence numbers (``FLAG_TAG_SEQ``)."""
        return bool(self.header.flags & FLAG_TAG_SEQ)

    def _bounds(self, addr: int) -> Tuple[int, int]:
        """The mapping holding ``addr``; the whole address space when not known (the reads
        then end where memory does)."""
        r = tags.region_of(self.regions(), addr)
        return (r.start, r.end) if r is not None else (0, MASK64)

    def tagged_below(self, addr: int) -> Optional[Block]:
        """The nearest tagged block at or below ``addr`` within 64 KiB: it holds ``addr``
        when it contains it, else no tagged block does."""
        if not self.header.tag_key:
            return None
        return tags.tagged_below(self.reader, self.header.tag_key, addr, self._bounds(addr)[0],
                                 self._long_tags())

    def tagged_containing(self, addr: int) -> Optional[Block]:
        """The tagged block holding ``addr``."""
        b = self.tagged_below(addr)
        return b if b is not None and _holds(b, addr) else None

    def _tagged_near(self, addr: int, below: Optional[Block], max_gap: int) -> List[Match]:
        """The nearest tagged blocks below (``after``) and above (``before``) ``addr``
        within ``max_gap``, which holds none."""
        out = []
        if below is not None and not _holds(below, addr) and addr - below.end <= max_gap:
            out.append(Match(addr, below, "after", addr - below.end))
        above = tags.tagged_above(self.reader, self.header.tag_key, addr, max_gap,
                                  self._bounds(addr)[1], self._long_tags())
        if above is not None:
            out.append(Match(addr, above, "before", above.addr - addr))
        return out

    def find_block(self, addr: int, max_gap: int = DEFAULT_MAX_GAP) -> Optional[Match]:
        """The block containing ``addr``, else the nearest one within ``max_gap``.

        Containment needs only the three candidate shards, then the backward scan
        for a tag (docs/LAYOUT.md "Block tags"). Only when neither holds ``addr``
        are the (at most two) extra region shards read that may hold a small block
        ending or starting within ``max_gap`` of it, and the tags just above it. Between a
        block below and one above at the same distance, "after" wins: overflows are
        more common than underflows.
        """
        if not 0 <= addr <= MASK64:
            raise ValueError(f"address {addr:#x} out of range")
        max_gap = max(0, min(max_gap, REGION_SIZE))
        if not self.shards():
            return None
        inside = self._scan(candidate_shards(addr), addr, 0, True)
        if inside is not None and inside.relation == "inside":
            return inside
        below = self.tagged_below(addr)
        if below is not None and _holds(below, addr):
            return Match(addr, below, "inside", addr - below.addr)
        if max_gap == 0:
            return None
        best = self._table_near(addr, max_gap)
        for m in self._tagged_near(addr, below, max_gap) if self.header.tag_key else []:
            if _better(m, best):
                best = m
        return best

    def _table_near(self, addr: int, max_gap: int) -> Optional[Match]:
        """The nearest table block within ``max_gap`` of ``addr``, which none holds."""
        # Small blocks ending within max_gap below addr start no lower than this,
        # and those starting within max_gap above start no higher than addr+max_gap.
        lo = max(0, addr - max_gap - REGION_SIZE) >> REGION_SHIFT
        hi = min(MASK64, addr + max_gap) >> REGION_SHIFT
        shards = list(dict.fromkeys([shard_of(r) for r in range(lo, hi + 1)] + [LARGE_SHARD]))
        return self._scan(shards, addr, max_gap, False)

    def _scan(
        self, shards: Iterable[int], addr: int, max_gap: int, inside_only: bool
    ) -> Optional[Match]:
        best: Optional[Match] = None
        lo = addr - max_gap - REGION_SIZE
        hi = addr + max_gap
        for index in shards:
            addrs, st, ss = self._slot_columns(index)
            large = index == LARGE_SHARD
            # tolist() then a plain loop: this is the hot part for big shards, and
            # list iteration beats indexing into a strided memoryview.
            for i, a in enumerate(addrs.tolist() if hasattr(addrs, "tolist") else addrs):
                if a <= SLOT_TOMBSTONE or a > hi or (a < lo and not large):
                    continue
                size = st[i] & FIELD_MASK
                end = a + size
                if a <= addr and (addr < end or (size == 0 and a == addr)):
                    m = Match(addr, decode_slot(a, st[i], ss[i]), "inside", addr - a)
                    # Overlaps cannot happen in a consistent table; prefer the
                    # newest allocation if a torn core shows two.
                    if best is None or best.relation != "inside" or m.block.seq > best.block.seq:
                        best = m
                    continue
                if inside_only or (best is not None and best.relation == "inside"):
                    continue
                if end <= addr:
                    relation, dist = "after", addr - end
                elif a > addr:
                    relation, dist = "before", a - addr
                else:
                    continue
                if dist > max_gap:
                    continue
                m = Match(addr, decode_slot(a, st[i], ss[i]), relation, dist)
                if _better(m, best):
                    best = m
        return best

    # -- stacks and threads

    def _directory(self, base: int, what: str, bits: int, chunks: int, max_count: int) -> int:
        """Validate a stack store / thread table header; returns its count."""
        cached = self._dirs.get(base)
        if cached is not None:
            return cached[0]
        count, chunk_bits, nchunks = DIRECTORY_HEADER_STRUCT.unpack(self._read(base, 16, what))
        if chunk_bits != bits or nchunks != chunks:
            raise Corrupt(
                f"{what} at {base:#x}: chunk_bits {chunk_bits}, chunks {nchunks}; "
                f"version {LAYOUT_VERSION} says {bits}, {chunks}"
            )
        if count > max_count:
            raise Corrupt(f"{what} at {base:#x}: count {count} is absurd")
        self._dirs[base] = (count, chunk_bits)
        return count

    def stack_count(self) -> int:
        """How many stack ids have been handed out (distinct stacks)."""
        if not self.header.stacks:
            return 0
        return self._directory(
            self.header.stacks, "the stack store", STACK_CHUNK_BITS, STACK_CHUNKS, MAX_STACK_ID
        )

    def thread_count(self) -> int:
        """How many thread indexes have been handed out."""
        if not self.header.threads:
            return 0
        return self._directory(
            self.header.threads, "the thread table", THREAD_CHUNK_BITS, THREAD_CHUNKS,
            MAX_THREAD_INDEX,
        )

    def _read_ptr(self, addr: int, what: str) -> int:
        return struct.unpack("<Q", self._read(addr, 8, what))[0]

    def stack(self, stack_id: int) -> Optional[Stack]:
        """The frames of stack ``stack_id``; None for id 0 or a record not published yet."""
        if stack_id == 0 or not self.header.stacks:
            return None
        count = self.stack_count()
        if stack_id > count:
            raise Corrupt(f"stack id {stack_id} is beyond the {count} handed out")
        base = self.header.stacks
        chunk = self._read_ptr(
            base + STACK_STORE_HEADER + 8 * (stack_id >> STACK_CHUNK_BITS),
            f"the stack directory entry of stack {stack_id}",
        )
        if not chunk:
            return None
        index = stack_id & ((1 << STACK_CHUNK_BITS) - 1)
        record = self._read_ptr(chunk + 8 * index, f"the record address of stack {stack_id}")
        if not record:
            return None
        what = f"stack {stack_id}"
        n = self._read_ptr(record, what)
        if n & STACK_IN_TREE:
            return Stack(stack_id, self._tree_frames(stack_id, n & ~STACK_IN_TREE, record))
        if n > MAX_FRAMES:
            raise Corrupt(f"{what} at {record:#x}: {n} frames is absurd")
        if n == 0:
            return Stack(stack_id, ())
        frames = tuple(_u64s(self._read(record + 8, 8 * n, what)))
        return Stack(stack_id, frames)

    def _tree_frames(self, stack_id: int, n: int, record: int) -> Tuple[int, ...]:
        """The ``n`` frames a stack record names by its call-tree node (docs/LAYOUT.md "Call
        tree"): the node's pc, its parent's, ... Parents have smaller ids, so the walk ends;
        a path shorter than ``n`` is corrupt."""
        what = f"stack {stack_id}"
        if n > MAX_FRAMES:
            raise Corrupt(f"{what} at {record:#x}: {n} frames is absurd")
        if not self.header.tree:
            raise Corrupt(f"{what} names the call tree, and the header has none")
        count = self._read_ptr(self.header.tree, "the call tree's node count")
        node = self._read_ptr(record + 8, what)
        frames = []
        while len(frames) < n:
            if node == 0 or node > count or node > 0xFFFF_FFFF:
                raise Corrupt(f"{what}: call-tree node {node} is not one of the {count} handed out")
            chunk = self._read_ptr(
                self.header.tree + CALL_TREE_HEADER + 8 * (node >> TREE_CHUNK_BITS),
                f"the call-tree directory entry of node {node}",
            )
            if not chunk:
                raise Corrupt(f"{what}: call-tree node {node} is in no chunk")
            at = chunk + TREE_NODE_SIZE * (node & ((1 << TREE_CHUNK_BITS) - 1))
            pc, word = _u64s(self._read(at, 16, f"call-tree node {node}"))
            parent = word & 0xFFFF_FFFF
            frames.append(pc)
            if len(frames) < n and parent >= node:
                raise Corrupt(f"{what}: call-tree node {node} has parent {parent}, not a smaller id")
            node = parent
        return tuple(frames)

    def thread(self, index: int) -> Optional[Thread]:
        """Thread record ``index``; None for 0 ("unknown") or an unpublished record (tid 0)."""
        if index == 0 or not self.header.threads:
            return None
        count = self.thread_count()
        if index > count:
            raise Corrupt(f"thread index {index} is beyond the {count} handed out")
        base = self.header.threads
        chunk = self._read_ptr(
            base + THREAD_TABLE_HEADER + 8 * (index >> THREAD_CHUNK_BITS),
            f"the thread directory entry of thread {index}",
        )
        if not chunk:
            return None
        offset = (index & ((1 << THREAD_CHUNK_BITS) - 1)) * THREAD_RECORD_SIZE
        raw = self._read(chunk + offset, THREAD_RECORD_SIZE, f"thread record {index}")
        return _decode_thread(index, raw)

    def threads(self) -> List[Thread]:
        """Every published thread record, by index; one read per chunk of 4096."""
        count = self.thread_count()
        out: List[Thread] = []
        per_chunk = 1 << THREAD_CHUNK_BITS
        taken = _Disjoint()
        for k in range((count >> THREAD_CHUNK_BITS) + 1):
            first = max(1, k * per_chunk)
            last = min(count, (k + 1) * per_chunk - 1)
            if first > last:
                continue
            chunk = self._read_ptr(
                self.header.threads + THREAD_TABLE_HEADER + 8 * k,
                f"the thread directory entry of chunk {k}",
            )
            if not chunk:
                continue
            lo = (first - k * per_chunk) * THREAD_RECORD_SIZE
            size = THREAD_RECORD_SIZE
            taken.claim(chunk + lo, (last - first + 1) * size,
                        f"chunk {k} of the thread table, which claims {count} threads")
            raw = self._read(chunk + lo, (last - first + 1) * size,
                             f"thread records {first}..{last}")
            for i in range(last - first + 1):
                t = _decode_thread(first + i, raw[i * size:(i + 1) * size])
                if t is not None:
                    out.append(t)
        return out

    # -- profile (profiler builds)

    def profile(self) -> Optional[Profile]:
        """The profile's head; None when the library was built without the profiler."""
        if self._profile is None and self.header.profile:
            base = self.header.profile
            what = "the profile"
            (
                counter_size, chunk_bits, chunks, _flags, started_ns, resets, reports,
            ) = PROFILE_STRUCT.unpack(self._read(base, PROFILE_HEADER, what))
            expected = {
                "counter_size": (counter_size, COUNTER_SIZE),
                "chunk_bits": (chunk_bits, COUNTER_CHUNK_BITS),
                "chunks": (chunks, COUNTER_CHUNKS),
            }
            for name, (got, want) in expected.items():
                if got != want:
                    raise Corrupt(
                        f"{what} at {base:#x}: {name} is {got}, version {LAYOUT_VERSION} says {want}"
                    )
            self._profile = Profile(address=base, started_ns=started_ns, resets=resets,
                                    reports=reports)
        return self._profile

    def shared_counters(self) -> Iterator[Counter]:
        """The shared counter record of every stack id handed out (and of id 0) that was
        ever updated; one read per chunk of 4096 records (256 KiB)."""
        if self.profile() is None:
            return
        count = self.stack_count()
        per_chunk = 1 << COUNTER_CHUNK_BITS
        nchunks = (count >> COUNTER_CHUNK_BITS) + 1
        dir_words = _u64s(self._read(
            self.header.profile + PROFILE_HEADER, 8 * nchunks, "the profile's directory"
        ))
        taken = _Disjoint()
        for k, chunk in enumerate(_as_list(dir_words)):
            if not chunk:
                continue
            n = min(per_chunk, count + 1 - k * per_chunk)
            taken.claim(chunk, n * COUNTER_SIZE, f"chunk {k} of the stack counters")
            words = _u64s(self._read(chunk, n * COUNTER_SIZE, f"counter chunk {k}"))
            last_seqs = _as_list(words[6::COUNTER_WORDS])
            for i, last in enumerate(last_seqs):
                if last:
                    base = i * COUNTER_WORDS
                    yield decode_counter(words[base:base + COUNTER_WORDS], k * per_chunk + i)

    def cached_counters(self, threads: Optional[Sequence[Thread]] = None) -> Iterator[Counter]:
        """Every thread's cache records in use (``stack`` set), each cache in one read."""
        if self.profile() is None:
            return
        count = self.stack_count()
        taken = _Disjoint()
        for t in self.threads() if threads is None else threads:
            if not t.counters:
                continue
            taken.claim(t.counters, COUNTER_CACHE * COUNTER_SIZE,
                        f"the counter cache of thread {t.index}")
            words = _u64s(self._read(
                t.counters, COUNTER_CACHE * COUNTER_SIZE, f"the counter cache of thread {t.index}"
            ))
            for i in range(COUNTER_CACHE):
                record = words[i * COUNTER_WORDS:(i + 1) * COUNTER_WORDS]
                tag = record[7] >> 32
                if not tag:
                    continue
                if tag - 1 > count:
                    raise Corrupt(
                        f"the counter cache of thread {t.index}: stack id {tag - 1} is beyond "
                        f"the {count} handed out"
                    )
                yield decode_counter(record)

    def stack_counts(self) -> Dict[int, Counts]:
        """Every counted stack's counts: its shared record plus every thread's cache record
        naming it (docs/LAYOUT.md "Profile"), with the at-peak rule against
        ``header.peak_seq``. Empty without the profiler."""
        peak_seq = self.header.peak_seq
        out: Dict[int, Counts] = {}
        for record in self.shared_counters():
            out[record.stack] = out.get(record.stack, Counts(record.stack)).add(record, peak_seq)
        for record in self.cached_counters():
            out[record.stack] = out.get(record.stack, Counts(record.stack)).add(record, peak_seq)
        return out

    # -- totals

    def totals(self) -> Totals:
        """Counters for ``mtrace-info``: reads the header, shards and two directory heads,
        and with block tags the heap mappings."""
        shards = self.shards()
        blocks, blocks_wrapped = checked_sum([s.live for s in shards])
        live_bytes, bytes_wrapped = checked_sum([s.live_bytes for s in shards])
        # Tagged blocks are in no shard's count (docs/LAYOUT.md "Block tags").
        if shards and self.header.tag_key:
            n, size = tags.tagged_totals(self.reader, self.header.tag_key, self.regions())
            blocks, live_bytes = blocks + n, live_bytes + size
        return Totals(
            live_blocks=blocks,
            live_bytes=live_bytes,
            tombstones=sum(s.tombstones for s in shards),
            stacks=self.stack_count(),
            threads=self.thread_count(),
            untracked=self.header.untracked,
            next_seq=self.header.next_seq,
            wrapped=blocks_wrapped or bytes_wrapped,
        )

    # -- live blocks containing an address (every one, for mtrace-history)

    def live_blocks_containing(self, addr: int) -> List[Block]:
        """Every live block containing ``addr``, newest allocation first.

        A consistent table has at most one; a core taken mid-update may show two.
        """
        out: List[Block] = []
        if not self.shards():
            return out
        for index in candidate_shards(addr):
            addrs, st, ss = self._slot_columns(index)
            for i, a in enumerate(_as_list(addrs)):
                if SLOT_TOMBSTONE < a <= addr and (a == addr or addr < a + (st[i] & FIELD_MASK)):
                    out.append(decode_slot(a, st[i], ss[i]))
        out.sort(key=lambda b: b.seq, reverse=True)
        tagged = self.tagged_containing(addr)
        if tagged is not None:
            out.append(tagged)
        return out

    # -- freed-block history

    def history_header(self) -> Optional[History]:
        """The history's header; None when the process has none (``header.freed == 0``)."""
        if self._history is None and self.header.freed:
            what = "the freed-block history header"
            (
                record_size, flags, capacity, records, written, quarantine_limit,
                quarantined_bytes, errors, index,
            ) = HISTORY_STRUCT.unpack(self._read(self.header.freed, HISTORY_HEADER_SIZE, what))
            base = self.header.freed
            if record_size != FREED_RECORD_SIZE:
                raise Corrupt(
                    f"{what} at {base:#x}: record_size is {record_size}, "
                    f"version {LAYOUT_VERSION} says {FREED_RECORD_SIZE}"
                )
            if capacity > MAX_HISTORY_CAPACITY:
                raise Corrupt(f"{what} at {base:#x}: capacity {capacity} is absurd")
            if written > MAX_WRITTEN:
                raise Corrupt(f"{what} at {base:#x}: {written} records written is absurd")
            self._history = History(
                address=base, flags=flags, capacity=capacity, records=records,
                written=written, quarantine_limit=quarantine_limit,
                quarantined_bytes=quarantined_bytes, errors=errors, index=index,
            )
        return self._history

    def _ring_parts(self) -> Iterable[Tuple[Sequence[int], ...]]:
        """The used part of the ring as five word columns, in parts of RING_CHUNK records.

        Before the ring wraps, records ``written..capacity`` were never written,
        so only the first ``written`` are read. A ring of up to RING_CHUNK records
        is one read, kept for the Tracer's life; a bigger one is read part by part
        on each scan, so memory stays bounded. The addr and size columns are
        lists: the scan is a plain loop, and list iteration beats a strided
        memoryview.
        """
        if self._ring is not None:
            return self._ring
        history = self.history_header()
        held = history.held if history is not None else 0
        if not held or not history.records:
            # records is 0 until the first free; nothing to read either way.
            self._ring = []
            return self._ring
        if held <= RING_CHUNK:
            self._ring = [self._ring_part(history.records, 0, held)]
            return self._ring
        return (
            self._ring_part(history.records, start, min(RING_CHUNK, held - start))
            for start in range(0, held, RING_CHUNK)
        )

    def _ring_part(self, records: int, start: int, n: int) -> Tuple[Sequence[int], ...]:
        raw = self._read(
            records + start * FREED_RECORD_SIZE, n * FREED_RECORD_SIZE,
            "the freed-block history ring",
        )
        words = _u64s(raw)
        cols = [words[k::FREED_RECORD_WORDS] for k in range(FREED_RECORD_WORDS)]
        # Only the two scanned columns become lists (~25 ms each for 262144
        # records); the others are indexed for the few hits.
        cols[0], cols[1] = _as_list(cols[0]), _as_list(cols[1])
        return tuple(cols)

    def freed_records(self) -> Iterator[FreedBlock]:
        """Every published record of the ring, in ring order (empty ones skipped)."""
        for cols in self._ring_parts():
            for i, a in enumerate(cols[0]):
                if a:
                    yield decode_freed([c[i] for c in cols])

    def freed_blocks_containing(self, addr: int) -> List[FreedBlock]:
        """Remembered freed blocks whose [addr, addr + size) contains ``addr``.

        A zero-size block contains only its start. Newest free first. Records with
        ``addr == 0`` are empty or being rewritten and never match. Through the
        history's address index when it has one (large rings), else by a scan of
        the ring: the same records either way.
        """
        index = self.freed_index()
        if index is not None:
            out = self._indexed_frees(index, addr)
        else:
            out = [r for cols in self._ring_parts() for _, r in _containing(cols, addr)]
        held = self.freed_tag_containing(addr)
        if held is not None and not any(r.addr == held.addr and r.free_seq == held.free_seq
                                        for r in out):
            out.append(held)
        out.sort(key=lambda r: r.free_seq, reverse=True)
        return out

    def freed_tag_containing(self, addr: int) -> Optional[FreedBlock]:
        """The block freed and still held by the tracer whose freed tag says it held
        ``addr`` (docs/LAYOUT.md "Freed tags"): its free is there before it reaches the
        history, and after the history forgot it."""
        if not self.header.tag_key or not self._long_tags():
            return None
        f = tags.freed_below(self.reader, self.header.tag_key, addr, self._bounds(addr)[0])
        return f if f is not None and _holds(f.allocation, addr) else None

    # -- the freed-block index

    def freed_index(self) -> Optional[FreedIndex]:
        """The index over the ring; None when the ring has none (or no record yet)."""
        history = self.history_header()
        if history is None or not history.index or not history.held or not history.records:
            return None
        if self._index is None:
            what = "the freed-block index"
            base = history.index
            (
                granule_shift, level_shift, levels, head_bits, multiplier, heads, links,
                disorder,
            ) = FREED_INDEX_STRUCT.unpack(self._read(base, FREED_INDEX_SIZE, what))
            last = granule_shift + level_shift * (levels - 1)
            if not (1 <= levels <= INDEX_MAX_LEVELS and level_shift >= 1
                    and FIELD_BITS <= last < 64 and 4 <= head_bits <= 32):
                raise Corrupt(
                    f"{what} at {base:#x}: {levels} levels of granules 2^{granule_shift} "
                    f"times 2^{level_shift} and {head_bits} head bits cannot be read"
                )
            if not heads or not links:
                raise Corrupt(f"{what} at {base:#x}: heads {heads:#x}, links {links:#x}")
            self._index = FreedIndex(
                address=base, granule_shift=granule_shift, level_shift=level_shift,
                levels=levels, head_bits=head_bits, multiplier=multiplier, heads=heads,
                links=links, disorder=disorder,
            )
        return self._index

    def _index_entry(self, base: int, per: int, slot: int, what: str) -> Sequence[int]:
        """The ``per`` words of entry ``slot`` of an array of ring-sized entries at
        ``base``, read INDEX_CHUNK entries at a time: chains often visit neighbours
        (a program frees nearby blocks one after the other)."""
        chunk = slot // INDEX_CHUNK
        words = self._index_chunks.get((base, chunk))
        if words is None:
            if len(self._index_chunks) >= INDEX_CHUNKS_KEPT:
                self._index_chunks.clear()
            first = chunk * INDEX_CHUNK
            n = min(INDEX_CHUNK, self.history_header().capacity - first)
            words = _u64s(self._read(base + 8 * per * first, 8 * per * n, what))
            self._index_chunks[(base, chunk)] = words
        at = (slot % INDEX_CHUNK) * per
        return words[at:at + per]

    def _indexed_frees(self, index: FreedIndex, addr: int) -> List[FreedBlock]:
        """The records containing ``addr``, by the index's chains (docs/LAYOUT.md
        "Freed-block index"): each chain up to a slot reused since, then the window
        of the ring such a cut may hide. A chain that loops or names a record never
        claimed is Corrupt; a loop is found within twice its length (Brent)."""
        history = self.history_header()
        cap, written, ring = history.capacity, history.written, history.records
        hits: Dict[int, FreedBlock] = {}
        window_end = 0
        for bucket in index.buckets(addr):
            chain = f"the freed-block index chain of head {bucket}"
            nxt = self._read_ptr(index.heads + 8 * bucket, f"{chain}'s head")
            power, steps, tortoise = 1, 0, -1
            while nxt:
                k = nxt - 1
                if k >= written:
                    raise Corrupt(f"{chain} names record {k}, but only {written} were written")
                if k == tortoise:
                    raise Corrupt(f"{chain} loops (record {k} twice)")
                steps += 1
                if steps == power:
                    tortoise, power, steps = k, power * 2, 0
                slot = k % cap
                link = self._index_entry(index.links, 1, slot, "the freed-block index links")[0]
                if link >> INDEX_NEXT_BITS != (k // cap) & INDEX_LAP_MASK:
                    # A later record took the slot: what joined the chain before k and
                    # is still in the ring was claimed less than `disorder` after it.
                    window_end = max(window_end, k + index.disorder)
                    break
                words = self._index_entry(
                    ring, FREED_RECORD_WORDS, slot, "the freed-block history ring")
                a = words[0]
                if 0 < a <= addr and (a == addr or addr < a + (words[1] & FIELD_MASK)):
                    hits[slot] = decode_freed(words)
                nxt = link & FIELD_MASK
        first, end = max(0, written - cap), min(window_end, written)
        for start, n in _slot_ranges(first, end, cap):
            for part in range(start, start + n, RING_CHUNK):
                cols = self._ring_part(ring, part, min(RING_CHUNK, start + n - part))
                for i, r in _containing(cols, addr):
                    hits[part + i] = r
        return list(hits.values())

    def history(self, addr: int) -> List[Event]:
        """Every remembered event touching ``addr``, newest first.

        The allocation of each live block containing it, and for each freed record
        containing it, the free and the allocation before it. Sequence numbers of
        allocations and frees share one counter, so sorting by them orders
        everything the process did.
        """
        events: List[Event] = []
        for b in self.live_blocks_containing(addr):
            events.append(Event("allocation", b.seq, b.thread, b.stack, b))
        for r in self.freed_blocks_containing(addr):
            a = r.allocation
            events.append(Event("free", r.free_seq, r.free_thread, r.free_stack, a, r))
            events.append(Event("allocation", a.seq, a.thread, a.stack, a, r))
        # On a (corrupt) tie, the free comes first: it cannot precede its allocation. A live
        # tagged block has no number, and is newer than every free of its memory.
        events.sort(key=lambda e: (MASK64 + 1 if e.live and e.block.tagged else e.seq,
                                   e.kind == "free"), reverse=True)
        return events
