"""Read NVIDIA AIConfigurator's kernel database for one (GPU, engine) into the check's tables.

The database (``../shared/calibration/aic/``, Apache-2.0, its README gives units and
columns) keeps ``<system>/<family>/<backend>/<version>/<table>.parquet``. :func:`load`
turns the tables of one system and one engine into the family DataFrames of
:mod:`check` (the columns of ``simulator/calibration/data/h100_sxm/*.csv``): latencies from
milliseconds to microseconds, communication sizes from element counts to bytes, the
generation tables' ``step`` to the cached length the forms read. NCCL rows are the same
for every engine (nccl-tests); each engine has its own GEMM, attention, custom
all-reduce, MoE and MLA module tables.

Where a table exists in several version folders (TensorRT-LLM's MoE: the newest folder
holds only DeepSeek-V4 shapes and declares the rest re-used from the one before), the
rows of every folder are kept, newest first, one row per shape. :func:`halves` splits
every table in two by a hash of each row's shape: the shipped fits see half 0 only, and
``benchmarks/validation/kernel_bias.py`` checks them on half 1.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.errors import ScenarioError
from simulator.paths import ROOT

ENGINES = ("vllm", "sglang", "trtllm")
#: Simulator GPU preset -> AIConfigurator system folder.
SYSTEMS = {"h100_sxm": "h100_sxm", "b200": "b200_sxm", "gb200": "gb200"}
#: GPUs of one node of each system (its ``systems/<system>.yaml`` ``num_gpus_per_node``):
#: the EP size of SGLang's one-node DeepEP rows (``node_num`` 1).
NODE_GPUS = {"h100_sxm": 8, "b200_sxm": 8, "gb200": 4}
#: SGLang's DeepEP tables (``comm/sglang``) and the check's mode names.
DEEPEP = {"wideep_deepep_ll_perf": "deepep_ll", "wideep_deepep_normal_perf": "deepep_ht"}
MS_TO_US = 1e3
#: Bytes per element of the communication tables' ``message_size``.
COMM_BYTES = {"half": 2, "bfloat16": 2, "float16": 2, "int8": 1}
#: Columns that identify a measurement (the rest are its result and provenance).
PROVENANCE = ("framework", "version", "device", "kernel_source", "latency", "backend",
              "implementation", "combine_avg_t_us", "combine_bandwidth_gbps",
              "dispatch_avg_t_us", "dispatch_bandwidth_gbps")

#: family -> (database family folder, table, backend: the engine's or a fixed one).
TABLES = {
    "gemm": ("gemm", "gemm_perf", None),
    "attention_context": ("attention", "context_attention_perf", None),
    "attention_generation": ("attention", "generation_attention_perf", None),
    "nccl": ("comm", "nccl_perf", "nccl"),
    "vllm_custom_allreduce": ("comm", "custom_allreduce_perf", None),
    "moe": ("moe", "moe_perf", None),
    "mla_context": ("mla", "mla_context_module_perf", None),
    "mla_generation": ("mla", "mla_generation_module_perf", None),
}


def default_root() -> Path:
    """``<repo>/../shared/calibration/aic``: where a clean clone finds the shared data."""
    return ROOT.parent / "shared" / "calibration" / "aic"


def _version(name: str) -> tuple:
    """Sort key of a version folder: its numbers in order (``1.3.0rc20`` -> 1, 3, 0, 20)."""
    return tuple(int(x) for x in re.findall(r"\d+", name))


def read_table(root: Path, system: str, folder: str, backend: str, table: str,
               by_kernel: bool = False):
    """Every version of one table, one row per shape; None when absent.

    A shape measured in several version folders keeps the newest folder's row; a shape
    timed with several alternative kernels in one folder (TensorRT-LLM's MoE: its
    min-latency and CUTLASS paths) keeps the fastest, the one a tuned engine runs.
    ``by_kernel`` keeps one row per kernel instead (custom all-reduce: CUDA-graph and
    eager launches are both measured on purpose).
    """
    base = root / system / folder / backend
    if not base.is_dir():
        return None
    versions = sorted(base.iterdir(), key=lambda d: _version(d.name), reverse=True)
    parts = [pd.read_parquet(p).assign(_rank=rank) for rank, v in enumerate(versions)
             if (p := v / f"{table}.parquet").exists()]
    if not parts:
        return None
    df = pd.concat(parts, ignore_index=True)
    df = df.sort_values(["_rank", *(["latency"] if "latency" in df else [])], kind="stable")
    key = [c for c in df.columns if c not in PROVENANCE and c != "_rank"]
    if by_kernel:
        key.append("kernel_source")
    df = df.drop_duplicates(subset=key, keep="first").drop(columns="_rank")
    return df.sort_index().reset_index(drop=True)


def _convert(family: str, df: pd.DataFrame) -> pd.DataFrame:
    """One database table in the check's columns (units: us, bytes)."""
    out = df.copy()
    out["latency_us"] = out["latency"].astype(float) * MS_TO_US
    if family == "gemm":
        out["dtype"] = out["gemm_dtype"]
    elif family == "attention_context":
        out["q_len"] = out["isl"]
    elif family == "attention_generation":
        out["kv_len"] = out["step"]  # tokens already cached
    elif family == "nccl":
        out["dtype"] = out["nccl_dtype"]
        out["message_bytes"] = out["message_size"] * out["nccl_dtype"].map(COMM_BYTES)
    elif family == "vllm_custom_allreduce":
        out["message_bytes"] = out["message_size"] * out["allreduce_dtype"].map(COMM_BYTES)
        out["kernel_source"] = out["kernel_source"].astype(str)
    elif family.startswith("mla"):
        out["gemm_dtype"] = out["gemm_type"]
        if family == "mla_context":
            out["q_len"] = out["isl"]
        else:
            out["seq_len"] = out["step"]  # the sequence with the new token
    if family in ("attention_context", "attention_generation"):
        out = out[out["attn_dtype"].astype(str) == "bfloat16"]
    return out.reset_index(drop=True)


