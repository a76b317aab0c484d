"""Step cost of one pipeline stage from the calibrated operator forms (docs/cost-model.md).

Per layer, on one GPU of the stage's TP group: four GEMMs (QKV, output, gate-up, down), each
priced by :func:`simulator.calibration.forms.gemm_time` (roofline with tile and wave
quantization, launch latency, activation quantization for W8A8 dtypes); the attention
kernels over the mixed batch (prefill chunks and decodes run as separate kernels, as in
vLLM 0.6); the elementwise kernels (norms, rotary, activation, residual adds, KV writes);
and two TP all-reduces of ``T * h * b_act`` bytes. The first stage adds the embedding
lookup, the last the LM head over the sequences that sample. Every efficiency is <= 1 and
every added latency >= 0, so no step beats :func:`roofline_time`.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from simulator.calibration.forms import ACT_BYTES, AttentionShape, gemm_time
from simulator.calibration.params import ACTIVATION_QUANTIZED
from simulator.hardware.specs import GPUSpec
from simulator.model.spec import BYTES_PER_DTYPE, ModelSpec, kv_heads_per_gpu
from simulator.parallel.collective import AllReduceCost

#: Elementwise kernels per layer in vLLM: fused residual-add + RMSNorm (x2), rotary, KV-cache
#: write, SiLU-and-mul. Each pays at least the GPU's shortest kernel time.
ELEMENTWISE_KERNELS = 5


@dataclass(frozen=True)
class Work:
    """FLOPs and bytes of one operator (or a sum of operators) on one GPU."""

    flops: float
    bytes: float

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.bytes + other.bytes)


def gemm_work(m: int, n: int, k: int, w_bytes: float, in_bytes: float = ACT_BYTES) -> Work:
    """[m,k] x [k,n]: 2mnk FLOPs; activations in, weights, activations out (16-bit)."""
    return Work(2.0 * m * n * k, m * k * in_bytes + k * n * w_bytes + m * n * ACT_BYTES)


class LayerShapes:
    """Per-GPU GEMM shapes and per-token byte counts of one layer at TP degree ``tp``."""

    def __init__(self, model: ModelSpec, tp: int, weight_dtype: str, kv_dtype: str):
        self.model, self.tp = model, tp
        self.w_bytes = BYTES_PER_DTYPE[weight_dtype]
        self.kv_bytes = BYTES_PER_DTYPE[kv_dtype]
        # W8A8 / W4A4 GEMMs read quantized activations; weight-only int4 reads 16-bit ones.
        self.quantized = weight_dtype in ACTIVATION_QUANTIZED
        self.in_bytes = self.w_bytes if self.quantized else ACT_BYTES
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
        return [gemm_work(tokens, n, k, self.w_bytes, self.in_bytes) for n, k in self.gemms]

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


def _pnorm(p: float, a: float, b: float, c: float) -> float:
    """Scalar :func:`simulator.calibration.forms.combine` of three times (hot path)."""
    top = max(a, b, c)
    if p == math.inf or top <= 0.0:
        return top
    return top * ((a / top) ** p + (b / top) ** p + (c / top) ** p) ** (1.0 / p)


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
    weight_dtype, kv_dtype : str
    allreduce : AllReduceCost
        Cost of one all-reduce over the stage's TP group.
    layer_launch_s : float
        CPU time to launch one layer's kernels when the engine runs without CUDA graphs;
        the stage then takes at least ``layers * layer_launch_s`` (launches are
        asynchronous, so CPU and GPU time overlap). 0 with CUDA graphs.
    graph_sizes : tuple of int
        Token counts the engine captured CUDA graphs for, ascending (empty: graphs are not
        modelled, every step runs at its own size). A step that a graph covers runs its
        dense kernels and all-reduces padded up to the next captured size and pays no
        launch floor; a larger one runs eagerly (``layer_launch_s`` applies). See
        :meth:`graph_tokens`.
    graph_mixed : bool
        Whether graphs also cover steps with prefill tokens (vLLM V1's piecewise graphs
        are keyed by token count); else decode-only steps only (vLLM 0.6).
    cpu_floor_s : float
        CPU time per step that overlaps the GPU step (async scheduling): the stage's
        compute then takes at least this long, graphed or not.
    host_seq_s, host_token_s : float
        The engine's host CPU time per step that grows with the step: seconds per
        scheduled sequence (``seqs``, else ``sampled``: scheduling, sampling,
        detokenization, output streaming) and per scheduled token (input preparation).
        Overlapped (``host_inline`` false) they raise the CPU floor to
        ``cpu_floor_s + host``; in line they add to the compute. 0: a constant CPU step.
    host_inline : bool
        Whether the CPU's per-step work runs in line with the GPU (no async scheduling),
        so the step takes GPU + host instead of max(GPU, host).
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int, layers: int, first: bool,
                 last: bool, weight_dtype: str, kv_dtype: str, allreduce: AllReduceCost,
                 layer_launch_s: float = 0.0, graph_sizes: tuple[int, ...] = (),
                 graph_mixed: bool = False, cpu_floor_s: float = 0.0,
                 host_seq_s: float = 0.0, host_token_s: float = 0.0,
                 host_inline: bool = False):
        self.shapes = sh = LayerShapes(model, tp, weight_dtype, kv_dtype)
        self.gpu, self.weight_dtype = gpu, weight_dtype
        self.layers, self.first, self.last = layers, first, last
        self.allreduce = allreduce
        cal = gpu.calibration
        self.gemm_params, self.head_params = cal.gemm_for(weight_dtype), cal.gemm_for("bf16")
        self.gemm_peak, self.bf16_peak = gpu.peak(weight_dtype), gpu.peak("bf16")
        elem = cal.elementwise
        self.elem_bw = gpu.hbm_bandwidth_Bps * elem.bandwidth_eff
        self.elem_launch = ELEMENTWISE_KERNELS * elem.launch_s
        self.hidden_bytes = model.hidden * ACT_BYTES
        self.vocab_shard = model.vocab // tp
        self._launch = max(layers * layer_launch_s, cpu_floor_s)
        self._cpu = cpu_floor_s
        self._hseq, self._htok, self._hinline = host_seq_s, host_token_s, host_inline
        self._hvar = bool(host_seq_s or host_token_s)  # off: the constant CPU step only
        self.graph_sizes, self.graph_mixed = tuple(graph_sizes), graph_mixed
        self._head: dict[int, tuple[float, float]] = {}
        self._fixed: dict[int, tuple[float, float]] = {}
        # Attention: seconds per unit of each step aggregate (forms.prefill/decode_time).
        shape = AttentionShape(sh.q_heads, sh.kv_heads, model.head_dim, sh.kv_bytes,
                               self.bf16_peak, gpu.hbm_bandwidth_Bps, gpu.sm_count)
        (self._pfloor, self._pseq, self._ptok, self._ppair, self._pwaste, self._pserial,
         self._pqo, self._pkv, self._pp) = shape.prefill_coeffs(
            cal.prefill_for(kv_dtype))
        (self._dfloor, self._dseq, self._dflop, self._dkv, self._dtok,
         self._dexp) = shape.decode_coeffs(
            cal.decode_for(kv_dtype))

    def graph_tokens(self, tokens: int, decode_only: bool) -> tuple[int, float]:
        """Token count the step's dense kernels run at, and its CPU launch floor (s).

        A step covered by a captured CUDA graph (``tokens`` <= the largest captured size,
        and decode-only unless ``graph_mixed``) replays the graph of the smallest captured
        size >= ``tokens``: GEMMs, elementwise kernels and all-reduces process the padded
        rows, launches cost nothing on the CPU (only ``cpu_floor_s`` applies). Attention and
        the LM head see the real sequences only (padded slots have no KV; logits are taken
        at the sampled rows).
        Without captured sizes every step runs at its own size with the launch floor.
        """
        sizes = self.graph_sizes
        if not sizes or tokens > sizes[-1] or not (decode_only or self.graph_mixed):
            return tokens, self._launch
        return sizes[bisect.bisect_left(sizes, tokens)], self._cpu

    def host_terms(self, launch: float, seqs: int, tokens: int) -> tuple[float, float]:
        """The CPU floor and the in-line compute addition of a step of ``seqs`` sequences
        and ``tokens`` tokens, given its constant floor ``launch`` (:meth:`graph_tokens`).

        The host's variable work is ``h = host_seq_s * seqs + host_token_s * tokens``.
        Overlapped, the step's CPU time is ``cpu_floor_s + h`` and the floor becomes
        ``max(launch, cpu_floor_s + h)``; in line, the step takes ``h`` more.
        """
        h = self._hseq * seqs + self._htok * tokens
        if self._hinline:
            return launch, h
        return max(launch, self._cpu + h), 0.0

    def gemm_time(self, tokens: int, n: int, k: int) -> float:
        """One of the layer's GEMMs at ``tokens`` rows, in the weight dtype."""
        sh, gpu = self.shapes, self.gpu
        return float(gemm_time(tokens, n, k, self.gemm_params, self.gemm_peak,
                               gpu.hbm_bandwidth_Bps, gpu.sm_count, sh.w_bytes, sh.in_bytes,
                               sh.quantized))

    def dense_layer_time(self, tokens: int) -> float:
        """GEMMs and elementwise kernels of one layer for ``tokens`` tokens."""
        s = self.shapes
        t = sum(self.gemm_time(tokens, n, k) for n, k in s.gemms)
        return t + self.elem_launch + tokens * s.elementwise_bytes_per_token / self.elem_bw

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
        """LM head GEMM (16-bit) and final norm (compute), logits gather to the driver."""
        t = self._head.get(sampled)
        if t is None:
            gpu = self.gpu
            compute = float(gemm_time(sampled, self.vocab_shard, self.shapes.model.hidden,
                                      self.head_params, self.bf16_peak, gpu.hbm_bandwidth_Bps,
                                      gpu.sm_count, ACT_BYTES))
            compute += sampled * 2 * self.hidden_bytes / self.elem_bw
            gather = 0.5 * self.allreduce.time(sampled * self.vocab_shard * ACT_BYTES)
            t = (compute, gather)
            self._head[sampled] = t
        return t

    def prefill_attention(self, tokens: int, pairs: float, ctx: float, seqs: int) -> float:
        """:func:`simulator.calibration.forms.prefill_time` of one layer (scalar)."""
        compute = (pairs + tokens * self._pwaste) * self._ppair
        per = pairs / tokens  # the last query tile's key loop (forms.prefill_time)
        serial = self._pserial * (max(per - ctx / (2.0 * seqs), 0.5 * per) if ctx else per)
        memory = self._pqo * tokens + self._pkv * (ctx + tokens)
        return (self._pfloor + self._pseq * seqs + self._ptok * tokens
                + _pnorm(self._pp, compute, serial, memory))

    def _decode(self, seqs: int, stream: float) -> float:
        """Decode kernel of one layer from its KV-stream time (forms.decode_time)."""
        per = self._dseq * seqs
        return (self._dfloor + max(per, stream)) + self._dexp * min(per, stream)

    def step(self, tokens: int, prefill_pairs: float, prefill_ctx: float, decode_kv: float,
             sampled: int, seqs: int = 0) -> tuple[float, float]:
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
        seqs : int, optional
            Sequences of the prefill kernel when the caller knows them (speculative
            verification: every decoder is a chunk of k + 1 tokens, while ``sampled``
            counts its k + 1 positions); 0: one in a mixed step, else ``sampled``.

        Notes
        -----
        Prefill chunks and decodes run as separate attention kernels. The prefill kernel
        moves every token's Q, O and new K/V; in a mixed step it counts one sequence (its
        per-sequence cost is tens of ns) and the decode kernel the ``sampled`` ones. The
        decode kernel is :func:`~simulator.calibration.forms.decode_time` written out,
        in the order :meth:`decode_steps` evaluates it.
        """
        if tokens <= 0:
            return 0.0, 0.0
        padded, launch = self.graph_tokens(tokens, not prefill_pairs)
        fixed = self._fixed.get(padded) or self._fixed_time(padded)
        if prefill_pairs:
            attn = self.prefill_attention(tokens, prefill_pairs, prefill_ctx,
                                          seqs or (1 if decode_kv or not sampled else sampled))
            if decode_kv:
                attn += self._decode(sampled, max(self._dkv * decode_kv,
                                                  self._dflop * decode_kv))
        else:
            attn = self._decode(sampled, max(self._dkv * decode_kv + self._dtok * tokens,
                                             self._dflop * decode_kv))
        compute = fixed[0] + self.layers * attn
        comm = fixed[1]
        if self.last and sampled:
            c, g = self._head.get(sampled) or self.head_time(sampled)
            compute += c
            comm += g
        if self._hvar:  # the host's per-sequence and per-token work
            launch, add = self.host_terms(launch, seqs or sampled, tokens)
            compute += add
        if launch:  # the CPU floor covers the whole GPU step: max(launch, compute + comm)
            compute = max(compute, launch - comm)
        return compute, comm

    def message_bytes(self, tokens):
        """Bytes of the activations of ``tokens`` tokens, ``T * h * 2``: one TP all-reduce's
        message, and the hand-off to the next pipeline stage."""
        return tokens * self.shapes.model.hidden * ACT_BYTES

    def allreduce_bytes(self, tokens):
        """Bytes the stage all-reduces over its TP group for ``tokens`` tokens: two
        all-reduces of :meth:`message_bytes` per layer."""
        return 2 * self.layers * tokens * self.shapes.model.hidden * ACT_BYTES

    def work(self, tokens: np.ndarray, prefill_pairs: np.ndarray, prefill_ctx: np.ndarray,
             decode_kv: np.ndarray, sampled: np.ndarray) -> tuple[np.ndarray, ...]:
        """FLOPs, HBM bytes, NVLink bytes and NIC bytes on one GPU of the stage for each of
        many steps (arrays of :meth:`step`'s arguments): the operator shapes :meth:`step`
        prices, at 100% efficiency, with no floors and no padding.

        Notes
        -----
        Per layer the four GEMMs, the attention
        (:meth:`LayerShapes.attention_work`) and the elementwise bytes; the embedding
        read on the first stage, the 16-bit LM head over the sampled rows on the last.
        Over NVLink, a ring all-reduce sends ``2(n-1)/n * S`` bytes per GPU, twice per
        layer, with ``S = T * h * 2``. The stage's own traffic only: the hand-off to the
        next stage depends on where that stage sits, which the caller knows.
        """
        sh, layers = self.shapes, self.layers
        tokens = np.asarray(tokens, dtype=float)
        flops = np.zeros(len(tokens))
        hbm = np.zeros(len(tokens))
        for w in sh.gemm_works(tokens):
            flops += w.flops
            hbm += w.bytes
        att = sh.attention_work(tokens, prefill_pairs, prefill_ctx, decode_kv)
        flops = layers * (flops + att.flops)
        hbm = layers * (hbm + att.bytes + tokens * sh.elementwise_bytes_per_token)
        h = sh.model.hidden
        if self.first:
            hbm += tokens * h * ACT_BYTES
        if self.last:
            head = gemm_work(sampled, sh.model.vocab // sh.tp, h, ACT_BYTES)  # 16-bit
            flops += head.flops
            hbm += np.where(sampled > 0, head.bytes, 0.0)
        n = sh.tp
        nvlink = 2 * layers * 2 * (n - 1) / n * tokens * h * ACT_BYTES if n > 1 else 0 * tokens
        return flops, hbm, nvlink, 0 * tokens

    def decode_run(self, n: int, decode_kv: int, k: int) -> tuple[list[float], float]:
        """:meth:`step` for ``k`` decode-only steps of ``n`` sequences reading
        ``decode_kv + j * n`` KV entries (j = 1..k), as a Python loop with the parts that do
        not change hoisted out: for the short runs between arrivals, where numpy's call
        overhead exceeds the work. Bit-identical to ``step(n, 0.0, 0, kv, n)`` (the same
        operations in the same order). Returns the compute times and the communication time.
        """
        padded, launch = self.graph_tokens(n, True)
        fixed = self._fixed.get(padded) or self._fixed_time(padded)
        fixed0, comm = fixed
        head = 0.0
        if self.last and n:
            head, g = self._head.get(n) or self.head_time(n)
            comm += g
        dkv, dflop, dfloor, dexp, layers = (self._dkv, self._dflop, self._dfloor, self._dexp,
                                            self.layers)
        tok, per = self._dtok * n, self._dseq * n
        add = 0.0
        if self._hvar:
            launch, add = self.host_terms(launch, n, n)
        floor = launch - comm if launch else 0.0
        out = []
        append, with_head = out.append, self.last and n
        kv = decode_kv
        for _ in range(k):
            kv += n
            stream = dkv * kv + tok
            f = dflop * kv
            if f > stream:  # max(stream, f)
                stream = f
            # _decode: (floor + max(per, stream)) + exp * min(per, stream)
            attn = (dfloor + stream) + dexp * per if stream > per else \
                (dfloor + per) + dexp * stream
            compute = fixed0 + layers * attn
            if with_head:
                compute += head
            if add:
                compute += add
            if compute < floor:
                compute = floor
            append(compute)
        return out, comm

    def decode_steps(self, n: int, decode_kv: np.ndarray) -> tuple[np.ndarray, float]:
        """:meth:`step` for many decode-only steps of ``n`` sequences at once.

        Evaluates the same expressions in the same order, element-wise, so each element is
        bit-identical to ``step(n, 0.0, 0, decode_kv[j], n)``. Returns the compute times and
        the (constant) communication time.
        """
        padded, launch = self.graph_tokens(n, True)
        fixed = self._fixed.get(padded) or self._fixed_time(padded)
        # In place, in step()'s order (x + y == y + x exactly; int KV counts convert exactly).
        stream = self._dkv * decode_kv
        stream += self._dtok * n
        np.maximum(stream, self._dflop * decode_kv, out=stream)
        per = self._dseq * n
        attn = np.maximum(stream, per)
        attn += self._dfloor
        np.minimum(stream, per, out=stream)
        stream *= self._dexp
        attn += stream
        attn *= self.layers
        attn += fixed[0]
        comm = fixed[1]
        if self.last and n:
            c, g = self._head.get(n) or self.head_time(n)
            attn += c
            comm += g
        if self._hvar:
            launch, add = self.host_terms(launch, n, n)
            if add:
                attn += add
        if launch:
            np.maximum(attn, launch - comm, out=attn)
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
    if sampled:  # the LM head stays 16-bit
        total = total + gemm_work(sampled, model.vocab // tp, model.hidden, ACT_BYTES)
    return max(total.flops / gpu.peak(weight_dtype), total.bytes / gpu.hbm_bandwidth_Bps)
