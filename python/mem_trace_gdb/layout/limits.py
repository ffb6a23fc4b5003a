"""The reader's limits: caps on untrusted values, read sizes, the default gap.

Not part of the contract: the tracer never writes these. They bound what a
corrupt or foreign image can make the reader do.
"""

from .contract import FIELD_BITS

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
# MEM_TRACE_FREED accepts at most 2^26 records (crates/core/src/config.rs); sequence numbers
# are 40 bits, so more frees than 2^40 cannot have been written.
MAX_HISTORY_CAPACITY = 1 << 26
MAX_WRITTEN = 1 << FIELD_BITS
# The ring is read in one read up to this many records (40 MiB; the default ring,
# 65536 records, is 2.5 MiB), in reads of this size beyond: as Python lists, a
# full 2^26-record ring would take gigabytes of gdb's memory.
RING_CHUNK = 1 << 20
# An index walk reads links and records this many at a time (2 KiB of links, 10 KiB of
# records), and keeps up to INDEX_CHUNKS_KEPT such reads (40 MiB of records) per Tracer.
INDEX_CHUNK = 256
INDEX_CHUNKS_KEPT = 4096

# How far from a block an address may be and still be reported as "N bytes
# after/before" it. Overflows and underflows land within a few elements of the
# block; 4 KiB also covers a misplaced struct-sized stride without attributing
# arbitrary addresses to an unrelated neighbour.
DEFAULT_MAX_GAP = 4096