def load(root: str | Path, gpu: str, engine: str) -> dict[str, pd.DataFrame]:
    """The check's family tables of one GPU preset and engine from the database at
    ``root``; an error naming what is missing."""
    root = Path(root)
    if engine not in ENGINES:
        raise ScenarioError(f"--engine: unknown engine {engine!r} (allowed: "
                            f"{', '.join(ENGINES)})")
    if gpu not in SYSTEMS:
        raise ScenarioError(f"--gpu: {gpu!r} has no AIConfigurator tables (the database "
                            f"holds: {', '.join(SYSTEMS)})")
    if not (root / SYSTEMS[gpu]).is_dir():
        raise ScenarioError(f"--data: {str(root / SYSTEMS[gpu])!r} not found (expected "
                            f"AIConfigurator's <system>/<family>/<backend>/<version>/ tree)")
    data = {}
    for family, (folder, table, backend) in TABLES.items():
        df = read_table(root, SYSTEMS[gpu], folder, backend or engine, table,
                        by_kernel=family == "vllm_custom_allreduce")
        if df is not None and len(df):
            data[family] = _convert(family, df)
    if engine == "sglang":
        a2a = _deepep(root, SYSTEMS[gpu])
        if a2a is not None:
            data["alltoall"] = a2a
    if not data:
        raise ScenarioError(f"--data: no tables of {engine} for {gpu} under {str(root)!r}")
    return data


def _deepep(root: Path, system: str) -> pd.DataFrame | None:
    """SGLang's DeepEP dispatch and combine rows in ``alltoall.csv``'s columns, in
    microseconds as measured, EP = the GPUs of one node. Normal-mode time is transmit plus
    notify; of its rows per shape at several SM budgets the fastest is kept (the tuned
    setting)."""
    parts = []
    shape = ["mode", "phase", "ep_size", "hidden_size", "topk", "num_experts",
             "num_tokens_per_rank"]
    for table, mode in DEEPEP.items():
        df = read_table(root, system, "comm", "sglang", table)
        if df is None:
            continue
        for phase in ("dispatch", "combine"):
            if f"{phase}_avg_t_us" in df:
                us = df[f"{phase}_avg_t_us"].astype(float)
            else:
                us = df[f"{phase}_transmit_us"] + df[f"{phase}_notify_us"]
            parts.append(pd.DataFrame({
                "mode": mode, "phase": phase, "ep_size": df["node_num"] * NODE_GPUS[system],
                "hidden_size": df["hidden_size"], "topk": df["num_topk"],
                "num_experts": df["num_experts"], "num_tokens_per_rank": df["num_token"],
                "latency_us": us.astype(float)}))
    if not parts:
        return None
    out = pd.concat(parts, ignore_index=True)
    return out.loc[out.groupby(shape, sort=False)["latency_us"].idxmin()].reset_index(drop=True)


def halves(df: pd.DataFrame) -> np.ndarray:
    """0 or 1 per row, by a hash of the row's shape columns (stable across runs)."""
    key = [c for c in df.columns if c not in (*PROVENANCE, "latency_us")]
    return (pd.util.hash_pandas_object(df[key], index=False).to_numpy() % 2).astype(int)


def half(data: dict[str, pd.DataFrame], which: int) -> dict[str, pd.DataFrame]:
    """Every table's rows of one half (:func:`halves`)."""
    out = {}
    for family, df in data.items():
        part = df[halves(df) == which].reset_index(drop=True)
        if len(part):
            out[family] = part
    return out


#: Rows a fit uses per family and kernel variant (a seeded sample of half 0): enough to
#: pin a handful of parameters per form, few enough to fit nine (GPU, engine) pairs on a
#: laptop. Variant columns: one sample per GEMM dtype, MoE dtype, attention KV dtype.
FIT_ROWS = 1000
VARIANT = {"gemm": "dtype", "moe": "moe_dtype", "attention_context": "kv_cache_dtype",
           "attention_generation": "kv_cache_dtype", "mla_context": "kv_cache_dtype",
           "mla_generation": "kv_cache_dtype"}


def sample(data: dict[str, pd.DataFrame], rows: int = FIT_ROWS,
           seed: int = 0) -> dict[str, pd.DataFrame]:
    """At most ``rows`` rows per family and variant (:data:`VARIANT`), drawn with ``seed``."""
    out = {}
    for family, df in data.items():
        col = VARIANT.get(family)
        groups = [g for _, g in df.groupby(col, sort=True)] if col else [df]
        out[family] = pd.concat([g.sample(min(len(g), rows), random_state=seed)
                                 for g in groups]).sort_index().reset_index(drop=True)
    return out
