"""Predict measured kernel and collective timings with a GPU's model; report the errors.

A data folder holds any of ``gemm.csv``, ``attention_context.csv``,
``attention_generation.csv``, ``nccl.csv``, ``vllm_custom_allreduce.csv``, ``moe.csv``,
``mla_context.csv``, ``mla_generation.csv`` and ``alltoall.csv`` in the columns
of the H100 data in ``simulator/calibration/data/h100_sxm/``. Each row is priced with the
same forms the simulator's step cost uses (:mod:`simulator.calibration.forms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulator import files
from simulator.calibration import forms, moe_check
from simulator.calibration.params import (
    ACTIVATION_QUANTIZED,
    CSV_DTYPES,
    GEMM_BYTES,
    PEAK_DTYPE,
)
from simulator.errors import ScenarioError
from simulator.files import excerpt
from simulator.hardware.specs import GPUSpec, load_node
from simulator.model.spec import BYTES_PER_DTYPE
from simulator.paths import TOPOLOGIES, catalog

#: Required columns of each family's CSV (the file's stem).
COLUMNS = {
    "gemm": ("dtype", "m", "n", "k", "latency_us"),
    "attention_context": ("batch_size", "q_len", "num_heads", "num_key_value_heads",
                          "head_dim", "kv_cache_dtype", "window_size", "latency_us"),
    "attention_generation": ("batch_size", "kv_len", "num_heads", "num_key_value_heads",
                             "head_dim", "kv_cache_dtype", "window_size", "latency_us"),
    "nccl": ("op_name", "dtype", "num_gpus", "message_bytes", "latency_us"),
    "vllm_custom_allreduce": ("kernel_source", "num_gpus", "message_bytes", "latency_us"),
    **moe_check.COLUMNS,
}
FAMILIES = tuple(COLUMNS)
#: Numeric columns that may be 0 (no sliding window); every other one must be > 0, and a
#: collective's row needs at least two GPUs (one GPU moves nothing).
ZERO_ALLOWED = frozenset({"window_size"})
MIN_VALUE = {"num_gpus": 2}
#: Reductions the switch can do (NVLS): 16- and 32-bit floats.
SWITCH_DTYPES = {"half", "float16", "bfloat16", "float", "float32"}


@dataclass(frozen=True)
class ScaleUp:
    """What collectives need from the node: link bandwidth, GPU-to-GPU wire latency."""

    bandwidth_Bps: float
    latency_s: float
    in_switch: bool


def scale_up_for(gpu: GPUSpec) -> ScaleUp | None:
    """The scale-up fabric of the first node preset built from this GPU, if any."""
    for name in catalog(TOPOLOGIES, ".toml"):
        node = load_node(name)
        if node.gpu.name == gpu.name:
            link = node.scale_up
            # GPU -> switch -> GPU: two hops of the link latency.
            return ScaleUp(link.bandwidth_Bps, 2 * link.latency_s, link.in_switch_reduction)
    return None


def read_family(folder: str | Path, family: str) -> pd.DataFrame | None:
    """One family's CSV from ``folder``, checked; None when the file is absent."""
    path = Path(folder) / f"{family}.csv"
    if not path.exists() and not path.is_symlink():
        return None
    files.regular_file(path, "--data", files.MAX_DATA_BYTES)
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError):
        raise ScenarioError(f"{path}: cannot read as CSV (not a table of comma-separated "
                            f"values with a header row)") from None
    missing = [c for c in COLUMNS[family] if c not in df.columns]
    if missing:
        raise ScenarioError(f"{path}: missing column(s) {', '.join(missing)} "
                            f"(expected {', '.join(COLUMNS[family])})")
    if df.empty:
        raise ScenarioError(f"{path}: no rows")
    for col in COLUMNS[family]:
        if col in ("dtype", "kv_cache_dtype", "op_name", "kernel_source", *moe_check.TEXT):
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        x = values.to_numpy(dtype=float)
        low = MIN_VALUE.get(col, 0)
        bad = ~np.isfinite(x) | (x < low) | ((x == 0) & (col not in ZERO_ALLOWED))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            allowed = (f"a finite number >= {low}" if col in MIN_VALUE
                       else "a finite number >= 0" if col in ZERO_ALLOWED
                       else "a finite number > 0")
            raise ScenarioError(f"{path}: column {col} row {row + 2} is not a valid number "
                                f"({files.excerpt(df[col].iloc[row])}; allowed: {allowed})")
        df[col] = values
    return df


