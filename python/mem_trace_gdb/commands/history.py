"""`mtrace-history EXPR`: every remembered allocation and free touching an address.

Where mtrace-why gives one answer (the live block, else the newest freed block),
this lists everything the tracer still knows, newest first, so a use-after-free
whose memory was reused since can be followed back:

    #40 allocation of a 32-byte block [0x55555555a2c0, 0x55555555a2e0) by thread 1 (live), tid 4242 "prog"
        #0 0x5555555551c9 in make_node at /src/prog.c:35
    #25 free of a 48-byte block [0x55555555a2c0, 0x55555555a2f0) by thread 1, tid 4242 "prog"
        #0 0x5555555551f3 in release_node at /src/prog.c:40
    #20 allocation of a 48-byte block [0x55555555a2c0, 0x55555555a2f0) by thread 1 (freed at #25), tid 4242 "prog"
        #0 0x5555555551c9 in make_node at /src/prog.c:35

`#N` is the event's sequence number: allocations and frees share one counter, so
the numbers order everything the process did. Frees older than the ring's
capacity (MEM_TRACE_FREED) are gone, and the answer says so when that happened.
"""

from __future__ import annotations

from typing import List, Optional

import gdb

from ..layout import Event, History, Tracer
from .common import (
    ArgumentParser,
    UsageError,
    address_and_tracer,
    command_errors,
    help_text,
    parse,
)
from .describe import block_text, history_or_none, stack_lines, thread_details, thread_text

NAME = "mtrace-history"

DEFAULT_FRAMES = 8

parser = ArgumentParser(
    prog=NAME,
    description="List every remembered allocation and free of the memory at an address, newest first.",
    epilog=(
        "EXPR is any gdb expression: p, $rdi, &v[3], buf + 16, 0x55555555a2c5.\n"
        "Lists the allocation of the live block holding the address, and for each\n"
        "freed block that held it (among the last MEM_TRACE_FREED frees) its free\n"
        "and its allocation, each with its stack. #N is the event's sequence number.\n"
        "Reads memory only: works on core files too.\n"
        "\n"
        "Examples:\n"
        "  mtrace-history p\n"
        "  mtrace-history --no-stacks &v[3]\n"
        "  mtrace-history -n 3 $rdi"
    ),
)
parser.add_argument("-n", "--frames", type=int, default=DEFAULT_FRAMES, metavar="N",
                    help="frames per stack (default %(default)s; 0: all)")
parser.add_argument("--no-stacks", action="store_true", help="one line per event, no stacks")
parser.add_argument("-r", "--raw", action="store_true",
                    help="print return addresses without symbolizing them")
parser.add_argument("expression", metavar="EXPR", help="the address whose history to show")


def event_line(tracer: Tracer, event: Event) -> str:
    """`#5678 free of a 48-byte block [a, b) by thread 2, tid ...`."""
    who = thread_text(event.thread)
    if event.kind == "free":
        what = "free (by realloc)" if event.freed.by_realloc else "free"
        state = ""
    else:
        what = "allocation"
        state = " (live)" if event.live else f" (freed at #{event.freed.free_seq})"
    return (
        f"#{event.seq} {what} of {block_text(event.block)} by {who}{state}"
        + thread_details(tracer, event.thread)
    )


def bound_line(history: Optional[History]) -> Optional[str]:
    if history is None:
        return "(this process keeps no freed-block history)"
    if not history.enabled:
        return "(the freed-block history is off: MEM_TRACE_FREED=0)"
    if history.wrapped:
        return f"(history keeps the last {history.capacity} frees; older events are gone)"
    return None


def history_lines(
    tracer: Tracer, address: int, frames: Optional[int], stacks: bool, raw: bool
) -> List[str]:
    events = tracer.history(address)
    history = history_or_none(tracer)
    bound = bound_line(history)
    if not events:
        lines = [f"no remembered allocation or free touches {address:#x}"]
        return lines + ([bound] if bound else [])
    count = f"{len(events)} event" + ("" if len(events) == 1 else "s")
    lines = [f"{address:#x}: {count}, newest first"]
    for event in events:
        lines.append(event_line(tracer, event))
        if stacks:
            lines += stack_lines(tracer, event.stack, frames, raw, event.kind, history,
                                 option="-n")
    if bound:
        lines.append(bound)
    return lines


class HistoryCommand(gdb.Command):
    __doc__ = help_text(parser)

    def __init__(self):
        super().__init__(NAME, gdb.COMMAND_DATA, gdb.COMPLETE_EXPRESSION)

    def invoke(self, arg, from_tty):
        self.dont_repeat()
        with command_errors(NAME):
            args = parse(parser, arg)
            if args.frames < 0:
                raise UsageError(f"-n {args.frames}: the number of frames cannot be negative")
            address, tracer = address_and_tracer(args.expression)
            lines = history_lines(tracer, address, args.frames or None, not args.no_stacks,
                                  args.raw)
            gdb.write("\n".join(lines) + "\n")
