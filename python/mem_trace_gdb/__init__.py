"""mem-trace's gdb support: which heap block holds an address, who allocated and freed it.

`layout` is pure Python (no gdb) and decodes docs/LAYOUT.md; everything else
runs inside gdb. `register()` is what gdb/mem_trace.py calls.
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
