"""The answer texts' lookups, backed by gdb: symbols from gdb's tables, gdb's thread
numbers, stacks and thread records from the tracer's."""

from __future__ import annotations

from typing import Optional

import gdb

from .. import symbolize
from ..frame import unsymbolized
from ..layout import Tracer
from ..text.parts import Lookups


def gdb_thread_number(tid: int) -> Optional[int]:
    """gdb's number for the thread with kernel id ``tid`` (its `info threads` column)."""
    try:
        for thread in gdb.selected_inferior().threads():
            if thread.ptid[1] == tid:
                return thread.num
    except gdb.error:
        pass
    return None


def lookups(tracer: Tracer, raw: bool = False) -> Lookups:
    """Lookups over ``tracer``; ``raw`` leaves return addresses unsymbolized."""
    return Lookups(
        records=tracer,
        symbolize=unsymbolized if raw else symbolize.symbolize,
        gdb_thread=gdb_thread_number,
    )
