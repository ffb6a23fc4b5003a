"""Sampling by bytes (MEM_TRACE_SAMPLE, docs/LAYOUT.md "Sampling"): what a sampled block
stands for. The Python twin of crates/read/src/sample.rs: the same arithmetic (glibc's
expm1, the same hash), so that a sum over the live-block table here equals the Rust reader's
and the tracer's own counters."""

from __future__ import annotations

import math
from typing import Tuple

MASK64 = (1 << 64) - 1


def probability(size: int, mean: int) -> float:
    """The probability that a block of ``size`` bytes is sampled (1 when exact)."""
    if mean == 0:
        return 1.0
    return -math.expm1(-float(size) / float(mean))


def weight(addr: int, size: int, mean: int) -> Tuple[int, int]:
    """(bytes, blocks) a sampled block stands for; (size, 1) when ``mean`` is 0."""
    p = probability(size, mean)
    if mean == 0 or p <= 0.0 or p >= 1.0:
        return size, 1
    nbytes = _round(size / p)
    blocks = 1.0 / p
    whole = math.floor(blocks)
    u = (((addr * 0x9E3779B97F4A7C15) & MASK64) >> 11) / float(1 << 53)
    return nbytes, int(whole) + (1 if u < blocks - whole else 0)


def _round(x: float) -> int:
    """Rust's f64::round: halves away from zero (Python's round() goes to even)."""
    return int(math.floor(x + 0.5))


def rate(mean: int) -> str:
    """"one allocation per ~512 KiB"."""
    from .tracer import human_bytes

    return f"one allocation per ~{human_bytes(mean)}"
