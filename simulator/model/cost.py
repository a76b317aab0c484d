"""Step cost of one pipeline stage: a roofline per operator, scaled by achieved efficiency.

Each operator's time is ``max(FLOPs / (peak * eta_c), bytes / (HBM_BW * eta_b))`` on one GPU
of the stage's TP group (REFERENCE.md section 1). Per layer: four GEMMs (QKV, output, gate-up,
down), one attention kernel over the mixed batch (causal prefill chunks plus decode KV reads,
with a per-kernel floor), elementwise ops (norms, rotary, activation, residuals), and two TP
all-reduces of ``T * h * b_act`` bytes. The first stage adds the embedding lookup, the last
the LM head over the sequences that sample. All efficiencies are <= 1 and all extras >= 0,
so no step beats :func:`roofline_time`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.hardware.specs import GPUSpec
from simulator.model.spec import BYTES_PER_DTYPE, ModelSpec, kv_heads_per_gpu
from simulator.parallel.collective import AllReduceCost

ACT_BYTES = 2  # activations stay in 16-bit


@dataclass(frozen=True)
class Work:
    """FLOPs and bytes of one operator (or a sum of operators) on one GPU."""

    flops: float
    bytes: float

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.bytes + other.bytes)


def gemm_work(m: int, n: int, k: int, w_bytes: float) -> Work:
    """[m,k] x [k,n]: 2mnk FLOPs; activations in, weights, activations out."""
    return Work(2.0 * m * n * k, m * k * ACT_BYTES + k * n * w_bytes + m * n * ACT_BYTES)


class LayerShapes:
    """Per-GPU GEMM shapes and per-token byte counts of one layer at TP degree ``tp``."""

    def __init__(self, model: ModelSpec, tp: int, weight_dtype: str, kv_dtype: str):
        self.model, self.tp = model, tp
        self.w_bytes = BYTES_PER_DTYPE[weight_dtype]
        self.kv_bytes = BYTES_PER_DTYPE[kv_dtype]
        d, h = model.head_dim, model.hidden
        self.q_heads = model.q_heads // tp
        self.kv_heads = kv_heads_per_gpu(model.kv_heads, tp)
        mlp_up = (2 if model.gated_mlp else 1) * model.intermediate // tp
        # (n, k) of the four GEMMs; m is the token count.
        self.gemms = (((self.q_heads + 2 * self.kv_heads) * d, h),
                      (h, self.q_heads * d),
                      (mlp_up, h),
                      (h, model.intermediate // tp))
        # Elementwise bytes per token: two norms (read+write h), two residual adds (2 reads,
        # 1 write), rotary on q and k, activation (read gate and up, write one).
        self.elementwise_bytes_per_token = ACT_BYTES * (
            4 * h + 6 * h + 2 * (self.q_heads + self.kv_heads) * d
            + 3 * model.intermediate // tp)
        self.kv_bytes_per_token = 2 * self.kv_heads * d * self.kv_bytes
        self.attn_flops_per_pair = 4.0 * self.q_heads * d  # QK^T and PV per (query, key)

    def gemm_works(self, tokens: int) -> list[Work]:
        return [gemm_work(tokens, n, k, self.w_bytes) for n, k in self.gemms]

    def attention_work(self, tokens: int, prefill_pairs: float, prefill_ctx: float,
                       decode_kv: float) -> Work:
        """Attention over one layer.

        ``prefill_pairs`` is the causal (query, key) pair count of the prefill chunks,
        sum of ``x*(c + (x+1)/2)`` for a chunk of x tokens after c cached ones, and
        ``prefill_ctx`` the sum of those c (cached KV the chunks read); ``decode_kv`` is the
        sum of KV lengths read by decoding sequences (including the new token). New K and V
        of every token are written once; the chunk's own K and V are read from on-chip memory.
        """
        flops = self.attn_flops_per_pair * (prefill_pairs + decode_kv)
        qo = 2 * tokens * self.q_heads * self.model.head_dim * ACT_BYTES
        kv_read = (decode_kv + prefill_ctx) * self.kv_bytes_per_token
        kv_write = tokens * self.kv_bytes_per_token
        return Work(flops, qo + kv_read + kv_write)


def roofline(work: Work, peak: float, bandwidth: float) -> float:
    return max(work.flops / peak, work.bytes / bandwidth)


class StageCost:
    """Time of one step on one pipeline stage: ``(compute_s, comm_s)``.

    Parameters
    ----------
    model, gpu : ModelSpec, GPUSpec
    tp : int
        TP degree of the stage.
    layers : int
        Transformer layers held by the stage.
    first, last : bool
        Whether the stage embeds tokens / runs the LM head.
    allreduce : AllReduceCost
        Cost of one all-reduce over the stage's TP group.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int, layers: int, first: bool,
                 last: bool, weight_dtype: str, kv_dtype: str, allreduce: AllReduceCost):
        self.shapes = LayerShapes(model, tp, weight_dtype, kv_dtype)
        self.layers, self.first, self.last = layers, first, last
        self.allreduce = allreduce
        eff = gpu.efficiency
        self.eff = eff
        self.gemm_peak = gpu.peak(weight_dtype) * eff.gemm_compute
        self.gemm_bw = gpu.hbm_bandwidth_Bps * eff.gemm_bandwidth
        self.attn_peak = gpu.peak("bf16") * eff.attention_compute
        self.attn_bw = gpu.hbm_bandwidth_Bps * eff.attention_bandwidth
        self.elem_bw = gpu.hbm_bandwidth_Bps * eff.elementwise_bandwidth
        self.hidden_bytes = model.hidden * ACT_BYTES
        self.vocab_shard = model.vocab // tp
        self._head: dict[int, tuple[float, float]] = {}

        # Attention seconds per unit: (query, key) pair, Q/O byte per token, KV entry.
        sh = self.shapes
        self._pair_s = sh.attn_flops_per_pair / self.attn_peak
        self._qo_s = 2 * sh.q_heads * model.head_dim * ACT_BYTES / self.attn_bw
        self._kv_s = sh.kv_bytes_per_token / self.attn_bw
        self._floor = eff.attention_decode_floor_s
        self._fixed: dict[int, tuple[float, float]] = {}

    def dense_layer_time(self, tokens: int) -> float:
        """GEMMs and elementwise ops of one layer for ``tokens`` tokens."""
        s = self.shapes
        t = sum(roofline(w, self.gemm_peak, self.gemm_bw) for w in s.gemm_works(tokens))
        return t + tokens * s.elementwise_bytes_per_token / self.elem_bw

    def _fixed_time(self, tokens: int) -> tuple[float, float]:
        """Parts that depend on the token count only (cached): dense layers, embedding, and
        the 2 all-reduces per layer."""
        compute = self.layers * self.dense_layer_time(tokens)
        if self.first:
            compute += tokens * self.hidden_bytes / self.elem_bw
        comm = 2 * self.layers * self.allreduce.time(tokens * self.hidden_bytes)
        self._fixed[tokens] = (compute, comm)
        return compute, comm

    def head_time(self, sampled: int) -> tuple[float, float]:
        """LM head GEMM and final norm (compute), logits gather to the driver (comm)."""
        t = self._head.get(sampled)
        if t is None:
            w = gemm_work(sampled, self.vocab_shard, self.shapes.model.hidden,
                          self.shapes.w_bytes)
            compute = roofline(w, self.gemm_peak, self.gemm_bw)
            compute += sampled * 2 * self.hidden_bytes / self.elem_bw
            gather = 0.5 * self.allreduce.time(sampled * self.vocab_shard * ACT_BYTES)
            t = (compute, gather)
            self._head[sampled] = t
        return t

    def step(self, tokens: int, prefill_pairs: float, prefill_ctx: float, decode_kv: float,
             sampled: int) -> tuple[float, float]:
        """Compute and communication seconds of this stage for one micro-batch.

        Parameters
        ----------
        tokens : int
            Tokens in the step: prefill chunk tokens plus one per decoding sequence.
        prefill_pairs, prefill_ctx : float
            Causal attention pairs of the prefill chunks and the cached tokens they read
            (see ``LayerShapes.attention_work``).
        decode_kv : float
            Sum of KV lengths read by the decoding sequences.
        sampled : int
            Sequences that sample a token at the end of the step.

        Notes
        -----
        The attention kernel is ``max(floor, FLOPs / peak, bytes / bandwidth)`` with the
        FLOPs and bytes of ``LayerShapes.attention_work``, expanded here because this runs
        once per simulated step.
        """
        if tokens <= 0:
            return 0.0, 0.0
        fixed = self._fixed.get(tokens) or self._fixed_time(tokens)
        attn = max(self._floor, self._pair_s * (prefill_pairs + decode_kv),
                   self._qo_s * tokens + self._kv_s * (decode_kv + prefill_ctx + tokens))
        compute = fixed[0] + self.layers * attn
        comm = fixed[1]
        if self.last and sampled:
            c, g = self._head.get(sampled) or self.head_time(sampled)
            return compute + c, comm + g
        return compute, comm


    def decode_steps(self, n: int, decode_kv: np.ndarray) -> tuple[np.ndarray, float]:
        """:meth:`step` for many decode-only steps of ``n`` sequences at once.

        Evaluates the same expressions in the same order, element-wise, so each element is
        bit-identical to ``step(n, 0.0, 0, decode_kv[j], n)``. Returns the compute times and
        the (constant) communication time.
        """
        fixed = self._fixed.get(n) or self._fixed_time(n)
        # In place, in step()'s order (x + y == y + x exactly; int KV counts convert exactly).
        attn = self._pair_s * decode_kv
        np.maximum(attn, self._floor, out=attn)
        mem = self._kv_s * (decode_kv + n)
        mem += self._qo_s * n
        np.maximum(attn, mem, out=attn)
        attn *= self.layers
        attn += fixed[0]
        comm = fixed[1]
        if self.last and n:
            c, g = self._head.get(n) or self.head_time(n)
            attn += c
            return attn, comm + g
        return attn, comm


def roofline_time(model: ModelSpec, gpu: GPUSpec, tp: int, weight_dtype: str, kv_dtype: str,
                  tokens: int, prefill_pairs: float, prefill_ctx: float, decode_kv: float,
                  sampled: int) -> float:
    """Lower bound of a whole forward step: total FLOPs / peak vs total bytes / HBM bandwidth.

    Sums every layer's GEMM, attention and LM head work on one GPU and takes the larger of
    compute and memory time, with no efficiency loss, no floors and no communication.
    """
    s = LayerShapes(model, tp, weight_dtype, kv_dtype)
    per_layer = Work(0.0, 0.0)
    for w in s.gemm_works(tokens):
        per_layer = per_layer + w
    per_layer = per_layer + s.attention_work(tokens, prefill_pairs, prefill_ctx, decode_kv)
    total = Work(per_layer.flops * model.layers, per_layer.bytes * model.layers)
    if sampled:
        total = total + gemm_work(sampled, model.vocab // tp, model.hidden, s.w_bytes)
    return max(total.flops / gpu.peak(weight_dtype), total.bytes / gpu.hbm_bandwidth_Bps)
