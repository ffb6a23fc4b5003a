"""mtrace-top, mtrace-peaks and mtrace-leaks without gdb: the leak scan (mem_trace_gdb.scan)
over synthetic memory, and the answers' text (text.profile, text.leaks) over images built
from docs/LAYOUT.md with fake symbols.

Run from the repository root: python3 -m unittest discover -s tests/python -v
"""

import os
import struct
import sys
import unittest
from bisect import bisect_right

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

    def roots(self):
        return [scan.Root("data", self.data, self.data + 0x100)]

    def classes(self, r):
        """{address: level} of a scan's blocks."""
        return {b.addr: level for b, level in zip(r.blocks, r.levels)}

    def test_start_chains_reachable_interior_possibly_and_lost(self):
        h = self.heap
        a, b, c = block(h, 64, 1), block(h + 0x100, 1000, 2), block(h + 0x800, 32, 3)
        d = block(h + 0x900, 48, 4)
        self.ptr(self.data + 8, a.addr)          # root -> a (start)
        self.ptr(a.addr + 8, d.addr)             # a -> d (start): a chain of starts
        self.ptr(a.addr + 16, b.addr + 500)      # a -> inside b: possibly lost
        self.ptr(c.addr, a.addr)                 # c -> a: does not reach c
        r = scan.scan(self.img, [c, b, a, d], self.roots())
        self.assertEqual(self.classes(r), {a.addr: scan.REACHABLE, d.addr: scan.REACHABLE,
                                           b.addr: scan.POSSIBLY, c.addr: scan.LOST})
        self.assertEqual([x.addr for x in r.reachable()], [a.addr, d.addr])
        self.assertEqual([x.addr for x in r.possibly_lost()], [b.addr])
        self.assertEqual([x.addr for x in r.lost()], [c.addr])
        self.assertEqual(r.root_bytes, 0x100)

    def test_an_interior_root_pointer_is_possibly_lost(self):
        a = block(self.heap, 64)
        self.ptr(self.data, a.addr + 24)
        r = scan.scan(self.img, [a], self.roots())
        self.assertEqual(r.levels, [scan.POSSIBLY])

    def test_a_start_pointer_from_a_possibly_lost_block_gives_possibly(self):
        # leaks.rs: a pointer to a block's start passes on the level of the memory it is in,
        # so what a possibly lost block points to (start or middle) is possibly lost too;
        # only chains of start pointers from the roots make blocks reachable.
        a, b, c = block(self.heap, 64), block(self.heap + 0x100, 64), block(self.heap + 0x200, 64)
        self.ptr(self.data, a.addr + 8)          # root -> inside a
        self.ptr(a.addr + 16, b.addr)            # a -> b (start)
        self.ptr(b.addr, c.addr + 8)             # b -> inside c
        r = scan.scan(self.img, [a, b, c], self.roots())
        self.assertEqual(r.levels, [scan.POSSIBLY] * 3)

    def test_a_start_pointer_from_reachable_memory_wins_over_interior_ones(self):
        # b is first met through an interior pointer, then through its start from a block
        # reached later: reachable, and what b points to at its start is reachable too.
        a, b, c = block(self.heap, 64), block(self.heap + 0x100, 64), block(self.heap + 0x200, 64)
        x = block(self.heap + 0x300, 64)
        self.ptr(self.data, b.addr + 8)          # root -> inside b
        self.ptr(self.data + 8, x.addr)          # root -> x -> a -> b (starts)
        self.ptr(x.addr, a.addr)
        self.ptr(a.addr, b.addr)
        self.ptr(b.addr + 8, c.addr)             # b -> c (start)
        r = scan.scan(self.img, [a, b, c, x], self.roots())
        self.assertEqual(r.levels, [scan.REACHABLE] * 4)

    def test_registers_are_roots(self):
        a = block(self.heap, 64)
        r = scan.scan(self.img, [a], [], registers=[a.addr])
        self.assertEqual(r.levels, [scan.REACHABLE])
        r = scan.scan(self.img, [a], [], registers=[a.addr + 63])
        self.assertEqual(r.levels, [scan.POSSIBLY])
        r = scan.scan(self.img, [a], [], registers=[a.addr + 64])  # one past the end
        self.assertEqual(r.levels, [scan.LOST])

    def test_a_lost_cycle_stays_lost(self):
        a, b = block(self.heap, 64), block(self.heap + 0x200, 64)
        self.ptr(a.addr, b.addr)
        self.ptr(b.addr, a.addr)
        r = scan.scan(self.img, [a, b], self.roots())
        self.assertEqual(len(r.lost()), 2)

    def test_glibc_next_header_offsets(self):
        # The twin of glibc_next_header_lies_inside_only_for_sizes_1_to_8_past_16k (scan.rs).
        for size in range(4096):
            inside = size > 16 and 1 <= size % 16 <= 8
            self.assertEqual(scan.glibc_next_header(size), size & ~15 if inside else None, size)

    def test_a_pointer_to_glibc_next_header_is_not_a_pointer_into_the_block(self):
        # glibc's bins and top point at the next chunk's header: +992 of a 1000-byte block,
        # +96 of a 100-byte one. Neither reachable nor possibly lost.
        roots = [scan.Root("data", self.data, self.data + 8)]

        def level(b, p):
            self.ptr(self.data, p)
            return scan.scan(self.img, [b], roots).levels

        a = block(self.heap, 1000)
        self.assertEqual(level(a, a.addr + 992), [scan.LOST])
        self.assertEqual(level(a, a.addr + 984), [scan.POSSIBLY])
        c = block(self.heap + 0x800, 100)
        self.assertEqual(level(c, c.addr + 96), [scan.LOST])
        self.assertEqual(level(c, c.addr + 88), [scan.POSSIBLY])
        # No header inside a 16- or 64-byte block: 8 bytes before the end is interior.
        b = block(self.heap + 0x1000, 64)
        self.assertEqual(level(b, b.addr + 56), [scan.POSSIBLY])
        d = block(self.heap + 0x1800, 16)
        self.assertEqual(level(d, d.addr + 8), [scan.POSSIBLY])
        # An 8-byte block: its start counts as its start.
        e = block(self.heap + 0x2000, 8)
        self.assertEqual(level(e, e.addr), [scan.REACHABLE])

    def test_a_thread_control_block_makes_its_dtv_reachable(self):
        # A stack mapping whose top holds a control block (tcb and self point at it, dtv at
        # +8 is the DTV's start + 16): the DTV, a live block, is reached from its start.
        stack = self.img.map(0x8000)
        tcb = stack + 0x8000 - 0x900
        dtv = block(self.heap, 288)
        self.ptr(tcb, tcb)
        self.ptr(tcb + 8, dtv.addr + 16)
        self.ptr(tcb + 16, tcb)
        words = scan.dtv_words(self.img, [(stack, stack + 0x8000)], [dtv])
        self.assertEqual(words, [dtv.addr])
        r = scan.scan(self.img, [dtv], self.roots(), words)
        self.assertEqual(r.levels, [scan.REACHABLE])
        # A mapping that holds live blocks is no stack; nor is one without the pattern.
        self.assertEqual(scan.dtv_words(self.img, [(self.heap, self.heap + 0x10000)], [dtv]), [])
        self.ptr(tcb + 16, 0)
        self.assertEqual(scan.dtv_words(self.img, [(stack, stack + 0x8000)], [dtv]), [])

    def test_definitely_lost_splits_into_direct_and_indirect(self):
        # The twin of definitely_lost_splits_into_direct_and_indirect (scan.rs).
        w, r, x, y, z, p, q, v = (block(self.heap + k * 0x100, 64) for k in range(8))
        self.ptr(r.addr, x.addr)
        self.ptr(r.addr + 8, y.addr + 24)
        self.ptr(y.addr, z.addr)
        self.ptr(p.addr, q.addr)
        self.ptr(q.addr, p.addr)
        self.ptr(v.addr + 16, w.addr)
        res = scan.scan(self.img, [w, r, x, y, z, p, q, v], self.roots())
        self.assertEqual(len(res.lost()), 8)
        self.assertEqual(sorted(b.addr for b in res.indirectly_lost()),
                         [b.addr for b in (w, x, y, z, q)])

    def test_zero_size_block_is_reached_by_its_start(self):
        z, a = block(self.heap + 0x100, 0), block(self.heap + 0x100 + 16, 64)
        r = scan.scan(self.img, [z, a], [], registers=[z.addr])
        self.assertEqual([x.addr for x in r.reachable()], [z.addr])
        self.assertEqual([x.addr for x in r.lost()], [a.addr])

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
        # One read per round, each one block, and the lost one's to split the lost.
        self.assertEqual(len(self.img.reads), 64)

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

    def test_same_classes_as_the_worklist_of_leaks_rs(self):
        # leaks.rs's algorithm transcribed (Scan::words and Scan::drain, one block at a
        # time): random heaps of start pointers, interior ones, ones 8 bytes before an end,
        # zero-size blocks and cycles must get the same class from scan.scan.
        import random

        def reference(img, blocks, roots, registers):
            blocks = sorted(blocks, key=lambda b: b.addr)
            starts = [b.addr for b in blocks]
            level = [scan.LOST] * len(blocks)
            work = []
            top = blocks[-1].addr + blocks[-1].size

            def words(values, frm):
                for p in values:
                    if p < starts[0] or p >= top:
                        continue
                    i = bisect_right(starts, p) - 1
                    b = blocks[i]
                    if p == b.addr:
                        lv = frm
                    elif p < b.addr + b.size and p - b.addr != scan.glibc_next_header(b.size):
                        lv = min(frm, scan.POSSIBLY)
                    else:
                        continue
                    if lv > level[i]:
                        level[i] = lv
                        work.append(i)

            def u64s(addr, n):
                n &= ~7
                return struct.unpack(f"<{n // 8}Q", img.read(addr, n)) if n else ()

            words(registers, scan.REACHABLE)
            for r in roots:
                words(u64s(r.start, r.end - r.start), scan.REACHABLE)
            while work:
                i = work.pop()
                words(u64s(blocks[i].addr, blocks[i].size), level[i])
            return {b.addr: lv for b, lv in zip(blocks, level)}

        rng = random.Random(7)
        for _ in range(300):
            img = Image()
            n = rng.randint(1, 12)
            sizes = [rng.choice([0, 8, 16, 24, 40, 64, 1000]) for _ in range(n)]
            heap = img.map(sum(max(size, 16) + 16 for size in sizes))
            blocks, at = [], heap
            for k, size in enumerate(sizes):
                blocks.append(block(at, size, k))
                at += max(size, 16) + 16
            data = img.map(64)

            def target():
                b = rng.choice(blocks)
                return b.addr + rng.choice([0, 0, 8, max(b.size - 8, 0), b.size, 16])

            for _w in range(rng.randint(0, 4)):
                img.write_u64(data + 8 * rng.randrange(8), target())
            for b in blocks:
                for off in range(0, b.size - b.size % 8, 8):
                    if rng.random() < 0.3:
                        img.write_u64(b.addr + off, target())
            roots = [scan.Root("data", data, data + 64)]
            registers = [target()] if rng.random() < 0.3 else []
            want = reference(img, blocks, roots, registers)
            r = scan.scan(img, blocks, roots, registers)
            self.assertEqual(self.classes(r), want)

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
    def tracer(self, profiler=True, shard_bytes=None):
        """The sites' tables; ``shard_bytes`` ({shard: bytes}) scribbles over shards' live
        bytes."""
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
        img, header, where = b.build()
        for shard, value in (shard_bytes or {}).items():
            img.write_u64(where["shards"] + 64 * shard + 32, value)
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

    def test_impossible_numbers_are_flagged(self):
        # The twin of impossible_numbers_are_flagged in crates/read/src/answer/tests/profile.rs.
        b = TraceBuilder()
        b.flags = 3
        b.profile = {"resets": 0}
        b.live_bytes, b.peak_bytes, b.peak_seq = 2**64 - 1, 4096, 5
        b.add_thread(10, "prog", own_live=8192, peak_bytes=4096, allocated_bytes=8192)
        fine, wrapped = b.add_stack([0x1000]), b.add_stack([0x2000])
        b.add_counter(fine, live_bytes=4096, live_blocks=1, total_bytes=4096, total_blocks=1,
                      last_seq=2)
        b.add_counter(wrapped, live_bytes=-4096, total_bytes=4096, total_blocks=1, last_seq=3)
        img, header, _ = b.build()
        t = Tracer.open(img, header)
        flags = [
            "inconsistent tables: live bytes 18446744073709551615 above the peak 4096",
            "inconsistent tables: thread 1 live bytes 8192 above its peak 4096",
            "inconsistent tables: the counters of 1 stack sum below zero or to more live than "
            f"ever allocated (stack {wrapped} first)",
        ]
        out = profile.top_lines(profile.TopFacts.read(t, "live"), lookups(t), 10)
        self.assertEqual(out[:4], [
            "live: 18446744073709551615 bytes in 0 blocks; peak: 4096 bytes; phase 1 (no reset)",
            *flags,
        ])
        out = profile.peaks_lines(profile.PeaksFacts.read(t), lookups(t), 1)
        self.assertEqual(out[3:7], [*flags, "threads: 1"])
        t = self.tracer()
        out = profile.top_lines(profile.TopFacts.read(t, "live"), lookups(t), 10)
        self.assertFalse([line for line in out if line.startswith("inconsistent")], out)

    def test_shard_sums_past_2_64_are_flagged(self):
        # The twin of shard_sums_past_2_64_are_flagged in crates/read/src/answer/tests/profile.rs.
        t = self.tracer(shard_bytes={0: 3 << 61, 1: 3 << 61, 2: 3 << 61})
        flag = "inconsistent tables: live counts sum past 2^64 or below zero"
        out = profile.top_lines(profile.TopFacts.read(t, "live"), lookups(t), 10)
        self.assertEqual(out[1], flag, out)
        out = profile.peaks_lines(profile.PeaksFacts.read(t), lookups(t), 1)
        self.assertEqual(out[3], flag, out)

    def test_without_the_profiler(self):
        t = self.tracer(profiler=False)
        with self.assertRaises(profile.NotProfiler) as e:
            profile.TopFacts.read(t, "live")
        self.assertIn("cargo build --release", str(e.exception))
        self.assertNotIn("\n", str(e.exception))
        with self.assertRaises(profile.NotProfiler):
            profile.PeaksFacts.read(t)

    def test_leak_lines(self):
        t = self.tracer()
        blocks = list(t.blocks())
        hold = [b for b in blocks if b.size == 4096]
        levels = [scan.REACHABLE if b in hold else scan.LOST for b in blocks]
        result = scan.ScanResult(blocks=blocks, levels=levels, root_bytes=4096)
        facts = leaks.LeakFacts.from_scan(result, objects=3, stacks=1, register_sets=1)
        self.assertEqual(leaks.lines(facts, lookups(t)), [
            "scanned 4096 bytes of roots (3 objects' data, 1 thread stack, 1 register set), "
            "reached 2 of 3 live blocks",
            "definitely lost: 1 stack, biggest first:",
            "definitely lost: 1000 bytes in 1 block, allocated from:",
            "    #0 0x3000 in leak_site at /src/p.c:76",
            "still reachable: 1 stack, biggest first:",
            "still reachable: 8192 bytes in 2 blocks, allocated from:",
            "    #0 0x1000 in hold_site at /src/p.c:56",
            "SUMMARY: 1000 bytes definitely lost in 1 block (direct: 1000 bytes in 1 block, "
            "indirect: 0 bytes in 0 blocks); 0 bytes possibly lost in 0 blocks; "
            "8192 bytes still reachable in 2 blocks",
        ])
        out = leaks.lines(facts, lookups(t), limit=0 or None, reachable=False)
        self.assertNotIn("still reachable: 8192 bytes in 2 blocks, allocated from:", out)
        self.assertNotIn("still reachable: 1 stack, biggest first:", out)

    def test_leak_lines_with_possibly_lost_blocks(self):
        t = self.tracer()
        blocks = list(t.blocks())
        levels = [scan.POSSIBLY if b.size == 1000 else scan.REACHABLE for b in blocks]
        result = scan.ScanResult(blocks=blocks, levels=levels, root_bytes=4096)
        facts = leaks.LeakFacts.from_scan(result, objects=3, stacks=1, register_sets=1)
        self.assertEqual(leaks.lines(facts, lookups(t)), [
            "scanned 4096 bytes of roots (3 objects' data, 1 thread stack, 1 register set), "
            "reached 3 of 3 live blocks (1 only through interior pointers)",
            "no block is definitely lost",
            "possibly lost: 1 stack, biggest first:",
            "possibly lost: 1000 bytes in 1 block, allocated from:",
            "    #0 0x3000 in leak_site at /src/p.c:76",
            "still reachable: 1 stack, biggest first:",
            "still reachable: 8192 bytes in 2 blocks, allocated from:",
            "    #0 0x1000 in hold_site at /src/p.c:56",
            "SUMMARY: 0 bytes definitely lost in 0 blocks (direct: 0 bytes in 0 blocks, indirect: "
            "0 bytes in 0 blocks); 1000 bytes possibly lost in 1 block; "
            "8192 bytes still reachable in 2 blocks",
        ])
        # --no-reachable hides only the still reachable groups.
        out = leaks.lines(facts, lookups(t), reachable=False)
        self.assertIn("possibly lost: 1000 bytes in 1 block, allocated from:", out)
        self.assertNotIn("still reachable: 8192 bytes in 2 blocks, allocated from:", out)


if __name__ == "__main__":
    unittest.main()
