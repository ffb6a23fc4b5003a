"""The error a command raises for what the user typed (shown after the command name)."""


class UsageError(Exception):
    """Bad command line or argument; the message is shown after the command name."""
