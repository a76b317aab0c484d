"""What a plan shows while it runs, and how it stops on Ctrl-C.

:class:`Progress` is one line on the terminal's stderr (tqdm; nothing when stderr is not a
terminal, nor when ``show`` is false): candidates estimated, simulations done / planned,
best so far. :func:`collect` gathers simulation rows as they finish and turns Ctrl-C into a
flag, so that the plan ends with what it knows; the workers are stopped by closing the
stream (:func:`simulator.sweep.run_many`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator

from tqdm import tqdm

from simulator.planner.objectives import SIM_COLUMN

#: The simulation column shown as "best" for the latency objectives.
LATENCY_COLUMN = {"min_ttft": "ttft_q_s", "min_tpot": "tpot_q_s"}


class Progress:
    """The plan's progress line; ``show`` false (or stderr not a terminal): silent."""

    def __init__(self, objective: str, show: bool = True) -> None:
        self.objective = objective
        self.column = SIM_COLUMN.get(objective) or LATENCY_COLUMN.get(objective,
                                                                      "goodput_req_per_s_per_gpu")
        self.lower = objective in LATENCY_COLUMN  # lower is better
        self.best = math.nan
        # disable=None: tqdm's own test, off when the stream is not a terminal
        self.bar = tqdm(total=0, unit="sim", desc="plan: estimating", file=sys.stderr,
                        disable=None if show else True, leave=False, dynamic_ncols=True)

    def estimated(self, candidates: int, feasible: int) -> None:
        self.bar.set_description_str(f"plan: {candidates} candidates estimated "
                                     f"({feasible} feasible), simulated")

    def planned(self, n: int) -> None:
        self.bar.total += n
        self.bar.refresh()

    def done(self, row: dict, met: bool) -> None:
        value = row.get(self.column, math.nan)
        if met and value == value and (self.best != self.best or (
                value < self.best if self.lower else value > self.best)):
            self.best = float(value)
        self.bar.update(1)
        if self.best == self.best:
            self.bar.set_postfix_str(f"best {self.column} {self.best:.4g}")

    def close(self) -> None:
        self.bar.close()


def collect(stream: Iterator[tuple], sims: dict, progress: Progress, meets) -> bool:
    """Put each ``(key, row)`` of ``stream`` into ``sims`` as it finishes, telling
    ``progress`` (``meets(row)``: whether it met the SLOs). Returns True when Ctrl-C
    stopped it: the stream is closed (its workers stopped) and ``sims`` holds the runs
    that finished."""
    try:
        for key, row in stream:
            sims[key] = row
            progress.done(row, meets(row))
    except KeyboardInterrupt:
        close = getattr(stream, "close", None)
        if close is not None:
            try:
                close()
            except KeyboardInterrupt:  # a second Ctrl-C while the workers stop
                pass
        return True
    return False
