"""`mtrace-info`: is mem-trace loaded, and what does its table hold."""

from __future__ import annotations

import gdb

from .. import memory
from ..layout import NotLoaded
from .common import ArgumentParser, command_errors, help_text, parse

NAME = "mtrace-info"

parser = ArgumentParser(
    prog=NAME,
    description="Show whether mem-trace is loaded and its live blocks, stacks and threads.",
    epilog="Reads the tracer's memory only: works live and on core files.\n\nExample:\n  mtrace-info",
)


class InfoCommand(gdb.Command):
    __doc__ = help_text(parser)

    def __init__(self):
        super().__init__(NAME, gdb.COMMAND_STATUS, gdb.COMPLETE_NONE)

    def invoke(self, arg, from_tty):
        self.dont_repeat()
        with command_errors(NAME):
            parse(parser, arg)
            try:
                tracer = memory.open_tracer()
            except (NotLoaded, memory.NoProcess) as e:
                # "Not loaded" is this command's answer, not a failure.
                gdb.write(f"{e}\n")
                return
            h = tracer.header
            t = tracer.totals()
            flags = [name for bit, name in ((h.initialised, "initialised"),
                                            (h.profiler, "profiler"),
                                            (h.free_stacks, "free stacks")) if bit]
            gdb.write(
                f"mem-trace is loaded: header at {h.address:#x}, layout version {h.version}\n"
                f"  live blocks:     {t.live_blocks} ({t.live_bytes} bytes)\n"
                f"  distinct stacks: {t.stacks}\n"
                f"  threads seen:    {t.threads}\n"
                f"  untracked:       {t.untracked}\n"
                f"  next sequence:   {t.next_seq}\n"
                f"  flags:           {', '.join(flags) or 'none'}\n"
            )
