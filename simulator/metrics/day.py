"""What a day looks like window by window: SLO attainment per window and the worst window.

Pure functions of the request table. A request belongs to the window in which it arrived
(the load it was part of), and it meets the SLOs when it completed with TTFT <= the TTFT
SLO and TPOT <= the TPOT SLO (a one-token reply has no TPOT), as the run's overall
``slo_attainment``: a request rejected, dropped or failed is a miss, not left out.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def slo_met(requests: pd.DataFrame, ttft_slo_s: float, tpot_slo_s: float) -> np.ndarray:
    """Per request: whether it completed within both SLOs (bool array, the table's order)."""
    done = (requests["status"] == "completed").to_numpy()
    ttft = requests["ttft_s"].to_numpy(float)
    tpot = requests["tpot_s"].to_numpy(float)
    with np.errstate(invalid="ignore"):
        return done & (ttft <= ttft_slo_s) & (np.isnan(tpot) | (tpot <= tpot_slo_s))


def attainment_by_window(requests: pd.DataFrame, edges: np.ndarray, ttft_slo_s: float,
                         tpot_slo_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Arrivals and SLO attainment per window ``[edges[i], edges[i + 1])``.

    Returns
    -------
    (arrivals, attainment)
        Requests that arrived in each window, and the share of them that met the SLOs
        (NaN where none arrived). The last window also holds arrivals at its end.

    Notes
    -----
    ``attainment_i = #{arrived in window i and met the SLOs} / #{arrived in window i}``;
    summed over the windows with their arrivals as weights it is the run's
    ``slo_attainment``.
    """
    arr = requests["arrival_s"].to_numpy(float)
    met = slo_met(requests, ttft_slo_s, tpot_slo_s)
    n = np.histogram(arr, bins=edges)[0]
    ok = np.histogram(arr[met], bins=edges)[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        return n, np.where(n > 0, ok / np.maximum(n, 1), np.nan)


def worst_window(requests: pd.DataFrame, window_s: float, ttft_slo_s: float,
                 tpot_slo_s: float) -> dict:
    """The window of ``window_s`` seconds (from t = 0) with the lowest SLO attainment among
    those in which requests arrived: ``slo_attainment_worst_window``, its start
    ``slo_attainment_worst_window_start_s`` and the window ``slo_window_s``."""
    arr = requests["arrival_s"].to_numpy(float)
    out = {"slo_window_s": float(window_s), "slo_attainment_worst_window": math.nan,
           "slo_attainment_worst_window_start_s": math.nan}
    if not len(arr) or not np.isfinite(arr).any():
        return out
    end = float(np.nanmax(arr))
    edges = np.arange(int(end // window_s) + 2) * float(window_s)
    _, att = attainment_by_window(requests, edges, ttft_slo_s, tpot_slo_s)
    i = int(np.nanargmin(att))  # the earliest of equally bad windows
    out["slo_attainment_worst_window"] = float(att[i])
    out["slo_attainment_worst_window_start_s"] = float(edges[i])
    return out


def with_attainment(ts: pd.DataFrame, requests: pd.DataFrame, ttft_slo_s: float,
                    tpot_slo_s: float) -> pd.DataFrame:
    """The time series with ``slo_attainment`` per window (:func:`attainment_by_window` over
    its own windows)."""
    if ts.empty:
        return ts.assign(slo_attainment=np.array([], dtype=float))
    edges = np.append(ts["window_start_s"].to_numpy(float), float(ts["window_end_s"].iloc[-1]))
    return ts.assign(slo_attainment=attainment_by_window(requests, edges, ttft_slo_s,
                                                         tpot_slo_s)[1])


#: Summary keys of an autoscaled run (docs/autoscaling.md), the columns a sweep adds when
#: its runs autoscale.
AUTOSCALE_SUMMARY_KEYS = [
    "autoscale_policy", "autoscale_replica_capacity_per_s", "autoscale_replicas_mean",
    "autoscale_replicas_min", "autoscale_replicas_max", "autoscale_scale_ups",
    "autoscale_scale_downs", "autoscale_scale_ups_capped", "autoscale_capped_first_s",
    "autoscale_capped_wanted_max", "autoscale_cold_start_mean_s", "autoscale_gpu_hours",
    "autoscale_cost_usd", "slo_window_s", "slo_attainment_worst_window",
    "slo_attainment_worst_window_start_s", "autoscale_requests_in_cold_starts",
    "autoscale_cold_start_slo_attainment"]
#: Per-class summary keys of a run with a gateway (``class_<name>_<key>``), and its own.
GATEWAY_CLASS_KEYS = ["requests", "goodput_req_per_s", "slo_attainment", "shed", "expired"]
GATEWAY_SUMMARY_KEYS = ["fairness_jain"]


def in_spans(requests: pd.DataFrame, spans: list[tuple[float, float]], ttft_slo_s: float,
             tpot_slo_s: float) -> dict:
    """The requests that arrived while a replica cold-started (within one of ``spans``,
    ``[start, end)``: a scale-up decided and the replica not yet serving), and the share of
    them that met the SLOs: ``autoscale_requests_in_cold_starts`` and
    ``autoscale_cold_start_slo_attainment`` (NaN when none did)."""
    arr = requests["arrival_s"].to_numpy(float)
    inside = np.zeros(len(arr), dtype=bool)
    for start, end in spans:  # a run has tens to hundreds of cold starts
        inside |= (arr >= start) & (arr < end)
    n = int(inside.sum())
    met = int((slo_met(requests, ttft_slo_s, tpot_slo_s) & inside).sum())
    return {"autoscale_requests_in_cold_starts": n,
            "autoscale_cold_start_slo_attainment": met / n if n else math.nan}


def day_summary(requests: pd.DataFrame, window_s: float, cold_starts: list[tuple[float, float]],
                ttft_slo_s: float, tpot_slo_s: float) -> dict:
    """The day's summary keys beyond the autoscaler's own: :func:`worst_window` over
    windows of ``window_s`` and :func:`in_spans` of the ``cold_starts``."""
    return (worst_window(requests, window_s, ttft_slo_s, tpot_slo_s)
            | in_spans(requests, cold_starts, ttft_slo_s, tpot_slo_s))
