"""Summary metrics: pure functions from the request and step tables to a flat dict.

Definitions (docs/metrics.md): TTFT = first token - arrival; TPOT = (finish - first token)
/ (output tokens - 1); E2E = finish - arrival; queue = first scheduled - arrival. Rates divide
by the span from the first arrival to the last completion. Goodput counts completed requests
whose TTFT and TPOT both meet the SLO (TPOT of a one-token reply counts as met); SLO
attainment is over every request, so rejected, dropped and failed ones count as misses.
Steady-state rates (``*_steady_*``) divide by the second half of the arrival window instead,
so that neither the warm-up nor the drain after the last arrival counts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Every key of a run's summary, in the order files show them (sweeps use it as columns).
SUMMARY_KEYS = [
    "requests_total", "requests_completed", "requests_rejected", "requests_dropped",
    "requests_failed",
    *[f"{m}_{s}_s" for m in ("ttft", "tpot", "e2e") for s in ("mean", "p50", "p90", "p99")],
    "itl_mean_s", "itl_p50_s", "itl_p99_s",
    "queue_mean_s", "queue_p99_s", "throughput_tok_per_s", "throughput_req_per_s",
    "goodput_req_per_s", "slo_attainment", "preemptions_total", "batch_efficiency_mean",
    "pp_bubble_fraction", "pp_stage_idle_s", "steps_total", "simulated_time_s",
    "prefix_hit_rate", "prefill_tokens_saved", "prefix_hit_rate_per_replica",
    "throughput_steady_tok_per_s", "throughput_steady_req_per_s", "goodput_steady_req_per_s",
    "steady_window_s",
    "kv_blocks_per_replica", "kv_tokens_per_replica", "max_model_len", "gpus",
    "simpy_events", "availability_mean", "availability_min", "retries_total",
    "nvlink_util_mean", "nvlink_util_max", "pcie_util_mean", "pcie_util_max",
    "fabric_util_mean", "fabric_util_max",  # simulator.metrics.links
    "downtime_spans",  # [replica, down_s, up_s or null, fault target], from the run's faults
    "energy_j", "energy_per_request_j", "energy_per_output_token_j", "power_mean_w",
    "gpu_hour_usd", "cost_per_million_output_tokens_usd",  # simulator.metrics.power
    "wall_time_s",
]


def _stats(prefix: str, x: pd.Series, out: dict, pcts=(50, 90, 99)) -> None:
    v = x.dropna().to_numpy(dtype=float)
    out[f"{prefix}_mean_s"] = float(v.mean()) if len(v) else float("nan")
    for p in pcts:
        out[f"{prefix}_p{p}_s"] = float(np.percentile(v, p)) if len(v) else float("nan")


def union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Total length covered by the union of intervals [start_i, end_i)."""
    if len(start) == 0:
        return 0.0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    gaps = np.maximum(s[1:] - reach[:-1], 0.0)
    return float(reach[-1] - s[0] - gaps.sum())


def bubble_fraction(steps: pd.DataFrame, pp: int) -> float:
    """Pipeline bubble: stage idle time while its replica has a stage busy.

    For each replica, the busy span U is the union of all its stage steps; a stage is idle
    for U - (its own busy time). The fraction is sum(idle) / sum(pp * U) over replicas: 0 for
    pp = 1, (P-1)/P for P equal stages with one micro-batch in flight.
    """
    if pp <= 1 or steps.empty:
        return 0.0
    idle = total = 0.0
    for _, g in steps.groupby("replica", sort=False):
        s, e = g["start_s"].to_numpy(), g["end_s"].to_numpy()
        u = union_length(s, e)
        idle += pp * u - float((e - s).sum())
        total += pp * u
    return idle / total if total > 0 else 0.0


def bubble_from_totals(busy_s: float, union_s: float, pp: int) -> float:
    """Bubble from streaming totals: ``(pp * union - busy) / (pp * union)`` (see
    :func:`bubble_fraction`; union and busy summed over replicas)."""
    if pp <= 1 or union_s <= 0:
        return 0.0
    return max(0.0, (pp * union_s - busy_s) / (pp * union_s))


