"""The Rust reader, loaded into gdb's process: `libmem_trace_reader.so`, a Python extension
module built from the workspace (crates/gdb). It decodes the tables, scans for leaks,
symbolizes and words every answer, exactly as the `mem-trace` command does; this package
only asks it.

Where it is looked for, first found wins:

1. ``$MEM_TRACE_READER`` (`mem-trace gdb` sets it to the one beside its library);
2. beside the library gdb auto-loaded the commands from, and beside any `libmem_trace*.so`
   gdb has loaded for the program or core;
3. in the source tree this package was loaded from (``target/release``, ``target/debug``);
4. beside a `mem-trace` binary on ``PATH``.

One copy is loaded per gdb process, and kept across a reload of this package: an extension
module cannot be initialised twice in one interpreter.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import List, Optional

import gdb

from .errors import MemTraceError

FILE = "libmem_trace_reader.so"
MODULE = "mem_trace_reader"

# Libraries that carried the commands (see `register`), newest first.
LIBRARIES: List[str] = []


def _candidates() -> List[str]:
    out = []
    env = os.environ.get("MEM_TRACE_READER")
    if env:
        out.append(env)
    libraries = list(LIBRARIES)
    for objfile in gdb.objfiles():
        name = os.path.basename(objfile.filename or "")
        if name.startswith("libmem_trace") and name.endswith(".so") and name != FILE:
            libraries.append(objfile.filename)
    out += [os.path.join(os.path.dirname(os.path.realpath(lib)), FILE) for lib in libraries]
    here = globals().get("__file__")
    if here and os.path.exists(here):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(here))))
        out += [os.path.join(root, "target", kind, FILE) for kind in ("release", "debug")]
    binary = shutil.which("mem-trace")
    if binary:
        out.append(os.path.join(os.path.dirname(os.path.realpath(binary)), FILE))
    return out


def _load(path: str):
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
    spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[MODULE] = module
    return module


def module():
    """The loaded reader, or MemTraceError saying where it was looked for and how to get it."""
    loaded = sys.modules.get(MODULE)
    if loaded is not None:
        return loaded
    looked: List[str] = []
    for path in _candidates():
        if path in looked:
            continue
        looked.append(path)
        if os.path.isfile(path):
            try:
                return _load(path)
            except ImportError as e:
                raise MemTraceError(f"cannot load mem-trace's reader {path}: {e}") from None
    where = ", ".join(looked) if looked else "beside libmem_trace.so"
    raise MemTraceError(
        f"mem-trace's gdb reader ({FILE}) was not found ({where}): build it with "
        "`cargo build --release` in the mem-trace tree (it lands beside libmem_trace.so), "
        "start gdb with `mem-trace gdb`, or set MEM_TRACE_READER to its path"
    )


def ask(function: str, *args, **kwargs) -> List[str]:
    """The answer's lines from the reader's ``function``; its failure as MemTraceError.
    The advice on debug information, when the reader has some, goes to gdb's stderr."""
    reader = module()
    try:
        lines, hint = getattr(reader, function)(*args, **kwargs)
    except reader.Error as e:
        raise MemTraceError(str(e)) from None
    if hint:
        gdb.write(hint, gdb.STDERR)
    return list(lines)


