"""Reading the traced process from gdb: live or from a core file, never calling in.

Calling into a stopped process can deadlock: a stopped thread may hold the
tracer's lock, glibc's arena lock or the stdio lock, and whatever gdb would run
there (an inferior call, even a string literal, which gdb allocates in the
inferior with malloc) waits for it forever. So everything here is `read_memory`
and symbol lookup.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

import gdb

from .layout import Inaccessible, MemTraceError, NotLoaded, Region, Tracer
from .modules import Listed, parse_listing

HEADER_SYMBOL = "MEM_TRACE_HEADER"

PRELOAD_HINT = (
    "mem-trace is not loaded in this process (run it with "
    "LD_PRELOAD=/path/to/libmem_trace.so, or in gdb: "
    "set exec-wrapper env LD_PRELOAD=/path/to/libmem_trace.so)"
)

CORE_HINT = (
    "mem-trace is not loaded in this core file, or gdb did not find its shared "
    "libraries (check `info sharedlibrary`; set sysroot / solib-search-path)"
)


class NoProcess(MemTraceError):
    """gdb has neither a live process nor a core file."""


class InferiorReader:
    """The layout's memory reader over a gdb inferior."""

    def __init__(self, inferior: "gdb.Inferior"):
        self.inferior = inferior
        # Readable memory as runs, listed on the first check (empty: cannot be told).
        self._runs: Optional[List[Tuple[int, int]]] = None
        self._regions: Optional[List[Region]] = None

    def read(self, addr: int, n: int) -> bytes:
        """Exactly ``n`` bytes at ``addr``, or Inaccessible."""
        try:
            return bytes(self.inferior.read_memory(addr, n))
        except (gdb.MemoryError, gdb.error, OverflowError, ValueError) as e:
            # A core file only holds what the kernel dumped; a live process may
            # have unmapped it. Both are "cannot read", not a bug here.
            detail = str(e).splitlines()[0] if str(e) else ""
            if _is_core(self.inferior):
                detail += (
                    " (the core file lacks it: mem-trace's tables are anonymous private"
                    " memory, dumped when bit 0 of /proc/PID/coredump_filter is set)"
                )
            raise Inaccessible(addr, n, detail=detail.strip()) from e

    def extent(self, addr: int, n: int) -> Optional[int]:
        """None when ``n`` bytes at ``addr`` are memory the target has (or it cannot be
        told), else how many bytes it has from ``addr`` on (0: none)."""
        if self._runs is None:
            self._runs = self._listed(_core_runs, _process_runs) or []
        if not self._runs:
            return None
        for start, end in self._runs:
            if start <= addr < end:
                return None if addr + n <= end else end - addr
        return 0

    def regions(self) -> List[Region]:
        """The target's mappings for the tagged blocks' scans (docs/LAYOUT.md "Block
        tags"): a live process's from /proc/PID/maps (``[heap]`` and anonymous writable
        ones are heap); a core's dumped segments (every writable one is heap: the core
        does not name them, and scanning more than glibc's memory finds no more tags).
        Empty when they cannot be listed."""
        if self._regions is None:
            regions = self._listed(_core_regions, _process_regions)
            self._regions = regions if regions is not None else _gdb_regions()
        return self._regions

    def _listed(self, from_core, from_process):
        """``from_core()`` for a core file, ``from_process(pid)`` for a live process of this
        machine; None for another target (a remote one), whose mappings neither can list."""
        if _is_core(self.inferior):
            return from_core()
        connection = getattr(self.inferior, "connection", None)
        if connection is None or connection.type == "native":
            return from_process(self.inferior.pid)
        return None


def _process_regions(pid: int) -> Optional[List[Region]]:
    """The readable mappings of live process ``pid``, the heap ones marked; None when
    /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 5 or "-" not in fields[0] or not fields[1].startswith("r"):
            continue
        lo, hi = fields[0].split("-", 1)
        try:
            start, end = int(lo, 16), int(hi, 16)
        except ValueError:
            continue
        name = fields[5].strip() if len(fields) > 5 else ""
        heap = fields[1][1:2] == "w" and name in ("", "[heap]")
        out.append(Region(start, end, heap))
    return sorted(out, key=lambda r: r.start)


def gdb_listing() -> List[Listed]:
    """Every mapping `info proc mappings` lists; empty when gdb cannot tell."""
    try:
        return parse_listing(gdb.execute("info proc mappings", to_string=True))
    except gdb.error:
        return []


def _gdb_regions() -> List[Region]:
    """The mappings as `info proc mappings` lists them (a remote target, or no /proc):
    empty when gdb cannot tell, and then no tagged block is enumerated."""
    out = [
        Region(m.start, m.end, m.perms[1:2] == "w" and m.name in ("", "[heap]"))
        for m in gdb_listing() if m.perms is not None and m.perms.startswith("r")
    ]
    return sorted(out, key=lambda r: r.start)


_CORE_SECTION = re.compile(r"(0x[0-9a-f]+)->(0x[0-9a-f]+) at 0x[0-9a-f]+: (\S+) (.*)")


def _core_regions() -> List[Region]:
    """The core file's dumped segments; the writable ones are heap."""
    try:
        text = gdb.execute("maintenance info sections", to_string=True)
    except gdb.error:
        return []
    out = []
    for line in text.splitlines():
        m = _CORE_SECTION.search(line)
        if m and m.group(3).startswith("load") and "HAS_CONTENTS" in m.group(4):
            flags = m.group(4).split()
            heap = "READONLY" not in flags and "CODE" not in flags
            out.append(Region(int(m.group(1), 16), int(m.group(2), 16), heap))
    return sorted(out, key=lambda r: r.start)


