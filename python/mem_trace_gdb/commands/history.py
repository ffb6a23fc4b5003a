"""`mtrace-history EXPR`: every remembered allocation and free at an address, newest first.

The answer is the Rust reader's (`mem-trace history` prints the same); this is the command
line.
"""

from __future__ import annotations


import gdb

from .. import reader, target
from .base import ArgparsedCommand, ArgumentParser, Expression
from .options import add_frames, add_raw


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
        "  mtrace-history -f 3 $rdi"
    ),
)
add_frames(parser, old=("-n",))
parser.add_argument("--no-stacks", action="store_true", help="one line per event, no stacks")
add_raw(parser)
parser.add_argument("address", type=Expression, metavar="EXPR",
                    help="the address whose history to show")


class HistoryCommand(ArgparsedCommand):
    parser = parser
    command_class = gdb.COMMAND_DATA

    def run(self, args):
        return reader.ask("history", target.named(), args.address, frames=args.frames,
                          no_stacks=args.no_stacks, raw=args.raw,
                          gdb_threads=target.gdb_threads())
