"""Summary metrics of a run with pools: pure functions of the request and pool tables.

Definitions (docs/metrics.md, "Pools"): a pool's utilization is the busy time of its
replicas (some stage computing or communicating) over replicas x span; transfer times and
decode-admission waits are percentiles over the requests whose KV moved; goodput per GPU
divides the goodput by every GPU of every pool; the cost of a million output tokens is
``sum(gpus x gpu_hour_usd) x span / 3600 / (output tokens / 1e6)``, NaN unless every pool
has a price.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: summary.json keys of a run with pools (sweeps over a pools scenario add them as columns,
#: tables as JSON cells, then one ``pool_utilization_<pool>`` column per pool).
POOL_SUMMARY_KEYS = [
    "pool_utilization", "pool_gpus", "kv_transfers", "kv_transfer_mean_s",
    "kv_transfer_p50_s", "kv_transfer_p99_s", "kv_bytes_moved", "decode_wait_mean_s",
    "decode_wait_p99_s", "goodput_req_per_s_per_gpu", "cost_per_million_tokens_usd",
]


def pool_columns(names: list[str]) -> list[str]:
    """Flat per-pool columns of a sweep over pools named ``names``."""
    return [f"pool_utilization_{n}" for n in names]


def flat_pool_metrics(summary: dict) -> dict:
    """``pool_utilization_<pool>`` of a summary with pools (empty without)."""
    return {f"pool_utilization_{k}": v
            for k, v in (summary.get("pool_utilization") or {}).items()}


def _pct(x: pd.Series, p: float) -> float:
    v = x.dropna().to_numpy(dtype=float)
    return float(np.percentile(v, p)) if len(v) else float("nan")


def pool_summary(requests: pd.DataFrame, pools: pd.DataFrame, summary: dict) -> dict:
    """Pool metrics to add to a run's summary.

    Parameters
    ----------
    requests : DataFrame
        requests.csv with the pool columns (``kv_transfer_s``, ``decode_wait_s``,
        ``kv_bytes``).
    pools : DataFrame
        One row per pool: ``pool``, ``role``, ``gpus``, ``replicas``, ``gpu_hour_usd``
        (None or NaN: no price), ``busy_s``.
    summary : dict
        The run's summary so far (``simulated_time_s``, ``goodput_req_per_s``, ...).
    """
    done = requests[requests["status"] == "completed"]
    span = float(done["finish_s"].max() - requests["arrival_s"].min()) if len(done) else 0.0
    out: dict = {}
    util = {}
    for row in pools.itertuples(index=False):
        util[row.pool] = row.busy_s / (row.replicas * span) if span > 0 else float("nan")
    out["pool_utilization"] = util
    out["pool_gpus"] = {r.pool: int(r.gpus) for r in pools.itertuples(index=False)}
    moved = done["kv_transfer_s"].dropna()
    out["kv_transfers"] = int(len(moved))
    out["kv_transfer_mean_s"] = float(moved.mean()) if len(moved) else float("nan")
    out["kv_transfer_p50_s"] = _pct(moved, 50)
    out["kv_transfer_p99_s"] = _pct(moved, 99)
    out["kv_bytes_moved"] = float(requests["kv_bytes"].sum())
    out["decode_wait_mean_s"] = float(done["decode_wait_s"].mean()) if len(moved) else float(
        "nan")
    out["decode_wait_p99_s"] = _pct(done["decode_wait_s"], 99)
    gpus = int(pools["gpus"].sum())
    out["goodput_req_per_s_per_gpu"] = summary["goodput_req_per_s"] / gpus
    price = pd.to_numeric(pools["gpu_hour_usd"], errors="coerce")
    tokens = float(done["output_tokens"].sum())
    if price.notna().all() and tokens > 0 and span > 0:
        usd = float((price * pools["gpus"]).sum()) * span / 3600.0
        out["cost_per_million_tokens_usd"] = usd / (tokens / 1e6)
    else:
        out["cost_per_million_tokens_usd"] = float("nan")
    return out
