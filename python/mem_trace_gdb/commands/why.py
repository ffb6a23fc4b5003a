"""`mtrace-why EXPR`: which heap block holds an address, and who allocated it.

The answer reads like AddressSanitizer's, the shape users already know:

    0x55555555a2c5 is 37 bytes inside a 100-byte block [0x55555555a2a0, 0x55555555a304) allocated by thread 1 (#1234), tid 4242 "prog"
        #0 0x55555555516d in make_buffer at /src/prog.c:12
        #1 0x5555555551a0 in main at /src/prog.c:30
"""

from __future__ import annotations

from typing import List, Optional

import gdb

from .. import layout, memory, symbolize
from ..layout import Match, MemTraceError, Tracer
from .common import ArgumentParser, command_errors, help_text, parse, to_address

NAME = "mtrace-why"

parser = ArgumentParser(
    prog=NAME,
    description="Show the heap block that holds an address and the stack that allocated it.",
    epilog=(
        "EXPR is any gdb expression: p, $rdi, &v[3], buf + 16, 0x55555555a2c5.\n"
        "Nothing is called in the process, so this works on core files and while\n"
        "threads hold locks. An address up to --gap bytes outside a block is\n"
        "reported as before or after the nearest block.\n"
        "\n"
        "Examples:\n"
        "  mtrace-why p\n"
        "  mtrace-why &v[3]\n"
        "  mtrace-why -n 5 $rdi"
    ),
)
parser.add_argument("-n", "--max-frames", type=int, default=None, metavar="N",
                    help="print at most N frames of the allocation stack")
parser.add_argument("--gap", type=int, default=layout.DEFAULT_MAX_GAP, metavar="BYTES",
                    help="how far outside a block to still name it (default %(default)s, 0: off)")
parser.add_argument("-r", "--raw", action="store_true",
                    help="print return addresses without symbolizing them")
parser.add_argument("expression", metavar="EXPR", help="the address to explain")


def _bytes(n: int) -> str:
    return "1 byte" if n == 1 else f"{n} bytes"


def describe_match(match: Match) -> str:
    """The first line of the answer, without the thread details."""
    b = match.block
    size = f"a block of at least {b.size} bytes" if b.size_saturated else f"a {b.size}-byte block"
    where = f"{match.address:#x} is "
    if match.relation == "inside":
        where += "at the start of " if match.offset == 0 else f"{_bytes(match.offset)} inside "
    elif match.relation == "after":
        where += f"{_bytes(match.offset)} after "
    else:
        where += f"{_bytes(match.offset)} before "
    who = f"thread {b.thread}" if b.thread else "an unknown thread"
    return f"{where}{size} [{b.addr:#x}, {b.end:#x}) allocated by {who} (#{b.seq})"


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


def stack_lines(tracer: Tracer, stack_id: int, max_frames: Optional[int], raw: bool) -> List[str]:
    """The numbered allocation stack, or one line saying why there is none."""
    if stack_id == 0:
        return ["    (no allocation stack was recorded)"]
    try:
        stack = tracer.stack(stack_id)
    except MemTraceError as e:
        return [f"    (allocation stack {stack_id} unreadable: {e})"]
    if stack is None:
        return [f"    (allocation stack {stack_id} is not published yet)"]
    lines: List[str] = []
    for pc in stack.frames:
        frames = (symbolize.Frame(pc),) if raw else symbolize.symbolize(pc)
        for frame in frames:
            if max_frames is not None and len(lines) >= max_frames:
                lines.append(f"    ... (--max-frames {max_frames})")
                return lines
            lines.append(f"    #{len(lines)} {frame.describe()}")
    if not lines:
        lines.append("    (empty allocation stack)")
    return lines


class WhyCommand(gdb.Command):
    __doc__ = help_text(parser)

    def __init__(self):
        super().__init__(NAME, gdb.COMMAND_DATA, gdb.COMPLETE_EXPRESSION)

    def invoke(self, arg, from_tty):
        self.dont_repeat()
        with command_errors(NAME):
            args = parse(parser, arg)
            address = to_address(args.expression)
            tracer = memory.open_tracer()
            match = tracer.find_block(address, max_gap=max(0, args.gap))
            if match is None:
                gdb.write(f"{address:#x} is not inside any block tracked by mem-trace\n")
                if tracer.header.untracked:
                    gdb.write(
                        f"({tracer.header.untracked} blocks could not be tracked; "
                        "it may be one of them)\n"
                    )
                return
            lines = [describe_match(match) + thread_details(tracer, match.block.thread)]
            if match.relation != "inside":
                # Glibc packs small blocks 16 bytes apart, so a dangling pointer to
                # a freed block is usually "N bytes before/after" a live neighbour.
                lines.append(
                    "    (not inside any live block: an overflow, or a pointer to a "
                    "freed or untracked block)"
                )
            lines += stack_lines(tracer, match.block.stack, args.max_frames, args.raw)
            gdb.write("\n".join(lines) + "\n")
