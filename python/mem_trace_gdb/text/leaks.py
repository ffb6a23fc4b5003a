"""The answer of `mtrace-leaks`: the live blocks in memcheck's classes (definitely lost,
possibly lost, still reachable: see scan.py), grouped by the stack that allocated them, the
way memcheck reports them:

    scanned 100688 bytes of roots (5 objects' data, 2 thread stacks, 2 register sets), reached 16397 of 16497 live blocks
    definitely lost: 1 stack, biggest first:
    definitely lost: 100000 bytes in 100 blocks, allocated from:
        #0 0x5555555552a9 in leak_site at tests/fixtures/profile_sites.c:332
        #1 0x5555555554c1 in sites at tests/fixtures/profile_sites.c:467
    ...
    still reachable: 3 stacks, biggest first:
    still reachable: 67108864 bytes in 16384 blocks, allocated from:
        #0 0x55555555526a in hold_site at tests/fixtures/profile_sites.c:312
    ...
    SUMMARY: 100000 bytes definitely lost in 100 blocks (direct: 100000 bytes in 100 blocks, indirect: 0 bytes in 0 blocks); 0 bytes possibly lost in 0 blocks; 67294320 bytes still reachable in 16397 blocks

Definitely lost groups first, then possibly lost ones, then still reachable ones, each
class under a line saying it is biggest first; the classes and their totals are those of the
in-process leak check of the profiler build (its exit report's `leak check:` line). The scan
itself is `scan.py`; the roots are found by commands/leaks.py.

Biggest first, where mtrace-top and mtrace-peaks put the biggest last, next to the prompt:
three lists follow one another here, then the summary, so no order puts the biggest of each
next to the prompt. First, each list opens with the stack that matters most (the biggest
definite leak is the first stack of the answer), as memcheck and LeakSanitizer list theirs
and as the exit report does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..scan import Group, ScanResult, group_by_stack, unreadable_bytes
from .parts import Lookups, stack_lines
from .profile import plural


@dataclass(frozen=True)
class LeakFacts:
    """The scan's result grouped, and what the roots were."""

    lost: Sequence[Group]
    possibly: Sequence[Group]
    reachable: Sequence[Group]
    root_bytes: int
    # How many objects' data, thread stacks and register sets were roots.
    objects: int
    stacks: int
    register_sets: int
    unreadable: int = 0
    untracked: int = 0
    # Of the definitely lost: bytes and blocks indirectly lost.
    indirect: Tuple[int, int] = (0, 0)

    @classmethod
    def from_scan(cls, result: ScanResult, objects: int, stacks: int, register_sets: int,
                  untracked: int = 0) -> "LeakFacts":
        return cls(
            lost=tuple(group_by_stack(result.lost())),
            possibly=tuple(group_by_stack(result.possibly_lost())),
            reachable=tuple(group_by_stack(result.reachable())),
            root_bytes=result.root_bytes,
            objects=objects,
            stacks=stacks,
            register_sets=register_sets,
            unreadable=unreadable_bytes(result),
            untracked=untracked,
            indirect=(sum(b.size for b in result.indirectly_lost()), len(result.indirect)),
        )


def _total(groups: Sequence[Group]):
    return sum(g.bytes for g in groups), sum(g.blocks for g in groups)


def group_lines(kind: str, groups: Sequence[Group], limit: Optional[int], lookups: Lookups,
                max_frames: Optional[int]) -> List[str]:
    out: List[str] = []
    shown = groups if limit is None else groups[:limit]
    if groups:
        out.append(f"{kind}: {plural(len(groups), 'stack')}, biggest first:")
    for g in shown:
        out.append(f"{kind}: {plural(g.bytes, 'byte')} in {plural(g.blocks, 'block')}, "
                   "allocated from:")
        out += stack_lines(lookups, g.stack, max_frames)
    if len(shown) < len(groups):
        rest_bytes, rest_blocks = _total(groups[len(shown):])
        out.append(
            f"({kind}: {plural(len(groups) - len(shown), 'more stack')} with "
            f"{plural(rest_bytes, 'byte')} in {plural(rest_blocks, 'block')}; -n 0 shows all)"
        )
    return out


def split(lost_bytes: int, lost_blocks: int, indirect: Tuple[int, int]) -> str:
    """Definitely lost split as memcheck splits it (the roots to fix, and what they hold)."""
    in_bytes, in_blocks = indirect
    return (
        f"direct: {plural(lost_bytes - in_bytes, 'byte')} in "
        f"{plural(lost_blocks - in_blocks, 'block')}, indirect: {plural(in_bytes, 'byte')} in "
        f"{plural(in_blocks, 'block')}"
    )


def lines(facts: LeakFacts, lookups: Lookups, limit: Optional[int] = None,
          max_frames: Optional[int] = None, reachable: bool = True) -> List[str]:
    """The answer: roots, definitely lost groups, possibly lost groups, still reachable
    groups (unless ``reachable`` is off), the summary."""
    lost_bytes, lost_blocks = _total(facts.lost)
    maybe_bytes, maybe_blocks = _total(facts.possibly)
    kept_bytes, kept_blocks = _total(facts.reachable)
    roots = (
        f"{plural(facts.objects, 'object')}' data, {plural(facts.stacks, 'thread stack')}, "
        f"{plural(facts.register_sets, 'register set')}"
    )
    reached = (
        f"scanned {plural(facts.root_bytes, 'byte')} of roots ({roots}), reached "
        f"{kept_blocks + maybe_blocks} of "
        f"{plural(kept_blocks + maybe_blocks + lost_blocks, 'live block')}"
    )
    if maybe_blocks:
        reached += f" ({maybe_blocks} only through interior pointers)"
    out = [reached]
    if facts.unreadable:
        out.append(
            f"({plural(facts.unreadable, 'byte')} of roots or blocks could not be read and were "
            "not scanned: blocks they point to may be reported lost)"
        )
    if not facts.lost:
        out.append("no block is definitely lost")
    out += group_lines("definitely lost", facts.lost, limit, lookups, max_frames)
    out += group_lines("possibly lost", facts.possibly, limit, lookups, max_frames)
    if reachable:
        out += group_lines("still reachable", facts.reachable, limit, lookups, max_frames)
    out.append(
        f"SUMMARY: {plural(lost_bytes, 'byte')} definitely lost in {plural(lost_blocks, 'block')} "
        f"({split(lost_bytes, lost_blocks, facts.indirect)}); "
        f"{plural(maybe_bytes, 'byte')} possibly lost in {plural(maybe_blocks, 'block')}; "
        f"{plural(kept_bytes, 'byte')} still reachable in {plural(kept_blocks, 'block')}"
    )
    if facts.untracked:
        out.append(f"({plural(facts.untracked, 'block')} could not be tracked and are not counted)")
    return out
