"""The script build.rs embeds in libmem_trace.so's .debug_gdb_scripts section.

Read from the built library itself: the section's framing (kind byte 4, a name
line, the script, a NUL), the script's sources against python/mem_trace_gdb,
and, under real gdb, that the script auto-loads from a stripped library and
registers the commands.

The library is the newest of target/{release,debug}/{,deps/}libmem_trace.so
($CARGO_TARGET_DIR is honoured, $MEM_TRACE_LIBRARY overrides). `cargo test`
builds it before running these tests; run alone without a build, they are
skipped, saying so.

Run from the repository root: python3 -m unittest discover -s tests/python -v
"""

import ast
import os
import re
import shutil
import struct
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(ROOT, "python", "mem_trace_gdb")
ENTRY = os.path.join(ROOT, "gdb", "mem_trace.py")
FIXTURES = os.path.join(HERE, "fixtures")

SECTION = ".debug_gdb_scripts"
# gdb's kinds of .debug_gdb_scripts entries: 1 names a Python file, 4 carries a Python script.
INLINE_PYTHON = 4
SCRIPT_NAME = b"mem_trace.py"


def built_library():
    """The most recently built libmem_trace.so, or None."""
    explicit = os.environ.get("MEM_TRACE_LIBRARY")
    if explicit:
        return explicit
    target = os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR") or "target")
    candidates = [
        os.path.join(target, profile, sub, "libmem_trace.so")
        for profile in ("release", "debug")
        for sub in ("", "deps")
    ]
    built = [p for p in candidates if os.path.isfile(p)]
    return max(built, key=os.path.getmtime) if built else None


def elf_section(path, name):
    """The contents of section ``name`` of a 64-bit little-endian ELF file, or None."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    for sh_name, sh_type, _flags, _addr, offset, size, *_ in headers:
        end = data.index(b"\0", names_offset + sh_name)
        if data[names_offset + sh_name:end].decode() == name:
            return data[offset:offset + size]
    return None


def entries(section):
    """The section's entries as (kind, body): each is a kind byte and a NUL-terminated body."""
    out, i = [], 0
    while i < len(section):
        if section[i] == 0:  # alignment padding between entries
            i += 1
            continue
        end = section.index(b"\0", i)
        out.append((section[i], section[i + 1:end]))
        i = end + 1
    return out


def package_sources():
    """{module name: source} of python/mem_trace_gdb and its package names, as build.rs
    collects them (a directory is a subpackage when it has an __init__.py)."""
    sources, packages = {}, set()
    for dirpath, dirnames, filenames in os.walk(PACKAGE):
        dirnames[:] = [d for d in dirnames if os.path.isfile(os.path.join(dirpath, d, "__init__.py"))]
        prefix = os.path.relpath(dirpath, os.path.dirname(PACKAGE)).replace(os.sep, ".")
        for filename in filenames:
            if not filename.endswith(".py") or filename.startswith("."):
                continue
            with open(os.path.join(dirpath, filename), encoding="utf-8") as f:
                text = f.read()
            if filename == "__init__.py":
                sources[prefix] = text
                packages.add(prefix)
            else:
                sources[f"{prefix}.{filename[:-3]}"] = text
    return sources, packages


def embedded_sources(script):
    """The ``sources`` and ``packages`` literals the script assigns, without running it."""
    found = {}
    for node in ast.walk(ast.parse(script)):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("sources", "packages"):
                found[target.id] = ast.literal_eval(node.value)
    return found["sources"], found["packages"]


class EmbeddedSection(unittest.TestCase):
    """What the library carries, read from its section headers."""

    @classmethod
    def setUpClass(cls):
        cls.library = built_library()
        if cls.library is None:
            raise unittest.SkipTest(
                "no built libmem_trace.so under target/: `cargo build --release` first "
                "(cargo test builds it)"
            )
        cls.section = elf_section(cls.library, SECTION)

    def ours(self):
        """Our entry's body: the name line and the script."""
        bodies = [b for kind, b in entries(self.section) if b.startswith(SCRIPT_NAME + b"\n")]
        self.assertEqual(len(bodies), 1, f"one {SCRIPT_NAME!r} entry in {self.library}")
        return bodies[0]

    def test_framing(self):
        self.assertIsNotNone(self.section, f"{self.library} has no {SECTION} section")
        start = self.section.index(SCRIPT_NAME + b"\n") - 1
        self.assertEqual(self.section[start], INLINE_PYTHON, "kind byte: inline Python script")
        body = self.ours()
        self.assertEqual(self.section[start + 1 + len(body)], 0, "the entry ends with a NUL")
        script = body[len(SCRIPT_NAME) + 1:]
        self.assertTrue(script.startswith(b"# GENERATED by build.rs"), script[:80])
        self.assertTrue(script.isascii(), "gdb may read the section in any encoding")
        compile(script.decode("ascii"), "<embedded>", "exec")

    def test_embedded_sources_are_the_package(self):
        sources, packages = embedded_sources(self.ours()[len(SCRIPT_NAME) + 1:].decode("ascii"))
        on_disk, disk_packages = package_sources()
        if (sources, set(packages)) != (on_disk, disk_packages):
            newest = max(os.path.getmtime(os.path.join(d, f))
                         for d, _, fs in os.walk(PACKAGE) for f in fs if f.endswith(".py"))
            if newest >= os.path.getmtime(self.library):
                self.skipTest(f"{self.library} is older than python/mem_trace_gdb: rebuild it")
        self.assertEqual(sorted(sources), sorted(on_disk), "the modules embedded")
        self.assertEqual(sorted(packages), sorted(disk_packages), "the packages embedded")
        for name in sources:
            self.assertEqual(sources[name], on_disk[name], f"{name} differs from its source")


