"""Kernel times of mixture-of-experts and MLA layers (docs/moe.md): the ONE place.

The stage cost (:mod:`simulator.model.moe_stage`) takes every MoE / MLA kernel time from
the functions here, which hand the shapes to the calibrated forms of
:mod:`simulator.calibration.moe_forms` (docs/cost-model.md, "Mixture-of-experts
families"): routed experts per rank from ``expert_time`` on the sampled rows of each local
expert (:func:`expert_time`), the MLA module from ``mla_prefill_time`` /
``mla_decode_time`` (:func:`mla_prefill`, :func:`mla_decode`), and a DeepEP dispatch or
combine from the form's fitted fixed latency, per-token cost and link efficiency with the
bandwidth of the topology graph (:func:`a2a_time`, :class:`A2APaths`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.calibration import moe_forms
from simulator.calibration.forms import AttentionShape
from simulator.hardware.specs import GPUSpec
from simulator.model.routing import Routing, row_sum
from simulator.model.spec import ModelSpec, kv_heads_per_gpu

A2A_MODES = ("auto", "normal", "low_latency")


def kernel_dtype(model: ModelSpec, dtype: str, gpu: GPUSpec | None = None) -> str:
    """The calibrated MoE kernel (a key of ``moe_forms.MOE_DTYPES``) of experts stored in
    ``dtype``: a release's native block-scaled FP8 (DeepSeek, Kimi) -> ``fp8_block``, other
    FP8 -> per-tensor ``fp8``, int4 -> ``int4_wo`` (Marlin), 16-bit -> ``bf16``; int8 is
    priced as per-tensor FP8 (same bytes, 8-bit tensor cores; no int8 MoE kernel was
    measured). 4-bit floats run as the GPU runs them: on a GPU with FP4 tensor cores
    (Blackwell) the native ``nvfp4`` kernel at the FP4 peak; elsewhere (Hopper) the
    weight-only ``w4a16_mxfp4`` kernel the engines fall back to (Marlin / Triton: 4-bit
    weights dequantized to 16-bit math), or without ``gpu`` that one."""
    if dtype == "fp8":
        return "fp8_block" if model.native_dtype == "fp8" else "fp8"
    if dtype == "fp4" and gpu is not None and "fp4" in gpu.peak_flops:
        return "nvfp4"
    return {"fp4": "w4a16_mxfp4", "int4": "int4_wo", "int8": "fp8", "fp16": "bf16",
            "bf16": "bf16"}[dtype]


def expert_time(local_rows, model: ModelSpec, inter_per_gpu: int, gpu: GPUSpec,
                dtype: str, ep: int):
    """Routed experts of one MoE layer per rank, seconds: ``moe_forms.expert_time`` on
    ``local_rows`` (``[..., local experts]``: the rows each expert copy on the rank gets;
    one time per leading index), with the model's gating and ``kernel_dtype``.

    The form's aggregates (rows, active experts, row tiles) are summed here with
    :func:`~simulator.model.routing.row_sum`, so each routing state's time has the same
    bits whichever other states are priced with it (fast-forward = stepping), and handed
    to ``moe_forms.expert_time_agg``, the form's own vectorised core.
    """
    key, w, a, peak = moe_forms.moe_dtype(kernel_dtype(model, dtype, gpu), ep)
    p = gpu.calibration.moe_for(key)
    counts = np.asarray(local_rows, dtype=float)
    return moe_forms.expert_time_agg(
        row_sum(counts), row_sum(counts > 0), row_sum(np.ceil(counts / p.tile_m)),
        model.hidden, inter_per_gpu, p, moe_forms.moe_peak(gpu, key, peak), gpu.hbm_bandwidth_Bps,
        gpu.sm_count, w, a, model.gated_mlp, counts.shape[-1])


def mla_dims(model: ModelSpec) -> dict:
    """The MLA dimensions of ``model`` as keyword arguments of the MLA forms."""
    m = model.mla
    return dict(hidden=model.hidden, q_lora_rank=m.q_lora_rank or model.hidden,
                kv_lora_rank=m.kv_lora_rank, qk_nope=m.qk_nope_head_dim,
                qk_rope=m.qk_rope_head_dim, v_head=m.v_head_dim)


def mla_gemm_dtype(model: ModelSpec, weight_dtype: str) -> str:
    """Projection weights of the MLA module: block-scaled FP8 for a release shipped in
    FP8 and served in it, FP8 for other FP8 weights, 16-bit otherwise."""
    if weight_dtype == "fp8":
        return "fp8_block" if model.native_dtype == "fp8" else "fp8"
    return "bf16"


def mla_decode(model: ModelSpec, gpu: GPUSpec, heads: int, seqs, decode_kv, kv_dtype: str,
               weight_dtype: str):
    """One layer's MLA module for ``seqs`` decodes reading ``decode_kv`` latent entries
    (array allowed), seconds: ``moe_forms.mla_decode_time``."""
    return moe_forms.mla_decode_time(gpu, heads, seqs, decode_kv, _kv(kv_dtype),
                                     mla_gemm_dtype(model, weight_dtype), **mla_dims(model))


def mla_prefill(model: ModelSpec, gpu: GPUSpec, heads: int, tokens, pairs, ctx, seqs,
                kv_dtype: str, weight_dtype: str):
    """One layer's MLA module for prefill chunks (step aggregates), seconds:
    ``moe_forms.mla_prefill_time``."""
    return moe_forms.mla_prefill_time(gpu, heads, tokens, pairs, ctx, seqs, _kv(kv_dtype),
                                      mla_gemm_dtype(model, weight_dtype),
                                      **mla_dims(model))


def mla_shapes(model: ModelSpec, heads: int, kv_bytes: float,
               gpu: GPUSpec) -> tuple[AttentionShape, AttentionShape]:
    """Attention shapes (prefill, decode) of one rank holding ``heads`` heads, for the
    attention forms of GQA models (MLA models take :func:`mla_prefill` / :func:`mla_decode`
    instead; their shapes here are the MQA-over-latent view, kept for utilization)."""
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


def _kv(kv_dtype: str) -> str:
    return "fp8" if kv_dtype == "fp8" else "bf16"


@dataclass(frozen=True)
class A2APaths:
    """How an EP group's all-to-all runs on the graph, at full link bandwidth (the
    calibrated form's link efficiency applies on top, :func:`a2a_time`).

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


def a2a_time(nbytes_per_peer, tokens_per_rank, paths: A2APaths, mode: str, phase: str,
             gpu: GPUSpec):
    """One DeepEP dispatch or combine of one rank, seconds (array arguments broadcast).

    ``launch + tokens c_tok / S + latency + bytes s_per_byte / eta_link``: the fixed
    latency, per-token SM cost and link efficiency of ``moe_forms.a2a_time`` (fitted per
    mode and phase), the path latency and seconds per byte at full link bandwidth of the
    graph (:class:`A2APaths`), so the topology decides which links carry the bytes and how
    they share them. ``nbytes_per_peer``: what the rank sends to each other rank.
    """
    p = gpu.calibration.alltoall_for(moe_forms.A2A_MODES[mode], phase)
    return (p.launch_s + np.asarray(tokens_per_rank, dtype=float) * p.token_sm_s
            / gpu.sm_count + paths.latency_s
            + np.asarray(nbytes_per_peer) * paths.s_per_byte / p.link_eff)


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


