"""Cost forms of the mixture-of-experts kernel families: expert compute, MLA attention and
the DeepEP all-to-all, with their roofline lower bounds.

The public functions take plain shape numbers and a :class:`GPUSpec` and return seconds;
the model side calls them at one place each. Like :mod:`simulator.calibration.forms`, each
form is a roofline times efficiencies <= 1 plus latencies >= 0, so it never beats the
roofline (``*_roofline``), and the neutral parameters of :mod:`params` reduce it to that
roofline. Formulas: docs/cost-model.md, section "Mixture-of-experts families".
"""

from __future__ import annotations

import math

import numpy as np

from simulator.calibration import forms
from simulator.calibration.params import AllToAllParams, MLAParams, MoEParams
from simulator.hardware.specs import GPUSpec

ACT = forms.ACT_BYTES
#: MoE weight dtypes: scenario or CSV name -> (parameter key, bytes per weight, bytes per
#: GEMM input activation, dtype of the tensor peak the math runs at). MXFP4 carries one
#: 8-bit scale per 32 weights; block-scaled FP8 one fp32 scale per 128 x 128 block.
MOE_DTYPES = {
    "bf16": ("bf16", 2.0, 2, "bf16"), "bfloat16": ("bf16", 2.0, 2, "bf16"),
    "fp16": ("bf16", 2.0, 2, "bf16"),
    "fp8": ("fp8", 1.0, 1, "fp8"),
    "fp8_block": ("fp8_block", 1.0 + 4 / 128**2, 1, "fp8"),
    "int4": ("int4_wo", 0.5 + 2 / 128, 2, "bf16"), "int4_wo": ("int4_wo", 0.5 + 2 / 128, 2, "bf16"),
    "w4a16_mxfp4": ("w4a16_mxfp4", 0.5 + 1 / 32, 2, "bf16"),
    "mxfp4": ("w4a16_mxfp4", 0.5 + 1 / 32, 2, "bf16"),
    # The same weights through vLLM's Marlin kernel (compressed-tensors checkpoints).
    "w4a16_mxfp4_marlin": ("w4a16_mxfp4_marlin", 0.5 + 1 / 32, 2, "bf16"),
    # Blackwell's native FP4 tensor cores (tcgen05 block-scaled MMA): NVFP4 weights and
    # activations (e2m1, one e4m3 scale per 16 values) at the FP4 peak; MXFP4 weights with
    # MXFP8 activations (one e8m0 scale per 32) at the FP8 peak, the rate of the mixed
    # f8f6f4 MMA kind.
    "nvfp4": ("nvfp4", 0.5 + 1 / 16, 0.5 + 1 / 16, "fp4"),
    "w4a8_mxfp4_mxfp8": ("w4a8_mxfp4_mxfp8", 0.5 + 1 / 32, 1 + 1 / 32, "fp8"),
}
#: MoE kernels that need FP4 tensor cores (Blackwell): refused on a GPU without them.
NATIVE_FP4 = ("nvfp4", "w4a8_mxfp4_mxfp8")
#: DeepEP modes: scenario name -> parameter prefix (``<prefix>_<phase>``).
A2A_MODES = {"normal": "normal", "low_latency": "low_latency", "deepep_ht": "normal",
             "deepep_ll": "low_latency", "v2_normal": "v2_normal",
             "v2_low_latency": "v2_low_latency"}
#: MLA head dimensions of DeepSeek-V3 (defaults of the MLA functions).
DSV3 = dict(hidden=7168, q_lora_rank=1536, kv_lora_rank=512, qk_nope=128, qk_rope=64,
            v_head=128)


def moe_dtype(dtype: str, ep: int = 1) -> tuple[str, float, float, str]:
    """``(key, weight bytes, input bytes, peak dtype)`` of a MoE weight dtype; vLLM runs
    block-scaled FP8 through Triton without EP and FlashInfer CUTLASS with it."""
    if dtype not in MOE_DTYPES:
        raise ValueError(f"MoE dtype {dtype!r} (allowed: {', '.join(MOE_DTYPES)})")
    key, w, a, peak = MOE_DTYPES[dtype]
    if key == "fp8_block" and ep == 1:
        key = "fp8_block_ep1"
    return key, w, a, peak


