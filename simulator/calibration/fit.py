"""Fit a GPU's kernel and collective parameters to measured timings, robustly.

Each family's few parameters minimise a robust loss (``soft_l1``: linear beyond ~10%, so
isolated outliers pull little) of the log-time residuals ``log(predicted / measured)``,
with :func:`scipy.optimize.least_squares` inside physical bounds (every efficiency in
(0, 1], every latency >= 0). Discrete choices (GEMM tile size, whether the library splits
K) are tried in turn on a subsample. The predictions are the ones :mod:`check` and the
simulator use.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simulator.calibration import check, forms
from simulator.calibration.params import (
    Calibration,
    GemmParams,
    with_family,
)
from simulator.hardware.specs import GPUSpec

LOSS, F_SCALE = "soft_l1", 0.1
#: Rows used to choose the discrete GEMM options (the winner is then fitted on all rows).
PROBE_ROWS = 6000
US, NS = 1e-6, 1e-9

# (field, lower, upper, unit): x = value / unit, so every unknown is O(1) for the solver.
GEMM_FREE = [("launch_s", 0, 50, US), ("compute_eff", 0.02, 1, 1), ("bandwidth_eff", 0.02, 1, 1),
             ("overlap", 1, 30, 1)]
GEMM_SPLIT = [("split_k_s", 0, 100, US)]
GEMM_QUANT = [("quant_row_sm_s", 0, 10, US), ("quant_bandwidth_eff", 0.02, 1, 1)]
PREFILL_FREE = [("floor_s", 0, 100, US), ("seq_head_sm_s", 0, 100, US),
                ("token_head_sm_s", 0, 1, US), ("token_kv_head_sm_s", 0, 1, US),
                ("compute_eff", 0.02, 1, 1),
                ("exp_sm_s", 0, 1, NS), ("serial_eff", 0.02, 1, 1),
                ("bandwidth_eff", 0.02, 1, 1), ("overlap", 1, 30, 1)]
DECODE_FREE = [("floor_s", 0, 100, US), ("seq_sm_s", 0, 100, US),
               ("seq_head_sm_s", 0, 100, US), ("seq_head_dim_sm_s", 0, 1, US),
               ("bandwidth_eff", 0.02, 1, 1), ("exposed", 0, 1, 1)]
NCCL_FREE = [("ring_launch_s", 0, 100, US), ("ring_step_s", 0, 20, US), ("ring_eff", 0.02, 1, 1),
             ("tree_launch_s", 0, 100, US), ("tree_step_s", 0, 20, US), ("tree_eff", 0.02, 1, 1),
             ("nvls_launch_s", 0, 100, US), ("nvls_eff", 0.02, 1, 1)]
GATHER_FREE = [("gather_launch_s", 0, 100, US), ("gather_step_s", 0, 20, US),
               ("gather_eff", 0.02, 1, 1)]
ALLTOALL_FREE = [("alltoall_launch_s", 0, 100, US), ("alltoall_step_s", 0, 20, US),
                 ("alltoall_eff", 0.02, 1, 1)]
CUSTOM_FREE = [("custom_launch_s", 0, 100, US), ("custom_step_s", 0, 20, US),
               ("custom_eff", 0.02, 1, 1), ("custom_eager_s", 0, 100, US)]
#: Physical tile shapes of the attention kernels (FlashAttention 3): not fitted.
ATTN_BLOCK = 128


#: Starting points for parameters that are still unset (infinite) before a fit.
START = {"split_k_s": 3 * US, "overlap": 2.0, "exposed": 0.5, "tree_launch_s": 10 * US,
         "tree_step_s": 1 * US, "tree_eff": 0.5, "nvls_launch_s": 15 * US, "nvls_eff": 0.5,
         "custom_launch_s": 3 * US, "custom_eff": 0.5, "gather_launch_s": 5 * US,
         "gather_eff": 0.7, "alltoall_launch_s": 5 * US, "alltoall_eff": 0.7}


def _start(p, free):
    x0, lo, hi = [], [], []
    for name, a, b, unit in free:
        v = getattr(p, name)
        if not math.isfinite(v) or (name in START and getattr(type(p)(), name) == v):
            v = START.get(name, (a + 0.1 * (b - a)) * unit)  # unset: a typical value
        x0.append(min(max(v / unit, a), b))
        lo.append(a)
        hi.append(b)
    return np.array(x0, float), np.array(lo, float), np.array(hi, float)


def _solve(p, free, predict, measured_s):
    """Least-squares fit of the ``free`` fields of ``p``; returns (params, |error| %)."""
    x0, lo, hi = _start(p, free)
    x0 = np.clip(x0, lo + 1e-9 * (hi - lo), hi - 1e-9 * (hi - lo))
    log_y = np.log(measured_s)

    def build(x):
        return replace(p, **{f[0]: float(v) * f[3] for f, v in zip(free, x, strict=True)})

    def residual(x):
        r = np.log(np.maximum(predict(build(x)), 1e-15)) - log_y
        return np.where(np.isfinite(r), r, 10.0)

    res = least_squares(residual, x0, bounds=(lo, hi), loss=LOSS, f_scale=F_SCALE,
                        x_scale="jac", max_nfev=400)
    best = build(res.x)
    return best, np.abs(predict(best) / measured_s - 1) * 100


def _score(err: np.ndarray) -> float:
    return float(np.median(err) + np.percentile(err, 90) / 2)


def fit_gemm(gpu: GPUSpec, df: pd.DataFrame) -> dict[str, GemmParams]:
    """GEMM parameters per dtype: tiles and split-K chosen on a subsample, then fitted."""
    out = {}
    dtypes = check._dtype("gemm.csv", "dtype", df["dtype"])
    for dt in np.unique(dtypes):
        sub = df[dtypes == dt]
        args = check.gemm_args(gpu, dt)
        quant = args[-1]

        def predictor(rows, args=args):
            m, n, k = (rows[c].to_numpy(float) for c in ("m", "n", "k"))
            return lambda q: forms.gemm_time(m, n, k, q, *args)

        probe = sub.sample(min(len(sub), PROBE_ROWS), random_state=0)
        base = replace(gpu.calibration.gemm_for(dt), quant_bandwidth_eff=0.5 if quant else 0)
        best = None
        for tile in ((64, 64), (128, 128)):
            for split in (True, False):
                free = GEMM_FREE + (GEMM_SPLIT if split else []) + (GEMM_QUANT if quant else [])
                p0 = replace(base, tile_m=tile[0], tile_n=tile[1],
                             split_k_s=base.split_k_s if split else math.inf)
                p, err = _solve(p0, free, predictor(probe), probe["latency_us"] * US)
                if best is None or _score(err) < best[0]:
                    best = (_score(err), p, free)
        p, _ = _solve(best[1], best[2], predictor(sub), sub["latency_us"].to_numpy() * US)
        out[dt] = p
    return out


def fit_attention(gpu: GPUSpec, df: pd.DataFrame, family: str) -> dict:
    """Prefill or decode attention parameters per KV dtype."""
    out = {}
    cal = gpu.calibration
    for dt, rows, shape, agg in check.attention_inputs(gpu, df, family):
        y = df["latency_us"].to_numpy()[rows] * US
        if family == "attention_context":
            p0 = replace(cal.prefill_for(dt), block_k=ATTN_BLOCK, block_q=ATTN_BLOCK)
            p, _ = _solve(p0, PREFILL_FREE,
                          lambda q, s=shape, a=agg: forms.prefill_time(s, q, *a), y)
        else:
            p, _ = _solve(cal.decode_for(dt), DECODE_FREE,
                          lambda q, s=shape, a=agg: forms.decode_time(s, q, *a), y)
        out[dt] = p
    return out


#: Starting points of the NCCL fit: which algorithm carries small messages is a discrete
#: choice the local solver cannot make (the min over algorithms has flat regions).
NCCL_STARTS = ({}, {"ring_launch_s": 15 * US, "ring_step_s": 1 * US, "tree_launch_s": 2 * US,
                    "tree_step_s": 1 * US, "nvls_launch_s": 40 * US},
               {"tree_launch_s": 50 * US, "nvls_launch_s": 20 * US})


def fit_collectives(gpu: GPUSpec, data: dict[str, pd.DataFrame]):
    """Collective parameters: the NCCL all-reduce algorithms from the all_reduce rows of
    ``nccl.csv``, then the ring all-gather / reduce-scatter and the all-to-all from theirs
    (the in-switch algorithm fixed), and the custom all-reduce from
    ``vllm_custom_allreduce.csv``."""
    link = check.scale_up_for(gpu)
    p = gpu.calibration.collectives

    def predictor(rows, family):
        def predict(q):
            g = replace(gpu, calibration=replace(gpu.calibration, collectives=q))
            return check.predict_collective(g, rows, family, link)
        return predict

    nccl = data.get("nccl")
    for ops, free in ((("all_reduce",), NCCL_FREE), (("all_gather", "reduce_scatter"),
                      GATHER_FREE), (("alltoall",), ALLTOALL_FREE)):
        rows = nccl[nccl["op_name"].isin(ops)] if nccl is not None else nccl
        if rows is None or not len(rows):
            continue
        y = rows["latency_us"].to_numpy() * US
        starts = NCCL_STARTS if ops == ("all_reduce",) else ({},)
        fits = [_solve(replace(p, **start), free, predictor(rows, "nccl"), y)
                for start in starts]
        p = min(fits, key=lambda f: _score(f[1]))[0]
    if "vllm_custom_allreduce" in data:
        rows = data["vllm_custom_allreduce"]
        p, _ = _solve(p, CUSTOM_FREE, predictor(rows, "vllm_custom_allreduce"),
                      rows["latency_us"].to_numpy() * US)
    return p


def fit(gpu: GPUSpec, data: dict[str, pd.DataFrame], source: str = "") -> Calibration:
    """The GPU's calibration refitted on ``data`` (families absent from it are kept)."""
    cal = gpu.calibration
    if "gemm" in data:
        for dt, p in fit_gemm(gpu, data["gemm"]).items():
            cal = with_family(cal, "gemm", dt, p)
        # Streaming kernels: the shortest kernel and the bandwidth of the 16-bit GEMMs.
        g = cal.gemm_for("bf16")
        cal = with_family(cal, "elementwise", None, replace(
            cal.elementwise, launch_s=g.launch_s, bandwidth_eff=g.bandwidth_eff))
    for family, section in (("attention_context", "prefill_attention"),
                            ("attention_generation", "decode_attention")):
        if family in data:
            for dt, p in fit_attention(replace(gpu, calibration=cal), data[family],
                                       family).items():
                cal = with_family(cal, section, dt, p)
    if {"nccl", "vllm_custom_allreduce"} & set(data):
        cal = with_family(cal, "collectives", None,
                          fit_collectives(replace(gpu, calibration=cal), data))
    return replace(cal, source=source or cal.source)

