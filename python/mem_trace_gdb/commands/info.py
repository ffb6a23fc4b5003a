"""`mtrace-info`: is mem-trace loaded, and what does its table hold.

The answer's text is in `text.info`; this is the command line.
"""

from __future__ import annotations

import gdb

from .. import memory
from ..layout import NotLoaded
from ..text import info
from .common import ArgumentParser, command_errors, help_text, parse

parser = ArgumentParser(
    prog="mtrace-info",
    description=(
        "Show whether mem-trace is loaded and its live blocks, stacks, threads and "
        "freed-block history."
    ),
    epilog="Reads the tracer's memory only: works live and on core files.\n\nExample:\n  mtrace-info",
)


class InfoCommand(gdb.Command):
    __doc__ = help_text(parser)

    def __init__(self):
        super().__init__(parser.prog, gdb.COMMAND_STATUS, gdb.COMPLETE_NONE)

    def invoke(self, arg, from_tty):
        self.dont_repeat()
        with command_errors(parser.prog):
            parse(parser, arg)
            try:
                tracer = memory.open_tracer()
            except (NotLoaded, memory.NoProcess) as e:
                # "Not loaded" is this command's answer, not a failure.
                gdb.write(f"{e}\n")
                return
            gdb.write("\n".join(info.lines(info.InfoFacts.read(tracer))) + "\n")