def moe_peak(gpu: GPUSpec, key: str, peak: str) -> float:
    """Tensor peak (FLOP/s) a MoE kernel runs at on ``gpu``; the native FP4 kernels need
    FP4 tensor cores (Blackwell) and are refused elsewhere."""
    if key in NATIVE_FP4 and "fp4" not in gpu.peak_flops:
        raise ValueError(f"MoE kernel {key} needs FP4 tensor cores; {gpu.name} has none "
                         f"(peak_flops: {', '.join(gpu.peak_flops)}); on it 4-bit experts "
                         f"run as w4a16_mxfp4 (16-bit math)")
    return gpu.peak(peak)


# ----------------------------------------------------------------------------- experts

def expert_aggregates(tokens_per_expert, tile_m: int = 1):
    """``(rows, active, padded)``: routed rows, experts with >= 1 row, and the sum over
    experts of ``ceil(M_e / tile_m)`` (row tiles). Works on the last axis of a 2-D array."""
    t = np.asarray(tokens_per_expert, dtype=float)
    return (t.sum(axis=-1), (t > 0).sum(axis=-1).astype(float),
            np.ceil(t / tile_m).sum(axis=-1))


def expert_time_agg(rows, active, padded, hidden, inter, p: MoEParams, peak: float,
                    bandwidth: float, sm_count: int, w_bytes: float, in_bytes: float,
                    gated: bool = True, local=0.0, rows_in=None):
    """Vectorized :func:`expert_time` on the aggregates of :func:`expert_aggregates`
    (``local`` experts held, ``rows_in`` rows the permute scans; default ``rows``)."""
    rows, active, padded, hidden, inter, local = (
        np.asarray(x, dtype=float) for x in (rows, active, padded, hidden, inter, local))
    rows_in = rows if rows_in is None else np.asarray(rows_in, dtype=float)
    n1 = np.where(gated, 2.0, 1.0) * inter  # gate and up projections side by side
    tm, tn = p.tile_m, p.tile_n
    rate = peak * p.compute_eff
    compute = 0.0
    for n, k in ((n1, hidden), (hidden, inter)):
        tiles = padded * np.ceil(np.asarray(n, float) / tn)
        compute = compute + np.ceil(tiles / sm_count) * sm_count * 2.0 * tm * tn * k / rate
    weights = active * (n1 + inter) * hidden * w_bytes
    acts = rows * _row_bytes(hidden, inter, n1, in_bytes)
    # Rows of other ranks' experts (vLLM EP without all-to-all): the GEMMs write zeros for
    # them, the activation and the final sum still read and write their 16-bit rows.
    foreign = (np.maximum(rows_in - rows, 0.0) * (2 * n1 + inter + 2 * hidden) * ACT
               * p.foreign_fill)
    memory = (weights + acts + foreign) / (bandwidth * p.bandwidth_eff)
    work = active * p.expert_sm_s + local * p.local_sm_s + rows_in * p.row_sm_s
    return p.launch_s + work / sm_count + forms.combine(p.overlap, compute, memory)


def _row_bytes(hidden, inter, n1, in_bytes):
    """HBM bytes per routed row: permuted input read by the first GEMM, its 16-bit output
    written and read by the activation, the activation's output (down GEMM input) written
    and read, the down GEMM's 16-bit output written and read by the weighted combine."""
    return hidden * in_bytes + 2 * n1 * ACT + 2 * inter * in_bytes + 2 * hidden * ACT


