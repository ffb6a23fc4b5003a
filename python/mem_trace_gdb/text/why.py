"""The answer of `mtrace-why EXPR`: which heap block holds an address, who allocated it,
who freed it.

It reads like AddressSanitizer's, the shape users already know:

    0x55555555a2c5 is 37 bytes inside a 100-byte block [0x55555555a2a0, 0x55555555a304) allocated by thread 1 (#1234), tid 4242 "prog"
        #0 0x55555555516d in make_buffer at /src/prog.c:12
        #1 0x5555555551a0 in main at /src/prog.c:30

and for a dangling pointer, from the freed-block history:

    0x55555555a2d0 is 16 bytes inside a 48-byte block [0x55555555a2c0, 0x55555555a2f0) freed by thread 1 (#7), tid 4242 "prog"
        #0 0x5555555551f3 in release_node at /src/prog.c:40
        #1 0x555555555290 in main at /src/prog.c:61
    previously allocated by thread 1 (#6), tid 4242 "prog"
        #0 0x5555555551c9 in make_node at /src/prog.c:35
        #1 0x555555555284 in main at /src/prog.c:60

Which answer wins: a live block containing the address (the memory was reused:
the history is then only mentioned), else the newest freed block containing it,
else a live block nearby ("N bytes after ...").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..layout import FLAG_ATTACHED, FLAG_PROFILE_MODE, FreedBlock, History, Match, MemTraceError, Tracer, sample
from .parts import (
    Lookups,
    block_text,
    bytes_text,
    history_or_none,
    stack_lines,
    thread_details,
    thread_text,
)


@dataclass(frozen=True)
class WhyFacts:
    """What the tracer's tables say about one address."""

    address: int
    # The live block containing the address, else the nearest one within the gap.
    match: Optional[Match]
    # Remembered freed blocks containing the address, newest free first.
    freed: Sequence[FreedBlock] = ()
    # Why the freed-block history could not be read (then ``freed`` is empty).
    freed_error: Optional[str] = None
    # The history's header, None when there is none or it is unreadable.
    history: Optional[History] = None
    # Blocks the tracer could not record (header.untracked).
    untracked: int = 0
    # MEM_TRACE_SAMPLE (0: every block recorded).
    sample_mean: int = 0
    # In a process `mem-trace attach` loaded the tracer into: the first event after the last
    # attach (header.attached_at); blocks from before it are unknown. None otherwise.
    attached_at: Optional[int] = None
    # The process kept no record of frees (profile mode): an address in no live block may be
    # in a freed one, which nothing remembers.
    no_frees_kept: bool = False

    @classmethod
    def read(cls, tracer: Tracer, address: int, max_gap: int) -> "WhyFacts":
        """Read them from the tables. An unreadable live table is the command's error;
        the history only adds to the answer, so when it cannot be read the answer
        stands, with a line saying why."""
        match = tracer.find_block(address, max_gap=max_gap)
        try:
            freed, freed_error = tracer.freed_blocks_containing(address), None
        except MemTraceError as e:
            freed, freed_error = [], str(e)
        history = history_or_none(tracer)
        return cls(
            address=address,
            match=match,
            freed=tuple(freed),
            freed_error=freed_error,
            history=history,
            # Profile mode writes nothing to the history, which may still be mapped.
            no_frees_kept=((history is None or history.written == 0)
                           and bool(tracer.header.flags & FLAG_PROFILE_MODE)),
            untracked=tracer.header.untracked,
            sample_mean=tracer.header.sample_mean,
            attached_at=(tracer.header.attached_at
                         if tracer.header.flags & FLAG_ATTACHED else None),
        )


# The line for an address in no live block of a process that kept no record of frees: it may
# be a dangling pointer, which only debug mode can answer (crates/read answer::why).
NO_FREES_KEPT = ("this process kept no record of frees (profile mode): the address may be a "
                 "dangling pointer; run with --mode debug to have frees answered")


def attached_line(seq: int) -> str:
    """The line for an address the tables do not know, in an attached process."""
    return (f"(mem-trace was attached to this process at event #{seq}: blocks allocated "
            "before that are unknown to it; it may be one of them)")


