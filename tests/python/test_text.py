"""The answers' text (mem_trace_gdb.text), without gdb: fake symbolizers and thread lookups.

The expected lines are written out in full, byte for byte: they are what users
read and what the gdb tests (tests/gdb_why.rs, tests/freed_blocks.rs,
test_gdb.py) match against a real process.

Run from the repository root: python3 -m unittest discover -s tests/python -v
"""

import ast
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "python", "mem_trace_gdb")
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from mem_trace_gdb.frame import Frame, unsymbolized  # noqa: E402
from mem_trace_gdb.layout import (  # noqa: E402
    CUT_MARKER,
    Block,
    Corrupt,
    Event,
    FreedBlock,
    History,
    Inaccessible,
    Match,
    Stack,
    Thread,
    Tracer,
)
from mem_trace_gdb.text import history, info, parts, why  # noqa: E402
from mem_trace_gdb.text.parts import Lookups  # noqa: E402
from image import TraceBuilder  # noqa: E402

MAIN, WORKER = 1, 2
ALLOC_STACK, FREE_STACK, DEEP_STACK, EMPTY_STACK, BROKEN_STACK, UNPUBLISHED_STACK = 1, 2, 3, 4, 5, 6
CUT_STACK, BUCKET_STACK = 7, 8

PC_MAKE, PC_MAIN, PC_FREE, PC_START = 0x55555555518B, 0x5555555551C6, 0x5555555551F3, 0x5555555550D1
PC_INLINED, PC_UNKNOWN = 0x555555555300, 0x7FFFF7A00010

SYMBOLS = {
    PC_MAKE: (Frame(PC_MAKE, "new_order", file="/src/demo.c", line=16),),
    PC_MAIN: (Frame(PC_MAIN, "main", file="/src/demo.c", line=30),),
    PC_FREE: (Frame(PC_FREE, "release", file="/src/demo.c", line=40),),
    PC_START: (Frame(PC_START, symbol="_start+0x21", module="demo"),),
    PC_INLINED: (
        Frame(PC_INLINED, "inner", inlined=True, file="/src/demo.c", line=7),
        Frame(PC_INLINED, "outer", file="/src/demo.c", line=12),
    ),
}


def fake_symbolize(pc):
    """gdb's symbolizer stand-in; a pc it does not know has no symbol at all."""
    return SYMBOLS.get(pc, (Frame(pc),))


class FakeRecords:
    """Stacks and thread records as a Tracer would return them, or its errors."""

    def __init__(self):
        self.stacks = {
            ALLOC_STACK: Stack(ALLOC_STACK, (PC_MAKE, PC_MAIN)),
            FREE_STACK: Stack(FREE_STACK, (PC_FREE, PC_MAIN)),
            DEEP_STACK: Stack(DEEP_STACK, (PC_INLINED, PC_UNKNOWN, PC_MAIN, PC_START)),
            EMPTY_STACK: Stack(EMPTY_STACK, ()),
            CUT_STACK: Stack(CUT_STACK, (PC_MAKE, CUT_MARKER)),
            BUCKET_STACK: Stack(BUCKET_STACK, (CUT_MARKER,)),
        }
        self.threads = {
            MAIN: Thread(MAIN, 18786, False, "demo"),
            WORKER: Thread(WORKER, 18790, True, "worker"),
        }

    def stack(self, stack_id):
        if stack_id == BROKEN_STACK:
            raise Inaccessible(0x7000, 16, f"stack {stack_id}")
        return self.stacks.get(stack_id)

    def thread(self, index):
        if index == 99:
            raise Corrupt("thread index 99 is beyond the 2 handed out")
        return self.threads.get(index)


GDB_THREADS = {18786: 1}


def lookups(records=None, symbolize=fake_symbolize):
    return Lookups(records or FakeRecords(), symbolize, GDB_THREADS.get)


BLOCK = Block(addr=0x5555555592C0, size=24, thread=MAIN, seq=2, stack=ALLOC_STACK)
ALLOC_FRAMES = [
    "    #0 0x55555555518b in new_order at /src/demo.c:16",
    "    #1 0x5555555551c6 in main at /src/demo.c:30",
]
FREE_FRAMES = [
    "    #0 0x5555555551f3 in release at /src/demo.c:40",
    "    #1 0x5555555551c6 in main at /src/demo.c:30",
]
HISTORY_ON = History(address=0x6000, flags=1, capacity=4096, records=0x7000, written=3,
                     quarantine_limit=0, quarantined_bytes=0, errors=0)
