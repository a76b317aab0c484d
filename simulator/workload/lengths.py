"""Token-length samplers: a constant or a distribution table from the scenario."""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.io.schema import MAX_TOKENS


def sample_lengths(spec: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` integer token counts (>= 1) drawn from ``spec``.

    Parameters
    ----------
    spec : int or dict
        An int (every request the same) or a table with ``dist`` one of constant (value),
        uniform (min, max: inclusive integers), normal (mean, std), lognormal (mean, sigma:
        the arithmetic mean and the log-space sigma, mu = ln(mean) - sigma^2/2) or
        exponential (mean); optional ``min`` and ``max`` clip the draws (always to at
        most ``MAX_TOKENS``).
    """
    if isinstance(spec, int):
        return np.full(n, spec, dtype=np.int64)
    dist = spec["dist"]
    if dist == "constant":
        x = np.full(n, float(spec["value"]))
    elif dist == "uniform":
        x = rng.integers(int(spec["min"]), int(spec["max"]) + 1, size=n).astype(float)
    elif dist == "normal":
        x = rng.normal(spec["mean"], spec["std"], size=n)
    elif dist == "lognormal":
        sigma = float(spec["sigma"])
        mu = np.log(max(float(spec["mean"]), 1e-9)) - sigma**2 / 2
        x = rng.lognormal(mu, sigma, size=n)
    elif dist == "exponential":
        x = rng.exponential(spec["mean"], size=n)
    else:  # validated earlier; kept for direct callers
        raise ValueError(f"unknown length distribution {dist!r}")
    lo = max(1, int(spec.get("min", 1)))
    # Never past MAX_TOKENS: a heavy tail must not overflow int64 (no model takes more).
    hi = min(spec.get("max", MAX_TOKENS), MAX_TOKENS)
    return np.clip(np.rint(x), lo, hi).astype(np.int64)


class LengthStream:
    """Deterministic stream of lengths drawn in chunks (closed-loop clients draw lazily)."""

    def __init__(self, spec: Any, rng: np.random.Generator, chunk: int = 4096):
        self.spec, self.rng, self.chunk = spec, rng, chunk
        self._buf = np.empty(0, dtype=np.int64)
        self._i = 0

    def next(self) -> int:
        v = self.peek()
        self._i += 1
        return v

    def peek(self) -> int:
        """The length :meth:`next` returns next, without taking it."""
        if self._i == len(self._buf):
            self._buf, self._i = sample_lengths(self.spec, self.chunk, self.rng), 0
        return int(self._buf[self._i])
