"""`mtrace-why EXPR`: which heap block holds an address, who allocated it, who freed it.

The answer reads like AddressSanitizer's, the shape users already know:

    0x55555555a2c5 is 37 bytes inside a 100-byte block [0x55555555a2a0, 0x55555555a304) allocated by thread 1 (#1234), tid 4242 "prog"
        #0 0x55555555516d in make_buffer at /src/prog.c:12
        #1 0x5555555551a0 in main at /src/prog.c:30

and for a dangling pointer, from the freed-block history (layout version 2):

    0x55555555a2d0 is 16 bytes inside a 48-byte block [0x55555555a2c0, 0x55555555a2f0) freed by thread 1 (#7), tid 4242 "prog"
        #0 0x5555555551f3 in release_node at /src/prog.c:40
        #1 0x555555555290 in main at /src/prog.c:61
    previously allocated by thread 1 (#6), tid 4242 "prog"
        #0 0x5555555551c9 in make_node at /src/prog.c:35
        #1 0x555555555284 in main at /src/prog.c:60

Which answer wins: a live block containing the address (the memory was reused:
the history is then only mentioned), else the newest freed block containing it,
else a live block nearby ("N bytes after ...").
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import gdb

from .. import layout
from ..layout import FreedBlock, Match, MemTraceError, Tracer
from .common import ArgumentParser, address_and_tracer, command_errors, help_text, parse
from .describe import (
    block_text,
    bytes_text,
    history_or_none,
    stack_lines,
    thread_details,
    thread_text,
)

NAME = "mtrace-why"

parser = ArgumentParser(
    prog=NAME,
    description=(
        "Show the heap block that holds an address, and the stacks that allocated "
        "(and freed) it."
    ),
    epilog=(
        "EXPR is any gdb expression: p, $rdi, &v[3], buf + 16, 0x55555555a2c5.\n"
        "Nothing is called in the process, so this works on core files and while\n"
        "threads hold locks. An address in a freed block (one of the last\n"
        "MEM_TRACE_FREED frees) is shown with the stacks that freed and allocated\n"
        "it. An address up to --gap bytes outside a live block is reported as\n"
        "before or after the nearest block. mtrace-history lists every event.\n"
        "\n"
        "Examples:\n"
        "  mtrace-why p\n"
        "  mtrace-why &v[3]\n"
        "  mtrace-why -n 5 $rdi"
    ),
)
parser.add_argument("-n", "--max-frames", type=int, default=None, metavar="N",
                    help="print at most N frames of each stack")
parser.add_argument("--gap", type=int, default=layout.DEFAULT_MAX_GAP, metavar="BYTES",
                    help="how far outside a block to still name it (default %(default)s, 0: off)")
parser.add_argument("-r", "--raw", action="store_true",
                    help="print return addresses without symbolizing them")
parser.add_argument("expression", metavar="EXPR", help="the address to explain")


def describe_match(match: Match) -> str:
    """The first line of a live-block answer, without the thread details."""
    b = match.block
    where = f"{match.address:#x} is "
    if match.relation == "inside":
        where += "at the start of " if match.offset == 0 else f"{bytes_text(match.offset)} inside "
    elif match.relation == "after":
        where += f"{bytes_text(match.offset)} after "
    else:
        where += f"{bytes_text(match.offset)} before "
    return f"{where}{block_text(b)} allocated by {thread_text(b.thread)} (#{b.seq})"


def describe_freed(address: int, record: FreedBlock) -> str:
    """The first line for an address in a freed block, without the thread details."""
    offset = address - record.addr
    where = "at the start of" if offset == 0 else f"{bytes_text(offset)} inside"
    verb = "freed (by realloc)" if record.by_realloc else "freed"
    return (
        f"{address:#x} is {where} {block_text(record.allocation)} {verb} by "
        f"{thread_text(record.free_thread)} (#{record.free_seq})"
    )


def older_line(count: int) -> str:
    return f"    (older freed blocks covered this address too: {count}; see mtrace-history)"


def freed_lookup(tracer: Tracer, address: int) -> Tuple[List[FreedBlock], Optional[str]]:
    """Freed records containing ``address``, and a note line if the history is unreadable.

    The history only adds to the answer: when it cannot be read, the live-block
    answer still stands, with one line saying why the history is missing.
    """
    try:
        return tracer.freed_blocks_containing(address), None
    except MemTraceError as e:
        return [], f"    (freed-block history unreadable: {e})"


def freed_answer(
    tracer: Tracer, address: int, records: List[FreedBlock], max_frames: Optional[int], raw: bool
) -> List[str]:
    """ASan's shape: freed by (free stack), previously allocated by (allocation stack)."""
    newest = records[0]
    lines = [describe_freed(address, newest) + thread_details(tracer, newest.free_thread)]
    lines += stack_lines(tracer, newest.free_stack, max_frames, raw, "free", history_or_none(tracer))
    a = newest.allocation
    lines.append(
        f"previously allocated by {thread_text(a.thread)} (#{a.seq})"
        + thread_details(tracer, a.thread)
    )
    lines += stack_lines(tracer, a.stack, max_frames, raw)
    if len(records) > 1:
        lines.append(older_line(len(records) - 1))
    return lines


def answer(tracer: Tracer, address: int, max_gap: int, max_frames: Optional[int], raw: bool) -> List[str]:
    """The lines of the answer: live block, else freed block, else a nearby live block."""
    match = tracer.find_block(address, max_gap=max_gap)
    freed, note = freed_lookup(tracer, address)
    tail = [note] if note else []
    if match is not None and match.relation == "inside":
        lines = [describe_match(match) + thread_details(tracer, match.block.thread)]
        lines += stack_lines(tracer, match.block.stack, max_frames, raw)
        # The live block reuses memory freed before: one line, details in mtrace-history.
        if freed:
            lines.append(older_line(len(freed)))
        return lines + tail
    if freed:
        # A freed block that contains the address beats a merely nearby live one:
        # the pointer is dangling, not overflowing its neighbour.
        return freed_answer(tracer, address, freed, max_frames, raw)
    if match is None:
        lines = [f"{address:#x} is not inside any block tracked by mem-trace"]
        if tracer.header.untracked:
            lines.append(
                f"({tracer.header.untracked} blocks could not be tracked; it may be one of them)"
            )
        return lines + tail
    lines = [describe_match(match) + thread_details(tracer, match.block.thread)]
    # Glibc packs small blocks 16 bytes apart, so a pointer to a block freed too
    # long ago for the history is "N bytes before/after" a live neighbour.
    lines.append(
        "    (not inside any live block nor any remembered freed block: an overflow, "
        "or a pointer to an untracked or long-freed block)"
    )
    lines += stack_lines(tracer, match.block.stack, max_frames, raw)
    return lines + tail


class WhyCommand(gdb.Command):
    __doc__ = help_text(parser)

    def __init__(self):
        super().__init__(NAME, gdb.COMMAND_DATA, gdb.COMPLETE_EXPRESSION)

    def invoke(self, arg, from_tty):
        self.dont_repeat()
        with command_errors(NAME):
            args = parse(parser, arg)
            address, tracer = address_and_tracer(args.expression)
            lines = answer(tracer, address, max(0, args.gap), args.max_frames, args.raw)
            gdb.write("\n".join(lines) + "\n")
