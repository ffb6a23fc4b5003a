"""The gdb commands, one module each; `register()` instantiates them.

Each command is an `ArgparsedCommand` (base.py) over a `text` module.
"""

import gdb

from .. import symbolize
from . import history, info, leaks, peaks, top, why

COMMANDS = (
    why.WhyCommand,
    history.HistoryCommand,
    info.InfoCommand,
    top.TopCommand,
    peaks.PeaksCommand,
    leaks.LeaksCommand,
)

_connected = []


def register():
    """Create every command and connect the symbol-cache invalidation."""
    for command in COMMANDS:
        # gdb replaces a command of the same name, so sourcing twice is harmless.
        command()
    if not _connected:
        for registry in (gdb.events.new_objfile, gdb.events.clear_objfiles):
            registry.connect(symbolize.clear_cache)
            _connected.append(registry)


def unregister():
    """Disconnect event handlers so a reloaded copy does not leave stale ones."""
    while _connected:
        registry = _connected.pop()
        try:
            registry.disconnect(symbolize.clear_cache)
        except (ValueError, RuntimeError):
            pass
