"""`mtrace-info`: is mem-trace loaded, and what does its table hold.

The answer's text is in `text.info`; this is the command line.
"""

from __future__ import annotations

import gdb

from .. import memory
from ..layout import NotLoaded
from ..text import info
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
            tracer = memory.open_tracer()
        except (NotLoaded, memory.NoProcess) as e:
            # "Not loaded" is this command's answer, not a failure.
            return [str(e)]
        return info.lines(info.InfoFacts.read(tracer))
