"""Cost of proposing speculative tokens: the draft forward passes of one step, and the GPU
memory the drafter's weights take.

The drafter runs on the target's GPUs, at the target's TP degree, priced by
:class:`~simulator.model.cost.StageCost` (so CUDA-graph padding and launch floors apply as
to any step):

- ``eagle``: a one-layer head at the target's width (EAGLE, Li et al. 2024) fed the target's
  hidden states through an ``fc`` projection ``[2h -> h]`` (replicated, as in vLLM), sharing
  the target's LM head.
- ``mtp``: the model's own multi-token-prediction module (DeepSeek-V3 section 2.2): one
  transformer layer at the target's width after an ``eh_proj`` projection ``[2h -> h]``,
  reused for each of the k drafts (vLLM reuses the single MTP layer).
- ``draft_model``: a whole catalog model (e.g. Llama-3.2-1B), k sequential forwards.
- ``ngram``: prompt lookup on the CPU, no GPU time.

A step's drafting is: one pass over the ``k + 1`` verified positions of every sequence
(the accepted tokens' hidden states or tokens enter the drafter; a prefill-like shape of
``n (k + 1)`` tokens), then ``k - 1`` passes of one token per sequence. The verification
forward itself is priced by the target's stages (see :mod:`simulator.engine.speculative`).
"""

from __future__ import annotations

from simulator.hardware.specs import GPUSpec
from simulator.model.cost import StageCost
from simulator.model.memory import ExpertLayout, moe_weight_bytes_per_gpu, weight_bytes_per_gpu
from simulator.model.spec import BYTES_PER_DTYPE, ModelSpec
from simulator.parallel.collective import AllReduceCost


def draft_weight_bytes(method: str, target: ModelSpec, draft: ModelSpec | None, tp: int,
                       weight_dtype: str, layout: ExpertLayout | None = None) -> float:
    """Bytes of the drafter's weights on one GPU (0 for ``ngram``).

    eagle / mtp: one layer of the target sharded over TP plus the replicated ``[2h, h]``
    projection (the LM head and embeddings are the target's); an MTP module of a MoE / MLA
    model is its last layer as ``layout`` places it (experts included); draft_model: the
    whole model.
    """
    if method == "ngram":
        return 0.0
    if method == "draft_model":
        return weight_bytes_per_gpu(draft, tp, draft.layers, True, True, weight_dtype)
    if method == "mtp" and layout is not None:
        layer = moe_weight_bytes_per_gpu(target, tp, layout, target.layers - 1, 1, False,
                                         False, weight_dtype)
    else:
        layer = weight_bytes_per_gpu(target, tp, 1, False, False, weight_dtype)
    return layer + 2 * target.hidden * target.hidden * BYTES_PER_DTYPE[weight_dtype]


def draft_kv_bytes_per_token(method: str, target: ModelSpec, draft: ModelSpec | None,
                             tp: int, kv_dtype: str) -> float:
    """KV bytes per token of the drafter on one GPU: the draft model's layers, or the one
    eagle / mtp layer at the target's shape; 0 for ``ngram``. vLLM keeps the drafter's KV in
    the same block pool as the target's (one block table per request), so a block holds
    both and the pool has fewer blocks."""
    kv_b = BYTES_PER_DTYPE[kv_dtype]
    if method == "ngram":
        return 0.0
    if method == "draft_model":
        return float(draft.kv_bytes_per_token(kv_b, tp))
    return float(target.kv_bytes_per_token(kv_b, tp, 1))


class DraftCost:
    """Seconds to draft ``k`` tokens for ``n`` sequences, as ``time(n, sum_kv, k)``.

    Parameters
    ----------
    method : {"draft_model", "eagle", "mtp", "ngram"}
    target, draft : ModelSpec
        The served model and (``draft_model`` only) the draft model.
    gpu : GPUSpec
    tp : int
    weight_dtype, kv_dtype : str
    allreduce : AllReduceCost
        All-reduce over the TP group (the drafter shards like the target).
    layer_launch_s : float
    graph_sizes : tuple of int
    graph_mixed : bool
        As :class:`~simulator.model.cost.StageCost`.
    head : StageCost, optional
        The one-layer stage of an eagle / mtp drafter when the caller builds it (the MTP
        layer of a MoE / MLA model, priced by its own stage cost).
    """

    def __init__(self, method: str, target: ModelSpec, draft: ModelSpec | None,
                 gpu: GPUSpec, tp: int, weight_dtype: str, kv_dtype: str,
                 allreduce: AllReduceCost, layer_launch_s: float = 0.0,
                 graph_sizes: tuple[int, ...] = (), graph_mixed: bool = False,
                 head: StageCost | None = None):
        self.method = method
        self.stage: StageCost | None = None
        self.proj = False
        if method == "draft_model":
            self.stage = StageCost(draft, gpu, tp, draft.layers, True, True, weight_dtype,
                                   kv_dtype, allreduce, layer_launch_s, graph_sizes,
                                   graph_mixed)
        elif head is not None:  # a one-layer stage built by the caller (MoE / MLA MTP)
            self.stage, self.proj = head, True
        elif method in ("eagle", "mtp"):
            self.stage = StageCost(target, gpu, tp, 1, False, True, weight_dtype, kv_dtype,
                                   allreduce, layer_launch_s, graph_sizes, graph_mixed)
            self.proj = True
        self._h = target.hidden
        self._proj: dict[int, float] = {}  # projection GEMM time by token count

    def _projection(self, tokens: int) -> float:
        """The replicated ``[2h -> h]`` GEMM of eagle / mtp for ``tokens`` rows (cached)."""
        t = self._proj.get(tokens)
        if t is None:
            t = self._proj[tokens] = self.stage.gemm_time(tokens, self._h, 2 * self._h)
        return t

    def time(self, n: int, sum_kv: int, k: int) -> float:
        """Draft seconds of one step: compute + communication of every pass.

        Parameters
        ----------
        n : int
            Decoding sequences.
        sum_kv : int
            Their KV tokens before the step.
        k : int
            Tokens to draft per sequence.

        Notes
        -----
        Pass 1: ``n (k + 1)`` tokens, causal pairs ``(k+1) sum_kv + n (k+1)(k+2)/2`` after
        ``sum_kv`` cached ones, ``n`` sampled; pass j = 2..k: one token per sequence reading
        ``sum_kv + n (k + j)`` KV entries. eagle / mtp add the ``[2h -> h]`` projection
        of each pass's tokens.
        """
        st = self.stage
        if st is None or n == 0 or k == 0:
            return 0.0
        t1 = n * (k + 1)
        c, m = st.step(t1, (k + 1) * sum_kv + n * (k + 1) * (k + 2) / 2, sum_kv, 0, n)
        total = c + m
        if self.proj:
            total += self._projection(t1)
        for j in range(2, k + 1):
            c, m = st.step(n, 0.0, 0, sum_kv + n * (k + j), n)
            total += c + m
            if self.proj:
                total += self._projection(n)
        return total
