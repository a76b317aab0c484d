"""The simulation clock's resolution: every event time is a multiple of ``TICK`` seconds.

``TICK = 2**-30 s`` (about 0.93 ns) is far below any modelled latency. Because all times and
durations are multiples of a power of two, adding them is exact in floating point (up to
2**23 s, about 97 days of simulated time): ``start + a + b == start + (a + b)``, the clock
never drifts, and a run of steps advanced in one event lands on exactly the times that
stepping one by one gives.
"""

from __future__ import annotations

import numpy as np

SCALE = float(2**30)
TICK = 1.0 / SCALE


def ticks(seconds: float) -> float:
    """``seconds`` rounded to the nearest multiple of TICK (ties to even)."""
    return round(seconds * SCALE) / SCALE


def ticks_array(seconds: np.ndarray) -> np.ndarray:
    """:func:`ticks` of each element of ``seconds`` (``np.rint``: ties to even, as ``round``)."""
    return np.rint(seconds * SCALE) / SCALE
