"""mtrace-top, mtrace-peaks and mtrace-leaks without gdb: the leak scan (mem_trace_gdb.scan)
over synthetic memory, and the answers' text (text.profile, text.leaks) over images built
from docs/LAYOUT.md with fake symbols.

Run from the repository root: python3 -m unittest discover -s tests/python -v
"""

import os
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from mem_trace_gdb import scan  # noqa: E402
from mem_trace_gdb.frame import Frame  # noqa: E402
from mem_trace_gdb.layout import Block, Tracer  # noqa: E402
from mem_trace_gdb.text import leaks, profile  # noqa: E402
from mem_trace_gdb.text.parts import Lookups  # noqa: E402
from image import Image, TraceBuilder  # noqa: E402


def block(addr, size, stack=1):
    return Block(addr=addr, size=size, thread=1, seq=1, stack=stack)


class ScanTests(unittest.TestCase):
    def setUp(self):
        self.img = Image()
        self.heap = self.img.map(0x10000)
        self.data = self.img.map(0x100)

    def ptr(self, where, value):
        self.img.write_u64(where, value)

    def test_transitive_interior_and_lost(self):
        h = self.heap
        a, b, c = block(h, 64, 1), block(h + 0x100, 1000, 2), block(h + 0x800, 32, 3)
        self.ptr(self.data + 8, a.addr)          # root -> a (start)
        self.ptr(a.addr + 16, b.addr + 500)      # a -> inside b
        self.ptr(c.addr, a.addr)                 # c -> a: does not make c reachable
        r = scan.scan(self.img, [c, b, a], [scan.Root("data", self.data, self.data + 0x100)])
        self.assertEqual({x.addr for x in r.reachable()}, {a.addr, b.addr})
        self.assertEqual([x.addr for x in r.lost()], [c.addr])
        self.assertEqual(r.root_bytes, 0x100)

    def test_registers_are_roots(self):
        a = block(self.heap, 64)
        r = scan.scan(self.img, [a], [], registers=[a.addr + 63])
        self.assertEqual(len(r.reachable()), 1)
        r = scan.scan(self.img, [a], [], registers=[a.addr + 64])  # one past the end
        self.assertEqual(len(r.lost()), 1)

    def test_a_lost_cycle_stays_lost(self):
        a, b = block(self.heap, 64), block(self.heap + 0x200, 64)
        self.ptr(a.addr, b.addr)
        self.ptr(b.addr, a.addr)
        r = scan.scan(self.img, [a, b], [scan.Root("data", self.data, self.data + 0x100)])
        self.assertEqual(len(r.lost()), 2)

    def test_glibc_next_chunk_header_is_not_a_pointer_into_the_block(self):
        # A 1000-byte block: glibc's next chunk header is at offset 992 (inside the block).
        a = block(self.heap, 1000)
        self.assertEqual(scan.next_chunk_offset(1000), 992)
        self.ptr(self.data, a.addr + 992)
        roots = [scan.Root("data", self.data, self.data + 8)]
        self.assertEqual(len(scan.scan(self.img, [a], roots).lost()), 1)
        self.ptr(self.data, a.addr + 984)
        self.assertEqual(len(scan.scan(self.img, [a], roots).lost()), 0)

    def test_zero_size_block_is_reached_by_its_start(self):
        z, a = block(self.heap + 0x100, 0), block(self.heap + 0x100 + 16, 64)
        r = scan.scan(self.img, [z, a], [], registers=[z.addr])
        self.assertEqual([x.addr for x in r.reachable()], [z.addr])

    def test_unaligned_words_and_tail_bytes_are_not_pointers(self):
        a, b = block(self.heap, 12), block(self.heap + 0x200, 64)
        # b's address at offset 4 (unaligned) and in the 4 tail bytes that make no word.
        self.img.write(a.addr + 4, struct.pack("<Q", b.addr))
        r = scan.scan(self.img, [a, b], [], registers=[a.addr])
        self.assertEqual([x.addr for x in r.reachable()], [a.addr])

    def test_unreadable_roots_and_blocks_are_noted_not_fatal(self):
        a = block(self.heap, 64)
        gone = block(0x7000_0000_0000, 64)  # not mapped in the image
        self.ptr(a.addr, gone.addr)
        r = scan.scan(self.img, [a, gone],
                      [scan.Root("missing", 0x6000_0000_0000, 0x6000_0000_2000)],
                      registers=[a.addr])
        self.assertEqual(len(r.reachable()), 2)
        self.assertEqual(scan.unreadable_bytes(r), 0x2000 + 64)

    def test_neighbours_read_together_and_gaps_ignored(self):
        blocks = [block(self.heap + 0x100 * i, 0x40) for i in range(64)]
        # A stale pointer in a gap between blocks must not count.
        self.ptr(self.heap + 0x80, self.heap + 0x100 * 63)
        for i in range(62):
            self.ptr(blocks[i].addr, blocks[i + 1].addr)
        self.img.reads.clear()
        r = scan.scan(self.img, blocks, [], registers=[blocks[0].addr])
        self.assertEqual(len(r.reachable()), 63)
        self.assertEqual([x.addr for x in r.lost()], [blocks[63].addr])
        self.assertEqual(len(self.img.reads), 63)  # one read per round, each one block

    def test_many_blocks_are_fast(self):
        import time
        img = Image()
        n, size = 16384, 4096
        heap = img.map(n * size)
        array = img.map(8 * n)
        img.write(array, struct.pack(f"<{n}Q", *[heap + i * size for i in range(n)]))
        data = img.map(16)
        img.write_u64(data, array)
        blocks = [block(heap + i * size, size) for i in range(n)] + [block(array, 8 * n, 2)]
        start = time.monotonic()
        r = scan.scan(img, blocks, [scan.Root("data", data, data + 16)])
        self.assertEqual(len(r.reachable()), n + 1)
        self.assertLess(time.monotonic() - start, 5.0)

    def test_group_by_stack_biggest_first_then_more_blocks(self):
        groups = scan.group_by_stack([block(1, 10, 1), block(2, 10, 1), block(3, 30, 2),
                                      block(4, 20, 3)])
        self.assertEqual([(g.stack, g.bytes, g.blocks) for g in groups],
                         [(2, 30, 1), (1, 20, 2), (3, 20, 1)])


