"""Reading config.json fields: whole numbers, the layer kinds, and the new layer families.

:func:`int_field` checks one numeric field; :func:`layer_types` reads ``layer_types`` (or
the pattern ``full_attention_interval`` implies) and refuses a kind the simulator cannot
price; :func:`linear_spec` and :func:`dsa_spec` build the Gated DeltaNet and DeepSeek
sparse-attention parts; :data:`UNPRICED` names the keys of architectures refused outright.
"""

from __future__ import annotations

from simulator.errors import ScenarioError
from simulator.files import excerpt
from simulator.model.linear_attention import LinearAttentionSpec
from simulator.model.sparse_attention import SparseAttentionSpec

#: Largest value a config.json field may hold: far above any released model, low enough
#: that the tables built from it (per layer, per expert) stay small. Other fields: 2^24.
FIELD_MAX = {"num_hidden_layers": 1024, "n_routed_experts": 4096, "num_local_experts": 4096,
             "num_experts": 4096, "num_experts_per_tok": 4096, "num_attention_heads": 4096,
             "num_key_value_heads": 4096, "n_shared_experts": 4096,
             "num_nextn_predict_layers": 64}
FIELD_DEFAULT_MAX = 2**24


def int_field(config: dict, key: str, default=None, minimum: int = 1) -> int:
    """A whole-number field in [``minimum``, :data:`FIELD_MAX`], or a ScenarioError naming
    it (a value shown as a short excerpt)."""
    value = config.get(key, default)
    if value is None:
        raise ScenarioError(f"model.name: config.json lacks the field {key!r}")
    top = FIELD_MAX.get(key, FIELD_DEFAULT_MAX)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()) or not (
            minimum <= value <= top):
        raise ScenarioError(f"model.name: config.json field {key!r} = {excerpt(value)} is "
                            f"not an integer in [{minimum}, {top}]")
    return int(value)


#: layer_types entries the parser knows (deepseek_sparse_attention: a full-attention MLA
#: layer with a DSA indexer, as GLM-5.2's NVFP4 release spells it).
LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention",
               "deepseek_sparse_attention")
#: Architectures whose keys name a layer kind the simulator cannot price yet, and why.
UNPRICED = {
    "hybrid_override_pattern": "Mamba2 layers (Nemotron-H / Nemotron-3) are not modelled",
    "compress_ratios": "DeepSeek-V4 compressed sparse attention (CSA / HCA) is not modelled",
    "linear_attn_config": "Kimi Delta Attention (KDA) layers, with Kimi-K3's latent MoE "
                          "(routed_expert_hidden_size) and SiTU activation, are not modelled",
    "sparse_attention_config": "MiniMax sparse attention (MSA) is not modelled",
    "layers_block_type": "Mamba2 layers (Nemotron-3 Ultra) are not modelled",
    "block_configs": "per-layer searched blocks (Llama-Nemotron: each layer its own "
                     "attention and MLP widths, some without attention) are not modelled",
    "hybrid_layer_pattern": "MiMo-V2 layers of two attention kinds with their own head "
                            "counts (swa_num_key_value_heads) are not modelled",
    "global_head_dim": "Gemma 4's global-attention layers with their own head size and "
                       "key-equals-value heads (attention_k_eq_v) are not modelled",
}
#: mamba_ssm_dtype values and the bytes of one recurrent-state element.
STATE_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}


def layer_types(config: dict, layers: int) -> list[str] | None:
    """``layer_types`` (checked), or the pattern ``full_attention_interval`` implies."""
    types = config.get("layer_types")
    if types is None and config.get("full_attention_interval"):
        k = int_field(config, "full_attention_interval")
        return ["full_attention" if (i + 1) % k == 0 else "linear_attention"
                for i in range(layers)]
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != layers:
        raise ScenarioError(f"model.name: config.json field 'layer_types' must list {layers} "
                            f"entries (num_hidden_layers)")
    bad = next((t for t in types if t not in LAYER_TYPES), None)
    if bad is not None:
        raise ScenarioError(f"model.name: config.json field 'layer_types' has {excerpt(bad)}, "
                            f"which the simulator cannot price (allowed: "
                            f"{', '.join(LAYER_TYPES)})")
    return types


def linear_spec(config: dict, types: list[str] | None) -> LinearAttentionSpec | None:
    """The Gated DeltaNet layers of a hybrid model (Qwen3.5, Qwen3-Next), or None."""
    if not types or "linear_attention" not in types:
        return None
    dtype = config.get("mamba_ssm_dtype", "float32")
    if dtype not in STATE_DTYPES:
        raise ScenarioError(f"model.name: config.json field 'mamba_ssm_dtype' = "
                            f"{excerpt(dtype)} is not supported (allowed: "
                            f"{', '.join(STATE_DTYPES)})")
    spec = LinearAttentionSpec(
        int_field(config, "linear_num_key_heads"), int_field(config, "linear_key_head_dim"),
        int_field(config, "linear_num_value_heads"), int_field(config, "linear_value_head_dim"),
        int_field(config, "linear_conv_kernel_dim"),
        tuple(i for i, t in enumerate(types) if t == "linear_attention"), STATE_DTYPES[dtype])
    if spec.value_heads % spec.key_heads:
        raise ScenarioError(f"model.name: config.json field 'linear_num_value_heads' = "
                            f"{spec.value_heads} is not a multiple of linear_num_key_heads = "
                            f"{spec.key_heads}")
    return spec


def dsa_spec(config: dict, mla) -> SparseAttentionSpec | None:
    """The lightning indexer of a DeepSeek-sparse-attention model (over ``mla``, the
    model's MLASpec), or None."""
    if "index_topk" not in config:
        return None
    if mla is None:
        raise ScenarioError("model.name: config.json field 'index_topk' (DeepSeek sparse "
                            "attention) needs an MLA model (kv_lora_rank)")
    types = config.get("indexer_types")
    layers = int_field(config, "num_hidden_layers")
    if types is not None and (not isinstance(types, list) or len(types) != layers
                              or any(t not in ("full", "shared") for t in types)):
        raise ScenarioError(f"model.name: config.json field 'indexer_types' must list "
                            f"{layers} entries of full, shared")
    if types is None and config.get("index_topk_freq", 1) != 1:
        raise ScenarioError(f"model.name: config.json field 'index_topk_freq' = "
                            f"{excerpt(config['index_topk_freq'])} without 'indexer_types' is not "
                            f"supported (allowed: 1, or list the layers in indexer_types)")
    indexed = (None if types is None or all(t == "full" for t in types)
               else tuple(i for i, t in enumerate(types) if t == "full"))
    return SparseAttentionSpec(int_field(config, "index_n_heads"),
                               int_field(config, "index_head_dim"),
                               int_field(config, "index_topk"), indexed)
