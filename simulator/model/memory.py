"""GPU memory: weights per GPU of each pipeline stage, activation reserve, KV cache blocks.

KV capacity per GPU = memory * utilization - weights - activations - runtime reserve, divided
by the bytes of one block (``block_size`` tokens of this stage's layers, REFERENCE.md s. 1).
A replica holds as many blocks as its tightest stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import ScenarioError
from simulator.model.cost import ACT_BYTES
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
    shard = model.vocab * h // tp * ACT_BYTES
    if first:
        total += shard
    if last and not (first and model.tie_word_embeddings):
        total += shard + h * ACT_BYTES
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

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size


def plan_memory(model: ModelSpec, gpu_memory_bytes: float, tp: int, pp: int,
                weight_dtype: str, kv_dtype: str, block_size: int, utilization: float,
                max_tokens: int, max_seqs: int, reserve_bytes: float) -> MemoryPlan:
    """KV blocks of one replica, or a :class:`ScenarioError` saying by how much it misses."""
    stages = split_layers(model.layers, pp)
    budget = gpu_memory_bytes * utilization
    act = activation_bytes(model, tp, max_tokens, max_seqs)
    kv_b = BYTES_PER_DTYPE[kv_dtype]
    weights, free, block = [], [], []
    for i, layers in enumerate(stages):
        w = weight_bytes_per_gpu(model, tp, layers, i == 0, i == pp - 1, weight_dtype)
        weights.append(w)
        free.append(budget - w - act - reserve_bytes)
        block.append(block_size * model.kv_bytes_per_token(kv_b, tp, layers))
    worst = min(range(pp), key=lambda i: free[i] / block[i])
    blocks = int(free[worst] // block[worst])
    if blocks < 1:
        need = (weights[worst] + act + reserve_bytes + block[worst]) / GIB
        raise ScenarioError(
            f"model.name: {model.name} ({weight_dtype}) does not fit with tp={tp}, pp={pp}: "
            f"stage {worst} needs {need:.1f} GiB per GPU (weights {weights[worst] / GIB:.1f}, "
            f"activations {act / GIB:.1f}, reserve {reserve_bytes / GIB:.1f}, one KV block) "
            f"but {budget / GIB:.1f} GiB is usable (memory x gpu_memory_utilization); short "
            f"by {need - budget / GIB:.1f} GiB. Raise tp or pp, or use fp8 weights")
    return MemoryPlan(tuple(weights), tuple(free), tuple(block), blocks, block_size)
