"""Synthetic process images in the mem-trace layout, version 7.

Written from docs/LAYOUT.md with its own struct formats and constants, not with
the decoder's, so a misreading of the contract in one does not hide in both.
"""

import struct
from collections import defaultdict

from mem_trace_gdb.layout import Inaccessible


class Image:
    """Sparse memory: separate mappings with unmapped gaps between them."""

    def __init__(self, base=0x5000_0000):
        self.maps = []  # [(start, bytearray)]
        self.next = base
        self.reads = []  # (addr, n) of every read, for tests on what was read

    def map(self, size, align=16):
        """A fresh zeroed mapping; a 64 KiB hole follows it so overreads fail."""
        addr = (self.next + align - 1) // align * align
        self.maps.append((addr, bytearray(size)))
        self.next = addr + max(size, 1) + 0x10000
        return addr

    def _find(self, addr, n):
        for start, buf in self.maps:
            if start <= addr and addr + n <= start + len(buf):
                return start, buf
        return None, None

    def write(self, addr, data):
        start, buf = self._find(addr, len(data))
        assert buf is not None, f"write outside mappings at {addr:#x}"
        buf[addr - start : addr - start + len(data)] = data

    def write_u64(self, addr, value):
        self.write(addr, struct.pack("<Q", value))

    def write_u32(self, addr, value):
        self.write(addr, struct.pack("<I", value))

    def map_at(self, addr, size):
        """A zeroed mapping at ``addr`` (a heap at a chosen place); it must overlap none."""
        assert addr % 16 == 0
        assert all(addr + size <= s or s + len(b) <= addr for s, b in self.maps)
        self.maps.append((addr, bytearray(size)))
        return addr

    def write_tag(self, key, q, size, thread=1, stack=0):
        """A live block tag for a block of ``size`` bytes at ``q`` (docs/LAYOUT.md "Block
        tags"): ``q ^ key``, then size, thread index and stack id in bits 0, 16 and 40."""
        self.write(q - 16, struct.pack("<QQ", q ^ key, size | thread << 16 | stack << 40))

    def regions(self):
        """Every mapping as heap memory, as InferiorReader.regions lists a process's."""
        from mem_trace_gdb.layout import Region
        return sorted((Region(s, s + len(b), True) for s, b in self.maps),
                      key=lambda r: r.start)

    def read(self, addr, n):
        self.reads.append((addr, n))
        start, buf = self._find(addr, n)
        if buf is None:
            raise Inaccessible(addr, n, detail="unmapped in the test image")
        return bytes(buf[addr - start : addr - start + n])


def shard_of(region):
    return ((region * 0x9E3779B97F4A7C15) % 2**64) >> 57


# The freed-block index's geometry as docs/LAYOUT.md gives it: 64-byte granules at level 0,
# each level 4 times the one below, 18 levels, the shard hash's multiplier.
INDEX_GRANULE_SHIFT = 6
INDEX_LEVEL_SHIFT = 2
INDEX_LEVELS = 18
INDEX_MULTIPLIER = 0x9E3779B97F4A7C15


def index_level(size):
    """The smallest level whose granule holds a block of ``size`` bytes."""
    size = min(size, 2**40 - 1)
    return next(l for l in range(INDEX_LEVELS)
                if size <= 1 << (INDEX_GRANULE_SHIFT + INDEX_LEVEL_SHIFT * l))


def index_bucket(addr, size, head_bits):
    """The chain head a block of ``size`` bytes at ``addr`` hangs from."""
    level = index_level(size)
    granule = addr >> (INDEX_GRANULE_SHIFT + INDEX_LEVEL_SHIFT * level)
    line = (((granule >> 3) * 32 + level) * INDEX_MULTIPLIER % 2**64) >> (67 - head_bits)
    return line * 8 + granule % 8


