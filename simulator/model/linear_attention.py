"""Gated DeltaNet linear-attention layers (Qwen3.5, Qwen3-Next): shape, weights, state, cost.

A Gated DeltaNet layer (Yang et al., "Gated Delta Networks", ICLR 2025) keeps, per sequence
and value head, a ``d_k x d_v`` recurrent state ``S`` instead of a growing KV cache, plus
the last ``K - 1`` inputs of its short causal convolution. Decoding one token updates
``S <- a S + b k (v - S^T k)^T`` and reads ``o = S^T q``: the cost of a step is fixed per
sequence (read and write the state), not proportional to the context. Prefill runs the
chunked form (chunks of :data:`CHUNK` tokens): within a chunk attention-like products, across
chunks one state update per chunk.

Shapes are those of the Hugging Face ``Qwen3NextGatedDeltaNet`` / ``Qwen3_5GatedDeltaNet``
modules: ``in_proj_qkvz`` (h -> 2 n_k d_k + 2 n_v d_v), ``in_proj_ba`` (h -> 2 n_v), a
depth-wise ``conv1d`` over the ``2 n_k d_k + n_v d_v`` q/k/v channels (kernel K, no bias),
``A_log`` and ``dt_bias`` (n_v each), a gated RMSNorm (d_v) and ``out_proj``
(n_v d_v -> h). The recurrent state is kept in ``mamba_ssm_dtype`` (float32 in every
Qwen3.5 release; the measured decode kernel moves 4-byte states, see
:func:`decode_work`), the convolution state in 16-bit.

Kernel times come from :func:`simulator.model.fitted.fitted_time` on the work here, with
parameters fitted to AIConfigurator's measured ``gdn_perf`` tables
(:data:`simulator.model.fitted.GDN_FIT`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Chunk length of the chunked prefill kernel (``chunk_gated_delta_rule``, FLA / FlashInfer).
CHUNK = 64
#: Bytes of a 16-bit activation / convolution state element.
ACT_BYTES = 2

@dataclass(frozen=True)
class LinearAttentionSpec:
    """The Gated DeltaNet layers of a hybrid model.

    ``layers`` are the indices of the linear-attention layers (``layer_types`` entries
    ``"linear_attention"``); the others are full (softmax) attention layers with a KV cache.
    """

    key_heads: int  # n_k (linear_num_key_heads)
    key_head_dim: int  # d_k
    value_heads: int  # n_v (linear_num_value_heads)
    value_head_dim: int  # d_v
    conv_kernel: int  # K (linear_conv_kernel_dim)
    layers: tuple[int, ...]
    state_bytes: int = 4  # mamba_ssm_dtype: float32

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: q, k and v (2 n_k d_k + n_v d_v)."""
        return 2 * self.key_dim + self.value_dim

    def params(self, hidden: int) -> int:
        """Weights of one layer: in_proj_qkvz, in_proj_ba, conv1d, A_log, dt_bias, the
        gated norm and out_proj (the layer's input norm is counted with the layer)."""
        nv = self.value_heads
        return (hidden * (2 * self.key_dim + 2 * self.value_dim) + hidden * 2 * nv
                + self.conv_dim * self.conv_kernel + 2 * nv + self.value_head_dim
                + self.value_dim * hidden)

    def gemms(self, hidden: int, tp: int) -> list[tuple[int, int]]:
        """(n, k) of the layer's projections on one GPU of a TP group (heads split)."""
        return [((2 * self.key_dim + 2 * self.value_dim) // tp, hidden),
                (2 * self.value_heads // tp, hidden), (hidden, self.value_dim // tp)]

    def params_per_gpu(self, hidden: int, tp: int) -> float:
        """:meth:`params` on one GPU of a TP group of ``tp``: every part splits by heads."""
        return self.params(hidden) / tp

    def state_bytes_per_seq(self, tp: int = 1, layers: int | None = None) -> int:
        """Recurrent and convolution state of one sequence on one GPU, bytes:
        ``layers * (n_v/tp * d_k * d_v * b_state + (K-1) * conv_dim/tp * 2)``."""
        layers = len(self.layers) if layers is None else layers
        ssm = self.value_heads // tp * self.key_head_dim * self.value_head_dim
        conv = (self.conv_kernel - 1) * self.conv_dim // tp
        return layers * (ssm * self.state_bytes + conv * ACT_BYTES)


def decode_work(spec: LinearAttentionSpec, seqs: int, tp: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one layer's decode kernels for ``seqs`` sequences on one GPU.

    Per value head: decay ``a S`` (1 FLOP per state element), ``S^T k`` (2), the rank-1
    update (2) and ``S^T q`` (2): 7 d_k d_v FLOPs; the state is read and written once, the
    convolution state read and written, q/k/v in, o out.
    """
    nv, dk, dv = spec.value_heads // tp, spec.key_head_dim, spec.value_head_dim
    conv = spec.conv_dim // tp
    flops = seqs * (7.0 * nv * dk * dv + 2.0 * conv * spec.conv_kernel)
    nbytes = seqs * (2.0 * nv * dk * dv * spec.state_bytes
                     + 2.0 * (spec.conv_kernel - 1) * conv * ACT_BYTES
                     + (2 * conv + nv * dv) * ACT_BYTES)
    return flops, nbytes


def prefill_work(spec: LinearAttentionSpec, tokens: int, seqs: int,
                 tp: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one layer's chunked prefill kernels for ``tokens`` new tokens of
    ``seqs`` sequences on one GPU.

    Per token and value head (chunk C): the state terms ``q S``, ``k S`` and the chunk's
    state update (6 d_k d_v) and the intra-chunk products ``Q K^T``, ``K K^T`` and the
    ``A V`` / ``A U`` products (2 C (2 d_k + 2 d_v)); bytes: the convolution in and out,
    q/k/v/gates read, o written, and one state read and write per sequence.
    """
    nv, dk, dv = spec.value_heads // tp, spec.key_head_dim, spec.value_head_dim
    conv = spec.conv_dim // tp
    flops = tokens * (nv * (6.0 * dk * dv + 2.0 * CHUNK * (2 * dk + 2 * dv))
                      + 2.0 * conv * spec.conv_kernel)
    nbytes = (tokens * (3 * conv + nv * dv + 2 * nv) * ACT_BYTES
              + seqs * 2.0 * nv * dk * dv * spec.state_bytes)
    return flops, nbytes
