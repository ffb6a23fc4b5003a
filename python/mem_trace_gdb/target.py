"""What gdb holds, as the reader takes it: a live process (gdb, its tracer, stopped it, so
reading it from gdb's process is allowed) or a core file and its executable; gdb's thread
numbers; and, for the leak scan of a live process, each thread's stack pointer and
registers. Nothing here calls into the process.
"""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

import gdb

from .errors import NoProcess, NotLoaded

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

MASK64 = (1 << 64) - 1

# The general registers whose values are leak roots (a pointer may live only in one).
REGISTERS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
             "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")

_CORE_FILE = re.compile(r"^\s*`(.*)', file type", re.M)


def require_process() -> "gdb.Inferior":
    """The selected inferior if it has a process or a core file."""
    inferior = gdb.selected_inferior()
    if inferior is None or inferior.pid == 0:
        raise NoProcess("no process and no core file")
    return inferior


def is_core(inferior: "gdb.Inferior") -> bool:
    connection = getattr(inferior, "connection", None)  # gdb >= 13
    if connection is not None:
        return connection.type == "core"
    return _core_file() is not None


def _core_file():
    """The core file gdb has open, or None."""
    inferior = gdb.selected_inferior()
    corefile = getattr(inferior, "corefile", None)  # gdb >= 16
    if corefile is not None:
        return corefile.filename
    try:
        text = gdb.execute("info target", to_string=True)
    except gdb.error:
        return None
    at = text.find("Local core dump file:")
    if at < 0:
        return None
    m = _CORE_FILE.search(text, at)
    return m.group(1) if m else None


def _has_header() -> bool:
    """Whether the program or core has the tracer's header symbol (a symbol lookup, no
    memory read)."""
    if gdb.lookup_static_symbol(HEADER_SYMBOL) is not None:
        return True
    try:
        if gdb.lookup_global_symbol(HEADER_SYMBOL) is not None:
            return True
    except gdb.error:
        pass
    try:
        text = gdb.execute(f"info address {HEADER_SYMBOL}", to_string=True)
    except gdb.error:
        return False
    return " is at " in text


def named() -> Tuple:
    """The target as the reader takes it: ("process", pid) or ("core", core, executable);
    NoProcess or NotLoaded (with what to do) when there is none to read."""
    inferior = require_process()
    core = is_core(inferior)
    if not _has_header():
        raise NotLoaded(CORE_HINT if core else PRELOAD_HINT)
    if not core:
        return ("process", inferior.pid)
    path = _core_file()
    if path is None:
        raise NoProcess("gdb has a core file but does not say which (`info target`)")
    executable = gdb.current_progspace().filename
    return ("core", path, executable)


def gdb_threads() -> Dict[int, int]:
    """gdb's number of each thread, by kernel thread id."""
    try:
        return {t.ptid[1]: t.num for t in gdb.selected_inferior().threads() if t.ptid[1]}
    except gdb.error:
        return {}


def thread_registers() -> List[Tuple[int, int, List[int]]]:
    """Each live thread's (tid, stack pointer, general registers), read with the thread
    selected; the user's thread and frame are selected again afterwards."""
    try:
        saved_thread = gdb.selected_thread()
    except gdb.error:
        saved_thread = None
    try:
        saved_frame = gdb.selected_frame()
    except gdb.error:
        saved_frame = None
    out = []
    try:
        for thread in gdb.selected_inferior().threads():
            if not thread.is_valid():
                continue
            thread.switch()
            try:
                frame = gdb.newest_frame()
                regs = [int(frame.read_register(r)) & MASK64 for r in REGISTERS]
            except (gdb.error, ValueError):
                continue
            out.append((thread.ptid[1], regs[REGISTERS.index("rsp")], regs))
    finally:
        if saved_thread is not None and saved_thread.is_valid():
            saved_thread.switch()
        if saved_frame is not None and saved_frame.is_valid():
            saved_frame.select()
    return out
