"""The gdb commands, one module each; `register()` instantiates them.

Each command is an `ArgparsedCommand` (base.py) whose answer comes from the Rust reader
(`reader.ask`).
"""

from . import history, info, leaks, peaks, top, why

COMMANDS = (
    why.WhyCommand,
    history.HistoryCommand,
    info.InfoCommand,
    top.TopCommand,
    peaks.PeaksCommand,
    leaks.LeaksCommand,
)


def register():
    """Create every command."""
    for command in COMMANDS:
        # gdb replaces a command of the same name, so sourcing twice is harmless.
        command()


def unregister():
    """Nothing is connected to gdb's events: kept for the loader's reload protocol."""