def _dtype(path: str, col: str, values) -> np.ndarray:
    out = pd.Series(values).map(CSV_DTYPES)
    if out.isna().any():
        bad = pd.Series(values)[out.isna()].iloc[0]
        raise ScenarioError(f"{path}: column {col} has unknown dtype {excerpt(bad)} "
                            f"(known: {', '.join(CSV_DTYPES)})")
    return out.to_numpy()


def gemm_args(gpu: GPUSpec, dt: str) -> tuple:
    """``(peak, bandwidth, SMs, weight bytes, input bytes, quantize)`` of a GEMM dtype on a
    GPU, the trailing arguments of :func:`forms.gemm_time`. FP4 needs FP4 tensor cores."""
    peak_dt = PEAK_DTYPE.get(dt, dt)
    if peak_dt == "fp4" and "fp4" not in gpu.peak_flops:
        raise ScenarioError(f"gemm.csv: dtype nvfp4 needs FP4 tensor cores; {gpu.name} has "
                            f"none (peak_flops: {', '.join(gpu.peak_flops)})")
    quant = dt in ACTIVATION_QUANTIZED
    w = GEMM_BYTES.get(dt) or BYTES_PER_DTYPE[dt]
    return (gpu.peak(peak_dt), gpu.hbm_bandwidth_Bps, gpu.sm_count, w,
            w if quant else forms.ACT_BYTES, quant)


def predict_gemm(gpu: GPUSpec, df: pd.DataFrame) -> np.ndarray:
    """Seconds of each GEMM row."""
    out = np.empty(len(df))
    dtypes = _dtype("gemm.csv", "dtype", df["dtype"])
    for dt in np.unique(dtypes):
        rows = dtypes == dt
        out[rows] = forms.gemm_time(
            df["m"].to_numpy()[rows], df["n"].to_numpy()[rows], df["k"].to_numpy()[rows],
            gpu.calibration.gemm_for(dt), *gemm_args(gpu, dt))
    return out


def causal_pairs(s, window):
    """(query, key) pairs of a causal prompt of ``s`` tokens; ``window`` > 0 limits keys."""
    s, w = np.asarray(s, dtype=float), np.asarray(window, dtype=float)
    full = s * (s + 1) / 2
    windowed = w * (w + 1) / 2 + (s - w) * w
    return np.where((w > 0) & (s > w), windowed, full)


def _shape(gpu: GPUSpec, df: pd.DataFrame, kv_bytes) -> forms.AttentionShape:
    return forms.AttentionShape(df["num_heads"].to_numpy(float),
                                df["num_key_value_heads"].to_numpy(float),
                                df["head_dim"].to_numpy(float), kv_bytes, gpu.peak("bf16"),
                                gpu.hbm_bandwidth_Bps, gpu.sm_count)


def attention_inputs(gpu: GPUSpec, df: pd.DataFrame, family: str):
    """Per kv dtype: (row mask, shape, aggregates) of the attention rows."""
    kv = _dtype(f"{family}.csv", "kv_cache_dtype", df["kv_cache_dtype"])
    b = df["batch_size"].to_numpy(float)
    w = df["window_size"].to_numpy(float)
    for dt in np.unique(kv):
        rows = kv == dt
        sub = df[rows]
        shape = _shape(gpu, sub, BYTES_PER_DTYPE[dt])
        if family == "attention_context":
            s = sub["q_len"].to_numpy(float)
            agg = (b[rows] * s, b[rows] * causal_pairs(s, w[rows]), 0.0, b[rows])
        else:
            kvl = sub["kv_len"].to_numpy(float)
            kvl = np.where(w[rows] > 0, np.minimum(kvl, w[rows]), kvl)
            # The new token's K/V is in the cache when the kernel runs: kv_len + 1 read.
            agg = (b[rows], b[rows] * (kvl + 1))
        yield dt, rows, shape, agg


def predict_attention(gpu: GPUSpec, df: pd.DataFrame, family: str) -> np.ndarray:
    out = np.empty(len(df))
    cal = gpu.calibration
    for dt, rows, shape, agg in attention_inputs(gpu, df, family):
        if family == "attention_context":
            out[rows] = forms.prefill_time(shape, cal.prefill_for(dt), *agg)
        else:
            out[rows] = forms.decode_time(shape, cal.decode_for(dt), *agg)
    return out


