"""Per-GPU utilization over time, from the step records: compute, HBM, NVLink, NIC.

Each stage step's work on one GPU of its TP group is what its stage cost reports
(:meth:`simulator.model.cost.StageCost.work`: the same FLOPs and bytes the cost model
prices, at 100% efficiency, and the stage's own collectives); this module adds the
pipeline hand-off of ``T * h * 2`` bytes to the next stage, over NVLink or the NIC as the
graph path says. A step counts in the window holding its midpoint.

Utilization = work in the window / (capacity x window): FLOPs / tensor peak of the weight
dtype, bytes / HBM bandwidth, bytes sent / link bandwidth per direction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.model.cost import StageCost

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
    """FLOPs, HBM bytes, NVLink bytes and NIC bytes per GPU for each step in ``g``: the
    stage cost's own work (:meth:`simulator.model.cost.StageCost.work`) plus the hand-off
    to the next stage, over the NIC or NVLink as ``st`` says."""
    tokens = (g["prefill_tokens"] + g["decode_tokens"]).to_numpy(float)
    flops, hbm, nvlink, nic = st.cost.work(
        tokens, g["prefill_pairs"].to_numpy(float), g["prefill_ctx"].to_numpy(float),
        g["decode_kv"].to_numpy(float), g["sampled"].to_numpy(float))
    send = 0 * tokens if st.last else st.cost.message_bytes(tokens)
    if st.send_over_nic:
        return flops, hbm, nvlink, nic + send
    return flops, hbm, nvlink + send, nic


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
