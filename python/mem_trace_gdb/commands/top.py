"""`mtrace-top [-n N] [--by live|allocated|blocks|peak] [--thread T]`: the stacks that hold
the most, from the profiler's per-stack counters.

The answer is the Rust reader's (`mem-trace top` prints the same); this is the command line.
"""

from __future__ import annotations

import argparse

import gdb

from .. import reader, target
from .base import ArgparsedCommand, ArgumentParser
from .errors import UsageError
from .options import add_frames, add_raw, positive

DEFAULT_COUNT = 10
BY = ("live", "allocated", "blocks", "peak")


parser = ArgumentParser(
    prog="mtrace-top",
    description="List the allocation stacks that hold the most memory, biggest last.",
    epilog=(
        "Reads the per-stack counters every build of the library keeps. Ranks stacks by\n"
        "  live       bytes in live blocks (default)\n"
        "  blocks     live blocks\n"
        "  allocated  bytes ever allocated, freed or not\n"
        "  peak       bytes held at the global peak (since the last mem_trace_reset_peaks)\n"
        "# 0 is the biggest, printed last. --thread T keeps the live blocks allocated by\n"
        "thread T, T being the tracer's thread index (the `thread T` of mtrace-why and\n"
        "mtrace-peaks, not gdb's thread number); it scans the live-block table, which\n"
        "records who allocated each live block but not who allocated freed ones, so it\n"
        "works with --by live and --by blocks only.\n"
        "Reads memory only: works live and on core files.\n"
        "\n"
        "Examples:\n"
        "  mtrace-top\n"
        "  mtrace-top -n 3 --by allocated\n"
        "  mtrace-top --thread 2 --by blocks"
    ),
)
parser.add_argument("-n", "--count", type=positive, default=None, metavar="N",
                    help=f"how many stacks (default {DEFAULT_COUNT})")
# The count as a bare word (`mtrace-top 3`), as it was first spelled: still taken, not shown.
parser.add_argument("count_word", nargs="?", type=positive, default=None, metavar="N",
                    help=argparse.SUPPRESS)
parser.add_argument("--by", choices=BY, default="live",
                    help="what to rank by (default %(default)s)")
parser.add_argument("--thread", type=positive, default=None, metavar="T",
                    help="only live blocks allocated by thread index T")
add_frames(parser)
add_raw(parser)


class TopCommand(ArgparsedCommand):
    parser = parser
    command_class = gdb.COMMAND_DATA
    words = True

    def run(self, args):
        if args.count is not None and args.count_word is not None:
            raise UsageError("the count twice: give -n N alone")
        shown = args.count or args.count_word or DEFAULT_COUNT
        return reader.ask("top", target.named(), count=shown, by=args.by, thread=args.thread,
                          frames=args.frames, raw=args.raw, gdb_threads=target.gdb_threads())
