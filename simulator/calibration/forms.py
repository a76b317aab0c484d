"""Physical cost forms per operator family, vectorized over numpy arrays (or scalars).

Each form is a roofline (FLOPs / peak, bytes / bandwidth) times efficiencies <= 1, plus fixed
latencies >= 0, so no form beats the plain roofline; with the neutral parameters of
:mod:`simulator.calibration.params` each reduces to it exactly. The attention forms take the
step aggregates the engine keeps (tokens, causal pairs, cached context, decode KV, sequence
count), so the simulator and the calibration check evaluate the same model. Times are
seconds; see docs/cost-model.md for the formulas.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from simulator.calibration.params import (
    CollectiveParams,
    DecodeParams,
    GemmParams,
    PrefillParams,
)

ACT_BYTES = 2  # activations, Q and O stay in 16-bit
#: Kernels shrink their tiles for small M: (64, 64) up to 64 rows, (64, tile_n) up to 128.
SMALL_TILE = 64


def combine(p: float, *terms):
    """p-norm of non-negative times: ``(sum t_i^p)^(1/p)``; ``p = inf`` is their maximum.

    Models imperfect overlap of phases that run concurrently (loads and math): never less
    than the longest phase, never more than their sum (for p >= 1).
    """
    top = terms[0]
    for t in terms[1:]:
        top = np.maximum(top, t)
    if p == math.inf:
        return top
    safe = np.where(top > 0, top, 1.0)
    total = sum((t / safe) ** p for t in terms)
    return np.where(top > 0, safe * total ** (1.0 / p), 0.0)


def gemm_time(m, n, k, p: GemmParams, peak: float, bandwidth: float, sm_count: int,
              w_bytes: float, in_bytes: float = ACT_BYTES, quantize: bool = False):
    """One GEMM of ``[m, k] x [k, n]`` (m = tokens), seconds.

    Parameters
    ----------
    m, n, k : array_like
        Shape.
    p : GemmParams
    peak : float
        Tensor peak of the dtype the math runs in, FLOP/s.
    bandwidth : float
        HBM bandwidth, bytes/s.
    sm_count : int
        Streaming multiprocessors (waves of output tiles).
    w_bytes, in_bytes : float
        Bytes per weight element and per input activation element.
    quantize : bool
        Whether a pass quantizes the 16-bit activations first (W8A8 kernels).

    Notes
    -----
    ``t = launch + ||(T_c, T_m)||_p [+ T_q]``. Compute ``T_c`` is tile and wave quantized:
    ``ceil(tiles / SMs) * SMs * 2 tm tn k / (peak * eta_c)``, or, where the library splits K
    to fill the GPU, ``2mnk / (peak * eta_c) + t_split`` when that is faster. Memory
    ``T_m = (mk b_in + kn b_w + mn 2) / (BW * eta_b)``. The quantization pass reads 16-bit
    and writes ``b_in`` per element plus a per-row cost: ``T_q = m q_row / SMs +
    mk (2 + b_in) / (BW * eta_q)``.
    """
    if np.ndim(m) == 0 and np.ndim(n) == 0 and np.ndim(k) == 0:
        return _gemm_scalar(float(m), float(n), float(k), p, peak, bandwidth, sm_count,
                            w_bytes, in_bytes, quantize)
    return _gemm(m, n, k, p, peak, bandwidth, sm_count, w_bytes, in_bytes, quantize)


def _gemm(m, n, k, p: GemmParams, peak: float, bandwidth: float, sm_count: int,
          w_bytes: float, in_bytes: float, quantize: bool):
    """:func:`gemm_time` itself (arrays or scalars)."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    tm = np.where(m <= 2 * SMALL_TILE, min(p.tile_m, SMALL_TILE), p.tile_m)
    tn = np.where(m <= SMALL_TILE, min(p.tile_n, SMALL_TILE), p.tile_n)
    tiles = np.ceil(m / tm) * np.ceil(n / tn)
    rate = peak * p.compute_eff
    tiled = np.ceil(tiles / sm_count) * sm_count * (2.0 * tm * tn * k / rate)
    ideal = 2.0 * m * n * k / rate
    compute = np.minimum(tiled, ideal + p.split_k_s)
    memory = (m * k * in_bytes + k * n * w_bytes + m * n * ACT_BYTES) / (
        bandwidth * p.bandwidth_eff)
    t = p.launch_s + combine(p.overlap, compute, memory)
    if quantize and p.quant_bandwidth_eff > 0:
        t = t + m * p.quant_row_sm_s / sm_count + m * k * (ACT_BYTES + in_bytes) / (
            bandwidth * p.quant_bandwidth_eff)
    return t


