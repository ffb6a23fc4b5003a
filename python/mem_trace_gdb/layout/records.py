"""What the decoder returns: frozen dataclasses, and the bit-field splits of slots and records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from .contract import (
    FIELD_BITS,
    FIELD_MASK,
    FLAG_FREE_STACKS,
    FLAG_INITIALISED,
    FLAG_PROFILER,
    FREED_BY_REALLOC,
    HISTORY_FLAG_FREE_STACKS,
    SIZE_SATURATED,
)


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
