"""`mtrace-top [N] [--by live|allocated|blocks|peak] [--thread T]`: the stacks that hold
the most, from the profiler's per-stack counters.

The answer's text is in `text.profile`; this is the command line.
"""

from __future__ import annotations

import argparse

import gdb

from .. import memory
from ..text import profile
from .base import ArgparsedCommand, ArgumentParser
from .errors import UsageError
from .history import FrameCount
from .lookups import lookups

DEFAULT_COUNT = 10
DEFAULT_FRAMES = 8


def _count_at_least(minimum: int, below: str):
    """An argparse ``type``: an integer (any base gdb users type) of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} {below}")
        return value

    return parse


positive = _count_at_least(1, "is not a positive number")
"""A count of at least 1."""
non_negative = _count_at_least(0, "is negative")
"""A count, 0 meaning "all"."""


parser = ArgumentParser(
    prog="mtrace-top",
    description="List the allocation stacks that hold the most memory, biggest last.",
    epilog=(
        "Needs the library built with the `profiler` feature. Ranks stacks by\n"
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
        "  mtrace-top 3 --by allocated\n"
        "  mtrace-top --thread 2 --by blocks"
    ),
)
parser.add_argument("count", nargs="?", type=positive, default=DEFAULT_COUNT, metavar="N",
                    help="how many stacks (default %(default)s)")
parser.add_argument("--by", choices=tuple(profile.BY), default="live",
                    help="what to rank by (default %(default)s)")
parser.add_argument("--thread", type=positive, default=None, metavar="T",
                    help="only live blocks allocated by thread index T")
parser.add_argument("-f", "--frames", type=int, action=FrameCount, default=DEFAULT_FRAMES,
                    metavar="N", help="frames per stack (default %(default)s; 0: all)")
parser.add_argument("-r", "--raw", action="store_true",
                    help="print return addresses without symbolizing them")


class TopCommand(ArgparsedCommand):
    parser = parser
    command_class = gdb.COMMAND_DATA
    words = True

    def run(self, args):
        if args.thread is not None and args.by not in ("live", "blocks"):
            raise UsageError(
                f"--thread counts the live blocks of the live-block table, which knows nothing "
                f"of {profile.BY[args.by]} per thread: use --by live or --by blocks"
            )
        tracer = memory.open_tracer()
        try:
            profile.require_profiler(tracer)
        except profile.NotProfiler as e:
            raise UsageError(str(e)) from None
        if args.thread is not None:
            count = tracer.thread_count()
            if args.thread > count:
                raise UsageError(
                    f"no thread {args.thread}: the tracer has seen threads 1..{count} "
                    "(mtrace-peaks lists them)"
                )
        facts = profile.TopFacts.read(tracer, args.by, args.thread)
        return profile.top_lines(facts, lookups(tracer, args.raw), args.count,
                                 args.frames or None)
