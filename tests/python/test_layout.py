"""Tests of the pure layout decoder against synthetic images (no gdb needed).

Run from the repository root: python3 -m unittest discover -s tests/python -v
"""

import os
import random
import struct
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from mem_trace_gdb import layout  # noqa: E402
from mem_trace_gdb.layout import (  # noqa: E402
    BadMagic,
    Corrupt,
    Inaccessible,
    MemTraceError,
    NotLoaded,
    Tracer,
    VersionMismatch,
)
from image import Image, TraceBuilder, shard_of  # noqa: E402

# Heap-like addresses: a small-block area and a large block far away.
HEAP = 0x5555_5555_A000
BIG = 0x7FFF_F000_0000


def region_start_in_other_shard(base):
    """A region start r*64K above base, and shard_of(r) != shard_of(r-1)."""
    r = (base >> 16) + 1
    while shard_of(r) == shard_of(r - 1):
        r += 1
    return r << 16


def _extent(img, addr, n):
    """What InferiorReader.extent answers, over a test image."""
    for start, buf in img.maps:
        end = start + len(buf)
        if start <= addr < end:
            return None if addr + n <= end else end - addr
    return 0


class Fixture(unittest.TestCase):
    def build(self, builder):
        self.img, self.header_addr, self.where = builder.build()
        return Tracer.open(self.img, self.header_addr)

    def standard(self):
        b = TraceBuilder()
        self.t_main = b.add_thread(4242, "prog")
        self.t_worker = b.add_thread(4243, "worker-with-a-long-name", exited=True)
        self.s1 = b.add_stack([0x5555_5555_516D, 0x5555_5555_5200, 0x7FFF_F7DF_0D90])
        self.s2 = b.add_stack([0x5555_5555_5300])
        b.add_block(HEAP + 0x2A0, 100, thread=self.t_main, stack=self.s1, seq=1234)
        b.add_block(HEAP + 0x310, 32, thread=self.t_worker, stack=self.s2, seq=1235)
        b.add_block(BIG, 1 << 20, thread=self.t_main, stack=self.s2, seq=7)
        b.add_tombstones(shard_of(HEAP >> 16), 3)
        b.untracked = 2
        return self.build(b)


