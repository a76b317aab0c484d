"""SplitMix64 (Steele, Lea and Flood 2014, "Fast splittable pseudorandom number
generators"): the one 64-bit mixer of the package, for Python integers and for numpy arrays.

Stable across runs and processes, unlike Python's salted ``hash`` of strings, so hashes that
place sessions on replicas and draws that decide speculative acceptance are pure functions
of their inputs.
"""

from __future__ import annotations

import numpy as np

MASK = (1 << 64) - 1
#: The increment of the SplitMix64 sequence: 2**64 / golden ratio, odd.
GOLDEN = 0x9E3779B97F4A7C15
M1, M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_GOLDEN64, _M1_64, _M2_64 = np.uint64(GOLDEN), np.uint64(M1), np.uint64(M2)


def splitmix64(x: int) -> int:
    """One SplitMix64 step of the state ``x``: ``finalize(x + GOLDEN)`` modulo 2**64, a
    bijection of 64-bit integers."""
    x = (x + GOLDEN) & MASK
    x = ((x ^ (x >> 30)) * M1) & MASK
    x = ((x ^ (x >> 27)) * M2) & MASK
    return x ^ (x >> 31)


def finalize(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function of every element of a ``uint64`` array (the arithmetic
    wraps modulo 2**64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1_64
    x = x ^ (x >> np.uint64(27))
    x = x * _M2_64
    return x ^ (x >> np.uint64(31))


def golden_multiple(x: np.ndarray) -> np.ndarray:
    """``x * GOLDEN`` modulo 2**64 of every element (a ``uint64`` array): spreads counters and
    ids over 64 bits before :func:`finalize`."""
    return x.astype(np.uint64) * _GOLDEN64