#: :func:`gemm_time` of one shape (scalar m, n, k), memoized: the step cost models price
#: the same few projection shapes at every step and for every candidate of a plan. The
#: cached value is the np.float64 that ``_gemm`` returns for those numbers (immutable).
_gemm_scalar = lru_cache(maxsize=1 << 16)(_gemm)


class AttentionShape:
    """Per-GPU attention shape of one layer and the GPU numbers the forms need.

    Parameters
    ----------
    q_heads, kv_heads, head_dim : int
        Heads on this GPU (already divided by TP) and head dimension.
    kv_bytes : float
        Bytes per KV-cache element.
    peak, bandwidth : float
        16-bit tensor peak (FLOP/s) and HBM bandwidth (bytes/s).
    sm_count : int
    """

    def __init__(self, q_heads: int, kv_heads: int, head_dim: int, kv_bytes: float,
                 peak: float, bandwidth: float, sm_count: int):
        self.hq, self.hk, self.d = q_heads, kv_heads, head_dim
        self.kv_token_bytes = 2 * kv_heads * head_dim * kv_bytes  # K and V of one token
        self.qo_token_bytes = 2 * q_heads * head_dim * ACT_BYTES  # Q read, O written
        self.peak, self.bandwidth, self.sms = peak, bandwidth, sm_count

    def prefill_coeffs(self, p: PrefillParams) -> tuple:
        """Seconds per unit of each aggregate, for :func:`prefill_time` and the engine."""
        s, bw = self.sms, self.bandwidth * p.bandwidth_eff
        pair = self.hq * (4.0 * self.d / (self.peak * p.compute_eff) + p.exp_sm_s / s)
        # The last query tile walks all its keys on one SM (K of prefill_time: 2 pairs /
        # tokens for a causal prompt from scratch), at 4 * block_q * d FLOPs per key.
        serial = (2.0 * 4.0 * p.block_q * self.d * s / (self.peak * p.serial_eff)
                  if p.block_q else 0.0)
        token = (self.hq * p.token_head_sm_s + self.hk * p.token_kv_head_sm_s) / s
        return (p.floor_s, self.hk * p.seq_head_sm_s / s, token, pair, p.block_k / 2.0,
                serial, self.qo_token_bytes / bw, self.kv_token_bytes / bw, p.overlap)

    def decode_coeffs(self, p: DecodeParams) -> tuple:
        """Seconds per unit of each aggregate, for :func:`decode_time` and the engine."""
        bw = self.bandwidth * p.bandwidth_eff
        seq = p.seq_sm_s + self.hk * (p.seq_head_sm_s + self.d * p.seq_head_dim_sm_s)
        return (p.floor_s, seq / self.sms,
                4.0 * self.hq * self.d / (self.peak * p.compute_eff),
                self.kv_token_bytes / bw, (self.qo_token_bytes + self.kv_token_bytes) / bw,
                p.exposed)