HISTORY_NO_FREE_STACKS = History(address=0x6000, flags=0, capacity=4096, records=0x7000,
                                 written=3, quarantine_limit=0, quarantined_bytes=0, errors=0)


def freed(block, free_seq=7, free_stack=FREE_STACK, free_thread=MAIN, realloc=False):
    return FreedBlock(allocation=block, free_seq=free_seq, free_stack=free_stack,
                      free_thread=free_thread, flags=1 if realloc else 0)


def why_lines(address, match=None, freed_blocks=(), max_frames=None, lk=None, **facts):
    facts.setdefault("history", HISTORY_ON)
    f = why.WhyFacts(address=address, match=match, freed=tuple(freed_blocks), **facts)
    return why.lines(f, lk or lookups(), max_frames)


class WhyLiveBlockTests(unittest.TestCase):
    def test_interior_pointer(self):
        self.assertEqual(
            why_lines(0x5555555592C4, Match(0x5555555592C4, BLOCK, "inside", 4)),
            ['0x5555555592c4 is 4 bytes inside a 24-byte block [0x5555555592c0, 0x5555555592d8) '
             'allocated by thread 1 (#2), tid 18786 "demo", gdb thread 1'] + ALLOC_FRAMES,
        )

    def test_start_of_block(self):
        lines = why_lines(BLOCK.addr, Match(BLOCK.addr, BLOCK, "inside", 0))
        self.assertEqual(
            lines[0],
            '0x5555555592c0 is at the start of a 24-byte block [0x5555555592c0, 0x5555555592d8) '
            'allocated by thread 1 (#2), tid 18786 "demo", gdb thread 1',
        )

    def test_one_byte_inside(self):
        lines = why_lines(BLOCK.addr + 1, Match(BLOCK.addr + 1, BLOCK, "inside", 1))
        self.assertTrue(lines[0].startswith("0x5555555592c1 is 1 byte inside a 24-byte block"))

    def test_one_past_the_end_and_after(self):
        note = ("    (not inside any live block nor any remembered freed block: an overflow, "
                "or a pointer to an untracked or long-freed block)")
        self.assertEqual(
            why_lines(BLOCK.end, Match(BLOCK.end, BLOCK, "after", 0)),
            ['0x5555555592d8 is 0 bytes after a 24-byte block [0x5555555592c0, 0x5555555592d8) '
             'allocated by thread 1 (#2), tid 18786 "demo", gdb thread 1', note] + ALLOC_FRAMES,
        )
        lines = why_lines(BLOCK.end + 4, Match(BLOCK.end + 4, BLOCK, "after", 4))
        self.assertTrue(lines[0].startswith("0x5555555592dc is 4 bytes after a 24-byte block"))
        lines = why_lines(BLOCK.addr - 1, Match(BLOCK.addr - 1, BLOCK, "before", 1))
        self.assertTrue(lines[0].startswith("0x5555555592bf is 1 byte before a 24-byte block"))

    def test_nothing_tracked(self):
        self.assertEqual(why_lines(0x10), ["0x10 is not inside any block tracked by mem-trace"])
        self.assertEqual(
            why_lines(0x10, untracked=3),
            ["0x10 is not inside any block tracked by mem-trace",
             "(3 blocks could not be tracked; it may be one of them)"],
        )

    def test_without_a_record_of_frees_an_unknown_address_names_debug_mode(self):
        note = ("this process kept no record of frees (profile mode): the address may be a "
                "dangling pointer; run with --mode debug to have frees answered")
        self.assertEqual(
            why_lines(0x10, history=None, no_frees_kept=True),
            ["0x10 is not inside any block tracked by mem-trace", f"({note})"],
        )
        lines = why_lines(BLOCK.end + 4, Match(BLOCK.end + 4, BLOCK, "after", 4),
                          history=None, no_frees_kept=True)
        self.assertEqual(lines[1], f"    (not inside any live block, and {note})")

    def test_nothing_tracked_in_an_attached_process_says_when_it_was_attached(self):
        self.assertEqual(
            why_lines(0x10, attached_at=4321),
            ["0x10 is not inside any block tracked by mem-trace",
             "(mem-trace was attached to this process at event #4321: blocks allocated "
             "before that are unknown to it; it may be one of them)"],
        )

    def test_saturated_size(self):
        big = Block(addr=0x7F0000000000, size=(1 << 40) - 1, thread=MAIN, seq=9, stack=ALLOC_STACK)
        line = why_lines(big.addr + 8, Match(big.addr + 8, big, "inside", 8))[0]
        self.assertIn("8 bytes inside a block of at least 1099511627775 bytes [0x7f0000000000, ", line)

    def test_live_block_over_freed_memory(self):
        old = Block(addr=BLOCK.addr, size=48, thread=MAIN, seq=1, stack=ALLOC_STACK)
        lines = why_lines(BLOCK.addr, Match(BLOCK.addr, BLOCK, "inside", 0), [freed(old)])
        self.assertIn("allocated by thread 1 (#2)", lines[0])
        self.assertEqual(
            lines[-1], "    (older freed blocks covered this address too: 1; see mtrace-history)")

    def test_history_unreadable_is_one_more_line(self):
        lines = why_lines(BLOCK.addr, Match(BLOCK.addr, BLOCK, "inside", 0),
                          freed_error="cannot read the freed-block history ring (40 bytes at 0x7000)")
        self.assertEqual(lines[1:3], ALLOC_FRAMES)
        self.assertEqual(lines[-1], "    (freed-block history unreadable: cannot read the "
                                    "freed-block history ring (40 bytes at 0x7000))")


