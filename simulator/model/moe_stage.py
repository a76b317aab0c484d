"""Step cost of a stage of a mixture-of-experts and/or MLA model (docs/moe.md).

A step of a MoE stage on the slowest rank: per layer, attention projections, attention
(the calibrated MLA module for MLA models, projections included) and elementwise kernels
on the rank's tokens (all of them under TP attention, ``T / tp`` under attention DP); a
dense MLP, or a MoE block (router GEMM, shared experts, routed experts of the rank that
received most tokens in this step's routing draw); under TP attention two all-reduces per
layer (the second also combines the experts' partial outputs), under attention DP a
dispatch and a combine all-to-all per MoE layer. The all-to-all varies per step with the
routing, so it is counted in the step's compute time (it is on the critical path) and
reported on its own by :meth:`MoEStageCost.moe_columns`; ``comm`` keeps the TP all-reduces
and the logits gather, which are constant for a token count. Every MoE / MLA kernel time
comes from :mod:`simulator.model.moe_cost` (the calibrated forms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.calibration.forms import ACT_BYTES, gemm_time
from simulator.hardware.specs import GPUSpec
from simulator.model.cost import StageCost
from simulator.model.hybrid_cost import DSACost, GDNCost
from simulator.model.memory import ExpertLayout, attention_params_per_gpu
from simulator.model.moe_cost import (
    A2APaths,
    a2a_time,
    dispatch_bytes_per_peer,
    expert_time,
    mla_decode,
    mla_prefill,
    mla_shapes,
)
from simulator.model.moe_work import moe_stage_work
from simulator.model.routing import Routing, imbalance, step_index
from simulator.model.spec import BYTES_PER_DTYPE, ModelSpec, kv_heads_per_gpu
from simulator.parallel.collective import AllReduceCost


@dataclass(frozen=True)
class LayoutComm:
    """Collectives of an attention-DP stage besides the all-to-all: the all-reduce of one
    attention group (``attention_tp`` GPUs), and the all-gather and reduce-scatter over
    the whole stage that bring every token to the MoE layer and its outputs back when the
    experts are TP-sliced (``ep < tp``), each ``alpha + beta * S`` on the graph."""

    attention: AllReduceCost
    gather: AllReduceCost
    scatter: AllReduceCost


@dataclass(frozen=True)
class MoETable:
    """Per routing state (row of the draw block) for one token count: the MoE block's
    time on the slowest rank (routed experts), its all-to-all time (dispatch + combine)
    and the imbalance factor, each ``(DRAWS,)``."""

    expert_s: np.ndarray
    a2a_s: np.ndarray
    imbalance: np.ndarray


#: Shared tables kept before the cache starts over.
SHARED_TABLES = 256
#: Table sets of :class:`MoEStageCost` shared by the stages whose routing rows are the
#: same numbers (:func:`_shared_tables`): key -> (objects the key names by id, tables).
_SHARED: dict[tuple, tuple[tuple, dict]] = {}


def _shared_tables(c: MoEStageCost) -> dict[tuple[int, str], MoETable]:
    """The ``(tokens, mode) -> MoETable`` dict of stage cost ``c``, shared with every stage
    built before whose :meth:`MoEStageCost._rows` is the same function: the same routing,
    model and GPU objects, expert layout, attention DP, all-to-all paths and dispatch
    bytes, and the TP size. A plan builds thousands of stages over a few such sets;
    rows are computed independently of each other, so a row is the same bits whichever
    stage filled it. The entry holds the objects keyed by id, so no id is reused while it
    lives (ModelSpec and GPUSpec hold dicts: they are not hashable)."""
    refs = (c.routing, c.model, c.gpu)
    key = (tuple(id(x) for x in refs), c.layout, c.n_moe > 0, c.dp, c.paths,
           c.dispatch_bytes, c.shapes.tp if c.layout.ep < c.shapes.tp else 0)
    hit = _SHARED.get(key)
    if hit is None or any(a is not b for a, b in zip(hit[0], refs, strict=True)):
        if len(_SHARED) >= SHARED_TABLES:
            _SHARED.clear()
        hit = _SHARED[key] = (refs, {})
    return hit[1]


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
    comm : LayoutComm or None
        The attention group's all-reduce and the stage's all-gather / reduce-scatter
        (attention DP with ``attention_tp > 1`` or ``ep < tp``; None: neither).
    a2a_mode : {"auto", "normal", "low_latency"}
        ``auto``: normal for steps with prefill, low_latency for decode-only steps.
    two_batch_overlap : bool
        Split each step into two half batches whose all-to-all and compute overlap
        (:meth:`_overlap`); attention DP only.
    cpu_floor_s, host_seq_s, host_token_s, host_inline
        The host's work per step (:class:`StageCost`); under attention DP each rank's own
        scheduler process handles its share of the sequences and tokens.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int, start: int, layers: int,
                 first: bool, last: bool, weight_dtype: str, kv_dtype: str,
                 allreduce: AllReduceCost, layout: ExpertLayout, routing: Routing,
                 paths: A2APaths | None, a2a_mode: str = "auto",
                 layer_launch_s: float = 0.0, two_batch_overlap: bool = False,
                 cpu_floor_s: float = 0.0, comm: LayoutComm | None = None,
                 host_seq_s: float = 0.0, host_token_s: float = 0.0,
                 host_inline: bool = False):
        super().__init__(model, gpu, tp, layers, first, last, weight_dtype, kv_dtype,
                         allreduce, layer_launch_s, cpu_floor_s=cpu_floor_s,
                         host_seq_s=host_seq_s, host_token_s=host_token_s,
                         host_inline=host_inline)
        self.model, self.layout, self.routing, self.paths = model, layout, routing, paths
        self.a2a_mode = a2a_mode
        self.tbo = two_batch_overlap
        self.dp = layout.attention_dp
        self.split = layout.groups(tp)
        attn_tp = layout.attn_tp(tp)
        # Attention DP with whole experts per rank: DeepEP dispatch / combine; with
        # TP-sliced experts: all-gather the tokens before the MoE layer, reduce-scatter after.
        self.a2a = self.dp and layout.ep == tp
        self.moe_tp = tp // layout.ep
        self.comm = comm
        h = model.hidden
        moe_set = set(model.moe.layers) if model.moe else set()
        self.n_moe = sum(1 for i in range(start, start + layers) if i in moe_set)
        self.n_dense = layers - self.n_moe
        # Sliding-window / chunked-attention layers read at most `window` keys per query.
        self.window = model.sliding_window or 0
        win = set(model.window_layers)
        self.n_window = sum(1 for i in range(start, start + layers) if i in win)
        heads = model.q_heads // attn_tp
        # MLA models price the whole attention module (projections included) by the
        # calibrated MLA forms; GQA models keep the attention forms and GEMMs below.
        self.mla, self.heads = model.mla is not None, heads
        # Gated DeltaNet layers (hybrid models) and DeepSeek sparse attention modules.
        self.n_lin = layers - model.full_attention_layers(start, layers)
        self.gdn = GDNCost(model, gpu, attn_tp) if self.n_lin else None
        self.dsa = (DSACost(model, gpu, heads, kv_dtype, weight_dtype)
                    if model.dsa is not None else None)
        # GLM-5.2: layers reusing another layer's top-k run the module without an indexer
        self.n_skip = layers - model.dsa.indexed(start, layers) if model.dsa else 0
        self.dsa_skip = (DSACost(model, gpu, heads, kv_dtype, weight_dtype, False)
                         if self.n_skip else None)
        self.weight_dtype, self.kv_dtype = weight_dtype, kv_dtype
        kv_b = BYTES_PER_DTYPE[kv_dtype]
        pshape, dshape = mla_shapes(model, heads, kv_b, gpu)
        cal = gpu.calibration
        (self._pfloor, self._pseq, self._ptok, self._ppair, self._pwaste, self._pserial,
         self._pqo, self._pkv, self._pp) = pshape.prefill_coeffs(cal.prefill_for(kv_dtype))
        (self._dfloor, self._dseq, self._dflop, self._dkv, self._dtok,
         self._dexp) = dshape.decode_coeffs(cal.decode_for(kv_dtype))
        if model.mla is None:
            d, kvh = model.head_dim, kv_heads_per_gpu(model.kv_heads, attn_tp)
            gate = heads if model.attn_output_gate else 0  # q_proj also emits the gate
            self.attn_gemms = [((heads + gate + 2 * kvh) * d, h), (h, heads * d)]
            self.lin_gemms = model.linear.gemms(h, attn_tp) if self.n_lin else []
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
        self._tables: dict[tuple[int, str], MoETable] = _shared_tables(self)

    # -- token-count dependent parts ------------------------------------------------------
    def _rank_tokens(self, tokens: int) -> int:
        return math.ceil(tokens / self.split)

    def _fixed_time(self, tokens: int) -> tuple[float, float]:
        """Projections, dense MLPs, router and shared experts of the rank's tokens, the
        elementwise kernels, the embedding; TP all-reduces (none under attention DP)."""
        t = self._rank_tokens(tokens)
        g = self.gemm_time
        attn = 0.0 if self.mla else sum(g(t, n, k) for n, k in self.attn_gemms)
        dense = sum(g(t, n, k) for n, k in self.dense_gemms)
        shared = sum(g(t, n, k) for n, k in self.shared_gemms)
        router = float(gemm_time(t, self.router_n, self.model.hidden, self.head_params,
                                 self.bf16_peak, self.gpu.hbm_bandwidth_Bps,
                                 self.gpu.sm_count, ACT_BYTES)) if self.n_moe else 0.0
        elem = self.elem_launch + t * self.elem_bytes_attn / self.elem_bw
        if self.n_lin:  # Gated DeltaNet projections instead of Q/K/V/O on those layers
            lin = sum(g(t, n, k) for n, k in self.lin_gemms)
            attn = ((self.layers - self.n_lin) * attn + self.n_lin * lin) / self.layers
        compute = (self.layers * (attn + elem)
                   + self.n_dense * (dense + t * self.elem_bytes_dense / self.elem_bw)
                   + self.n_moe * (router + shared + t * self.elem_bytes_moe / self.elem_bw))
        if self.first:
            compute += t * self.hidden_bytes / self.elem_bw
        if not self.dp:
            comm = 2 * self.layers * self.allreduce.time(tokens * self.hidden_bytes)
        elif self.comm is None:
            comm = 0.0
        else:  # two attention-group all-reduces per layer (around the all-to-all: their
            # reduce-scatter and all-gather halves); gathered MoE: AG + RS replace one
            c = self.comm
            comm = 2 * self.layers * c.attention.time(t * self.hidden_bytes)
            if not self.a2a:
                comm += self.n_moe * (c.gather.time(tokens * self.hidden_bytes)
                                      + c.scatter.time(tokens * self.hidden_bytes)
                                      - c.attention.time(t * self.hidden_bytes))
        self._fixed[tokens] = (compute, comm)
        return compute, comm

    def _mode(self, decode_only: bool) -> str:
        if self.a2a_mode != "auto":
            return self.a2a_mode
        return "low_latency" if decode_only else "normal"

    def table(self, tokens: int, mode: str, idx=None) -> MoETable:
        """:class:`MoETable` of a step of ``tokens`` tokens (cached), with at least the
        routing states ``idx`` filled (all of them when None). Rows are computed when
        first needed, each independently of the others (row-by-row operations only), so
        a row has the same value whichever step or run of steps asked for it first."""
        key = (tokens, mode)
        tab = self._tables.get(key)
        if tab is None:
            nan = np.full(self.routing.z.shape[0], np.nan)
            tab = self._tables[key] = MoETable(nan.copy(), nan.copy(), nan.copy())
        rows = (np.arange(tab.expert_s.size) if idx is None
                else np.unique(np.asarray(idx, dtype=np.int64)))
        rows = rows[np.isnan(tab.expert_s[rows])]
        if rows.size:
            t, a2a, imb = self._rows(tokens, mode, rows)
            tab.expert_s[rows], tab.a2a_s[rows], tab.imbalance[rows] = t, a2a, imb
        return tab

    def _rows(self, tokens: int, mode: str, rows: np.ndarray):
        """(expert, all-to-all, imbalance) of the routing states ``rows``."""
        r, lay, moe = self.routing, self.layout, self.model.moe
        if not self.n_moe or tokens <= 0:
            zero = np.zeros(rows.size)
            return zero, zero, zero + 1.0
        if lay.ep > 1:  # each rank its local experts' sampled rows; the slowest decides
            t = expert_time(r.local_counts(tokens, rows), self.model,
                            moe.intermediate // self.moe_tp, self.gpu, lay.expert_dtype,
                            lay.ep)
            imb = imbalance(r.rank_loads(tokens, rows))
            a2a = np.zeros_like(imb)
            if self.a2a:  # the hottest rank receives imb x the mean
                per_rank = tokens / lay.ep
                out = dispatch_bytes_per_peer(per_rank, r, self.model.hidden,
                                              self.dispatch_bytes, mode)
                back = dispatch_bytes_per_peer(per_rank, r, self.model.hidden, ACT_BYTES,
                                               mode)
                a2a = (a2a_time(out * imb, per_rank, self.paths, mode, "dispatch", self.gpu)
                       + a2a_time(back * imb, per_rank, self.paths, mode, "combine",
                                  self.gpu))
            return t.max(axis=1), a2a, imb
        # MoE-TP: every rank runs every expert's slice on all tokens
        t = expert_time(r.expert_counts(tokens, rows), self.model,
                        moe.intermediate // self.shapes.tp, self.gpu, lay.expert_dtype, 1)
        return t, np.zeros_like(t), np.ones_like(t)

    # -- the StageCost interface ----------------------------------------------------------
    def _decode_core(self, n: int, kv: np.ndarray, idx) -> tuple[np.ndarray, np.ndarray]:
        """(compute without all-to-all and LM head, all-to-all) of decode-only steps."""
        fixed0 = (self._fixed.get(n) or self._fixed_time(n))[0]
        s, nr = self.split, self._rank_tokens(n)
        per = self._dseq * nr

        def attention(kvr):
            if self.dsa is not None:
                return self.dsa.decode(nr, np.maximum(kvr, nr))
            if self.mla:
                return mla_decode(self.model, self.gpu, self.heads, nr,
                                  np.maximum(kvr, nr), self.kv_dtype, self.weight_dtype)
            stream = self._dkv * kvr + self._dtok * nr
            stream = np.maximum(stream, self._dflop * kvr)
            return (self._dfloor + np.maximum(stream, per)) + self._dexp * np.minimum(stream,
                                                                                     per)

        kvr = kv / s
        attn = (self.layers - self.n_window - self.n_lin - self.n_skip) * attention(kvr)
        if self.n_skip:
            attn = attn + self.n_skip * self.dsa_skip.decode(nr, np.maximum(kvr, nr))
        if self.n_lin:  # fixed-size recurrent state per sequence: no KV term
            attn = attn + self.n_lin * self.gdn.decode(nr)
        if self.n_window:  # sum_i min(l_i, W) <= min(sum_i l_i, n W): an upper bound
            attn = attn + self.n_window * attention(np.minimum(kvr, self.window * nr))
        tab = self.table(n, self._mode(True), idx)
        return (fixed0 + attn + self.n_moe * tab.expert_s[idx], self.n_moe * tab.a2a_s[idx])

    def _overlap(self, compute, a2a):
        """Two-batch overlap of two half batches: each half's all-to-all runs under the
        other half's compute, ``max(2 C_h, 2 A_h)``, plus one MoE layer's share of the
        shorter one exposed at the ends (pipeline fill and drain)."""
        return np.maximum(2 * compute, 2 * a2a) + np.minimum(compute, a2a) / max(self.n_moe,
                                                                                   1)

    def _decode_vec(self, n: int, kv: np.ndarray, comm: float) -> np.ndarray:
        """Compute seconds of decode-only steps of ``n`` sequences reading ``kv`` KV
        entries each (array); ``comm`` is the steps' communication time, which the CPU
        floor covers too."""
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
        launch = self._launch
        if self._hvar:  # the host's per-sequence and per-token work, per DP scheduler
            per = -(-n // self.split)
            launch, add = self.host_terms(launch, per, per)
            if add:
                out = out + add
        if launch:
            out = np.maximum(out, launch - comm)
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
                      decode_kv: float, sampled: int, idx: int,
                      mode: str, seqs: int = 0) -> tuple[float, float]:
        """(compute without all-to-all and LM head, all-to-all) of a step with prefill;
        ``seqs`` as in :meth:`StageCost.step`."""
        s = self.split
        fixed0 = (self._fixed.get(tokens) or self._fixed_time(tokens))[0]
        seqs_d = math.ceil(sampled / s)
        seqs_p = math.ceil(seqs / s) if seqs else (1 if decode_kv or not sampled else seqs_d)
        t_r = self._rank_tokens(tokens)

        def attention(pairs, ctx, kv):
            if self.dsa is not None:  # prefill chunks and decodes as separate modules
                t_p = max(t_r - seqs_d, 1) if kv else t_r
                a = self.dsa.prefill(t_p, pairs)
                return a + (float(self.dsa.decode(seqs_d, max(kv, seqs_d))) if kv else 0.0)
            if self.mla:  # prefill chunks and decodes as separate kernels
                t_p = max(t_r - seqs_d, 1) if kv else t_r
                a = float(mla_prefill(self.model, self.gpu, self.heads, t_p, pairs, ctx,
                                      1 if kv or not sampled else seqs_d, self.kv_dtype,
                                      self.weight_dtype))
                if kv:
                    a += float(mla_decode(self.model, self.gpu, self.heads, seqs_d,
                                          max(kv, seqs_d), self.kv_dtype,
                                          self.weight_dtype))
                return a
            a = self.prefill_attention(t_r, pairs, ctx, seqs_p)
            if kv:
                a += self._decode(seqs_d, max(self._dkv * kv, self._dflop * kv))
            return a

        pairs, ctx, kv = prefill_pairs / s, prefill_ctx / s, decode_kv / s
        attn = (self.layers - self.n_window - self.n_lin - self.n_skip) * attention(pairs, ctx,
                                                                                 kv)
        if self.n_skip:
            t_p = max(t_r - seqs_d, 1) if kv else t_r
            attn += self.n_skip * (self.dsa_skip.prefill(t_p, pairs) + (float(
                self.dsa_skip.decode(seqs_d, max(kv, seqs_d))) if kv else 0.0))
        if self.n_lin:  # chunked GDN over the prompt tokens, the recurrent kernel for decodes
            t_p = max(t_r - seqs_d, 1) if kv else t_r
            attn += self.n_lin * (self.gdn.prefill(t_p, seqs_p)
                                  + (self.gdn.decode(seqs_d) if kv else 0.0))
        if self.n_window:  # each query sees at most W keys (upper bounds, as in decode)
            w = self.window
            attn += self.n_window * attention(min(pairs, t_r * w), min(ctx, t_r * w),
                                              min(kv, seqs_d * w))
        tab = self.table(tokens, mode, idx)
        return (fixed0 + attn + self.n_moe * float(tab.expert_s[idx]),
                self.n_moe * float(tab.a2a_s[idx]))

    def step(self, tokens: int, prefill_pairs: float, prefill_ctx: float, decode_kv: float,
             sampled: int, seqs: int = 0) -> tuple[float, float]:
        """See :meth:`StageCost.step`; here on the slowest rank of the stage."""
        if tokens <= 0:
            return 0.0, 0.0
        if not prefill_pairs:
            comm = self._comm(tokens, sampled)
            return float(self._decode_vec(tokens, np.array([decode_kv]), comm)[0]), comm
        idx = step_index(self._key(tokens, int(prefill_pairs), int(decode_kv)))
        # Every token sampled (speculative verification, no prompt chunk): a decode batch
        # for the all-to-all (DeepEP low latency under "auto"), as SGLang runs it.
        mode = self._mode(sampled >= tokens)
        if self.tbo:
            compute = float(self._overlap(*self._prefill_core(
                math.ceil(tokens / 2), prefill_pairs / 2, prefill_ctx / 2, decode_kv / 2,
                math.ceil(sampled / 2), idx, mode, math.ceil(seqs / 2))))
        else:
            compute, a2a = self._prefill_core(tokens, prefill_pairs, prefill_ctx, decode_kv,
                                              sampled, idx, mode, seqs)
            compute += a2a
        if self.last and sampled:
            compute += (self._head.get(sampled) or self.head_time(sampled))[0]
        comm = self._comm(tokens, sampled)
        launch = self._launch
        if self._hvar:  # the host's per-sequence and per-token work, per DP scheduler
            launch, add = self.host_terms(launch, -(-(seqs or sampled) // self.split),
                                          -(-tokens // self.split))
            compute += add
        if launch:  # the CPU floor covers the whole GPU step
            compute = max(compute, launch - comm)
        return compute, comm

    def decode_run(self, n: int, decode_kv: int, k: int) -> tuple[list[float], float]:
        kv = decode_kv + n * np.arange(1, k + 1)
        comm = self._comm(n, n)
        return self._decode_vec(n, kv, comm).tolist(), comm

    def decode_steps(self, n: int, decode_kv: np.ndarray) -> tuple[np.ndarray, float]:
        comm = self._comm(n, n)
        return self._decode_vec(n, decode_kv, comm), comm

    def work(self, tokens: np.ndarray, prefill_pairs: np.ndarray, prefill_ctx: np.ndarray,
             decode_kv: np.ndarray, sampled: np.ndarray) -> tuple[np.ndarray, ...]:
        """See :meth:`StageCost.work`; here on a mean rank of the stage, with the
        all-to-all's bytes over NVLink and the NIC
        (:func:`simulator.model.moe_work.moe_stage_work`)."""
        return moe_stage_work(self, tokens, prefill_pairs, prefill_ctx, decode_kv, sampled)

    def moe_columns(self, tokens: np.ndarray, prefill_pairs: np.ndarray,
                    decode_kv: np.ndarray,
                    sampled: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """All-to-all seconds (all MoE layers of the stage) and imbalance factor of
        recorded steps, from the same tables and draws as their step times (``sampled``
        tells verification steps, priced as decode batches; without it, steps with
        prefill pairs count as prefill)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        pairs = np.asarray(prefill_pairs, dtype=float).astype(np.int64)
        kv = np.asarray(decode_kv, dtype=np.int64)
        decode = pairs == 0
        low = decode if sampled is None else decode | (np.asarray(sampled) >= tokens)
        key = np.where(decode, kv, self._key(tokens, pairs, kv))
        idx = step_index(key)
        a2a, imb = np.zeros(tokens.size), np.ones(tokens.size)
        for t, d, ll in {(int(t), bool(d), bool(ll))
                         for t, d, ll in zip(tokens, decode, low, strict=True)}:
            rows = (tokens == t) & (decode == d) & (low == ll)
            if t <= 0:
                continue
            half = self.tbo and (t > 1 if d else True)
            tab = self.table(math.ceil(t / 2) if half else t, self._mode(ll), idx[rows])
            a2a[rows] = (2 if half else 1) * self.n_moe * tab.a2a_s[idx[rows]]
            imb[rows] = tab.imbalance[idx[rows]]
        return a2a, imb
