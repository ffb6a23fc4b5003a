"""End-to-end: the gdb commands on a real process and its core, under real gdb.

The tracer here is fixtures/fake_tracer.c, a C stand-in written from
docs/LAYOUT.md, so this tests the gdb side (symbol lookup, reading, symbolizing,
command conventions) independently of the Rust tracer. Needs gcc and gdb; the
tests are skipped, loudly, without them.

Run from the repository root: python3 -m unittest discover -s tests/python -v
"""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
ROOT = os.path.dirname(os.path.dirname(HERE))
ENTRY = os.path.join(ROOT, "gdb", "mem_trace.py")
PROG_C = os.path.join(FIXTURES, "prog.c")


def marker_line(marker):
    """Line number of `/* line: MARKER */` in prog.c: expectations follow the fixture."""
    with open(PROG_C) as f:
        for number, text in enumerate(f, start=1):
            if f"/* line: {marker} */" in text:
                return number
    raise AssertionError(f"no marker {marker} in {PROG_C}")


@unittest.skipUnless(shutil.which("gdb") and shutil.which("gcc"), "gdb and gcc are needed")
class GdbTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mem-trace-gdb-")
        cls.lib = os.path.join(cls.tmp, "libfake_tracer.so")
        cls.stripped = os.path.join(cls.tmp, "libfake_stripped.so")
        cls.prog = os.path.join(cls.tmp, "prog")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-o", cls.lib,
                        os.path.join(FIXTURES, "fake_tracer.c")], check=True)
        shutil.copy(cls.lib, cls.stripped)
        subprocess.run(["strip", cls.stripped], check=True)
        subprocess.run(["gcc", "-g", "-O0", "-pthread", "-o", cls.prog, PROG_C], check=True)
        cls.core = os.path.join(cls.tmp, "prog.core")
        cls.live = cls.gdb_live(cls.lib, [
            "mtrace-info",
            'mtrace-why "abc"',
            "mtrace-info",
            "mtrace-why buffer + 37",
            "mtrace-why buffer",
            "mtrace-why buffer + 104",
            "mtrace-why big + 5000",
            "mtrace-why from_worker",
            "mtrace-why from_inline",
            "mtrace-why &numbers[10]",
            "mtrace-why 0x10",
            "mtrace-why local_pair",
            "mtrace-why ratio",
            "mtrace-why nosuchvar",
            "mtrace-why",
            "mtrace-why -h",
            "mtrace-why -n 1 buffer",
            "mtrace-why dangling + 16",
            "mtrace-why reused + 8",
            "mtrace-why twice",
            "mtrace-why moved_from",
            "mtrace-why freed_then + 2",
            "echo ==history-twice==\\n",
            "mtrace-history twice + 1",
            "echo ==history-reused==\\n",
            "mtrace-history -n 1 reused",
            "echo ==history-dangling==\\n",
            "mtrace-history --no-stacks dangling",
            "echo ==history-end==\\n",
            "mtrace-history 0x10",
            "mtrace-history -h",
            "mtrace-history -n -1 buffer",
            "mtrace-history",
            "help mtrace-history",
            f"generate-core-file {cls.core}",
        ])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def gdb(cls, args, commands, cwd=None):
        argv = ["gdb", "-nx", "-batch"] + args
        for c in commands:
            argv += ["-ex", c]
        r = subprocess.run(argv, cwd=cwd or cls.tmp, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
        return r.stdout

    @classmethod
    def gdb_live(cls, lib, commands, source=ENTRY):
        pre = [f"set exec-wrapper env LD_PRELOAD={lib}"] if lib else []
        return cls.gdb([cls.prog], pre + ["break break_here", "run", f"source {source}"] + commands)

    def assertLine(self, output, pattern):
        """Some line matches the regex `pattern` in full."""
        for line in output.splitlines():
            if re.fullmatch(pattern, line.strip()):
                return line
        self.fail(f"no line matches {pattern!r} in:\n{output}")

    def test_inside_with_stack(self):
        out = self.live
        self.assertLine(out, r"0x[0-9a-f]+ is 37 bytes inside a 100-byte block \[0x[0-9a-f]+, 0x[0-9a-f]+\) "
                             r'allocated by thread 1 \(#1\), tid \d+ "prog", gdb thread 1')
        self.assertLine(out, r"0x[0-9a-f]+ is at the start of a 100-byte block .* allocated by thread 1 \(#1\).*")
        self.assertLine(out, rf"#0 0x[0-9a-f]+ in make_buffer at \S*prog\.c:{marker_line('make_buffer-malloc')}")
        self.assertLine(out, r"#1 0x[0-9a-f]+ in main at \S*prog\.c:\d+")

    def test_after_large_thread_array(self):
        out = self.live
        self.assertLine(out, r"0x[0-9a-f]+ is 4 bytes after a 100-byte block .*")
        self.assertLine(out, r"0x[0-9a-f]+ is 5000 bytes inside a 1048576-byte block .*allocated by thread 1 \(#\d+\).*")
        self.assertLine(out, r"0x[0-9a-f]+ is at the start of a 77-byte block .*allocated by thread 2 \(#\d+\).*")
        self.assertLine(out, rf"#0 0x[0-9a-f]+ in worker at \S*prog\.c:{marker_line('worker-malloc')}")
        self.assertLine(out, r"0x[0-9a-f]+ is 40 bytes inside a 4000-byte block .*")

    def test_inlined_frames(self):
        out = self.live
        self.assertLine(out, rf"#0 0x[0-9a-f]+ in inlined_alloc \(inlined\) at \S*prog\.c:{marker_line('inlined-malloc')}")
        self.assertLine(out, rf"#1 0x[0-9a-f]+ in outer_alloc at \S*prog\.c:{marker_line('outer-call')}")

    def test_errors_are_one_line(self):
        out = self.live
        self.assertLine(out, r"0x10 is not inside any block tracked by mem-trace")
        self.assertLine(out, r"mtrace-why: `local_pair` is a struct, not an address")
        self.assertLine(out, r"mtrace-why: `ratio` is a float, not an address")
        self.assertLine(out, r'mtrace-why: No symbol "nosuchvar" in current context\.')
        self.assertLine(out, r"mtrace-why: the following arguments are required: EXPR .*")
        self.assertLine(out, r"usage: mtrace-why .*EXPR")
        self.assertLine(out, r"\.\.\. \(--frames 1\)")
        self.assertNotIn("Traceback", out)
        self.assertNotIn("Python Exception", out)

    def test_string_literal_does_not_allocate_in_the_process(self):
        counts = re.findall(r"live blocks: +(\d+)", self.live)
        self.assertEqual(len(counts), 2, self.live)
        self.assertEqual(counts[0], counts[1])
        self.assertLine(self.live, r'mtrace-why: `"abc"` is not in the process\'s memory')

    def test_core_file(self):
        out = self.gdb([self.prog, self.core], [f"source {ENTRY}", "mtrace-info", "mtrace-why buffer + 37"])
        self.assertLine(out, r"mem-trace is loaded: header at 0x[0-9a-f]+, layout version 7")
        self.assertLine(out, r"0x[0-9a-f]+ is 37 bytes inside a 100-byte block .*allocated by thread 1 \(#1\).*")
        self.assertLine(out, rf"#0 0x[0-9a-f]+ in make_buffer at \S*prog\.c:{marker_line('make_buffer-malloc')}")

    def test_stripped_library_and_rust_language(self):
        out = self.gdb_live(self.stripped, ["set $p = numbers", "set language rust", "mtrace-why $p", "show language"])
        self.assertLine(out, r"0x[0-9a-f]+ is at the start of a 4000-byte block .*")
        self.assertLine(out, r'The current source language is "rust"\.')

    def test_not_loaded_and_no_process(self):
        out = self.gdb_live(None, ["mtrace-why buffer", "mtrace-info"])
        self.assertLine(out, r"mtrace-why: mem-trace is not loaded in this process \(run it with LD_PRELOAD=.*")
        self.assertLine(out, r"mem-trace is not loaded in this process .*")
        out = self.gdb([self.prog], [f"source {ENTRY}", "mtrace-why 0x10", "mtrace-info",
                                     "mtrace-history nosuchvar"])
        self.assertLine(out, r"mtrace-why: no process and no core file")
        self.assertLine(out, r"mtrace-history: no process and no core file")
        self.assertLine(out, r"no process and no core file")

    def test_source_twice_from_elsewhere_through_a_symlink(self):
        link = os.path.join(self.tmp, "link_to_entry.py")
        if not os.path.exists(link):
            os.symlink(ENTRY, link)
        out = self.gdb([], [f"source {link}", f"source {link}", "mtrace-why -h", "help mtrace-info"], cwd="/")
        self.assertLine(out, r"usage: mtrace-why .*")
        self.assertLine(out, r"Show whether mem-trace is loaded.*")
        self.assertNotIn("rror", out)

    # -- freed blocks (layout version 2)

    def section(self, name):
        out = self.live
        start = out.index(f"=={name}==")
        return out[start:out.index("==", out.index("\n", start))]

    def test_why_dangling_pointer(self):
        out = self.live
        self.assertLine(out, r"0x[0-9a-f]+ is 16 bytes inside a 72-byte block \[0x[0-9a-f]+, 0x[0-9a-f]+\) "
                             r'freed by thread 1 \(#\d+\), tid \d+ "prog", gdb thread 1')
        self.assertLine(out, rf"#0 0x[0-9a-f]+ in release_node at \S*prog\.c:{marker_line('release_node-free')}")
        self.assertLine(out, rf"#1 0x[0-9a-f]+ in main at \S*prog\.c:{marker_line('main-release_node')}")
        self.assertLine(out, r'previously allocated by thread 1 \(#\d+\), tid \d+ "prog", gdb thread 1')
        self.assertLine(out, rf"#0 0x[0-9a-f]+ in make_node at \S*prog\.c:{marker_line('make_node-malloc')}")
        self.assertLine(out, rf"#1 0x[0-9a-f]+ in main at \S*prog\.c:{marker_line('main-make_node')}")
        # The free comes right after its allocation, and the free stack comes first.
        lines = [l.strip() for l in out.splitlines()]
        head = next(i for i, l in enumerate(lines) if "72-byte block" in l and "freed by" in l)
        self.assertRegex(lines[head + 1], r"#0 .* in release_node ")
        alloc = next(i for i in range(head, len(lines)) if lines[i].startswith("previously allocated"))
        self.assertRegex(lines[alloc + 1], r"#0 .* in make_node ")

    def test_why_live_block_over_freed_memory(self):
        self.assertLine(self.live, r"0x[0-9a-f]+ is 8 bytes inside a 200-byte block .* allocated by thread 1 .*")
        self.assertLine(self.live, r"\(older freed blocks covered this address too: 1; see mtrace-history\)")

    def test_why_newest_of_several_and_realloc(self):
        out = self.live
        self.assertLine(out, r"0x[0-9a-f]+ is at the start of a 300-byte block .* freed by thread 1 \(#\d+\).*")
        self.assertLine(out, r"0x[0-9a-f]+ is at the start of a 24-byte block .* freed \(by realloc\) by thread 1 \(#\d+\).*")
        self.assertLine(out, rf"#0 0x[0-9a-f]+ in main at \S*prog\.c:{marker_line('main-realloc')}")
        # A freed block containing the address beats a nearby live block.
        self.assertLine(out, r"0x[0-9a-f]+ is 2 bytes inside a 48-byte block .* freed by thread 1 .*")

    def test_history(self):
        twice = self.section("history-twice")
        seqs = [int(n) for n in re.findall(r"^#(\d+) ", twice, re.M)]
        self.assertEqual(len(seqs), 4, twice)
        self.assertEqual(seqs, sorted(seqs, reverse=True), "newest first")
        kinds = re.findall(r"^#\d+ (free|allocation) of a 300-byte block", twice, re.M)
        self.assertEqual(kinds, ["free", "allocation", "free", "allocation"], twice)
        self.assertLine(twice, r"0x[0-9a-f]+: 4 events, newest first")
        self.assertLine(twice, rf"#\d+ allocation of a 300-byte block .* by thread 1 \(freed at #{seqs[0]}\), tid .*")
        reused = self.section("history-reused")
        self.assertLine(reused, r"#\d+ allocation of a 200-byte block .* by thread 1 \(live\), tid .*")
        self.assertEqual(len(re.findall(r"\.\.\. \(--frames 1\)", reused)), 3, reused)
        dangling = self.section("history-dangling")
        self.assertNotRegex(dangling, r"\n\s+#0 ")
        self.assertLine(dangling, r"#\d+ free of a 72-byte block .* by thread 1, tid .*")

    def test_history_errors_and_help(self):
        out = self.live
        self.assertLine(out, r"no remembered allocation or free touches 0x10")
        self.assertLine(out, r"usage: mtrace-history \[-h\] \[-f N\] \[--no-stacks\] \[-r\] EXPR")
        self.assertLine(out, r"mtrace-history: -n -1: the number of frames cannot be negative \(see 'mtrace-history -h'\)")
        self.assertLine(out, r"mtrace-history: the following arguments are required: EXPR .*")
        self.assertLine(out, r"List every remembered allocation and free .*")

    def test_info_history_figures(self):
        self.assertLine(self.live, r"freed history: +4096 records, \d+ claimed by freeing threads \(in runs of up to 8 per thread\)")
        self.assertLine(self.live, r"free stacks: +on")
        self.assertLine(self.live, r"quarantine: +off \(MEM_TRACE_QUARANTINE=0\)")
        self.assertLine(self.live, r"errors reported: +0 .*")

    def test_core_file_freed_blocks(self):
        out = self.gdb([self.prog, self.core], [f"source {ENTRY}", "mtrace-why dangling", "mtrace-history twice"])
        self.assertLine(out, r"0x[0-9a-f]+ is at the start of a 72-byte block .* freed by thread 1 .*")
        self.assertLine(out, rf"#0 0x[0-9a-f]+ in release_node at \S*prog\.c:{marker_line('release_node-free')}")
        self.assertLine(out, rf"#0 0x[0-9a-f]+ in make_node at \S*prog\.c:{marker_line('make_node-malloc')}")
        self.assertLine(out, r"0x[0-9a-f]+: 4 events, newest first")
        self.assertNotIn("Traceback", out)

    def test_free_stacks_off_and_wrapped_ring(self):
        out = self.gdb([self.prog], [
            f"set exec-wrapper env LD_PRELOAD={self.lib} MEM_TRACE_FREE_STACKS=0 MEM_TRACE_FREED=2",
            "break break_here", "run", f"source {ENTRY}",
            "mtrace-info", "mtrace-why moved_from", "mtrace-history moved_from", "mtrace-why dangling",
        ])
        self.assertLine(out, r"free stacks: +off \(MEM_TRACE_FREE_STACKS=0\)")
        self.assertLine(out, r"freed history: +2 records, 6 claimed by freeing threads \(wrapped: keeps the last 2\)")
        self.assertLine(out, r"0x[0-9a-f]+ is at the start of a 24-byte block .* freed \(by realloc\) by thread 1 .*")
        self.assertLine(out, r"\(no free stack was recorded: MEM_TRACE_FREE_STACKS=0\)")
        self.assertLine(out, r"\(history keeps the last 2 frees; older events are gone\)")
        # dangling's free fell out of the ring: the answer falls back to a neighbour.
        self.assertLine(out, r"0x[0-9a-f]+ is \d+ bytes (after|before) a \d+-byte block .*")
        self.assertLine(out, r"\(not inside any live block nor any remembered freed block: .*\)")
        self.assertNotIn("Traceback", out)


if __name__ == "__main__":
    unittest.main()
