"""Tagged blocks (docs/LAYOUT.md "Block tags", version 6; "Freed tags", version 7) on synthetic images: found from
any of their bytes and from nothing else, enumerated from memory full of other words, and
answered by the commands' text without an event number.

Run from the repository root: python3 -m unittest discover -s tests/python -v
"""

import os
import random
import struct
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from mem_trace_gdb.layout import (  # noqa: E402
    NO_SEQ,
    TAG_MAX_SIZE,
    Block,
    Corrupt,
    Region,
    Scanned,
    Tracer,
    VersionMismatch,
)
from mem_trace_gdb.layout import tags  # noqa: E402
from mem_trace_gdb.text import history as history_text  # noqa: E402
from mem_trace_gdb.text import why as why_text  # noqa: E402
from mem_trace_gdb.text.parts import Lookups  # noqa: E402
from image import Image, TraceBuilder  # noqa: E402

# A key as the writer makes them: its top 16 bits neither all zero nor all one.
KEY = 0x9C3E_1F2A_5B6D_7E81
HEAP = 0x1000_0000
HEAP_SIZE = 3 << 20
BIG = 0x7FFF_F000_0000


class ImageReader:
    """The image as InferiorReader is to the tracer: reads, and the mappings."""

    def __init__(self, img, regions=None):
        self.img = img
        self._regions = regions

    def read(self, addr, n):
        return self.img.read(addr, n)

    def regions(self):
        return self.img.regions() if self._regions is None else self._regions


class TagFixture(unittest.TestCase):
    def process(self, tagged=(), fill=None, regions=None):
        """A process with key KEY, a heap mapping at HEAP with ``tagged`` blocks
        ``(q, size, thread, stack)``, and one table block of 1 MiB elsewhere."""
        img = Image()
        img.map_at(HEAP, HEAP_SIZE)
        if fill is not None:
            fill(img)
        for q, size, thread, stack in tagged:
            img.write_tag(KEY, q, size, thread, stack)
        b = TraceBuilder()
        b.tag_key = KEY
        t = b.add_thread(4242, "prog")
        s = b.add_stack([0x5555_5555_516D])
        b.add_block(BIG, 1 << 20, thread=t, stack=s, seq=5)
        self.img, self.header_addr, _ = b.build(img)
        return Tracer.open(ImageReader(self.img, regions), self.header_addr)

    def holder(self, t, addr):
        m = t.find_block(addr, max_gap=0)
        if m is None:
            return None
        self.assertEqual(m.relation, "inside")
        return m.block.addr, m.offset