def expert_time(tokens_per_expert, hidden: int, inter_per_gpu: int, dtype: str,
                gpu: GPUSpec, gated: bool = True, ep: int = 1,
                rows_in=None):
    """Seconds of one MoE layer's routed-expert compute on one GPU (no router GEMM).

    Parameters
    ----------
    tokens_per_expert : array_like of int
        Tokens each LOCAL expert receives this step (zeros allowed; the most loaded GPU of
        an EP group decides the step). A 2-D array ``[ranks, local experts]`` gives one
        time per rank (an array); 1-D gives a float.
    hidden : int
        Model hidden size h.
    inter_per_gpu : int
        ``moe_intermediate_size / moe_tp`` (I).
    dtype : str
        Expert weight dtype: a key of :data:`MOE_DTYPES`.
    gated : bool
        Gate and up projections (SwiGLU): the first GEMM has 2I columns, else I.
    ep : int
        Expert-parallel size (only picks the kernel vLLM runs for fp8_block).
    rows_in : float, optional
        (token, expert) rows the kernel's permute scans: the rows this GPU received after
        an all-to-all (the default, ``sum M_e``), or every token x top-k of the batch when
        each rank is handed the whole batch (vLLM's EP without all-to-all, as measured).

    Notes
    -----
    Over the ``L`` local experts e with ``M_e`` rows (``R = sum M_e``, ``A`` experts with
    ``M_e > 0``, ``R_in`` rows scanned)::

        t = launch + (A c_e + L c_l + R_in c_r) / S + ||(T_c, T_m)||_p
        T_c = sum_{GEMM (n, k)} ceil(sum_e ceil(M_e / t_m) ceil(n / t_n) / S) S 2 t_m t_n k
              / (P eta_c)                             (n, k) = (2I, h) and (h, I)
        T_m = (A 3 h I b_w + R (h b_in + 4I 2 + 2I b_in + 2h 2)
               + f (R_in - R)(2 N1 + I + 2h) 2) / (BW eta_b)

    Each expert's weights are read once; each expert's M is padded to the row tile, so a
    skewed load over the same experts costs more than a balanced one. ``f`` is the share of
    the 16-bit row traffic (GEMM outputs written as zeros, the activation's read and write,
    the final sum's read) that a kernel still moves for scanned rows of other ranks' experts.
    """
    key, w, a, peak = moe_dtype(dtype, ep)
    p = gpu.calibration.moe_for(key)
    counts = np.asarray(tokens_per_expert, dtype=float)
    rows, active, padded = expert_aggregates(counts, p.tile_m)
    t = expert_time_agg(rows, active, padded, hidden, inter_per_gpu, p,
                        moe_peak(gpu, key, peak),
                        gpu.hbm_bandwidth_Bps, gpu.sm_count, w, a, gated, counts.shape[-1],
                        rows_in)
    return float(t) if counts.ndim == 1 else t


def expert_roofline(tokens_per_expert, hidden: int, inter_per_gpu: int, dtype: str,
                    gpu: GPUSpec, gated: bool = True):
    """Roofline of :func:`expert_time`: ``max(FLOPs / P, bytes / BW)`` (seconds)."""
    key, w, a, peak = moe_dtype(dtype)
    rows, active, _ = expert_aggregates(tokens_per_expert)
    n1 = (2 if gated else 1) * inter_per_gpu
    flops = 2.0 * rows * (n1 + inter_per_gpu) * hidden
    nbytes = (active * (n1 + inter_per_gpu) * hidden * w
              + rows * _row_bytes(hidden, inter_per_gpu, n1, a))
    return np.maximum(flops / moe_peak(gpu, key, peak), nbytes / gpu.hbm_bandwidth_Bps)


# ----------------------------------------------------------------------------- MLA

#: Projection weight dtypes of the MLA module -> (GEMM family, bytes per weight, peak).
MLA_GEMMS = {"fp8": ("fp8", 1, "fp8"), "fp8_block": ("fp8_block", 1, "fp8"),
             "nvfp4": ("fp4", 0.5, "fp4"), "fp4": ("fp4", 0.5, "fp4")}


def _gemm(gpu: GPUSpec, gemm_dtype: str, m, n, k):
    """One projection GEMM with the GPU's calibrated GEMM family of its dtype (block-scaled
    FP8 by its own fit where the GPU has one, else as FP8; a low-precision dtype the GPU
    has no tensor cores for runs as 16-bit)."""
    fam, w, peak = MLA_GEMMS.get(gemm_dtype, ("bf16", 2, "bf16"))
    if peak not in gpu.peak_flops:
        fam, w, peak = "bf16", 2, "bf16"
    low = fam != "bf16"
    return forms.gemm_time(m, n, k, gpu.calibration.gemm_for(fam), gpu.peak(peak),
                           gpu.hbm_bandwidth_Bps, gpu.sm_count, w, w if low else ACT, low)