class WhyFreedBlockTests(unittest.TestCase):
    OLD = Block(addr=0x55555555B4E0, size=72, thread=MAIN, seq=6, stack=ALLOC_STACK)

    def test_freed_with_free_stack(self):
        self.assertEqual(
            why_lines(self.OLD.addr + 16, None, [freed(self.OLD)]),
            ['0x55555555b4f0 is 16 bytes inside a 72-byte block [0x55555555b4e0, 0x55555555b528) '
             'freed by thread 1 (#7), tid 18786 "demo", gdb thread 1']
            + FREE_FRAMES
            + ['previously allocated by thread 1 (#6), tid 18786 "demo", gdb thread 1']
            + ALLOC_FRAMES,
        )

    def test_freed_without_free_stack(self):
        record = freed(self.OLD, free_stack=0)
        lines = why_lines(self.OLD.addr, None, [record], history=HISTORY_NO_FREE_STACKS)
        self.assertTrue(lines[0].startswith("0x55555555b4e0 is at the start of a 72-byte block "))
        self.assertEqual(lines[1], "    (no free stack was recorded: MEM_TRACE_FREE_STACKS=0)")
        self.assertEqual(lines[2], 'previously allocated by thread 1 (#6), tid 18786 "demo", gdb thread 1')
        # Free stacks on, but this one missing: no reason to give.
        lines = why_lines(self.OLD.addr, None, [record], history=HISTORY_ON)
        self.assertEqual(lines[1], "    (no free stack recorded)")
        lines = why_lines(self.OLD.addr, None, [record], history=None)
        self.assertEqual(lines[1], "    (no free stack recorded)")

    def test_freed_by_realloc(self):
        line = why_lines(self.OLD.addr, None, [freed(self.OLD, realloc=True)])[0]
        self.assertEqual(
            line,
            '0x55555555b4e0 is at the start of a 72-byte block [0x55555555b4e0, 0x55555555b528) '
            'freed (by realloc) by thread 1 (#7), tid 18786 "demo", gdb thread 1',
        )

    def test_newest_of_several_and_the_count_of_older_ones(self):
        newer = freed(self.OLD, free_seq=12, free_thread=WORKER)
        lines = why_lines(self.OLD.addr, None, [newer, freed(self.OLD), freed(self.OLD, 3)])
        self.assertIn("freed by thread 2 (#12), tid 18790 \"worker\", exited", lines[0])
        self.assertEqual(
            lines[-1], "    (older freed blocks covered this address too: 2; see mtrace-history)")

    def test_freed_block_beats_a_nearby_live_one(self):
        nearby = Match(self.OLD.addr + 2, BLOCK, "after", 2)
        lines = why_lines(self.OLD.addr + 2, nearby, [freed(self.OLD)])
        self.assertIn("is 2 bytes inside a 72-byte block", lines[0])
        self.assertIn(" freed by thread 1 ", lines[0])


