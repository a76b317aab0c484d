"""Measured against simulated: the benchmark's load as a ``[workload]``, and the table.

:func:`benchmark_workload` turns a :class:`~simulator.io.measured.Measured` run into the
``[workload]`` table that offers the same load: the same number of requests, the same
concurrency cap (closed-loop clients that send the next request when one finishes, as the
clients' semaphores do, each request also held until its release time when the rate is
finite), or the same Poisson (gamma, for vLLM's ``--burstiness``) rate, and the measured
token lengths (exact when every request had the same length, as fixed-ISL/OSL benchmarks
do; else a lognormal with the measured mean and spread, clipped to the measured range).
:func:`comparison` puts each metric the file has beside the simulation's, with the signed
relative error (simulated - measured) / measured.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simulator.io.measured import METRICS, STATS, Lengths, Measured

PERCENTILES = {"p50": 50, "p90": 90, "p95": 95, "p99": 99}
#: Request-level columns of requests.csv behind each metric.
COLUMNS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}


def length_spec(x: Lengths):
    """A scenario length: an int when every request had the same length, else a clipped
    lognormal with the measured mean and coefficient of variation."""
    if x.std <= 0 or (x.low is not None and x.low == x.high):
        return max(1, round(x.mean))
    cv = x.std / x.mean
    spec = {"dist": "lognormal", "mean": x.mean, "sigma": math.sqrt(math.log1p(cv * cv))}
    if x.low is not None:
        spec["min"] = max(1, x.low)
    if x.high is not None:
        spec["max"] = max(1, x.high)
    return spec


def benchmark_workload(m: Measured, concurrency: int | None = None,
                       rate_per_s: float | None = None) -> dict:
    """The ``[workload]`` table offering ``m``'s load (``concurrency`` / ``rate_per_s``
    replace what the file says, for files that do not record it)."""
    conc = concurrency if concurrency is not None else m.concurrency
    rate = rate_per_s if rate_per_s is not None else m.rate_per_s
    wl = {"num_requests": m.requests, "prompt_tokens": length_spec(m.prompt),
          "output_tokens": length_spec(m.output)}
    cv = 1 / math.sqrt(m.burstiness)  # vLLM: gamma gaps of shape `burstiness`
    if conc is not None and conc < m.requests:
        # The clients' semaphore: at most `conc` in flight; with a finite rate, request i is
        # also held until its release time (vllm bench serve's rate-limited closed loop).
        wl |= {"arrival": "closed_loop", "concurrency": conc}
        if rate is not None:
            wl |= {"rate_per_s": rate, "cv": cv}
    elif rate is None:  # no cap, no rate: every request at once
        wl |= {"arrival": "closed_loop", "concurrency": m.requests}
    elif m.burstiness == 1.0:
        wl |= {"arrival": "poisson", "rate_per_s": rate}
    else:
        wl |= {"arrival": "gamma", "rate_per_s": rate, "cv": cv}
    return wl


def simulated(summary: dict, requests: pd.DataFrame) -> dict[str, float]:
    """The simulation's figures in the measured vocabulary (seconds; NumPy's linear
    percentiles over completed requests, as the clients compute them)."""
    done = requests[requests["status"] == "completed"]
    out = {}
    for metric, col in COLUMNS.items():
        x = done[col].to_numpy(dtype=float)
        x = x[np.isfinite(x)]
        if not len(x):
            continue
        out[f"{metric}_mean_s"] = float(x.mean())
        for stat, q in PERCENTILES.items():
            out[f"{metric}_{stat}_s"] = float(np.percentile(x, q))
    for stat in STATS:  # inter-token gaps are not per request: the summary pools them
        if summary.get(f"itl_{stat}_s") is not None:
            out[f"itl_{stat}_s"] = float(summary[f"itl_{stat}_s"])
    for key in ("throughput_req_per_s", "throughput_tok_per_s"):
        out[key] = float(summary[key])
    return out


def comparison(m: Measured, sim: dict[str, float]) -> pd.DataFrame:
    """One row per metric the file has: measured, simulated, error_pct."""
    order = [f"{x}_{s}_s" for x in METRICS for s in STATS]
    order += ["throughput_req_per_s", "throughput_tok_per_s"]
    rows = []
    for key in order:
        if key not in m.metrics:
            continue
        got, want = sim.get(key, float("nan")), m.metrics[key]
        err = (got - want) / want * 100 if want > 0 else float("nan")
        rows.append({"metric": key, "measured": want, "simulated": got, "error_pct": err})
    return pd.DataFrame(rows, columns=["metric", "measured", "simulated", "error_pct"])


THROUGHPUTS = {"throughput_req_per_s": ("throughput", 1.0, "req/s"),
               "throughput_tok_per_s": ("output throughput", 1.0, "tok/s")}


def label(key: str) -> tuple[str, float, str]:
    """A metric key -> (printed label, scale, unit): latencies in milliseconds."""
    if key in THROUGHPUTS:
        return THROUGHPUTS[key]
    metric, stat = key[:-2].split("_", 1)
    return f"{metric.upper()} {stat}", 1e3, "ms"


def format_comparison(m: Measured, table: pd.DataFrame, workload: dict) -> str:
    """The printed table: one line per metric, with units."""
    load = (f"{workload['concurrency']} concurrent clients"
            if workload["arrival"] == "closed_loop" else f"{workload['arrival']} arrivals")
    if "rate_per_s" in workload:
        load += f" at {workload['rate_per_s']:g} req/s"
    lines = [f"measured ({m.tool}, {m.path}) vs simulated: {m.requests:,} requests, {load}, "
             f"prompts {m.prompt.mean:,.0f} and outputs {m.output.mean:,.0f} tokens (mean)",
             f"  {'metric':<24}{'measured':>13}{'simulated':>13}{'error':>9}"]
    for row in table.itertuples():
        name, scale, unit = label(row.metric)
        err = "-" if not math.isfinite(row.error_pct) else f"{row.error_pct:+.1f}%"
        lines.append(f"  {name + ' (' + unit + ')':<24}{row.measured * scale:>13,.2f}"
                     f"{row.simulated * scale:>13,.2f}{err:>9}")
    lines += [f"  note: {n}" for n in m.notes]
    return "\n".join(lines)
