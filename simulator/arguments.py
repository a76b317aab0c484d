"""Typed command-line values: each numeric flag is parsed by a checker that knows its range.

A value outside its range is an argparse error (one line naming the flag, exit 2) before
the command spends any memory: ``topology show --nodes 1000000``,
``--oversubscription nan``, ``plan --jobs 0``. The ranges follow the scenario's own caps
(:data:`simulator.io.schema.LIMITS`, docs/scenario.md) where a flag stands for a key.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from simulator.files import excerpt
from simulator.io.schema import LIMITS, MAX_REQUESTS

#: Most nodes a command may build (``cluster.nodes``' cap).
MAX_NODES = int(LIMITS["cluster.nodes"]["max"])
#: Highest leaf_spine oversubscription (``cluster.oversubscription``' cap).
MAX_OVERSUBSCRIPTION = LIMITS["cluster.oversubscription"]["max"]
#: Most worker processes a command may start.
MAX_JOBS = 1024
#: Most GPUs a plan may search over, and most collectives timed at once.
MAX_GPUS = 65_536
MAX_CONCURRENT = 65_536
#: Most candidates a plan simulates.
MAX_TOP = 10_000


def whole(lo: int, hi: int) -> Callable[[str], int]:
    """A checker for a whole number in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{excerpt(text)} is not a whole number in "
                                             f"[{lo}, {hi}]") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} must be at least {lo} and at most {hi}")
        return value
    return parse


def real(lo: float, hi: float, low_open: bool = False) -> Callable[[str], float]:
    """A checker for a finite number in [lo, hi] (``(lo, hi]`` with ``low_open``)."""
    span = f"{'(' if low_open else '['}{lo:g}, {hi:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > lo if low_open else value >= lo)
                and value <= hi):
            raise argparse.ArgumentTypeError(f"{excerpt(text)} is not a finite number in "
                                             f"{span}")
        return value
    return parse


nodes = whole(1, MAX_NODES)
jobs = whole(1, MAX_JOBS)
gpus = whole(1, MAX_GPUS)
concurrent = whole(1, MAX_CONCURRENT)
requests = whole(1, MAX_REQUESTS)
top = whole(1, MAX_TOP)
quantile = real(0.0, 1.0, low_open=True)
tolerance = real(0.0, 1.0, low_open=True)
oversubscription = real(1.0, MAX_OVERSUBSCRIPTION)
ratio = real(0.0, MAX_OVERSUBSCRIPTION, low_open=True)  # collective: any link ratio
