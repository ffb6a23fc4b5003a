"""The errors the gdb layer raises on purpose; str() of each is one line."""


class MemTraceError(Exception):
    """A failure to answer: the reader's, or gdb's target not being one it can read."""


class NotLoaded(MemTraceError):
    """mem-trace is not in the process or core gdb holds."""


class NoProcess(MemTraceError):
    """gdb has neither a live process nor a core file."""
