"""MoE columns of the step table and their summary (docs/metrics.md).

``a2a_s``: all-to-all seconds of the step on its stage (dispatch + combine over the
stage's MoE layers; 0 under TP attention, where the experts combine by all-reduce);
``imbalance``: max EP-rank routed tokens / mean in the step's routing draw. Both come
from the stage cost's own tables, so they are the values the step time was priced with.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def add_moe_columns(steps: pd.DataFrame, stage_costs) -> pd.DataFrame:
    """``steps`` with ``a2a_s`` and ``imbalance``; ``stage_costs[replica][stage]`` is the
    MoEStageCost that priced the replica's stage."""
    if steps.empty:
        return steps.assign(a2a_s=pd.Series(dtype=float), imbalance=pd.Series(dtype=float))
    a2a, imb = np.zeros(len(steps)), np.ones(len(steps))
    tokens = (steps["prefill_tokens"] + steps["decode_tokens"]).to_numpy()
    for (r, i), rows in steps.groupby(["replica", "stage"], sort=False).indices.items():
        a, m = stage_costs[r][i].moe_columns(tokens[rows],
                                             steps["prefill_pairs"].to_numpy()[rows],
                                             steps["decode_kv"].to_numpy()[rows],
                                             steps["sampled"].to_numpy()[rows])
        a2a[rows], imb[rows] = a, m
    return steps.assign(a2a_s=a2a, imbalance=imb)


def moe_summary(steps: pd.DataFrame) -> dict:
    """``moe_imbalance_mean`` (mean over steps) and ``moe_a2a_share`` (all-to-all seconds
    / step seconds, compute + comm, over all steps); NaN without step records."""
    if steps.empty or "a2a_s" not in steps:
        return {"moe_imbalance_mean": float("nan"), "moe_a2a_share": float("nan")}
    busy = float((steps["compute_s"] + steps["comm_s"]).sum())
    return {"moe_imbalance_mean": float(steps["imbalance"].mean()),
            "moe_a2a_share": float(steps["a2a_s"].sum() / busy) if busy else float("nan")}