def _mla_core(gpu, p: MLAParams, heads, tokens, pairs, seqs, kv_read_bytes, flops_per_pair):
    """Attention core: floor, per-sequence and per-(token, head) work, then the p-norm of
    the score FLOPs, the last query tile's serial key loop and the KV traffic."""
    h_eff = np.ceil(np.asarray(heads, float) / p.head_block) * p.head_block
    compute = pairs * h_eff * flops_per_pair / (gpu.peak("bf16") * p.compute_eff)
    # The last query tile of a causal prompt walks its (2 pairs / T) keys on one SM.
    serial = (2.0 * pairs / np.maximum(tokens, 1.0) * p.block_q * flops_per_pair
              * gpu.sm_count / (gpu.peak("bf16") * p.serial_eff))
    memory = kv_read_bytes / (gpu.hbm_bandwidth_Bps * p.bandwidth_eff)
    return (p.floor_s + (seqs * p.seq_sm_s + tokens * heads * p.token_head_sm_s) / gpu.sm_count
            + forms.combine(p.overlap, compute, serial, memory))


def _kv_bytes(kv_dtype: str) -> float:
    return 1.0 if kv_dtype == "fp8" else 2.0


def mla_absorbed_time(gpu: GPUSpec, heads_per_gpu, tokens, pairs, kv_read, seqs,
                      kv_dtype: str, gemm_dtype: str, hidden=7168, q_lora_rank=1536,
                      kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head=128):
    """The weight-absorbed MLA path (decode, and short prefill chunks), seconds.

    ``tokens`` queries, ``pairs`` (query, key) pairs, ``kv_read`` cached latent entries
    read (the ``tokens`` new ones are written and read on top).
    Projections: fused q_a/kv_a ``[T, h] x [h, q_l + c + r]``, q_b ``[T, q_l] x [q_l, n
    (d_n + r)]``, the absorbed W_UK ``n x [T, d_n] x [d_n, c]`` and W_UV ``n x [T, c] x [c,
    d_v]`` (each one batched GEMM, priced as ``[T, d_n] x [d_n, n c]`` and ``[T, c] x [c, n
    d_v]``: same FLOPs and weights) and o_proj ``[T, n d_v] x [n d_v, h]``. Core: ``2 (c +
    r) + 2c`` FLOPs per (pair, head) over the shared latent of ``(c + r) kv_bytes`` per
    entry.
    """
    n, T = np.asarray(heads_per_gpu, float), np.asarray(tokens, float)
    c, r = kv_lora_rank, qk_rope
    dims = (hidden, q_lora_rank, c, r, qk_nope, v_head)
    if n.ndim == 0 and T.ndim == 0:  # one shape: memoized (decode steps and runs)
        key = (id(gpu), gemm_dtype, float(T), float(n), dims)
        hit = _ABSORBED_PROJ.get(key)
        if hit is None or hit[0] is not gpu:
            if len(_ABSORBED_PROJ) >= PROJ_CACHE:
                _ABSORBED_PROJ.clear()
            hit = _ABSORBED_PROJ[key] = (gpu, _absorbed_proj(gpu, gemm_dtype, T, n, *dims))
        proj = hit[1]
    else:
        proj = _absorbed_proj(gpu, gemm_dtype, T, n, *dims)
    p = gpu.calibration.mla_for("decode", kv_dtype)
    nbytes = (np.asarray(kv_read, float) + T) * (c + r) * _kv_bytes(kv_dtype) \
        + T * n * (c + r + c) * ACT
    return proj + _mla_core(gpu, p, n, T, np.asarray(pairs, float), np.asarray(seqs, float),
                            nbytes, 2.0 * (c + r) + 2.0 * c)


#: Shapes of :data:`_ABSORBED_PROJ` kept before it starts over.
PROJ_CACHE = 1 << 16
#: ``(id(gpu), gemm dtype, T, n, dims) -> (gpu, seconds)``: the projections of
#: :func:`mla_absorbed_time` per scalar shape. The entry holds the GPU itself, so its id
#: cannot be reused by another object while the entry lives (GPUSpec holds dicts: it is
#: not hashable).
_ABSORBED_PROJ: dict[tuple, tuple[GPUSpec, float]] = {}


def _absorbed_proj(gpu: GPUSpec, gemm_dtype: str, T, n, hidden, q_lora_rank, c, r, qk_nope,
                   v_head):
    """The five projection GEMMs of :func:`mla_absorbed_time`, seconds."""
    return (_gemm(gpu, gemm_dtype, T, q_lora_rank + c + r, hidden)
            + _gemm(gpu, gemm_dtype, T, n * (qk_nope + r), q_lora_rank)
            + _gemm(gpu, "bf16", T, n * c, qk_nope) + _gemm(gpu, "bf16", T, n * v_head, c)
            + _gemm(gpu, gemm_dtype, T, hidden, n * v_head))


