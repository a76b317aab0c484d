"""Kernel times of the new attention kinds in a stage: Gated DeltaNet and DeepSeek sparse.

:class:`GDNCost` prices one Gated DeltaNet layer's kernels (convolution and gated delta
rule; the projections are GEMMs the stage prices itself) and :class:`DSACost` one DSA
attention module (projections, lightning indexer, top-k and sparse MLA), both from the
fitted forms of :mod:`simulator.model.linear_attention` and
:mod:`simulator.model.sparse_attention`. :class:`~simulator.model.moe_stage.MoEStageCost`
holds one of each where the stage has such layers.
"""

from __future__ import annotations

import numpy as np

from simulator.errors import ScenarioError
from simulator.hardware.specs import GPUSpec
from simulator.model import linear_attention as la
from simulator.model import sparse_attention as sa
from simulator.model.fitted import DSA_FIT, GDN_FIT, fit_for, fitted_time
from simulator.model.spec import BYTES_PER_DTYPE, ModelSpec


def _fit(table: dict, gpu: GPUSpec, what: str) -> dict:
    try:
        return fit_for(table, gpu, what)
    except ValueError as exc:
        raise ScenarioError(f"cluster.topology: {exc}") from None


class GDNCost:
    """One Gated DeltaNet layer's kernels on one GPU of a TP group of ``tp``.

    Decode: :func:`~simulator.model.linear_attention.decode_work` of the step's sequences
    under the fitted decode form; prefill: :func:`~.linear_attention.prefill_work` of the
    chunk tokens and their sequences under the prefill form. Both are per call, so a step
    pays the floor once per layer and phase.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int):
        self.spec, self.tp = model.linear, tp
        fit = _fit(GDN_FIT, gpu, "Gated DeltaNet")
        self.fit_d, self.fit_p = fit["decode"], fit["prefill"]
        self.peak, self.bw = gpu.peak("bf16"), gpu.hbm_bandwidth_Bps
        self._decode: dict[int, float] = {}

    def decode(self, seqs: int) -> float:
        """Seconds of one layer's decode kernels for ``seqs`` sequences (cached)."""
        t = self._decode.get(seqs)
        if t is None:
            f, b = la.decode_work(self.spec, seqs, self.tp)
            t = self._decode[seqs] = float(fitted_time(self.fit_d, f, b, self.peak,
                                                          self.bw)) if seqs else 0.0
        return t

    def prefill(self, tokens: int, seqs: int) -> float:
        """Seconds of one layer's chunked-prefill kernels for ``tokens`` tokens of
        ``seqs`` sequences."""
        if tokens <= 0:
            return 0.0
        f, b = la.prefill_work(self.spec, tokens, max(seqs, 1), self.tp)
        return float(fitted_time(self.fit_p, f, b, self.peak, self.bw))


class DSACost:
    """One DSA attention module on one GPU holding ``heads`` query heads.

    The sparse attention reads ``min(keys, queries * index_topk)`` latent entries
    (:meth:`~simulator.model.sparse_attention.SparseAttentionSpec.selected`), so a decode
    step's cost stops growing once every context exceeds ``index_topk``; only the
    indexer's small per-key term keeps growing.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, heads: int, kv_dtype: str,
                 weight_dtype: str, indexed: bool = True):
        m = model.mla
        self.index = model.dsa
        self.shape = sa.DSAShape(model.hidden, heads, m.q_lora_rank or model.hidden,
                                 m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim,
                                 m.v_head_dim, model.dsa, indexed)
        fit = _fit(DSA_FIT, gpu, "DeepSeek sparse attention")
        self.fit_d, self.fit_p = fit["decode"], fit["prefill"]
        self.kv_b, self.w_b = BYTES_PER_DTYPE[kv_dtype], BYTES_PER_DTYPE[weight_dtype]
        self.peak, self.bw = gpu.peak("bf16"), gpu.hbm_bandwidth_Bps

    def decode(self, seqs: int, kv):
        """Seconds of ``seqs`` decodes reading ``kv`` cached tokens in all (array
        allowed)."""
        kv = np.asarray(kv, dtype=float)
        selected = np.minimum(kv, seqs * self.index.index_topk)
        f, b = self.shape.work(seqs, kv, selected, self.kv_b, self.w_b)
        return fitted_time(self.fit_d, f, b, self.peak, self.bw)

    def prefill(self, tokens: int, pairs: float) -> float:
        """Seconds of a prefill of ``tokens`` tokens scoring ``pairs`` causal (query,
        key) pairs (cached context included)."""
        f, b = self.shape.work(tokens, pairs, self.index.selected(pairs, tokens), self.kv_b,
                               self.w_b)
        return float(fitted_time(self.fit_p, f, b, self.peak, self.bw))
