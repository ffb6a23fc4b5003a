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

# The frame limit as every command spells it (gdb's and `mem-trace`'s alike), named in the
# line that says a stack was cut, so that the line tells how to see more; crates/read's
# answer/parts.rs FRAMES_OPTION.
FRAMES_OPTION = "--frames"


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
        stack = lookups.records.stack(stack_id)
    except MemTraceError as e:
        return [f"    ({kind} stack {stack_id} unreadable: {e})"]
    if stack is None:
        return [f"    ({kind} stack {stack_id} is not published yet)"]
    frames: List[Frame] = []
    cut = False
    for pc in stack.frames:
        if pc == CUT_MARKER:
            # Never symbolized: it is no address.
            cut = True
            break
        frames.extend(lookups.symbolize(pc))
    lines: List[str] = []
    shown = 0
    for step in recursion_plan([f.describe() for f in frames]):
        if isinstance(step, Recursion):
            lines.append(recursion_line(step, frames))
            continue
        if max_frames is not None and shown >= max_frames:
            lines.append(f"    ... ({FRAMES_OPTION} {max_frames})")
            return lines
        lines.append(f"    #{step} {frames[step].describe()}")
        shown += 1
    if cut:
        lines.append(f"    {CUT_TEXT}")
    if not lines:
        lines.append(f"    (empty {kind} stack)")
    return lines


# A recursion repeats the same frames (one function, or up to this many calling each other in
# turn): shown once, with at least this many of its frames, then one line for the rest, when
# that hides at least as many. crates/read/src/answer/parts.rs does the same.
RECURSION_PERIOD = 4
RECURSION_SHOWN = 3
RECURSION_MIN_HIDDEN = 3


@dataclass(frozen=True)
class Recursion:
    """`hidden` frames left out, repeating the `period` frames from index `first`."""

    hidden: int
    first: int
    period: int


def recursion_plan(keys: Sequence[str]) -> List[object]:
    """The frames to show, by index, with a `Recursion` in place of each long repetition of
    the same frames (`keys`: what tells frames apart, their descriptions). The frames after a
    recursion keep their numbers, as in gdb's backtrace."""
    plan: List[object] = []
    i, n = 0, len(keys)
    while i < n:
        end, period = i, 0
        for p in range(1, RECURSION_PERIOD + 1):
            e = i + p
            while e < n and keys[e] == keys[e - p]:
                e += 1
            # The smallest period that reaches furthest, repeated at least twice.
            if e - i >= 2 * p and e > end:
                end, period = e, p
        shown = max(RECURSION_SHOWN, period)
        if period and end - i - shown >= RECURSION_MIN_HIDDEN:
            plan.extend(range(i, i + shown))
            plan.append(Recursion(end - i - shown, i, period))
            i = end
            continue
        plan.append(i)
        i += 1
    return plan


def recursion_line(r: Recursion, frames: Sequence[Frame]) -> str:
    """`... 39 more frames of the same recursion (fib at fib.c:12)`."""
    repeated = ", ".join(
        _without_pc(frames[k].describe()) for k in range(r.first, r.first + r.period))
    return f"    ... {r.hidden} more frames of the same recursion ({repeated})"


def _without_pc(text: str) -> str:
    """A frame's description without its address, unless that is all it has."""
    _, sep, rest = text.partition(" in ")
    return rest if sep else text
