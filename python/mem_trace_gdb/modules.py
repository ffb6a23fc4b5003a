"""Which loaded file holds an address, and its load bias (pure: no gdb).

A frame nothing names is spelled `module+0xoffset`, the address as the module's
file states it, as the Rust side spells it and as `addr2line -e MODULE` takes it.
gdb 13's Python gives neither an objfile's load bias nor the objfile of an
address in a stripped file, so both come from `info proc mappings` (which gdb
answers for a live process and for a core's NT_FILE note alike) and the file's
program headers: bias = where offset 0 of the file is mapped, less the page of
its first PT_LOAD segment's address.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional

PAGE = 4096
PT_LOAD = 1


@dataclass(frozen=True)
class Mapping:
    """One file-backed mapping: [start, end) maps the file from `offset`."""

    start: int
    end: int
    offset: int
    path: str


@dataclass(frozen=True)
class Listed:
    """One line of `info proc mappings`: ``perms`` is None where gdb prints no Perms
    column (a core), ``name`` empty for an anonymous mapping."""

    start: int
    end: int
    offset: int
    perms: Optional[str]
    name: str


def parse_listing(text: str) -> List[Listed]:
    """Every mapping in `info proc mappings` output, anonymous ones too.

    Live processes have a Perms column (gdb 13) that cores lack; a path may hold
    spaces, so it is everything after the fixed columns.
    """
    columns = 4
    out: List[Listed] = []
    for line in text.splitlines():
        if "Start Addr" in line:
            columns = 5 if "Perms" in line else 4
            continue
        parts = line.split(None, columns)
        if len(parts) < columns or not parts[0].startswith("0x"):
            continue
        try:
            start, end, offset = (int(parts[i], 16) for i in (0, 1, 3))
        except ValueError:
            continue
        perms = parts[4] if columns == 5 else None
        name = parts[columns].strip() if len(parts) > columns else ""
        out.append(Listed(start, end, offset, perms, name))
    return out


def parse_mappings(text: str) -> List[Mapping]:
    """The file-backed mappings in `info proc mappings` output."""
    out: List[Mapping] = []
    for m in parse_listing(text):
        path = m.name
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        if path.startswith("/"):
            out.append(Mapping(m.start, m.end, m.offset, path))
    return out


def first_load_address(path: str) -> int:
    """The page of the first PT_LOAD segment's address in ELF file `path`; 0
    (position independent, as every shared object and PIE is) when the file
    cannot be read."""
    try:
        with open(path, "rb") as f:
            header = f.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:
                return 0
            order = "<" if header[5] == 1 else ">"
            phoff, = struct.unpack_from(order + "Q", header, 32)
            phentsize, phnum = struct.unpack_from(order + "HH", header, 54)
            f.seek(phoff)
            table = f.read(phentsize * min(phnum, 256))
    except OSError:
        return 0
    for i in range(len(table) // max(phentsize, 1)):
        entry = table[i * phentsize : (i + 1) * phentsize]
        if len(entry) < 24:
            break
        p_type, _flags, p_offset, p_vaddr = struct.unpack_from(order + "IIQQ", entry)
        if p_type == PT_LOAD:
            return (p_vaddr - p_offset) & ~(PAGE - 1)
    return 0


class ModuleMap:
    """The modules of one address space, from its mappings."""

    def __init__(self, mappings: List[Mapping], link_base=first_load_address):
        self._mappings = sorted(mappings, key=lambda m: m.start)
        self._link_base = link_base
        self._bias: Dict[str, Optional[int]] = {}

    def module_of(self, address: int):
        """(path, bias) of the file mapped at `address`, or None."""
        for m in self._mappings:
            if m.start <= address < m.end:
                bias = self._bias_of(m.path)
                return None if bias is None else (m.path, bias)
        return None

    def _bias_of(self, path: str) -> Optional[int]:
        if path not in self._bias:
            starts = [m.start for m in self._mappings if m.path == path and m.offset == 0]
            self._bias[path] = min(starts) - self._link_base(path) if starts else None
        return self._bias[path]


def module_offset(path: str, stated: int) -> str:
    """`libc.so.6+0x2724a`: the file name and the address as the file states it."""
    return f"{os.path.basename(path)}+{stated:#x}"
