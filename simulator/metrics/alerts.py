"""Alert rules over windowed metrics: every firing and clearing, as an operator sees them.

A rule compares one window column with a threshold. With hysteresis, it fires at the end of
the ``fire_after``-th window in a row that breaks it and clears at the end of the
``clear_after``-th window in a row that does not (``[alerts]``; 1 and 1: the first window
either way), so a value hovering at the threshold does not fire and clear every window.
Windows with no value (no request finished, no step ran) leave the state and the count as
they were. ``batch_efficiency_below`` breaks only while requests wait (at the window's end
the oldest queued request has waited longer than a window): under-filled batches with
nothing waiting are light load, not waste.
The latency rules take the p99 over the requests finished in the window, topped up with
the latest earlier ones to at least ``min_completions`` (a p99 of one or two requests is
noise; a fixed minimum per window would never clear at low load). Rules on what waits
(queue length, age of the oldest queued request, age of the oldest request still without
its first token) have a value in every window, so they see an outage while nothing
completes. Rules run on the whole cluster (``replica = "all"``) and on each replica.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from simulator.metrics.timeseries import request_windows, step_windows, window_edges


def _above(v, t):
    return v > t


def _below(v, t):
    return v < t


def _queued(ts: pd.DataFrame) -> np.ndarray:
    """Windows ending with a request queued for longer than a window: work that waits, not
    the arrival of the last few milliseconds that the next step takes."""
    width = ts["window_end_s"].to_numpy(dtype=float) - ts["window_start_s"].to_numpy(dtype=float)
    return ts["oldest_queued_s"].to_numpy(dtype=float) > width


#: rule name -> (window column, breaks the rule?, scenario key of its threshold, and a
#: condition the window must also meet to break it, or None)
RULES: dict[str, tuple[str, Callable, str, Callable | None]] = {
    "ttft_p99_above": ("ttft_p99_s", _above, "ttft_p99_s", None),
    "e2e_p99_above": ("e2e_p99_s", _above, "e2e_p99_s", None),
    "batch_efficiency_below": ("batch_efficiency", _below, "batch_efficiency_min", _queued),
    "queue_len_above": ("queue_len", _above, "queue_len_max", None),
    "oldest_queued_above": ("oldest_queued_s", _above, "oldest_queued_s", None),
    "waiting_ttft_above": ("waiting_ttft_max_s", _above, "waiting_ttft_s", None),
}
#: Scenario keys of the ``[alerts]`` table that :func:`alerts` reads.
THRESHOLD_KEYS = ("ttft_p99_s", "e2e_p99_s", "batch_efficiency_min", "queue_len_max",
                  "oldest_queued_s", "waiting_ttft_s", "min_completions", "fire_after",
                  "clear_after")
ALERT_COLUMNS = ["time_s", "rule", "event", "value", "threshold", "replica"]


def _run_lengths(flags: np.ndarray) -> np.ndarray:
    """Per element, how many elements in a row up to it (itself included) have its value."""
    start = np.flatnonzero(np.concatenate(([True], flags[1:] != flags[:-1])))
    length = np.arange(len(flags)) - np.repeat(start, np.diff(np.append(start, len(flags))))
    return length + 1


def switches(bad: np.ndarray, fire_after: int = 1, clear_after: int = 1) -> list[int]:
    """Indices where the alert state changes: it starts clear, fires where ``fire_after``
    breaking values in a row end, clears where ``clear_after`` good ones in a row end.

    Vectorized over the values; the loop runs once per event (a fire needs a clear before
    the next fire, so each takes the first candidate after the last event).
    """
    n = _run_lengths(bad)
    fires = np.flatnonzero(bad & (n == fire_after))
    clears = np.flatnonzero(~bad & (n == clear_after))
    out, at, firing = [], -1, False
    while True:
        cands = clears if firing else fires
        k = np.searchsorted(cands, at, side="right")
        if k == len(cands):
            return out
        at = int(cands[k])
        out.append(at)
        firing = not firing


def transitions(ts: pd.DataFrame, thresholds: dict[str, float], replica: str) -> list[dict]:
    """Fire/clear events of every enabled rule (threshold > 0) over one window table."""
    rows = []
    fire_after = int(thresholds.get("fire_after", 1))
    clear_after = int(thresholds.get("clear_after", 1))
    for rule, (column, breaks, key, also) in RULES.items():
        threshold = thresholds.get(key, 0.0)
        if threshold <= 0 or column not in ts:
            continue
        values = ts[column].to_numpy(dtype=float)
        valid = ~np.isnan(values)
        bad = np.asarray(breaks(values, threshold), dtype=bool)
        if also is not None:
            bad &= also(ts)
        ends, values, bad = ts["window_end_s"].to_numpy()[valid], values[valid], bad[valid]
        for k, i in enumerate(switches(bad, fire_after, clear_after)):
            rows.append({"time_s": ends[i], "rule": rule,
                         "event": "clear" if k % 2 else "fire", "value": values[i],
                         "threshold": threshold, "replica": replica})
    return rows


def trailing_pct(times: np.ndarray, values: np.ndarray, edges: np.ndarray, q: float,
                 least: int) -> np.ndarray:
    """Per window with a completion: the q-th percentile (linear) of ``values`` over the
    requests finishing in it, plus the latest earlier ones when fewer than ``least``
    finished (then exactly the latest ``least``, or all there are).

    Notes
    -----
    Vectorized: windows with at least ``least`` completions are disjoint groups (one
    grouped quantile); the others each take a fixed-length slice ending at the window's
    end (one ``percentile`` along the rows of a windows x ``least`` matrix). No loop over
    windows (a long run with many replicas has them by the hundred thousand), but over the
    few before the first ``least`` completions.
    """
    ok = ~(np.isnan(times) | np.isnan(values))
    order = np.argsort(times[ok], kind="stable")
    t, v = times[ok][order], values[ok][order]
    hi = np.searchsorted(t, edges[1:], side="left")  # finished before the window's end
    first = np.searchsorted(t, edges[:-1], side="left")
    count = hi - first
    out = np.full(len(edges) - 1, np.nan)
    big = count >= least
    if big.any():
        w = np.searchsorted(edges, t, side="right") - 1  # each completion's window
        keep = (w >= 0) & (w < len(out)) & big[np.clip(w, 0, len(out) - 1)]
        got = pd.Series(v[keep]).groupby(w[keep]).quantile(q / 100)
        out[got.index.to_numpy()] = got.to_numpy()
    small = (count > 0) & ~big
    full = np.flatnonzero(small & (hi >= least))  # the latest `least` completions
    if len(full):
        idx = hi[full, None] - least + np.arange(least)[None, :]
        out[full] = np.percentile(v[idx], q, axis=1)
    for j in np.flatnonzero(small & (hi < least)):  # before the first `least` completions:
        out[j] = np.percentile(v[:hi[j]], q)  # at most `least` such windows
    return out


def _latency_rules(ts: pd.DataFrame, requests: pd.DataFrame, edges: np.ndarray,
                   least: int) -> pd.DataFrame:
    """``ts`` with the p99 columns the latency rules read, topped up to ``least``."""
    fin = requests["finish_s"].where(requests["status"] == "completed").to_numpy(float)
    ts = ts.copy()
    for col in ("ttft", "e2e"):
        ts[f"{col}_p99_s"] = trailing_pct(fin, requests[f"{col}_s"].to_numpy(float),
                                          edges[:len(ts) + 1], 99, least)
    return ts


def _whole(r: int, g: pd.DataFrame, requests: pd.DataFrame, steps: pd.DataFrame | None,
           cluster_ts: pd.DataFrame, edges: np.ndarray) -> bool:
    """Whether replica ``r`` (its requests ``g``) served every request, none of them
    rerouted (requeued after a failure, which only the cluster's table counts), and ran every
    step, over the cluster table's windows: its rule columns are then the cluster's, the
    same functions of the same rows."""
    return (len(g) == len(requests) and not requests["retries"].to_numpy().any()
            and len(cluster_ts) == len(edges) - 1
            and np.array_equal(cluster_ts["window_end_s"].to_numpy(), edges[1:])
            and (steps is None or steps.empty or bool((steps["replica"].to_numpy() == r).all())))


def alerts(requests: pd.DataFrame, steps: pd.DataFrame | None, cluster_ts: pd.DataFrame,
           thresholds: dict[str, float], *, window_s: float, budget: int,
           max_num_seqs: int, stream_blocks: int) -> pd.DataFrame:
    """Every alert event of the run, cluster-wide and per replica, ordered by time.

    ``budget``, ``max_num_seqs`` and ``stream_blocks`` (KV blocks per micro-batch stream)
    are the limits the batch fill is measured against (:func:`~simulator.metrics.
    timeseries.step_fill`).
    """
    least = int(thresholds.get("min_completions", 1))
    edges = window_edges(float(cluster_ts["window_end_s"].iloc[-1]), window_s)
    cluster = _latency_rules(cluster_ts, requests, edges, least)
    rows = transitions(cluster, thresholds, "all")
    for r, g in requests[requests["replica"] >= 0].groupby("replica"):
        if _whole(r, g, requests, steps, cluster_ts, edges):
            rows += transitions(cluster, thresholds, str(r))
            continue
        ts = _latency_rules(request_windows(g, edges), g, edges, least)
        if steps is not None and not steps.empty:
            eff = step_windows(steps[steps["replica"] == r], edges, budget, {},
                               max_num_seqs=max_num_seqs, stream_blocks=stream_blocks)
            ts["batch_efficiency"] = eff["batch_efficiency"].to_numpy()
        rows += transitions(ts, thresholds, str(r))
    df = pd.DataFrame(rows, columns=ALERT_COLUMNS)
    return df.sort_values(["time_s", "replica", "rule"], kind="stable", ignore_index=True)