class FindTaggedTests(TagFixture):
    def test_found_from_each_of_its_bytes_and_no_other(self):
        q = HEAP + 0x1230
        t = self.process([(q, 100, 3, 77)])
        m = t.find_block(q + 37, max_gap=0)
        self.assertEqual(m.block, Block(q, 100, 3, NO_SEQ, 77))
        self.assertTrue(m.block.tagged)
        self.assertEqual(self.holder(t, q), (q, 0))
        self.assertEqual(self.holder(t, q + 37), (q, 37))
        self.assertEqual(self.holder(t, q + 99), (q, 99))
        # One past its end, and the 16 bytes of its own tag, belong to no block.
        self.assertIsNone(self.holder(t, q + 100))
        for a in range(q - 16, q):
            self.assertIsNone(self.holder(t, a), hex(a))
        self.assertEqual(t.live_blocks_containing(q + 50), [m.block])
        self.assertEqual(t.live_blocks_containing(q + 100), [])

    def test_stale_and_copied_tags_are_no_blocks(self):
        q = HEAP + 0x4000
        t = self.process([(q, 64, 1, 2)])
        # A copy of the whole tag further on: bound to the address, no tag there.
        self.img.write(q + 0x100 - 16, struct.pack("<QQ", q ^ KEY, 64 | 1 << 16))
        self.assertIsNone(self.holder(t, q + 0x100))
        self.assertIsNone(self.holder(t, q + 0x108))
        self.assertEqual(self.holder(t, q + 8), (q, 8))
        # Freed: the writer zeroed the check word; the size word left behind is nothing.
        self.img.write_u64(q - 16, 0)
        self.assertIsNone(self.holder(t, q + 8))
        self.assertIsNone(self.holder(t, q))

    def test_the_largest_tagged_block_from_its_last_byte_in_one_read(self):
        q = HEAP + 0x2_0000
        size = TAG_MAX_SIZE - 1
        t = self.process([(q, size, 1, 9)])
        self.img.reads.clear()
        self.assertEqual(self.holder(t, q + size - 1), (q, size - 1))
        scan_reads = [n for a, n in self.img.reads if HEAP <= a < HEAP + HEAP_SIZE]
        self.assertEqual(len(scan_reads), 1, self.img.reads)
        self.assertLessEqual(scan_reads[0], TAG_MAX_SIZE)
        self.assertIsNone(self.holder(t, q + size))

    def test_the_backward_scan_stops_at_the_start_of_the_mapping(self):
        below = HEAP + HEAP_SIZE
        q = below - 0x100

        def fill(img):
            img.map_at(below, 0x1000)
            img.write_tag(KEY, q, 0x1000, 1, 1)

        t = self.process(fill=fill)
        self.assertEqual(self.holder(t, q + 0x80), (q, 0x80))
        self.assertIsNone(self.holder(t, below + 8))

    def test_table_blocks_are_still_found_first(self):
        q = HEAP + 0x3_0010
        t = self.process([(q, 24, 2, 3)])
        m = t.find_block(BIG + 5000, max_gap=0)
        self.assertEqual((m.block.seq, m.offset), (5, 5000))
        self.assertEqual(self.holder(t, q + 23), (q, 23))

    def test_near_misses_name_the_nearest_tagged_block(self):
        a, b = HEAP + 0x1000, HEAP + 0x1100
        t = self.process([(a, 40, 1, 1), (b, 8, 1, 2)])

        def near(addr):
            m = t.find_block(addr, max_gap=4096)
            return m and (m.block.addr, m.relation, m.offset)

        self.assertEqual(near(a + 40), (a, "after", 0))
        self.assertEqual(near(a + 100), (a, "after", 60))
        self.assertEqual(near(b - 8), (b, "before", 8))
        self.assertEqual(near(a - 100), (a, "before", 100))
        self.assertIsNone(near(b + 5000))

    def test_no_key_no_tags(self):
        t = self.process([(HEAP + 0x100, 8, 1, 1)])
        self.img.write_u64(self.header_addr + 136, 0)
        t = Tracer.open(ImageReader(self.img), self.header_addr)
        self.assertEqual(t.header.tag_key, 0)
        self.assertIsNone(t.find_block(HEAP + 0x100, max_gap=0))
        self.assertEqual(len(list(t.blocks())), 1)

    def test_a_failed_read_is_no_block_and_no_traceback(self):
        # The address is in no mapping: the scan's reads fail, and that is "no block".
        t = self.process([(HEAP + 0x100, 8, 1, 1)])
        self.assertIsNone(t.find_block(0x10, max_gap=4096))
        self.assertIsNone(t.find_block(HEAP + HEAP_SIZE + 0x8000, max_gap=4096))

    def test_a_key_the_tracer_never_makes_is_corrupt(self):
        self.process()
        for key, every in ((0x0000_7FFF_1234_5678, "zero"), (2**64 - 1, "one")):
            self.img.write_u64(self.header_addr + 136, key)
            with self.assertRaises(Corrupt) as e:
                Tracer.open(ImageReader(self.img), self.header_addr)
            self.assertEqual(
                str(e.exception),
                f"mem-trace header: tag_key {key:#x} is no key the "
                f"tracer makes (its top 16 bits are all {every})")

    def test_version_5_is_refused(self):
        # Version 5 had word 136 reserved and every live block in the table: refused as
        # every version this reader does not know is, rather than read without tags.
        self.process()
        self.img.write_u32(self.header_addr + 8, 5)
        with self.assertRaises(VersionMismatch):
            Tracer.open(ImageReader(self.img), self.header_addr)