def merge_ranges(ranges: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Sorted ``(start, end)`` runs, touching ones merged."""
    runs: List[Tuple[int, int]] = []
    for start, end in sorted(ranges):
        if runs and start <= runs[-1][1]:
            runs[-1] = (runs[-1][0], max(runs[-1][1], end))
        else:
            runs.append((start, end))
    return runs


def _process_runs(pid: int) -> Optional[List[Tuple[int, int]]]:
    """The readable mappings of live process ``pid``, from /proc/PID/maps, touching ones
    merged."""
    regions = _process_regions(pid)
    return None if regions is None else merge_ranges([(r.start, r.end) for r in regions])


def _core_runs() -> Optional[List[Tuple[int, int]]]:
    """What the selected core file holds: its ``load`` sections with contents."""
    regions = _core_regions()
    return merge_ranges([(r.start, r.end) for r in regions]) if regions else None


def _is_core(inferior: "gdb.Inferior") -> bool:
    connection = getattr(inferior, "connection", None)  # gdb >= 13
    return connection is not None and connection.type == "core"


def require_process() -> "gdb.Inferior":
    """The selected inferior if it has a process or a core file."""
    inferior = gdb.selected_inferior()
    if inferior is None or inferior.pid == 0:
        raise NoProcess("no process and no core file")
    return inferior


def _language_c():
    """Context manager: evaluate under `set language c`, then restore the user's setting."""

    class _Lang:
        def __enter__(self):
            self.saved = gdb.parameter("language")
            if self.saved != "c":
                gdb.execute("set language c", to_string=True)
            return self

        def __exit__(self, *exc):
            if self.saved != "c":
                gdb.execute(f"set language {self.saved}", to_string=True)
            return False

    return _Lang()


_INFO_ADDRESS = re.compile(r"\bis at (0x[0-9a-fA-F]+)")


def header_address() -> int:
    """Address of MEM_TRACE_HEADER in the selected inferior, or NotLoaded.

    The symbol is a data symbol of the preloaded .so, usually without a debug-info
    type (release builds, stripped builds keep only the dynamic symbol). In C,
    `&sym` of such a minimal symbol is fine; in Rust or C++ frames it may not be,
    hence the temporary language switch. `info address` is the fallback.
    """
    try:
        with _language_c():
            value = gdb.parse_and_eval(f"(unsigned long)&{HEADER_SYMBOL}")
        addr = int(value)
        if addr:
            return addr
    except gdb.error:
        pass
    try:
        text = gdb.execute(f"info address {HEADER_SYMBOL}", to_string=True)
    except gdb.error:
        text = ""
    m = _INFO_ADDRESS.search(text)
    if m:
        return int(m.group(1), 16)
    if _is_core(gdb.selected_inferior()):
        raise NotLoaded(CORE_HINT)
    raise NotLoaded(PRELOAD_HINT)


PRELOAD_POINTER = "MEM_TRACE_PRELOAD_HEADER"


def preload_header_address():
    """The preload library's header, through the pointer only it exports, or None.

    A process can hold two headers: a Rust program linking the `Traced` allocator wrapper
    defines one in its executable, and run under the preload it has the library's too; the
    wrapper then hands its records to the preload and leaves its own header uninitialised.
    gdb resolves `MEM_TRACE_HEADER` to the executable's, so the library's is found through a
    symbol of its own.
    """
    try:
        with _language_c():
            value = gdb.parse_and_eval(f"*(unsigned long *)&{PRELOAD_POINTER}")
        return int(value) or None
    except gdb.error:
        return None


def open_tracer() -> Tracer:
    """A fresh decoder over the selected inferior (header validated): of several headers,
    the initialised one."""
    reader = InferiorReader(require_process())
    tracer = Tracer.open(reader, header_address())
    if tracer.header.initialised:
        return tracer
    address = preload_header_address()
    if address is None or address == tracer.header.address:
        return tracer
    try:
        other = Tracer.open(reader, address)
    except MemTraceError:
        return tracer
    return other if other.header.initialised else tracer
