"""Fit the MoE expert, MLA and DeepEP all-to-all parameters to measured rows.

Same method as :mod:`fit` (robust ``soft_l1`` least squares on log-time residuals inside
physical bounds, discrete choices tried in turn on a probe subsample). :func:`fit` runs
:func:`simulator.calibration.fit.fit` for the dense families (unchanged, bit for bit) and
then these families on the same GPU.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from simulator.calibration import check, moe_check
from simulator.calibration import fit as dense
from simulator.calibration.fit import NS, US, _score, _solve
from simulator.calibration.params import (
    AllToAllParams,
    Calibration,
    MLAParams,
    MoEParams,
    with_family,
)
from simulator.hardware.specs import GPUSpec

MOE_FREE = [("launch_s", 0, 500, US), ("expert_sm_s", 0, 500, US), ("local_sm_s", 0, 100, US),
            ("row_sm_s", 0, 20, US), ("foreign_fill", 0, 1, 1),
            ("compute_eff", 0.02, 1, 1), ("bandwidth_eff", 0.02, 1, 1), ("overlap", 1, 30, 1)]
MLA_FREE = [("floor_s", 0, 500, US), ("seq_sm_s", 0, 5000, US), ("token_head_sm_s", 0, 1000, NS),
            ("compute_eff", 0.02, 1, 1), ("bandwidth_eff", 0.02, 1, 1), ("overlap", 1, 30, 1)]
A2A_FREE = [("launch_s", 0, 1000, US), ("token_sm_s", 0, 100, US), ("link_eff", 0.02, 1, 1)]
MOE_START = MoEParams(launch_s=30 * US, expert_sm_s=5 * US, local_sm_s=0.5 * US,
                      row_sm_s=0.1 * US, foreign_fill=0.3,
                      compute_eff=0.6, bandwidth_eff=0.6, overlap=2.0)
MLA_START = MLAParams(floor_s=40 * US, seq_sm_s=5 * US, token_head_sm_s=10 * NS,
                      compute_eff=0.6, bandwidth_eff=0.7, overlap=2.0)
A2A_START = AllToAllParams(launch_s=50 * US, token_sm_s=1 * US, link_eff=0.5)
#: Rows used to choose the grouped GEMM tile (the winner is then fitted on all rows).
PROBE_ROWS = 3000
TILES_N = (64, 128)


def fit_moe(gpu: GPUSpec, df: pd.DataFrame) -> dict[str, MoEParams]:
    """Expert-compute parameters per dtype / kernel key; tiles chosen on a probe."""
    inp = moe_check.moe_inputs(df)
    y_all = df["latency_us"].to_numpy() * US
    out = {}
    for key in sorted(inp["key"].unique()):
        rows = (inp["key"] == key).to_numpy()
        sub, sin, y = df[rows], inp[rows], y_all[rows]
        idx = np.random.default_rng(0).permutation(len(sub))[:PROBE_ROWS]

        def predictor(d, i):
            return lambda q: moe_check.predict_moe_rows(gpu, d, i, q)

        best = None
        for tm in moe_check.TILES_M:
            for tn in TILES_N:
                p0 = replace(MOE_START, tile_m=tm, tile_n=tn)
                p, err = _solve(p0, MOE_FREE, predictor(sub.iloc[idx], sin.iloc[idx]), y[idx])
                if best is None or _score(err) < best[0]:
                    best = (_score(err), p)
        out[key], _ = _solve(best[1], MOE_FREE, predictor(sub, sin), y)
    return out


def fit_mla(gpu: GPUSpec, data: dict[str, pd.DataFrame], cal: Calibration) -> Calibration:
    """Absorbed-path parameters on the decode rows and the short prefill rows, then the
    prefill path's on the long prefill rows, per KV dtype."""
    cal = moe_check.with_mla_rule(cal)
    ctx, gen = data.get("mla_context"), data.get("mla_generation")
    for kv in ("bf16", "fp8"):
        parts = []
        if gen is not None:
            parts.append(("mla_generation", gen[gen["kv_cache_dtype"].map(moe_check.KV) == kv]))
        if ctx is not None:
            q = ctx["q_len"] <= moe_check.ABSORBED_MAX_Q[kv]
            parts.append(("mla_context", ctx[(ctx["kv_cache_dtype"].map(moe_check.KV) == kv)
                                             & q]))
        parts = [(f, d) for f, d in parts if len(d)]
        if parts:
            cal = _fit_mla_path(gpu, cal, "mla_decode", kv, parts)
        if ctx is not None:
            long = ctx[(ctx["kv_cache_dtype"].map(moe_check.KV) == kv)
                       & (ctx["q_len"] > moe_check.ABSORBED_MAX_Q[kv])]
            if len(long):
                cal = _fit_mla_path(gpu, cal, "mla_prefill", kv, [("mla_context", long)])
    return cal


