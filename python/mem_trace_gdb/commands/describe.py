"""Pieces of text every answer is made of: blocks, threads, numbered stacks.

Shared by mtrace-why and mtrace-history so both say the same thing the same way.
Nothing here raises for unreadable memory: a stack or thread record that cannot
be read becomes a line saying so, and the rest of the answer stands.
"""

from __future__ import annotations

from typing import List, Optional

import gdb

from .. import symbolize
from ..layout import Block, History, MemTraceError, Tracer


def bytes_text(n: int) -> str:
    return "1 byte" if n == 1 else f"{n} bytes"


def block_text(b: Block) -> str:
    """`a 48-byte block [a, b)`."""
    size = f"a block of at least {b.size} bytes" if b.size_saturated else f"a {b.size}-byte block"
    return f"{size} [{b.addr:#x}, {b.end:#x})"


def thread_text(index: int) -> str:
    return f"thread {index}" if index else "an unknown thread"


def _gdb_thread_of(tid: int) -> Optional[int]:
    try:
        for thread in gdb.selected_inferior().threads():
            if thread.ptid[1] == tid:
                return thread.num
    except gdb.error:
        pass
    return None


def thread_details(tracer: Tracer, index: int) -> str:
    """`, tid 4242 "prog"` and more when the thread record is readable."""
    try:
        thread = tracer.thread(index)
    except MemTraceError as e:
        return f" (thread record unreadable: {e})"
    if thread is None:
        return ""
    text = f", tid {thread.tid}"
    if thread.name:
        text += f' "{thread.name}"'
    if thread.exited:
        text += ", exited"
    else:
        num = _gdb_thread_of(thread.tid)
        if num is not None:
            text += f", gdb thread {num}"
    return text


def history_or_none(tracer: Tracer) -> Optional[History]:
    """The history header, or None when it is absent or unreadable (callers only decorate)."""
    try:
        return tracer.history_header()
    except MemTraceError:
        return None


def stack_lines(
    tracer: Tracer,
    stack_id: int,
    max_frames: Optional[int],
    raw: bool,
    kind: str = "allocation",
    history: Optional[History] = None,
    option: str = "--max-frames",
) -> List[str]:
    """The numbered stack of ``kind`` ("allocation" or "free"), or one line saying why not.

    ``history`` tells a free stack that was never recorded (MEM_TRACE_FREE_STACKS=0)
    from one that is just missing.
    """
    if stack_id == 0:
        if kind == "free":
            if history is not None and not history.free_stacks:
                return ["    (no free stack was recorded: MEM_TRACE_FREE_STACKS=0)"]
            return ["    (no free stack recorded)"]
        return [f"    (no {kind} stack was recorded)"]
    try:
        stack = tracer.stack(stack_id)
    except MemTraceError as e:
        return [f"    ({kind} stack {stack_id} unreadable: {e})"]
    if stack is None:
        return [f"    ({kind} stack {stack_id} is not published yet)"]
    lines: List[str] = []
    for pc in stack.frames:
        frames = (symbolize.Frame(pc),) if raw else symbolize.symbolize(pc)
        for frame in frames:
            if max_frames is not None and len(lines) >= max_frames:
                lines.append(f"    ... ({option} {max_frames})")
                return lines
            lines.append(f"    #{len(lines)} {frame.describe()}")
    if not lines:
        lines.append(f"    (empty {kind} stack)")
    return lines
