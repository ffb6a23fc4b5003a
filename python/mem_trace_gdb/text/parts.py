"""The pieces every answer is made of: sizes, blocks, threads, numbered stacks.

Shared by mtrace-why and mtrace-history so both say the same thing the same way.
Nothing here raises for unreadable memory: a stack or thread record that cannot
be read becomes a line saying so, and the rest of the answer stands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Protocol, Sequence

from ..frame import Frame
from ..layout import CUT_MARKER, Block, History, MemTraceError, Stack, Thread, Tracer

# What a stack cut by the cap on distinct stacks shows in place of its last frame, the marker
# (docs/LAYOUT.md "Stack store"); crates/read/src/text.rs's CUT_TEXT.
CUT_TEXT = "(stack cut: the cap on distinct stacks, MEM_TRACE_MAX_STACKS, was reached)"


class Records(Protocol):
    """Stacks and thread records by id; a `layout.Tracer` is one.

    Both return None for an id with nothing published under it, and raise
    `MemTraceError` when the record cannot be read or makes no sense.
    """

    def stack(self, stack_id: int) -> Optional[Stack]:  # pragma: no cover - protocol
        ...

    def thread(self, index: int) -> Optional[Thread]:  # pragma: no cover - protocol
        ...


def no_gdb_thread(tid: int) -> Optional[int]:
    """A thread lookup that knows no gdb threads (a core without them, or a test)."""
    return None


@dataclass(frozen=True)
class Lookups:
    """What the text needs besides the facts: records, symbols, gdb's thread numbers."""

    records: Records
    # A return address to its frames, innermost (inlined) first; never raises.
    symbolize: Callable[[int], Sequence[Frame]]
    # A kernel tid to gdb's thread number, None if gdb lists no such thread.
    gdb_thread: Callable[[int], Optional[int]] = no_gdb_thread


def history_or_none(tracer: Tracer) -> Optional[History]:
    """The history header, or None when it is absent or unreadable: it only decorates
    the answers (a free stack that was never recorded, a ring that wrapped)."""
    try:
        return tracer.history_header()
    except MemTraceError:
        return None


def bytes_text(n: int) -> str:
    return "1 byte" if n == 1 else f"{n} bytes"


def block_text(b: Block) -> str:
    """`a 48-byte block [a, b)`."""
    size = f"a block of at least {b.size} bytes" if b.size_saturated else f"a {b.size}-byte block"
    return f"{size} [{b.addr:#x}, {b.end:#x})"


def thread_text(index: int) -> str:
    return f"thread {index}" if index else "an unknown thread"


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quoted(text: str) -> str:
    """``text`` in double quotes, with what a terminal would act on or hide escaped.

    A thread name is whatever bytes the process wrote (prctl, pthread_setname_np):
    a newline would forge a line of the answer, an escape sequence would drive the
    terminal, a quote would end the name early. Those, and every other character
    that does not print, appear as escapes; printable non-ASCII stays as it is.
    """
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            if code < 0x100:
                out.append(f"\\x{code:02x}")
            elif code < 0x10000:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def thread_details(lookups: Lookups, index: int) -> str:
    """`, tid 4242 "prog"` and more when the thread record is readable."""
    try:
        thread = lookups.records.thread(index)
    except MemTraceError as e:
        return f" (thread record unreadable: {e})"
    if thread is None:
        return ""
    text = f", tid {thread.tid}"
    if thread.name:
        text += f" {quoted(thread.name)}"
    if thread.exited:
        text += ", exited"
    else:
        num = lookups.gdb_thread(thread.tid)
        if num is not None:
            text += f", gdb thread {num}"
    return text


def stack_lines(
    lookups: Lookups,
    stack_id: int,
    max_frames: Optional[int],
    kind: str = "allocation",
    history: Optional[History] = None,
    option: str = "--max-frames",
) -> List[str]:
    """The numbered stack of ``kind`` ("allocation" or "free"), or one line saying why not.

    ``history`` tells a free stack that was never recorded (MEM_TRACE_FREE_STACKS=0)
    from one that is just missing. ``option`` is how the command spells the frame
    limit, named in the line that says the stack was cut.
    """
    if stack_id == 0:
        if kind == "free":
            if history is not None and not history.free_stacks:
                return ["    (no free stack was recorded: MEM_TRACE_FREE_STACKS=0)"]
            return ["    (no free stack recorded)"]
        return [f"    (no {kind} stack was recorded)"]
    try:
        stack = lookups.records.stack(stack_id)
    except MemTraceError as e:
        return [f"    ({kind} stack {stack_id} unreadable: {e})"]
    if stack is None:
        return [f"    ({kind} stack {stack_id} is not published yet)"]
    lines: List[str] = []
    for pc in stack.frames:
        if pc == CUT_MARKER:
            # Never symbolized: it is no address.
            lines.append(f"    {CUT_TEXT}")
            break
        for frame in lookups.symbolize(pc):
            if max_frames is not None and len(lines) >= max_frames:
                lines.append(f"    ... ({option} {max_frames})")
                return lines
            lines.append(f"    #{len(lines)} {frame.describe()}")
    if not lines:
        lines.append(f"    (empty {kind} stack)")
    return lines
