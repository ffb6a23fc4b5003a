# mem-trace's gdb entry point: `source /path/to/mem-trace/gdb/mem_trace.py`.
#
# Registers mtrace-why, mtrace-history, mtrace-info, mtrace-top, mtrace-peaks and
# mtrace-leaks. The code lives in
# ../python/mem_trace_gdb (found relative to this file, through symlinks); this
# file only puts it on sys.path and registers, so it can be sourced from any
# directory, any number of times: a second source reloads the package (handy
# while editing it).

import os
import sys

import gdb


def _mem_trace_load():
    package = "mem_trace_gdb"
    try:
        here = os.path.dirname(os.path.realpath(__file__))
    except NameError:
        # Auto-loaded from the .so's .debug_gdb_scripts: there is no file, so the
        # package must already be importable (PYTHONPATH, or a previous source).
        here = None
    if here is not None:
        root = os.path.join(os.path.dirname(here), "python")
        if root not in sys.path:
            sys.path.insert(0, root)

    old = sys.modules.get(package)
    if old is not None:
        try:
            old.unregister()
        except Exception:
            pass
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
    try:
        module = __import__(package)
    except ImportError as e:
        gdb.write(
            "mem-trace: cannot import the gdb package (%s); "
            "source /path/to/mem-trace/gdb/mem_trace.py from the source tree\n" % e,
            gdb.STDERR,
        )
        return
    module.register()


_mem_trace_load()
del _mem_trace_load