class ThreadTests(unittest.TestCase):
    def first_line(self, thread_index, records=None):
        block = Block(addr=0x1000, size=16, thread=thread_index, seq=5, stack=ALLOC_STACK)
        return why_lines(0x1000, Match(0x1000, block, "inside", 0), lk=lookups(records))[0]

    def test_unknown_thread(self):
        self.assertEqual(
            self.first_line(0),
            "0x1000 is at the start of a 16-byte block [0x1000, 0x1010) allocated by an unknown thread (#5)",
        )

    def test_unpublished_thread_record(self):
        self.assertTrue(self.first_line(7).endswith("allocated by thread 7 (#5)"))

    def test_unreadable_thread_record(self):
        self.assertTrue(self.first_line(99).endswith(
            "allocated by thread 99 (#5) (thread record unreadable: "
            "thread index 99 is beyond the 2 handed out)"))

    def test_exited_thread_has_no_gdb_thread(self):
        self.assertTrue(self.first_line(WORKER).endswith(
            'allocated by thread 2 (#5), tid 18790 "worker", exited'))

    def test_thread_gdb_does_not_list_and_nameless_thread(self):
        records = FakeRecords()
        records.threads[3] = Thread(3, 555, False, "")
        self.assertTrue(self.first_line(3, records).endswith("allocated by thread 3 (#5), tid 555"))

    def test_control_characters_in_a_name_are_escaped(self):
        records = FakeRecords()
        records.threads[3] = Thread(3, 555, False, 'a\nb\x1b[31m"\\\t\x7f\u202e\x00')
        line = self.first_line(3, records)
        self.assertEqual(line.count("\n"), 0)
        self.assertNotIn("\x1b", line)
        self.assertTrue(line.endswith(
            'allocated by thread 3 (#5), tid 555 "a\\nb\\x1b[31m\\"\\\\\\t\\x7f\\u202e\\x00"'), line)

    def test_printable_non_ascii_names_stay(self):
        self.assertEqual(parts.quoted("wörker ✓"), '"wörker ✓"')
        self.assertEqual(parts.quoted("\ufffd"), '"\ufffd"')


