"""The answers of `mtrace-top` and `mtrace-peaks`: where the memory is, and where it was
at the peak, from the profiler's per-stack counters (docs/LAYOUT.md "Profile").

A ranking reads like a heap profiler's, biggest LAST so that it is the line left
on the screen after a long list:

    live: 69338456 bytes in 16496 blocks; peak: 77826048 bytes; phase 1 (no reset)
    top 2 of 9 stacks by live bytes, biggest last:
    # 1: 131072 bytes in 1 block
        #0 0x5555555552a9 in hold_array_site at /src/profile_sites.c:52
        #1 0x5555555553f0 in main at /src/profile_sites.c:143
    # 0: 67108864 bytes in 16384 blocks
        #0 0x5555555552c5 in hold_site at /src/profile_sites.c:57
        #1 0x555555555404 in main at /src/profile_sites.c:145

`# 0` is the biggest. Counts are the shared record plus every thread's cached
deltas; a live process may be caught mid-update (a stack counted twice or not at
all for an instant), a stopped one or a core is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..layout import (SUM_LINE, Counts, Header, Profile, Thread, Tracer, checked_sum, sample,
                      signed64)
from .parts import Lookups, stack_lines, thread_details, thread_text

# What --by accepts, and how each ranking is named in the answer.
BY = {
    "live": "live bytes",
    "allocated": "bytes ever allocated",
    "blocks": "live blocks",
    "peak": "bytes at the peak",
}

class NotProfiler(Exception):
    """An old tracer-only library, which kept no counters (every build keeps them now)."""


NOT_PROFILER = (
    "this libmem_trace.so is an old tracer-only build (header flag bit 1 is "
    "clear), so it keeps no per-stack counters or peaks: rebuild it with "
    "`cargo build --release` and run the program under that library"
)


@dataclass(frozen=True)
class Ranked:
    """One stack's line of a ranking: what the ranking counts, plus its live bytes."""

    stack: int
    bytes: int
    blocks: int
    live_bytes: int = 0


def require_profiler(tracer: Tracer) -> Profile:
    """The profile, or NotProfiler (flag bit 1 clear or no profile pointer)."""
    profile = tracer.profile() if tracer.header.profiler else None
    if profile is None:
        raise NotProfiler(NOT_PROFILER)
    return profile


def rank(counts: Dict[int, Counts], by: str) -> List[Ranked]:
    """Every stack with something to count under ``by``, biggest first (ties: more blocks,
    then the older stack)."""
    out = []
    for c in counts.values():
        if by == "live" or by == "blocks":
            r = Ranked(c.stack, c.live_bytes, c.live_blocks, c.live_bytes)
        elif by == "allocated":
            r = Ranked(c.stack, c.total_bytes, c.total_blocks, c.live_bytes)
        else:
            r = Ranked(c.stack, c.peak_bytes, c.peak_blocks, c.live_bytes)
        if r.bytes or r.blocks:
            out.append(r)
    if by == "blocks":
        out.sort(key=lambda r: (-r.blocks, -r.bytes, r.stack))
    else:
        out.sort(key=lambda r: (-r.bytes, -r.blocks, r.stack))
    return out


U64_MAX = (1 << 64) - 1


def rank_thread_blocks(tracer: Tracer, thread: int, by: str) -> Tuple[List[Ranked], int, int]:
    """The live blocks ``thread`` allocated, per stack, from the live-block table (the
    counters are per stack, not per thread); with the thread's live bytes and blocks."""
    sums: Dict[int, List[int]] = {}
    mean = tracer.header.sample_mean
    for b in tracer.blocks():
        if b.thread == thread:
            nbytes, count = sample.weight(b.addr, b.size, mean)
            s = sums.setdefault(b.stack, [0, 0])
            # Clamped as the Rust twin's saturating sums: sizes and weights come from the
            # target, which may have scribbled.
            s[0] = min(s[0] + nbytes, U64_MAX)
            s[1] = min(s[1] + count, U64_MAX)
    ranked = [Ranked(stack, n, count, n) for stack, (n, count) in sums.items()]
    if by == "blocks":
        ranked.sort(key=lambda r: (-r.blocks, -r.bytes, r.stack))
    else:
        ranked.sort(key=lambda r: (-r.bytes, -r.blocks, r.stack))
    return (ranked, min(sum(r.bytes for r in ranked), U64_MAX),
            min(sum(r.blocks for r in ranked), U64_MAX))