class EnumerateTaggedTests(TagFixture):
    def fill_with_noise(self, img):
        """Random words, pointers into the heap, small integers and tag words of other
        addresses: what a heap holds besides tags."""
        rng = random.Random(0x1234_5678)
        words = []
        for k in range(HEAP_SIZE // 8):
            r = rng.getrandbits(64)
            words.append((r, (HEAP + r % HEAP_SIZE) & ~7, r & 0xFFFF,
                          (HEAP + r % HEAP_SIZE) ^ KEY)[k % 4])
        img.write(HEAP, struct.pack(f"<{len(words)}Q", *words))

    def test_every_tagged_block_and_nothing_else(self):
        rng = random.Random(99)
        want = []
        q, size = HEAP + 16, 0
        while q < HEAP + HEAP_SIZE:
            want.append((q, size))
            size = (size * 7 + 13) % 3000
            q += 16 + ((size + 15) & ~15) + 16 * rng.randrange(300)
        t = self.process([(q, s, 7, s + 1) for q, s in want], fill=self.fill_with_noise)
        self.assertGreater(len(want), 500)
        self.img.reads.clear()
        scanned = Scanned()
        start = time.monotonic()
        got = [(b.addr, b.size) for b in t.tagged_blocks(scanned)]
        elapsed = time.monotonic() - start
        self.assertEqual(got, want)
        self.assertEqual(scanned.unreadable, 0)
        self.assertTrue(all(n <= tags.SCAN_PIECE for _, n in self.img.reads))
        # 3 MiB of noise: well under a second (about 30 ms here).
        self.assertLess(elapsed, 1.0)
        blocks = list(t.blocks())
        self.assertEqual(len(blocks), len(want) + 1)
        totals = t.totals()
        self.assertEqual(totals.live_blocks, len(want) + 1)
        self.assertEqual(totals.live_bytes, sum(s for _, s in want) + (1 << 20))

    def test_a_tag_across_a_piece_boundary_is_found_once(self):
        q = HEAP + tags.SCAN_PIECE
        t = self.process([(q, 32, 1, 1), (q + 64, 16, 1, 1)])
        self.assertEqual([b.addr for b in t.tagged_blocks()], [q, q + 64])

    def test_unreadable_memory_is_counted_and_the_rest_scanned(self):
        regions = [Region(HEAP, HEAP + HEAP_SIZE + tags.SCAN_PIECE, True)]
        t = self.process([(HEAP + 0x100, 8, 1, 1)], regions=regions)
        scanned = Scanned()
        self.assertEqual([b.addr for b in t.tagged_blocks(scanned)], [HEAP + 0x100])
        self.assertEqual(scanned.unreadable, tags.SCAN_PIECE)

    def test_only_heap_regions_are_enumerated(self):
        regions = [Region(HEAP, HEAP + HEAP_SIZE, False)]
        t = self.process([(HEAP + 0x100, 8, 1, 1)], regions=regions)
        self.assertEqual(list(t.tagged_blocks()), [])
        # The backward scan still finds it: every readable mapping bounds it.
        self.assertEqual(self.holder(t, HEAP + 0x104), (HEAP + 0x100, 4))


class TaggedTextTests(TagFixture):
    def test_why_and_history_say_no_event_number(self):
        q = HEAP + 0x2A0
        t = self.process([(q, 100, 1, 1)])
        line = why_text.describe_match(t.find_block(q + 37, max_gap=0))
        self.assertEqual(
            line, f"{q + 37:#x} is 37 bytes inside a 100-byte block "
                  f"[{q:#x}, {q + 100:#x}) allocated by thread 1")
        events = t.history(q + 37)
        self.assertEqual([(e.kind, e.live) for e in events], [("allocation", True)])
        lookups = Lookups(t, lambda pc: [], lambda tid: None)
        self.assertEqual(
            history_text.event_line(lookups, events[0]),
            f"allocation of a 100-byte block [{q:#x}, {q + 100:#x}) by thread 1 (live)"
            ', tid 4242 "prog"')



class LongTagTests(unittest.TestCase):
    def test_long_tags_give_their_sequence_numbers(self):
        """With FLAG_TAG_SEQ (debug mode) the word at q - 24 is the block's sequence number:
        found from inside the block, from above it, and in an enumeration, even when that
        word is the last of the piece before."""
        img = Image()
        img.map_at(HEAP, HEAP_SIZE)
        blocks = [(HEAP + 0x1020, 40, 901), (HEAP + tags.SCAN_PIECE + 16, 64, 902)]
        for q, size, seq in blocks:
            img.write_tag(KEY, q, size, 2, 9)
            img.write(q - 32, struct.pack("<QQ", 0, seq))
        b = TraceBuilder()
        b.tag_key = KEY
        b.flags |= 1 << 5
        img, header, _ = b.build(img)
        t = Tracer.open(ImageReader(img), header)
        for q, size, seq in blocks:
            m = t.find_block(q + size - 1, max_gap=0)
            self.assertEqual((m.block.addr, m.block.seq), (q, seq))
            self.assertFalse(m.block.tagged)
        above = t.find_block(HEAP + 0x1000, max_gap=64)
        self.assertEqual((above.block.addr, above.block.seq), (HEAP + 0x1020, 901))
        self.assertEqual([(b.addr, b.seq) for b in t.tagged_blocks()],
                         [(HEAP + 0x1020, 901), (HEAP + tags.SCAN_PIECE + 16, 902)])


def write_freed_tag(img, q, size, thread, stack, seq, free_seq, free_stack, free_thread):
    """A freed tag (docs/LAYOUT.md "Freed tags"): who freed the block, then ``~(q ^ key)``
    and the live tag's record word."""
    img.write(q - 32, struct.pack(
        "<QQQQ", free_seq | free_stack << 40, seq | free_thread << 40,
        (q ^ KEY) ^ 0xFFFF_FFFF_FFFF_FFFF, size | thread << 16 | stack << 40))


class FreedTagTests(unittest.TestCase):
    def test_a_held_freed_block_is_answered_from_its_tag_once(self):
        """A freed tag answers for its block's bytes only, is no live block, and a free the
        history also holds is listed once."""
        img = Image()
        img.map_at(HEAP, HEAP_SIZE)
        live, held, both = HEAP + 0x1020, HEAP + 0x1060, HEAP + 0x2000
        img.write_tag(KEY, live, 40, 2, 9)
        img.write(live - 32, struct.pack("<QQ", 0, 905))
        write_freed_tag(img, held, 48, 2, 9, seq=910, free_seq=930, free_stack=11,
                        free_thread=3)
        write_freed_tag(img, both, 100, 1, 9, seq=940, free_seq=950, free_stack=11,
                        free_thread=1)
        # A freed tag's words copied elsewhere are bound to their own address.
        img.write(HEAP + 0x3020, bytes(img.read(held - 32, 32)))
        b = TraceBuilder()
        b.tag_key = KEY
        b.flags |= 1 << 5
        b.add_freed(both, 100, thread=1, stack=9, seq=940, free_seq=950, free_stack=11)
        img, header, _ = b.build(img)
        t = Tracer.open(ImageReader(img), header)

        [f] = t.freed_blocks_containing(held + 47)
        self.assertEqual(
            (f.addr, f.size, f.allocation.thread, f.allocation.stack, f.allocation.seq,
             f.free_seq, f.free_stack, f.free_thread, f.by_realloc),
            (held, 48, 2, 9, 910, 930, 11, 3, False))
        self.assertEqual(t.freed_blocks_containing(held + 48), [])
        self.assertEqual(t.freed_blocks_containing(live + 3), [])
        self.assertEqual(t.freed_blocks_containing(HEAP + 0x3020), [])
        self.assertIsNone(t.find_block(held, max_gap=0))
        self.assertEqual([b.addr for b in t.tagged_blocks()], [live])
        self.assertEqual([(r.addr, r.free_seq) for r in t.freed_blocks_containing(both + 99)],
                         [(both, 950)])
        self.assertEqual([(e.kind, e.seq) for e in t.history(held)],
                         [("free", 930), ("allocation", 910)])

    def test_short_tags_are_never_read_as_freed(self):
        """Without FLAG_TAG_SEQ no tag is freed: the words are not read as one."""
        img = Image()
        img.map_at(HEAP, HEAP_SIZE)
        q = HEAP + 0x1060
        write_freed_tag(img, q, 48, 2, 9, seq=910, free_seq=930, free_stack=11, free_thread=3)
        b = TraceBuilder()
        b.tag_key = KEY
        img, header, _ = b.build(img)
        t = Tracer.open(ImageReader(img), header)
        self.assertEqual(t.freed_blocks_containing(q), [])


if __name__ == "__main__":
    unittest.main()