class StackTests(unittest.TestCase):
    def stack(self, stack_id, max_frames=None, symbolize=fake_symbolize, kind="allocation"):
        return parts.stack_lines(lookups(symbolize=symbolize), stack_id, max_frames, kind)

    def test_inlined_frames_and_frames_without_symbols(self):
        self.assertEqual(self.stack(DEEP_STACK), [
            "    #0 0x555555555300 in inner (inlined) at /src/demo.c:7",
            "    #1 0x555555555300 in outer at /src/demo.c:12",
            "    #2 0x7ffff7a00010",
            "    #3 0x5555555551c6 in main at /src/demo.c:30",
            "    #4 0x5555555550d1 in _start+0x21 from demo",
        ])

    def test_raw(self):
        self.assertEqual(self.stack(ALLOC_STACK, symbolize=unsymbolized),
                         ["    #0 0x55555555518b", "    #1 0x5555555551c6"])

    def test_cut_at_max_frames_counts_inlined_frames(self):
        self.assertEqual(self.stack(DEEP_STACK, 1), [
            "    #0 0x555555555300 in inner (inlined) at /src/demo.c:7",
            "    ... (--frames 1)",
        ])
        self.assertEqual(len(self.stack(DEEP_STACK, 5)), 5)
        self.assertEqual(self.stack(DEEP_STACK, 0), ["    ... (--frames 0)"])

    def test_a_recursion_is_shown_once_then_counted(self):
        """40 frames of one recursive call site: three shown, one line for the other 37, and
        the frames after it keep their numbers; --frames counts the frames shown."""
        records = FakeRecords()
        records.stacks[9] = Stack(9, (PC_MAKE,) + (PC_FREE,) * 40 + (PC_MAIN, PC_START))
        got = parts.stack_lines(lookups(records), 9, None)
        self.assertEqual(got, [
            "    #0 0x55555555518b in new_order at /src/demo.c:16",
            "    #1 0x5555555551f3 in release at /src/demo.c:40",
            "    #2 0x5555555551f3 in release at /src/demo.c:40",
            "    #3 0x5555555551f3 in release at /src/demo.c:40",
            "    ... 37 more frames of the same recursion (release at /src/demo.c:40)",
            "    #41 0x5555555551c6 in main at /src/demo.c:30",
            "    #42 0x5555555550d1 in _start+0x21 from demo",
        ])
        self.assertEqual(parts.stack_lines(lookups(records), 9, 5), got[:6] + [
            "    ... (--frames 5)"])
        # Two functions calling each other (with an inlined frame: three frames a turn).
        records.stacks[10] = Stack(10, (PC_INLINED, PC_UNKNOWN) * 6 + (PC_MAIN,))
        got = parts.stack_lines(lookups(records), 10, None)
        self.assertEqual(got[3:5], [
            "    ... 15 more frames of the same recursion (inner (inlined) at /src/demo.c:7, "
            "outer at /src/demo.c:12, 0x7ffff7a00010)",
            "    #18 0x5555555551c6 in main at /src/demo.c:30",
        ])
        # A short repetition is shown whole.
        records.stacks[11] = Stack(11, (PC_FREE,) * 5 + (PC_MAIN,))
        self.assertEqual(len(parts.stack_lines(lookups(records), 11, None)), 6)

    def test_missing_empty_unreadable_unpublished(self):
        self.assertEqual(self.stack(0), ["    (no allocation stack was recorded)"])
        self.assertEqual(self.stack(EMPTY_STACK), ["    (empty allocation stack)"])
        self.assertEqual(self.stack(BROKEN_STACK), [
            "    (allocation stack 5 unreadable: cannot read stack 5 (16 bytes at 0x7000))"])
        self.assertEqual(self.stack(UNPUBLISHED_STACK),
                         ["    (allocation stack 6 is not published yet)"])
        self.assertEqual(self.stack(EMPTY_STACK, kind="free"), ["    (empty free stack)"])

    def test_cut_stacks_end_with_the_cut_line(self):
        """A stack cut by MEM_TRACE_MAX_STACKS: its kept frame, then one line in place of the
        marker, which is never symbolized (even by --raw, which shows every other address)."""
        cut = "    (stack cut: the cap on distinct stacks, MEM_TRACE_MAX_STACKS, was reached)"
        asked = []

        def symbolize(pc):
            asked.append(pc)
            return fake_symbolize(pc)

        self.assertEqual(self.stack(CUT_STACK, symbolize=symbolize),
                         ["    #0 0x55555555518b in new_order at /src/demo.c:16", cut])
        self.assertEqual(self.stack(BUCKET_STACK, symbolize=symbolize), [cut])
        self.assertEqual(self.stack(CUT_STACK, 1, symbolize=symbolize),
                         ["    #0 0x55555555518b in new_order at /src/demo.c:16", cut])
        self.assertEqual(asked, [PC_MAKE, PC_MAKE])
        self.assertEqual(self.stack(CUT_STACK, symbolize=unsymbolized, kind="free"),
                         ["    #0 0x55555555518b", cut])

    def test_frame_describe_without_line_or_module(self):
        self.assertEqual(Frame(0x10, "f", file="a.c").describe(), "0x10 in f at a.c")
        self.assertEqual(Frame(0x10, symbol="g+0x4").describe(), "0x10 in g+0x4")
        self.assertEqual(Frame(0x10, symbol="x.so+0x10").describe(), "0x10 in x.so+0x10")
        self.assertEqual(Frame(0x10, symbol="g+0x4", module="x.so").describe(),
                         "0x10 in g+0x4 from x.so")