def prefill_time(shape: AttentionShape, p: PrefillParams, tokens, pairs, ctx, seqs):
    """Prefill attention of one layer over a batch of prompt chunks, seconds.

    Parameters
    ----------
    tokens : array_like
        Query tokens (their Q read, O written and K/V written).
    pairs : array_like
        Causal (query, key) pairs, ``sum x (c + (x + 1) / 2)`` over chunks.
    ctx : array_like
        Cached tokens the chunks read.
    seqs : array_like
        Sequences.

    Notes
    -----
    ``t = floor + seqs n_kv c_s + tokens (n_q c_t + n_kv c_tk) + ||(T_c, T_serial, T_m)||_p``
    ``T_c = (pairs + tokens b_k / 2) n_q (4d / (peak eta_c) + c_exp)``,
    ``T_serial = K 4 b_q d / (peak / SMs * eta_s)`` and ``T_m = (tokens (Q + O) + (ctx +
    tokens) KV) / (BW * eta_b)``.

    ``K`` is the key loop of a chunk's last query tile, ``c + x`` for a chunk of ``x``
    tokens after ``c`` cached ones. From the aggregates: ``K = 2 pairs / tokens - ctx /
    seqs`` (``2 pairs / tokens = 2c + x + 1`` for one chunk: its mean query row sees ``c +
    (x + 1) / 2`` keys), exact for one chunk and for equal chunks, and at least ``pairs /
    tokens`` (the mean row's keys) when ``seqs`` undercounts the chunks. Without cached
    tokens ``K = 2 pairs / tokens``, as the H100 fit (prompts from scratch) saw it.
    """
    floor, seq, tok, pair, waste, serial, qo, kv, ov = shape.prefill_coeffs(p)
    tokens, pairs, ctx, seqs = (np.asarray(x, dtype=float) for x in (tokens, pairs, ctx, seqs))
    compute = (pairs + tokens * waste) * pair
    per = pairs / np.maximum(tokens, 1.0)  # half of K without cached tokens
    crit = serial * np.maximum(per - ctx / (2.0 * np.maximum(seqs, 1.0)), 0.5 * per)
    memory = qo * tokens + kv * (ctx + tokens)
    return floor + seq * seqs + tok * tokens + combine(ov, compute, crit, memory)


def decode_time(shape: AttentionShape, p: DecodeParams, seqs, decode_kv, io_tokens=None):
    """Decode attention of one layer: ``seqs`` sequences reading ``decode_kv`` KV entries.

    ``io_tokens`` (default ``seqs``) are the tokens whose Q, O and new K/V this kernel
    moves. ``t = floor + max(T_seq, T_kv) + x min(T_seq, T_kv)`` with per-sequence work
    ``T_seq = seqs (c_seq + n_kv (c_head + d c_dim)) / SMs``, the KV stream ``T_kv =
    max(4 n_q d kv / (peak eta_c), (io (Q + O + KV) + kv KV) / (BW eta_b))`` and ``x`` the
    exposed share of the shorter one (no powers: the engine's vectorized decode runs
    evaluate the same operations bit for bit).
    """
    floor, seq, flop, kv_s, tok, exposed = shape.decode_coeffs(p)
    seqs, decode_kv = np.asarray(seqs, dtype=float), np.asarray(decode_kv, dtype=float)
    io = seqs if io_tokens is None else np.asarray(io_tokens, dtype=float)
    per = seq * seqs
    stream = np.maximum(kv_s * decode_kv + tok * io, flop * decode_kv)
    return floor + np.maximum(per, stream) + exposed * np.minimum(per, stream)


