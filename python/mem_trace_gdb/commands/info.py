"""`mtrace-info`: is mem-trace loaded, and what does its table hold."""

from __future__ import annotations

import gdb

from .. import memory
from ..layout import MemTraceError, NotLoaded, Tracer
from .common import ArgumentParser, command_errors, help_text, parse

NAME = "mtrace-info"

parser = ArgumentParser(
    prog=NAME,
    description=(
        "Show whether mem-trace is loaded and its live blocks, stacks, threads and "
        "freed-block history."
    ),
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
            gdb.write("\n".join(history_lines(tracer)) + "\n")


def history_lines(tracer: Tracer) -> list:
    """The freed-block history's figures; an unreadable history is one line, not a failure."""
    try:
        h = tracer.history_header()
    except MemTraceError as e:
        return [f"  freed history:   unreadable ({e})"]
    if h is None:
        return ["  freed history:   none (header.freed is 0)"]
    if not h.enabled:
        lines = ["  freed history:   off (MEM_TRACE_FREED=0)"]
    else:
        kept = (
            f"wrapped: keeps the last {h.capacity}" if h.wrapped
            else f"{h.held} of {h.capacity} held"
        )
        frees = "1 free" if h.written == 1 else f"{h.written} frees"
        lines = [f"  freed history:   {h.capacity} records, {frees} written ({kept})"]
    quarantine = (
        f"{h.quarantined_bytes} of {h.quarantine_limit} bytes held"
        if h.quarantine_limit else "off (MEM_TRACE_QUARANTINE=0)"
    )
    lines += [
        f"  free stacks:     {'on' if h.free_stacks else 'off (MEM_TRACE_FREE_STACKS=0)'}",
        f"  quarantine:      {quarantine}",
        f"  errors reported: {h.errors} (double or invalid frees)",
    ]
    return lines
