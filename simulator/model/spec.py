"""Model architecture from a Hugging Face ``config.json``: sizes, parameters, bytes.

A catalog name (``llama-3.1-70b``) loads ``simulator/model/configs/<name>.json``; any other
value is a path to a config.json. Dense decoder-only transformers with (grouped-query)
attention and a gated or plain MLP are supported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.paths import MODEL_CONFIGS, catalog

#: Bytes per element. int4 and fp4 pack two weights per byte (scales are ignored: < 1%).
BYTES_PER_DTYPE = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5, "fp4": 0.5}
#: Dtypes the KV cache can be stored in.
KV_DTYPES = ("bf16", "fp16", "fp8")
GATED_ACTIVATIONS = {"silu", "swiglu", "gelu_pytorch_tanh", "geglu"}


@dataclass(frozen=True)
class ModelSpec:
    """Sizes of a dense decoder-only transformer (notation of REFERENCE.md section 1)."""

    name: str
    hidden: int  # h
    layers: int  # L
    q_heads: int  # n_q
    kv_heads: int  # n_kv
    head_dim: int  # d
    intermediate: int  # I
    vocab: int  # V
    max_position_embeddings: int
    gated_mlp: bool = True
    tie_word_embeddings: bool = False
    mtp_layers: int = 0  # multi-token prediction modules (num_nextn_predict_layers)

    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V and output projections: h*(n_q + 2 n_kv)*d + n_q*d*h."""
        h, d = self.hidden, self.head_dim
        return h * (self.q_heads + 2 * self.kv_heads) * d + self.q_heads * d * h

    @property
    def mlp_params_per_layer(self) -> int:
        """3*h*I for a gated MLP (gate, up, down), else 2*h*I."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.intermediate

    @property
    def params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.layers * self.params_per_layer + self.embedding_params + lm_head + self.hidden

    def kv_bytes_per_token(self, kv_bytes: int, tp: int = 1, layers: int | None = None) -> int:
        """KV cache bytes per token on one GPU: 2 * layers * ceil(n_kv/tp) * d * b_kv.

        KV heads shard across TP up to n_kv; beyond that each GPU keeps one replicated head.
        """
        layers = self.layers if layers is None else layers
        return 2 * layers * kv_heads_per_gpu(self.kv_heads, tp) * self.head_dim * kv_bytes


def kv_heads_per_gpu(kv_heads: int, tp: int) -> int:
    return max(1, kv_heads // tp)


def from_config(config: dict, name: str) -> ModelSpec:
    """Build a :class:`ModelSpec` from the fields of a Hugging Face config.json."""
    try:
        hidden = int(config["hidden_size"])
        q_heads = int(config["num_attention_heads"])
        return ModelSpec(
            name=name,
            hidden=hidden,
            layers=int(config["num_hidden_layers"]),
            q_heads=q_heads,
            kv_heads=int(config.get("num_key_value_heads") or q_heads),
            head_dim=int(config.get("head_dim") or hidden // q_heads),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
            gated_mlp=config.get("hidden_act", "silu") in GATED_ACTIVATIONS,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            mtp_layers=int(config.get("num_nextn_predict_layers") or 0),
        )
    except KeyError as exc:
        raise ScenarioError(f"model.name: config.json lacks the field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"model.name: config.json has a malformed field ({exc})") from None


def load_model(name: str, base_dir: str | Path = ".") -> ModelSpec:
    """A catalog model by name, or a config.json at a path (relative to ``base_dir``)."""
    path = MODEL_CONFIGS / f"{name}.json"
    if not path.exists():
        candidate = Path(name) if Path(name).is_absolute() else Path(base_dir) / name
        if not (name.endswith(".json") or candidate.is_dir()):
            names = ", ".join(catalog(MODEL_CONFIGS, ".json"))
            raise ScenarioError(f"model.name: unknown model {name!r} "
                                f"(catalog: {names}; or a path to a config.json)")
        path = candidate / "config.json" if candidate.is_dir() else candidate
        if not path.exists():
            raise ScenarioError(f"model.name: config file {str(path)!r} not found")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ScenarioError(f"model.name: cannot read {str(path)!r} as JSON ({exc})") from None
    return from_config(config, name if path.parent == MODEL_CONFIGS else path.stem)