def describe_match(match: Match) -> str:
    """The first line of a live-block answer, without the thread details."""
    b = match.block
    where = f"{match.address:#x} is "
    if match.relation == "inside":
        where += "at the start of " if match.offset == 0 else f"{bytes_text(match.offset)} inside "
    elif match.relation == "after":
        where += f"{bytes_text(match.offset)} after "
    else:
        where += f"{bytes_text(match.offset)} before "
    # A tagged block (docs/LAYOUT.md "Block tags") has no event number.
    number = "" if b.tagged else f" (#{b.seq})"
    return f"{where}{block_text(b)} allocated by {thread_text(b.thread)}{number}"


def describe_freed(address: int, record: FreedBlock) -> str:
    """The first line for an address in a freed block, without the thread details."""
    offset = address - record.addr
    where = "at the start of" if offset == 0 else f"{bytes_text(offset)} inside"
    verb = "freed (by realloc)" if record.by_realloc else "freed"
    return (
        f"{address:#x} is {where} {block_text(record.allocation)} {verb} by "
        f"{thread_text(record.free_thread)} (#{record.free_seq})"
    )


def older_line(count: int) -> str:
    return f"    (older freed blocks covered this address too: {count}; see mtrace-history)"


def freed_lines(facts: WhyFacts, lookups: Lookups, max_frames: Optional[int]) -> List[str]:
    """ASan's shape: freed by (free stack), previously allocated by (allocation stack)."""
    newest = facts.freed[0]
    lines = [describe_freed(facts.address, newest) + thread_details(lookups, newest.free_thread)]
    lines += stack_lines(lookups, newest.free_stack, max_frames, "free", facts.history)
    a = newest.allocation
    lines.append(
        f"previously allocated by {thread_text(a.thread)} (#{a.seq})"
        + thread_details(lookups, a.thread)
    )
    lines += stack_lines(lookups, a.stack, max_frames)
    if len(facts.freed) > 1:
        lines.append(older_line(len(facts.freed) - 1))
    return lines


def not_sampled(address: int, mean: int) -> str:
    """The answer for an address in no sampled block of a process that samples."""
    return (
        f"{address:#x} is in no sampled block: not sampled, this process samples "
        f"{sample.rate(mean)} (MEM_TRACE_SAMPLE)"
    )


def lines(facts: WhyFacts, lookups: Lookups, max_frames: Optional[int] = None) -> List[str]:
    """The lines of the answer: live block, else freed block, else a nearby live block."""
    match, freed = facts.match, facts.freed
    tail = [f"    (freed-block history unreadable: {facts.freed_error})"] if facts.freed_error else []
    if match is not None and match.relation == "inside":
        out = [describe_match(match) + thread_details(lookups, match.block.thread)]
        out += stack_lines(lookups, match.block.stack, max_frames)
        # The live block reuses memory freed before: one line, details in mtrace-history.
        if freed:
            out.append(older_line(len(freed)))
        return out + tail
    if freed:
        # A freed block that contains the address beats a merely nearby live one:
        # the pointer is dangling, not overflowing its neighbour.
        return freed_lines(facts, lookups, max_frames)
    if facts.sample_mean:
        # Most blocks go unrecorded: a nearby sampled block says nothing of this address.
        return [not_sampled(facts.address, facts.sample_mean)] + tail
    if match is None:
        out = [f"{facts.address:#x} is not inside any block tracked by mem-trace"]
        if facts.untracked:
            out.append(f"({facts.untracked} blocks could not be tracked; it may be one of them)")
        if facts.attached_at is not None:
            out.append(attached_line(facts.attached_at))
        if facts.no_frees_kept:
            out.append(f"({NO_FREES_KEPT})")
        return out + tail
    out = [describe_match(match) + thread_details(lookups, match.block.thread)]
    # Glibc packs small blocks 16 bytes apart, so a pointer to a block freed too
    # long ago for the history is "N bytes before/after" a live neighbour.
    if facts.no_frees_kept:
        out.append(f"    (not inside any live block, and {NO_FREES_KEPT})")
    else:
        out.append(
            "    (not inside any live block nor any remembered freed block: an overflow, "
            "or a pointer to an untracked or long-freed block)"
        )
    if facts.attached_at is not None:
        out.append("    " + attached_line(facts.attached_at))
    out += stack_lines(lookups, match.block.stack, max_frames)
    return out + tail
