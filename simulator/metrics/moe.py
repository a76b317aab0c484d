"""MoE columns of the step table and their summary (docs/metrics.md).

``a2a_s``: all-to-all seconds of the step on its stage (dispatch + combine over the
stage's MoE layers; 0 under TP attention, where the experts combine by all-reduce);
``imbalance``: max EP-rank routed tokens / mean in the step's routing draw. Both come
from the stage cost's own tables, so they are the values the step time was priced with.
:func:`stage_work` is the per-rank work of a MoE / MLA stage for GPU utilization.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.calibration.forms import ACT_BYTES
from simulator.model.cost import gemm_work
from simulator.model.moe_cost import dispatch_bytes_per_peer
from simulator.model.moe_stage import MoEStageCost
from simulator.model.spec import BYTES_PER_DTYPE, kv_heads_per_gpu


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


def stage_work(cost: MoEStageCost, tokens: np.ndarray, pairs: np.ndarray, ctx: np.ndarray,
           kv: np.ndarray, sampled: np.ndarray) -> tuple[np.ndarray, ...]:
    """FLOPs, HBM bytes, NVLink bytes and NIC bytes on a mean rank of the stage for
    each recorded step (for GPU utilization; no efficiency, no floors): projections,
    dense MLPs, routers, shared experts, the rank's share of the routed tokens through
    its active experts' weights, attention reads and writes, elementwise traffic, the
    TP all-reduces or the all-to-all, the LM head."""
    m, lay, sh, moe = cost.model, cost.layout, cost.shapes, cost.model.moe
    tokens = np.asarray(tokens, dtype=float)
    t_r = tokens / cost.split
    flops, hbm = np.zeros(tokens.size), np.zeros(tokens.size)

    def add(gemms, times, w_b=sh.w_bytes, in_b=sh.in_bytes):
        nonlocal flops, hbm
        for n, k in gemms:
            w = gemm_work(t_r, n, k, w_b, in_b)
            flops, hbm = flops + times * w.flops, hbm + times * np.where(t_r > 0, w.bytes,
                                                                           0.0)

    add(cost.attn_gemms, cost.layers)
    add(cost.dense_gemms, cost.n_dense)
    add(cost.shared_gemms, cost.n_moe)
    h = m.hidden
    if cost.n_moe:
        add([(cost.router_n, h)], cost.n_moe, ACT_BYTES, ACT_BYTES)
        ranks = lay.ep
        inter = moe.intermediate // cost.moe_tp
        routed = tokens * moe.top_k / ranks
        uniq, inv = np.unique(tokens, return_inverse=True)
        active = np.array([cost.routing.active_experts(t).mean() for t in uniq])[inv]
        e_b = BYTES_PER_DTYPE[lay.expert_dtype]
        flops = flops + cost.n_moe * 2 * routed * 3 * h * inter
        hbm = hbm + cost.n_moe * (np.where(routed > 0, active * 3 * h * inter * e_b, 0.0)
                                  + routed * (2 * h + 3 * inter) * ACT_BYTES)
    attn_tp = lay.attn_tp(sh.tp)
    heads = m.q_heads // attn_tp
    if m.mla is not None:
        width, kv_tok = m.mla.cache_width, m.mla.cache_width * sh.kv_bytes
    else:
        width = m.head_dim
        kv_tok = 2 * kv_heads_per_gpu(m.kv_heads, attn_tp) * width \
            * sh.kv_bytes
    s = cost.split
    att_flops = 4.0 * heads * width * (np.asarray(pairs) + np.asarray(kv)) / s
    att_bytes = ((np.asarray(kv) + np.asarray(ctx)) / s + t_r) * kv_tok \
        + 2 * t_r * heads * width * ACT_BYTES
    flops = flops + cost.layers * att_flops
    hbm = hbm + cost.layers * (att_bytes + t_r * cost.elem_bytes_attn) \
        + cost.n_dense * t_r * cost.elem_bytes_dense + cost.n_moe * t_r * cost.elem_bytes_moe
    if cost.first:
        hbm = hbm + t_r * h * ACT_BYTES
    if cost.last:
        head = gemm_work(np.asarray(sampled, dtype=float), cost.vocab_shard, h, ACT_BYTES)
        flops = flops + head.flops
        hbm = hbm + np.where(np.asarray(sampled) > 0, head.bytes, 0.0)
    n = sh.tp
    nvlink, nic = np.zeros(tokens.size), np.zeros(tokens.size)
    if not cost.dp and n > 1:
        nvlink = 2 * cost.layers * 2 * (n - 1) / n * tokens * h * ACT_BYTES
    elif cost.dp and attn_tp > 1:  # the attention groups' two all-reduces per layer
        nvlink = 2 * cost.layers * 2 * (attn_tp - 1) / attn_tp * t_r * h * ACT_BYTES
    if cost.dp and cost.n_moe and not cost.a2a:  # all-gather + reduce-scatter of every token
        nvlink = nvlink + cost.n_moe * 2 * (n - 1) / n * tokens * h * ACT_BYTES
    elif cost.dp and cost.n_moe and cost.paths is not None:
        out = dispatch_bytes_per_peer(1.0, cost.routing, h, cost.dispatch_bytes, "normal")
        back = dispatch_bytes_per_peer(1.0, cost.routing, h, ACT_BYTES, "normal")
        sent = cost.n_moe * (out + back) * tokens / lay.ep
        intra = cost.paths.intra_peers
        nvlink, nic = nvlink + sent * intra, sent * (lay.ep - 1 - intra)
    return flops, hbm, nvlink, nic