class HistoryTextTests(unittest.TestCase):
    OLD = Block(addr=0x55555555B600, size=300, thread=MAIN, seq=14, stack=ALLOC_STACK)
    LIVE = Block(addr=0x55555555B600, size=200, thread=MAIN, seq=20, stack=ALLOC_STACK)

    def events(self):
        record = freed(self.OLD, free_seq=17)
        return (
            Event("allocation", 20, MAIN, ALLOC_STACK, self.LIVE),
            Event("free", 17, MAIN, FREE_STACK, self.OLD, record),
            Event("allocation", 14, MAIN, ALLOC_STACK, self.OLD, record),
        )

    def lines(self, events, hist=HISTORY_ON, max_frames=None, stacks=True, address=None):
        facts = history.HistoryFacts(address or self.OLD.addr + 1, events, hist)
        return history.lines(facts, lookups(), max_frames, stacks)

    def test_newest_first_with_stacks(self):
        tid = ', tid 18786 "demo", gdb thread 1'
        self.assertEqual(self.lines(self.events()), [
            "0x55555555b601: 3 events, newest first",
            "#20 allocation of a 200-byte block [0x55555555b600, 0x55555555b6c8) by thread 1 (live)" + tid,
        ] + ALLOC_FRAMES + [
            "#17 free of a 300-byte block [0x55555555b600, 0x55555555b72c) by thread 1" + tid,
        ] + FREE_FRAMES + [
            "#14 allocation of a 300-byte block [0x55555555b600, 0x55555555b72c) by thread 1 "
            "(freed at #17)" + tid,
        ] + ALLOC_FRAMES)

    def test_no_stacks_and_cut_stacks(self):
        self.assertEqual(len(self.lines(self.events(), stacks=False)), 4)
        lines = self.lines(self.events(), max_frames=1)
        self.assertEqual(lines.count("    ... (--frames 1)"), 3)

    def test_realloc_free_and_one_event(self):
        record = freed(self.OLD, free_seq=17, realloc=True)
        lines = self.lines((Event("free", 17, 0, 0, self.OLD, record),), stacks=True)
        self.assertEqual(lines[0], "0x55555555b601: 1 event, newest first")
        self.assertEqual(lines[1], "#17 free (by realloc) of a 300-byte block "
                                   "[0x55555555b600, 0x55555555b72c) by an unknown thread")
        self.assertEqual(lines[2], "    (no free stack recorded)")

    def test_bounds(self):
        self.assertEqual(self.lines((), address=0x10),
                         ["no remembered allocation or free touches 0x10"])
        self.assertEqual(self.lines((), hist=None, address=0x10), [
            "no remembered allocation or free touches 0x10",
            "(this process keeps no freed-block history)",
        ])
        off = History(0x6000, 1, 0, 0, 0, 0, 0, 0)
        self.assertEqual(self.lines((), hist=off, address=0x10)[-1],
                         "(the freed-block history is off: MEM_TRACE_FREED=0)")
        wrapped = History(0x6000, 0, 2, 0x7000, 6, 0, 0, 0)
        self.assertEqual(self.lines(self.events(), hist=wrapped)[-1],
                         "(history keeps the last 2 frees; older events are gone)")


class InfoTextTests(unittest.TestCase):
    def facts(self, **changes):
        b = TraceBuilder()
        b.add_thread(4242, "prog")
        b.add_block(0x5555_5555_A2A0, 100, stack=b.add_stack([0x1234]))
        b.add_freed(0x5555_5555_B000, 48)
        for name, value in changes.items():
            setattr(b, name, value)
        img, addr, where = b.build()
        return info.InfoFacts.read(Tracer.open(img, addr)), img, where

    def test_loaded(self):
        facts, _, _ = self.facts()
        self.assertEqual(info.lines(facts), [
            f"mem-trace is loaded: header at {facts.header.address:#x}, layout version 7",
            "  live blocks:     1 (100 bytes)",
            "  distinct stacks: 1",
            "  threads seen:    1",
            "  untracked:       0",
            "  next sequence:   4",
            "  flags:           initialised",
            "  freed history:   8 records, 1 claimed by freeing threads (in runs of up to 8 per thread)",
            "  free stacks:     on",
            "  quarantine:      off (MEM_TRACE_QUARANTINE=0)",
            "  errors reported: 0 (double or invalid frees)",
        ])

    def test_live_bytes_summed_past_2_64_are_flagged(self):
        # The twin of live_bytes_summed_past_2_64_are_flagged in
        # crates/read/src/answer/tests/info.rs.
        def scribbled(shard_bytes):
            b = TraceBuilder()
            b.add_block(0x5555_5555_A2A0, 100, thread=0, stack=b.add_stack([0x1234]))
            img, addr, where = b.build()
            for shard, value in shard_bytes.items():
                img.write_u64(where["shards"] + 64 * shard + 32, value)
            return info.lines(info.InfoFacts.read(Tracer.open(img, addr)))

        flag = "  inconsistent tables: live counts sum past 2^64 or below zero"
        out = scribbled({0: 3 << 61, 1: 3 << 61, 2: 3 << 61})
        self.assertEqual(out[1:4], ["  live blocks:     1 (18446744073709551615 bytes)", flag,
                                    "  distinct stacks: 1"])
        out = scribbled({7: 2**64 - 200})
        self.assertEqual(out[1:3], ["  live blocks:     1 (18446744073709551516 bytes)", flag])
        facts, _, _ = self.facts()
        self.assertFalse([line for line in info.lines(facts) if "inconsistent" in line])

    def test_history_variants(self):
        facts, _, _ = self.facts(history_capacity=None, flags=7)
        self.assertEqual(info.lines(facts)[6:], [
            "  flags:           initialised, profiler, free stacks",
            "  freed history:   none (header.freed is 0)",
        ])
        facts, _, _ = self.facts(history_capacity=0, history_flags=0, quarantine_limit=4096,
                                 quarantined_bytes=100, errors=2, flags=8)
        self.assertEqual(info.lines(facts)[6:], [
            "  flags:           profile mode",
            "  freed history:   off (MEM_TRACE_FREED=0)",
            "  free stacks:     off (MEM_TRACE_FREE_STACKS=0)",
            "  quarantine:      100 of 4096 bytes held",
            "  errors reported: 2 (double or invalid frees)",
        ])
        facts, _, _ = self.facts(history_capacity=2, written=6)
        self.assertIn("  freed history:   2 records, 6 claimed by freeing threads (wrapped: keeps the last 2)",
                      info.lines(facts))

    def test_unreadable_history_is_one_line(self):
        facts = info.InfoFacts(header=self.facts()[0].header, totals=self.facts()[0].totals,
                               history_error="cannot read 64 bytes at 0x6000")
        self.assertEqual(info.lines(facts)[-1],
                         "  freed history:   unreadable (cannot read 64 bytes at 0x6000)")


