"""Run metrics in fixed time windows, as an operator's dashboard shows them.

Pure functions of the request and step tables. A window [t, t + w) counts the arrivals and
completions in it; queue and running counts are sampled at the window's end; latency
percentiles are over requests that finished in the window; batching efficiency is the mean
over the first-stage steps that ended in it; KV utilization per replica is the last value
of the window (carried forward while a replica is idle).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def window_edges(end_s: float, window_s: float) -> np.ndarray:
    n = max(1, int(np.ceil(end_s / window_s)))
    return np.arange(n + 1) * window_s


def _count_in(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.histogram(times[~np.isnan(times)], bins=edges)[0]


def _alive_at(start: np.ndarray, end: np.ndarray, at: np.ndarray) -> np.ndarray:
    """How many intervals [start, end) contain each time in ``at`` (NaN end = never)."""
    s = np.sort(start[~np.isnan(start)])
    e = np.sort(np.where(np.isnan(end), np.inf, end)[~np.isnan(start)])
    return np.searchsorted(s, at, side="right") - np.searchsorted(e, at, side="right")


def _pct_by_window(times: np.ndarray, values: np.ndarray, edges: np.ndarray,
                   q: float) -> np.ndarray:
    out = np.full(len(edges) - 1, np.nan)
    ok = ~(np.isnan(times) | np.isnan(values))
    idx = np.searchsorted(edges, times[ok], side="right") - 1
    df = pd.DataFrame({"w": idx, "v": values[ok]})
    df = df[(df["w"] >= 0) & (df["w"] < len(out))]
    if not df.empty:
        got = df.groupby("w")["v"].quantile(q / 100)
        out[got.index.to_numpy()] = got.to_numpy()
    return out


def request_windows(requests: pd.DataFrame, edges: np.ndarray) -> pd.DataFrame:
    """Per-window request metrics (see the module docstring)."""
    arr = requests["arrival_s"].to_numpy(float)
    sched = requests["first_scheduled_s"].to_numpy(float)
    fin = requests["finish_s"].to_numpy(float)
    done = (requests["status"] == "completed").to_numpy()
    fin_done = np.where(done, fin, np.nan)
    ends = edges[1:]
    w = edges[1] - edges[0]
    tokens = np.histogram(fin_done[done], bins=edges,
                          weights=requests["output_tokens"].to_numpy(float)[done])[0]
    # Queued: arrived, not yet scheduled (rejected requests never queue).
    queued_until = np.where(np.isnan(sched), np.where(done, np.inf, arr), sched)
    out = pd.DataFrame({
        "window_start_s": edges[:-1], "window_end_s": ends,
        "arrivals": _count_in(arr, edges),
        "completions": _count_in(fin_done, edges),
        "queue_len": _alive_at(arr, queued_until, ends),
        "running": _alive_at(sched, fin_done, ends),
        "output_tok_per_s": tokens / w,
    })
    for metric in ("ttft_s", "e2e_s"):
        v = requests[metric].to_numpy(float)
        for q in (50, 99):
            out[f"{metric[:-2]}_p{q}_s"] = _pct_by_window(fin_done, v, edges, q)
    if "cached_prompt_tokens" in requests:
        # Prefix hit rate of the requests that completed in the window (tokens).
        cached = np.histogram(fin_done[done], bins=edges, weights=requests[
            "cached_prompt_tokens"].to_numpy(float)[done])[0]
        prompt = np.histogram(fin_done[done], bins=edges,
                              weights=requests["prompt_tokens"].to_numpy(float)[done])[0]
        out["prefix_hit_rate"] = np.where(prompt > 0, cached / np.maximum(prompt, 1), np.nan)
    return out


def step_windows(steps: pd.DataFrame, edges: np.ndarray, budget: int,
                 kv_capacity: dict[int, int]) -> pd.DataFrame:
    """Batching efficiency and KV utilization per replica, per window."""
    n = len(edges) - 1
    out = pd.DataFrame(index=range(n))
    first = steps[steps["stage"] == 0]
    idx = np.searchsorted(edges, first["end_s"].to_numpy(), side="right") - 1
    eff = (first["prefill_tokens"] + first["decode_tokens"]).to_numpy(float) / budget
    keep = (idx >= 0) & (idx < n)
    sums = np.bincount(idx[keep], weights=eff[keep], minlength=n)
    counts = np.bincount(idx[keep], minlength=n)
    out["batch_efficiency"] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    for r, cap in sorted(kv_capacity.items()):
        g = first[first["replica"] == r]
        if g.empty:
            out[f"kv_util_r{r}"] = 0.0
            continue
        # Streams of a replica share its KV: each stream's latest value, summed.
        w = np.searchsorted(edges, g["end_s"].to_numpy(), side="right") - 1
        per_stream = pd.DataFrame({"w": np.clip(w, 0, n - 1), "kv": g["kv_blocks"].to_numpy(),
                                   "stream": g["stream"].to_numpy()})
        last = per_stream.groupby(["w", "stream"])["kv"].last().unstack("stream")
        last = last.reindex(range(n)).ffill().fillna(0.0)
        out[f"kv_util_r{r}"] = last.sum(axis=1).to_numpy() / cap
    return out


def timeseries(requests: pd.DataFrame, steps: pd.DataFrame | None, *, window_s: float,
               budget: int, kv_capacity: dict[int, int],
               gpu: pd.DataFrame | None = None) -> pd.DataFrame:
    """The full per-window table: request metrics, then step metrics when steps exist,
    then per-GPU utilization columns when ``gpu`` (window x GPU table) is given."""
    end = float(np.nanmax(requests[["arrival_s", "finish_s"]].to_numpy(float)))
    edges = window_edges(end, window_s)
    out = request_windows(requests, edges)
    if steps is not None and not steps.empty:
        out = pd.concat([out, step_windows(steps, edges, budget, kv_capacity)],
                        axis=1)
    return out