def mla_prefill_time(gpu: GPUSpec, heads_per_gpu, tokens, pairs, ctx, seqs, kv_dtype: str,
                     gemm_dtype: str, hidden=7168, q_lora_rank=1536, kv_lora_rank=512,
                     qk_nope=128, qk_rope=64, v_head=128):
    """Prefill through the MLA attention module of one layer on one GPU, seconds.

    Parameters
    ----------
    heads_per_gpu : int
        Attention heads on this GPU (``num_attention_heads / tp``), n.
    tokens, pairs, ctx, seqs : array_like
        Query tokens T, causal (query, key) pairs, cached tokens read, sequences (the step
        aggregates of :func:`forms.prefill_time`).
    kv_dtype, gemm_dtype : str
        Latent cache dtype (bf16 / fp8) and projection weight dtype (bf16 / fp8_block).
    hidden, q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head : int
        MLA dimensions (defaults: DeepSeek-V3).

    Notes
    -----
    Chunks whose mean length ``T / seqs`` is at most ``absorbed_max_q_len`` (vLLM: 512 with
    bf16 KV, 128 with FP8) take :func:`mla_absorbed_time`. Longer ones decompress K and V:
    projections q_a/kv_a, q_b, kv_b ``[T + ctx, c] x [c, n (d_n + d_v)]`` and o_proj, then
    ``2 (d_n + r) + 2 d_v`` FLOPs per (pair, head) and ``(T + ctx) n (d_n + r + d_v) 2 + T
    n (d_n + r + d_v) 2`` bytes of K, V, Q and O.
    """
    dims = dict(hidden=hidden, q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank,
                qk_nope=qk_nope, qk_rope=qk_rope, v_head=v_head)
    n, T, ctx, seqs = (np.asarray(x, float) for x in (heads_per_gpu, tokens, ctx, seqs))
    pairs = np.asarray(pairs, float)
    c, r = kv_lora_rank, qk_rope
    kv = T + ctx
    proj = (_gemm(gpu, gemm_dtype, T, q_lora_rank + c + r, hidden)
            + _gemm(gpu, gemm_dtype, T, n * (qk_nope + r), q_lora_rank)
            + _gemm(gpu, gemm_dtype, kv, n * (qk_nope + v_head), c)
            + _gemm(gpu, gemm_dtype, T, hidden, n * v_head))
    p = gpu.calibration.mla_for("prefill", kv_dtype)
    nbytes = (kv + T) * n * (qk_nope + r + v_head) * ACT + kv * (c + r) * _kv_bytes(kv_dtype)
    full = proj + _mla_core(gpu, p, n, T, pairs, seqs, nbytes,
                            2.0 * (qk_nope + r) + 2.0 * v_head)
    if not p.absorbed_max_q_len:
        return full
    absorbed = mla_absorbed_time(gpu, n, T, pairs, ctx, seqs, kv_dtype, gemm_dtype, **dims)
    return np.where(T / np.maximum(seqs, 1) <= p.absorbed_max_q_len, absorbed, full)


def mla_decode_time(gpu: GPUSpec, heads_per_gpu, seqs, decode_kv, kv_dtype: str,
                    gemm_dtype: str, hidden=7168, q_lora_rank=1536, kv_lora_rank=512,
                    qk_nope=128, qk_rope=64, v_head=128):
    """One decode step through the MLA attention module of one layer on one GPU, seconds.

    ``seqs`` sequences, one new token each, reading ``decode_kv`` latent entries in all
    (the new token's included): :func:`mla_absorbed_time` with ``T = seqs`` and ``pairs =
    decode_kv``. The latent cache holds ``kv_lora_rank + qk_rope`` values per token, shared
    by every head (576 for DeepSeek-V3).
    """
    seqs, decode_kv = np.asarray(seqs, float), np.asarray(decode_kv, float)
    return mla_absorbed_time(gpu, heads_per_gpu, seqs, decode_kv, decode_kv - seqs, seqs,
                             kv_dtype, gemm_dtype, hidden, q_lora_rank, kv_lora_rank,
                             qk_nope, qk_rope, v_head)