def allreduce_times(p: CollectiveParams, ranks: int, bandwidth: float, latency: float,
                    in_switch: bool) -> dict[str, tuple[float, float]]:
    """``(alpha_s, beta_s_per_byte)`` of each available all-reduce algorithm.

    Parameters
    ----------
    ranks : int
        GPUs in the group (n).
    bandwidth, latency : float
        Slowest link bandwidth (bytes/s, per direction) and largest wire latency (s)
        between neighbours of the group.
    in_switch : bool
        Whether the switch can reduce (NVLink SHARP on NVSwitch 3 and later).

    Notes
    -----
    Ring: ``t0 + 2(n-1)(a + s) + 2(n-1)/n S / (B eta)``; tree: ``t0 + 2 ceil(log2 n)(a + s)
    + 2 S / (B eta)``; NVLS: ``t0 + a + S / (B eta)`` (each GPU sends and receives S once);
    custom one-shot: ``t0 + a + s + (n-1) S / (B eta)`` (each GPU reads every peer's
    buffer); two-shot: ``t0 + 2(a + s) + 2(n-1)/n S / (B eta)``. NCCL takes the fastest of
    ring, tree and NVLS per size; vLLM takes the faster custom one below its size limit.
    """
    n, b, a = ranks, bandwidth, latency
    out = {"ring": (p.ring_launch_s + 2 * (n - 1) * (a + p.ring_step_s),
                    2 * (n - 1) / n / (b * p.ring_eff))}
    if p.tree_launch_s < math.inf:
        steps = 2 * math.ceil(math.log2(n))
        out["tree"] = (p.tree_launch_s + steps * (a + p.tree_step_s), 2 / (b * p.tree_eff))
    if in_switch and p.nvls_launch_s < math.inf:
        out["nvls"] = (p.nvls_launch_s + a, 1 / (b * p.nvls_eff))
    if p.custom_launch_s < math.inf:
        out["one_shot"] = (p.custom_launch_s + a + p.custom_step_s,
                           (n - 1) / (b * p.custom_eff))
        out["two_shot"] = (p.custom_launch_s + 2 * (a + p.custom_step_s),
                           2 * (n - 1) / n / (b * p.custom_eff))
    return out


NCCL = ("ring", "tree", "nvls")
CUSTOM = ("one_shot", "two_shot")


def _half_ring(p: CollectiveParams, op: str, n: int, latency: float) -> tuple[float, float]:
    """``(alpha, beta)`` of a ring all-gather / reduce-scatter (``gather_*``) or all-to-all
    (``alltoall_*``): n - 1 steps, each GPU moves (n-1)/n of the buffer."""
    launch, step, eff = ((p.alltoall_launch_s, p.alltoall_step_s, p.alltoall_eff)
                         if op == "alltoall" else
                         (p.gather_launch_s, p.gather_step_s, p.gather_eff))
    if launch == math.inf:
        launch, step, eff = p.ring_launch_s, p.ring_step_s, p.ring_eff
    return launch + (n - 1) * (latency + step), (n - 1) / n / eff


def collective_time(p: CollectiveParams, op: str, ranks, nbytes, bandwidth: float,
                    latency: float, in_switch, custom: bool = False, eager=False):
    """Vectorized time of one collective of ``nbytes`` (the whole buffer) over ``ranks``.

    ``op`` is ``all_reduce`` (fastest of :func:`allreduce_times`), ``all_gather``,
    ``reduce_scatter`` (ring, or in the switch: ``t0 + a + (n-1)/n S / (B eta)``) or
    ``alltoall`` (pairwise). ``custom`` prices vLLM's custom all-reduce (``eager`` adds its
    copy into the shared buffer without CUDA graphs).
    """
    ranks, nbytes = np.asarray(ranks, dtype=float), np.asarray(nbytes, dtype=float)
    in_switch = np.broadcast_to(np.asarray(in_switch, dtype=bool), ranks.shape)
    best = np.full(np.broadcast(ranks, nbytes).shape, np.inf)
    for n in np.unique(ranks):
        for sw in (False, True):
            sel = (ranks == n) & (in_switch == sw)
            if not sel.any():
                continue
            algos = allreduce_times(p, int(n), bandwidth, latency, bool(sw))
            if op == "all_reduce":
                names = CUSTOM if custom else NCCL
                options = [algos[k] for k in names if k in algos]
            else:
                a, b = _half_ring(p, op, int(n), latency)
                options = [(a, b / bandwidth)]
                if "nvls" in algos and op != "alltoall":
                    options.append((algos["nvls"][0], algos["nvls"][1] * (n - 1) / n))
            for alpha, beta in options:
                best = np.where(sel, np.minimum(best, alpha + beta * nbytes), best)
    if custom:
        best = best + np.where(np.asarray(eager, dtype=bool), p.custom_eager_s, 0.0)
    return best