def index_link(k, capacity, next_plus_one):
    """Record k's link word: its lap in the high 24 bits, the next record plus one below."""
    return ((k // capacity) % 2**24) << 40 | next_plus_one


def tree_path(nodes, frames):
    """The node of ``frames``' innermost frame, made in ``nodes`` from the outermost frame
    in, sharing the nodes of a path already there."""
    parent = 0
    for pc in reversed(frames):
        try:
            parent = nodes.index((pc, parent)) + 1
        except ValueError:
            nodes.append((pc, parent))
            parent = len(nodes)
    return parent


class TraceBuilder:
    """Collects blocks, stacks and threads, then lays them out like the tracer."""

    def __init__(self, capacity=16):
        self.capacity = capacity
        self.blocks = []  # (addr, size, thread, seq, stack)
        self.tombstones = defaultdict(int)  # shard -> count
        self.stacks = []
        self.in_tree = set()  # stack ids whose records name their frames in the call tree
        self.threads = []
        self.next_seq = 1
        self.flags = 1
        self.untracked = 0
        self.version = 7
        # The block tags' key (0: no block is tagged).
        self.tag_key = 0
        # Profiler words of the header (docs/LAYOUT.md "Header").
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_seq = 0
        self.sample_mean = 0
        # Profile: None leaves header.profile at 0 (a build without the profiler).
        self.profile = None  # or {"resets": n, "started_ns": n, "reports": n}
        # Shared counter records: stack id -> (live_bytes, live_blocks, total_bytes,
        # total_blocks, peak_bytes, peak_blocks, last_seq), raw u64 words.
        self.counters = {}
        # Thread caches: thread index -> [(slot, stack id, the seven words as above)].
        self.caches = {}
        # Freed-block history: None leaves header.freed at 0.
        self.history_capacity = 8
        self.history_flags = 1  # bit 0: free stacks recorded
        self.frees = []  # (addr, size, thread, seq, stack, free_seq, free_stack, free_thread, flags)
        self.written = None  # None: len(self.frees)
        self.quarantine_limit = 0
        self.quarantined_bytes = 0
        self.errors = 0
        # The freed-block index: None leaves history.index at 0. insert_order: the order in
        # which the frees joined their chains, as indexes into frees (None: ring order);
        # disorder: None is what the writer would have measured.
        self.index_head_bits = None
        self.insert_order = None
        self.disorder = None

    def add_stack(self, frames):
        self.stacks.append(list(frames))
        return len(self.stacks)

    def add_tree_stack(self, frames):
        """A stack whose record names its frames in the call tree; stacks added this way
        share the nodes of their common outer frames, as the tracer's do."""
        stack_id = self.add_stack(frames)
        self.in_tree.add(stack_id)
        return stack_id

    def add_thread(self, tid, name="", exited=False, own_live=0, freed_elsewhere=0,
                   peak_bytes=0, allocated_bytes=0):
        self.threads.append((tid, 1 if exited else 0, name.encode(),
                             own_live, freed_elsewhere, peak_bytes, allocated_bytes))
        return len(self.threads)

    def add_counter(self, stack, live_bytes=0, live_blocks=0, total_bytes=0, total_blocks=0,
                    peak_bytes=0, peak_blocks=0, last_seq=1):
        """Stack ``stack``'s shared counter record (values are stored mod 2^64)."""
        self.counters[stack] = tuple(v % 2**64 for v in (
            live_bytes, live_blocks, total_bytes, total_blocks, peak_bytes, peak_blocks,
            last_seq))

    def add_cached(self, thread, stack, live_bytes=0, live_blocks=0, total_bytes=0,
                   total_blocks=0, peak_bytes=0, peak_blocks=0, last_seq=1, slot=None):
        """A record of thread ``thread``'s cache naming ``stack``: wrapping deltas, so
        negative values are stored as their two's complement."""
        self.caches.setdefault(thread, []).append((
            stack % 128 if slot is None else slot, stack,
            tuple(v % 2**64 for v in (live_bytes, live_blocks, total_bytes, total_blocks,
                                      peak_bytes, peak_blocks, last_seq))))

    def add_block(self, addr, size, thread=1, stack=0, seq=None):
        if seq is None:
            seq = self.next_seq
        self.next_seq = max(self.next_seq, seq + 1)
        self.blocks.append((addr, size, thread, seq, stack))
        return seq

    def add_freed(self, addr, size, thread=1, stack=0, seq=None, free_seq=None,
                  free_stack=0, free_thread=None, realloc=False):
        """A free, in ring order: the k-th call is record k (at index k % capacity)."""
        if seq is None:
            seq = self.next_seq
        if free_seq is None:
            free_seq = max(self.next_seq, seq + 1)
        self.next_seq = max(self.next_seq, seq + 1, free_seq + 1)
        self.frees.append((addr, size, thread, seq, stack, free_seq, free_stack,
                           thread if free_thread is None else free_thread, 1 if realloc else 0))
        return free_seq

    def add_tombstones(self, shard, n):
        self.tombstones[shard] += n

    @staticmethod
    def shard_for(addr, size):
        return 128 if size > 65536 else shard_of(addr >> 16)

    def build(self, image=None):
        """Lay everything out; returns (image, header address, {name: address})."""
        img = image or Image()
        where = {}
        header = img.map(160)
        where["header"] = header

        per_shard = defaultdict(list)
        for b in self.blocks:
            per_shard[self.shard_for(b[0], b[1])].append(b)

        shards = img.map(129 * 64)
        where["shards"] = shards
        for index in range(129):
            entries = per_shard.get(index, [])
            tomb = self.tombstones.get(index, 0)
            if not entries and not tomb:
                continue
            cap = self.capacity
            while cap < 2 * (len(entries) + tomb):
                cap *= 2
            array = img.map(16 + 24 * cap)
            where[f"array{index}"] = array
            img.write_u64(array, cap)
            used = set()

            def place(addr_word, w1, w2):
                pos = (addr_word * 0x9E3779B97F4A7C15 % 2**64) >> 40 & (cap - 1)
                while pos in used:
                    pos = (pos + 1) & (cap - 1)
                used.add(pos)
                img.write(array + 16 + 24 * pos, struct.pack("<QQQ", addr_word, w1, w2))

            live_bytes = 0
            for addr, size, thread, seq, stack in entries:
                place(addr, min(size, 2**40 - 1) | thread << 40, seq | stack << 40)
                live_bytes += size
            for k in range(tomb):
                # Tombstones keep stale fields that must be ignored.
                place(1, 0xFFFF | 5 << 40, 77 | 3 << 40)
            img.write(
                shards + 64 * index,
                struct.pack("<IIQQQQ", 0, 0, array, len(entries), tomb, live_bytes),
            )

        nodes = []  # the call tree: (pc, parent), node k at index k - 1
        stacks = img.map(16 + 8 * 256)
        where["stacks"] = stacks
        img.write(stacks, struct.pack("<QII", len(self.stacks), 16, 256))
        if self.stacks:
            chunk = img.map(8 * 65536)
            img.write_u64(stacks + 16, chunk)
            for i, frames in enumerate(self.stacks, start=1):
                if i in self.in_tree:
                    rec = img.map(16, align=8)
                    node = tree_path(nodes, frames)
                    img.write(rec, struct.pack("<QQ", (1 << 63) | len(frames), node))
                else:
                    rec = img.map(8 + 8 * len(frames), align=8)
                    img.write(rec, struct.pack(f"<Q{len(frames)}Q", len(frames), *frames))
                img.write_u64(chunk + 8 * i, rec)
                where[f"stack{i}"] = rec
        tree = img.map(16 + 8 * 256)
        where["tree"] = tree
        img.write(tree, struct.pack("<QII", len(nodes), 16, 256))
        if nodes:
            chunk = img.map(16 * 65536)
            img.write_u64(tree + 16, chunk)
            for k, (pc, parent) in enumerate(nodes, start=1):
                img.write(chunk + 16 * k, struct.pack("<QQ", pc, parent))
                where[f"node{k}"] = chunk + 16 * k

        threads = img.map(16 + 8 * 4096)
        where["threads"] = threads
        img.write(threads, struct.pack("<QII", len(self.threads), 12, 4096))
        if self.threads:
            # Thread record: 64 bytes; the last five words are the profiler's.
            chunk = img.map(64 * 4096)
            img.write_u64(threads + 16, chunk)
            for i, (tid, flags, name, own, elsewhere, peak, allocated) in enumerate(
                    self.threads, start=1):
                cache = 0
                if i in self.caches:
                    cache = img.map(64 * 128)
                    where[f"cache{i}"] = cache
                    for slot, stack, words in self.caches[i]:
                        img.write(cache + 64 * slot,
                                  struct.pack("<7QII", *words, 0, stack + 1))
                img.write(chunk + 64 * i, struct.pack(
                    "<II16sQQQQQ", tid, flags, name[:16], cache, own, elsewhere, peak,
                    allocated))

        profile = 0
        if self.profile is not None:
            # Profile: 64-byte head, then a directory of 4096 chunk pointers.
            profile = img.map(64 + 8 * 4096)
            where["profile"] = profile
            img.write(profile, struct.pack(
                "<IIIIQQQ24x", 64, 12, 4096, 0, self.profile.get("started_ns", 0),
                self.profile.get("resets", 0), self.profile.get("reports", 0)))
            chunks = {}
            for stack, words in sorted(self.counters.items()):
                k = stack >> 12
                if k not in chunks:
                    chunks[k] = img.map(64 * 4096)
                    img.write_u64(profile + 64 + 8 * k, chunks[k])
                img.write(chunks[k] + 64 * (stack & 4095), struct.pack("<7QII", *words, 0, 0))

        freed = 0
        if self.history_capacity is not None:
            freed = img.map(64)
            where["freed"] = freed
            cap = self.history_capacity
            ring = 0
            if self.frees and cap:
                ring = img.map(40 * cap, align=8)
                where["ring"] = ring
                for k, (addr, size, thread, seq, stack, fseq, fstack, fthread, fflags) in enumerate(self.frees):
                    img.write(ring + 40 * (k % cap), struct.pack(
                        "<QQQQII", addr, min(size, 2**40 - 1) | thread << 40, seq | stack << 40,
                        fseq | fstack << 40, fthread, fflags))
            index = 0
            if ring and self.index_head_bits is not None:
                index = self.lay_out_index(img, where, cap)
            written = len(self.frees) if self.written is None else self.written
            img.write(freed, struct.pack(
                "<IIQQQQQQQ", 40, self.history_flags, cap, ring, written,
                self.quarantine_limit, self.quarantined_bytes, self.errors, index))

        img.write(
            header,
            struct.pack(
                "<8sIIIIII16Q",
                b"MEMTRACE", self.version, 160, 24, 64, 129, 16,
                shards, stacks, threads, freed, self.next_seq, self.live_bytes, self.flags,
                self.untracked, profile, self.peak_bytes, self.peak_seq, tree,
                self.sample_mean, self.tag_key, 0, 0,
            ),
        )
        return img, header, where

    def lay_out_index(self, img, where, cap):
        """The freed-block index over the ring: each free joins the chain of its level's
        granule in ``insert_order``, its link written before the head names it."""
        bits = self.index_head_bits
        index = img.map(64)
        heads = img.map(8 << bits, align=8)
        links = img.map(8 * cap, align=8)
        where.update(index=index, heads=heads, links=links)
        head = [0] * (1 << bits)
        claimed = disorder = 0
        order = range(len(self.frees)) if self.insert_order is None else self.insert_order
        for k in order:
            addr, size = self.frees[k][0], self.frees[k][1]
            b = index_bucket(addr, size, bits)
            img.write_u64(links + 8 * (k % cap), index_link(k, cap, head[b]))
            head[b] = k + 1
            # At least every record that joined a chain before was claimed by then.
            claimed = max(claimed, k + 1)
            disorder = max(disorder, claimed - k)
        img.write(heads, struct.pack(f"<{len(head)}Q", *head))
        img.write(index, struct.pack(
            "<IIIIQQQQ16x", INDEX_GRANULE_SHIFT, INDEX_LEVEL_SHIFT, INDEX_LEVELS, bits,
            INDEX_MULTIPLIER, heads, links, disorder if self.disorder is None else self.disorder))
        return index
