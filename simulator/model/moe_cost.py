"""Step cost of a stage of a mixture-of-experts and/or MLA model (docs/moe.md).

Kernel times are taken in ONE place, the three functions :func:`expert_time`,
:func:`mla_shapes` and :func:`a2a_time` (plain shape numbers plus the GPUSpec), so the
calibrated MoE / MLA / all-to-all forms can replace them there. Until then they price:
experts as a grouped GEMM (the calibrated GEMM form per expert with M = tokens routed to it),
MLA through the calibrated attention forms (decode: an MQA-like kernel over the cached
latent, ``kv_lora_rank + qk_rope_head_dim`` values per token; prefill: full attention over
``qk_nope + qk_rope`` dims), and the all-to-all as bytes over the graph's paths plus a
per-mode launch latency.

A step of a MoE stage on the slowest rank: per layer, attention projections, attention and
elementwise kernels on the rank's tokens (all of them under TP attention, ``T / tp`` under
attention DP); a dense MLP, or a MoE block (router GEMM, shared experts, routed experts of
the rank that received most tokens in this step's routing draw); under TP attention two
all-reduces per layer (the second also combines the experts' partial outputs), under
attention DP a dispatch and a combine all-to-all per MoE layer. The all-to-all varies per
step with the routing, so it is counted in the step's compute time (it is on the critical
path) and reported on its own by :meth:`MoEStageCost.moe_columns`; ``comm`` keeps the TP
all-reduces and the logits gather, which are constant for a token count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.calibration.forms import ACT_BYTES, AttentionShape, gemm_time
from simulator.calibration.params import ACTIVATION_QUANTIZED
from simulator.hardware.specs import GPUSpec
from simulator.model.cost import StageCost, gemm_work
from simulator.model.memory import ExpertLayout, attention_params_per_gpu
from simulator.model.routing import Routing, imbalance, step_index
from simulator.model.spec import BYTES_PER_DTYPE, ModelSpec, kv_heads_per_gpu
from simulator.parallel.collective import AllReduceCost

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


@dataclass(frozen=True)
class MoETable:
    """Per routing state (row of the draw block) for one token count: the MoE block's
    time on the slowest rank (routed experts), its all-to-all time (dispatch + combine)
    and the imbalance factor, each ``(DRAWS,)``."""

    expert_s: np.ndarray
    a2a_s: np.ndarray
    imbalance: np.ndarray


class MoEStageCost(StageCost):
    """:class:`~simulator.model.cost.StageCost` of a MoE and/or MLA stage, on its slowest
    rank. Same interface (``step``, ``decode_run``, ``decode_steps``); ``decode_run`` and
    ``decode_steps`` evaluate :meth:`_decode_vec`, as ``step`` does for decode-only
    steps, so fast-forwarded runs are bit-identical to stepping.

    Parameters
    ----------
    start : int
        Index of the stage's first layer (which of its layers are MoE layers).
    layout : ExpertLayout
    routing : Routing
        Popularity and placement over ``layout.ep`` ranks (1 for MoE-TP).
    paths : A2APaths or None
        The EP group's paths (attention DP only).
    a2a_mode : {"auto", "normal", "low_latency"}
        ``auto``: normal for steps with prefill, low_latency for decode-only steps.
    two_batch_overlap : bool
        Split each step into two half batches whose all-to-all and compute overlap
        (:meth:`_overlap`); attention DP only.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int, start: int, layers: int,
                 first: bool, last: bool, weight_dtype: str, kv_dtype: str,
                 allreduce: AllReduceCost, layout: ExpertLayout, routing: Routing,
                 paths: A2APaths | None, a2a_mode: str = "auto",
                 layer_launch_s: float = 0.0, two_batch_overlap: bool = False):
        super().__init__(model, gpu, tp, layers, first, last, weight_dtype, kv_dtype,
                         allreduce, layer_launch_s)
        self.model, self.layout, self.routing, self.paths = model, layout, routing, paths
        self.a2a_mode = a2a_mode
        self.tbo = two_batch_overlap
        self.dp = layout.attention_dp
        self.split = tp if self.dp else 1
        attn_tp = 1 if self.dp else tp
        h = model.hidden
        moe_set = set(model.moe.layers) if model.moe else set()
        self.n_moe = sum(1 for i in range(start, start + layers) if i in moe_set)
        self.n_dense = layers - self.n_moe
        # Sliding-window / chunked-attention layers read at most `window` keys per query.
        self.window = model.sliding_window or 0
        win = set(model.window_layers)
        self.n_window = sum(1 for i in range(start, start + layers) if i in win)
        heads = model.q_heads // attn_tp
        kv_b = BYTES_PER_DTYPE[kv_dtype]
        pshape, dshape = mla_shapes(model, heads, kv_b, gpu)
        cal = gpu.calibration
        (self._pfloor, self._pseq, self._ptok, self._ppair, self._pwaste, self._pserial,
         self._pqo, self._pkv, self._pp) = pshape.prefill_coeffs(cal.prefill_for(kv_dtype))
        (self._dfloor, self._dseq, self._dflop, self._dkv, self._dtok,
         self._dexp) = dshape.decode_coeffs(cal.decode_for(kv_dtype))
        if model.mla is None:
            d, kvh = model.head_dim, kv_heads_per_gpu(model.kv_heads, attn_tp)
            self.attn_gemms = [((heads + 2 * kvh) * d, h), (h, heads * d)]
        else:
            m = model.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = ([(m.q_lora_rank, h), (heads * qk, m.q_lora_rank)] if m.q_lora_rank
                 else [(heads * qk, h)])
            # kv up-projection (prefill) and its absorbed form (decode) move the same bytes.
            self.attn_gemms = q + [(m.cache_width, h),
                                   (heads * (m.qk_nope_head_dim + m.v_head_dim),
                                    m.kv_lora_rank), (h, heads * m.v_head_dim)]
        mult = 2 if model.gated_mlp else 1
        self.dense_gemms = [(mult * model.intermediate // attn_tp, h),
                            (h, model.intermediate // attn_tp)]
        moe = model.moe
        shared = moe.shared_intermediate // attn_tp if moe else 0
        self.shared_gemms = [(2 * shared, h), (h, shared)] if shared else []
        self.router_n = moe.experts if moe else 0
        self.elem_bytes_attn = ACT_BYTES * (10 * h + 2 * (heads + 1) * model.head_dim)
        self.elem_bytes_dense = ACT_BYTES * 3 * model.intermediate // attn_tp
        self.elem_bytes_moe = ACT_BYTES * (3 * shared + 2 * h)
        self.dispatch_bytes = 1 if self.shapes.quantized else ACT_BYTES
        self.attn_param_bytes = attention_params_per_gpu(model, attn_tp)
        self._tables: dict[tuple[int, str], MoETable] = {}

    # -- token-count dependent parts ------------------------------------------------------
    def _rank_tokens(self, tokens: int) -> int:
        return math.ceil(tokens / self.split)

    def _fixed_time(self, tokens: int) -> tuple[float, float]:
        """Projections, dense MLPs, router and shared experts of the rank's tokens, the
        elementwise kernels, the embedding; TP all-reduces (none under attention DP)."""
        t = self._rank_tokens(tokens)
        g = self.gemm_time
        attn = sum(g(t, n, k) for n, k in self.attn_gemms)
        dense = sum(g(t, n, k) for n, k in self.dense_gemms)
        shared = sum(g(t, n, k) for n, k in self.shared_gemms)
        router = float(gemm_time(t, self.router_n, self.model.hidden, self.head_params,
                                 self.bf16_peak, self.gpu.hbm_bandwidth_Bps,
                                 self.gpu.sm_count, ACT_BYTES)) if self.n_moe else 0.0
        elem = self.elem_launch + t * self.elem_bytes_attn / self.elem_bw
        compute = (self.layers * (attn + elem)
                   + self.n_dense * (dense + t * self.elem_bytes_dense / self.elem_bw)
                   + self.n_moe * (router + shared + t * self.elem_bytes_moe / self.elem_bw))
        if self.first:
            compute += t * self.hidden_bytes / self.elem_bw
        comm = 0.0 if self.dp else 2 * self.layers * self.allreduce.time(
            tokens * self.hidden_bytes)
        self._fixed[tokens] = (compute, comm)
        return compute, comm

    def _mode(self, decode_only: bool) -> str:
        if self.a2a_mode != "auto":
            return self.a2a_mode
        return "low_latency" if decode_only else "normal"

    def table(self, tokens: int, mode: str) -> MoETable:
        """:class:`MoETable` of a step of ``tokens`` tokens (cached)."""
        key = (tokens, mode)
        tab = self._tables.get(key)
        if tab is not None:
            return tab
        r, lay, moe = self.routing, self.layout, self.model.moe
        if not self.n_moe or tokens <= 0:
            zero = np.zeros(r.z.shape[0])
            tab = MoETable(zero, zero, zero + 1.0)
        elif lay.ep > 1:
            loads = r.rank_loads(tokens)
            active = r.active_experts(tokens)
            t = expert_time(loads, active[None, :], self.model.hidden, moe.intermediate,
                            self.gpu, lay.expert_dtype)
            imb = imbalance(loads)
            a2a = np.zeros_like(imb)
            if self.dp:  # the hottest rank receives imb x the mean
                per_rank = tokens / lay.ep
                out = dispatch_bytes_per_peer(per_rank, r, self.model.hidden,
                                              self.dispatch_bytes, mode)
                back = dispatch_bytes_per_peer(per_rank, r, self.model.hidden, ACT_BYTES,
                                               mode)
                a2a = (a2a_time(out * imb, self.paths, mode)
                       + a2a_time(back * imb, self.paths, mode))
            tab = MoETable(t.max(axis=1), a2a, imb)
        else:  # MoE-TP: every rank runs every expert's slice on all tokens
            active = r.active_experts(tokens).sum()
            t = float(expert_time(tokens * moe.top_k, active, self.model.hidden,
                                  moe.intermediate // self.shapes.tp, self.gpu,
                                  lay.expert_dtype))
            n = r.z.shape[0]
            tab = MoETable(np.full(n, t), np.zeros(n), np.ones(n))
        self._tables[key] = tab
        return tab

    # -- the StageCost interface ----------------------------------------------------------
    def _decode_core(self, n: int, kv: np.ndarray, idx) -> tuple[np.ndarray, np.ndarray]:
        """(compute without all-to-all and LM head, all-to-all) of decode-only steps."""
        fixed0 = (self._fixed.get(n) or self._fixed_time(n))[0]
        s, nr = self.split, self._rank_tokens(n)
        per = self._dseq * nr

        def attention(kvr):
            stream = self._dkv * kvr + self._dtok * nr
            stream = np.maximum(stream, self._dflop * kvr)
            return (self._dfloor + np.maximum(stream, per)) + self._dexp * np.minimum(stream,
                                                                                     per)

        kvr = kv / s
        attn = (self.layers - self.n_window) * attention(kvr)
        if self.n_window:  # sum_i min(l_i, W) <= min(sum_i l_i, n W): an upper bound
            attn = attn + self.n_window * attention(np.minimum(kvr, self.window * nr))
        tab = self.table(n, self._mode(True))
        return (fixed0 + attn + self.n_moe * tab.expert_s[idx], self.n_moe * tab.a2a_s[idx])

    def _overlap(self, compute, a2a):
        """Two-batch overlap of two half batches: each half's all-to-all runs under the
        other half's compute, ``max(2 C_h, 2 A_h)``, plus one MoE layer's share of the
        shorter one exposed at the ends (pipeline fill and drain)."""
        return np.maximum(2 * compute, 2 * a2a) + np.minimum(compute, a2a) / max(self.n_moe,
                                                                                   1)

    def _decode_vec(self, n: int, kv: np.ndarray) -> np.ndarray:
        """Compute seconds of decode-only steps of ``n`` sequences reading ``kv`` KV
        entries each (array)."""
        kv = np.asarray(kv)
        idx = step_index(kv)
        kv = kv.astype(float)
        if self.tbo and n > 1:
            out = self._overlap(*self._decode_core(math.ceil(n / 2), kv / 2, idx))
        else:
            compute, a2a = self._decode_core(n, kv, idx)
            out = compute + a2a
        if self.last and n:
            out = out + (self._head.get(n) or self.head_time(n))[0]
        if self._launch:
            out = np.maximum(out, self._launch)
        return out

    def _comm(self, tokens: int, sampled: int) -> float:
        comm = (self._fixed.get(tokens) or self._fixed_time(tokens))[1]
        if self.last and sampled:
            comm += (self._head.get(sampled) or self.head_time(sampled))[1]
        return comm

    @staticmethod
    def _key(tokens, prefill_pairs, decode_kv):
        """Routing-draw key of a step with prefill (decode-only steps use decode_kv)."""
        return tokens + 7 * decode_kv + prefill_pairs

    def _prefill_core(self, tokens: int, prefill_pairs: float, prefill_ctx: float,
                      decode_kv: float, sampled: int, idx: int) -> tuple[float, float]:
        """(compute without all-to-all and LM head, all-to-all) of a step with prefill."""
        s = self.split
        fixed0 = (self._fixed.get(tokens) or self._fixed_time(tokens))[0]
        seqs_d = math.ceil(sampled / s)
        t_r = self._rank_tokens(tokens)

        def attention(pairs, ctx, kv):
            a = self.prefill_attention(t_r, pairs, ctx, 1 if decode_kv or not sampled
                                       else seqs_d)
            if kv:
                a += self._decode(seqs_d, max(self._dkv * kv, self._dflop * kv))
            return a

        pairs, ctx, kv = prefill_pairs / s, prefill_ctx / s, decode_kv / s
        attn = (self.layers - self.n_window) * attention(pairs, ctx, kv)
        if self.n_window:  # each query sees at most W keys (upper bounds, as in decode)
            w = self.window
            attn += self.n_window * attention(min(pairs, t_r * w), min(ctx, t_r * w),
                                              min(kv, seqs_d * w))
        tab = self.table(tokens, self._mode(False))
        return (fixed0 + attn + self.n_moe * float(tab.expert_s[idx]),
                self.n_moe * float(tab.a2a_s[idx]))

    def step(self, tokens: int, prefill_pairs: float, prefill_ctx: float, decode_kv: float,
             sampled: int) -> tuple[float, float]:
        """See :meth:`StageCost.step`; here on the slowest rank of the stage."""
        if tokens <= 0:
            return 0.0, 0.0
        if not prefill_pairs:
            return float(self._decode_vec(tokens, np.array([decode_kv]))[0]), self._comm(
                tokens, sampled)
        idx = step_index(self._key(tokens, int(prefill_pairs), int(decode_kv)))
        if self.tbo:
            compute = float(self._overlap(*self._prefill_core(
                math.ceil(tokens / 2), prefill_pairs / 2, prefill_ctx / 2, decode_kv / 2,
                math.ceil(sampled / 2), idx)))
        else:
            compute, a2a = self._prefill_core(tokens, prefill_pairs, prefill_ctx, decode_kv,
                                              sampled, idx)
            compute += a2a
        if self.last and sampled:
            compute += (self._head.get(sampled) or self.head_time(sampled))[0]
        if self._launch:
            compute = max(compute, self._launch)
        return compute, self._comm(tokens, sampled)

    def decode_run(self, n: int, decode_kv: int, k: int) -> tuple[list[float], float]:
        kv = decode_kv + n * np.arange(1, k + 1)
        return self._decode_vec(n, kv).tolist(), self._comm(n, n)

    def decode_steps(self, n: int, decode_kv: np.ndarray) -> tuple[np.ndarray, float]:
        return self._decode_vec(n, decode_kv), self._comm(n, n)

    def moe_columns(self, tokens: np.ndarray, prefill_pairs: np.ndarray,
                    decode_kv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All-to-all seconds (all MoE layers of the stage) and imbalance factor of
        recorded steps, from the same tables and draws as their step times."""
        tokens = np.asarray(tokens, dtype=np.int64)
        pairs = np.asarray(prefill_pairs, dtype=float).astype(np.int64)
        kv = np.asarray(decode_kv, dtype=np.int64)
        decode = pairs == 0
        key = np.where(decode, kv, self._key(tokens, pairs, kv))
        idx = step_index(key)
        a2a, imb = np.zeros(tokens.size), np.ones(tokens.size)
        for t, d in {(int(t), bool(d)) for t, d in zip(tokens, decode, strict=True)}:
            rows = (tokens == t) & (decode == d)
            if t <= 0:
                continue
            half = self.tbo and (t > 1 if d else True)
            tab = self.table(math.ceil(t / 2) if half else t, self._mode(d))
            a2a[rows] = (2 if half else 1) * self.n_moe * tab.a2a_s[idx[rows]]
            imb[rows] = tab.imbalance[idx[rows]]
        return a2a, imb

    def work(self, tokens: np.ndarray, pairs: np.ndarray, ctx: np.ndarray,
             kv: np.ndarray, sampled: np.ndarray) -> tuple[np.ndarray, ...]:
        """FLOPs, HBM bytes, NVLink bytes and NIC bytes on a mean rank of the stage for
        each recorded step (for GPU utilization; no efficiency, no floors): projections,
        dense MLPs, routers, shared experts, the rank's share of the routed tokens through
        its active experts' weights, attention reads and writes, elementwise traffic, the
        TP all-reduces or the all-to-all, the LM head."""
        m, lay, sh, moe = self.model, self.layout, self.shapes, self.model.moe
        tokens = np.asarray(tokens, dtype=float)
        t_r = tokens / self.split
        flops, hbm = np.zeros(tokens.size), np.zeros(tokens.size)

        def add(gemms, times, w_b=sh.w_bytes, in_b=sh.in_bytes):
            nonlocal flops, hbm
            for n, k in gemms:
                w = gemm_work(t_r, n, k, w_b, in_b)
                flops, hbm = flops + times * w.flops, hbm + times * np.where(t_r > 0, w.bytes,
                                                                               0.0)

        add(self.attn_gemms, self.layers)
        add(self.dense_gemms, self.n_dense)
        add(self.shared_gemms, self.n_moe)
        h = m.hidden
        if self.n_moe:
            add([(self.router_n, h)], self.n_moe, ACT_BYTES, ACT_BYTES)
            ranks = lay.ep
            inter = moe.intermediate // (1 if ranks > 1 else sh.tp)
            routed = tokens * moe.top_k / ranks
            uniq, inv = np.unique(tokens, return_inverse=True)
            active = np.array([self.routing.active_experts(t).mean() for t in uniq])[inv]
            e_b = BYTES_PER_DTYPE[lay.expert_dtype]
            flops = flops + self.n_moe * 2 * routed * 3 * h * inter
            hbm = hbm + self.n_moe * (np.where(routed > 0, active * 3 * h * inter * e_b, 0.0)
                                      + routed * (2 * h + 3 * inter) * ACT_BYTES)
        heads = m.q_heads // (1 if self.dp else sh.tp)
        if m.mla is not None:
            width, kv_tok = m.mla.cache_width, m.mla.cache_width * sh.kv_bytes
        else:
            width = m.head_dim
            kv_tok = 2 * kv_heads_per_gpu(m.kv_heads, 1 if self.dp else sh.tp) * width \
                * sh.kv_bytes
        s = self.split
        att_flops = 4.0 * heads * width * (np.asarray(pairs) + np.asarray(kv)) / s
        att_bytes = ((np.asarray(kv) + np.asarray(ctx)) / s + t_r) * kv_tok \
            + 2 * t_r * heads * width * ACT_BYTES
        flops = flops + self.layers * att_flops
        hbm = hbm + self.layers * (att_bytes + t_r * self.elem_bytes_attn) \
            + self.n_dense * t_r * self.elem_bytes_dense + self.n_moe * t_r * self.elem_bytes_moe
        if self.first:
            hbm = hbm + t_r * h * ACT_BYTES
        if self.last:
            head = gemm_work(np.asarray(sampled, dtype=float), self.vocab_shard, h, ACT_BYTES)
            flops = flops + head.flops
            hbm = hbm + np.where(np.asarray(sampled) > 0, head.bytes, 0.0)
        n = sh.tp
        nvlink, nic = np.zeros(tokens.size), np.zeros(tokens.size)
        if not self.dp and n > 1:
            nvlink = 2 * self.layers * 2 * (n - 1) / n * tokens * h * ACT_BYTES
        elif self.dp and self.n_moe and self.paths is not None:
            out = dispatch_bytes_per_peer(1.0, self.routing, h, self.dispatch_bytes, "normal")
            back = dispatch_bytes_per_peer(1.0, self.routing, h, ACT_BYTES, "normal")
            sent = self.n_moe * (out + back) * tokens / lay.ep
            intra = self.paths.intra_peers
            nvlink, nic = sent * intra, sent * (lay.ep - 1 - intra)
        return flops, hbm, nvlink, nic