SYMBOLS = {
    0x1000: (Frame(0x1000, "hold_site", file="/src/p.c", line=56),),
    0x2000: (Frame(0x2000, "churn_site", file="/src/p.c", line=64),),
    0x3000: (Frame(0x3000, "leak_site", file="/src/p.c", line=76),),
}


def lookups(tracer):
    return Lookups(records=tracer, symbolize=lambda pc: SYMBOLS.get(pc, (Frame(pc),)))


class ProfileTextTests(unittest.TestCase):
    def tracer(self, profiler=True):
        b = TraceBuilder()
        if profiler:
            b.flags = 3
            b.profile = {"resets": 0}
        b.live_bytes, b.peak_bytes, b.peak_seq = 4096 * 2 + 1000, 1 << 20, 50
        self.t1 = b.add_thread(10, "prog", own_live=9192, peak_bytes=1 << 20,
                               allocated_bytes=3 << 20)
        self.t2 = b.add_thread(11, "worker", exited=True, peak_bytes=1 << 20,
                               allocated_bytes=1 << 20)
        hold, churn, leak = b.add_stack([0x1000]), b.add_stack([0x2000]), b.add_stack([0x3000])
        b.add_block(0x5555_0000_0000, 4096, thread=1, stack=hold, seq=1)
        b.add_block(0x5555_0000_2000, 4096, thread=1, stack=hold, seq=2)
        b.add_block(0x5555_0000_4000, 1000, thread=2, stack=leak, seq=3)
        b.add_counter(hold, live_bytes=8192, live_blocks=2, total_bytes=8192, total_blocks=2,
                      last_seq=2)
        b.add_counter(churn, total_bytes=3 << 20, total_blocks=3, peak_bytes=1 << 20,
                      peak_blocks=1, last_seq=60)
        b.add_cached(self.t1, leak, live_bytes=1000, live_blocks=1, total_bytes=1000,
                     total_blocks=1, last_seq=3)
        img, header, _ = b.build()
        return Tracer.open(img, header)

    def test_top_by_live_biggest_last(self):
        t = self.tracer()
        facts = profile.TopFacts.read(t, "live")
        self.assertEqual(profile.top_lines(facts, lookups(t), 10), [
            "live: 9192 bytes in 3 blocks; peak: 1048576 bytes; phase 1 (no reset)",
            "top 2 of 2 stacks by live bytes, biggest last:",
            "# 1: 1000 bytes in 1 block",
            "    #0 0x3000 in leak_site at /src/p.c:76",
            "# 0: 8192 bytes in 2 blocks",
            "    #0 0x1000 in hold_site at /src/p.c:56",
        ])

    def test_top_by_allocated_and_peak(self):
        t = self.tracer()
        out = profile.top_lines(profile.TopFacts.read(t, "allocated"), lookups(t), 1)
        self.assertEqual(out[1:], [
            "top 1 of 3 stacks by bytes ever allocated, biggest last:",
            "# 0: 3145728 bytes in 3 blocks allocated (0 bytes live)",
            "    #0 0x2000 in churn_site at /src/p.c:64",
        ])
        out = profile.top_lines(profile.TopFacts.read(t, "peak"), lookups(t), 1)
        self.assertEqual(out[2], "# 0: 1048576 bytes in 1 block at the peak (0 bytes live now)")

    def test_top_of_a_thread_counts_its_live_blocks(self):
        t = self.tracer()
        out = profile.top_lines(profile.TopFacts.read(t, "blocks", 2), lookups(t), 5)
        self.assertEqual(out[1:], [
            'thread 2, tid 11 "worker", exited: 1000 bytes in 1 live block (from the live-block table)',
            "top 1 of 1 stack by live blocks allocated by thread 2, biggest last:",
            "# 0: 1000 bytes in 1 block",
            "    #0 0x3000 in leak_site at /src/p.c:76",
        ])

    def test_peaks(self):
        t = self.tracer()
        out = profile.peaks_lines(profile.PeaksFacts.read(t), lookups(t), 1)
        self.assertEqual(out, [
            "live now: 9192 bytes in 3 blocks",
            "peak: 1048576 bytes (at event #50, since the start)",
            "phase 1 (no reset)",
            "threads: 2",
            '  thread 1, tid 10 "prog": live 9192 bytes, peak 1048576 bytes, allocated 3145728 bytes',
            '  thread 2, tid 11 "worker", exited: live 0 bytes, peak 1048576 bytes, allocated 1048576 bytes',
            "top 1 of 3 stacks by bytes at the peak, biggest last:",
            "# 0: 1048576 bytes in 1 block at the peak (0 bytes live now)",
            "    #0 0x2000 in churn_site at /src/p.c:64",
        ])

    def test_without_the_profiler(self):
        t = self.tracer(profiler=False)
        with self.assertRaises(profile.NotProfiler) as e:
            profile.TopFacts.read(t, "live")
        self.assertIn("--features profiler", str(e.exception))
        self.assertNotIn("\n", str(e.exception))
        with self.assertRaises(profile.NotProfiler):
            profile.PeaksFacts.read(t)

    def test_leak_lines(self):
        t = self.tracer()
        blocks = list(t.blocks())
        hold = [b for b in blocks if b.size == 4096]
        result = scan.ScanResult(blocks=blocks, reached={blocks.index(b) for b in hold},
                                 root_bytes=4096)
        facts = leaks.LeakFacts.from_scan(result, objects=3, stacks=1, register_sets=1)
        self.assertEqual(leaks.lines(facts, lookups(t)), [
            "scanned 4096 bytes of roots (3 objects' data, 1 thread stack, 1 register set), "
            "reached 2 of 3 live blocks",
            "definitely lost: 1000 bytes in 1 block, allocated from:",
            "    #0 0x3000 in leak_site at /src/p.c:76",
            "still reachable: 8192 bytes in 2 blocks, allocated from:",
            "    #0 0x1000 in hold_site at /src/p.c:56",
            "SUMMARY: 1000 bytes definitely lost in 1 block; 8192 bytes still reachable in 2 blocks",
        ])
        out = leaks.lines(facts, lookups(t), limit=0 or None, reachable=False)
        self.assertNotIn("still reachable: 8192 bytes in 2 blocks, allocated from:", out)


if __name__ == "__main__":
    unittest.main()
