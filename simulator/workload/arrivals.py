"""Open-loop arrivals as arrays (times, prompt and output lengths), and trace windows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.errors import ScenarioError
from simulator.io.schema import MAX_REQUESTS, MAX_TIME_S, WorkloadKeys
from simulator.workload.profile import RateProfile, horizon_for, parse_profile


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


def _unit_gaps(w: WorkloadKeys, n: int, rng: np.random.Generator) -> np.ndarray:
    """Gaps of the process at rate 1 (the rate profile rescales time)."""
    if w.arrival == "poisson":
        return rng.exponential(1.0, size=n)
    if w.arrival == "gamma":
        return _gamma_gaps(1.0, w.cv, n, rng)
    return np.ones(n)


def profile_of(w: WorkloadKeys) -> RateProfile:
    """The workload's validated rate profile."""
    problems: list[str] = []
    profile = parse_profile(w.rate_profile, w.arrival == "trace", problems)
    if problems or profile is None:  # validated at load; direct callers get the message
        raise ScenarioError(problems[0] if problems else "workload.rate_profile: invalid")
    return profile


def warp_times(profile: RateProfile, u: np.ndarray, duration_s: float | None,
               rng: np.random.Generator) -> np.ndarray:
    """``Lambda^-1(u)`` (see :mod:`~simulator.workload.profile`), the horizon doubled until
    it holds every ``u`` or reaches ``duration_s``; times past the duration are dropped."""
    seed = int(rng.integers(2**63))  # one noise stream however often the horizon grows
    horizon = horizon_for(profile, duration_s, len(u))
    while True:
        edges = len(profile.edges(horizon))
        if edges > 4 * 10**6:
            raise ScenarioError(f"workload.rate_profile: {edges:,} rate changes over "
                                f"{horizon:.3g} s (noise_interval_s, steps or bursts); at "
                                f"most 4,000,000")
        t = profile.warp(u, horizon, np.random.default_rng(seed))
        if duration_s is not None:
            return t[t <= duration_s]
        if np.isfinite(t[-1]) or horizon >= MAX_TIME_S:
            break
        horizon = min(MAX_TIME_S, 2 * horizon)
    if not np.isfinite(t[-1]):
        raise ScenarioError(f"workload.rate_profile: {len(u):,} requests do not arrive "
                            f"within the {MAX_TIME_S:g} s a run may simulate (raise the "
                            "rates or lower num_requests)")
    return t


def profiled_times(w: WorkloadKeys, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) under ``[workload.rate_profile]``: unit-rate gaps, rescaled."""
    profile = profile_of(w)
    if w.num_requests is not None:
        u = np.cumsum(_unit_gaps(w, w.num_requests, rng))
        return warp_times(profile, u, w.duration_s, rng)
    # Duration only: unit-rate arrivals until one lands past the duration.
    _, lam = profile.cumulative(w.duration_s, None)
    if lam[-1] > MAX_REQUESTS:
        raise ScenarioError(f"workload.duration_s: the rate profile brings about "
                            f"{lam[-1]:.3g} requests in {w.duration_s:g} s, more than the "
                            f"{MAX_REQUESTS} a run may draw (set num_requests or shorten it)")
    seed = int(rng.integers(2**63))
    u = np.cumsum(_unit_gaps(w, int(lam[-1] * 1.2) + 64, rng))
    while True:
        t = warp_times(profile, u, w.duration_s,
                       np.random.default_rng(seed))
        if len(t) < len(u) or len(u) > MAX_REQUESTS:
            return t
        u = np.concatenate((u, u[-1] + np.cumsum(_unit_gaps(w, len(u), rng))))


def arrival_times(w: WorkloadKeys, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of an open-loop process, the first at the first gap.

    ``num_requests`` caps the count and ``duration_s`` the horizon; with both, whichever
    comes first. A ``rate_profile`` makes the rate a function of time.
    """
    if w.rate_profile is not None:
        return profiled_times(w, rng)
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


def profiled_trace(df: pd.DataFrame, w: WorkloadKeys, rng: np.random.Generator
                   ) -> pd.DataFrame:
    """A replayed trace under ``[workload.rate_profile]`` (multipliers of its own rate):
    trace time ``u`` is replayed at ``Lambda^-1(u)``, ``Lambda`` the multiplier's integral."""
    if w.rate_profile is None or df.empty:
        return df
    out = df.copy()
    out["arrival_s"] = warp_times(profile_of(w), df["arrival_s"].to_numpy(), None, rng)
    if out["arrival_s"].iloc[-1] > MAX_TIME_S:
        raise ScenarioError(f"workload.rate_profile: the replay lasts "
                            f"{out['arrival_s'].iloc[-1]:.3g} s, beyond the {MAX_TIME_S:g} s "
                            "a run may simulate (raise the multipliers)")
    return out
