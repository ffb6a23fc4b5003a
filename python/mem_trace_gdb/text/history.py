"""The answer of `mtrace-history EXPR`: every remembered allocation and free touching
an address.

Where mtrace-why gives one answer (the live block, else the newest freed block),
this lists everything the tracer still knows, newest first, so a use-after-free
whose memory was reused since can be followed back:

    #40 allocation of a 32-byte block [0x55555555a2c0, 0x55555555a2e0) by thread 1 (live), tid 4242 "prog"
        #0 0x5555555551c9 in make_node at /src/prog.c:35
    #25 free of a 48-byte block [0x55555555a2c0, 0x55555555a2f0) by thread 1, tid 4242 "prog"
        #0 0x5555555551f3 in release_node at /src/prog.c:40
    #20 allocation of a 48-byte block [0x55555555a2c0, 0x55555555a2f0) by thread 1 (freed at #25), tid 4242 "prog"
        #0 0x5555555551c9 in make_node at /src/prog.c:35

`#N` is the event's sequence number: allocations and frees share one counter, so
the numbers order everything the process did. Frees older than the ring's
capacity (MEM_TRACE_FREED) are gone, and the answer says so when that happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..layout import Event, History, Tracer
from .parts import Lookups, block_text, history_or_none, stack_lines, thread_details, thread_text


@dataclass(frozen=True)
class HistoryFacts:
    """What the tracer's tables remember about one address."""

    address: int
    # Allocations and frees touching the address, newest first.
    events: Sequence[Event]
    # The history's header, None when there is none or it is unreadable.
    history: Optional[History] = None

    @classmethod
    def read(cls, tracer: Tracer, address: int) -> "HistoryFacts":
        events = tracer.history(address)
        return cls(address=address, events=tuple(events), history=history_or_none(tracer))


def event_line(lookups: Lookups, event: Event) -> str:
    """`#5678 free of a 48-byte block [a, b) by thread 2, tid ...`."""
    who = thread_text(event.thread)
    if event.kind == "free":
        what = "free (by realloc)" if event.freed.by_realloc else "free"
        state = ""
    else:
        what = "allocation"
        state = " (live)" if event.live else f" (freed at #{event.freed.free_seq})"
    # A live tagged block (docs/LAYOUT.md "Block tags") has no event number.
    number = "" if event.live and event.block.tagged else f"#{event.seq} "
    return (
        f"{number}{what} of {block_text(event.block)} by {who}{state}"
        + thread_details(lookups, event.thread)
    )


def bound_line(history: Optional[History]) -> Optional[str]:
    """What the history cannot know, when that matters: none kept, off, or wrapped."""
    if history is None:
        return "(this process keeps no freed-block history)"
    if not history.enabled:
        return "(the freed-block history is off: MEM_TRACE_FREED=0)"
    if history.wrapped:
        return f"(history keeps the last {history.capacity} frees; older events are gone)"
    return None


def lines(
    facts: HistoryFacts, lookups: Lookups, max_frames: Optional[int] = None, stacks: bool = True
) -> List[str]:
    """The events, each with its stack unless ``stacks`` is off, then the history's bound."""
    events, address = facts.events, facts.address
    bound = bound_line(facts.history)
    if not events:
        out = [f"no remembered allocation or free touches {address:#x}"]
        return out + ([bound] if bound else [])
    count = f"{len(events)} event" + ("" if len(events) == 1 else "s")
    out = [f"{address:#x}: {count}, newest first"]
    for event in events:
        out.append(event_line(lookups, event))
        if stacks:
            out += stack_lines(lookups, event.stack, max_frames, event.kind, facts.history)
    if bound:
        out.append(bound)
    return out
