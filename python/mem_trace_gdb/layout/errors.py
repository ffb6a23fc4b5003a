"""The typed errors of the decoder: every failure it reports is one of these."""

from __future__ import annotations

from .contract import LAYOUT_VERSION, MAGIC


class MemTraceError(Exception):
    """Base of every error this package raises on purpose; str() is one line."""


class NotLoaded(MemTraceError):
    """mem-trace is not in the process (no header symbol or a null header)."""


class BadMagic(MemTraceError):
    """The header address does not hold ``MEMTRACE``."""

    def __init__(self, address: int, found: bytes):
        self.address = address
        self.found = found
        super().__init__(
            f"no mem-trace header at {address:#x} (magic {found!r}, expected {MAGIC!r})"
        )


class VersionMismatch(MemTraceError):
    """The process uses a layout version this reader does not know."""

    def __init__(self, found: int, expected: int = LAYOUT_VERSION):
        self.found = found
        self.expected = expected
        super().__init__(
            f"mem-trace layout version {found} in the process, this gdb script reads "
            f"version {expected}: use the gdb/mem_trace.py from the same build"
        )


class Corrupt(MemTraceError):
    """Bytes that cannot be what the contract says (insane counts, bad sizes...)."""


class Inaccessible(MemTraceError):
    """Memory the reader cannot read (unmapped, missing from the core, short read)."""

    def __init__(self, address: int, length: int, what: str = "", detail: str = ""):
        self.address = address
        self.length = length
        self.what = what
        self.detail = detail
        text = f"cannot read {length} bytes at {address:#x}"
        if what:
            text = f"cannot read {what} ({length} bytes at {address:#x})"
        if detail:
            text += f": {detail}"
        super().__init__(text)
