"""Alert rules over windowed metrics: every firing and clearing, as an operator sees them.

A rule compares one window column with a threshold; it fires at the end of the first window
that breaks it and clears at the end of the first window that no longer does. Windows with
no value (no request finished, no step ran) leave the state as it was. Rules run on the
whole cluster (``replica = "all"``) and on each replica.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from simulator.metrics.timeseries import request_windows, step_windows, window_edges

#: rule name -> (window column, breaks the rule?, scenario key of its threshold)
RULES: dict[str, tuple[str, Callable[[float, float], bool], str]] = {
    "ttft_p99_above": ("ttft_p99_s", lambda v, t: v > t, "ttft_p99_s"),
    "e2e_p99_above": ("e2e_p99_s", lambda v, t: v > t, "e2e_p99_s"),
    "batch_efficiency_below": ("batch_efficiency", lambda v, t: v < t, "batch_efficiency_min"),
}
ALERT_COLUMNS = ["time_s", "rule", "event", "value", "threshold", "replica"]


def transitions(ts: pd.DataFrame, thresholds: dict[str, float], replica: str) -> list[dict]:
    """Fire/clear events of every enabled rule (threshold > 0) over one window table."""
    rows = []
    for rule, (column, breaks, key) in RULES.items():
        threshold = thresholds.get(key, 0.0)
        if threshold <= 0 or column not in ts:
            continue
        values = ts[column].to_numpy(dtype=float)
        valid = ~np.isnan(values)
        ends, values = ts["window_end_s"].to_numpy()[valid], values[valid]
        bad = np.asarray(breaks(values, threshold), dtype=bool)
        # The state starts clear; an event wherever a window's verdict differs from the last.
        for i in np.flatnonzero(bad != np.concatenate(([False], bad[:-1]))):
            rows.append({"time_s": ends[i], "rule": rule,
                         "event": "fire" if bad[i] else "clear", "value": values[i],
                         "threshold": threshold, "replica": replica})
    return rows


def alerts(requests: pd.DataFrame, steps: pd.DataFrame | None, cluster_ts: pd.DataFrame,
           thresholds: dict[str, float], *, window_s: float, budget: int) -> pd.DataFrame:
    """Every alert event of the run, cluster-wide and per replica, ordered by time."""
    rows = transitions(cluster_ts, thresholds, "all")
    edges = window_edges(float(cluster_ts["window_end_s"].iloc[-1]), window_s)
    for r, g in requests[requests["replica"] >= 0].groupby("replica"):
        ts = request_windows(g, edges)
        if steps is not None and not steps.empty:
            eff = step_windows(steps[steps["replica"] == r], edges, budget, {})
            ts["batch_efficiency"] = eff["batch_efficiency"].to_numpy()
        rows += transitions(ts, thresholds, str(r))
    df = pd.DataFrame(rows, columns=ALERT_COLUMNS)
    return df.sort_values(["time_s", "replica", "rule"], kind="stable", ignore_index=True)
