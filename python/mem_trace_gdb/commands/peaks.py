"""`mtrace-peaks`: live bytes now and at the peak, per thread, and the stacks that held the
peak.

The answer is the Rust reader's (`mem-trace peaks` prints the same); this is the command line.
"""

from __future__ import annotations

import gdb

from .. import reader, target
from .base import ArgparsedCommand, ArgumentParser
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
        return reader.ask("peaks", target.named(), count=args.count, frames=args.frames,
                          raw=args.raw, gdb_threads=target.gdb_threads())
