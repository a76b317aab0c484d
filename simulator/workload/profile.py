"""Arrival rates that change over time: a diurnal cycle, steps, bursts and noise.

``[workload.rate_profile]`` gives the rate as a function of time. For synthetic arrivals
(``poisson``, ``gamma``, ``constant``) the values are requests per second; over a replayed
trace (``arrival = "trace"``) they are multipliers of the trace's own rate (2 = twice as
many requests per second as recorded, at that moment).

Arrivals come from the time-rescaling theorem: with the cumulative rate
``Lambda(t) = integral_0^t r(s) ds``, the times ``t_k = Lambda^-1(u_k)`` of a unit-rate
process ``u_k`` (exponential gaps for Poisson, gamma gaps of coefficient of variation ``cv``,
constant gaps) form a process of intensity ``r(t)`` (Brown et al., Neural Computation 14,
2002). A trace's own times play ``u_k`` with ``Lambda`` the integral of the multiplier:
a stretch where the multiplier is 2 is replayed in half the time. The rate is held
piecewise constant on a grid of at most ``GRID`` cells (a second or finer, and every step,
burst and noise edge exactly), so ``Lambda`` is piecewise linear and its inverse exact.

Shapes (``shape``):

- ``diurnal``: ``r(t) = trough + (peak - trough) (1 + cos(2 pi (t - peak_at_s) / period_s)) / 2``:
  the peak at ``peak_at_s`` (and every ``period_s``, default 86,400 s), the trough half a
  period away; mean (peak + trough) / 2.
- ``steps``: ``at_s = [t0 = 0, t1, ...]`` and the rate from each time on (``rates_per_s``,
  or ``multipliers`` over a trace).

Either may add ``bursts = [{ at_s, duration_s, multiplier }, ...]`` (the rate times
``multiplier`` inside each) and ``noise`` (a lognormal factor of log-sigma ``noise``, mean 1,
drawn once per ``noise_interval_s``, default 300 s, from the run's arrival stream).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.io.schema import MAX_TIME_S

KEY = "workload.rate_profile"
SHAPES = ("diurnal", "steps")
#: Arrivals a profile may shape (closed loops and sessions have their own pacing).
PROFILED = ("poisson", "gamma", "constant", "trace")
#: Most cells of the piecewise-constant rate (memory: 16 bytes a cell).
GRID = 2_000_000
#: Most bursts, steps and noise intervals one profile may list or imply.
MAX_PIECES = 100_000
BURST_KEYS = ("at_s", "duration_s", "multiplier")


@dataclass(frozen=True)
class RateProfile:
    """A validated ``[workload.rate_profile]``; values are rates (req/s) or multipliers."""

    shape: str
    peak: float = 0.0
    trough: float = 0.0
    period_s: float = 86_400.0
    peak_at_s: float = 0.0
    at_s: tuple[float, ...] = ()
    values: tuple[float, ...] = ()
    bursts: tuple[tuple[float, float, float], ...] = ()
    noise: float = 0.0
    noise_interval_s: float = 300.0

    def base(self, t: np.ndarray) -> np.ndarray:
        """The rate (or multiplier) at times ``t``, before noise."""
        if self.shape == "diurnal":
            phase = 2 * np.pi * (t - self.peak_at_s) / self.period_s
            r = self.trough + (self.peak - self.trough) * (1 + np.cos(phase)) / 2
        else:
            idx = np.searchsorted(np.asarray(self.at_s), t, side="right") - 1
            r = np.asarray(self.values)[np.clip(idx, 0, len(self.values) - 1)]
        for at, dur, mult in self.bursts:
            r = np.where((t >= at) & (t < at + dur), r * mult, r)
        return r

    def mean(self) -> float:
        """The long-run mean of the base shape (no bursts): for sizing the horizon."""
        if self.shape == "diurnal":
            return (self.peak + self.trough) / 2
        return float(np.mean(self.values))

    def edges(self, horizon: float) -> np.ndarray:
        """Times at which the rate jumps (steps, bursts, noise intervals) up to ``horizon``."""
        pts = [*self.at_s, *(b[0] for b in self.bursts), *(b[0] + b[1] for b in self.bursts)]
        if self.noise > 0:
            pts += list(np.arange(0.0, horizon, self.noise_interval_s))
        e = np.asarray(pts, dtype=float)
        return e[(e > 0) & (e < horizon)]

    def cumulative(self, horizon: float, rng: np.random.Generator | None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """``(grid, Lambda(grid))`` over ``[0, horizon]``: the rate piecewise constant on
        the grid cells, evaluated at their midpoints (noise drawn from ``rng``)."""
        smooth = self.shape == "diurnal"
        cells = min(GRID // 2, max(1, math.ceil(horizon))) if smooth else 1
        grid = np.union1d(np.linspace(0.0, horizon, cells + 1), self.edges(horizon))
        mid = (grid[:-1] + grid[1:]) / 2
        r = self.base(mid)
        if self.noise > 0 and rng is not None:
            k = np.floor(mid / self.noise_interval_s).astype(np.int64)
            z = rng.standard_normal(int(k.max()) + 1)
            r = r * np.exp(self.noise * z[k] - self.noise**2 / 2)
        lam = np.concatenate(([0.0], np.cumsum(r * np.diff(grid))))
        return grid, lam

    def warp(self, u: np.ndarray, horizon: float,
             rng: np.random.Generator | None = None) -> np.ndarray:
        """Times ``Lambda^-1(u)`` of unit-rate times ``u`` (those past ``Lambda(horizon)``
        fall beyond the horizon and are dropped by the caller)."""
        grid, lam = self.cumulative(horizon, rng)
        # Zero-rate cells make Lambda flat: np.interp then takes their first time.
        return np.interp(u, lam, grid, right=np.inf)


def _number(table: dict, key: str, problems: list[str], *, positive: bool = False,
            default: float | None = None) -> float:
    v = table.get(key, default)
    if v is None:
        problems.append(f"{KEY}.{key}: required (a number)")
        return 1.0
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0 \
            or (positive and v == 0) or v > MAX_TIME_S * 1e3:
        problems.append(f"{KEY}.{key}: expected a finite number {'> 0' if positive else '>= 0'}"
                        f", got {str(v)[:24]!r}")
        return 1.0
    return float(v)


def _list(table: dict, key: str, problems: list[str]) -> tuple[float, ...]:
    v = table.get(key)
    if not isinstance(v, list) or not v or len(v) > MAX_PIECES or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
            and 0 <= x <= MAX_TIME_S * 1e3 for x in v):
        problems.append(f"{KEY}.{key}: expected a list of 1 to {MAX_PIECES:,} finite numbers "
                        f">= 0")
        return ()
    return tuple(float(x) for x in v)


def parse_profile(table: dict, trace: bool, problems: list[str]) -> RateProfile | None:
    """A :class:`RateProfile` from the TOML table, every problem appended to ``problems``
    (one line each, naming the key). ``trace``: values are multipliers of a replay."""
    rate = "multipliers" if trace else "rates_per_s"
    peak, trough = ("peak", "trough") if trace else ("peak_per_s", "trough_per_s")
    shape = table.get("shape")
    if shape not in SHAPES:
        problems.append(f"{KEY}.shape: expected one of {', '.join(SHAPES)}, got "
                        f"{str(shape)[:24]!r}")
        return None
    allowed = {"shape", "bursts", "noise", "noise_interval_s"}
    allowed |= {peak, trough, "period_s", "peak_at_s"} if shape == "diurnal" else {"at_s", rate}
    for k in table:
        if k not in allowed:
            problems.append(f"{KEY}.{str(k)[:32]}: unknown key for shape = \"{shape}\" "
                            f"{'over a trace ' if trace else ''}(allowed: "
                            f"{', '.join(sorted(allowed))})")
    kw: dict = {"shape": shape}
    if shape == "diurnal":
        kw |= {"peak": _number(table, peak, problems),
               "trough": _number(table, trough, problems),
               "period_s": _number(table, "period_s", problems, positive=True,
                                   default=86_400.0),
               "peak_at_s": _number(table, "peak_at_s", problems, default=0.0)}
        if kw["peak"] < kw["trough"]:
            problems.append(f"{KEY}.{peak}: must be >= {trough} ({kw['trough']:g}), got "
                            f"{kw['peak']:g}")
        if kw["peak"] == 0:
            problems.append(f"{KEY}.{peak}: must be > 0 (no request would ever arrive)")
    else:
        at, values = _list(table, "at_s", problems), _list(table, rate, problems)
        if at and values:
            if len(at) != len(values):
                problems.append(f"{KEY}.{rate}: {len(values)} values for {len(at)} times in "
                                "at_s (one value from each time on)")
            elif at[0] != 0 or any(b <= a for a, b in zip(at, at[1:], strict=False)):
                problems.append(f"{KEY}.at_s: must start at 0 and increase")
            elif max(values) == 0:
                problems.append(f"{KEY}.{rate}: at least one must be > 0")
        kw |= {"at_s": at, "values": values}
    bursts = table.get("bursts", [])
    if not isinstance(bursts, list) or len(bursts) > MAX_PIECES:
        problems.append(f"{KEY}.bursts: expected a list of tables {{ at_s, duration_s, "
                        f"multiplier }} (at most {MAX_PIECES:,})")
        bursts = []
    parsed = []
    for i, b in enumerate(bursts):
        if not isinstance(b, dict) or set(b) != set(BURST_KEYS):
            problems.append(f"{KEY}.bursts[{i}]: expected exactly the keys "
                            f"{', '.join(BURST_KEYS)}")
            continue
        parsed.append((_number(b, "at_s", problems), _number(b, "duration_s", problems,
                                                             positive=True),
                       _number(b, "multiplier", problems)))
    kw["bursts"] = tuple(parsed)
    kw["noise"] = _number(table, "noise", problems, default=0.0)
    kw["noise_interval_s"] = _number(table, "noise_interval_s", problems, positive=True,
                                     default=300.0)
    if kw["noise"] > 3:
        problems.append(f"{KEY}.noise: a log-sigma above 3 is not a rate profile, got "
                        f"{kw['noise']:g}")
    return RateProfile(**kw)


def horizon_for(profile: RateProfile, duration_s: float | None, num_requests: int | None
                ) -> float:
    """How far to lay out the rate: the duration, else three times the time the mean rate
    takes to deliver ``num_requests`` (the caller extends it when that falls short)."""
    if duration_s is not None:
        return duration_s
    return min(MAX_TIME_S, 3.0 * num_requests / max(profile.mean(), 1e-9) + 1.0)
