"""mem-trace's gdb support: which heap block holds an address, who allocated and freed it.

Only gdb's part lives here: the commands' options and help (`commands`), which target gdb
holds (`target`), and the Rust reader that answers (`reader`: `libmem_trace_reader.so`, the
same decoder, leak scan, symbolizer and wording as the `mem-trace` command).
`register()` is what gdb/mem_trace.py and the script embedded in the library call.
"""


def register(library=None):
    """Create the gdb commands (idempotent: gdb replaces same-named commands). ``library``:
    the file of the library that carries them, when gdb auto-loaded them from it; the
    reader is looked for beside it first."""
    from . import commands, reader

    if library:
        reader.LIBRARIES.insert(0, library)
    commands.register()


def unregister():
    """Undo what register() connected, before a reload replaces the modules."""
    import sys

    commands = sys.modules.get(__name__ + ".commands")
    if commands is not None:
        commands.unregister()
