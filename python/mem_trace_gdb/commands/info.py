"""`mtrace-info`: is mem-trace loaded, and what does its table hold.

The answer is the Rust reader's (`mem-trace info` prints the same); this is the command line.
"""

from __future__ import annotations

import gdb

from .. import reader, target
from ..errors import NoProcess, NotLoaded
from .base import ArgparsedCommand, ArgumentParser

parser = ArgumentParser(
    prog="mtrace-info",
    description=(
        "Show whether mem-trace is loaded and its live blocks, stacks, threads and "
        "freed-block history."
    ),
    epilog="Reads the tracer's memory only: works live and on core files.\n\nExample:\n  mtrace-info",
)


class InfoCommand(ArgparsedCommand):
    parser = parser
    command_class = gdb.COMMAND_STATUS

    def run(self, args):
        try:
            named = target.named()
        except (NotLoaded, NoProcess) as e:
            # "Not loaded" is this command's answer, not a failure.
            return [str(e)]
        return reader.ask("info", named)
