"""What the decoder returns: frozen dataclasses, and the bit-field splits of slots and records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .contract import (
    FIELD_BITS,
    FIELD_MASK,
    FLAG_FREE_STACKS,
    FLAG_INITIALISED,
    FLAG_PROFILE_MODE,
    FLAG_PROFILER,
    FREED_BY_REALLOC,
    HISTORY_FLAG_FREE_STACKS,
    MASK64,
    SIZE_SATURATED,
)


@dataclass(frozen=True)
class Header:
    """The decoded 160-byte header."""

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
    # Profiler builds only (0 otherwise): live bytes of all threads, the profile, the peak.
    live_bytes: int = 0
    profile: int = 0
    peak_bytes: int = 0
    peak_seq: int = 0
    # The call tree that stack records may name their frames in (0: none).
    tree: int = 0
    # MEM_TRACE_SAMPLE: mean bytes between sampled allocations (0: every block recorded).
    sample_mean: int = 0
    # The block tags' key (version 6): 0 when every live block is in the table.
    tag_key: int = 0
    # With FLAG_ATTACHED: the first event after the last `mem-trace attach` (0 otherwise).
    attached_at: int = 0

    @property
    def initialised(self) -> bool:
        return bool(self.flags & FLAG_INITIALISED)

    @property
    def profiler(self) -> bool:
        return bool(self.flags & FLAG_PROFILER)

    @property
    def free_stacks(self) -> bool:
        return bool(self.flags & FLAG_FREE_STACKS)

    @property
    def profile_mode(self) -> bool:
        return bool(self.flags & FLAG_PROFILE_MODE)


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

    @property
    def tagged(self) -> bool:
        """Found by its tag, not in the table: it has no sequence number."""
        return self.seq == 0


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


def signed64(value: int) -> int:
    """A wrapping u64 as the signed number it stands for (a sum of deltas may be negative)."""
    value &= MASK64
    return value - (1 << 64) if value >> 63 else value


# The line an answer adds when counts it sums went past 2^64 or below zero.
SUM_LINE = "inconsistent tables: live counts sum past 2^64 or below zero"


def checked_sum(counts: Sequence[int]) -> Tuple[int, bool]:
    """The sum of u64 ``counts`` clamped to 2^64-1, and whether it went past 2^64 or a count
    was below zero (2^63 or more: a wrapped count; no process holds that much)."""
    total = sum(counts)
    wrapped = total > MASK64 or any(signed64(n) < 0 for n in counts)
    return min(total, MASK64), wrapped


@dataclass(frozen=True)
class Thread:
    """A thread record; ``index`` is what slots store.

    The last five fields are written by profiler builds only (zero otherwise).
    """

    index: int
    tid: int
    exited: bool
    name: str
    # Address of the thread's cache of counter deltas (0: none).
    counters: int = 0
    own_live: int = 0
    freed_elsewhere: int = 0
    peak_bytes: int = 0
    allocated_bytes: int = 0

    @property
    def live_bytes(self) -> int:
        """``own_live - freed_elsewhere``, wrapping; a running process may show it
        negative for an instant (another thread freed first): that is 0."""
        return max(0, signed64(self.own_live - self.freed_elsewhere))


@dataclass(frozen=True)
class Stack:
    """An interned allocation stack: return addresses, innermost first."""

    id: int
    frames: Tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """The profile's 64-byte head (``header.profile``)."""

    address: int
    started_ns: int
    resets: int
    reports: int


@dataclass(frozen=True)
class Counter:
    """One 64-byte counter record, shared or in a thread's cache (then every field is a
    wrapping delta). ``stack`` is the stack id it counts."""

    stack: int
    live_bytes: int
    live_blocks: int
    total_bytes: int
    total_blocks: int
    peak_bytes: int
    peak_blocks: int
    last_seq: int

    def at_peak(self, peak_seq: int) -> Tuple[int, int]:
        """(bytes, blocks) this record held at the global peak.

        The writer saves ``live_*`` into ``peak_*`` on a record's first change after the
        peak (docs/LAYOUT.md "Profile"), so a record not changed since then
        (``last_seq <= peak_seq``) still holds its at-peak values in ``live_*``.
        """
        if self.last_seq <= peak_seq:
            return self.live_bytes, self.live_blocks
        return self.peak_bytes, self.peak_blocks