def predict_collective(gpu: GPUSpec, df: pd.DataFrame, family: str,
                       link: ScaleUp | None) -> np.ndarray:
    if link is None:
        raise ScenarioError(f"{family}.csv: no node preset in topologies/ uses GPU "
                            f"{excerpt(gpu.name)}; collectives need its NVLink bandwidth")
    p = gpu.calibration.collectives
    if family == "vllm_custom_allreduce":
        eager = df["kernel_source"].str.contains("eager").to_numpy()
        return forms.collective_time(p, "all_reduce", df["num_gpus"], df["message_bytes"],
                                     link.bandwidth_Bps, link.latency_s, link.in_switch,
                                     custom=True, eager=eager)
    out = np.empty(len(df))
    ops = df["op_name"].to_numpy()
    for op in np.unique(ops):
        if op not in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
            raise ScenarioError(f"nccl.csv: unknown op_name {excerpt(op)} (known: all_reduce, "
                                f"all_gather, reduce_scatter, alltoall)")
        rows = ops == op
        floats = df["dtype"].to_numpy()[rows].astype(str)
        switch = link.in_switch & (np.isin(floats, list(SWITCH_DTYPES)) | (op == "all_gather"))
        out[rows] = forms.collective_time(p, op, df["num_gpus"].to_numpy()[rows],
                                          df["message_bytes"].to_numpy()[rows],
                                          link.bandwidth_Bps, link.latency_s, switch)
    return out


def predict(gpu: GPUSpec, family: str, df: pd.DataFrame,
            link: ScaleUp | None = None) -> np.ndarray:
    """Predicted seconds of each row of one family."""
    if family == "gemm":
        return predict_gemm(gpu, df)
    if family.startswith("attention"):
        return predict_attention(gpu, df, family)
    try:
        if family == "moe":
            return moe_check.predict_moe(gpu, df)
        if family.startswith("mla"):
            return moe_check.predict_mla(gpu, df, family)
        if family == "alltoall":
            link = link or scale_up_for(gpu)
            if link is None:
                raise ValueError(f"no node preset in topologies/ uses GPU {excerpt(gpu.name)}; "
                                 f"the all-to-all needs its NVLink bandwidth")
            return moe_check.predict_alltoall(gpu, df, link.bandwidth_Bps)
    except ValueError as exc:
        raise ScenarioError(f"{family}.csv: {exc}") from None
    return predict_collective(gpu, df, family, link)


def load_data(folder: str | Path) -> dict[str, pd.DataFrame]:
    """Every family CSV present in ``folder``; an error when there is none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ScenarioError(f"--data: directory {str(folder)!r} not found")
    data = {f: df for f in FAMILIES if (df := read_family(folder, f)) is not None}
    if not data:
        raise ScenarioError(f"--data: {str(folder)!r} holds none of "
                            f"{', '.join(f + '.csv' for f in FAMILIES)}")
    return data


def check(gpu: GPUSpec, data: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The input rows of every family with ``family``, ``predicted_us`` and ``error_pct``
    (signed: (predicted - measured) / measured * 100) added."""
    link = scale_up_for(gpu) if {"nccl", "vllm_custom_allreduce"} & set(data) else None
    parts = []
    for family, df in data.items():
        pred = predict(gpu, family, df, link) * 1e6
        part = df.copy()
        part.insert(0, "family", family)
        part["predicted_us"] = pred
        part["error_pct"] = (pred - df["latency_us"].to_numpy()) / df["latency_us"] * 100
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def summarize(report: pd.DataFrame, by: str | list[str] = "family") -> pd.DataFrame:
    """Rows, median and 90th percentile of |error| % per group."""
    err = report["error_pct"].abs()
    g = err.groupby([report[c] for c in ([by] if isinstance(by, str) else by)], sort=False)
    return pd.DataFrame({"rows": g.size(), "median_abs_error_pct": g.median(),
                         "p90_abs_error_pct": g.quantile(0.9)})


def breakdown(report: pd.DataFrame) -> pd.DataFrame:
    """Errors per family and kernel variant: GEMM per dtype, attention per KV dtype,
    collectives per op (what docs/cost-model.md tabulates)."""
    key = pd.Series(report["family"], index=report.index, dtype=object)
    for col, fams in (("dtype", ("gemm",)), ("kv_cache_dtype", ("attention_context",
                                                                 "attention_generation")),
                      ("op_name", ("nccl",)), ("kernel_source", ("vllm_custom_allreduce",)),
                      ("moe_dtype", ("moe",)), ("kv_cache_dtype", ("mla_context",
                                                                  "mla_generation")),
                      ("mode", ("alltoall",))):
        if col in report:
            rows = report["family"].isin(fams)
            key[rows] = report["family"][rows] + " " + report[col][rows].astype(str)
    if "phase" in report:
        rows = report["family"] == "alltoall"
        key[rows] = key[rows] + " " + report["phase"][rows].astype(str)
    return summarize(report.assign(variant=key), "variant")
