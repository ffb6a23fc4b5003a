"""The leak scan of `mtrace-leaks`: which live blocks can the program still reach?

Pure Python over a memory reader (no gdb), so the unit tests run it on synthetic
images. The gdb side (commands/leaks.py) finds the roots; this follows pointers.

It is the conservative mark phase of memcheck, classifying blocks exactly as the
in-process leak check of the profiler build does (its exit report), so that the
same program gets the same answer from gdb, live or on a core, as at its exit:

* roots are memory ranges (writable data of the loaded objects, every thread's
  stack from its stack pointer up) and loose words (every thread's registers);
* any 8-byte-aligned word whose value points into a live block reaches that
  block: a pointer to its start passes the reach of the memory it was found in
  on to the block, a pointer into its middle (an interior pointer) at most
  "possibly". A block reached from the roots through a chain of pointers to
  block starts is *still reachable*; one reached only through some interior
  pointer is *possibly lost* (as is a block whose start is pointed at only from
  possibly lost blocks); one not reached at all is *definitely lost*. A reached
  block's own words are scanned in turn, at its level, until nothing rises any
  more.
* Definitely lost splits as memcheck's cliques do: in address order, each lost
  block not yet reached from another leads a clique, and every lost block its
  memory reaches (through any pointer, transitively) is *indirectly* lost, an
  earlier leader included; the rest are *directly* lost, the blocks to fix.
* Why interior pointers do not make a block reachable, as LeakSanitizer's rule
  would: glibc's own bookkeeping points into the last 8 bytes of blocks. It
  puts a chunk's 16-byte header right after the previous chunk's usable bytes,
  and its bins and `top` (in libc's data, a root) point at free chunks'
  headers; counting such a pointer as reaching would call reachable a leaked
  block just before a free chunk (the profiler's reference fixture,
  tests/fixtures/profile_sites.c, has one).
* Why a pointer to where glibc's next chunk header starts does not count at
  all, not even as "possibly" (:func:`glibc_next_header`): glibc's chunk for n
  bytes is n + 8 rounded up to 16, at least 32, the block 16 bytes into it, so
  the next header lies inside the block only when n is 1 to 8 more than a
  multiple of 16 (n > 16): +992 of a 1000-byte block, +96 of a 100-byte one;
  a 16-byte block has none (8 bytes into it is a real interior pointer).
  Without the exception, a leaked block followed by a free chunk (or glibc's
  top chunk) would be "possibly lost". memcheck and LSan replace
  the allocator, so their scans never see glibc's bookkeeping; mem-trace runs
  over glibc's malloc and must discount it. A real pointer to exactly that spot
  is rare, and the block's owner holds its start anyway.

The rules are those of crates/core/src/profile/leaks.rs (the in-process check);
a change to one must be made to the other. Only the roots differ: gdb reads
every thread's registers and stack from its stack pointer up; the process
itself reads its threads' whole stacks and static TLS, and no registers.

Speed, because a process holds millions of words: memory is read in large
chunks, decoded with `memoryview.cast("Q")`, deduplicated with `set()` (a
block full of equal bytes is one value), filtered by the heap's address range,
and only the survivors are looked up, by bisection on the sorted block starts.
The scan runs in two passes, each reading a block at most once: first the
closure of the roots under pointers to block starts (the still reachable
blocks), collecting the interior pointers met on the way; then, from the
blocks those hit, the closure under any pointer (the possibly lost ones). Each
round of a pass reads every newly reached block, neighbours merged into one
read.
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


def glibc_next_header(size: int):
    """Offset from a block's start of glibc's next chunk header when it lies inside the
    block, else None (leaks/mod.rs's ``glibc_next_header``)."""
    at = max(32, (size + 8 + 15) & ~15) - 16
    return at if at < size else None


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


# Reach levels, also the classes (the values of leaks.rs's).
LOST = 0
POSSIBLY = 1
REACHABLE = 2


@dataclass
class ScanResult:
    """Each block's class (``levels[i]`` of ``blocks[i]``: LOST, POSSIBLY or REACHABLE), and
    what could not be scanned."""

    blocks: Sequence[Block]
    levels: List[int]
    # Indexes of the definitely lost blocks that are indirectly lost.
    indirect: Set[int] = field(default_factory=set)
    # Bytes of roots scanned, and of roots (or reached blocks) that could not be read.
    root_bytes: int = 0
    unreadable: List[Tuple[str, int, int]] = field(default_factory=list)

    def of_class(self, level: int) -> List[Block]:
        return [b for b, lv in zip(self.blocks, self.levels) if lv == level]

    def lost(self) -> List[Block]:
        """Definitely lost: no pointer to them from the roots or any reached block."""
        return self.of_class(LOST)

    def indirectly_lost(self) -> List[Block]:
        """The definitely lost blocks some other definitely lost block points to."""
        return [b for i, b in enumerate(self.blocks) if i in self.indirect]

    def possibly_lost(self) -> List[Block]:
        """Reached, but only through some interior pointer."""
        return self.of_class(POSSIBLY)

    def reachable(self) -> List[Block]:
        """Still reachable: through a chain of pointers to block starts from the roots."""
        return self.of_class(REACHABLE)


def _words(data) -> Sequence[int]:
    """The bytes as little-endian u64s (trailing bytes that make no word are dropped)."""
    usable = len(data) - len(data) % 8
    if sys.byteorder == "little":
        return memoryview(data)[:usable].cast("Q")
    import struct

    return struct.unpack(f"<{usable // 8}Q", data[:usable])


class Heap:
    """Live blocks sorted by start, for "which block does this value point into"."""

    def __init__(self, blocks: Iterable[Block]):
        self.blocks: List[Block] = sorted(blocks, key=lambda b: b.addr)
        self.starts = [b.addr for b in self.blocks]
        self.ends = [b.addr + b.size for b in self.blocks]
        self.headers = [glibc_next_header(b.size) for b in self.blocks]
        self.lo = self.starts[0] if self.starts else 0
        # The end of the last block (blocks do not overlap). As in leaks.rs, a value equal to
        # it is not looked up, even when the last block is zero-size and starts there.
        self.hi = self.ends[-1] if self.ends else 0

    def hits(self, values: Iterable[int], exempt: bool = True) -> Tuple[Set[int], Set[int]]:
        """Indexes of the blocks ``values`` (a set, ideally) point to the start of, and of
        those they point into only elsewhere (interior pointers). A value where glibc's next
        chunk header lies inside a block is neither (see the module documentation),
        unless ``exempt`` is off (the values come from a lost block, not glibc's data)."""
        lo, hi, starts, ends, headers = self.lo, self.hi, self.starts, self.ends, self.headers
        at_start: Set[int] = set()
        inside: Set[int] = set()
        for v in values:
            if v < lo or v >= hi:
                continue
            # Blocks do not overlap, so only the last one starting at or below v can hold
            # it; a zero-size block holds its start only.
            i = bisect_right(starts, v) - 1
            if v == starts[i]:
                at_start.add(i)
            elif v < ends[i] and (not exempt or v - starts[i] != headers[i]):
                inside.add(i)
        return at_start, inside


# A glibc thread control block lies this close to the end of its thread's stack mapping.
TCB_WINDOW = 16 << 10


def dtv_words(reader: Reader, mappings: Iterable[Tuple[int, int]],
              blocks: Sequence[Block]) -> List[int]:
    """The start of the dynamic thread vector (DTV) of every glibc thread whose control block
    ends one of ``mappings`` (anonymous memory without live blocks), live threads' and those
    of exited threads whose stacks glibc keeps for reuse: loose words of the roots (leaks/
    roots.rs's ``dtv_words``). glibc allocates a thread's DTV with malloc and points at it
    only from the control block, 16 bytes in (``tcbhead_t.dtv`` is ``dtv + 1``; ``tcb`` and
    ``self``, at 0 and 16, point at the control block itself, 64-byte aligned); LSan treats
    the DTV as reachable from there, and so does this scan."""
    starts = sorted(b.addr for b in blocks)
    words: List[int] = []
    for start, end in mappings:
        if end <= start:
            continue
        i = bisect_right(starts, start - 1)
        if i < len(starts) and starts[i] < end:
            continue
        lo = max(start, end - TCB_WINDOW)
        try:
            tail = _words(reader.read(lo, end - lo))
        except MemTraceError:
            continue
        for k in range(0, len(tail) - 2):
            p = lo + 8 * k
            if p % 64 == 0 and tail[k] == p and tail[k + 2] == p and tail[k + 1] >= 16:
                words.append(tail[k + 1] - 16)
    return words


def _aligned(start: int, end: int) -> Tuple[int, int]:
    """[start, end) shrunk to whole aligned words."""
    return (start + 7) & ~7, end & ~7


def _read_range(reader: Reader, start: int, end: int, what: str,
                unreadable: List[Tuple[str, int, int]]) -> Iterable[bytes]:
    """The bytes of an aligned range in CHUNK reads; an unreadable chunk is retried page by
    page, and what stays unreadable is noted, not fatal: a core may lack some pages.

    A range lies in one mapping: what a (scribbled) block size claims past the end of the
    one holding its start is noted unreadable at once, when the reader can tell, rather
    than retried page by page over a terabyte."""
    extent = getattr(reader, "extent", None)
    have = extent(start, end - start) if extent is not None else None
    if have is not None:
        unreadable.append((what, start + have, end - start - have))
        end = start + have
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
    """Classify every live block by its reach from ``roots`` and ``registers`` (see the
    module documentation); ``blocks`` are the live blocks of the tracer's table.

    The same fixpoint as leaks.rs's worklist (a block's level is the highest any pointer to
    it gives: the level of the memory holding a pointer to its start, at most POSSIBLY for
    an interior one), computed in two passes so that each block is read once: the still
    reachable blocks are exactly those reached from the roots through start pointers only;
    the possibly lost ones, the others reached from there by any chain of pointers that
    goes through an interior pointer."""
    heap = Heap(blocks)
    levels = [LOST] * len(heap.blocks)
    result = ScanResult(blocks=heap.blocks, levels=levels)
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

    # Pass 1: still reachable. Interior pointers met are kept for pass 2.
    frontier, interior = heap.hits(values)
    while frontier:
        for i in frontier:
            levels[i] = REACHABLE
        at_start, inside = heap.hits(_contents(reader, heap, frontier, result.unreadable))
        interior |= inside
        frontier = {i for i in at_start if levels[i] == LOST}

    # Pass 2: possibly lost, from the blocks only interior pointers of reachable memory
    # hit, through any pointer.
    frontier = {i for i in interior if levels[i] == LOST}
    while frontier:
        for i in frontier:
            levels[i] = POSSIBLY
        at_start, inside = heap.hits(_contents(reader, heap, frontier, result.unreadable))
        frontier = {i for i in at_start | inside if levels[i] == LOST}

    _cliques(reader, heap, result)
    return result


def _cliques(reader: Reader, heap: Heap, result: ScanResult) -> None:
    """Marks the indirectly lost blocks (see the module documentation; leaks/scan.rs's
    ``cliques``). Unreadable lost blocks are not noted: they hide nothing reachable."""
    levels, indirect = result.levels, result.indirect
    ignored: List[Tuple[str, int, int]] = []
    for leader in range(len(heap.blocks)):
        if levels[leader] != LOST or leader in indirect:
            continue
        frontier = {leader}
        while frontier:
            at_start, inside = heap.hits(_contents(reader, heap, frontier, ignored), exempt=False)
            frontier = {i for i in at_start | inside
                        if levels[i] == LOST and i not in indirect and i != leader}
            indirect |= frontier


def _contents(reader: Reader, heap: Heap, indexes: Iterable[int],
              unreadable: List[Tuple[str, int, int]]) -> Set[int]:
    """The distinct words of the blocks at ``indexes``."""
    values: Set[int] = set()
    for data in _block_contents(reader, heap, sorted(indexes), unreadable):
        values.update(data)
    return values


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
    """Blocks of one allocation stack, in one class (definitely lost, possibly lost or
    still reachable)."""

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
