"""Inter-token latency (ITL) distribution, accumulated as a log-binned histogram.

Every gap between two consecutive output tokens of a request is one sample; a decode step
of n sequences adds n samples at once, so the engine never touches tokens one by one. Bins
are 0.5% wide (460 per decade from 1 us to 1,000 s): percentiles are exact to 0.25% (the
bin's geometric middle); the mean is exact.
"""

from __future__ import annotations

import numpy as np

LO, HI, PER_DECADE = 1e-6, 1e3, 460


class GapHistogram:
    """Weighted samples of gaps (s) in log-spaced bins."""

    def __init__(self) -> None:
        self.edges = np.logspace(np.log10(LO), np.log10(HI), 9 * PER_DECADE + 1)
        self.counts = np.zeros(len(self.edges) + 1, dtype=np.int64)
        self.total = 0
        self.sum_s = 0.0
        self._scale = PER_DECADE / np.log(10.0)
        self._log_lo = np.log(LO)

    def _bin(self, gap: float) -> int:
        if gap < LO:
            return 0
        if gap >= HI:
            return len(self.edges)
        i = int((np.log(gap) - self._log_lo) * self._scale) + 1
        return min(max(i, 1), len(self.edges) - 1)

    def add(self, gap: float, count: int = 1) -> None:
        """``count`` gaps of ``gap`` seconds."""
        if count > 0:
            self.counts[self._bin(gap)] += count
            self.total += count
            self.sum_s += gap * count

    def add_run(self, times, count: int) -> None:
        """``count`` sequences emitted a token at each of ``times``: the gaps between
        consecutive times, ``count`` of each."""
        gaps = np.diff(np.asarray(times, dtype=float))
        if len(gaps) == 0 or count <= 0:
            return
        idx = np.clip(((np.log(np.maximum(gaps, LO)) - self._log_lo) * self._scale)
                      .astype(np.int64) + 1, 1, len(self.edges) - 1)
        idx[gaps < LO] = 0
        idx[gaps >= HI] = len(self.edges)
        np.add.at(self.counts, idx, count)
        self.total += count * len(gaps)
        self.sum_s += float(gaps.sum()) * count

    def merge(self, other: GapHistogram) -> None:
        self.counts += other.counts
        self.total += other.total
        self.sum_s += other.sum_s

    def percentile(self, p: float) -> float:
        """The p-th percentile (0-100): the geometric middle of the bin that holds it."""
        if self.total == 0:
            return float("nan")
        rank = np.searchsorted(np.cumsum(self.counts), p / 100 * self.total, side="left")
        if rank == 0:
            return LO
        if rank >= len(self.edges):
            return HI
        return float(np.sqrt(self.edges[rank - 1] * self.edges[rank]))

    @property
    def mean(self) -> float:
        return self.sum_s / self.total if self.total else float("nan")
