"""`mtrace-history EXPR`: every remembered allocation and free at an address, newest first.

The answer's text is in `text.history`; this is the command line.
"""

from __future__ import annotations

import gdb

from ..text import history
from .common import (
    ArgumentParser,
    UsageError,
    address_and_tracer,
    command_errors,
    help_text,
    parse,
)
from .lookups import lookups

DEFAULT_FRAMES = 8


parser = ArgumentParser(
    prog="mtrace-history",
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
parser.add_argument("expression", metavar="EXPR",
                    help="the address whose history to show")


class HistoryCommand(gdb.Command):
    __doc__ = help_text(parser)

    def __init__(self):
        super().__init__(parser.prog, gdb.COMMAND_DATA, gdb.COMPLETE_EXPRESSION)

    def invoke(self, arg, from_tty):
        self.dont_repeat()
        with command_errors(parser.prog):
            args = parse(parser, arg)
            if args.frames < 0:
                raise UsageError(f"-n {args.frames}: the number of frames cannot be negative")
            address, tracer = address_and_tracer(args.expression)
            facts = history.HistoryFacts.read(tracer, address)
            lines = history.lines(facts, lookups(tracer, args.raw), args.frames or None,
                                  stacks=not args.no_stacks)
            gdb.write("\n".join(lines) + "\n")
