"""gdb/mem_trace_embedded.py: fresh, and auto-loaded from a .so's .debug_gdb_scripts.

Run: cd /work/main && python3 -m unittest discover -s tests/python -v
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

import make_embedded  # noqa: E402

EMBEDDED = os.path.join(ROOT, "gdb", "mem_trace_embedded.py")
ENTRY = os.path.join(ROOT, "gdb", "mem_trace.py")
FIXTURES = os.path.join(HERE, "fixtures")

# What the Rust side does with a #[link_section = ".debug_gdb_scripts"] static:
# kind byte 4 (inline Python), a name line, the script, a NUL. Allocatable, so
# `strip` keeps it.
SECTION_ASM = """\
.pushsection .debug_gdb_scripts, "aMS",@progbits,1
.byte 4
.ascii "mem_trace\\n"
.incbin "{script}"
.byte 0
.popsection
.section .note.GNU-stack,"",@progbits
"""


class FreshnessTests(unittest.TestCase):
    def test_embedded_script_is_up_to_date(self):
        with open(EMBEDDED, encoding="utf-8") as f:
            self.assertEqual(
                f.read(), make_embedded.render(),
                "gdb/mem_trace_embedded.py is stale: run python3 python/make_embedded.py",
            )

    def test_no_nul_bytes(self):
        with open(EMBEDDED, "rb") as f:
            self.assertNotIn(b"\0", f.read())


@unittest.skipUnless(shutil.which("gdb") and shutil.which("gcc"), "gdb and gcc are needed")
class AutoLoadTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mem-trace-embed-")
        asm = os.path.join(cls.tmp, "embed.S")
        with open(asm, "w") as f:
            f.write(SECTION_ASM.format(script=EMBEDDED))
        cls.lib = os.path.join(cls.tmp, "libfake_tracer.so")
        cls.prog = os.path.join(cls.tmp, "prog")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", cls.lib,
                        os.path.join(FIXTURES, "fake_tracer.c"), asm], check=True)
        subprocess.run(["strip", cls.lib], check=True)
        subprocess.run(["gcc", "-g", "-O0", "-pthread", "-o", cls.prog,
                        os.path.join(FIXTURES, "prog.c")], check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def gdb(self, before_run, after_run):
        argv = ["gdb", "-nx", "-batch", "-iex", f"add-auto-load-safe-path {self.tmp}",
                "-ex", f"set exec-wrapper env LD_PRELOAD={self.lib}", "-ex", "break break_here"]
        for c in before_run:
            argv += ["-ex", c]
        argv += ["-ex", "run"]
        for c in after_run:
            argv += ["-ex", c]
        argv.append(self.prog)
        r = subprocess.run(argv, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
        return r.stdout

    def test_auto_loaded_from_stripped_so(self):
        out = self.gdb([], ["mtrace-why buffer + 3", "info auto-load python-scripts"])
        self.assertRegex(out, r"is 3 bytes inside a 100-byte block .*allocated by thread 1 \(#1\)")
        self.assertRegex(out, r"Yes\s+mem_trace")
        self.assertNotIn("Traceback", out)

    def test_sourced_copy_wins_and_both_orders_work(self):
        probe = "python import mem_trace_gdb.layout as l; print('layout from', l.__spec__.origin)"
        out = self.gdb([f"source {ENTRY}"], [probe, "mtrace-why buffer"])
        self.assertRegex(out, r"layout from /\S+/python/mem_trace_gdb/layout\.py")
        self.assertRegex(out, r"at the start of a 100-byte block")
        out = self.gdb([], [probe, f"source {ENTRY}", probe, "mtrace-why buffer"])
        self.assertEqual(
            re.findall(r"layout from (\S+)", out),
            ["<mem-trace", os.path.join(ROOT, "python", "mem_trace_gdb", "layout.py")],
            out,
        )
        self.assertRegex(out, r"at the start of a 100-byte block")


if __name__ == "__main__":
    unittest.main()