def _live_blocks(tracer: Tracer, counts: Dict[int, Counts]) -> Tuple[int, bool]:
    """Live blocks now: the table's count, or under sampling or with tagged blocks the
    counters' sum (tagged blocks are in no shard's count, and counting them otherwise is a
    scan of the heap); and whether the counts summed past 2^64 or below zero (checked_sum)."""
    if not tracer.header.sample_mean and not tracer.header.tag_key:
        totals = tracer.totals()
        return totals.live_blocks, totals.wrapped
    # A stack's count below zero is flagged on its own line (inconsistencies) and counts as
    # zero here.
    return checked_sum([max(c.live_blocks, 0) for c in counts.values()])


def estimated_lines(header: Header) -> List[str]:
    """The line that says the numbers are estimates, under sampling."""
    if not header.sample_mean:
        return []
    return [
        "estimated from sampled allocations: this process samples "
        f"{sample.rate(header.sample_mean)} (MEM_TRACE_SAMPLE)"
    ]


def inconsistencies(header: Header, threads: Sequence[Thread],
                    counts: Dict[int, Counts]) -> List[str]:
    """What no consistent tables hold, one line each: global or per-thread live bytes above
    their peak (a count that went below zero reads as a number near 2^64, above any peak),
    and stacks whose counters sum below zero or to more live than ever allocated (sums that
    wrapped). A core is exact, so there they mean corrupt tables; a running process may also
    be caught between two of its updates."""
    out = []
    if header.live_bytes > header.peak_bytes:
        out.append(f"inconsistent tables: live bytes {header.live_bytes} above the peak "
                   f"{header.peak_bytes}")
    for t in threads:
        if t.live_bytes > t.peak_bytes:
            out.append(f"inconsistent tables: {thread_text(t.index)} live bytes {t.live_bytes} "
                       f"above its peak {t.peak_bytes}")
    wrong = [
        stack for stack, c in sorted(counts.items())
        if any(signed64(n) < 0 for n in (c.live_bytes_raw, c.live_blocks_raw, c.total_bytes_raw,
                                         c.total_blocks_raw, c.peak_bytes_raw, c.peak_blocks_raw))
        or c.live_bytes_raw > c.total_bytes_raw or c.live_blocks_raw > c.total_blocks_raw
    ]
    if wrong:
        out.append(f"inconsistent tables: the counters of {plural(len(wrong), 'stack')} sum below "
                   f"zero or to more live than ever allocated (stack {wrong[0]} first)")
    return out


@dataclass(frozen=True)
class TopFacts:
    """What a ranking needs: the process-wide figures and the ranked stacks."""

    header: Header
    profile: Profile
    live_blocks: int
    by: str
    ranked: Sequence[Ranked]
    # --thread: its index, and its live bytes and blocks from the table.
    thread: Optional[int] = None
    thread_bytes: int = 0
    thread_blocks: int = 0
    # The inconsistencies() lines.
    inconsistent: Tuple[str, ...] = ()

    @classmethod
    def read(cls, tracer: Tracer, by: str, thread: Optional[int] = None) -> "TopFacts":
        profile = require_profiler(tracer)
        counts = tracer.stack_counts()
        live_blocks, wrapped = _live_blocks(tracer, counts)
        flags = tuple(inconsistencies(tracer.header, tracer.threads(), counts)
                      + ([SUM_LINE] if wrapped else []) + estimated_lines(tracer.header))
        if thread is None:
            return cls(tracer.header, profile, live_blocks, by, rank(counts, by),
                       inconsistent=flags)
        ranked, n, count = rank_thread_blocks(tracer, thread, by)
        return cls(tracer.header, profile, live_blocks, by, ranked, thread, n, count, flags)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def phase_text(profile: Profile) -> str:
    """`phase 1 (no reset)`: the phase is one more than the resets so far."""
    resets = "no reset" if profile.resets == 0 else plural(profile.resets, "reset")
    return f"phase {profile.resets + 1} ({resets})"


