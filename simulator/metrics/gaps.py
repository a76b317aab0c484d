"""Inter-token latency (ITL) distribution, accumulated as a log-binned histogram.

Every gap between two consecutive output tokens of a request is one sample; a decode step
of n sequences adds n samples at once, so the engine never touches tokens one by one. Bins
are 0.5% wide (460 per decade from 1 us to 1,000 s): percentiles are exact to 0.25% (the
bin's geometric middle); the mean is exact.
"""

from __future__ import annotations

import math
from array import array

import numpy as np

LO, HI, PER_DECADE = 1e-6, 1e3, 460


class GapHistogram:
    """Weighted samples of gaps (s) in log-spaced bins."""

    #: Run samples are buffered and binned in bulk once this many gaps wait.
    FLUSH = 1 << 20

    def __init__(self) -> None:
        # Buffered samples as flat arrays of numbers, filled while the values are fresh in
        # the cache: runs' times end to end with each run's length and count, and single
        # gaps with their counts.
        self._times, self._lens, self._weights = array("d"), array("q"), array("q")
        self._pending = 0
        self._gaps, self._counts = array("d"), array("q")
        self.edges = np.logspace(np.log10(LO), np.log10(HI), 9 * PER_DECADE + 1)
        self.counts = np.zeros(len(self.edges) + 1, dtype=np.int64)
        self._total = 0
        self.sum_s = 0.0
        self._scale = PER_DECADE / np.log(10.0)
        self._log_lo = math.log(LO)

    def add(self, gap: float, count: int = 1) -> None:
        """``count`` gaps of ``gap`` seconds (buffered; binned in bulk)."""
        if count > 0:
            self._gaps.append(gap)
            self._counts.append(count)
            if len(self._gaps) >= self.FLUSH:
                self._flush()

    def add_run(self, times, count: int) -> None:
        """``count`` sequences emitted a token at each of ``times``: the gaps between
        consecutive times, ``count`` of each (buffered; binned in bulk)."""
        if len(times) < 2 or count <= 0:
            return
        if type(times) is list:
            self._times.fromlist(times)  # faster than extend
        else:
            self._times.frombytes(np.asarray(times, dtype=np.float64).tobytes())
        self._lens.append(len(times))
        self._weights.append(count)
        self._pending += len(times)
        if self._pending >= self.FLUSH:
            self._flush()

    def _flush(self) -> None:
        if not self._lens and not self._gaps:
            return
        gaps = [np.frombuffer(self._gaps, dtype=np.float64)]
        weights = [np.frombuffer(self._counts, dtype=np.int64)]
        if self._lens:
            # All runs' times end to end, differenced once; the differences across two runs'
            # boundary are dropped.
            times = np.frombuffer(self._times, dtype=np.float64)
            lens = np.frombuffer(self._lens, dtype=np.int64)
            keep = np.ones(len(times) - 1, dtype=bool)
            keep[np.cumsum(lens)[:-1] - 1] = False
            gaps.append(np.diff(times)[keep])
            weights.append(np.repeat(np.frombuffer(self._weights, dtype=np.int64), lens - 1))
        gaps, weights = np.concatenate(gaps), np.concatenate(weights)
        self._times, self._lens, self._weights = array("d"), array("q"), array("q")
        self._pending, self._gaps, self._counts = 0, array("d"), array("q")
        with np.errstate(divide="ignore"):
            idx = ((np.log(gaps) - self._log_lo) * self._scale).astype(np.int64) + 1
        idx = np.where(gaps < LO, 0, np.where(gaps >= HI, len(self.edges),
                                              np.clip(idx, 1, len(self.edges) - 1)))
        self.counts += np.bincount(idx, weights=weights,
                                   minlength=len(self.counts)).astype(np.int64)
        self._total += int(weights.sum())
        self.sum_s += float((gaps * weights).sum())

    def merge(self, other: GapHistogram) -> None:
        self._flush()
        other._flush()
        self.counts += other.counts
        self._total += other._total
        self.sum_s += other.sum_s

    def percentile(self, p: float) -> float:
        """The p-th percentile (0-100): the geometric middle of the bin that holds it."""
        self._flush()
        if self._total == 0:
            return float("nan")
        rank = np.searchsorted(np.cumsum(self.counts), p / 100 * self._total, side="left")
        if rank == 0:
            return LO
        if rank >= len(self.edges):
            return HI
        return float(np.sqrt(self.edges[rank - 1] * self.edges[rank]))

    @property
    def total(self) -> int:
        """Gaps counted."""
        self._flush()
        return self._total

    @property
    def mean(self) -> float:
        self._flush()
        return self.sum_s / self._total if self._total else float("nan")
