"""DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5): the lightning indexer and top-k MLA.

Each DSA layer is an MLA layer (:class:`~simulator.model.spec.MLASpec`) with a lightning
indexer (DeepSeek-V3.2 report, section 2.1): ``index_n_heads`` small heads of
``index_head_dim`` score every cached token for each query (``wq_b``: q_lora_rank ->
n_I d_I, ``wk``: h -> d_I with a LayerNorm, ``weights_proj``: h -> n_I), and the MLA
attention then reads only the ``index_topk`` best-scored tokens. So per query token of
context ``c``:

- indexer: ``2 n_I d_I c`` FLOPs (FP8 logits) and ``c`` indexer-key reads
  (:data:`INDEX_KEY_BYTES` each: ``d_I`` FP8 values and a 4-byte scale per 128, as vLLM's
  indexer cache stores them), growing with the context but small;
- sparse MLA: ``2 n (2 r + r_rope) min(c, k)`` FLOPs (absorbed: ``QK`` over latent + rope,
  ``PV`` over the latent) and ``min(c, k)`` latent reads: flat once ``c > index_topk``.

The whole attention module (projections, indexer, top-k and sparse FlashMLA) is priced by
:func:`simulator.model.fitted.fitted_time` on :meth:`DSAShape.work`, with parameters
fitted to AIConfigurator's measured ``dsa_*_module_perf`` tables
(:data:`simulator.model.fitted.DSA_FIT`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bytes of one token's indexer key per layer: 128 FP8 values and one fp32 scale.
INDEX_KEY_BYTES_PER_DIM = 1 + 4 / 128
ACT_BYTES = 2

@dataclass(frozen=True)
class SparseAttentionSpec:
    """The lightning indexer of a DSA model (``index_n_heads``, ``index_head_dim``,
    ``index_topk``)."""

    index_heads: int  # n_I
    index_head_dim: int  # d_I
    index_topk: int  # k
    # Layers that run their own indexer (None: every layer); the others reuse the top-k
    # indices of an earlier layer (GLM-5.2 ``indexer_types`` "shared"): no indexer weights,
    # keys or scoring.
    indexed_layers: tuple[int, ...] | None = None

    def indexed(self, start: int, layers: int) -> int:
        """Layers among ``start .. start+layers-1`` with their own indexer."""
        if self.indexed_layers is None:
            return layers
        return sum(1 for i in self.indexed_layers if start <= i < start + layers)

    def indexer_params(self, hidden: int, q_lora_rank: int) -> int:
        """wq_b, wk, the key LayerNorm (weight and bias) and weights_proj of one layer."""
        n, d = self.index_heads, self.index_head_dim
        return q_lora_rank * n * d + hidden * d + 2 * d + hidden * n

    @property
    def key_bytes(self) -> float:
        """Indexer-cache bytes per token and layer (FP8 keys with their scales)."""
        return self.index_head_dim * INDEX_KEY_BYTES_PER_DIM

    def selected(self, keys: float, queries: float) -> float:
        """Keys the sparse attention reads for ``queries`` queries over ``keys`` (query,
        key) pairs in all: at most ``index_topk`` per query, ``min(keys, queries k)``
        (exact for one query; an upper bound of the per-query sum for several)."""
        return min(keys, queries * self.index_topk)


@dataclass(frozen=True)
class DSAShape:
    """Per-GPU sizes of one DSA attention module (``heads`` query heads on the GPU)."""

    hidden: int
    heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope: int
    qk_rope: int
    v_head: int
    index: SparseAttentionSpec
    indexed: bool = True  # False: a layer reusing another layer's top-k (no indexer)

    @property
    def weights(self) -> float:
        """Parameters of the module on the GPU (MLA projections, absorbed, and indexer)."""
        h, n = self.hidden, self.heads
        qk = self.qk_nope + self.qk_rope
        return (h * self.q_lora_rank + self.q_lora_rank * n * qk
                + h * (self.kv_lora_rank + self.qk_rope)
                + n * self.kv_lora_rank * (self.qk_nope + self.v_head) + n * self.v_head * h
                + (self.index.indexer_params(h, self.q_lora_rank) if self.indexed else 0))

    def work(self, tokens: float, index_pairs: float, selected: float, kv_bytes: float,
             w_bytes: float) -> tuple[float, float]:
        """(FLOPs, bytes) of the module for ``tokens`` query tokens whose indexer scores
        ``index_pairs`` (query, key) pairs and whose attention reads ``selected`` keys."""
        ix, n, r = self.index, self.heads, self.kv_lora_rank
        index_pairs = index_pairs if self.indexed else 0.0
        flops = (2.0 * tokens * self.weights
                 + 2.0 * ix.index_heads * ix.index_head_dim * index_pairs
                 + 2.0 * n * (2 * r + self.qk_rope) * selected)
        nbytes = (self.weights * w_bytes + index_pairs * ix.key_bytes
                  + selected * (r + self.qk_rope) * kv_bytes
                  + tokens * (2 * self.hidden + (r + self.qk_rope) + ix.index_head_dim)
                  * ACT_BYTES)
        return flops, nbytes
