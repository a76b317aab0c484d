"""Summary metrics of a run with pools: pure functions of the request and pool tables.

Definitions (docs/metrics.md, "Pools"): a pool's utilization is the busy time of its
replicas (some stage computing or communicating) over replicas x span; transfer times and
decode-admission waits are percentiles over the requests whose KV moved; goodput per GPU
divides the goodput by every GPU of every pool; the cost of a million output tokens is
``sum(gpus x gpu_hour_usd) x span / 3600 / (output tokens / 1e6)``, NaN unless every pool
has a price. Power and energy per pool: :func:`pool_energy`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.hardware.specs import GPUSpec
from simulator.metrics.power import (
    energy_summary,
    gpu_power_w,
    pool_energy_summary,
    pool_power,
)
from simulator.metrics.utilization import StageHardware

#: summary.json keys of a run with pools (sweeps over a pools scenario add them as columns,
#: tables as JSON cells, then one ``pool_utilization_<pool>`` column per pool).
POOL_SUMMARY_KEYS = [
    "pool_utilization", "pool_gpus", "kv_transfers", "kv_transfer_mean_s",
    "kv_transfer_p50_s", "kv_transfer_p99_s", "kv_bytes_moved", "decode_wait_mean_s",
    "decode_wait_p99_s", "goodput_req_per_s_per_gpu", "cost_per_million_tokens_usd",
    "pool_energy_j", "pool_power_mean_w",  # pool_energy
]


def pool_columns(names: list[str]) -> list[str]:
    """Flat per-pool columns of a sweep over pools named ``names``."""
    return [f"pool_utilization_{n}" for n in names] + [f"pool_power_mean_w_{n}"
                                                        for n in names]


def flat_pool_metrics(summary: dict) -> dict:
    """``pool_utilization_<pool>`` and ``pool_power_mean_w_<pool>`` of a summary with
    pools (empty without)."""
    return {f"{key}_{k}": v for key in ("pool_utilization", "pool_power_mean_w")
            for k, v in (summary.get(key) or {}).items()}


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


def pool_energy(gpu_ts: pd.DataFrame, pools: list[tuple[str, list[StageHardware], GPUSpec]],
                node_of: dict[int, int], edges: np.ndarray, requests: pd.DataFrame
                ) -> tuple[pd.DataFrame, dict[str, np.ndarray], dict]:
    """Power and energy of a run with pools (docs/metrics.md, "Power, energy and cost").

    Parameters
    ----------
    gpu_ts : DataFrame
        Per GPU and window the utilizations of every pool's GPUs
        (:func:`simulator.metrics.utilization.gpu_windows`); empty when the run kept no
        step work (every energy key is then NaN).
    pools : list of (name, stage hardware, GPU spec)
        Per pool, in file order: its replicas' stages and its GPU (``idle_w``, ``tdp_w``).
    node_of : dict
        GPU index -> node of the joined graph (every GPU, used or not).
    edges : ndarray
        Window edges of the time series (s).
    requests : DataFrame
        requests.csv (completed requests and their output tokens).

    Returns
    -------
    (DataFrame, dict, dict)
        ``gpu_ts`` with ``power_w`` (when every pool's GPU has ``tdp_w`` and ``idle_w``)
        and ``pool``; the time-series columns ``power_w`` (cluster) and
        ``power_w_<pool>`` (W); the summary keys of
        :func:`simulator.metrics.power.energy_summary` and
        :func:`simulator.metrics.power.pool_energy_summary`.
    """
    names = [name for name, _, _ in pools]
    window_s = float(edges[1] - edges[0]) if len(edges) > 1 else 1.0
    nan_keys = {**energy_summary(np.zeros(0), window_s, requests),
                **pool_energy_summary({k: np.zeros(0) for k in names}, window_s)}
    if not len(gpu_ts):
        return pd.DataFrame(), {}, nan_keys
    of_gpu = {int(gpu.removeprefix("gpu")): k for k, (_, stages, _) in enumerate(pools)
              for st in stages for gpu in st.gpus}
    which = gpu_ts["gpu"].map(of_gpu).to_numpy()
    if any(g.tdp_w is None or g.idle_w is None for _, _, g in pools):
        return gpu_ts.assign(pool=np.array(names, dtype=object)[which]), {}, nan_keys
    idle_w = np.array([g.idle_w for _, _, g in pools], dtype=float)[which]
    tdp_w = np.array([g.tdp_w for _, _, g in pools], dtype=float)[which]
    gpu_ts = gpu_ts.assign(power_w=gpu_power_w(gpu_ts["compute_util"].to_numpy(float),
                                               gpu_ts["hbm_util"].to_numpy(float),
                                               idle_w, tdp_w),
                           pool=np.array(names, dtype=object)[which])
    idle = {node_of[int(gpu.removeprefix("gpu"))]: g.idle_w
            for _, stages, g in pools for st in stages for gpu in st.gpus}
    power = pool_power(gpu_ts, edges, names, node_of,
                       pd.Series(node_of).value_counts().to_dict(), idle)
    total = np.sum(list(power.values()), axis=0)
    return gpu_ts, {"power_w": total, **{f"power_w_{k}": v for k, v in power.items()}}, {
        **energy_summary(total, window_s, requests), **pool_energy_summary(power, window_s)}
