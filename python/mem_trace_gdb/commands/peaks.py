"""`mtrace-peaks`: live bytes now and at the peak, per thread, and the stacks that held the
peak.

The answer's text is in `text.profile`; this is the command line.
"""

from __future__ import annotations

import gdb

from .. import memory
from ..text import profile
from .base import ArgparsedCommand, ArgumentParser
from .errors import UsageError
from .history import FrameCount
from .lookups import lookups
from .top import positive

DEFAULT_COUNT = 5
DEFAULT_FRAMES = 8

parser = ArgumentParser(
    prog="mtrace-peaks",
    description="Show live bytes now and at the peak, per thread, and the stacks that held the peak.",
    epilog=(
        "Needs the library built with the `profiler` feature. The peak is the highest\n"
        "live-byte count since the start, or since the last mem_trace_reset_peaks()\n"
        "(each reset starts a new phase); each thread's peak is its own. Threads are\n"
        "listed by the tracer's thread index, exited ones too.\n"
        "Reads memory only: works live and on core files.\n"
        "\n"
        "Examples:\n"
        "  mtrace-peaks\n"
        "  mtrace-peaks -n 10"
    ),
)
parser.add_argument("-n", "--count", type=positive, default=DEFAULT_COUNT, metavar="N",
                    help="stacks at the peak to show (default %(default)s)")
parser.add_argument("-f", "--frames", type=int, action=FrameCount, default=DEFAULT_FRAMES,
                    metavar="N", help="frames per stack (default %(default)s; 0: all)")
parser.add_argument("-r", "--raw", action="store_true",
                    help="print return addresses without symbolizing them")


class PeaksCommand(ArgparsedCommand):
    parser = parser
    command_class = gdb.COMMAND_DATA
    words = True

    def run(self, args):
        tracer = memory.open_tracer()
        try:
            facts = profile.PeaksFacts.read(tracer)
        except profile.NotProfiler as e:
            raise UsageError(str(e)) from None
        return profile.peaks_lines(facts, lookups(tracer, args.raw), args.count,
                                   args.frames or None)
