"""Run metrics in fixed time windows, as an operator's dashboard shows them.

Pure functions of the request and step tables. A window [t, t + w) counts the arrivals and
completions in it; queue and running counts, and the ages of what waits, are sampled at the
window's end (a request rerouted after a failure is queued, not running, until admitted
again; ``oldest_queued_s`` still ages only requests never admitted); output tokens count
in the window where they are generated; latency percentiles are over requests that
finished in the window; batch fill is the mean over the first-stage steps that ended in it
of how full each step was on its binding resource; KV utilization per replica is the last
value of the window (carried forward while a replica is idle).
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


def _pcts_by_window(times: np.ndarray, values: dict[str, np.ndarray], edges: np.ndarray,
                    qs: tuple[float, ...]) -> dict[tuple[str, float], np.ndarray]:
    """Per window [edges[i], edges[i + 1]): the q-th percentiles (linear) of each of
    ``values`` over the rows whose ``times`` fall in it, NaN values left out (NaN where
    none is left). One grouping for every column and percentile: the rows share their
    times, and pandas' grouped quantile skips each column's NaN on its own."""
    n = len(edges) - 1
    ok = ~np.isnan(times)
    idx = np.searchsorted(edges, times[ok], side="right") - 1
    inside = (idx >= 0) & (idx < n)
    table = pd.DataFrame({k: v[ok][inside] for k, v in values.items()})
    out = {(k, q): np.full(n, np.nan) for k in values for q in qs}
    if table.empty:
        return out
    grouped = table.groupby(idx[inside])
    for q in qs:
        got = grouped.quantile(q / 100)
        rows = got.index.to_numpy()
        for k in values:
            out[k, q][rows] = got[k].to_numpy()
    return out


def generated_by(requests: pd.DataFrame, at: np.ndarray) -> np.ndarray:
    """Output tokens of completed requests generated before each time in ``at`` (so that a
    window [a, b) holds ``G(b) - G(a)``): a request's
    first token at ``first_token_s``, its other ``output - 1`` evenly until ``finish_s``.

    Notes
    -----
    With rate r_i = (o_i - 1) / (f_i - s_i) over [s_i, f_i), the tokens by t are
    ``sum_{s_i < t} 1 + sum_{s_i <= t} r_i (t - s_i) - sum_{f_i <= t} r_i (t - f_i)``: sorted prefix
    sums, O((n + len(at)) log n), no loop over requests.
    """
    done = (requests["status"] == "completed").to_numpy()
    s = requests["first_token_s"].to_numpy(float)[done]
    f = requests["finish_s"].to_numpy(float)[done]
    o = requests["output_tokens"].to_numpy(float)[done]
    span = f - s
    r = np.where(span > 0, (o - 1) / np.where(span > 0, span, 1.0), 0.0)
    burst = np.where(span > 0, 1.0, o)  # all at once when first token and finish coincide
    at = np.asarray(at, dtype=float)

    def by(times: np.ndarray, weights: np.ndarray,
           side: str = "right") -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(times, kind="stable")
        k = np.searchsorted(times[order], at, side=side)
        cw = np.concatenate(([0.0], np.cumsum(weights[order])))
        ctw = np.concatenate(([0.0], np.cumsum((weights * times)[order])))
        return cw[k], ctw[k]

    n_s, _ = by(s, burst, "left")
    rs, rts = by(s, r)
    rf, rtf = by(f, r)
    return n_s + (at * rs - rts) - (at * rf - rtf)


def oldest_age(arrival: np.ndarray, until: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Age at each time t in ``at`` of the oldest interval [arrival, until) containing t
    (0 when none does).

    Notes
    -----
    In arrival order, the oldest one holding t is the first whose ``until`` exceeds t, if
    it has arrived: the first index where the running maximum of ``until`` passes t.
    """
    order = np.argsort(arrival, kind="stable")
    a, u = arrival[order], until[order]
    if len(a) == 0:
        return np.zeros(len(at))
    reach = np.maximum.accumulate(u)
    i = np.searchsorted(reach, at, side="right")
    i_safe = np.minimum(i, len(a) - 1)
    holds = (i < len(a)) & (a[i_safe] <= at)
    return np.where(holds, at - a[i_safe], 0.0)