def _fit_mla_path(gpu, cal, section, kv, parts):
    y = np.concatenate([d["latency_us"].to_numpy() for _, d in parts]) * US
    path = "decode" if section == "mla_decode" else "prefill"
    p0 = cal.mla_for(path, kv)
    if p0 == MLAParams() or (path == "prefill" and p0 == replace(
            MLAParams(), absorbed_max_q_len=p0.absorbed_max_q_len, block_q=p0.block_q)):
        p0 = replace(MLA_START, absorbed_max_q_len=p0.absorbed_max_q_len, block_q=p0.block_q,
                     serial_eff=0.5 if p0.block_q else 1.0)

    def predict(q):
        g = replace(gpu, calibration=with_family(cal, section, kv, q))
        return np.concatenate([moe_check.predict_mla(g, d, f) for f, d in parts])

    free = MLA_FREE + ([("serial_eff", 0.02, 1, 1)] if p0.block_q else [])
    p, _ = _solve(p0, free, predict, y)
    return with_family(cal, section, kv, p)


def fit_alltoall(gpu: GPUSpec, df: pd.DataFrame, link_Bps: float) -> dict[str, AllToAllParams]:
    """Latency, per-token cost and link fraction per DeepEP mode and phase."""
    out = {}
    for (mode, phase), sub in df.groupby(["mode", "phase"]):
        key = f"{moe_check.A2A_DATA_MODES[mode]}_{phase}"
        y = sub["latency_us"].to_numpy() * US

        def predict(q, sub=sub, key=key):
            cal = with_family(gpu.calibration, "alltoall", key, q)
            return moe_check.predict_alltoall(replace(gpu, calibration=cal), sub, link_Bps)

        out[key], _ = _solve(A2A_START, A2A_FREE, predict, y)
    return out


def fit_moe_families(gpu: GPUSpec, data: dict[str, pd.DataFrame]) -> Calibration:
    """``gpu.calibration`` with the MoE, MLA and all-to-all families present in ``data``
    refitted (the others untouched)."""
    cal = gpu.calibration
    if "moe" in data:
        for key, p in fit_moe(gpu, data["moe"]).items():
            cal = with_family(cal, "moe", key, p)
    if {"mla_context", "mla_generation"} & set(data):
        cal = fit_mla(replace(gpu, calibration=cal), data, cal)
    if "alltoall" in data:
        link = check.scale_up_for(gpu)
        for key, p in fit_alltoall(replace(gpu, calibration=cal), data["alltoall"],
                                   link.bandwidth_Bps).items():
            cal = with_family(cal, "alltoall", key, p)
    return cal


def fit(gpu: GPUSpec, data: dict[str, pd.DataFrame], source: str = "") -> Calibration:
    """Every family in ``data``: the dense ones by :func:`fit.fit`, then the MoE ones."""
    cal = dense.fit(gpu, data, source)
    return fit_moe_families(replace(gpu, calibration=cal), data)