class HeaderTests(Fixture):
    def test_header_fields(self):
        t = self.standard()
        h = t.header
        self.assertEqual(h.version, 7)
        self.assertEqual(h.address, self.header_addr)
        self.assertEqual(h.shards, self.where["shards"])
        self.assertEqual(h.stacks, self.where["stacks"])
        self.assertEqual(h.threads, self.where["threads"])
        self.assertEqual(h.freed, self.where["freed"])
        self.assertEqual(h.next_seq, 1236)
        self.assertTrue(h.initialised)
        self.assertFalse(h.profiler)
        self.assertEqual(h.untracked, 2)

    def test_totals(self):
        tot = self.standard().totals()
        self.assertEqual(tot.live_blocks, 3)
        self.assertEqual(tot.live_bytes, 100 + 32 + (1 << 20))
        self.assertEqual(tot.tombstones, 3)
        self.assertEqual(tot.stacks, 2)
        self.assertEqual(tot.threads, 2)
        self.assertEqual(tot.untracked, 2)

    def test_blocks_lists_live_only(self):
        t = self.standard()
        got = sorted((b.addr, b.size, b.seq) for b in t.blocks())
        self.assertEqual(got, [(HEAP + 0x2A0, 100, 1234), (HEAP + 0x310, 32, 1235), (BIG, 1 << 20, 7)])

    def test_uninitialised_header_is_empty(self):
        img = Image()
        h = img.map(160)
        # Version 7: shards, stacks, threads, freed, next_seq, live_bytes, flags, untracked,
        # profile, peak_bytes, peak_seq, tree, sample_mean, tag_key, attached_at, reserved.
        img.write(h, struct.pack("<8sIIIIII16Q", b"MEMTRACE", 7, 160, 24, 64, 129, 16,
                                 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
        t = Tracer.open(img, h)
        self.assertIsNone(t.find_block(HEAP))
        self.assertEqual(t.totals().live_blocks, 0)
        self.assertIsNone(t.stack(1))
        self.assertIsNone(t.thread(1))
        self.assertIsNone(t.history_header())
        self.assertEqual(t.freed_blocks_containing(HEAP), [])
        self.assertEqual(t.history(HEAP), [])
        self.assertIsNone(t.profile())
        self.assertEqual(t.stack_counts(), {})
        self.assertEqual(t.threads(), [])


class FindBlockTests(Fixture):
    def test_exact_start(self):
        m = self.standard().find_block(HEAP + 0x2A0)
        self.assertEqual((m.relation, m.offset, m.block.addr, m.block.size), ("inside", 0, HEAP + 0x2A0, 100))
        self.assertEqual((m.block.thread, m.block.seq, m.block.stack), (self.t_main, 1234, self.s1))

    def test_interior_and_last_byte(self):
        t = self.standard()
        m = t.find_block(HEAP + 0x2A0 + 37)
        self.assertEqual((m.relation, m.offset), ("inside", 37))
        m = t.find_block(HEAP + 0x2A0 + 99)
        self.assertEqual((m.relation, m.offset), ("inside", 99))

    def test_one_past_the_end_is_after(self):
        t = self.standard()
        m = t.find_block(HEAP + 0x2A0 + 100)
        self.assertEqual((m.relation, m.offset, m.block.seq), ("after", 0, 1234))
        m = t.find_block(HEAP + 0x2A0 + 104)
        self.assertEqual((m.relation, m.offset, m.block.seq), ("after", 4, 1234))

    def test_before_a_block(self):
        m = self.standard().find_block(HEAP + 0x2A0 - 8)
        self.assertEqual((m.relation, m.offset, m.block.seq), ("before", 8, 1234))

    def test_gap_between_blocks_picks_nearest(self):
        t = self.standard()
        # Block 1 ends at +0x304, block 2 starts at +0x310.
        m = t.find_block(HEAP + 0x30C)
        self.assertEqual((m.relation, m.offset, m.block.seq), ("before", 4, 1235))
        m = t.find_block(HEAP + 0x306)
        self.assertEqual((m.relation, m.offset, m.block.seq), ("after", 2, 1234))

    def test_tie_prefers_after(self):
        b = TraceBuilder()
        b.add_block(HEAP, 16, seq=1)
        b.add_block(HEAP + 24, 16, seq=2)
        m = self.build(b).find_block(HEAP + 20)
        self.assertEqual((m.relation, m.offset, m.block.seq), ("after", 4, 1))

    def test_nothing_near(self):
        t = self.standard()
        self.assertIsNone(t.find_block(0x10))
        self.assertIsNone(t.find_block(HEAP + 0x310 + 32 + 5000))
        self.assertIsNone(t.find_block(HEAP + 0x2A0 + 100, max_gap=0))
        self.assertIsNone(t.find_block(layout.MASK64))

    def test_large_shard(self):
        t = self.standard()
        for off in (0, 12345, (1 << 20) - 1):
            m = t.find_block(BIG + off)
            self.assertEqual((m.relation, m.offset, m.block.size, m.block.seq), ("inside", off, 1 << 20, 7))
        m = t.find_block(BIG + (1 << 20) + 3)
        self.assertEqual((m.relation, m.offset), ("after", 3))

    def test_block_crossing_into_next_region(self):
        start = region_start_in_other_shard(HEAP) - 40
        b = TraceBuilder()
        b.add_block(start, 100, seq=9)
        t = self.build(b)
        m = t.find_block(start + 60)  # in the next region, found via shard_of(r - 1)
        self.assertEqual((m.relation, m.offset, m.block.seq), ("inside", 60, 9))

    def test_after_a_full_region_block_two_regions_down(self):
        # A 64 KiB block starting just below a region boundary ends in the next
        # region; an address a little past its end is two regions above its start.
        r = region_start_in_other_shard(HEAP + 0x20000)
        start = r - 0x10000 - 16
        b = TraceBuilder()
        b.add_block(start, 0x10000, seq=3)
        t = self.build(b)
        m = t.find_block(start + 0x10000 + 0x20)
        self.assertEqual((m.relation, m.offset, m.block.seq), ("after", 0x20, 3))

    def test_zero_size_block(self):
        b = TraceBuilder()
        b.add_block(HEAP, 0, seq=5)
        t = self.build(b)
        m = t.find_block(HEAP)
        self.assertEqual((m.relation, m.offset, m.block.size), ("inside", 0, 0))
        m = t.find_block(HEAP + 1)
        self.assertEqual((m.relation, m.offset), ("after", 1))

    def test_tombstones_never_match(self):
        b = TraceBuilder()
        b.add_tombstones(shard_of(0), 4)
        b.add_tombstones(128, 4)
        t = self.build(b)
        for a in (0, 1, 2, 0x8000, 0xFFFF):
            self.assertIsNone(t.find_block(a), hex(a))
        self.assertEqual(list(t.blocks()), [])

    def test_reads_only_candidate_shards_each_in_one_read(self):
        t = self.standard()
        self.img.reads.clear()
        arrays = {v: k for k, v in self.where.items() if k.startswith("array")}
        t.find_block(HEAP + 0x2A0 + 5)
        wanted = {f"array{i}" for i in layout.candidate_shards(HEAP + 0x2A5)}
        slot_reads = [(a, n) for a, n in self.img.reads if a - 16 in arrays]
        touched = {arrays[a - 16] for a, _ in slot_reads}
        self.assertLessEqual(touched, wanted)
        self.assertEqual(len(slot_reads), len(touched), "one read per slot array")
        for a, n in slot_reads:
            self.assertEqual(n, 24 * struct.unpack("<Q", self.img.read(a - 16, 8))[0])
        # Every read touched the header, the shard array or a candidate array.
        allowed = {self.where["shards"]} | {a + d for a in arrays for d in (0, 16) if arrays[a] in wanted}
        self.assertTrue(all(a in allowed for a, _ in self.img.reads), self.img.reads)


class ScaleTests(Fixture):
    def test_big_shard_is_fast(self):
        """200k blocks in one 64 KiB-region stride: one shard of 2^19 slots, decoded quickly."""
        import time

        b = TraceBuilder()
        r = HEAP >> 16
        same = [k for k in range(r, r + 400000) if shard_of(k) == shard_of(r)][:2000]
        for k in same:
            for j in range(100):
                b.add_block((k << 16) + 32 * j, 24, seq=len(b.blocks) + 1)
        t = self.build(b)
        start = time.perf_counter()
        target = (same[-1] << 16) + 32 * 99 + 5
        m = t.find_block(target)
        elapsed = time.perf_counter() - start
        self.assertEqual((m.relation, m.offset, m.block.size), ("inside", 5, 24))
        self.assertLess(elapsed, 2.0)


class BitfieldTests(Fixture):
    def test_extremes(self):
        b = TraceBuilder()
        b.add_block(HEAP, (1 << 40) - 2, thread=(1 << 24) - 1, stack=(1 << 24) - 1, seq=(1 << 40) - 1)
        b.add_block(BIG, 1 << 45, thread=3, seq=1)
        self.img, h, _ = b.build()
        t = Tracer.open(self.img, h)
        blocks = {x.addr: x for x in t.blocks()}
        x = blocks[HEAP]
        self.assertEqual((x.size, x.thread, x.stack, x.seq), ((1 << 40) - 2, (1 << 24) - 1, (1 << 24) - 1, (1 << 40) - 1))
        self.assertFalse(x.size_saturated)
        y = blocks[BIG]
        self.assertTrue(y.size_saturated)
        self.assertEqual((y.size, y.thread), ((1 << 40) - 1, 3))

    def test_decode_slot(self):
        blk = layout.decode_slot(0x1000, 100 | 7 << 40, 1234 | 9 << 40)
        self.assertEqual((blk.addr, blk.size, blk.thread, blk.seq, blk.stack, blk.end), (0x1000, 100, 7, 1234, 9, 0x1064))

    def test_shard_of_matches_contract(self):
        self.assertEqual(layout.shard_of(0), 0)
        for r in (1, 0x5555_5555, 0xFFFF_FFFF_FFFF):
            self.assertEqual(layout.shard_of(r), ((r * 0x9E3779B97F4A7C15) % 2**64) >> 57)
            self.assertLess(layout.shard_of(r), 128)
        self.assertEqual(layout.candidate_shards(0x100), [0, 128])


class StackThreadTests(Fixture):
    def test_stack(self):
        t = self.standard()
        self.assertEqual(t.stack(self.s1).frames, (0x5555_5555_516D, 0x5555_5555_5200, 0x7FFF_F7DF_0D90))
        self.assertEqual(t.stack(self.s2).frames, (0x5555_5555_5300,))
        self.assertIsNone(t.stack(0))

    def test_stacks_named_in_the_call_tree(self):
        b = TraceBuilder()
        flat = b.add_stack([0x1010, 0x2020, 0x3030])
        # Two stacks sharing their two outer frames, and one that is a path's middle.
        deep = b.add_tree_stack([0x1111, 0x2222, 0x3333, 0x4444])
        sibling = b.add_tree_stack([0x5555, 0x3333, 0x4444])
        short = b.add_tree_stack([0x4444])
        t = self.build(b)
        self.assertEqual(t.stack(flat).frames, (0x1010, 0x2020, 0x3030))
        self.assertEqual(t.stack(deep).frames, (0x1111, 0x2222, 0x3333, 0x4444))
        self.assertEqual(t.stack(sibling).frames, (0x5555, 0x3333, 0x4444))
        self.assertEqual(t.stack(short).frames, (0x4444,))

    def test_a_broken_tree_path_is_corrupt(self):
        b = TraceBuilder()
        sid = b.add_tree_stack([0x1111, 0x2222])
        img, header, where = b.build()
        rec = where[f"stack{sid}"]
        cases = [
            # Three frames asked of a path of two.
            (rec, (1 << 63) | 3, "node 0 is not one of the 2 handed out"),
            # A node id past the count.
            (rec + 8, 9, "node 9 is not one of the 2"),
            # The inner frame's node made its own parent: a loop.
            (where["node2"] + 8, 2, "has parent 2, not a smaller id"),
        ]
        for at, value, why in cases:
            saved = img.read(at, 8)
            img.write_u64(at, value)
            with self.assertRaises(Corrupt) as cm:
                Tracer.open(img, header).stack(sid)
            self.assertIn(why, str(cm.exception))
            img.write(at, saved)

    def test_unpublished_stack_is_none(self):
        t = self.standard()
        chunk = struct.unpack("<Q", self.img.read(self.where["stacks"] + 16, 8))[0]
        self.img.write_u64(chunk + 8 * self.s2, 0)
        self.assertIsNone(Tracer.open(self.img, self.header_addr).stack(self.s2))

    def test_thread(self):
        t = self.standard()
        th = t.thread(self.t_main)
        self.assertEqual((th.tid, th.name, th.exited), (4242, "prog", False))
        th = t.thread(self.t_worker)
        self.assertEqual((th.tid, th.name, th.exited), (4243, "worker-with-a-lo", True))
        self.assertIsNone(t.thread(0))

    def test_unpublished_thread_is_none(self):
        b = TraceBuilder()
        b.add_thread(0, "half-written")
        self.assertIsNone(self.build(b).thread(1))

    def test_out_of_range_ids(self):
        t = self.standard()
        with self.assertRaises(Corrupt):
            t.stack(3)
        with self.assertRaises(Corrupt):
            t.thread(3)


class ErrorTests(Fixture):
    def assert_only(self, err, fn):
        with self.assertRaises(err) as cm:
            fn()
        msg = str(cm.exception)
        self.assertNotIn("\n", msg)
        self.assertTrue(msg)
        return msg

    def test_null_header(self):
        self.assert_only(NotLoaded, lambda: Tracer.open(Image(), 0))

    def test_bad_magic(self):
        self.standard()
        self.img.write(self.header_addr, b"NOTTRACE")
        self.assert_only(BadMagic, lambda: Tracer.open(self.img, self.header_addr))

    def test_version_mismatch_names_both(self):
        # Versions 1 and 2 (32-byte thread records, other header offsets) are refused too.
        for version in (1, 2, 3, 4, 5, 6, 0xFFFF_FFFF):
            self.standard()
            self.img.write_u32(self.header_addr + 8, version)
            msg = self.assert_only(VersionMismatch, lambda: Tracer.open(self.img, self.header_addr))
            self.assertEqual(
                msg,
                f"mem-trace layout version {version} in the process, this gdb script reads "
                "version 7: use the gdb/mem_trace.py from the same build",
            )

    def test_wrong_sizes(self):
        for off, value in ((12, 64), (16, 32), (20, 128), (24, 65), (28, 12)):
            self.standard()
            self.img.write_u32(self.header_addr + off, value)
            self.assert_only(Corrupt, lambda: Tracer.open(self.img, self.header_addr))

    def test_unreadable_header(self):
        self.assert_only(Inaccessible, lambda: Tracer.open(Image(), 0xDEAD0000))

    def test_short_header(self):
        img = Image()
        h = img.map(100)  # the mapping ends inside the header
        img.write(h, b"MEMTRACE" + struct.pack("<I", 7))
        self.assert_only(Inaccessible, lambda: Tracer.open(img, h))

    def test_reader_returning_short_bytes(self):
        self.standard()

        class Short:
            def read(s, addr, n):
                return self.img.read(addr, n)[: max(0, n - 1)]

        self.assert_only(Inaccessible, lambda: Tracer.open(Short(), self.header_addr))

    def test_shards_pointer_unreadable(self):
        self.standard()
        self.img.write_u64(self.header_addr + 32, 0xDEAD_BEEF_0000)
        t = Tracer.open(self.img, self.header_addr)
        self.assert_only(Inaccessible, lambda: t.find_block(HEAP))
        self.assert_only(Inaccessible, t.totals)

    def array_of_heap_shard(self):
        self.standard()
        return self.where[f"array{shard_of(HEAP >> 16)}"]

    def test_capacity_zero_or_huge(self):
        for cap in (0, (1 << 64) - 1):
            self.img_array = self.array_of_heap_shard()
            self.img.write_u64(self.img_array, cap)
            t = Tracer.open(self.img, self.header_addr)
            self.assert_only(Corrupt, lambda: t.find_block(HEAP + 0x2A0))

    def test_capacity_any_size(self):
        # Capacities grow by quarters, so 80 slots (not a power of two) is normal.
        array = self.array_of_heap_shard()
        t = Tracer.open(self.img, self.header_addr)
        before = t.find_block(HEAP + 0x2A0)
        self.assertIsNotNone(before)

    def test_capacity_absurd(self):
        array = self.array_of_heap_shard()
        self.img.write_u64(array, 1 << 40)
        t = Tracer.open(self.img, self.header_addr)
        self.assert_only(Corrupt, lambda: t.find_block(HEAP + 0x2A0))

    def test_capacity_larger_than_mapping(self):
        array = self.array_of_heap_shard()
        self.img.write_u64(array, 1 << 20)
        t = Tracer.open(self.img, self.header_addr)
        self.assert_only(Inaccessible, lambda: t.find_block(HEAP + 0x2A0))

    def test_capacity_past_the_mapping_is_one_line_when_mappings_are_known(self):
        # A reader that knows the target's mappings (gdb's, through /proc or the core's
        # sections) refuses the claim before reading it.
        array = self.array_of_heap_shard()
        self.img.write_u64(array, 1 << 23)
        self.img.extent = lambda addr, n: _extent(self.img, addr, n)
        t = Tracer.open(self.img, self.header_addr)
        with self.assertRaises(Corrupt) as e:
            t.find_block(HEAP + 0x2A0)
        self.assertIn("claims 192 MiB at", str(e.exception))
        self.assertIn("where the target's memory ends after", str(e.exception))
        self.assertFalse([n for _, n in self.img.reads if n > 1 << 20], self.img.reads)

    def test_directory_chunks_that_overlap_are_corrupt(self):
        self.standard()
        threads = self.where["threads"]
        chunk = struct.unpack("<Q", self.img.read(threads + 16, 8))[0]
        # 8192 threads claimed, the second chunk the first one again.
        self.img.write_u64(threads, 8191)
        self.img.write_u64(threads + 24, chunk)
        t = Tracer.open(self.img, self.header_addr)
        with self.assertRaises(Corrupt) as e:
            t.threads()
        self.assertIn("chunk 1 of the thread table, which claims 8191 threads", str(e.exception))

    def test_huge_shard_counts(self):
        self.standard()
        self.img.write_u64(self.where["shards"] + 64 * 5 + 16, 1 << 62)
        t = Tracer.open(self.img, self.header_addr)
        self.assert_only(Corrupt, t.totals)

    def test_huge_stack_count_and_frames(self):
        self.standard()
        self.img.write_u64(self.where["stacks"], 1 << 40)
        self.assert_only(Corrupt, Tracer.open(self.img, self.header_addr).totals)
        self.standard()
        self.img.write_u64(self.where[f"stack{self.s1}"], 1 << 50)
        self.assert_only(Corrupt, lambda: Tracer.open(self.img, self.header_addr).stack(self.s1))

    def test_bad_directory_shape(self):
        self.standard()
        self.img.write_u32(self.where["threads"] + 8, 16)
        self.assert_only(Corrupt, lambda: Tracer.open(self.img, self.header_addr).thread(1))
        self.standard()
        self.img.write_u32(self.where["stacks"] + 12, 255)
        self.assert_only(Corrupt, lambda: Tracer.open(self.img, self.header_addr).stack(1))

    def test_dangling_stack_record(self):
        self.standard()
        chunk = struct.unpack("<Q", self.img.read(self.where["stacks"] + 16, 8))[0]
        self.img.write_u64(chunk + 8 * self.s1, 0x10)
        self.assert_only(Inaccessible, lambda: Tracer.open(self.img, self.header_addr).stack(self.s1))

    def test_pointer_near_top_of_address_space(self):
        self.standard()
        self.img.write_u64(self.header_addr + 32, (1 << 64) - 8)
        t = Tracer.open(self.img, self.header_addr)
        self.assert_only(Corrupt, lambda: t.find_block(HEAP))

    def test_random_corruption_raises_only_typed_errors(self):
        """Flip bytes anywhere in the image; every operation ends in a typed error or an answer."""
        rng = random.Random(1234)
        for _ in range(300):
            self.standard()
            for _ in range(rng.randint(1, 8)):
                start, buf = rng.choice(self.img.maps)
                # Bias toward the small structures: the big zeroed chunks dilute flips.
                if len(buf) > 4096 and rng.random() < 0.8:
                    continue
                pos = rng.randrange(len(buf))
                buf[pos] = rng.randrange(256) if rng.random() < 0.5 else buf[pos] ^ (1 << rng.randrange(8))
            try:
                t = Tracer.open(self.img, self.header_addr)
                t.totals()
                for a in (HEAP + 0x2A5, HEAP + 0x304, BIG + 5, 0x10):
                    m = t.find_block(a)
                    if m is not None:
                        t.stack(m.block.stack)
                        t.thread(m.block.thread)
                list(t.blocks())
            except MemTraceError as e:
                self.assertNotIn("\n", str(e))


class HistoryTests(Fixture):
    """The freed-block history ring (layout version 2)."""

    def history_fixture(self, capacity=8):
        b = TraceBuilder()
        self.t_main = b.add_thread(4242, "prog")
        self.t_other = b.add_thread(4243, "other")
        self.s_alloc = b.add_stack([0x5555_5555_5100])
        self.s_free = b.add_stack([0x5555_5555_5200, 0x5555_5555_5300])
        b.history_capacity = capacity
        b.quarantine_limit, b.quarantined_bytes, b.errors = 1 << 20, 4096, 3
        # The same 48 bytes allocated and freed twice, then reused by a live block.
        b.add_freed(HEAP, 48, thread=self.t_main, stack=self.s_alloc, seq=10, free_seq=11,
                    free_stack=self.s_free, free_thread=self.t_other)
        b.add_freed(HEAP, 48, thread=self.t_main, stack=self.s_alloc, seq=20, free_seq=25,
                    free_stack=self.s_free, free_thread=self.t_main, realloc=True)
        # A neighbour freed with no free stack, and a zero-size one.
        b.add_freed(HEAP + 0x100, 64, thread=self.t_other, seq=30, free_seq=31)
        b.add_freed(HEAP + 0x200, 0, seq=32, free_seq=33)
        b.add_block(HEAP, 32, thread=self.t_other, stack=self.s_alloc, seq=40)
        return b

    def test_header(self):
        t = self.build(self.history_fixture())
        h = t.history_header()
        self.assertEqual((h.address, h.capacity, h.written, h.held, h.wrapped),
                         (self.where["freed"], 8, 4, 4, False))
        self.assertEqual(h.records, self.where["ring"])
        self.assertEqual((h.quarantine_limit, h.quarantined_bytes, h.errors), (1 << 20, 4096, 3))
        self.assertTrue(h.free_stacks)
        self.assertTrue(h.enabled)

    def test_record_fields(self):
        t = self.build(self.history_fixture())
        r = t.freed_blocks_containing(HEAP + 40)
        self.assertEqual([x.free_seq for x in r], [25, 11], "newest free first")
        newest = r[0]
        self.assertEqual((newest.addr, newest.size, newest.end), (HEAP, 48, HEAP + 48))
        a = newest.allocation
        self.assertEqual((a.thread, a.seq, a.stack), (self.t_main, 20, self.s_alloc))
        self.assertEqual((newest.free_stack, newest.free_thread, newest.by_realloc),
                         (self.s_free, self.t_main, True))
        self.assertEqual((r[1].free_thread, r[1].by_realloc), (self.t_other, False))

    def test_containment_bounds(self):
        t = self.build(self.history_fixture())
        self.assertEqual(len(t.freed_blocks_containing(HEAP)), 2)
        self.assertEqual(len(t.freed_blocks_containing(HEAP + 47)), 2)
        self.assertEqual(t.freed_blocks_containing(HEAP + 48), [])
        self.assertEqual(t.freed_blocks_containing(HEAP - 1), [])
        self.assertEqual([x.free_seq for x in t.freed_blocks_containing(HEAP + 0x13F)], [31])
        self.assertEqual(t.freed_blocks_containing(HEAP + 0x140), [])
        # Zero size: only its start.
        self.assertEqual([x.free_seq for x in t.freed_blocks_containing(HEAP + 0x200)], [33])
        self.assertEqual(t.freed_blocks_containing(HEAP + 0x201), [])
        self.assertEqual(t.freed_blocks_containing(0), [])
        self.assertEqual(t.freed_blocks_containing(layout.MASK64), [])

    def test_history_newest_first(self):
        t = self.build(self.history_fixture())
        got = [(e.kind, e.seq, e.live) for e in t.history(HEAP + 8)]
        self.assertEqual(got, [
            ("allocation", 40, True),
            ("free", 25, False),
            ("allocation", 20, False),
            ("free", 11, False),
            ("allocation", 10, False),
        ])
        events = t.history(HEAP + 8)
        self.assertEqual((events[0].thread, events[0].stack, events[0].block.size), (self.t_other, self.s_alloc, 32))
        self.assertEqual((events[1].thread, events[1].stack, events[1].freed.by_realloc), (self.t_main, self.s_free, True))
        self.assertEqual(events[2].freed.free_seq, 25, "an allocation event knows its free")
        # Past the live block's 32 bytes, only the freed 48-byte blocks remain.
        self.assertEqual([e.seq for e in t.history(HEAP + 40)], [25, 20, 11, 10])
        self.assertEqual(t.history(HEAP + 0x1000), [])

    def test_history_with_live_block_only(self):
        t = self.standard()
        self.assertEqual([(e.kind, e.seq, e.live) for e in t.history(HEAP + 0x2A5)], [("allocation", 1234, True)])
        self.assertEqual([e.seq for e in t.history(BIG + 77)], [7])

    def test_wrap_around_keeps_the_newest(self):
        b = TraceBuilder()
        b.history_capacity = 4
        for k in range(10):  # record k lands at k % 4: 6..9 survive
            b.add_freed(HEAP + 0x40 * (k % 3), 16, seq=100 + 2 * k, free_seq=101 + 2 * k)
        t = self.build(b)
        h = t.history_header()
        self.assertEqual((h.written, h.held, h.wrapped), (10, 4, True))
        self.assertEqual(sorted(r.free_seq for r in t.freed_records()), [113, 115, 117, 119])
        # k = 6 and 9 are at HEAP (k % 3 == 0); 0 and 3 were overwritten.
        self.assertEqual([r.free_seq for r in t.freed_blocks_containing(HEAP + 3)], [119, 113])
        self.assertEqual([e.seq for e in t.history(HEAP)], [119, 118, 113, 112])

    def test_reads_only_the_written_part_of_the_ring_in_one_read(self):
        b = self.history_fixture(capacity=1024)
        t = self.build(b)
        self.img.reads.clear()
        t.freed_blocks_containing(HEAP)
        t.freed_blocks_containing(HEAP + 0x100)
        t.history(HEAP)
        ring_reads = [(a, n) for a, n in self.img.reads if a == self.where["ring"]]
        self.assertEqual(ring_reads, [(self.where["ring"], 4 * 40)])

    def test_big_ring_is_scanned_in_parts(self):
        b = TraceBuilder()
        b.history_capacity = 16
        for k in range(20):
            b.add_freed(HEAP + 0x40 * (k % 5), 16, seq=100 + 2 * k, free_seq=101 + 2 * k)
        t = self.build(b)
        whole = [r.free_seq for r in t.freed_blocks_containing(HEAP + 0x40)]
        self.assertEqual(whole, [133, 123, 113])  # k = 16, 11, 6 (1 was overwritten)
        # The tracer module's own binding is the one _ring_parts reads.
        saved = layout.tracer.RING_CHUNK
        layout.tracer.RING_CHUNK = 3
        try:
            t = Tracer.open(self.img, self.header_addr)
            self.img.reads.clear()
            self.assertEqual([r.free_seq for r in t.freed_blocks_containing(HEAP + 0x40)], whole)
            ring = self.where["ring"]
            parts = [(a, n) for a, n in self.img.reads if ring <= a < ring + 16 * 40]
            self.assertEqual(parts, [(ring + 40 * k, 40 * min(3, 16 - k)) for k in range(0, 16, 3)])
            self.assertEqual(len(list(t.freed_records())), 16)
        finally:
            layout.tracer.RING_CHUNK = saved

    def test_empty_records_are_skipped(self):
        b = self.history_fixture()
        t = self.build(b)
        # Record 1 (free #25) is being rewritten: addr cleared first, the rest stale.
        self.img.write_u64(self.where["ring"] + 40, 0)
        t = Tracer.open(self.img, self.header_addr)
        self.assertEqual([r.free_seq for r in t.freed_blocks_containing(HEAP)], [11])
        self.assertEqual(len(list(t.freed_records())), 3)
        # A history written to fewer records than its capacity: the rest are zero.
        self.assertEqual(t.freed_blocks_containing(0), [])

    def test_no_free_yet_and_disabled(self):
        b = TraceBuilder()
        b.add_block(HEAP, 16, seq=1)
        t = self.build(b)  # history present, no ring yet (records == 0)
        h = t.history_header()
        self.assertEqual((h.records, h.written, h.held), (0, 0, 0))
        self.assertEqual(t.freed_blocks_containing(HEAP), [])
        self.assertEqual([e.seq for e in t.history(HEAP)], [1])
        b = TraceBuilder()
        b.history_capacity = 0
        b.add_freed(HEAP, 16)
        t = self.build(b)
        self.assertFalse(t.history_header().enabled)
        self.assertEqual(t.freed_blocks_containing(HEAP), [])
        b = TraceBuilder()
        b.history_capacity = None  # header.freed == 0
        t = self.build(b)
        self.assertIsNone(t.history_header())
        self.assertEqual(t.freed_blocks_containing(HEAP), [])

    def test_free_stacks_flag(self):
        b = self.history_fixture()
        b.history_flags = 0
        self.assertFalse(self.build(b).history_header().free_stacks)

    def test_bitfield_extremes(self):
        b = TraceBuilder()
        b.add_freed(HEAP, (1 << 40) - 2, thread=(1 << 24) - 1, stack=(1 << 24) - 1, seq=(1 << 40) - 3,
                    free_seq=(1 << 40) - 2, free_stack=(1 << 24) - 1, free_thread=0xFFFF_FFFF, realloc=True)
        r = self.build(b).freed_blocks_containing(HEAP + (1 << 40) - 3)
        self.assertEqual(len(r), 1)
        r = r[0]
        self.assertEqual((r.size, r.allocation.thread, r.allocation.stack, r.allocation.seq),
                         ((1 << 40) - 2, (1 << 24) - 1, (1 << 24) - 1, (1 << 40) - 3))
        self.assertEqual((r.free_seq, r.free_stack, r.free_thread, r.by_realloc),
                         ((1 << 40) - 2, (1 << 24) - 1, 0xFFFF_FFFF, True))

    def test_decode_freed(self):
        r = layout.decode_freed([0x1000, 100 | 7 << 40, 1234 | 9 << 40, 1240 | 11 << 40, 3 | 1 << 32])
        self.assertEqual((r.addr, r.size, r.allocation.thread, r.allocation.seq, r.allocation.stack),
                         (0x1000, 100, 7, 1234, 9))
        self.assertEqual((r.free_seq, r.free_stack, r.free_thread, r.flags, r.by_realloc), (1240, 11, 3, 1, True))

    def test_scan_of_a_full_default_ring_is_fast(self):
        """262144 records (the default capacity, a 10 MiB ring): one read, well under 1 s."""
        import time

        b = TraceBuilder()
        cap = 262144
        b.history_capacity = cap
        for k in range(cap + 1000):  # wrapped
            b.add_freed(HEAP + 64 * (k % 100000), 48, seq=2 * k + 1, free_seq=2 * k + 2)
        t = self.build(b)
        target = HEAP + 64 * 4242 + 10
        start = time.perf_counter()
        hits = t.freed_blocks_containing(target)
        first = time.perf_counter() - start
        start = time.perf_counter()
        events = t.history(target)
        second = time.perf_counter() - start
        # k = 4242 + 100000 j for j = 0..2 survive (k >= 1000 after the wrap); j = 3 too.
        self.assertEqual([r.free_seq for r in hits], [2 * (4242 + 100000 * j) + 2 for j in (2, 1, 0)])
        self.assertEqual(len(events), 6)
        self.assertLess(first, 1.0)
        self.assertLess(second, 1.0)
        if os.environ.get("MEM_TRACE_TIMINGS"):
            print(f"\n  262144-record ring: first query {first * 1000:.1f} ms, next {second * 1000:.1f} ms")


class HistoryErrorTests(Fixture):
    """Truncated or corrupted history: typed one-line errors, never anything else."""

    assert_only = ErrorTests.assert_only

    def history(self):
        b = HistoryTests.history_fixture(self)
        return self.build(b)

    def test_record_size(self):
        self.history()
        self.img.write_u32(self.where["freed"], 48)
        t = Tracer.open(self.img, self.header_addr)
        msg = self.assert_only(Corrupt, lambda: t.freed_blocks_containing(HEAP))
        self.assertIn("record_size is 48", msg)

    def test_absurd_capacity_and_written(self):
        self.history()
        self.img.write_u64(self.where["freed"] + 8, (1 << 26) + 1)
        self.assert_only(Corrupt, lambda: Tracer.open(self.img, self.header_addr).history(HEAP))
        self.history()
        self.img.write_u64(self.where["freed"] + 24, 1 << 50)
        self.assert_only(Corrupt, lambda: Tracer.open(self.img, self.header_addr).freed_blocks_containing(HEAP))

    def test_truncated_ring(self):
        # capacity and written larger than the ring that is mapped: one short read.
        self.history()
        self.img.write_u64(self.where["freed"] + 8, 4096)
        self.img.write_u64(self.where["freed"] + 24, 5000)
        t = Tracer.open(self.img, self.header_addr)
        msg = self.assert_only(Inaccessible, lambda: t.freed_blocks_containing(HEAP))
        self.assertIn("the freed-block history ring", msg)

    def test_unreadable_history(self):
        self.history()
        self.img.write_u64(self.header_addr + 56, 0xDEAD_0000)
        t = Tracer.open(self.img, self.header_addr)
        msg = self.assert_only(Inaccessible, lambda: t.history(HEAP))
        self.assertIn("freed-block history header", msg)
        self.history()
        self.img.write_u64(self.where["freed"] + 16, 0xDEAD_0000)
        self.assert_only(Inaccessible, lambda: Tracer.open(self.img, self.header_addr).history(HEAP))
        self.history()
        self.img.write_u64(self.where["freed"] + 16, (1 << 64) - 16)
        self.assert_only(Corrupt, lambda: Tracer.open(self.img, self.header_addr).history(HEAP))

    def test_history_header_cut_short(self):
        img = Image()
        b = TraceBuilder()
        self.img, self.header_addr, self.where = b.build(img)
        short = img.map(40)  # the mapping ends inside the 64-byte history header
        img.write_u64(self.header_addr + 56, short)
        self.assert_only(Inaccessible, lambda: Tracer.open(img, self.header_addr).history_header())

    def test_random_history_corruption(self):
        rng = random.Random(99)
        for _ in range(300):
            self.history()
            targets = [(self.where["freed"], 64), (self.where["ring"], 4 * 40)]
            for _ in range(rng.randint(1, 6)):
                base, n = rng.choice(targets)
                pos = base + rng.randrange(n)
                old = self.img.read(pos, 1)[0]
                self.img.write(pos, bytes([rng.randrange(256) if rng.random() < 0.5 else old ^ (1 << rng.randrange(8))]))
            try:
                t = Tracer.open(self.img, self.header_addr)
                t.history_header()
                for a in (HEAP, HEAP + 40, HEAP + 0x100, HEAP + 0x200, 0x10):
                    for e in t.history(a):
                        t.stack(e.stack)
                        t.thread(e.thread)
                list(t.freed_records())
            except MemTraceError as e:
                self.assertNotIn("\n", str(e))


class IndexTests(Fixture):
    """The freed-block index over large rings: the same answers as a scan of the ring."""

    SIZES = [0, 1, 16, 48, 64, 65, 100, 255, 256, 257, 1024, 4096, 5 * 1024, 65536,
             200 * 1024, 2 << 20, 1 << 30, (1 << 40) + 5]

    def random_frees(self, b, seed, n):
        """n frees over a small heap with reuse, of sizes across every level (granule-sized
        ones included), and a few huge blocks far away."""
        rng = random.Random(seed)
        for k in range(n):
            size = rng.choice(self.SIZES + [1 << (6 + 2 * rng.randrange(18))])
            if size >= 1 << 20:
                addr = BIG + (rng.randrange(64) << 16)
            else:
                addr = HEAP + 16 * rng.randrange(1, 4096)
            b.add_freed(addr, size, seq=2 * k + 1, free_seq=2 * k + 2)

    def both(self, b):
        """The same history read through its index and by a scan."""
        b.index_head_bits = None
        scan = self.build(b)
        b.index_head_bits = 5
        indexed = self.build(b)
        self.assertIsNotNone(indexed.freed_index())
        self.assertIsNone(scan.freed_index())
        return indexed, scan

    def probes(self, b):
        out = {0, 1, layout.MASK64, HEAP, BIG}
        for f in b.frees:
            addr, size = f[0], min(f[1], (1 << 40) - 1)
            out.update({addr - 1, addr, addr + 1, addr + size - 1, addr + size, addr + size // 2})
        return sorted(a for a in out if 0 <= a <= layout.MASK64)

    def assert_same(self, indexed, scan, addrs):
        for a in addrs:
            got = [r.free_seq for r in indexed.freed_blocks_containing(a)]
            want = [r.free_seq for r in scan.freed_blocks_containing(a)]
            self.assertEqual(got, want, f"address {a:#x}")

    def test_same_answers_as_a_scan_wrapped_or_not(self):
        for seed, cap, n in [(1, 64, 40), (2, 64, 300), (3, 97, 1000)]:
            b = TraceBuilder()
            b.history_capacity = cap
            self.random_frees(b, seed, n)
            indexed, scan = self.both(b)
            self.assert_same(indexed, scan, self.probes(b))

    def test_chains_across_levels_and_blocks_of_exactly_a_granule(self):
        b = TraceBuilder()
        b.history_capacity = 64
        # 64 bytes (level 0) and 256 bytes (level 1) ending one byte into the next granule;
        # 5 KiB, 200 KiB and 2 MiB blocks over the same bytes.
        b.add_freed(HEAP + 0x40 * 5 + 1, 64, seq=1, free_seq=2)
        b.add_freed(HEAP + 0x100 * 9 + 1, 256, seq=3, free_seq=4)
        b.add_freed(HEAP, 5 * 1024, seq=5, free_seq=6)
        b.add_freed(HEAP - 0x1000, 200 * 1024, seq=7, free_seq=8)
        b.add_freed(HEAP - 0x10000, 2 << 20, seq=9, free_seq=10)
        indexed, scan = self.both(b)
        self.assertEqual([r.free_seq for r in indexed.freed_blocks_containing(HEAP + 0x180)],
                         [10, 8, 6, 2])
        self.assertEqual([r.free_seq for r in indexed.freed_blocks_containing(HEAP + 0xA00)],
                         [10, 8, 6, 4])
        self.assertEqual([r.free_seq for r in indexed.freed_blocks_containing(HEAP + 0xA01)],
                         [10, 8, 6])
        self.assert_same(indexed, scan, self.probes(b))

    def test_a_chain_stops_at_a_slot_reused_since(self):
        b = TraceBuilder()
        b.history_capacity = 4
        b.add_freed(HEAP, 48, seq=1, free_seq=2)
        for k in range(1, 5):  # record 4 takes record 0's slot
            b.add_freed(BIG + 0x1000 * k, 48, seq=2 * k + 1, free_seq=2 * k + 2)
        indexed, scan = self.both(b)
        self.img.reads.clear()
        self.assertEqual(indexed.freed_blocks_containing(HEAP + 8), [])
        self.assertEqual([r.free_seq for r in indexed.freed_blocks_containing(BIG + 0x4000)],
                         [10])
        self.assert_same(indexed, scan, self.probes(b))

    def test_a_record_that_joined_late_uncovers_the_window(self):
        """Record 3 joined its chain after 4..9 (its thread was behind the claims), in
        front of record 5 of the same granule; record 11 then took its slot. Record 5 is
        still in the ring, behind a chain cut at 3: the window of `disorder` records
        after 3 finds it, as the contract says."""
        b = TraceBuilder()
        b.history_capacity = 8
        for k in range(12):
            addr = HEAP + 0x20 if k in (3, 5) else BIG + 0x1000 * k
            b.add_freed(addr, 16, seq=2 * k + 1, free_seq=2 * k + 2)
        b.insert_order = [0, 1, 2, 4, 5, 6, 7, 8, 9, 3, 10, 11]
        indexed, scan = self.both(b)
        self.assertEqual(indexed.freed_index().disorder, 7)
        self.assertEqual([r.free_seq for r in indexed.freed_blocks_containing(HEAP + 0x20)], [12])
        self.assert_same(indexed, scan, self.probes(b))
        # Without the window the chain alone would lose record 5.
        b.disorder = 1
        t = self.build(b)
        self.assertEqual(t.freed_blocks_containing(HEAP + 0x20), [])

    def test_reads_a_few_chunks_not_the_ring(self):
        b = TraceBuilder()
        cap = 65536
        b.history_capacity = cap
        self.random_frees(b, 4, cap + 1000)
        # Four heads per record: few chains of other granules share a head with these.
        b.index_head_bits = 18
        t = self.build(b)
        ring = self.where["ring"]
        # Addresses no block is near: what is read is the chains that share their heads.
        for a in (0x1234, HEAP + (16 << 20)):
            self.img.reads.clear()
            t = Tracer.open(self.img, self.header_addr)
            self.assertEqual(t.freed_blocks_containing(a), [])
            self.assertTrue(all(n <= 40 * layout.INDEX_CHUNK for _, n in self.img.reads))
            ring_bytes = sum(n for at, n in self.img.reads if ring <= at < ring + 40 * cap)
            self.assertLess(ring_bytes, 40 * cap // 4, f"address {a:#x}")


class IndexErrorTests(Fixture):
    """A corrupt index: typed one-line errors, never a hang or anything else."""

    assert_only = ErrorTests.assert_only

    def indexed(self, cap=16, n=40):
        b = TraceBuilder()
        b.history_capacity = cap
        for k in range(n):
            b.add_freed(HEAP + 0x40 * (k % 7), 48, seq=2 * k + 1, free_seq=2 * k + 2)
        b.index_head_bits = 4
        self.builder = b
        return self.build(b)

    def chain(self):
        """The records on HEAP's chain, newest first, and where the links are."""
        from image import index_bucket
        heads, links = self.where["heads"], self.where["links"]
        self.head = heads + 8 * index_bucket(HEAP, 48, 4)
        out, nxt = [], struct.unpack("<Q", self.img.read(self.head, 8))[0]
        while nxt:
            k = nxt - 1
            link = struct.unpack("<Q", self.img.read(links + 8 * (k % 16), 8))[0]
            if link >> 40 != k // 16:
                break
            out.append(k)
            nxt = link & ((1 << 40) - 1)
        return out, links

    def test_a_looping_chain(self):
        from image import index_link
        for at in (0, -1):  # the newest record back to itself; the oldest to the newest
            self.indexed()
            records, links = self.chain()
            self.assertGreater(len(records), 1)
            k = records[at]
            self.img.write_u64(links + 8 * (k % 16), index_link(k, 16, records[0] + 1))
            t = Tracer.open(self.img, self.header_addr)
            msg = self.assert_only(Corrupt, lambda: t.freed_blocks_containing(HEAP))
            self.assertIn("loops", msg)

    def test_a_chain_naming_a_record_never_written(self):
        self.indexed()
        self.chain()
        self.img.write_u64(self.head, 41)
        t = Tracer.open(self.img, self.header_addr)
        self.assertIn("only 40 were written",
                      self.assert_only(Corrupt, lambda: t.freed_blocks_containing(HEAP)))

    def test_a_geometry_that_cannot_be_read(self):
        for offset, value in [(0, 40), (8, 0), (8, 33), (12, 3), (12, 40)]:
            self.indexed()
            self.img.write_u32(self.where["index"] + offset, value)
            t = Tracer.open(self.img, self.header_addr)
            self.assert_only(Corrupt, lambda: t.freed_blocks_containing(HEAP))

    def test_unreadable_index(self):
        self.indexed()
        self.img.write_u64(self.where["index"] + 24, 0xDEAD_0000)
        t = Tracer.open(self.img, self.header_addr)
        self.assert_only(Inaccessible, lambda: t.freed_blocks_containing(HEAP))
        self.indexed()
        self.img.write_u64(self.where["freed"] + 56, 0xDEAD_0000)
        t = Tracer.open(self.img, self.header_addr)
        self.assert_only(Inaccessible, lambda: t.freed_blocks_containing(HEAP))

    def test_random_index_corruption(self):
        rng = random.Random(7)
        for _ in range(300):
            self.indexed()
            targets = [(self.where["index"], 64), (self.where["heads"], 128),
                       (self.where["links"], 16 * 8)]
            for _ in range(rng.randint(1, 6)):
                base, n = rng.choice(targets)
                pos = base + rng.randrange(n)
                old = self.img.read(pos, 1)[0]
                self.img.write(pos, bytes([rng.randrange(256) if rng.random() < 0.5
                                           else old ^ (1 << rng.randrange(8))]))
            try:
                t = Tracer.open(self.img, self.header_addr)
                for a in (HEAP, HEAP + 40, HEAP + 0x100, 0x10, layout.MASK64):
                    t.freed_blocks_containing(a)
            except MemTraceError as e:
                self.assertNotIn("\n", str(e))


class SampleTests(unittest.TestCase):
    """The sampling weights, the same as the Rust reader's (crates/read/src/sample.rs)."""

    def test_weights_agree_with_the_rust_reader(self):
        from mem_trace_gdb.layout import sample

        self.assertEqual(sample.weight(0x5555_0040, 100, 65536), (65586, 656))
        self.assertEqual(sample.weight(0x7F00_1230, 48, 524288), (524312, 10923))
        self.assertEqual(sample.weight(0x1000, 65536, 65536), (103676, 2))
        self.assertEqual(sample.weight(0xABC_DEF0, 3000, 65536), (67047, 23))
        self.assertEqual(sample.weight(0x1000, 100, 0), (100, 1))
        self.assertEqual(sample.rate(512 << 10), "one allocation per ~512 KiB")

    def test_expm1_has_the_tracers_bits(self):
        """The sweep and digest of crates/read/src/exp.rs's test: the same bits as the
        tracer's own expm1 (it does without libm), within a few units of libm's."""
        import math

        from mem_trace_gdb.layout import sample

        digest = 0
        for i in range(4000):
            x = -float(i * i * 37 + 1) / 65536.0 / 7.0
            for y in (x, x / 1024.0, -x / 3.0):
                bits = struct.unpack("<Q", struct.pack("<d", sample.expm1(y)))[0]
                digest = (digest * 31 + bits) & ((1 << 64) - 1)
                libm = math.expm1(y)
                if libm != 0.0 and not math.isinf(libm):
                    self.assertLess(abs(sample.expm1(y) - libm), 4e-16 * abs(libm))
        self.assertEqual(digest, 0x8EF021956DCF7684)
        self.assertTrue(math.isnan(sample.expm1(math.nan)))
        self.assertEqual(sample.expm1(-1e6), -1.0)


class ProfileTests(Fixture):
    """Layout version 3's profiler words: header, thread records, the Profile section."""

    def profiled(self, peak_seq=100):
        b = TraceBuilder()
        b.flags = 1 | 2
        b.live_bytes, b.peak_bytes, b.peak_seq = 5000, 9000, peak_seq
        b.profile = {"resets": 2, "started_ns": 123, "reports": 4}
        self.t1 = b.add_thread(4242, "prog", own_live=3000, freed_elsewhere=1000,
                               peak_bytes=7000, allocated_bytes=11000)
        self.t2 = b.add_thread(4243, "worker", exited=True, own_live=10, freed_elsewhere=30,
                               peak_bytes=8388608, allocated_bytes=8388608)
        self.sa = b.add_stack([0x1000])
        self.sb = b.add_stack([0x2000])
        self.sc = b.add_stack([0x3000])
        return b

    def test_header_and_profile_head(self):
        t = self.build(self.profiled())
        h = t.header
        self.assertTrue(h.profiler)
        self.assertEqual((h.live_bytes, h.peak_bytes, h.peak_seq), (5000, 9000, 100))
        self.assertEqual(h.profile, self.where["profile"])
        p = t.profile()
        self.assertEqual((p.resets, p.started_ns, p.reports), (2, 123, 4))

    def test_thread_profiler_words(self):
        b = self.profiled()
        b.add_cached(self.t1, self.sa, live_bytes=1)
        t = self.build(b)
        th = t.thread(self.t1)
        self.assertEqual(th.counters, self.where["cache1"])
        self.assertEqual((th.own_live, th.freed_elsewhere, th.peak_bytes, th.allocated_bytes),
                         (3000, 1000, 7000, 11000))
        self.assertEqual(th.live_bytes, 2000)
        # More freed elsewhere than owned (a reader racing the owner): 0, not 2^64 - 20.
        self.assertEqual(t.thread(self.t2).live_bytes, 0)
        self.assertEqual(t.thread(self.t2).counters, 0)
        self.assertEqual([x.index for x in t.threads()], [1, 2])
        self.assertEqual(t.threads()[1].name, "worker")

    def test_shared_plus_every_cache_with_wrapping_deltas(self):
        b = self.profiled()
        b.add_counter(self.sa, live_bytes=1000, live_blocks=10, total_bytes=5000,
                      total_blocks=50, last_seq=20)
        # Thread 1 allocated 300 more bytes; thread 2 freed 400 of them: a negative delta.
        b.add_cached(self.t1, self.sa, live_bytes=300, live_blocks=3, total_bytes=300,
                     total_blocks=3, last_seq=30)
        b.add_cached(self.t2, self.sa, live_bytes=-400, live_blocks=-4, last_seq=40)
        # A stack known only to a cache, and stack id 0 (blocks without a stack).
        b.add_cached(self.t2, self.sb, live_bytes=64, live_blocks=1, total_bytes=64,
                     total_blocks=1, last_seq=41)
        b.add_counter(0, live_bytes=7, live_blocks=1, total_bytes=7, total_blocks=1, last_seq=5)
        counts = self.build(b).stack_counts()
        a = counts[self.sa]
        self.assertEqual((a.live_bytes, a.live_blocks, a.total_bytes, a.total_blocks),
                         (900, 9, 5300, 53))
        self.assertEqual((counts[self.sb].live_bytes, counts[self.sb].total_blocks), (64, 1))
        self.assertEqual(counts[0].live_bytes, 7)
        # Never-updated records (last_seq 0) are not counted stacks.
        self.assertNotIn(self.sc, counts)

    def test_a_sum_caught_negative_mid_move_reads_as_zero(self):
        b = self.profiled()
        b.add_cached(self.t1, self.sa, live_bytes=-100, live_blocks=-1, last_seq=50)
        a = self.build(b).stack_counts()[self.sa]
        self.assertEqual((a.live_bytes, a.live_blocks), (0, 0))
        self.assertEqual(a.live_bytes_raw, 2**64 - 100)

    def test_at_peak_rule(self):
        # peak_seq 100. Shared record unchanged since the peak (last_seq 100 == peak_seq):
        # its live values are its at-peak values; the cache record changed after (last_seq
        # 150): its peak_* fields are.
        b = self.profiled(peak_seq=100)
        b.add_counter(self.sa, live_bytes=4096, live_blocks=1, peak_bytes=1, peak_blocks=1,
                      last_seq=100)
        b.add_cached(self.t1, self.sa, live_bytes=-4096, live_blocks=-1, peak_bytes=8192,
                     peak_blocks=2, last_seq=150)
        # Changed after the peak in the shared record: peak_* (the live value is gone).
        b.add_counter(self.sb, live_bytes=0, live_blocks=0, peak_bytes=65536, peak_blocks=1,
                      total_bytes=65536, total_blocks=1, last_seq=101)
        # Before the peak and stale peak_* left from an earlier peak: ignored.
        b.add_counter(self.sc, live_bytes=10, live_blocks=1, peak_bytes=999, peak_blocks=9,
                      last_seq=99)
        counts = self.build(b).stack_counts()
        self.assertEqual((counts[self.sa].peak_bytes, counts[self.sa].peak_blocks),
                         (4096 + 8192, 3))
        self.assertEqual(counts[self.sa].live_bytes, 0)
        self.assertEqual((counts[self.sb].peak_bytes, counts[self.sb].live_bytes), (65536, 0))
        self.assertEqual((counts[self.sc].peak_bytes, counts[self.sc].peak_blocks), (10, 1))

    def test_counter_at_peak_boundary(self):
        c = layout.Counter(stack=1, live_bytes=5, live_blocks=1, total_bytes=5, total_blocks=1,
                           peak_bytes=7, peak_blocks=2, last_seq=10)
        self.assertEqual(c.at_peak(10), (5, 1))
        self.assertEqual(c.at_peak(11), (5, 1))
        self.assertEqual(c.at_peak(9), (7, 2))

    def test_rust_reference_scenario(self):
        # crates/core/src/profile/counters.rs's test, as records: a peak at seq 11 with 150
        # bytes in 2 blocks; after it, -100 (seq 12), +7 (seq 13, a realloc put back) and an
        # eviction into the shared record at seq 14.
        b = self.profiled(peak_seq=11)
        b.add_counter(self.sa, live_bytes=57, live_blocks=2, total_bytes=150, total_blocks=2,
                      peak_bytes=150, peak_blocks=2, last_seq=14)
        n = self.build(b).stack_counts()[self.sa]
        self.assertEqual((n.peak_bytes, n.peak_blocks), (150, 2))
        self.assertEqual((n.live_bytes, n.live_blocks, n.total_bytes), (57, 2, 150))

    def test_without_the_profiler(self):
        t = self.standard()
        self.assertIsNone(t.profile())
        self.assertEqual(t.stack_counts(), {})
        self.assertEqual(list(t.cached_counters()), [])

    def test_bad_profile_head(self):
        b = self.profiled()
        t = self.build(b)
        self.img.write_u32(self.where["profile"], 32)
        with self.assertRaises(Corrupt) as e:
            Tracer.open(self.img, self.header_addr).profile()
        self.assertIn("counter_size is 32", str(e.exception))

    def test_cache_naming_an_unknown_stack(self):
        b = self.profiled()
        b.add_cached(self.t1, 77, live_bytes=1, last_seq=3)
        with self.assertRaises(Corrupt):
            self.build(b).stack_counts()

    def test_unreadable_cache_is_typed(self):
        b = self.profiled()
        b.add_cached(self.t1, self.sa, live_bytes=1, last_seq=3)
        t = self.build(b)
        self.img.maps = [(s, buf) for s, buf in self.img.maps if s != self.where["cache1"]]
        with self.assertRaises(Inaccessible):
            Tracer.open(self.img, self.header_addr).stack_counts()


if __name__ == "__main__":
    unittest.main()
