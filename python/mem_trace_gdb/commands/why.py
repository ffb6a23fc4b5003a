"""`mtrace-why EXPR`: which heap block holds an address, who allocated it, who freed it.

The answer is the Rust reader's (`mem-trace why` prints the same); this is the command line.
"""

from __future__ import annotations

import gdb

from .. import reader, target
from .base import ArgparsedCommand, ArgumentParser, Expression
from .options import add_frames, add_raw, non_negative

# How far outside a block an address is still named (bytes).
DEFAULT_GAP = 4096

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
        "  mtrace-why -f 5 $rdi"
    ),
)
# All frames unless asked: this is the one answer about one block.
add_frames(parser, default=0, help="frames per stack (default and 0: all)",
           old=("-n", "--max-frames"))
parser.add_argument("--gap", type=non_negative, default=DEFAULT_GAP, metavar="BYTES",
                    help="how far outside a block to still name it (default %(default)s, 0: off)")
add_raw(parser)
parser.add_argument("address", type=Expression, metavar="EXPR", help="the address to explain")


class WhyCommand(ArgparsedCommand):
    parser = parser
    command_class = gdb.COMMAND_DATA

    def run(self, args):
        return reader.ask("why", target.named(), args.address, frames=args.frames,
                          gap=args.gap, raw=args.raw, gdb_threads=target.gdb_threads())