def summarize(requests: pd.DataFrame, engine: dict, *, ttft_slo_s: float,
              tpot_slo_s: float, max_num_batched_tokens: int, pp: int,
              steady_end_s: float | None = None) -> dict:
    """Flat summary of a run (keys carry units).

    ``steady_end_s`` ends the steady window instead of the last arrival
    (:func:`steady_rates`): the last session start of multi-turn sessions.

    ``engine`` holds the replicas' streaming totals: ``steps``, ``step_tokens``,
    ``stage_busy_s`` (per stage) and ``union_s`` (see :class:`simulator.engine.replica.Replica`),
    and ``gaps``, the inter-token gap histogram.
    """
    done = requests[requests["status"] == "completed"]
    out: dict = {"requests_total": int(len(requests)),
                 "requests_completed": int(len(done)),
                 "requests_rejected": int((requests["status"] == "rejected").sum()),
                 "requests_dropped": int((requests["status"] == "dropped").sum()),
                 "requests_failed": int((requests["status"] == "failed_after_retries").sum())}
    _stats("ttft", done["ttft_s"], out)
    _stats("tpot", done["tpot_s"], out)
    _stats("e2e", done["e2e_s"], out)
    gaps = engine["gaps"]
    out["itl_mean_s"] = gaps.mean
    out["itl_p50_s"] = gaps.percentile(50)
    out["itl_p99_s"] = gaps.percentile(99)
    queue = (done["first_scheduled_s"] - done["arrival_s"]).dropna()
    out["queue_mean_s"] = float(queue.mean()) if len(queue) else float("nan")
    out["queue_p99_s"] = float(np.percentile(queue, 99)) if len(queue) else float("nan")
    span = float(done["finish_s"].max() - requests["arrival_s"].min()) if len(done) else 0.0
    tokens = float(done["output_tokens"].sum())
    ok = (done["ttft_s"] <= ttft_slo_s) & (done["tpot_s"].isna() | (done["tpot_s"] <= tpot_slo_s))

    def rate(x: float) -> float:
        return x / span if span > 0 else float("nan")

    out["throughput_tok_per_s"] = rate(tokens)
    out["throughput_req_per_s"] = rate(float(len(done)))
    out["goodput_req_per_s"] = rate(float(ok.sum()))
    # Over every request: one rejected, dropped or failed is a miss, not left out.
    out["slo_attainment"] = float(ok.sum()) / len(requests) if len(requests) else float("nan")
    out["preemptions_total"] = int(requests["preemptions"].sum())
    steps = engine["steps"]
    # The token budget's fill from the running totals: a lower bound of the binding-resource
    # fill, which replaces it when steps are recorded (timeseries.batch_fill_mean).
    out["batch_efficiency_mean"] = (engine["step_tokens"] / (steps * max_num_batched_tokens)
                                    if steps else float("nan"))
    busy = engine["stage_busy_s"]
    out["pp_bubble_fraction"] = bubble_from_totals(sum(busy), engine["union_s"], pp)
    # Per stage: time the replica was busy somewhere while this stage was idle.
    out["pp_stage_idle_s"] = [max(0.0, engine["union_s"] - b) for b in busy]
    out["steps_total"] = int(steps)
    out["simulated_time_s"] = float(done["finish_s"].max()) if len(done) else 0.0
    out.update(prefix_hits(done))
    out.update(steady_rates(requests, ok.reindex(requests.index, fill_value=False),
                            steady_end_s))
    return out


def prefix_hits(done: pd.DataFrame) -> dict:
    """Prefix caching over completed requests: hit rate = cached prompt tokens / prompt
    tokens (0 without prefix caching), the prefill tokens saved (the cached ones), and the
    hit rate of each replica (NaN for one that completed nothing)."""
    cached = done["cached_prompt_tokens"] if "cached_prompt_tokens" in done else done[
        "prompt_tokens"] * 0
    prompt = float(done["prompt_tokens"].sum())
    saved = int(cached.sum())
    n = int(done["replica"].max()) + 1 if len(done) else 0
    per = pd.DataFrame({"r": done["replica"], "c": cached, "p": done["prompt_tokens"]}
                       ).groupby("r")[["c", "p"]].sum()
    rates = [float("nan")] * n
    for r, row in per.iterrows():
        if r >= 0 and row["p"] > 0:
            rates[int(r)] = float(row["c"] / row["p"])
    return {"prefix_hit_rate": saved / prompt if prompt > 0 else 0.0,
            "prefill_tokens_saved": saved, "prefix_hit_rate_per_replica": rates}


#: Share of the arrival window skipped as warm-up before the steady window (as the planner).
STEADY_WARMUP = 0.5


def tokens_generated(requests: pd.DataFrame, lo: float, hi: float) -> float:
    """Output tokens of completed requests generated in [lo, hi]: the first at
    ``first_token_s``, the other ``output - 1`` evenly until ``finish_s``."""
    done = (requests["status"] == "completed").to_numpy()
    first = requests["first_token_s"].to_numpy(dtype=float)[done]
    finish = requests["finish_s"].to_numpy(dtype=float)[done]
    out = requests["output_tokens"].to_numpy(dtype=float)[done]
    span = np.maximum(finish - first, 1e-12)
    overlap = np.clip(np.minimum(finish, hi) - np.maximum(first, lo), 0.0, None)
    return float(((out - 1) * overlap / span).sum() + ((first >= lo) & (first <= hi)).sum())


def steady_rates(requests: pd.DataFrame, ok: pd.Series, end_s: float | None = None) -> dict:
    """Rates over the steady window ``[t0 + STEADY_WARMUP (t1 - t0), t1]``, t0 and t1 the
    first and last arrival (nan when the window is empty); ``end_s``, when given, is t1.
    Multi-turn sessions end it at the last session start: the turns arriving later are
    the last sessions' remaining ones, fewer and fewer, a ramp-down that a window up to the
    last arrival would mostly hold.

    Tokens per second generated in the window (:func:`tokens_generated`), completions per
    second finishing in it, and goodput: requests arriving in it that complete within both
    SLOs, per second. At an offered rate a layout keeps up with, goodput equals the offered
    rate; the whole-run figures divide by a span that includes the drain.
    """
    t = requests["arrival_s"].to_numpy(dtype=float)
    nan = float("nan")
    keys = ("throughput_steady_tok_per_s", "throughput_steady_req_per_s",
            "goodput_steady_req_per_s")
    if len(t) < 2 or t.max() <= t.min():
        return {**dict.fromkeys(keys, nan), "steady_window_s": 0.0}
    t0, t1 = float(t.min()), float(t.max()) if end_s is None else float(end_s)
    if t1 <= t0:
        return {**dict.fromkeys(keys, nan), "steady_window_s": 0.0}
    lo = t0 + STEADY_WARMUP * (t1 - t0)
    width = t1 - lo
    fin = requests["finish_s"].where(requests["status"] == "completed").to_numpy(dtype=float)
    arrived = (t > lo) & (t <= t1)  # k gaps of a constant rate hold k arrivals
    return {"throughput_steady_tok_per_s": tokens_generated(requests, lo, t1) / width,
            "throughput_steady_req_per_s": float(((fin >= lo) & (fin <= t1)).sum()) / width,
            "goodput_steady_req_per_s": float((arrived & ok.to_numpy()).sum()) / width,
            "steady_window_s": width}
