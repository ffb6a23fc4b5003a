"""Which file holds an address and its load bias, from `info proc mappings` text
(mem_trace_gdb.modules), without gdb.

Run from the repository root: python3 -m unittest discover -s tests/python -v
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from mem_trace_gdb.modules import (  # noqa: E402
    Listed,
    Mapping,
    ModuleMap,
    first_load_address,
    module_offset,
    parse_listing,
    parse_mappings,
)

# gdb 13 on a live process (with Perms) and on a core (without).
LIVE = """process 1234
Mapped address spaces:

          Start Addr           End Addr       Size     Offset  Perms  objfile
      0x555555554000     0x555555558000     0x4000        0x0  r--p   /usr/bin/sqlite3
      0x555555558000     0x555555590000    0x38000     0x4000  r-xp   /usr/bin/sqlite3
      0x7ffff7c00000     0x7ffff7c28000    0x28000        0x0  r--p   /tmp/my lib.so (deleted)
      0x7ffff7ff0000     0x7ffff7ff2000     0x2000        0x0  rw-p
      0x7ffffffde000     0x7ffffffff000    0x21000        0x0  rw-p   [stack]
"""
CORE = """Mapped address spaces:

          Start Addr           End Addr       Size     Offset objfile
            0x400000           0x401000     0x1000        0x0 /usr/bin/static
            0x401000           0x402000     0x1000     0x1000 /usr/bin/static
"""


class ModulesTests(unittest.TestCase):
    def test_live_and_core_mappings(self):
        self.assertEqual(parse_mappings(LIVE), [
            Mapping(0x555555554000, 0x555555558000, 0, "/usr/bin/sqlite3"),
            Mapping(0x555555558000, 0x555555590000, 0x4000, "/usr/bin/sqlite3"),
            Mapping(0x7FFFF7C00000, 0x7FFFF7C28000, 0, "/tmp/my lib.so"),
        ])
        self.assertEqual(parse_mappings(CORE)[1], Mapping(0x401000, 0x402000, 0x1000, "/usr/bin/static"))
        self.assertEqual(parse_mappings("No current process: you must name one."), [])

    def test_the_listing_keeps_anonymous_mappings_and_permissions(self):
        live = parse_listing(LIVE)
        self.assertEqual(len(live), 5)
        self.assertEqual(live[3], Listed(0x7FFFF7FF0000, 0x7FFFF7FF2000, 0, "rw-p", ""))
        self.assertEqual(live[4].name, "[stack]")
        self.assertEqual(live[2].name, "/tmp/my lib.so (deleted)")
        # A core's listing has no Perms column: the name follows the offset.
        core = parse_listing(CORE)
        self.assertEqual(core[0], Listed(0x400000, 0x401000, 0, None, "/usr/bin/static"))
        self.assertEqual(parse_listing("No current process: you must name one."), [])
        self.assertEqual(parse_listing("0xzz 0x1 0x1 0x0 rw-p"), [])

    def test_bias_is_where_offset_zero_is_mapped_less_the_link_address(self):
        link = {"/usr/bin/sqlite3": 0, "/tmp/my lib.so": 0, "/usr/bin/static": 0x400000}
        live = ModuleMap(parse_mappings(LIVE), link.get)
        self.assertEqual(live.module_of(0x55555555A123), ("/usr/bin/sqlite3", 0x555555554000))
        self.assertIsNone(live.module_of(0x7FFFF7FF0010))
        core = ModuleMap(parse_mappings(CORE), link.get)
        self.assertEqual(core.module_of(0x401234), ("/usr/bin/static", 0))
        self.assertEqual(module_offset("/usr/bin/sqlite3", 0x6123), "sqlite3+0x6123")

    def test_link_address_from_the_file(self):
        # Python itself is a PIE on Debian; an unreadable file counts as one.
        self.assertEqual(first_load_address(sys.executable), 0)
        self.assertEqual(first_load_address("/nonexistent"), 0)
        self.assertEqual(first_load_address(__file__), 0)


if __name__ == "__main__":
    unittest.main()