def summary_line(facts: TopFacts) -> str:
    h = facts.header
    return (
        f"live: {plural(h.live_bytes, 'byte')} in {plural(facts.live_blocks, 'block')}; "
        f"peak: {plural(h.peak_bytes, 'byte')}; {phase_text(facts.profile)}"
    )


def entry_line(k: int, r: Ranked, by: str) -> str:
    """`# 0: 67108864 bytes in 16384 blocks` and what the ranking adds."""
    text = f"# {k}: {plural(r.bytes, 'byte')} in {plural(r.blocks, 'block')}"
    if by == "allocated":
        text += f" allocated ({plural(r.live_bytes, 'byte')} live)"
    elif by == "peak":
        text += f" at the peak ({plural(r.live_bytes, 'byte')} live now)"
    return text


def ranking_lines(ranked: Sequence[Ranked], by: str, n: int, lookups: Lookups,
                  max_frames: Optional[int], what: str) -> List[str]:
    """The title and the top ``n`` entries, each with its stack, biggest (`# 0`) last."""
    top = list(ranked[:n])
    if not top:
        return [f"no stack has {BY[by]}{what}"]
    shown = f"top {len(top)} of {plural(len(ranked), 'stack')}"
    out = [f"{shown} by {BY[by]}{what}, biggest last:"]
    for k in reversed(range(len(top))):
        out.append(entry_line(k, top[k], by))
        out += stack_lines(lookups, top[k].stack, max_frames)
    return out


def top_lines(facts: TopFacts, lookups: Lookups, n: int,
              max_frames: Optional[int] = None) -> List[str]:
    """The answer of `mtrace-top`."""
    out = [summary_line(facts), *facts.inconsistent]
    what = ""
    if facts.thread is not None:
        out.append(
            f"{thread_text(facts.thread)}{thread_details(lookups, facts.thread)}: "
            f"{plural(facts.thread_bytes, 'byte')} in {plural(facts.thread_blocks, 'live block')} "
            "(from the live-block table)"
        )
        what = f" allocated by {thread_text(facts.thread)}"
    return out + ranking_lines(facts.ranked, facts.by, n, lookups, max_frames, what)


@dataclass(frozen=True)
class PeaksFacts:
    """The global and per-thread peaks, and the stacks ranked by bytes at the peak."""

    header: Header
    profile: Profile
    live_blocks: int
    threads: Sequence[Thread]
    ranked: Sequence[Ranked]
    # The inconsistencies() lines.
    inconsistent: Tuple[str, ...] = ()

    @classmethod
    def read(cls, tracer: Tracer) -> "PeaksFacts":
        profile = require_profiler(tracer)
        threads = tracer.threads()
        counts = tracer.stack_counts()
        live_blocks, wrapped = _live_blocks(tracer, counts)
        return cls(
            header=tracer.header,
            profile=profile,
            live_blocks=live_blocks,
            threads=tuple(threads),
            ranked=rank(counts, "peak"),
            inconsistent=tuple(inconsistencies(tracer.header, threads, counts)
                               + ([SUM_LINE] if wrapped else []) + estimated_lines(tracer.header)),
        )


def thread_line(lookups: Lookups, t: Thread) -> str:
    """`  thread 2, tid 4243 "worker", exited: live 0 bytes, peak ..., allocated ...`."""
    return (
        f"  {thread_text(t.index)}{thread_details(lookups, t.index)}: "
        f"live {plural(t.live_bytes, 'byte')}, peak {plural(t.peak_bytes, 'byte')}, "
        f"allocated {plural(t.allocated_bytes, 'byte')}"
    )


def peaks_lines(facts: PeaksFacts, lookups: Lookups, n: int,
                max_frames: Optional[int] = None) -> List[str]:
    """The answer of `mtrace-peaks`."""
    h = facts.header
    out = [
        f"live now: {plural(h.live_bytes, 'byte')} in {plural(facts.live_blocks, 'block')}",
        f"peak: {plural(h.peak_bytes, 'byte')} (at event #{h.peak_seq}, "
        f"{'since the start' if facts.profile.resets == 0 else 'since the last reset'})",
        f"{phase_text(facts.profile)}",
        *facts.inconsistent,
        f"threads: {len(facts.threads)}",
    ]
    out += [thread_line(lookups, t) for t in facts.threads]
    return out + ranking_lines(facts.ranked, "peak", n, lookups, max_frames, "")
