"""mem-trace's gdb support: which heap block holds an address, who allocated and freed it.

`layout` (decodes docs/LAYOUT.md), `frame` and `text` (the answers' lines) are
pure Python, no gdb; `memory`, `symbolize` and `commands` run inside gdb.
`register()` is what gdb/mem_trace.py and the script embedded in the library call.
"""


def register():
    """Create the gdb commands and hooks (idempotent: gdb replaces same-named commands)."""
    from . import commands

    commands.register()


def unregister():
    """Undo what register() connected, before a reload replaces the modules."""
    import sys

    commands = sys.modules.get(__name__ + ".commands")
    if commands is not None:
        commands.unregister()