@unittest.skipUnless(shutil.which("gdb") and shutil.which("gcc"), "gdb and gcc are needed")
class AutoLoadTests(unittest.TestCase):
    """The section's entry, as built, in a stripped stand-in tracer that gdb auto-loads.

    The stand-in is fixtures/fake_tracer.c, so this needs neither the tracer
    feature nor the Rust tracer to behave: only the entry is from the build.
    """

    @classmethod
    def setUpClass(cls):
        library = built_library()
        if library is None:
            raise unittest.SkipTest("no built libmem_trace.so under target/: `cargo build --release`")
        section = elf_section(library, SECTION)
        if section is None:
            raise AssertionError(f"{library} has no {SECTION} section")
        cls.tmp = tempfile.mkdtemp(prefix="mem-trace-embed-")
        entry = os.path.join(cls.tmp, "entry.bin")
        with open(entry, "wb") as f:
            f.write(section)
        asm = os.path.join(cls.tmp, "embed.S")
        with open(asm, "w") as f:
            # Allocated, so `strip` keeps it, as it keeps the Rust static's section.
            f.write(f'.pushsection {SECTION}, "a",@progbits\n.incbin "{entry}"\n.popsection\n'
                    '.section .note.GNU-stack,"",@progbits\n')
        cls.lib = os.path.join(cls.tmp, "libfake_tracer.so")
        cls.prog = os.path.join(cls.tmp, "prog")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", cls.lib,
                        os.path.join(FIXTURES, "fake_tracer.c"), asm], check=True)
        subprocess.run(["strip", cls.lib], check=True)
        # The reader gdb's commands answer through is found beside the library that carries
        # them, as `cargo build --release` leaves the two.
        reader = os.path.join(os.path.dirname(library), "libmem_trace_reader.so")
        if not os.path.isfile(reader):
            raise AssertionError(f"no {reader} beside {library}: `cargo build --release`")
        shutil.copy(reader, os.path.join(cls.tmp, "libmem_trace_reader.so"))
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

    def test_auto_loaded_from_stripped_so_registers_the_commands(self):
        out = self.gdb([], ["mtrace-why buffer + 3", "info auto-load python-scripts",
                            "help mtrace-history", "help mtrace-info", "mtrace-why -h"])
        self.assertRegex(out, r"is 3 bytes inside a 100-byte block .*allocated by thread 1 \(#1\)")
        self.assertRegex(out, r"Yes\s+mem_trace\.py")
        self.assertIn("List every remembered allocation and free", out)
        self.assertIn("Show whether mem-trace is loaded", out)
        self.assertIn("usage: mtrace-why [-h]", out)
        self.assertNotIn("Traceback", out)
        self.assertNotIn("Python Exception", out)

    def test_sourced_copy_wins_and_both_orders_work(self):
        probe = "python import mem_trace_gdb.target as l; print('target from', l.__spec__.origin)"
        out = self.gdb([f"source {ENTRY}"], [probe, "mtrace-why buffer"])
        self.assertRegex(out, r"target from /\S+/python/mem_trace_gdb/target\.py")
        self.assertRegex(out, r"at the start of a 100-byte block")
        out = self.gdb([], [probe, f"source {ENTRY}", probe, "mtrace-why buffer"])
        self.assertEqual(
            re.findall(r"target from (\S+)", out),
            ["<mem-trace", os.path.join(ROOT, "python", "mem_trace_gdb", "target.py")],
            out,
        )
        self.assertRegex(out, r"at the start of a 100-byte block")


if __name__ == "__main__":
    unittest.main()
