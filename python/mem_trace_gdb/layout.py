"""Decoder for the mem-trace memory layout, version 2 (docs/LAYOUT.md).

This module is the out-of-process half of the layout contract. It never imports
`gdb`: it reads through any object with a ``read(addr, n) -> bytes`` method that
raises :class:`Inaccessible` for memory it cannot read, so it runs the same way
under gdb (live process or core file) and in plain unit tests over synthetic
images.

How an address is answered, in short (the contract explains why this is enough):

* the header at ``MEM_TRACE_HEADER`` points to ``shard_count`` shards;
* a block of at most 64 KiB starting at ``s`` lives in region shard
  ``shard_of(s >> 16)``, a larger one in the last ("large") shard;
* so a block containing ``a`` lives in ``shard_of(a >> 16)``,
  ``shard_of((a >> 16) - 1)`` or the large shard, and :meth:`Tracer.find_block`
  reads only those, each slot array in one read;
* a freed block is in the freed-block history (``header.freed``), a ring of the
  last ``capacity`` frees shared by all threads. It is not indexed by address, so
  :meth:`Tracer.freed_blocks_containing` reads the used part of the ring in one
  read and scans it as columns of u64s (262144 records in about 0.1 s).

Everything read from the process is untrusted: a core taken mid-update, a stray
write, or a different build can leave any bytes there. Every count and size is
checked against a cap before it drives a read or a loop, and every failure is one
of the typed errors below, never another exception.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Protocol, Sequence, Tuple

LAYOUT_VERSION = 2
MAGIC = b"MEMTRACE"

HEADER_SIZE = 128
SLOT_SIZE = 24
SHARD_SIZE = 64
REGION_SHIFT = 16
REGION_SIZE = 1 << REGION_SHIFT
REGION_SHARD_BITS = 7
REGION_SHARDS = 1 << REGION_SHARD_BITS
SHARD_COUNT = REGION_SHARDS + 1
LARGE_SHARD = SHARD_COUNT - 1
SHARD_HASH = 0x9E3779B97F4A7C15
SLOT_ARRAY_HEADER = 16

STACK_STORE_HEADER = 16
STACK_CHUNK_BITS = 16
STACK_CHUNKS = 256
THREAD_TABLE_HEADER = 16
THREAD_CHUNK_BITS = 12
THREAD_CHUNKS = 4096
THREAD_RECORD_SIZE = 32
HISTORY_HEADER_SIZE = 64
FREED_RECORD_SIZE = 40
FREED_RECORD_WORDS = FREED_RECORD_SIZE // 8

MASK64 = (1 << 64) - 1
FIELD_BITS = 40
FIELD_MASK = (1 << FIELD_BITS) - 1
SIZE_SATURATED = FIELD_MASK
SLOT_EMPTY = 0
SLOT_TOMBSTONE = 1

FLAG_INITIALISED = 1 << 0
FLAG_PROFILER = 1 << 1
FLAG_FREE_STACKS = 1 << 2

HISTORY_FLAG_FREE_STACKS = 1 << 0
FREED_BY_REALLOC = 1 << 0

# Caps on values read from the process. They are far above what a real process
# reaches and far below what would make gdb allocate gigabytes or spin:
# 2^24 slots is one 384 MiB read for a single shard, i.e. ~2 billion live blocks
# over 128 shards; stacks deeper than 4096 frames are not captured by any unwinder
# configuration we ship.
MAX_CAPACITY = 1 << 24
MAX_FRAMES = 4096
MAX_STACK_ID = (1 << 24) - 1
MAX_THREAD_INDEX = (1 << 24) - 1
MAX_LIVE = 1 << FIELD_BITS
# MEM_TRACE_FREED accepts at most 2^26 records (src/config.rs); sequence numbers
# are 40 bits, so more frees than 2^40 cannot have been written.
MAX_HISTORY_CAPACITY = 1 << 26
MAX_WRITTEN = 1 << FIELD_BITS
# The ring is read in one read up to this many records (40 MiB; the default ring,
# 65536 records, is 2.5 MiB), in reads of this size beyond: as Python lists, a
# full 2^26-record ring would take gigabytes of gdb's memory.
RING_CHUNK = 1 << 20

# How far from a block an address may be and still be reported as "N bytes
# after/before" it. Overflows and underflows land within a few elements of the
# block; 4 KiB also covers a misplaced struct-sized stride without attributing
# arbitrary addresses to an unrelated neighbour.
DEFAULT_MAX_GAP = 4096


# --------------------------------------------------------------------------- errors


class MemTraceError(Exception):
    """Base of every error this package raises on purpose; str() is one line."""


class NotLoaded(MemTraceError):
    """mem-trace is not in the process (no header symbol or a null header)."""


class BadMagic(MemTraceError):
    """The header address does not hold ``MEMTRACE``."""

    def __init__(self, address: int, found: bytes):
        self.address = address
        self.found = found
        super().__init__(
            f"no mem-trace header at {address:#x} (magic {found!r}, expected {MAGIC!r})"
        )


class VersionMismatch(MemTraceError):
    """The process uses a layout version this reader does not know."""

    def __init__(self, found: int, expected: int = LAYOUT_VERSION):
        self.found = found
        self.expected = expected
        super().__init__(
            f"mem-trace layout version {found} in the process, this gdb script reads "
            f"version {expected}: use the gdb/mem_trace.py from the same build"
        )


class Corrupt(MemTraceError):
    """Bytes that cannot be what the contract says (insane counts, bad sizes...)."""


class Inaccessible(MemTraceError):
    """Memory the reader cannot read (unmapped, missing from the core, short read)."""

    def __init__(self, address: int, length: int, what: str = "", detail: str = ""):
        self.address = address
        self.length = length
        self.what = what
        self.detail = detail
        text = f"cannot read {length} bytes at {address:#x}"
        if what:
            text = f"cannot read {what} ({length} bytes at {address:#x})"
        if detail:
            text += f": {detail}"
        super().__init__(text)


class MemoryReader(Protocol):
    """What the decoder needs from memory: exact reads or :class:`Inaccessible`."""

    def read(self, addr: int, n: int) -> bytes:  # pragma: no cover - protocol
        ...


# --------------------------------------------------------------------------- helpers


def shard_of(region: int) -> int:
    """Region shard index of a 64 KiB region number (the contract's ``shard_of``)."""
    return ((region * SHARD_HASH) & MASK64) >> (64 - REGION_SHARD_BITS)


def candidate_shards(addr: int) -> List[int]:
    """The shards that can hold a block containing ``addr``, without duplicates."""
    region = addr >> REGION_SHIFT
    out = [shard_of(region)]
    if region > 0 and shard_of(region - 1) not in out:
        out.append(shard_of(region - 1))
    out.append(LARGE_SHARD)
    return out


def _u64s(data: bytes) -> Sequence[int]:
    """The bytes as little-endian u64s; memoryview.cast is ~50x faster than struct."""
    if sys.byteorder == "little":
        return memoryview(data).cast("Q")
    return struct.unpack(f"<{len(data) // 8}Q", data)


def _as_list(column: Sequence[int]) -> List[int]:
    """A column as a list (memoryview.tolist() is one C call)."""
    return column.tolist() if hasattr(column, "tolist") else list(column)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Header:
    """The decoded 128-byte header."""

    address: int
    version: int
    shard_count: int
    region_shift: int
    shards: int
    stacks: int
    threads: int
    freed: int
    next_seq: int
    flags: int
    untracked: int

    @property
    def initialised(self) -> bool:
        return bool(self.flags & FLAG_INITIALISED)

    @property
    def profiler(self) -> bool:
        return bool(self.flags & FLAG_PROFILER)

    @property
    def free_stacks(self) -> bool:
        return bool(self.flags & FLAG_FREE_STACKS)


@dataclass(frozen=True)
class Shard:
    """One shard's counters and the address of its slot array (0: never used)."""

    index: int
    array: int
    live: int
    tombstones: int
    live_bytes: int


@dataclass(frozen=True)
class Block:
    """A live heap block as recorded in a slot."""

    addr: int
    size: int
    thread: int
    seq: int
    stack: int

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.addr + self.size

    @property
    def size_saturated(self) -> bool:
        """The real size is at least ``size`` (the 40-bit field saturated)."""
        return self.size == SIZE_SATURATED


def decode_slot(addr: int, size_thread: int, seq_stack: int) -> Block:
    """Split a slot's two bitfield words into a :class:`Block`."""
    return Block(
        addr=addr,
        size=size_thread & FIELD_MASK,
        thread=size_thread >> FIELD_BITS,
        seq=seq_stack & FIELD_MASK,
        stack=seq_stack >> FIELD_BITS,
    )


@dataclass(frozen=True)
class Match:
    """Where an address is relative to a block.

    ``relation`` is ``"inside"`` (``offset`` = bytes from the block's start),
    ``"after"`` (``offset`` = bytes past its end, 0 = one past the end) or
    ``"before"`` (``offset`` = bytes before its start).
    """

    address: int
    block: Block
    relation: str
    offset: int


@dataclass(frozen=True)
class Thread:
    """A thread record; ``index`` is what slots store."""

    index: int
    tid: int
    exited: bool
    name: str


@dataclass(frozen=True)
class Stack:
    """An interned allocation stack: return addresses, innermost first."""

    id: int
    frames: Tuple[int, ...]


@dataclass(frozen=True)
class Totals:
    """Process-wide counters for ``mtrace-info``."""

    live_blocks: int
    live_bytes: int
    tombstones: int
    stacks: int
    threads: int
    untracked: int
    next_seq: int


@dataclass(frozen=True)
class History:
    """The freed-block history's 64-byte header (``header.freed``)."""

    address: int
    flags: int
    capacity: int
    records: int
    written: int
    quarantine_limit: int
    quarantined_bytes: int
    errors: int

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    @property
    def free_stacks(self) -> bool:
        """Free stacks are recorded (``MEM_TRACE_FREE_STACKS``)."""
        return bool(self.flags & HISTORY_FLAG_FREE_STACKS)

    @property
    def held(self) -> int:
        """How many records the ring holds now."""
        return min(self.written, self.capacity)

    @property
    def wrapped(self) -> bool:
        """Older frees have been overwritten: the ring only knows the last ``capacity``."""
        return self.written > self.capacity


@dataclass(frozen=True)
class FreedBlock:
    """A freed-block record: the allocation as its slot said, and the free."""

    allocation: Block
    free_seq: int
    free_stack: int
    free_thread: int
    flags: int

    @property
    def addr(self) -> int:
        return self.allocation.addr

    @property
    def size(self) -> int:
        return self.allocation.size

    @property
    def end(self) -> int:
        return self.allocation.end

    @property
    def by_realloc(self) -> bool:
        """Freed by a ``realloc`` that moved the block or was given size 0."""
        return bool(self.flags & FREED_BY_REALLOC)


@dataclass(frozen=True)
class Event:
    """One remembered allocation or free, for ``mtrace-history``.

    ``kind`` is ``"allocation"`` or ``"free"``; ``seq``, ``thread`` and ``stack``
    are the event's own. ``freed`` is the history record the event comes from
    (None for the allocation of a live block); an allocation event with a record
    is one whose block was freed later, at ``freed.free_seq``.
    """

    kind: str
    seq: int
    thread: int
    stack: int
    block: Block
    freed: Optional[FreedBlock] = None

    @property
    def live(self) -> bool:
        return self.freed is None


def decode_freed(words: Sequence[int]) -> FreedBlock:
    """A freed record from its five u64 words (the last holds free_thread and flags)."""
    addr, size_thread, seq_stack, free_seq_stack, thread_flags = words
    return FreedBlock(
        allocation=decode_slot(addr, size_thread, seq_stack),
        free_seq=free_seq_stack & FIELD_MASK,
        free_stack=free_seq_stack >> FIELD_BITS,
        free_thread=thread_flags & 0xFFFF_FFFF,
        flags=thread_flags >> 32,
    )


# --------------------------------------------------------------------------- decoder


class Tracer:
    """A view of one process's mem-trace state, read lazily through ``reader``.

    Instances cache what they read, so create a fresh one per command: a live
    process changes between commands.
    """

    _HEADER = struct.Struct("<8sIIIIII QQQQ QQQ 40x")
    _SHARD = struct.Struct("<II QQQQ 24x")
    _DIR_HEADER = struct.Struct("<QII")
    _THREAD = struct.Struct("<II16s8x")
    _HISTORY = struct.Struct("<II QQQ QQQ 8x")

    def __init__(self, reader: MemoryReader, header: Header):
        self.reader = reader
        self.header = header
        self._shards: Optional[List[Shard]] = None
        self._slots: Dict[int, Tuple[Sequence[int], Sequence[int], Sequence[int]]] = {}
        self._dirs: Dict[int, Tuple[int, int]] = {}
        self._history: Optional[History] = None
        self._ring: Optional[List[Tuple[Sequence[int], ...]]] = None

    # -- reading

    def _read(self, addr: int, n: int, what: str) -> bytes:
        """Exactly ``n`` bytes at ``addr`` or a typed error naming ``what``."""
        if addr <= 0 or addr + n > MASK64 + 1:
            raise Corrupt(f"{what}: pointer {addr:#x} is not a valid address")
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
            shards, stacks, threads, freed, next_seq, flags, untracked,
        ) = cls._HEADER.unpack(raw)
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
        header = Header(
            address=address, version=version, shard_count=shard_count,
            region_shift=region_shift, shards=shards, stacks=stacks, threads=threads,
            freed=freed, next_seq=next_seq, flags=flags, untracked=untracked,
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
                    _lock, _res, array, live, tomb, live_bytes = self._SHARD.unpack_from(
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
        """Every live block, shard by shard."""
        for shard in self.shards():
            yield from self.shard_blocks(shard.index)

    def find_block(self, addr: int, max_gap: int = DEFAULT_MAX_GAP) -> Optional[Match]:
        """The block containing ``addr``, else the nearest one within ``max_gap``.

        Containment needs only the three candidate shards. Only when none
        contains ``addr`` are the (at most two) extra region shards read that may
        hold a small block ending or starting within ``max_gap`` of it. Between a
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
        if max_gap == 0:
            return None
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
                if (
                    best is None
                    or dist < best.offset
                    or (dist == best.offset and relation == "after" and best.relation == "before")
                ):
                    best = Match(addr, decode_slot(a, st[i], ss[i]), relation, dist)
        return best

    # -- stacks and threads

    def _directory(self, base: int, what: str, bits: int, chunks: int, max_count: int) -> int:
        """Validate a stack store / thread table header; returns its count."""
        cached = self._dirs.get(base)
        if cached is not None:
            return cached[0]
        count, chunk_bits, nchunks = self._DIR_HEADER.unpack(self._read(base, 16, what))
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
        if n > MAX_FRAMES:
            raise Corrupt(f"{what} at {record:#x}: {n} frames is absurd")
        if n == 0:
            return Stack(stack_id, ())
        frames = tuple(_u64s(self._read(record + 8, 8 * n, what)))
        return Stack(stack_id, frames)

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
        tid, flags, name = self._THREAD.unpack(raw)
        if tid == 0:
            # The tracer stores tid last (release): 0 is a record still being
            # written when the process stopped, and never a real kernel tid.
            return None
        name = name.split(b"\0", 1)[0].decode("utf-8", "replace")
        return Thread(index=index, tid=tid, exited=bool(flags & 1), name=name)

    # -- totals

    def totals(self) -> Totals:
        """Counters for ``mtrace-info``: reads the header, shards and two directory heads."""
        shards = self.shards()
        return Totals(
            live_blocks=sum(s.live for s in shards),
            live_bytes=sum(s.live_bytes for s in shards),
            tombstones=sum(s.tombstones for s in shards),
            stacks=self.stack_count(),
            threads=self.thread_count(),
            untracked=self.header.untracked,
            next_seq=self.header.next_seq,
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
        return out

    # -- freed-block history

    def history_header(self) -> Optional[History]:
        """The history's header; None when the process has none (``header.freed == 0``)."""
        if self._history is None and self.header.freed:
            what = "the freed-block history header"
            (
                record_size, flags, capacity, records, written, quarantine_limit,
                quarantined_bytes, errors,
            ) = self._HISTORY.unpack(self._read(self.header.freed, HISTORY_HEADER_SIZE, what))
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
                quarantined_bytes=quarantined_bytes, errors=errors,
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
        ``addr == 0`` are empty or being rewritten and never match.
        """
        out = []
        for cols in self._ring_parts():
            # One pass in a comprehension: 262144 records take ~40 ms (see the tests).
            hits = [
                i
                for i, (a, st) in enumerate(zip(cols[0], cols[1]))
                if 0 < a <= addr and (a == addr or addr < a + (st & FIELD_MASK))
            ]
            out += [decode_freed([c[i] for c in cols]) for i in hits]
        out.sort(key=lambda r: r.free_seq, reverse=True)
        return out

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
        # On a (corrupt) tie, the free comes first: it cannot precede its allocation.
        events.sort(key=lambda e: (e.seq, e.kind == "free"), reverse=True)
        return events
