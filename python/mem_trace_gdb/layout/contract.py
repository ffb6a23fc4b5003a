"""The layout contract, version 7 (docs/LAYOUT.md): sizes, bit fields, flags, struct formats.

What the tracer writes and this reader must agree on, byte for byte. A change here
is a change to docs/LAYOUT.md and to the tracer (crates/format), and bumps
LAYOUT_VERSION.
"""

from __future__ import annotations

import struct
from typing import List

LAYOUT_VERSION = 7
MAGIC = b"MEMTRACE"

HEADER_SIZE = 160
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
# A stack record whose first word has this bit names its frames in the call tree: the low 8
# bits are the frame count, the next word the node of the innermost frame.
STACK_IN_TREE = 1 << 63
CALL_TREE_HEADER = 16
TREE_CHUNK_BITS = 16
TREE_CHUNKS = 256
TREE_NODE_SIZE = 16
# A stack's last frame equal to this means it was cut: the cap on distinct stacks
# (MEM_TRACE_MAX_STACKS) was reached, and only the frames before it are the stack's.
CUT_MARKER = 0xFFFF_FFFF_FFFF_FFFE
THREAD_TABLE_HEADER = 16
THREAD_CHUNK_BITS = 12
THREAD_CHUNKS = 4096
THREAD_RECORD_SIZE = 64
HISTORY_HEADER_SIZE = 64
FREED_RECORD_SIZE = 40
FREED_RECORD_WORDS = FREED_RECORD_SIZE // 8
# The freed-block index (at history.index, large rings only): its header's size, and the
# split of a link word: the next record number plus one below, the owner's lap above.
FREED_INDEX_SIZE = 64
INDEX_NEXT_BITS = 40
INDEX_LAP_MASK = (1 << (64 - INDEX_NEXT_BITS)) - 1
# A key's level takes 5 bits: at most 32 levels.
INDEX_MAX_LEVELS = 32

# Profile (profiler builds, at header.profile).
PROFILE_HEADER = 64
COUNTER_SIZE = 64
COUNTER_WORDS = COUNTER_SIZE // 8
COUNTER_CHUNK_BITS = 12
COUNTER_CHUNKS = 4096
# Records in a thread's cache of counter deltas (thread record's `counters`).
COUNTER_CACHE = 128

MASK64 = (1 << 64) - 1
FIELD_BITS = 40
FIELD_MASK = (1 << FIELD_BITS) - 1
SIZE_SATURATED = FIELD_MASK
SLOT_EMPTY = 0
SLOT_TOMBSTONE = 1

FLAG_INITIALISED = 1 << 0
FLAG_PROFILER = 1 << 1
FLAG_FREE_STACKS = 1 << 2
FLAG_PROFILE_MODE = 1 << 3
# Started in a running process by `mem-trace attach`: blocks from before it are unknown.
FLAG_ATTACHED = 1 << 4
# Tags are 32 bytes and carry the block's sequence number at q - 24 (debug mode).
FLAG_TAG_SEQ = 1 << 5

THREAD_EXITED = 1 << 0

# Block tags (version 6, "Block tags"): a small block is in no table; the 16 bytes before
# it hold `q ^ tag_key`, then size (bits 0..16), thread index (16..40) and stack id
# (40..64); with FLAG_TAG_SEQ the word at q - 24 is its sequence number (32-byte tags).
# Tagged blocks are under TAG_MAX_SIZE bytes.
TAG_SIZE = 16
TAG_MAX_SIZE = 1 << 16
# Freed tags (version 7, "Freed tags"): a long tag whose block was freed and is still held
# by the tracer has `~(q ^ tag_key)` at q - 16; q - 32 holds the free's sequence number and
# stack (as a freed record's free_seq_stack), q - 24 the block's sequence number (bits
# 0..40) and the freeing thread's index (40..64); q - 8 is unchanged.
SEQ_TAG_SIZE = 32
# The `seq` of a block whose tag has none (the table's numbers start at 1).
NO_SEQ = 0

HISTORY_FLAG_FREE_STACKS = 1 << 0
FREED_BY_REALLOC = 1 << 0

# The records' byte formats, little-endian (the tables in docs/LAYOUT.md).
# magic, version, header_size, slot_size, shard_size, shard_count, region_shift, shards,
# stacks, threads, freed, next_seq, live_bytes, flags, untracked, profile, peak_bytes,
# peak_seq, tree, sample_mean, tag_key, attached_at, reserved.
HEADER_STRUCT = struct.Struct("<8sIIIIII QQQQ QQQQ QQQ Q QQQ 8x")
SHARD_STRUCT = struct.Struct("<II QQQQ 24x")
DIRECTORY_HEADER_STRUCT = struct.Struct("<QII")
# tid, flags, name, counters, own_live, freed_elsewhere, peak_bytes, allocated_bytes.
THREAD_STRUCT = struct.Struct("<II16s QQQQQ")
# counter_size, chunk_bits, chunks, flags, started_ns, resets, reports, reserved.
PROFILE_STRUCT = struct.Struct("<IIII QQQ 24x")
# record_size, flags, capacity, records, written, quarantine_limit, quarantined_bytes, errors,
# index.
HISTORY_STRUCT = struct.Struct("<II QQQ QQQ Q")
# granule_shift, level_shift, levels, head_bits, multiplier, heads, links, disorder, reserved.
FREED_INDEX_STRUCT = struct.Struct("<IIII QQQQ 16x")


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
