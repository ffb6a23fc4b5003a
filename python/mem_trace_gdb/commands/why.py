"""`mtrace-why EXPR`: which heap block holds an address, who allocated it, who freed it.

The answer's text and which answer wins are in `text.why`; this is the command line.
"""

from __future__ import annotations

import gdb

from .. import layout
from ..text import why
from .common import ArgumentParser, address_and_tracer, command_errors, help_text, parse
from .lookups import lookups

parser = ArgumentParser(
    prog="mtrace-why",
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


class WhyCommand(gdb.Command):
    __doc__ = help_text(parser)

    def __init__(self):
        super().__init__(parser.prog, gdb.COMMAND_DATA, gdb.COMPLETE_EXPRESSION)

    def invoke(self, arg, from_tty):
        self.dont_repeat()
        with command_errors(parser.prog):
            args = parse(parser, arg)
            address, tracer = address_and_tracer(args.expression)
            facts = why.WhyFacts.read(tracer, address, max(0, args.gap))
            lines = why.lines(facts, lookups(tracer, args.raw), args.max_frames)
            gdb.write("\n".join(lines) + "\n")
