"""Kernel times of mixture-of-experts and MLA layers (docs/moe.md): the ONE place.

The stage cost (:mod:`simulator.model.moe_stage`) takes every MoE / MLA kernel time from
the three functions here, :func:`expert_time`, :func:`mla_shapes` and :func:`a2a_time`
(plain shape numbers plus the GPUSpec), so the calibrated MoE / MLA / all-to-all forms can
replace them here. Until then they price: experts as a grouped GEMM (the calibrated GEMM
form with M = tokens routed to each expert, over all the rank's active experts' tiles),
MLA through the calibrated attention forms (decode: an MQA-like kernel over the cached
latent, ``kv_lora_rank + qk_rope_head_dim`` values per token; prefill: full attention over
``qk_nope + qk_rope`` dims), and the all-to-all as bytes over the graph's paths (the fluid
model's seconds per byte, :class:`A2APaths`) plus a per-mode launch latency.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.calibration.forms import ACT_BYTES, AttentionShape, gemm_time
from simulator.calibration.params import ACTIVATION_QUANTIZED
from simulator.hardware.specs import GPUSpec
from simulator.model.routing import Routing
from simulator.model.spec import BYTES_PER_DTYPE, ModelSpec, kv_heads_per_gpu

#: Launch and synchronization latency of one dispatch or combine, seconds, per DeepEP
#: mode: ``normal`` (notify + copy kernels, built for large prefill batches) and
#: ``low_latency`` (one kernel, fixed per-expert slots, for decode). Order of magnitude of
#: DeepEP's published small-batch figures; the calibrated all-to-all form replaces them.
A2A_LAUNCH_S = {"normal": 25e-6, "low_latency": 10e-6}
A2A_MODES = ("auto", "normal", "low_latency")


def expert_time(rank_tokens, active, hidden: int, intermediate: int, gpu: GPUSpec,
                dtype: str):
    """Grouped GEMM of one rank's routed experts (gate-up then down), seconds.

    ``rank_tokens`` rows are spread over ``active`` experts (each with at least one
    token), ``M = rank_tokens / active`` rows per expert. A grouped GEMM is one kernel
    whose output tiles are those of every expert: it is priced by
    :func:`simulator.calibration.forms.gemm_time` at ``(M, active * n, k)``, which has the
    experts' tile count (waves over the SMs), FLOPs ``2 M_rank n k``, weight bytes
    ``active * n * k * b_w`` and output bytes, and one launch per projection. Array
    arguments broadcast.
    """
    cal, w_b = gpu.calibration.gemm_for(dtype), BYTES_PER_DTYPE[dtype]
    quantized = dtype in ACTIVATION_QUANTIZED
    in_b = w_b if quantized else ACT_BYTES
    active = np.maximum(np.asarray(active, dtype=float), 1.0)
    m = np.maximum(np.asarray(rank_tokens, dtype=float) / active, 1.0)
    peak, bw, sms = gpu.peak(dtype), gpu.hbm_bandwidth_Bps, gpu.sm_count
    t = (gemm_time(m, 2 * intermediate * active, hidden, cal, peak, bw, sms, w_b, in_b,
                   quantized)
         + gemm_time(m, hidden * active, intermediate, cal, peak, bw, sms, w_b, in_b,
                     quantized))
    return np.where(np.asarray(rank_tokens) > 0, t, 0.0)


def mla_shapes(model: ModelSpec, heads: int, kv_bytes: float,
               gpu: GPUSpec) -> tuple[AttentionShape, AttentionShape]:
    """Attention shapes (prefill, decode) of one rank holding ``heads`` heads.

    Prefill runs full multi-head attention over ``qk_nope + qk_rope`` dims; decode runs
    with the up-projections absorbed, as MQA over one cached latent of
    ``kv_lora_rank + qk_rope_head_dim`` values per token (DeepSeek-V2, FlashMLA).
    GQA models get their own heads for both.
    """
    peak, bw, sms = gpu.peak("bf16"), gpu.hbm_bandwidth_Bps, gpu.sm_count
    if model.mla is None:
        kvh = kv_heads_per_gpu(model.kv_heads, model.q_heads // heads)
        shape = AttentionShape(heads, kvh, model.head_dim, kv_bytes, peak, bw, sms)
        return shape, shape
    m = model.mla
    prefill = AttentionShape(heads, heads, m.qk_nope_head_dim + m.qk_rope_head_dim,
                             kv_bytes, peak, bw, sms)
    decode = AttentionShape(heads, 1, m.cache_width, kv_bytes, peak, bw, sms)
    return prefill, decode


@dataclass(frozen=True)
class A2APaths:
    """How an EP group's all-to-all runs on the graph.

    ``s_per_byte``: seconds per byte sent to each peer when every rank sends to every
    other at once, from the max-min fair fluid model of :mod:`simulator.topology.flows`
    on the graph's paths (NVLink ports, NICs, fabric links and their oversubscription all
    shared). ``intra_s_per_byte`` / ``inter_s_per_byte``: the same for one rank alone,
    summed over its NVLink-only peers and over the others (what the fluid model gives when
    the GPU's own links are the only bottleneck); ``latency_s`` the largest path latency.
    """

    intra_s_per_byte: float
    inter_s_per_byte: float
    latency_s: float
    ranks: int
    intra_peers: int = 0  # peers reached over NVLink only
    s_per_byte: float = 0.0


def a2a_time(nbytes_per_peer, paths: A2APaths, mode: str):
    """One dispatch or combine: ``launch + latency + bytes * s_per_byte`` seconds, where
    ``nbytes_per_peer`` is what one rank sends to each other rank (array allowed)."""
    return (A2A_LAUNCH_S[mode] + paths.latency_s
            + np.asarray(nbytes_per_peer) * paths.s_per_byte)


def dispatch_bytes_per_peer(tokens_per_rank: float, routing: Routing, hidden: int,
                            act_bytes: float, mode: str) -> float:
    """Bytes one rank sends to each other rank in one dispatch.

    ``normal`` de-duplicates per destination: a token goes once to each rank holding at
    least one of its k experts, ``P(rank r hit) = 1 - (1 - P_r)^k`` with ``P_r`` the
    rank's share of the routing probability. ``low_latency`` sends one fixed slot per
    (token, expert) pair: ``k * P_r`` messages per token.
    """
    ranks = routing.share.shape[0]
    p_rank = routing.share @ routing.p
    k = routing.top_k
    per = 1.0 - (1.0 - p_rank) ** k if mode == "normal" else k * p_rank
    # A token's copy for its own rank does not leave the GPU: spread the rest over peers.
    remote = per.sum() * (ranks - 1) / ranks
    return tokens_per_rank * remote / max(ranks - 1, 1) * hidden * act_bytes


