"""Sampling by bytes (MEM_TRACE_SAMPLE, docs/LAYOUT.md "Sampling"): what a sampled block
stands for. The Python twin of crates/read/src/sample.rs: the same arithmetic (the same
expm1, operation for operation, as crates/read/src/exp.rs; the same hash), so that a sum over
the live-block table here equals the Rust reader's and the tracer's own counters."""

from __future__ import annotations

import math
from typing import Tuple

MASK64 = (1 << 64) - 1


def probability(size: int, mean: int) -> float:
    """The probability that a block of ``size`` bytes is sampled (1 when exact)."""
    if mean == 0:
        return 1.0
    return -expm1(-float(size) / float(mean))


# The same bits as crates/read/src/exp.rs's constants.
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
_INV_LN2 = float.fromhex("0x1.71547652b82fep+0")


def expm1(x: float) -> float:
    """e**x - 1 as crates/read/src/exp.rs computes it, to the same bits: the tracer uses that
    one (it does without libm), and the weights must agree to the unit."""
    if math.isnan(x):
        return x
    if -0.5 <= x <= 0.5:
        t = 1.0
        for n in range(18, 1, -1):
            t = 1.0 + x / float(n) * t
        return x * t
    if x < -40.0:
        return -1.0
    return _exp(x) - 1.0


def _exp(x: float) -> float:
    if x > 709.7:
        return math.inf
    k = math.floor(x * _INV_LN2 + 0.5)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    t = 1.0
    for n in range(20, 0, -1):
        t = 1.0 + r / float(n) * t
    half = math.floor(k / 2.0)
    return math.ldexp(math.ldexp(t, half), k - half)


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
