"""Tests of the pure layout decoder against synthetic images (no gdb needed).

Run: cd /work/main && python3 -m unittest discover -s tests/python -v
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
        self.assertEqual(h.version, 1)
        self.assertEqual(h.address, self.header_addr)
        self.assertEqual(h.shards, self.where["shards"])
        self.assertEqual(h.stacks, self.where["stacks"])
        self.assertEqual(h.threads, self.where["threads"])
        self.assertEqual(h.freed, 0)
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
        h = img.map(128)
        img.write(h, struct.pack("<8sIIIIII7Q40x", b"MEMTRACE", 1, 128, 24, 64, 129, 16, 0, 0, 0, 0, 1, 0, 0))
        t = Tracer.open(img, h)
        self.assertIsNone(t.find_block(HEAP))
        self.assertEqual(t.totals().live_blocks, 0)
        self.assertIsNone(t.stack(1))
        self.assertIsNone(t.thread(1))


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
        self.standard()
        self.img.write_u32(self.header_addr + 8, 2)
        msg = self.assert_only(VersionMismatch, lambda: Tracer.open(self.img, self.header_addr))
        self.assertEqual(
            msg,
            "mem-trace layout version 2 in the process, this gdb script reads version 1: "
            "use the gdb/mem_trace.py from the same build",
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
        img.write(h, b"MEMTRACE" + struct.pack("<I", 1))
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

    def test_capacity_not_power_of_two(self):
        for cap in (0, 3, 24, (1 << 64) - 1):
            self.img_array = self.array_of_heap_shard()
            self.img.write_u64(self.img_array, cap)
            t = Tracer.open(self.img, self.header_addr)
            self.assert_only(Corrupt, lambda: t.find_block(HEAP + 0x2A0))

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


if __name__ == "__main__":
    unittest.main()
