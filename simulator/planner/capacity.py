"""Capacity search: the highest request rate a scenario's layout sustains while meeting its
SLOs at a quantile, by bracketing and bisection on ``workload.rate_per_s``.

A probe is one simulation at a rate (same seed, so arrivals are the same draws scaled: the
probes are comparable). A rate is *sustained* when the TTFT and TPOT quantiles meet the
SLOs and the layout keeps up: it generates the output tokens offered in the steady
window, within 5% or the noise of a short run (past capacity, queues grow without
bound and completions fall behind; see :func:`simulator.planner.simulate.keep_up`). A
probe too short to judge keeping up (too few arrivals in the steady window, or a warm-up
shorter than the median end-to-end latency) is not sustained: a rate is only reported
from runs that show they keep up.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import pandas as pd
from tqdm import tqdm

from simulator.errors import NoAnswer, ScenarioError
from simulator.io.scenario import load_scenario
from simulator.io.schema import Scenario
from simulator.planner.simulate import base_scenario, simulate
from simulator.sweep import resolve_point

#: Requests per probe by default (the scenario's count, capped).
DEFAULT_REQUESTS = 2000
#: Doublings or halvings tried while bracketing the capacity.
MAX_BRACKET = 12
#: Columns of capacity.csv.
CURVE_COLUMNS = ["rate_per_s", "ttft_slo_q_s", "tpot_slo_q_s", "ttft_p50_s", "tpot_p50_s",
                 "throughput_tok_per_s", "goodput_req_per_s", "keep_up_ratio",
                 "keep_up_least", "slo_attainment", "met", "note"]


@dataclass
class CapacityResult:
    """``rate_per_s``: the highest sustained rate found (within ``tolerance`` of the lowest
    rate that failed, ``failed_rate_per_s``); ``curve``: every probe, by rate."""

    scenario: Scenario
    quantile: float
    tolerance: float
    rate_per_s: float
    failed_rate_per_s: float
    curve: pd.DataFrame
    bound: str
    wall_time_s: float
    # Ctrl-C stopped the search: the bracket found so far (rate_per_s is still sustained).
    interrupted: bool = False

#: What a probe too short to judge keeping up says (and how to get an answer).
TOO_SHORT = "too short to judge keeping up at this rate (raise --requests)"


def _misses(row: dict, s: Scenario, q: float) -> list[str]:
    if row["status"] != "ok":
        return [row["error"]]
    p = f"p{q * 100:g}"
    out = []
    if not row["ttft_q_s"] <= s.slo.ttft_s:
        out.append(f"TTFT {p} {row['ttft_q_s']:.3g} s > {s.slo.ttft_s:g} s")
    if not row["tpot_q_s"] <= s.slo.tpot_s:
        out.append(f"TPOT {p} {row['tpot_q_s']:.3g} s > {s.slo.tpot_s:g} s")
    if not math.isfinite(row["keep_up_ratio"]):  # NaN: never counts as keeping up
        out.append(TOO_SHORT)
    elif row["keep_up_ratio"] < row["keep_up_least"]:
        out.append(f"falls behind (generates {row['keep_up_ratio']:.0%} of the offered "
                       f"tokens)")
    return out


def capacity(scenario: str | dict | Scenario, *, slo_quantile: float = 0.99,
             tolerance: float = 0.05, requests: int | None = None,
             overrides: list[str] | None = None, max_probes: int = 40,
             progress: bool = False) -> CapacityResult:
    """Highest request rate the scenario's layout sustains within its SLOs.

    Parameters
    ----------
    scenario : path, dict or Scenario
        An open-loop workload with ``rate_per_s`` (poisson, gamma or constant arrivals);
        its rate is the first probe.
    slo_quantile : float
        Quantile of TTFT and TPOT held to the SLO targets.
    tolerance : float
        Stop when ``(failed - sustained) / sustained <= tolerance``.
    requests : int, optional
        Requests per probe, above the scenario's count too (None: the scenario's, at most
        ``DEFAULT_REQUESTS``).
    overrides : list of str, optional
        ``section.key=value`` overrides.
    max_probes : int
        Safety cap on simulations.
    progress : bool
        A progress line on stderr when it is a terminal (probes, bracket).

    Raises
    ------
    ScenarioError
        A workload without a rate or bad arguments.
    NoAnswer
        No sustained rate down to ``rate / 2**MAX_BRACKET`` (saying which SLO binds).
    KeyboardInterrupt
        Ctrl-C before any rate was sustained (after one, the bracket so far returns with
        ``interrupted`` set).

    Notes
    -----
    Bracket: from the scenario's rate r, double while sustained (or halve while not) until
    one rate is sustained and the next is not. Bisect: probe ``(lo + hi) / 2`` until
    ``hi - lo <= tolerance * lo``. Sustained is assumed monotone in the rate.
    """
    t0 = time.perf_counter()
    if not 0 < slo_quantile <= 1:
        raise ScenarioError(f"--slo-quantile: must be in (0, 1], got {slo_quantile}")
    if not 0 < tolerance < 1:
        raise ScenarioError(f"--tolerance: must be in (0, 1), got {tolerance}")
    base = base_scenario(scenario, overrides, requests, DEFAULT_REQUESTS)
    s = load_scenario(base)
    w = s.workload
    if w.arrival not in ("poisson", "gamma", "constant"):
        raise ScenarioError(f"workload.arrival: capacity needs a rate to vary (poisson, gamma "
                            f"or constant arrivals), got {w.arrival!r}")
    probes: dict[float, dict] = {}
    bar = tqdm(unit="probe", desc="capacity", file=sys.stderr, leave=False,
               disable=None if progress else True)

    def probe(rate: float) -> bool:
        if rate not in probes:
            if len(probes) >= max_probes:
                raise ScenarioError(f"capacity: no answer within {max_probes} probes")
            row = simulate(resolve_point(base, {"workload.rate_per_s": rate}, s.seed),
                           slo_quantile)
            if row["status"] != "ok":
                raise ScenarioError(row["error"])
            row["misses"] = _misses(row, s, slo_quantile)
            probes[rate] = row
            bar.update(1)
            bar.set_postfix_str(f"{rate:.3g} req/s {'met' if not row['misses'] else 'missed'}")
        return not probes[rate]["misses"]

    try:
        lo, hi, interrupted = _search(probe, probes, float(w.rate_per_s), tolerance)
    finally:
        bar.close()

    curve = pd.DataFrame([{"rate_per_s": r, "ttft_slo_q_s": p["ttft_q_s"],
                           "tpot_slo_q_s": p["tpot_q_s"], "ttft_p50_s": p["ttft_p50_s"],
                           "tpot_p50_s": p["tpot_p50_s"],
                           "throughput_tok_per_s": p["throughput_tok_per_s"],
                           "goodput_req_per_s": p["goodput_req_per_s"],
                           "keep_up_ratio": p["keep_up_ratio"],
                           "keep_up_least": p["keep_up_least"],
                           "slo_attainment": p["slo_attainment"], "met": not p["misses"],
                           "note": "; ".join(p["misses"])}
                          for r, p in sorted(probes.items())], columns=CURVE_COLUMNS)
    bound = ("; ".join(probes[hi]["misses"]) if math.isfinite(hi)
             else f"still sustained at {lo:.3g} req/s (the bracket's end)")
    if interrupted:
        bound = "stopped by Ctrl-C; " + bound
    return CapacityResult(s, slo_quantile, tolerance, lo, hi, curve, bound,
                          time.perf_counter() - t0, interrupted)


def _search(probe, probes: dict[float, dict], rate: float,
            tolerance: float) -> tuple[float, float, bool]:
    """Bracket then bisect from ``rate`` with ``probe(rate) -> sustained``: ``(highest
    sustained, lowest failed above it or inf, interrupted)``. On Ctrl-C, the bracket of
    the probes so far (Ctrl-C before any sustained rate propagates)."""
    try:
        return (*_bisect(probe, probes, rate, tolerance), False)
    except KeyboardInterrupt:
        met = [r for r, p in probes.items() if not p["misses"]]
        if not met:
            raise
        lo = max(met)
        return lo, min((r for r in probes if r > lo), default=math.inf), True


def _bisect(probe, probes: dict[float, dict], rate: float,
            tolerance: float) -> tuple[float, float]:
    if probe(rate):
        lo = rate
        for _ in range(MAX_BRACKET):
            if not probe(lo * 2):
                break
            lo *= 2
        hi = lo * 2
        if not probe(hi):
            pass
        else:  # never failed: report the highest probed rate as a lower bound
            hi = math.inf
    else:
        hi = rate
        for _ in range(MAX_BRACKET):
            if probe(hi / 2):
                break
            hi /= 2
        lo = hi / 2
        if not probe(lo):
            r = probes[lo]
            raise NoAnswer(f"slo: the layout meets the SLOs at no rate down to "
                           f"{lo:.3g} req/s; there: " + "; ".join(r["misses"]))
    while math.isfinite(hi) and hi - lo > tolerance * lo:
        mid = (lo + hi) / 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi
