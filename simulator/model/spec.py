"""Model architecture from a Hugging Face ``config.json``: sizes, parameters, bytes.

A catalog name (``llama-3.1-70b``) loads ``simulator/model/configs/<name>.json``; a value
that ends with ``.json`` or names a directory is a path to a config.json (relative to the
scenario file). Decoder-only transformers with (grouped-query) attention or multi-head
latent attention (MLA, DeepSeek-V3), a gated or plain MLP, and optionally mixture-of-experts
layers (routed experts with top-k routing, shared experts, a per-layer dense / MoE pattern)
and sliding-window or chunked attention on some layers; hybrid models whose
``layer_types`` mix Gated DeltaNet linear-attention layers with full attention (Qwen3.5,
Qwen3-Next: :mod:`simulator.model.linear_attention`); DeepSeek sparse attention over MLA
(DeepSeek-V3.2, GLM-5: :mod:`simulator.model.sparse_attention`); and the precision a
release ships in, per layer class (:mod:`simulator.model.quant`). A field the simulator
cannot express is a :class:`ScenarioError` that names it: never a silent dense
approximation.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.files import excerpt, load_json
from simulator.model.config_fields import UNPRICED, dsa_spec, layer_types, linear_spec
from simulator.model.config_fields import int_field as _int
from simulator.model.linear_attention import LinearAttentionSpec
from simulator.model.quant import QuantSpec, module_names, parse_quant
from simulator.model.sparse_attention import SparseAttentionSpec
from simulator.paths import MODEL_CONFIGS, catalog

#: Bytes per element. int4 and fp4 pack two weights per byte (scales are ignored: < 1%).
BYTES_PER_DTYPE = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5, "fp4": 0.5}
#: Dtypes the KV cache can be stored in.
KV_DTYPES = ("bf16", "fp16", "fp8")
GATED_ACTIVATIONS = {"silu", "swiglu", "gelu_pytorch_tanh", "geglu"}
#: quantization_config.quant_method values a release may ship in, and the weight dtype
#: they mean (fp8: DeepSeek's 128 x 128 block-scaled e4m3; mxfp4: gpt-oss experts).
NATIVE_QUANT = {"fp8": "fp8", "mxfp4": "fp4"}


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts layers: routed experts, top-k routing, shared experts.

    ``layers`` are the indices of the MoE layers; the others run a dense MLP of
    ``ModelSpec.intermediate``. ``shared_intermediate`` is the total intermediate size of
    the shared experts (0: none). ``expert_dtype`` is the dtype the release ships its
    experts in when it differs from the rest (gpt-oss: MXFP4), else None.
    """

    experts: int  # E
    top_k: int  # k
    intermediate: int  # I_e, per routed expert
    shared_intermediate: int  # I_s, all shared experts together
    layers: tuple[int, ...]
    router_bias: bool = False
    expert_bias: bool = False
    expert_dtype: str | None = None
    expert_scheme: str | None = None  # quant.SCHEMES key of expert_dtype (nvfp4, mxfp4, ...)

    def expert_params(self, hidden: int) -> int:
        """Gate, up and down projections of one routed expert: 3 h I_e (+ biases)."""
        bias = 2 * self.intermediate + hidden if self.expert_bias else 0
        return 3 * hidden * self.intermediate + bias

    def router_params(self, hidden: int) -> int:
        return hidden * self.experts + (self.experts if self.router_bias else 0)


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank Q and a compressed KV latent.

    Per token and layer the cache holds the latent (``kv_lora_rank``) and the shared rotary
    key (``qk_rope_head_dim``): it has no heads, so TP cannot shard it.
    """

    q_lora_rank: int  # 0: Q projected from the hidden state directly
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def cache_width(self) -> int:
        """Values cached per token and layer: kv_lora_rank + qk_rope_head_dim."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelSpec:
    """Sizes of a decoder-only transformer (notation of REFERENCE.md section 1)."""

    name: str
    hidden: int  # h
    layers: int  # L
    q_heads: int  # n_q
    kv_heads: int  # n_kv
    head_dim: int  # d
    intermediate: int  # I (the dense MLP)
    vocab: int  # V
    max_position_embeddings: int
    gated_mlp: bool = True
    tie_word_embeddings: bool = False
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    # Sliding-window (or chunked) attention: the window in tokens and which layers use it.
    sliding_window: int | None = None
    window_layers: tuple[int, ...] = ()
    attention_bias: bool = False
    # The weight dtype the release ships in (quantization_config), None for 16-bit.
    native_dtype: str | None = None
    mtp_layers: int = 0  # multi-token prediction modules (num_nextn_predict_layers)
    # Hybrid linear attention (Gated DeltaNet layers), DeepSeek sparse attention, the
    # release's per-class precision; Qwen3-Next / Qwen3.5 full-attention layers gate
    # their output (q_proj twice as wide) and normalise q and k (2 d weights).
    linear: LinearAttentionSpec | None = None
    dsa: SparseAttentionSpec | None = None
    quant: QuantSpec | None = None
    attn_output_gate: bool = False

    @property
    def layer_plan(self) -> bool:
        """Whether the model is priced layer by layer (MoE, MLA or hybrid layers:
        :mod:`simulator.model.moe_stage`, :func:`~simulator.model.memory.plan_moe_memory`)."""
        return self.moe is not None or self.mla is not None or self.linear is not None

    def full_attention_layers(self, start: int = 0, layers: int | None = None) -> int:
        """Layers among ``start .. start+layers-1`` with a KV cache (not linear attention)."""
        layers = self.layers - start if layers is None else layers
        if self.linear is None:
            return layers
        lin = set(self.linear.layers)
        return sum(1 for i in range(start, start + layers) if i not in lin)

    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V and output projections: h*(n_q + 2 n_kv)*d + n_q*d*h (MLA: the low-rank
        Q and KV projections, their norms and the output projection)."""
        h, d = self.hidden, self.head_dim
        if self.mla is not None:
            m, n = self.mla, self.q_heads
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * n * qk
                 if m.q_lora_rank else h * n * qk)
            kv = h * m.cache_width + m.kv_lora_rank + m.kv_lora_rank * n * (
                m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + n * m.v_head_dim * h
        bias = (self.q_heads + 2 * self.kv_heads) * d + h if self.attention_bias else 0
        if self.attn_output_gate:  # q_proj also emits the output gate; q_norm and k_norm
            bias += h * self.q_heads * d + 2 * d
        return h * (self.q_heads + 2 * self.kv_heads) * d + self.q_heads * d * h + bias

    @property
    def attention_extra_params(self) -> int:
        """What the linear-attention layers and DSA indexers add to ``layers`` full
        attention layers: ``n_lin (P_lin - P_attn) + L P_indexer``."""
        extra = 0
        if self.linear is not None:
            extra += len(self.linear.layers) * (self.linear.params(self.hidden)
                                                - self.attn_params_per_layer)
        if self.dsa is not None:
            extra += (self.dsa.indexed(0, self.layers)
                      * self.dsa.indexer_params(self.hidden, self.mla.q_lora_rank))
        return extra

    @property
    def mlp_params_per_layer(self) -> int:
        """3*h*I for a gated MLP (gate, up, down), else 2*h*I."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.intermediate

    @property
    def params_per_layer(self) -> int:
        """Parameters of a dense layer."""
        return self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden

    @property
    def moe_layers(self) -> int:
        return 0 if self.moe is None else len(self.moe.layers)

    def moe_layer_params(self, experts: int) -> int:
        """A MoE layer holding ``experts`` routed experts (all: ``moe.experts``)."""
        m, h = self.moe, self.hidden
        return (self.attn_params_per_layer + m.router_params(h) + experts * m.expert_params(h)
                + 3 * h * m.shared_intermediate + 2 * h)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def _params(self, experts: int) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        dense = (self.layers - self.moe_layers) * self.params_per_layer
        moe = self.moe_layers * self.moe_layer_params(experts) if self.moe else 0
        return (dense + moe + self.embedding_params + lm_head + self.hidden
                + self.attention_extra_params)

    @property
    def total_params(self) -> int:
        """Every weight: embedding, LM head, attention, dense MLPs, routers, experts, norms."""
        return self._params(self.moe.experts if self.moe else 0)

    @property
    def active_params(self) -> int:
        """Weights one token uses: as :attr:`total_params` with top-k routed experts."""
        return self._params(self.moe.top_k if self.moe else 0)

    def kv_bytes_per_token(self, kv_bytes: int, tp: int = 1, layers: int | None = None) -> int:
        """KV cache bytes per token on one GPU: 2 * layers * ceil(n_kv/tp) * d * b_kv.

        KV heads shard across TP up to n_kv; beyond that each GPU keeps one replicated head.
        MLA caches ``layers * (kv_lora_rank + qk_rope_head_dim) * b_kv`` on every GPU of the
        TP group (the latent has no heads to shard).
        """
        layers = self.layers if layers is None else layers
        if self.mla is not None:  # DSA adds its indexer keys (FP8 + scales) per layer
            index = 0.0
            if self.dsa is not None:  # on the indexed share of the layers (all but GLM-5.2)
                index = self.dsa.key_bytes * self.dsa.indexed(0, self.layers) / self.layers
            return round(layers * (self.mla.cache_width * kv_bytes + index))
        return 2 * layers * kv_heads_per_gpu(self.kv_heads, tp) * self.head_dim * kv_bytes

    def describe(self) -> str:
        """One line for ``validate``: parameters, attention, experts, native precision."""
        text = f"{self.total_params / 1e9:.1f} B params"
        if self.moe is not None:
            m = self.moe
            shared = f", shared {m.shared_intermediate}" if m.shared_intermediate else ""
            text += (f" ({self.active_params / 1e9:.1f} B active), MoE: {m.experts} experts, "
                     f"top-{m.top_k}, expert intermediate {m.intermediate}{shared}, "
                     f"{len(m.layers)} of {self.layers} layers")
        else:
            text += f", {self.layers} layers"
        if self.mla is not None:
            text += (f", MLA: {self.q_heads} heads, KV latent {self.mla.kv_lora_rank} + rope "
                     f"{self.mla.qk_rope_head_dim} per token and layer")
        else:
            text += f", {self.q_heads} heads / {self.kv_heads} KV heads"
        if self.sliding_window:
            text += f", window {self.sliding_window} on {len(self.window_layers)} layers"
        if self.linear is not None:
            la = self.linear
            text += (f", Gated DeltaNet on {len(la.layers)} of {self.layers} layers ("
                     f"{la.key_heads} key / {la.value_heads} value heads of "
                     f"{la.key_head_dim}x{la.value_head_dim}, state "
                     f"{la.state_bytes_per_seq() / 2**20:.1f} MiB per sequence)")
        if self.dsa is not None:
            text += (f", DSA: indexer {self.dsa.index_heads} x {self.dsa.index_head_dim}, "
                     f"top-{self.dsa.index_topk}")
        if self.native_dtype or (self.moe and self.moe.expert_dtype):
            text += f", ships in {self.native_dtype or self.moe.expert_dtype}"
            text += " (experts)" if self.moe and self.moe.expert_dtype else ""
        return text


def kv_heads_per_gpu(kv_heads: int, tp: int) -> int:
    """KV heads one GPU of a TP group of ``tp`` holds: ``ceil(kv / tp)``. A divisor of the
    KV heads shards them; beyond them each GPU keeps a replica of one (vLLM, SGLang); a TP
    size that is neither (TensorRT-LLM only) replicates the remainder."""
    return -(-kv_heads // tp)


#: Fields that mark a config as MoE: with one of them, zero experts is an error, not dense.
MOE_MARKS = ("num_experts_per_tok", "moe_intermediate_size", "experts_per_token")


def _moe(config: dict, layers: int, hidden: int) -> MoESpec | None:
    """The MoE part of a config, or None for a dense model."""
    key = next((k for k in ("n_routed_experts", "num_local_experts", "num_experts")
                if config.get(k) is not None), None)
    if key is None or (config[key] == 0 and not any(m in config for m in MOE_MARKS)):
        return None  # dense (some dense configs carry num_experts = 0 or null)
    experts = _int(config, key)
    top_k = _int(config, "num_experts_per_tok", config.get("experts_per_token"))
    if top_k > experts:
        raise ScenarioError(f"model.name: config.json field 'num_experts_per_tok' = {top_k} "
                            f"exceeds the {experts} experts ({key})")
    mtype = config.get("model_type", "")
    if "first_k_dense_replace" in config or "n_routed_experts" in config:  # DeepSeek, Kimi
        first = _int(config, "first_k_dense_replace", 0, minimum=0)
        freq = _int(config, "moe_layer_freq", 1)
        moe_layers = tuple(i for i in range(first, layers) if i % freq == 0)
        inter = _int(config, "moe_intermediate_size")
        shared = _int(config, "n_shared_experts", 0, minimum=0) * inter
    elif "interleave_moe_layer_step" in config:  # Llama 4: every step-th layer, one shared
        step = _int(config, "interleave_moe_layer_step")
        moe_layers = tuple(range(step - 1, layers, step))
        inter = _int(config, "intermediate_size")
        shared = inter
    elif ("decoder_sparse_step" in config or "mlp_only_layers" in config
          or "shared_expert_intermediate_size" in config):  # Qwen-MoE, Qwen3.5/3.6 MoE
        step = _int(config, "decoder_sparse_step", 1)
        dense = config.get("mlp_only_layers") or []
        if not isinstance(dense, list) or not all(isinstance(i, int) for i in dense):
            raise ScenarioError(f"model.name: config.json field 'mlp_only_layers' = "
                                f"{excerpt(dense)} is not a list of layer indices")
        moe_layers = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
        inter = _int(config, "moe_intermediate_size")
        shared = _int(config, "shared_expert_intermediate_size", 0, minimum=0)
    else:  # Mixtral, gpt-oss: every layer, experts of intermediate_size
        moe_layers = tuple(range(layers))
        inter = _int(config, "intermediate_size")
        shared = 0
    if not moe_layers:
        raise ScenarioError(f"model.name: config.json declares {experts} experts ({key}) but "
                            f"its layer pattern leaves no MoE layer")
    expert_dtype = None
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "mxfp4":
        expert_dtype = NATIVE_QUANT["mxfp4"]
    return MoESpec(experts, top_k, inter, shared, moe_layers,
                   router_bias=mtype in ("gpt_oss", "deepseek_v3", "kimi_k2")
                   or config.get("topk_method") == "noaux_tc",
                   expert_bias=mtype == "gpt_oss", expert_dtype=expert_dtype)


def _mla(config: dict) -> MLASpec | None:
    if not config.get("kv_lora_rank"):
        return None
    q_lora = config.get("q_lora_rank")
    return MLASpec(0 if q_lora is None else _int(config, "q_lora_rank"),
                   _int(config, "kv_lora_rank"), _int(config, "qk_nope_head_dim"),
                   _int(config, "qk_rope_head_dim"), _int(config, "v_head_dim"))


def _windows(config: dict, layers: int,
             types: list[str] | None) -> tuple[int | None, tuple[int, ...]]:
    """Sliding-window layers (gpt-oss ``layer_types``, Mistral ``sliding_window``) and
    Llama 4's chunked attention (every layer but each fourth)."""
    if types is not None:
        windowed = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
        return (_int(config, "sliding_window") if windowed else None), windowed
    if config.get("attention_chunk_size"):
        return (_int(config, "attention_chunk_size"),
                tuple(i for i in range(layers) if (i + 1) % 4))
    if config.get("sliding_window") and config.get("use_sliding_window", True):
        if "max_window_layers" in config and config.get("use_sliding_window"):
            raise ScenarioError("model.name: config.json field 'use_sliding_window' = true "
                                "with 'max_window_layers' (Qwen layer-range windows) is not "
                                "supported")
        return _int(config, "sliding_window"), tuple(range(layers))
    return None, ()


def from_config(config: dict, name: str, hf_quant: dict | None = None,
                label: str = "config.json") -> ModelSpec:
    """Build a :class:`ModelSpec` from the fields of a Hugging Face config.json.

    Raises
    ------
    ScenarioError
        Naming the first field that is missing, malformed (every numeric field must be an
        integer >= 1) or not expressible (an unknown ``quantization_config.quant_method``,
        ``moe_layer_freq`` patterns the parser does not know, ...).
    """
    if not isinstance(config, dict):
        raise ScenarioError("model.name: config.json is not a JSON object")
    nested = "hidden_size" not in config and isinstance(config.get("text_config"), dict)
    if nested:
        outer = config
        config = dict(config["text_config"])  # multimodal release (Llama 4, Qwen3.5): text
        if "quantization_config" in outer:
            config.setdefault("quantization_config", outer["quantization_config"])
    for key, why in UNPRICED.items():
        if key in config:
            raise ScenarioError(f"model.name: config.json field {key!r}: {why} (the "
                                f"simulator prices full, sliding-window, MLA, DeepSeek sparse "
                                f"and Gated DeltaNet attention)")
    hidden = _int(config, "hidden_size")
    q_heads = _int(config, "num_attention_heads")
    layers = _int(config, "num_hidden_layers")
    kv_heads = _int(config, "num_key_value_heads", q_heads)
    if q_heads % kv_heads:
        raise ScenarioError(f"model.name: config.json field 'num_key_value_heads' = {kv_heads} "
                            f"does not divide num_attention_heads = {q_heads}")
    mla = _mla(config)
    if mla is not None:
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    else:
        head_dim = _int(config, "head_dim", config.get("head_dim") or hidden // q_heads)
    native = None
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") in NATIVE_QUANT:
        native = NATIVE_QUANT[quant["quant_method"]] if quant["quant_method"] == "fp8" else None
    act = config.get("hidden_act", "silu")
    moe = _moe(config, layers, hidden)
    types = layer_types(config, layers)
    window, windowed = _windows(config, layers, types)
    linear = linear_spec(config, types)
    spec = ModelSpec(
        name=name,
        hidden=hidden,
        layers=layers,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        # an all-MoE model (Qwen3.5 MoE) has no dense MLP: its expert size stands in, unused
        intermediate=_int(config, "intermediate_size_mlp", config.get("intermediate_size")
                          or config.get("moe_intermediate_size")),
        vocab=_int(config, "vocab_size"),
        max_position_embeddings=_int(config, "max_position_embeddings", 4096),
        gated_mlp=act in GATED_ACTIVATIONS,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        moe=moe, mla=mla, sliding_window=window, window_layers=windowed,
        attention_bias=bool(config.get("attention_bias", False)) and mla is None,
        native_dtype=native,
        mtp_layers=_int(config, "num_nextn_predict_layers",
                        config.get("mtp_num_hidden_layers", 0), minimum=0),
        linear=linear, dsa=dsa_spec(config, mla),
        attn_output_gate=bool(config.get("attn_output_gate", False)),
    )
    q = parse_quant(config, hf_quant, module_names(spec), label)
    if q is None:
        return spec
    if moe is not None and q.experts != "bf16" and q.scheme != "fp8_block":
        # NVFP4 / int4 experts (MXFP4 keeps its existing expert_dtype): run as shipped
        moe = replace(moe, expert_dtype=q.experts, expert_scheme=q.scheme)
    return replace(spec, moe=moe, quant=q)


def load_model(name: str, base_dir: str | Path = ".") -> ModelSpec:
    """A catalog model by name, or a config.json at a path (relative to ``base_dir``).

    Only an exact catalog name reads the catalog folder; anything else must look like a
    path (ends with .json or names a directory) and resolves relative to ``base_dir``, so
    ``"../x"`` can never reach files through the catalog folder.
    """
    names = catalog(MODEL_CONFIGS, ".json")
    if name in names:
        path = MODEL_CONFIGS / f"{name}.json"
    else:
        candidate = Path(name) if Path(name).is_absolute() else Path(base_dir) / name
        if not name or not (name.endswith(".json") or candidate.is_dir()):
            # the catalog outgrew one line: the closest names, and where the rest are
            close = difflib.get_close_matches(name, names, n=8, cutoff=0.4) or names[:8]
            raise ScenarioError(f"model.name: unknown model {name!r} (catalog, closest: "
                                f"{', '.join(close)}; all {len(names)} in "
                                f"simulator/model/configs/README.md; or a path to a "
                                f"config.json or to a folder holding one)")
        path = candidate / "config.json" if candidate.is_dir() else candidate
        if not path.exists() and not path.is_symlink():
            raise ScenarioError(f"model.name: config file {str(path)!r} not found")
    config = _read_json(path)
    # ModelOpt releases put their quantization in hf_quant_config.json beside config.json
    # (the catalog keeps it as configs/hf_quant/<name>.json).
    quant_path = (MODEL_CONFIGS / "hf_quant" / f"{name}.json" if name in names
                  else path.with_name(path.name.removesuffix("config.json")
                                      + "hf_quant_config.json"))
    hf_quant = _read_json(quant_path) if quant_path.is_file() else None
    # A Hugging Face checkout holds config.json: the model's name is its folder's.
    label = name if name in names else (path.parent.name if path.stem == "config"
                                        else path.stem)
    try:
        return from_config(config, label, hf_quant,
                           path.name if name in names else str(path))
    except ScenarioError as exc:  # name the file read, not "config.json"
        raise ScenarioError([_named(p, path, quant_path) for p in exc.problems]) from None


def _named(problem: str, path: Path, quant_path: Path) -> str:
    """A parser problem with the file it concerns named by its path."""
    for generic, real in (("model.name: hf_quant_config.json", quant_path),
                          ("model.name: config.json", path)):
        if problem.startswith(generic):
            return f"model.name: {real}" + problem[len(generic):]
    return problem


def _read_json(path: Path) -> dict:
    """A JSON file through the input layer (regular file, bounded size and depth)."""
    return load_json(path, "model.name")
