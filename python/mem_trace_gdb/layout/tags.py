"""Tagged blocks (docs/LAYOUT.md "Block tags", version 6; "Freed tags", version 7): the twin
of the Rust reader's `crates/read/src/layout/tags.rs`.

A small block is in no table: the 16 bytes in front of it hold ``q ^ tag_key`` (``q`` its
address) and its size, thread and stack; with ``FLAG_TAG_SEQ`` (debug mode) the word at
``q - 24`` is its sequence number (``seq=True`` below). A 16-byte aligned ``q``
starts a live tagged block exactly when the word at ``q - 16`` is ``q ^ tag_key``. The key's
top 16 bits are neither all zero nor all one, and a user-space address has none of them
set, so a check word's last two bytes are the key's: the enumeration finds candidates with
``bytes.find`` on those two bytes (C speed) and checks only them in Python.

A long tag whose block was freed and is still held by the tracer is a freed tag (version 7,
"Freed tags"): its check word is ``~(q ^ tag_key)``, and :func:`freed_below` reads who freed
it.

Memory is read in big pieces: one read of at most 64 KiB for the backward scan, 1 MiB per
read for the enumeration; a piece that cannot be read whole is read page by page, and what
is still missing is counted, not raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

from .contract import FIELD_BITS, FIELD_MASK, MASK64, NO_SEQ, SEQ_TAG_SIZE, TAG_MAX_SIZE, TAG_SIZE
from .errors import MemTraceError
from .records import Block, FreedBlock

SCAN_PIECE = 1 << 20
PAGE = 4096


@dataclass(frozen=True)
class Region:
    """A mapping of the target: every readable one bounds the backward scan; ``heap`` ones
    (``[heap]``, anonymous writable memory, or on a core every writable segment) are
    enumerated."""

    start: int
    end: int
    heap: bool


def region_of(regions: Sequence[Region], addr: int) -> Optional[Region]:
    """The region holding ``addr``."""
    for r in regions:
        if r.start <= addr < r.end:
            return r
    return None


def block_from_tag(q: int, word: int, seq: int = NO_SEQ) -> Block:
    """The block a tag at ``q - 16`` whose second word is ``word`` describes."""
    return Block(addr=q, size=word & 0xFFFF, thread=(word >> 16) & 0xFF_FFFF, seq=seq,
                 stack=word >> 40)


def _seq_of(reader, q: int, before: Optional[int]) -> int:
    """A long tag's sequence number: ``before`` (the word at ``q - 24``) when it was read with
    the tag, else read now."""
    if before is not None:
        return before
    try:
        return int.from_bytes(bytes(reader.read(q - 24, 8)), "little")
    except MemTraceError:
        return NO_SEQ


def _block(reader, q: int, word: int, before: Optional[int], seq: bool) -> Block:
    return block_from_tag(q, word, _seq_of(reader, q, before) if seq else NO_SEQ)


def _read_down(reader, lo: int, hi: int) -> Tuple[int, bytes]:
    """The readable bytes of ``[lo, hi)`` that end at ``hi``: the whole range in one read,
    else page by page down from ``hi`` to the first page that cannot be read."""
    try:
        return lo, bytes(reader.read(lo, hi - lo))
    except MemTraceError:
        pass
    parts: List[bytes] = []
    start = hi
    while start > lo:
        frm = max(lo, (start - 1) & ~(PAGE - 1))
        try:
            parts.append(bytes(reader.read(frm, start - frm)))
        except MemTraceError:
            break
        start = frm
    return start, b"".join(reversed(parts))


def _tag_words_below(reader, addr: int, floor: int, tag_bytes: int
                     ) -> Tuple[int, Sequence[int]]:
    """``(start, words)``: the words of the tags (``tag_bytes`` each, 16 or 32) of every
    candidate block start ``q`` at or below ``addr`` and at most 64 KiB below it, the tag at
    or above ``floor``, read down from the top as far as memory can be read; pair ``k``
    (words ``2k``, ``2k + 1``) is the check word and record of ``q = start + 16 (k + 1)``.
    No words when no tag is within reach."""
    top = addr & ~15
    lowest = max(top - (TAG_MAX_SIZE - TAG_SIZE), floor + tag_bytes)
    if top < lowest:
        return 0, ()
    start, data = _read_down(reader, lowest - tag_bytes, top)
    return start, memoryview(data[: len(data) // 16 * 16]).cast("Q")


def tagged_below(reader, key: int, addr: int, floor: int = 0, seq: bool = False
                 ) -> Optional[Block]:
    """The nearest live tagged block starting at or below ``addr`` and at most 64 KiB
    below it, its tag at or above ``floor`` (the start of the mapping holding ``addr``).
    It holds ``addr`` when it contains it; otherwise no tagged block does."""
    if not key:
        return None
    start, words = _tag_words_below(reader, addr, floor, TAG_SIZE)
    n = len(words) // 2
    for k in range(n - 1, -1, -1):
        q = start + TAG_SIZE * (k + 1)
        if words[2 * k] == q ^ key:
            return _block(reader, q, words[2 * k + 1], words[2 * k - 1] if k else None, seq)
    return None


def freed_below(reader, key: int, addr: int, floor: int = 0) -> Optional[FreedBlock]:
    """The block freed and still held by the tracer (its freed tag) nearest at or below
    ``addr`` and at most 64 KiB below it, its tag at or above ``floor``. It holds ``addr``
    when it contains it; otherwise no held freed block does (a held block's memory is no
    other block's). Only long tags are ever freed."""
    if not key:
        return None
    start, words = _tag_words_below(reader, addr, floor, SEQ_TAG_SIZE)
    n = len(words) // 2
    # Pair k (words 2k, 2k + 1) is the check and record of q = start + 16 (k + 1); the two
    # words before it complete a long tag.
    for k in range(n - 1, 0, -1):
        q = start + TAG_SIZE * (k + 1)
        if words[2 * k] == (q ^ key) ^ MASK64:
            free, seq = words[2 * k - 2], words[2 * k - 1]
            return FreedBlock(
                allocation=block_from_tag(q, words[2 * k + 1], seq & FIELD_MASK),
                free_seq=free & FIELD_MASK, free_stack=free >> FIELD_BITS,
                free_thread=seq >> FIELD_BITS, flags=0)
    return None


def tagged_above(reader, key: int, addr: int, max_gap: int, ceiling: int = MASK64,
                 seq: bool = False) -> Optional[Block]:
    """The nearest live tagged block starting above ``addr`` and at most ``max_gap``
    bytes after it, its tag below ``ceiling`` (the end of the mapping holding ``addr``)."""
    if not key or max_gap <= 0:
        return None
    lo = addr & ~15
    hi = min(addr + max_gap, ceiling - TAG_SIZE) & ~15
    if hi <= lo:
        return None
    try:
        data = bytes(reader.read(lo, hi - lo))
    except MemTraceError:
        return None
    words = memoryview(data).cast("Q")
    for k in range(len(data) // 16):
        q = lo + TAG_SIZE * (k + 1)
        if q > addr and words[2 * k] == q ^ key:
            return _block(reader, q, words[2 * k + 1], words[2 * k - 1] if k else None, seq)
    return None


def _scan_piece(at: int, data: bytes, key: int, end: int
                ) -> Iterator[Tuple[int, int, Optional[int]]]:
    """``(q, size word, word at q - 24 if in data)`` of the tagged blocks whose tags lie in
    ``data`` (read at ``at``, 16-byte aligned) and which start before ``end``."""
    top = (key >> 48).to_bytes(2, "little")
    words = memoryview(data).cast("Q")
    find = data.find
    pos = find(top, 6)
    while pos >= 0:
        s = pos - 6
        if not s & 15:
            q = at + s + TAG_SIZE
            if words[s >> 3] == q ^ key and q < end:
                yield q, words[(s >> 3) + 1], words[(s >> 3) - 1] if s else None
        # On from the next place a check word's top bytes can be.
        pos = find(top, pos + ((6 - pos) & 15 or 16))


@dataclass
class Scanned:
    """What an enumeration read: bytes searched, bytes it could not read."""

    bytes: int = 0
    unreadable: int = 0


def tagged_in(reader, key: int, start: int, end: int, scanned: Optional[Scanned] = None,
              seq: bool = False) -> Iterator[Block]:
    """Every live tagged block starting in ``[start, end)``, its tag in the same range, in
    address order; SCAN_PIECE bytes per read."""
    for q, word, before in tag_words_in(reader, key, start, end, scanned):
        yield _block(reader, q, word, before, seq)


def tag_words_in(reader, key: int, start: int, end: int, scanned: Optional[Scanned] = None
                 ) -> Iterator[Tuple[int, int, Optional[int]]]:
    """:func:`tagged_in` as ``(address, size word, word before the check if read)``, for
    counts that need no :class:`Block` (a million of them cost a second)."""
    if not key:
        return
    scanned = scanned if scanned is not None else Scanned()
    start, end = (start + 15) & ~15, end & ~15
    at = start
    while at < end:
        n = min(SCAN_PIECE, end - at)
        try:
            data = bytes(reader.read(at, n))
        except MemTraceError:
            data = None
        if data is not None and len(data) == n:
            scanned.bytes += n
            yield from _scan_piece(at, data, key, end)
        else:
            p = at
            while p < at + n:
                nxt = min((p & ~(PAGE - 1)) + PAGE, at + n)
                try:
                    part = bytes(reader.read(p, nxt - p))
                except MemTraceError:
                    scanned.unreadable += nxt - p
                else:
                    scanned.bytes += nxt - p
                    yield from _scan_piece(p, part, key, end)
                p = nxt
        at += n


def tagged_blocks(reader, key: int, regions: Sequence[Region],
                  scanned: Optional[Scanned] = None, seq: bool = False) -> Iterator[Block]:
    """Every live tagged block of the heap regions."""
    for r in regions:
        if r.heap:
            yield from tagged_in(reader, key, r.start, r.end, scanned, seq)


def tagged_totals(reader, key: int, regions: Sequence[Region]) -> Tuple[int, int]:
    """Live tagged blocks and their bytes in the heap regions."""
    blocks = size = 0
    for r in regions:
        if r.heap:
            for _, word, _ in tag_words_in(reader, key, r.start, r.end):
                blocks += 1
                size += word & 0xFFFF
    return blocks, size