def request_windows(requests: pd.DataFrame, edges: np.ndarray,
                    requeues: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-window request metrics (see the module docstring and docs/observability.md).

    ``requeues`` (``request_id``, ``requeued_s``, ``readmitted_s``): admitted requests sent
    back to a queue by a failure. Each counts as queued, not running, from ``requeued_s``
    until ``readmitted_s`` (NaN: until it finished, or for good)."""
    arr = requests["arrival_s"].to_numpy(float)
    sched = requests["first_scheduled_s"].to_numpy(float)
    first = requests["first_token_s"].to_numpy(float)
    fin = requests["finish_s"].to_numpy(float)
    done = (requests["status"] == "completed").to_numpy()
    fin_done = np.where(done, fin, np.nan)
    ends = edges[1:]
    w = edges[1] - edges[0]
    tokens = np.diff(generated_by(requests, edges))
    # Queued: arrived, not yet scheduled, until scheduled or given up (dropped while no
    # replica was up); rejected requests never queue (no finish time, so until = arrival).
    left = np.where(np.isnan(fin), arr, fin)
    queued_until = np.where(np.isnan(sched), left, sched)
    no_token_until = np.where(np.isnan(first), left, first)
    requeued = np.zeros(len(ends), dtype=np.int64)
    if requeues is not None and len(requeues):
        left_of = pd.Series(np.where(np.isnan(fin), np.nan, fin),
                            index=requests["request_id"].to_numpy())
        back = requeues["readmitted_s"].to_numpy(float)
        gone = left_of.reindex(requeues["request_id"].to_numpy()).to_numpy(float)
        requeued = _alive_at(requeues["requeued_s"].to_numpy(float),
                             np.where(np.isnan(back), gone, back), ends)
    out = pd.DataFrame({
        "window_start_s": edges[:-1], "window_end_s": ends,
        "arrivals": _count_in(arr, edges),
        "completions": _count_in(fin_done, edges),
        "queue_len": _alive_at(arr, queued_until, ends) + requeued,
        "running": _alive_at(sched, np.where(np.isnan(sched), np.nan, left), ends) - requeued,
        "output_tok_per_s": tokens / w,
        "oldest_queued_s": oldest_age(arr, queued_until, ends),
        "waiting_ttft_max_s": oldest_age(arr, no_token_until, ends),
    })
    metrics = ("ttft_s", "tpot_s", "e2e_s")
    pcts = _pcts_by_window(fin_done, {m: requests[m].to_numpy(float) for m in metrics},
                           edges, (50, 99))
    for metric in metrics:
        for q in (50, 99):
            out[f"{metric[:-2]}_p{q}_s"] = pcts[metric, q]
    if "cached_prompt_tokens" in requests:
        # Prefix hit rate of the requests that completed in the window (tokens).
        cached = np.histogram(fin_done[done], bins=edges, weights=requests[
            "cached_prompt_tokens"].to_numpy(float)[done])[0]
        prompt = np.histogram(fin_done[done], bins=edges,
                              weights=requests["prompt_tokens"].to_numpy(float)[done])[0]
        out["prefix_hit_rate"] = np.where(prompt > 0, cached / np.maximum(prompt, 1), np.nan)
    return out


def step_fill(steps: pd.DataFrame, budget: int, max_num_seqs: int,
              stream_blocks: int) -> pd.DataFrame:
    """How full each step was on each of a micro-batch stream's three limits, and on the
    binding one (their maximum), as fractions.

    ``seqs = batch_size / max_num_seqs``, ``tokens = (prefill + decode tokens) /
    max_num_batched_tokens``, ``kv = kv_blocks / KV blocks per stream``. A decode-heavy
    step uses a few percent of the token budget even when no further sequence fits: its
    limit is sequences or KV blocks, so the fill is the largest of the three.
    """
    seqs = steps["batch_size"].to_numpy(float) / max_num_seqs
    tokens = (steps["prefill_tokens"] + steps["decode_tokens"]).to_numpy(float) / budget
    kv = steps["kv_blocks"].to_numpy(float) / max(stream_blocks, 1)
    return pd.DataFrame({"seqs": seqs, "tokens": tokens, "kv": kv,
                         "fill": np.maximum(np.maximum(seqs, tokens), kv)})


def batch_fill_mean(steps: pd.DataFrame, budget: int, max_num_seqs: int,
                    stream_blocks: int) -> float:
    """Mean over a run's first-stage steps of the binding-resource fill
    (:func:`step_fill`'s ``fill``): summary.json's ``batch_efficiency_mean`` when steps are
    recorded. NaN for a run without steps."""
    first = steps[steps["stage"] == 0]
    if first.empty:
        return float("nan")
    return float(step_fill(first, budget, max_num_seqs, stream_blocks)["fill"].mean())


def step_windows(steps: pd.DataFrame, edges: np.ndarray, budget: int,
                 kv_capacity: dict[int, int], *, max_num_seqs: int,
                 stream_blocks: int) -> pd.DataFrame:
    """Batch fill (:func:`step_fill`, mean over the first-stage steps ending in each window;
    ``batch_efficiency`` is the binding resource's fill) and KV utilization per replica."""
    n = len(edges) - 1
    out = pd.DataFrame(index=range(n))
    first = steps[steps["stage"] == 0]
    idx = np.searchsorted(edges, first["end_s"].to_numpy(), side="right") - 1
    fill = step_fill(first, budget, max_num_seqs, stream_blocks)
    keep = (idx >= 0) & (idx < n)
    counts = np.bincount(idx[keep], minlength=n)
    for col, name in (("fill", "batch_efficiency"), ("seqs", "batch_fill_seqs"),
                      ("tokens", "batch_fill_tokens"), ("kv", "batch_fill_kv")):
        sums = np.bincount(idx[keep], weights=fill[col].to_numpy()[keep], minlength=n)
        out[name] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
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


def down_windows(downtime: list[list[list[float]]], edges: np.ndarray) -> np.ndarray:
    """Replicas down at each window's end, from each replica's [down, up] spans."""
    spans = [sp for rep in downtime for sp in rep]
    if not spans:
        return np.zeros(len(edges) - 1, dtype=np.int64)
    start = np.array([a for a, _ in spans], dtype=float)
    end = np.array([b for _, b in spans], dtype=float)
    return _alive_at(start, np.where(np.isinf(end), np.nan, end), edges[1:])


def mark_down(ts: pd.DataFrame, downtime: list[list[list[float]]],
               edges: np.ndarray) -> pd.DataFrame:
    """``ts`` with ``replicas_down`` and, for each window in which replica R is down at its
    end, ``kv_util_rR`` = 0 (its KV cache is lost; carrying its last value forward would show
    a frozen cache through the outage)."""
    ts = ts.copy()
    ts["replicas_down"] = down_windows(downtime, edges)
    for r, spans in enumerate(downtime):
        col = f"kv_util_r{r}"
        if col in ts and spans:
            down = down_windows([spans], edges) > 0
            ts.loc[down, col] = 0.0
    return ts


def timeseries(requests: pd.DataFrame, steps: pd.DataFrame | None, *, window_s: float,
               budget: int, kv_capacity: dict[int, int], max_num_seqs: int,
               stream_blocks: int, gpu: pd.DataFrame | None = None,
               requeues: pd.DataFrame | None = None) -> pd.DataFrame:
    """The full per-window table: request metrics, then step metrics when steps exist,
    then per-GPU utilization columns when ``gpu`` (window x GPU table) is given.
    ``requeues``: reroutes after failures (:meth:`Recorder.requeues_frame`)."""
    end = float(np.nanmax(requests[["arrival_s", "finish_s"]].to_numpy(float)))
    edges = window_edges(end, window_s)
    out = request_windows(requests, edges, requeues)
    if steps is not None and not steps.empty:
        out = pd.concat([out, step_windows(steps, edges, budget, kv_capacity,
                                           max_num_seqs=max_num_seqs,
                                           stream_blocks=stream_blocks)], axis=1)
    return out