class FactsFromTablesTests(unittest.TestCase):
    """The Facts records read from a synthetic process image (layout decoder underneath)."""

    def test_why_facts(self):
        b = TraceBuilder()
        t = b.add_thread(4242, "prog")
        s = b.add_stack([PC_MAKE, PC_MAIN])
        b.add_block(0x5555_5555_A2A0, 100, thread=t, stack=s, seq=1)
        b.add_freed(0x5555_5555_B000, 48, thread=t, stack=s, seq=2, free_seq=3, free_stack=s)
        b.untracked = 4
        img, addr, where = b.build()
        tracer = Tracer.open(img, addr)
        facts = why.WhyFacts.read(tracer, 0x5555_5555_A2A0 + 37, 4096)
        self.assertEqual((facts.match.relation, facts.match.offset), ("inside", 37))
        self.assertEqual((facts.freed, facts.freed_error, facts.untracked), ((), None, 4))
        lines = why.lines(facts, Lookups(tracer, fake_symbolize))
        self.assertEqual(lines, [
            "0x55555555a2c5 is 37 bytes inside a 100-byte block [0x55555555a2a0, 0x55555555a304) "
            'allocated by thread 1 (#1), tid 4242 "prog"',
        ] + ALLOC_FRAMES)
        facts = why.WhyFacts.read(tracer, 0x5555_5555_B000 + 8, 4096)
        self.assertEqual([r.free_seq for r in facts.freed], [3])
        # The ring unreadable: the live answer stands, with one line saying why.
        del img.maps[[start for start, _ in img.maps].index(where["ring"])]
        facts = why.WhyFacts.read(Tracer.open(img, addr), 0x5555_5555_A2A0, 4096)
        self.assertRegex(facts.freed_error, r"^cannot read the freed-block history ring ")

    def test_history_facts(self):
        b = TraceBuilder()
        b.add_block(0x5555_5555_A2A0, 100, seq=5)
        b.add_freed(0x5555_5555_A2A0, 48, seq=1, free_seq=2)
        img, addr, _ = b.build()
        facts = history.HistoryFacts.read(Tracer.open(img, addr), 0x5555_5555_A2A0)
        self.assertEqual([(e.kind, e.seq) for e in facts.events],
                         [("allocation", 5), ("free", 2), ("allocation", 1)])
        self.assertEqual(facts.history.capacity, 8)


class NoGdbTests(unittest.TestCase):
    """The modules the texts are made of never import gdb (they run in plain Python)."""

    def test_pure_modules_do_not_import_gdb(self):
        pure = ["frame.py", "modules.py"] + [
            os.path.join(sub, n)
            for sub in ("layout", "text")
            for n in os.listdir(os.path.join(PACKAGE, sub))
            if n.endswith(".py")
        ]
        for name in pure:
            with open(os.path.join(PACKAGE, name), encoding="utf-8") as f:
                tree = ast.parse(f.read(), name)
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                for imported in names:
                    self.assertNotEqual(imported.split(".")[0], "gdb", f"{name} imports gdb")
        self.assertNotIn("gdb", sys.modules)


if __name__ == "__main__":
    unittest.main()
