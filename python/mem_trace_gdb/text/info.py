"""The answer of `mtrace-info`: is mem-trace loaded, and what its tables hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from ..layout import SUM_LINE, Header, History, MemTraceError, Totals, Tracer, sample


@dataclass(frozen=True)
class InfoFacts:
    """The header, the process-wide counters and the freed-block history's header."""

    header: Header
    totals: Totals
    # None when the process has no history (header.freed is 0) or it is unreadable.
    history: Optional[History] = None
    # Why the history header could not be read.
    history_error: Optional[str] = None

    @classmethod
    def read(cls, tracer: Tracer) -> "InfoFacts":
        """Read them. Unreadable counters are the command's error; an unreadable
        history is one line of the answer."""
        totals = tracer.totals()
        try:
            history, error = tracer.history_header(), None
        except MemTraceError as e:
            history, error = None, str(e)
        return cls(header=tracer.header, totals=totals, history=history, history_error=error)


def lines(facts: InfoFacts) -> List[str]:
    h, t = facts.header, facts.totals
    flags = [name for bit, name in ((h.initialised, "initialised"),
                                    (h.profiler, "profiler"),
                                    (h.free_stacks, "free stacks"),
                                    (h.profile_mode, "profile mode")) if bit]
    return [
        f"mem-trace is loaded: header at {h.address:#x}, layout version {h.version}",
        f"  live blocks:     {t.live_blocks} ({t.live_bytes} bytes)",
        *([f"  {SUM_LINE}"] if t.wrapped else []),
        f"  distinct stacks: {t.stacks}",
        f"  threads seen:    {t.threads}",
        f"  untracked:       {t.untracked}",
        f"  next sequence:   {t.next_seq}",
        f"  flags:           {', '.join(flags) or 'none'}",
    ] + sampling_lines(h) + history_lines(facts)


def sampling_lines(h: Header) -> List[str]:
    """The sampling rate, when the process samples."""
    if not h.sample_mean:
        return []
    return [f"  sampling:        {sample.rate(h.sample_mean)} (MEM_TRACE_SAMPLE): "
            "the live blocks are the samples"]


def history_lines(facts: InfoFacts) -> List[str]:
    """The freed-block history's figures."""
    if facts.history_error is not None:
        return [f"  freed history:   unreadable ({facts.history_error})"]
    h = facts.history
    if h is None:
        return ["  freed history:   none (header.freed is 0)"]
    if not h.enabled:
        out = ["  freed history:   off (MEM_TRACE_FREED=0)"]
    else:
        # Records are claimed by each freeing thread in runs (one shared atomic per run, not
        # per free), so the count is of records claimed, not frees: a thread that freed once
        # holds a run whose other records are empty.
        kept = (
            f"wrapped: keeps the last {h.capacity}" if h.wrapped
            else "in runs of up to 8 per thread"
        )
        out = [f"  freed history:   {h.capacity} records, {h.written} claimed by freeing threads "
               f"({kept})"]
    quarantine = (
        f"{h.quarantined_bytes} of {h.quarantine_limit} bytes held"
        if h.quarantine_limit else "off (MEM_TRACE_QUARANTINE=0)"
    )
    return out + [
        f"  free stacks:     {'on' if h.free_stacks else 'off (MEM_TRACE_FREE_STACKS=0)'}",
        f"  quarantine:      {quarantine}",
        f"  errors reported: {h.errors} (double or invalid frees)",
    ]
