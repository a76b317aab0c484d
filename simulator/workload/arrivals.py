"""Open-loop arrivals as arrays (times, prompt and output lengths), and trace windows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.errors import ScenarioError
from simulator.io.schema import MAX_TIME_S, WorkloadKeys


def _gamma_gaps(rate: float, cv: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` gamma gaps with mean ``1 / rate`` and coefficient of variation ``cv``."""
    shape = 1.0 / cv**2
    return rng.gamma(shape, 1.0 / rate / shape, size=n)


def _gaps(w: WorkloadKeys, n: int, rng: np.random.Generator) -> np.ndarray:
    mean = 1.0 / w.rate_per_s
    if w.arrival == "poisson":
        return rng.exponential(mean, size=n)
    if w.arrival == "gamma":
        return _gamma_gaps(w.rate_per_s, w.cv, n, rng)
    return np.full(n, mean)  # constant


def arrival_times(w: WorkloadKeys, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of an open-loop process, the first at the first gap.

    ``num_requests`` caps the count and ``duration_s`` the horizon; with both, whichever
    comes first.
    """
    if w.num_requests is not None:
        t = np.cumsum(_gaps(w, w.num_requests, rng))
        return t[t <= w.duration_s] if w.duration_s is not None else t
    chunks, now = [], 0.0
    while now <= w.duration_s:
        block = now + np.cumsum(_gaps(w, max(16, int(w.rate_per_s * w.duration_s * 0.5)), rng))
        chunks.append(block)
        now = block[-1]
    t = np.concatenate(chunks)
    return t[t <= w.duration_s]


def release_times(w: WorkloadKeys, rng: np.random.Generator) -> np.ndarray:
    """When each of a rate-limited closed loop's ``num_requests`` requests may be sent (s).

    As ``vllm bench serve --request-rate R --max-concurrency C`` (vllm/benchmarks/serve.py
    ``get_request``): gamma gaps with mean 1/R and shape 1/cv^2 (``burstiness``; cv = 1 is
    a Poisson process), summed and rescaled so that the last is exactly N/R; request i is
    then sent at the later of its release and the moment one of the C clients is free.
    """
    t = np.cumsum(_gamma_gaps(w.rate_per_s, w.cv, w.num_requests, rng))
    return t * (w.num_requests / w.rate_per_s / t[-1])


def trace_window(df: pd.DataFrame, w: WorkloadKeys) -> pd.DataFrame:
    """Apply ``start_s``, ``duration_s`` (trace time), ``time_scale`` and ``num_requests``."""
    t = df["arrival_s"].to_numpy()
    keep = t >= w.start_s
    if w.duration_s is not None:
        keep &= t < w.start_s + w.duration_s
    out = df[keep].copy()
    out["arrival_s"] = (out["arrival_s"] - w.start_s) * w.time_scale
    if w.num_requests is not None:
        out = out.iloc[: w.num_requests]
    if len(out) and out["arrival_s"].iloc[-1] > MAX_TIME_S:
        raise ScenarioError(f"workload.time_scale: {w.time_scale:g} stretches the trace to "
                            f"{out['arrival_s'].iloc[-1]:.3g} s, beyond the {MAX_TIME_S:g} s "
                            f"a run may simulate")
    return out.reset_index(drop=True)