def mla_roofline(gpu: GPUSpec, heads_per_gpu, tokens, pairs, ctx, kv_dtype: str,
                 gemm_dtype: str, absorbed, hidden=7168, q_lora_rank=1536, kv_lora_rank=512,
                 qk_nope=128, qk_rope=64, v_head=128):
    """Roofline of the MLA module (either path): projection and score FLOPs at the peaks,
    projection weights and the latent cache at HBM bandwidth, whichever is longer."""
    n, T, pairs, ctx = (np.asarray(x, float) for x in (heads_per_gpu, tokens, pairs, ctx))
    c, r = kv_lora_rank, qk_rope
    fam, w, peak_dt = MLA_GEMMS.get(gemm_dtype, ("bf16", 2.0, "bf16"))
    lo = fam != "bf16" and peak_dt in gpu.peak_flops
    w = w if lo else 2.0
    big = [(q_lora_rank + c + r) * hidden, n * (qk_nope + r) * q_lora_rank,
           hidden * n * v_head]
    absorbed = np.asarray(absorbed, bool)
    small = np.where(absorbed, n * (qk_nope * c + c * v_head), 0.0)
    kvb = np.where(absorbed, 0.0, n * (qk_nope + v_head) * c)
    weights = sum(big) * w + small * ACT + kvb * w
    flops_lo = 2.0 * (T * sum(big) + np.where(absorbed, 0.0, (T + ctx) * kvb))
    score = np.where(absorbed, 2.0 * (c + r) + 2.0 * c, 2.0 * (qk_nope + r) + 2.0 * v_head)
    flops_hi = 2.0 * T * small + pairs * n * score
    peak_lo = gpu.peak(peak_dt if lo else "bf16")
    t_c = flops_lo / peak_lo + flops_hi / gpu.peak("bf16")
    t_m = (weights + (ctx + T) * (c + r) * _kv_bytes(kv_dtype)) / gpu.hbm_bandwidth_Bps
    return np.maximum(t_c, t_m)


# ----------------------------------------------------------------------------- all-to-all

def a2a_bytes(mode: str, tokens_per_rank, hidden: int, topk: int, experts: int, ep: int,
              bytes_per_elem: float):
    """Bytes one rank sends to OTHER ranks in one dispatch (a combine returns as many).

    ``normal`` sends each token once per distinct destination rank among its top-k experts;
    with uniform routing over ``experts`` split evenly over ``ep`` ranks the expected count
    of distinct ranks is ``ep (1 - C(E - E/ep, k) / C(E, k))``, of which ``(ep - 1) / ep``
    are remote. ``low_latency`` sends one copy per expert: ``k (ep - 1) / ep``. Bytes =
    ``tokens x hidden x bytes_per_elem x copies``.
    """
    kind = A2A_MODES[mode]
    if ep <= 1:
        return 0.0 * np.asarray(tokens_per_rank, float)
    if kind.endswith("low_latency"):
        copies = topk * (ep - 1) / ep
    else:
        copies = _distinct(ep, experts, topk) * (ep - 1) / ep
    return np.asarray(tokens_per_rank, float) * hidden * bytes_per_elem * copies


def _distinct(groups: int, experts: int, topk: int) -> float:
    """Expected distinct groups (of ``experts / groups`` experts each) among a token's
    top-k under uniform routing: ``G (1 - C(E - E/G, k) / C(E, k))``."""
    e, local = experts, experts // groups
    miss = math.exp(_lbinom(e - local, topk) - _lbinom(e, topk)) if e - local >= topk else 0.0
    return groups * (1.0 - miss)


def a2a_split_bytes(mode: str, tokens_per_rank, hidden: int, topk: int, experts: int,
                    ep: int, bytes_per_elem: float, ranks_per_node: int):
    """``(scale-up bytes, scale-out bytes)`` one rank sends when the EP group spans
    ``ep / ranks_per_node`` nodes (g ranks per node, N nodes).

    ``low_latency`` sends every expert copy straight to its rank: ``k (g - 1) / ep`` copies
    per token stay in the node, ``k (ep - g) / ep`` cross it. ``normal`` (DeepEP internode)
    sends a token once per distinct remote NODE over the network, ``D_N (N - 1) / N``
    copies with ``D_N`` the expected distinct nodes, and the NVLink forwarding inside the
    nodes reaches the ``D_ep`` distinct ranks: ``D_ep (g - 1) / g`` copies.
    """
    t = np.asarray(tokens_per_rank, float) * hidden * bytes_per_elem
    g = int(ranks_per_node)
    nodes = ep // g if g > 0 else 1
    if nodes <= 1:
        return a2a_bytes(mode, tokens_per_rank, hidden, topk, experts, ep, bytes_per_elem), 0 * t
    if A2A_MODES[mode].endswith("low_latency"):
        return t * topk * (g - 1) / ep, t * topk * (ep - g) / ep
    up = _distinct(ep, experts, topk) * (g - 1) / g
    out = _distinct(nodes, experts, topk) * (nodes - 1) / nodes
    return t * up, t * out


