"""Per-rank work of a step of a mixture-of-experts and/or MLA stage (docs/moe.md): the
FLOPs and bytes :meth:`simulator.model.moe_stage.MoEStageCost.work` reports for GPU
utilization, from the shapes the stage cost prices (no efficiency, no floors).
"""

from __future__ import annotations

import numpy as np

from simulator.calibration.forms import ACT_BYTES
from simulator.model.cost import StageCost, gemm_work
from simulator.model.moe_cost import dispatch_bytes_per_peer
from simulator.model.spec import BYTES_PER_DTYPE, kv_heads_per_gpu


def moe_stage_work(cost: StageCost, tokens: np.ndarray, pairs: np.ndarray, ctx: np.ndarray,
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
