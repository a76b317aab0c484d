"""GPU memory: weights per GPU of each pipeline stage, activation reserve, KV cache blocks.

KV capacity per GPU = memory * utilization - weights - activations - runtime reserve, divided
by the bytes of one block (``block_size`` tokens of this stage's layers, REFERENCE.md s. 1).
A replica holds as many blocks as its tightest stage.

Mixture-of-experts and MLA models (:func:`plan_moe_memory`) plan one rank of a stage: its
attention weights (TP-sharded, or whole under attention DP), its routed experts (``E / ep``
whole experts, plus its share of redundant ones, or every expert sliced by TP when ep = 1),
shared experts and dense layers following the attention layout, and its KV cache: an MLA
cache is replicated on every rank of a TP group, while under attention DP each rank holds
the KV of its own requests, so the replica's KV capacity is ``tp`` times one rank's.

Hybrid models (Gated DeltaNet layers, :mod:`simulator.model.linear_attention`) take the
same per-rank plan: only their full-attention layers hold KV blocks, and the fixed-size
recurrent state of every sequence the engine may run at once (``max_num_seqs``, per rank
under attention DP) is set aside before the KV blocks are counted, as vLLM's hybrid cache
manager gives each running request its state pages (mamba_cache_mode "none": one state
per request). DeepSeek sparse attention adds its indexer weights (replicated) and its
FP8 indexer keys to every token's cache (:meth:`ModelSpec.kv_bytes_per_token`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.errors import ScenarioError
from simulator.model.cost import ACT_BYTES
from simulator.model.quant import SCALE_BYTES
from simulator.model.spec import BYTES_PER_DTYPE, ModelSpec, kv_heads_per_gpu

GIB = 1024**3


def split_layers(layers: int, pp: int) -> list[int]:
    """Layers per stage: as even as possible, earlier stages take the remainder."""
    base, extra = divmod(layers, pp)
    return [base + (1 if i < extra else 0) for i in range(pp)]


def weight_bytes_per_gpu(model: ModelSpec, tp: int, layers: int, first: bool, last: bool,
                         weight_dtype: str) -> float:
    """Bytes of weights on one GPU of a stage holding ``layers`` layers.

    Linear layers are in ``weight_dtype``; embeddings, LM head and norms stay 16-bit. Q and O
    shard over TP; K and V shard up to n_kv heads and replicate beyond.
    """
    h, d = model.hidden, model.head_dim
    kvh = kv_heads_per_gpu(model.kv_heads, tp)
    linear = (h * (model.q_heads // tp + 2 * kvh) * d + (model.q_heads // tp) * d * h
              + model.mlp_params_per_layer // tp)
    total = layers * (linear * BYTES_PER_DTYPE[weight_dtype] + 2 * h * ACT_BYTES)
    return float(total + embedding_bytes(model, tp, first, last))


def embedding_bytes(model: ModelSpec, tp: int, first: bool, last: bool) -> float:
    """16-bit vocabulary shards on one GPU: the embedding on the first stage, the LM head
    and final norm on the last (one shared table when they are tied and on one stage)."""
    shard = model.vocab * model.hidden // tp * ACT_BYTES
    total = shard if first else 0
    if last and not (first and model.tie_word_embeddings):
        total += shard + model.hidden * ACT_BYTES
    return float(total)


def activation_bytes(model: ModelSpec, tp: int, max_tokens: int, max_seqs: int) -> float:
    """Peak activation memory of a step of ``max_tokens`` tokens (what vLLM profiles).

    Residual stream and norm outputs (4h), QKV output, gated MLP intermediates (2 * 2I/tp),
    in 16-bit, plus fp32 logits of ``max_seqs`` sequences.
    """
    d = model.head_dim
    per_token = (4 * model.hidden + (model.q_heads // tp + 2 * kv_heads_per_gpu(
        model.kv_heads, tp)) * d + 4 * model.intermediate // tp) * ACT_BYTES
    return float(max_tokens * per_token + max_seqs * (model.vocab // tp) * 4)


@dataclass(frozen=True)
class MemoryPlan:
    """Memory of one replica: per-stage weights and free bytes, and KV blocks."""

    weights_per_gpu: tuple[float, ...]
    kv_bytes_per_gpu: tuple[float, ...]
    block_bytes_per_gpu: tuple[int, ...]
    kv_blocks: int
    block_size: int
    note: str = ""  # how the KV cache and experts are laid out (MoE / MLA models)
    state_bytes_per_gpu: float = 0.0  # recurrent state set aside (hybrid models), worst stage

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size


def plan_memory(model: ModelSpec, gpu_memory_bytes: float, tp: int, pp: int,
                weight_dtype: str, kv_dtype: str, block_size: int, utilization: float,
                max_tokens: int, max_seqs: int, reserve_bytes: float) -> MemoryPlan:
    """KV blocks of one replica, or a :class:`ScenarioError` saying by how much it misses."""
    stages = split_layers(model.layers, pp)
    weights = [weight_bytes_per_gpu(model, tp, layers, i == 0, i == pp - 1, weight_dtype)
               for i, layers in enumerate(stages)]
    kv_b = BYTES_PER_DTYPE[kv_dtype]
    block = [block_size * model.kv_bytes_per_token(kv_b, tp, layers) for layers in stages]
    act = activation_bytes(model, tp, max_tokens, max_seqs)
    free, blocks = _fit(weights, block, act, reserve_bytes, gpu_memory_bytes * utilization,
                        f"{model.name} ({weight_dtype}) does not fit with tp={tp}, pp={pp}",
                        "Raise tp or pp, or use fp8 weights")
    return MemoryPlan(tuple(weights), free, tuple(block), blocks, block_size)


def _fit(weights: list[float], block: list[int], act: float, reserve_bytes: float,
         budget: float, what: str, advice: str,
         state: list[float] | None = None) -> tuple[tuple[float, ...], int]:
    """Free bytes per stage GPU and the KV blocks of the tightest stage, or a
    :class:`ScenarioError` saying ``what`` and by how many GiB the tightest stage misses.
    ``state``: bytes of recurrent state set aside per stage GPU (hybrid models)."""
    state = state or [0.0] * len(weights)
    free = tuple(budget - w - act - reserve_bytes - st for w, st in zip(weights, state,
                                                                         strict=True))
    worst = min(range(len(weights)), key=lambda i: free[i] / block[i])
    blocks = int(free[worst] // block[worst])
    if blocks < 1:
        need = (weights[worst] + act + reserve_bytes + state[worst] + block[worst]) / GIB
        held = f", recurrent state {state[worst] / GIB:.1f}" if state[worst] else ""
        raise ScenarioError(
            f"model.name: {what}: stage {worst} needs {need:.1f} GiB per GPU (weights "
            f"{weights[worst] / GIB:.1f}, activations {act / GIB:.1f}, reserve "
            f"{reserve_bytes / GIB:.1f}{held}, one KV block) but {budget / GIB:.1f} GiB is "
            f"usable "
            f"(memory x gpu_memory_utilization); short by {need - budget / GIB:.1f} GiB. "
            f"{advice}")
    return free, blocks


@dataclass(frozen=True)
class ExpertLayout:
    """How a MoE / MLA model spreads over the ``tp`` GPUs of a stage.

    ``ep`` divides ``tp``: the experts spread over ``ep`` ranks, each expert sliced over
    ``tp / ep`` GPUs (1: every expert sliced over the TP group, MoE-TP; ``tp``: whole
    experts). ``attention_dp``: the stage splits into ``tp / attention_tp`` attention
    groups, each running attention (and the dense layers and shared experts) for its own
    requests, TP-sharded over its ``attention_tp`` GPUs (1: whole weights).
    ``expert_dtype`` is the dtype experts run in (the release's own where it declares one).
    """

    ep: int = 1
    attention_dp: bool = False
    redundant_experts: int = 0
    expert_dtype: str = "bf16"
    attention_tp: int = 1

    def experts_per_rank(self, experts: int) -> int:
        """Routed experts one EP rank holds: ceil((E + redundant) / ep)."""
        return math.ceil((experts + self.redundant_experts) / self.ep)

    def attn_tp(self, tp: int) -> int:
        """GPUs one request's attention is TP-sharded over in a stage of ``tp`` GPUs."""
        return self.attention_tp if self.attention_dp else tp

    def groups(self, tp: int) -> int:
        """Attention-DP groups of a stage of ``tp`` GPUs (1 under TP attention)."""
        return tp // self.attn_tp(tp)


def attention_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """Attention weights of one layer on one GPU of a TP group of ``tp`` (1: whole).

    GQA: Q and O shard over TP, K and V up to n_kv heads. MLA: the down projections
    (h x q_lora_rank, h x (kv_lora_rank + rope)) and their norms are replicated, the
    per-head up projections and O shard over TP.
    """
    h, d = model.hidden, model.head_dim
    if model.mla is None:
        kvh = kv_heads_per_gpu(model.kv_heads, tp)
        return h * (model.q_heads // tp + 2 * kvh) * d + (model.q_heads // tp) * d * h
    m = model.mla
    down = h * m.q_lora_rank + m.q_lora_rank + h * m.cache_width + m.kv_lora_rank
    # DSA's lightning indexer is replicated on every rank (vLLM: ReplicatedLinear).
    # (GLM-5.2: the indexed share of the layers, as an average per layer)
    index = (model.dsa.indexer_params(h, m.q_lora_rank) * model.dsa.indexed(0, model.layers)
             / model.layers if model.dsa is not None else 0)
    return down + (model.attn_params_per_layer - down) / tp + index


def expert_bytes_per_weight(model: ModelSpec, dtype: str) -> float:
    """Bytes of one routed-expert weight stored in ``dtype``: the dtype's bytes, plus the
    scales of the release's scheme when the experts run as shipped (NVFP4: one FP8 per 16
    weights; int4: one 16-bit per group of 32)."""
    moe = model.moe
    scheme = moe.expert_scheme if moe is not None and dtype == moe.expert_dtype else None
    extra = SCALE_BYTES[scheme] if scheme in ("nvfp4", "int4") else 0.0
    return BYTES_PER_DTYPE[dtype] + extra


def state_bytes_per_gpu(model: ModelSpec, tp: int, start: int, layers: int,
                        seqs: int) -> float:
    """Recurrent state of ``seqs`` sequences over the linear-attention layers among
    ``start .. start+layers-1`` on one GPU of a TP group of ``tp`` (0 without any)."""
    if model.linear is None:
        return 0.0
    n_lin = layers - model.full_attention_layers(start, layers)
    return float(seqs * model.linear.state_bytes_per_seq(tp, n_lin))


def moe_weight_bytes_per_gpu(model: ModelSpec, tp: int, layout: ExpertLayout, start: int,
                             layers: int, first: bool, last: bool, weight_dtype: str) -> float:
    """Bytes of weights on one rank of a stage holding layers ``start .. start+layers-1``.

    Attention, dense MLPs and shared experts shard over TP (whole under attention DP); the
    routers and norms stay 16-bit and whole; routed experts are ``experts_per_rank`` whole
    experts sliced over ``tp / ep`` GPUs (whole at ep = tp, all experts sliced by TP at
    ep = 1), in ``layout.expert_dtype``.
    """
    h, w_b = model.hidden, BYTES_PER_DTYPE[weight_dtype]
    attn_tp = layout.attn_tp(tp)
    moe_set = set(model.moe.layers) if model.moe else set()
    n_moe = sum(1 for i in range(start, start + layers) if i in moe_set)
    attn = attention_params_per_gpu(model, attn_tp) * w_b
    total = layers * (attn + 2 * h * ACT_BYTES)
    if model.linear is not None:  # Gated DeltaNet layers instead of full attention
        n_lin = layers - model.full_attention_layers(start, layers)
        total += n_lin * (model.linear.params_per_gpu(h, attn_tp) * w_b - attn)
    total += (layers - n_moe) * model.mlp_params_per_layer / attn_tp * w_b
    if n_moe:
        m = model.moe
        e_b = expert_bytes_per_weight(model, layout.expert_dtype)
        if layout.ep >= tp:
            experts = layout.experts_per_rank(m.experts) * m.expert_params(h)
        else:  # each expert sliced over tp / ep GPUs
            experts = layout.experts_per_rank(m.experts) * m.expert_params(h) / (tp // layout.ep)
        per = (m.router_params(h) * ACT_BYTES + experts * e_b
               + 3 * h * m.shared_intermediate / attn_tp * w_b)
        total += n_moe * per
    return float(total + embedding_bytes(model, tp, first, last))


def moe_activation_bytes(model: ModelSpec, tp: int, layout: ExpertLayout, max_tokens: int,
                         max_seqs: int) -> float:
    """Peak activations of one rank: the attention part of :func:`activation_bytes` for
    the rank's tokens (``max_tokens / groups`` under attention DP), plus the dispatched
    tokens of a MoE layer (``max_tokens * k / ep`` rows of h in and out, and the gated
    intermediates of the rank's expert slice)."""
    attn_tp = layout.attn_tp(tp)
    groups = layout.groups(tp)
    rank_tokens = math.ceil(max_tokens / groups) if layout.attention_dp else max_tokens
    dense = activation_bytes(model, attn_tp, rank_tokens, max_seqs)
    if model.moe is None:
        return dense
    m = model.moe
    moe_tp = tp // layout.ep
    routed = max_tokens * m.top_k / layout.ep
    return dense + routed * (2 * model.hidden + 4 * m.intermediate / moe_tp) * ACT_BYTES


def hybrid_block_tokens(model: ModelSpec, kv_bytes: float, tp: int) -> int:
    """vLLM's attention block of a hybrid model, tokens: the fewest multiple of 16 whose
    page (one layer's KV of that many tokens on one GPU of a TP group of ``tp``) holds one
    layer's recurrent state of one sequence, so that both share one block pool (vLLM
    ``HybridAttentionMambaModelConfig.verify_and_update_config``: ``16 * cdiv(mamba_page,
    16 * attn_page_1_token)``; Qwen3.5-27B in bf16 on one GPU: 784)."""
    attn = 2 * kv_heads_per_gpu(model.kv_heads, tp) * model.head_dim * kv_bytes
    return 16 * math.ceil(model.linear.state_bytes_per_seq(tp, 1) / (16 * attn))


def plan_moe_memory(model: ModelSpec, gpu_memory_bytes: float, tp: int, pp: int,
                    layout: ExpertLayout, weight_dtype: str, kv_dtype: str, block_size: int,
                    utilization: float, max_tokens: int, max_seqs: int,
                    reserve_bytes: float, snapshot_tokens: int = 0) -> MemoryPlan:
    """:func:`plan_memory` for a MoE or MLA model, one rank at a time.

    The replica's KV blocks are those of its tightest stage, times ``tp`` under attention
    DP (each attention group caches its own requests). Raises a :class:`ScenarioError` that says by
    how much the tightest rank misses.

    ``snapshot_tokens`` > 0 (a hybrid model under vLLM's prefix caching, ``mamba_cache_mode
    = "align"``): the recurrent state is kept as one snapshot per ``snapshot_tokens`` of
    every sequence, in the same block pool as the KV, instead of one state per running
    sequence; each KV block then carries ``block_size / snapshot_tokens`` of a snapshot.
    """
    stages = split_layers(model.layers, pp)
    starts = [sum(stages[:i]) for i in range(pp)]
    weights = [moe_weight_bytes_per_gpu(model, tp, layout, starts[i], layers, i == 0,
                                        i == pp - 1, weight_dtype)
               for i, layers in enumerate(stages)]
    kv_b = BYTES_PER_DTYPE[kv_dtype]
    kv_tp = layout.attn_tp(tp)
    groups = layout.groups(tp)
    block = [block_size * model.kv_bytes_per_token(
        kv_b, kv_tp, model.full_attention_layers(starts[i], layers))
        for i, layers in enumerate(stages)]
    rank_seqs = math.ceil(max_seqs / groups)
    state = [state_bytes_per_gpu(model, kv_tp, starts[i], layers, rank_seqs)
             for i, layers in enumerate(stages)]
    if snapshot_tokens:
        block = [b + round(block_size * st / rank_seqs / snapshot_tokens)
                 for b, st in zip(block, state, strict=True)]
        state = [0.0] * len(stages)
    act = moe_activation_bytes(model, tp, layout, max_tokens, max_seqs)
    how = (f"ep={layout.ep}, attention_dp={str(layout.attention_dp).lower()}, "
           + (f"attention_tp={layout.attention_tp}, " if layout.attn_tp(tp) > 1
              and layout.attention_dp else "")
           + f"redundant_experts={layout.redundant_experts}")
    budget = gpu_memory_bytes * utilization
    advice = "Add GPUs (tp/ep or pp), or use lower-precision weights"
    q = model.quant
    if q is not None and q.attention != weight_dtype and q.attention != "bf16":
        advice += (f" (the release ships in {q.scheme}: model.weight_dtype = "
                   f"\"{q.attention}\")")
    if model.linear is not None:
        advice += _state_advice(weights, block, state, act + reserve_bytes, budget, rank_seqs,
                                groups)
    free, blocks = _fit(weights, block, act, reserve_bytes, budget,
                        f"{model.name} ({weight_dtype}, experts {layout.expert_dtype}) does "
                        f"not fit with tp={tp}, pp={pp}, {how}", advice, state)
    replicas = groups
    return MemoryPlan(tuple(weights), free, tuple(block), blocks * replicas, block_size,
                      _note(model, tp, layout), max(state))


def _state_advice(weights: list[float], block: list[int], state: list[float], fixed: float,
                  budget: float, seqs: int, ranks: int) -> str:
    """How many sequences' recurrent states fit beside the weights and one KV block on
    the tightest stage, times the ``ranks`` that cache their own requests (attention DP):
    the most ``engine.max_num_seqs`` may be."""
    fits = min(int((budget - w - fixed - b) // (st / seqs)) if st else seqs
               for w, b, st in zip(weights, block, state, strict=True))
    if fits >= seqs:
        return ""
    return (f"; or lower engine.max_num_seqs to at most {max(fits, 0) * ranks} (each "
            f"running sequence holds its recurrent state: {state[0] / seqs / 2**20:.1f} MiB "
            f"per GPU on stage 0)")


def _note(model: ModelSpec, tp: int, layout: ExpertLayout) -> str:
    """One line on the layout: experts per GPU, and where the KV cache lives."""
    parts = []
    if model.moe is not None:
        if layout.ep > 1:
            extra = (f" (with {layout.redundant_experts} redundant over the group)"
                     if layout.redundant_experts else "")
            what = ("whole experts" if layout.ep == tp else
                    f"experts, each sliced {tp // layout.ep} ways (MoE-TP{tp // layout.ep})")
            parts.append(f"EP{layout.ep}: {layout.experts_per_rank(model.moe.experts)} "
                         f"{what} per GPU{extra}")
        else:
            parts.append(f"all {model.moe.experts} experts sliced {tp} ways (MoE-TP)")
        parts.append(f"experts in {layout.expert_dtype}")
    if layout.attention_dp and layout.attn_tp(tp) > 1:
        parts.append(f"attention DP{layout.groups(tp)} x TP{layout.attn_tp(tp)}: each group "
                     f"of {layout.attn_tp(tp)} GPUs caches its own requests' KV")
    elif layout.attention_dp:
        parts.append(f"attention DP: each of {tp} GPUs caches its own requests' KV")
    elif model.mla is not None and tp > 1:
        parts.append(f"MLA cache replicated on all {tp} GPUs of the TP group (attention_dp "
                     f"would hold {tp}x the tokens)")
    return "; ".join(parts)


def weight_classes(model: ModelSpec, tp: int, layout: ExpertLayout, layers: int,
                   last: bool, weight_dtype: str) -> list[tuple[str, float, str]]:
    """(class, bytes on one GPU, dtype) of the first pipeline stage (layers
    ``0 .. layers-1``), for ``validate``: the terms of :func:`moe_weight_bytes_per_gpu`
    grouped by layer class, so they add up to it."""
    h, w_b = model.hidden, BYTES_PER_DTYPE[weight_dtype]
    attn_tp = 1 if layout.attention_dp else tp
    n_full = model.full_attention_layers(0, layers)
    attn = n_full * attention_params_per_gpu(model, attn_tp)
    if model.linear is not None:
        attn += (layers - n_full) * model.linear.params_per_gpu(h, attn_tp)
    n_moe = sum(1 for i in model.moe.layers if i < layers) if model.moe else 0
    rows = [("attention", attn * w_b, weight_dtype),
            ("dense MLP", (layers - n_moe) * model.mlp_params_per_layer / attn_tp * w_b,
             weight_dtype)]
    if n_moe:
        m, lay = model.moe, layout
        per = (lay.experts_per_rank(m.experts) if lay.ep > 1
               else (m.experts + lay.redundant_experts) / tp)
        rows += [("routed experts", n_moe * per * m.expert_params(h)
                  * expert_bytes_per_weight(model, lay.expert_dtype), lay.expert_dtype),
                 ("shared experts", n_moe * 3 * h * m.shared_intermediate / attn_tp * w_b,
                  weight_dtype),
                 ("routers", n_moe * m.router_params(h) * ACT_BYTES, "bf16")]
    rows.append(("embedding, LM head, norms", embedding_bytes(model, tp, True, last)
                 + layers * 2 * h * ACT_BYTES, "bf16"))
    return [r for r in rows if r[1]]