def _lbinom(n: int, k: int) -> float:
    # scipy on use: importing it costs every dense run 0.13 s of CPU.
    from scipy.special import gammaln  # noqa: PLC0415
    return float(gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1))


def a2a_time(mode: str, phase: str, tokens_per_rank, hidden: int, topk: int, experts: int,
             ep: int, link_bandwidth_Bps: float, gpu: GPUSpec, bytes_per_elem: float = 2.0,
             ranks_per_node: int | None = None, scale_up_Bps: float | None = None):
    """Seconds of one DeepEP dispatch or combine on one rank.

    Parameters
    ----------
    mode : {"normal", "low_latency"}
        DeepEP kernels: normal (high throughput, prefill) or low latency (decode).
    phase : {"dispatch", "combine"}
    tokens_per_rank : array_like
        Tokens this rank sends into dispatch (and gets back from combine).
    hidden, topk, experts, ep : int
        Hidden size, experts per token, routed experts, EP ranks.
    link_bandwidth_Bps : float
        Per-direction bandwidth of the slowest link on the path (NVLink 450 GB/s per
        H100; a NIC 50 GB/s across nodes), from the topology graph.
    bytes_per_elem : float
        Bytes per hidden element on the wire (2 for bf16, ~1 for FP8 with scales).
    ranks_per_node, scale_up_Bps : optional
        For an EP group spanning nodes: GPUs of the group per node and their NVLink
        bandwidth; ``link_bandwidth_Bps`` is then the network (NIC) bandwidth per GPU.

    Notes
    -----
    ``t = launch + tokens c_tok / S + a2a_bytes / (B eta_link)``: a fixed latency per mode
    and phase plus the bytes over the link bandwidth times a fitted fraction, which carries
    to other links by datasheet. Across nodes the two link classes run concurrently:
    ``max(up / (B_up eta_link), out / (B eta_link))`` with the bytes of
    :func:`a2a_split_bytes`.
    """
    p: AllToAllParams = gpu.calibration.alltoall_for(A2A_MODES[mode], phase)
    t = np.asarray(tokens_per_rank, float)
    fixed = p.launch_s + t * p.token_sm_s / gpu.sm_count
    if ranks_per_node and ranks_per_node < ep:
        up, out = a2a_split_bytes(mode, t, hidden, topk, experts, ep, bytes_per_elem,
                                  ranks_per_node)
        b_up = scale_up_Bps or link_bandwidth_Bps
        return fixed + np.maximum(up / (b_up * p.link_eff),
                                  out / (link_bandwidth_Bps * p.link_eff))
    nbytes = a2a_bytes(mode, t, hidden, topk, experts, ep, bytes_per_elem)
    return fixed + nbytes / (link_bandwidth_Bps * p.link_eff)


def a2a_roofline(mode: str, tokens_per_rank, hidden: int, topk: int, experts: int, ep: int,
                 link_bandwidth_Bps: float, bytes_per_elem: float = 2.0,
                 ranks_per_node: int | None = None, scale_up_Bps: float | None = None):
    """Roofline of :func:`a2a_time`: the bytes at the full link bandwidths."""
    if ranks_per_node and ranks_per_node < ep:
        up, out = a2a_split_bytes(mode, tokens_per_rank, hidden, topk, experts, ep,
                                  bytes_per_elem, ranks_per_node)
        return np.maximum(up / (scale_up_Bps or link_bandwidth_Bps), out / link_bandwidth_Bps)
    return a2a_bytes(mode, tokens_per_rank, hidden, topk, experts, ep,
                     bytes_per_elem) / link_bandwidth_Bps
