"""Decoder for the mem-trace memory layout, version 6 (docs/LAYOUT.md).

This package is the out-of-process half of the layout contract. It never imports
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
  last ``capacity`` frees shared by all threads. A small ring (the default) is
  not indexed by address: :meth:`Tracer.freed_blocks_containing` reads its used
  part in one read and scans it as columns of u64s (262144 records in about
  0.1 s). A large one (``MEM_TRACE_FREED`` of a million and more) has an
  address index (``history.index``): chains of records per granule of memory at
  a few levels of granule size, so the records containing ``a`` are on the
  chains of ``a``'s granule and the one before at each level, and only those
  are walked;
* a small block (``header.tag_key`` not 0) is in no table: a 16-byte tag in
  front of it names it (32 bytes with its sequence number under
  ``FLAG_TAG_SEQ``, debug mode), found by a backward scan of at
  most 64 KiB from the address and enumerated by a scan of the heap mappings
  (`tags`, :meth:`Tracer.tagged_blocks`);
* profiler builds add per-stack counters (``header.profile``): a stack's counts
  are its shared record plus every thread's cache record naming it, summed
  with wrapping arithmetic (:meth:`Tracer.stack_counts`), and what it held at
  the global peak follows the at-peak rule (:meth:`Counter.at_peak`).

Everything read from the process is untrusted: a core taken mid-update, a stray
write, or a different build can leave any bytes there. Every count and size is
checked against a cap before it drives a read or a loop, and every failure is one
of the typed errors below, never another exception.

The modules, by job: `contract` (the constants, struct formats and shard hash of
docs/LAYOUT.md), `limits` (the reader's caps on untrusted values), `errors` (the
typed errors), `records` (the decoded dataclasses and bit-field splits), `tags`
(tagged blocks) and `tracer` (the `Tracer` that reads a process). Every public name
is re-exported here: import from `mem_trace_gdb.layout`, not from the modules.
"""

from .contract import (
    COUNTER_CACHE,
    CUT_MARKER,
    COUNTER_CHUNK_BITS,
    COUNTER_CHUNKS,
    COUNTER_SIZE,
    COUNTER_WORDS,
    DIRECTORY_HEADER_STRUCT,
    FIELD_BITS,
    FIELD_MASK,
    FLAG_ATTACHED,
    FLAG_FREE_STACKS,
    FLAG_INITIALISED,
    FLAG_PROFILE_MODE,
    FLAG_PROFILER,
    FLAG_TAG_SEQ,
    FREED_BY_REALLOC,
    FREED_INDEX_SIZE,
    FREED_INDEX_STRUCT,
    FREED_RECORD_SIZE,
    FREED_RECORD_WORDS,
    HEADER_SIZE,
    HEADER_STRUCT,
    HISTORY_FLAG_FREE_STACKS,
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
    REGION_SHARD_BITS,
    REGION_SHARDS,
    REGION_SHIFT,
    REGION_SIZE,
    SHARD_COUNT,
    SHARD_HASH,
    SHARD_SIZE,
    SHARD_STRUCT,
    SIZE_SATURATED,
    SLOT_ARRAY_HEADER,
    SLOT_EMPTY,
    SLOT_SIZE,
    SLOT_TOMBSTONE,
    NO_SEQ,
    TAG_MAX_SIZE,
    TAG_SIZE,
    STACK_CHUNK_BITS,
    STACK_CHUNKS,
    STACK_STORE_HEADER,
    THREAD_CHUNK_BITS,
    THREAD_CHUNKS,
    THREAD_EXITED,
    THREAD_RECORD_SIZE,
    THREAD_STRUCT,
    THREAD_TABLE_HEADER,
    candidate_shards,
    shard_of,
)
from .errors import BadMagic, Corrupt, Inaccessible, MemTraceError, NotLoaded, VersionMismatch
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
    SUM_LINE,
    Totals,
    checked_sum,
    decode_counter,
    decode_freed,
    decode_slot,
    signed64,
)
from .tags import Region, Scanned
from .tracer import MemoryReader, Tracer

__all__ = [
    # contract
    "COUNTER_CACHE",
    "CUT_MARKER",
    "COUNTER_CHUNK_BITS",
    "COUNTER_CHUNKS",
    "COUNTER_SIZE",
    "COUNTER_WORDS",
    "DIRECTORY_HEADER_STRUCT",
    "FIELD_BITS",
    "FIELD_MASK",
    "FLAG_ATTACHED",
    "FLAG_FREE_STACKS",
    "FLAG_INITIALISED",
    "FLAG_PROFILE_MODE",
    "FLAG_TAG_SEQ",
    "FLAG_PROFILER",
    "FREED_BY_REALLOC",
    "FREED_INDEX_SIZE",
    "FREED_INDEX_STRUCT",
    "FREED_RECORD_SIZE",
    "FREED_RECORD_WORDS",
    "HEADER_SIZE",
    "HEADER_STRUCT",
    "HISTORY_FLAG_FREE_STACKS",
    "HISTORY_HEADER_SIZE",
    "HISTORY_STRUCT",
    "INDEX_LAP_MASK",
    "INDEX_MAX_LEVELS",
    "INDEX_NEXT_BITS",
    "LARGE_SHARD",
    "LAYOUT_VERSION",
    "MAGIC",
    "MASK64",
    "PROFILE_HEADER",
    "PROFILE_STRUCT",
    "REGION_SHARD_BITS",
    "REGION_SHARDS",
    "REGION_SHIFT",
    "REGION_SIZE",
    "SHARD_COUNT",
    "SHARD_HASH",
    "SHARD_SIZE",
    "SHARD_STRUCT",
    "SIZE_SATURATED",
    "SLOT_ARRAY_HEADER",
    "SLOT_EMPTY",
    "SLOT_SIZE",
    "SLOT_TOMBSTONE",
    "NO_SEQ",
    "TAG_MAX_SIZE",
    "TAG_SIZE",
    "STACK_CHUNK_BITS",
    "STACK_CHUNKS",
    "STACK_STORE_HEADER",
    "THREAD_CHUNK_BITS",
    "THREAD_CHUNKS",
    "THREAD_EXITED",
    "THREAD_RECORD_SIZE",
    "THREAD_STRUCT",
    "THREAD_TABLE_HEADER",
    "candidate_shards",
    "shard_of",
    # errors
    "BadMagic",
    "Corrupt",
    "Inaccessible",
    "MemTraceError",
    "NotLoaded",
    "VersionMismatch",
    # limits
    "DEFAULT_MAX_GAP",
    "INDEX_CHUNK",
    "INDEX_CHUNKS_KEPT",
    "MAX_CAPACITY",
    "MAX_FRAMES",
    "MAX_HISTORY_CAPACITY",
    "MAX_LIVE",
    "MAX_STACK_ID",
    "MAX_THREAD_INDEX",
    "MAX_WRITTEN",
    "RING_CHUNK",
    # records
    "Block",
    "Counter",
    "Counts",
    "Event",
    "FreedBlock",
    "FreedIndex",
    "Header",
    "History",
    "Match",
    "Profile",
    "Shard",
    "Stack",
    "Thread",
    "SUM_LINE",
    "Totals",
    "checked_sum",
    "decode_counter",
    "decode_freed",
    "decode_slot",
    "signed64",
    # tags
    "Region",
    "Scanned",
    # tracer
    "MemoryReader",
    "Tracer",
]
