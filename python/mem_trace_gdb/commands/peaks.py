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
from .lookups import lookups
from .options import add_frames, add_raw, positive

DEFAULT_COUNT = 5

parser = ArgumentParser(
    prog="mtrace-peaks",
    description="Show live bytes now and at the peak, per thread, and the stacks that held the peak.",
    epilog=(
        "Reads the counters every build of the library keeps. The peak is the highest\n"
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
add_frames(parser)
add_raw(parser)


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