def decode_counter(words: Sequence[int], stack: Optional[int] = None) -> Counter:
    """A counter record from its eight u64 words; ``stack`` overrides the record's own
    (a shared record's is 0: its id is its position)."""
    if stack is None:
        stack = (words[7] >> 32) - 1
    return Counter(
        stack=stack,
        live_bytes=words[0],
        live_blocks=words[1],
        total_bytes=words[2],
        total_blocks=words[3],
        peak_bytes=words[4],
        peak_blocks=words[5],
        last_seq=words[6],
    )


@dataclass(frozen=True)
class Counts:
    """A stack's counts: its shared record plus every thread's cache record naming it.

    Built with :meth:`add`, which sums with wrapping 64-bit arithmetic as the contract
    says; the properties read the sums as signed and clamp at 0, because a reader that
    does not stop the process may catch a record mid-move and see a negative total.
    """

    stack: int
    live_bytes_raw: int = 0
    live_blocks_raw: int = 0
    total_bytes_raw: int = 0
    total_blocks_raw: int = 0
    peak_bytes_raw: int = 0
    peak_blocks_raw: int = 0

    def add(self, record: Counter, peak_seq: int) -> "Counts":
        """These counts plus one record's (the reference is ``Counts::add`` in
        crates/core/src/profile/counters.rs)."""
        pb, pn = record.at_peak(peak_seq)
        return Counts(
            stack=self.stack,
            live_bytes_raw=(self.live_bytes_raw + record.live_bytes) & MASK64,
            live_blocks_raw=(self.live_blocks_raw + record.live_blocks) & MASK64,
            total_bytes_raw=(self.total_bytes_raw + record.total_bytes) & MASK64,
            total_blocks_raw=(self.total_blocks_raw + record.total_blocks) & MASK64,
            peak_bytes_raw=(self.peak_bytes_raw + pb) & MASK64,
            peak_blocks_raw=(self.peak_blocks_raw + pn) & MASK64,
        )

    @property
    def live_bytes(self) -> int:
        return max(0, signed64(self.live_bytes_raw))

    @property
    def live_blocks(self) -> int:
        return max(0, signed64(self.live_blocks_raw))

    @property
    def total_bytes(self) -> int:
        return max(0, signed64(self.total_bytes_raw))

    @property
    def total_blocks(self) -> int:
        return max(0, signed64(self.total_blocks_raw))

    @property
    def peak_bytes(self) -> int:
        return max(0, signed64(self.peak_bytes_raw))

    @property
    def peak_blocks(self) -> int:
        return max(0, signed64(self.peak_blocks_raw))


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
    # The shards' live counts summed past 2^64 or one was below zero: live_blocks and
    # live_bytes are then clamped to 2^64-1 (see SUM_LINE).
    wrapped: bool = False


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
    # The address index over the ring; 0: none (the ring is scanned).
    index: int = 0

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
class FreedIndex:
    """The freed-block index's header (``history.index``) and its arithmetic."""

    address: int
    granule_shift: int
    level_shift: int
    levels: int
    head_bits: int
    multiplier: int
    heads: int
    links: int
    disorder: int

    def shift(self, level: int) -> int:
        """The granule shift of ``level``."""
        return self.granule_shift + self.level_shift * level

    def bucket(self, level: int, granule: int) -> int:
        """The chain head of ``granule`` of ``level``: eight neighbouring granules share a
        line of heads, whose place is hashed."""
        key = (((granule >> 3) << 5) | level) & MASK64
        line = ((key * self.multiplier) & MASK64) >> (67 - self.head_bits)
        return (line << 3) | (granule & 7)

    def buckets(self, addr: int) -> List[int]:
        """The distinct chain heads a block containing ``addr`` can hang from: at each
        level, the granule of ``addr`` and the one before (a block starting there
        reaches at most one granule further)."""
        out = []
        for level in range(self.levels):
            q = addr >> self.shift(level)
            out.append(self.bucket(level, q))
            if q:
                out.append(self.bucket(level, q - 1))
        return sorted(set(out))


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
