"""The leak scan of `mtrace-leaks`: which live blocks can the program still reach?

Pure Python over a memory reader (no gdb), so the unit tests run it on synthetic
images. The gdb side (commands/leaks.py) finds the roots; this follows pointers.

It is the conservative mark phase LeakSanitizer and memcheck use:

* roots are memory ranges (writable data of the loaded objects, every thread's
  stack from its stack pointer up) and loose words (every thread's registers);
* any 8-byte-aligned word whose value points into a live block marks that block
  reachable. "Into" means anywhere in ``[start, start + size)`` (a zero-size
  block: its start): memcheck's interior-pointer rule, counted as reachable, as
  LSan does by default, because C++ multiple inheritance, `std::string`'s small
  buffers and pointers into arrays all keep a block alive through an interior
  pointer, and a false "lost" sends the user chasing a leak that is not there;
* except one value per block: the address of the next malloc chunk's header.
  glibc puts a chunk's 16-byte header right after the previous chunk's usable
  bytes, so for most sizes it falls inside the last 8 bytes of the block
  before it, and glibc's own free lists and `top` (in libc's data, a root) hold
  such addresses. Counting them would keep the block just before every free
  chunk reachable; a real pointer to exactly that spot is rare, and the block's
  owner holds its start anyway;
* a reachable block's own words are scanned the same way, until nothing new is
  reached. The rest is definitely lost (no pointer to it anywhere the program
  could follow).

Speed, because a process holds millions of words: memory is read in large
chunks, decoded with `memoryview.cast("Q")`, deduplicated with `set()` (a
block full of equal bytes is one value), filtered by the heap's address range,
and only the survivors are looked up, by bisection on the sorted block starts.
Each round reads every newly reached block, neighbours merged into one read.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Protocol, Sequence, Set, Tuple

from .layout import Block, MemTraceError

# One read covers at most this much (a root range or neighbouring blocks).
CHUNK = 8 << 20
# Neighbouring blocks closer than this are read together (the gap is read and ignored).
MERGE_GAP = 64 << 10
# A root range that cannot be read in one go is retried page by page.
PAGE = 4096


class Reader(Protocol):
    """Exact reads or :class:`Inaccessible` (the layout's MemoryReader)."""

    def read(self, addr: int, n: int) -> bytes:  # pragma: no cover - protocol
        ...


@dataclass(frozen=True)
class Root:
    """A range of memory to scan: ``what`` names it in the answer."""

    what: str
    start: int
    end: int


@dataclass
class ScanResult:
    """Which blocks were reached, and what could not be scanned."""

    blocks: Sequence[Block]
    reached: Set[int]
    # Bytes of roots scanned, and of roots (or reached blocks) that could not be read.
    root_bytes: int = 0
    unreadable: List[Tuple[str, int, int]] = field(default_factory=list)

    def lost(self) -> List[Block]:
        return [b for i, b in enumerate(self.blocks) if i not in self.reached]

    def reachable(self) -> List[Block]:
        return [b for i, b in enumerate(self.blocks) if i in self.reached]


def _words(data) -> Sequence[int]:
    """The bytes as little-endian u64s (trailing bytes that make no word are dropped)."""
    usable = len(data) - len(data) % 8
    if sys.byteorder == "little":
        return memoryview(data)[:usable].cast("Q")
    import struct

    return struct.unpack(f"<{usable // 8}Q", data[:usable])


def next_chunk_offset(size: int) -> int:
    """Offset from a glibc block's start of the next chunk's header: the chunk is
    ``max(32, (size + 8 + 15) & ~15)`` bytes from 16 bytes before the block."""
    return max(32, (size + 8 + 15) & ~15) - 16


class Heap:
    """Live blocks sorted by start, for "which block contains this value"."""

    def __init__(self, blocks: Iterable[Block]):
        self.blocks: List[Block] = sorted(blocks, key=lambda b: b.addr)
        self.starts = [b.addr for b in self.blocks]
        self.ends = [b.addr + b.size for b in self.blocks]
        self.lo = self.starts[0] if self.starts else 0
        self.hi = max(self.ends) if self.ends else 0

    def containing(self, values: Iterable[int]) -> Set[int]:
        """Indexes of the blocks that contain any of ``values`` (a set, ideally)."""
        lo, hi, starts, ends = self.lo, self.hi, self.starts, self.ends
        out: Set[int] = set()
        for v in values:
            if v < lo or v > hi:
                continue
            i = bisect_right(starts, v) - 1
            # Blocks do not overlap, so only the last one starting at or below v can
            # hold it; a zero-size block holds its start only.
            if i >= 0 and (v < ends[i] or v == starts[i]):
                offset = v - starts[i]
                if offset and offset == next_chunk_offset(ends[i] - starts[i]):
                    continue  # glibc's pointer to the next chunk, not into this block
                out.add(i)
        return out


def _aligned(start: int, end: int) -> Tuple[int, int]:
    """[start, end) shrunk to whole aligned words."""
    return (start + 7) & ~7, end & ~7


def _read_range(reader: Reader, start: int, end: int, what: str,
                unreadable: List[Tuple[str, int, int]]) -> Iterable[bytes]:
    """The bytes of an aligned range in CHUNK reads; an unreadable chunk is retried page by
    page, and what stays unreadable is noted, not fatal: a core may lack some pages."""
    pos = start
    while pos < end:
        n = min(CHUNK, end - pos)
        try:
            yield reader.read(pos, n)
        except MemTraceError:
            page = pos
            while page < pos + n:
                m = min(PAGE - page % PAGE, pos + n - page)
                try:
                    yield reader.read(page, m)
                except MemTraceError:
                    unreadable.append((what, page, m))
                page += m
        pos += n


def scan(reader: Reader, blocks: Iterable[Block], roots: Sequence[Root],
         registers: Iterable[int] = ()) -> ScanResult:
    """Mark every live block reachable from ``roots`` and ``registers`` (see the module
    documentation); ``blocks`` are the live blocks of the tracer's table."""
    heap = Heap(blocks)
    result = ScanResult(blocks=heap.blocks, reached=set())
    if not heap.blocks:
        return result
    values: Set[int] = set(registers)
    for root in roots:
        start, end = _aligned(root.start, root.end)
        if end <= start:
            continue
        result.root_bytes += end - start
        for data in _read_range(reader, start, end, root.what, result.unreadable):
            values.update(_words(data))
    frontier = heap.containing(values)
    reached = result.reached
    while frontier:
        reached |= frontier
        values = set()
        for data in _block_contents(reader, heap, sorted(frontier), result.unreadable):
            values.update(data)
        frontier = heap.containing(values) - reached
    return result


def _block_contents(reader: Reader, heap: Heap, indexes: Sequence[int],
                    unreadable: List[Tuple[str, int, int]]) -> Iterable[Sequence[int]]:
    """The aligned words of the blocks at ``indexes`` (sorted by address), neighbours read
    together in one read of at most CHUNK bytes (the gaps between them are not scanned)."""
    i = 0
    while i < len(indexes):
        first = heap.blocks[indexes[i]]
        span_start = first.addr & ~7
        span_end = first.addr + first.size
        j = i + 1
        while j < len(indexes):
            b = heap.blocks[indexes[j]]
            if b.addr - span_end > MERGE_GAP or b.addr + b.size - span_start > CHUNK:
                break
            span_end = max(span_end, b.addr + b.size)
            j += 1
        group = [heap.blocks[k] for k in indexes[i:j]]
        i = j
        if span_end - span_start > CHUNK:
            # One block bigger than a chunk: read it in chunks.
            b = group[0]
            start, end = _aligned(b.addr, b.addr + b.size)
            for data in _read_range(reader, start, end, "a live block", unreadable):
                yield _words(data)
            continue
        try:
            data = reader.read(span_start, span_end - span_start)
        except MemTraceError:
            # A gap between blocks may be unmapped (blocks from separate mmaps).
            for b in group:
                start, end = _aligned(b.addr, b.addr + b.size)
                if end > start:
                    try:
                        yield _words(reader.read(start, end - start))
                    except MemTraceError:
                        unreadable.append(("a live block", start, end - start))
            continue
        view = memoryview(data)
        for b in group:
            start, end = _aligned(b.addr, b.addr + b.size)
            if end > start:
                yield _words(view[start - span_start:end - span_start])


@dataclass(frozen=True)
class Group:
    """Blocks of one allocation stack, in one class (lost or reachable)."""

    stack: int
    bytes: int
    blocks: int


def group_by_stack(blocks: Iterable[Block]) -> List[Group]:
    """Blocks summed per allocation stack, biggest first (ties: more blocks, lower id)."""
    sums: Dict[int, List[int]] = {}
    for b in blocks:
        s = sums.setdefault(b.stack, [0, 0])
        s[0] += b.size
        s[1] += 1
    groups = [Group(stack, n, count) for stack, (n, count) in sums.items()]
    groups.sort(key=lambda g: (-g.bytes, -g.blocks, g.stack))
    return groups


def unreadable_bytes(result: ScanResult) -> int:
    return sum(n for _what, _addr, n in result.unreadable)
