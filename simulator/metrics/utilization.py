"""Per-GPU utilization over time, from the step records: compute, HBM, NVLink, NIC.

Each stage step's work on one GPU of its TP group comes from the model's operator shapes
(the same FLOPs and bytes the cost model prices, at 100% efficiency): GEMMs, attention
(from the step's causal pairs, cached context and decode KV reads), elementwise ops, the
embedding on the first stage and the LM head on the last. Communication per GPU: a ring
all-reduce sends ``2(n-1)/n * S`` bytes, twice per layer with ``S = T * h * 2``; a pipeline
hand-off sends ``T * h * 2``, over NVLink or the NIC as the graph path says. A step counts
in the window holding its midpoint.

Utilization = work in the window / (capacity x window): FLOPs / tensor peak of the weight
dtype, bytes / HBM bandwidth, bytes sent / link bandwidth per direction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.metrics.moe import stage_work as moe_stage_work
from simulator.model.cost import ACT_BYTES, StageCost, gemm_work
from simulator.model.moe_stage import MoEStageCost

GPU_COLUMNS = ["window_start_s", "gpu", "replica", "stage", "compute_util", "hbm_util",
               "nvlink_util", "nic_util"]


@dataclass(frozen=True)
class StageHardware:
    """What utilization needs to know about one replica stage."""

    replica: int
    stage: int
    gpus: tuple[str, ...]
    cost: StageCost
    peak_flops: float
    hbm_Bps: float
    nvlink_Bps: float
    nic_Bps: float
    send_over_nic: bool  # the hand-off to the next stage crosses nodes
    last: bool


def stage_work(st: StageHardware, g: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """FLOPs, HBM bytes, NVLink bytes and NIC bytes per GPU for each step in ``g``."""
    if isinstance(st.cost, MoEStageCost):  # its own per-rank work
        flops, hbm, nvlink, nic = moe_stage_work(st.cost,
            (g["prefill_tokens"] + g["decode_tokens"]).to_numpy(float),
            g["prefill_pairs"].to_numpy(float), g["prefill_ctx"].to_numpy(float),
            g["decode_kv"].to_numpy(float), g["sampled"].to_numpy(float))
        tokens = (g["prefill_tokens"] + g["decode_tokens"]).to_numpy(float)
        send = 0 * tokens if st.last else tokens * st.cost.model.hidden * ACT_BYTES
        if st.send_over_nic:
            return flops, hbm, nvlink, nic + send
        return flops, hbm, nvlink + send, nic
    sh, layers = st.cost.shapes, st.cost.layers
    tokens = (g["prefill_tokens"] + g["decode_tokens"]).to_numpy(float)
    flops = np.zeros(len(g))
    hbm = np.zeros(len(g))
    for w in sh.gemm_works(tokens):
        flops += w.flops
        hbm += w.bytes
    att = sh.attention_work(tokens, g["prefill_pairs"].to_numpy(float),
                            g["prefill_ctx"].to_numpy(float), g["decode_kv"].to_numpy(float))
    flops = layers * (flops + att.flops)
    hbm = layers * (hbm + att.bytes + tokens * sh.elementwise_bytes_per_token)
    h = sh.model.hidden
    if st.cost.first:
        hbm += tokens * h * ACT_BYTES
    sampled = g["sampled"].to_numpy(float)
    if st.last:
        head = gemm_work(sampled, sh.model.vocab // sh.tp, h, ACT_BYTES)  # LM head: 16-bit
        flops += head.flops
        hbm += np.where(sampled > 0, head.bytes, 0.0)
    n = sh.tp
    nvlink = 2 * layers * 2 * (n - 1) / n * tokens * h * ACT_BYTES if n > 1 else 0 * tokens
    send = 0 * tokens if st.last else tokens * h * ACT_BYTES
    nic = send if st.send_over_nic else 0 * tokens
    nvlink = nvlink + (0 * tokens if st.send_over_nic else send)
    return flops, hbm, nvlink, nic


def gpu_windows(steps: pd.DataFrame, stages: list[StageHardware],
                edges: np.ndarray) -> pd.DataFrame:
    """One row per window and GPU with the four utilizations (see the module docstring)."""
    n = len(edges) - 1
    totals = []
    for st in stages:
        g = steps[(steps["replica"] == st.replica) & (steps["stage"] == st.stage)]
        totals.append(window_work(st, g, edges, n))
    return windows_frame(stages, totals, edges)


def window_work(st: StageHardware, g: pd.DataFrame, edges: np.ndarray,
                n: int) -> list[np.ndarray]:
    """FLOPs, HBM bytes, NVLink bytes and NIC bytes per GPU of stage ``st`` summed per
    window over its steps ``g`` (a step in the window of its midpoint; windows ``edges``,
    those past window ``n - 1`` counted in it)."""
    mid = ((g["start_s"] + g["end_s"]) / 2).to_numpy()
    idx = np.clip(np.searchsorted(edges, mid, side="right") - 1, 0, n - 1)
    return [np.bincount(idx, weights=v, minlength=n) if len(g) else np.zeros(n)
            for v in stage_work(st, g)]


def windows_frame(stages: list[StageHardware], totals: list[list[np.ndarray]],
                  edges: np.ndarray) -> pd.DataFrame:
    """:func:`gpu_windows`' table from each stage's per-window work (:func:`window_work`)."""
    w = edges[1] - edges[0]
    n = len(edges) - 1
    frames = []
    for st, work in zip(stages, totals, strict=True):
        cols = {name: total[:n] / (cap * w) if cap > 0 else np.zeros(n)
                for name, total, cap in zip(
                    ("compute_util", "hbm_util", "nvlink_util", "nic_util"), work,
                    (st.peak_flops, st.hbm_Bps, st.nvlink_Bps, st.nic_Bps), strict=True)}
        for gpu in st.gpus:
            frames.append(pd.DataFrame({"window_start_s": edges[:-1],
                                        "gpu": int(gpu.removeprefix("gpu")),
                                        "replica": st.replica, "stage": st.stage, **cols}))
    if not frames:
        return pd.DataFrame(columns=GPU_COLUMNS)
    df = pd.concat(frames, ignore_index=True)
    return df.sort_values(["window_start_s", "gpu"], ignore_index=True)[GPU_COLUMNS]
