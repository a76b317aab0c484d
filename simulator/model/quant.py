"""The precision a release checkpoint ships in, per layer class, from its quantization config.

Read from ``config.json``'s ``quantization_config`` or, when that is absent, from the
``hf_quant_config.json`` beside it (NVIDIA ModelOpt releases). Schemes:

- ``fp8_block``: ``quant_method = "fp8"`` with ``weight_block_size = [128, 128]``
  (DeepSeek, GLM, Qwen FP8 releases): e4m3 weights with one scale per 128 x 128 tile;
- ``fp8``: ModelOpt ``quant_algo = "FP8"`` (per-tensor scales);
- ``nvfp4``: ModelOpt ``quant_algo = "NVFP4"``: e2m1 weights, one FP8 scale per 16 values;
  needs FP4 tensor cores (Blackwell), refused elsewhere (no silent 16-bit fallback);
- ``mxfp4``: ``quant_method = "mxfp4"`` (gpt-oss): e2m1 weights, one e8m0 scale per 32;
- ``int4``: ``quant_method = "compressed-tensors"`` with 4-bit integer weight groups
  (Kimi-K2.5's W4A16 experts).

Modules the config leaves out (``modules_to_not_convert``, ``ignore``,
``exclude_modules``: globs, or ``re:`` regular expressions) stay 16-bit. Each class
(attention, dense MLP, shared experts, routed experts, LM head) takes the precision of
most of its projections over the model's layers (:func:`class_dtypes`).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from simulator.errors import ScenarioError
from simulator.files import excerpt

#: Schemes and the weight dtype (a key of ``spec.BYTES_PER_DTYPE``) they store.
SCHEMES = {"fp8_block": "fp8", "fp8": "fp8", "nvfp4": "fp4", "mxfp4": "fp4", "int4": "int4"}
#: Extra bytes per weight for the scales: one FP8 per 16 (NVFP4), one e8m0 per 32 (MXFP4),
#: one fp32 per 128 x 128 tile (block FP8), one 16-bit per group of 32 (int4).
SCALE_BYTES = {"fp8_block": 4 / 128**2, "fp8": 0.0, "nvfp4": 1 / 16, "mxfp4": 1 / 32,
               "int4": 2 / 32}
CLASSES = ("attention", "dense_mlp", "shared_experts", "experts", "lm_head")


@dataclass(frozen=True)
class QuantSpec:
    """A release's scheme and the dtype of each layer class (``"bf16"``: not quantized)."""

    scheme: str
    attention: str
    dense_mlp: str
    shared_experts: str
    experts: str
    lm_head: str
    source: str  # the file and key it came from

    def dtype(self, cls: str) -> str:
        return getattr(self, cls)

    def describe(self) -> str:
        return f"{self.scheme} ({self.source}): " + ", ".join(
            f"{c.replace('_', ' ')} {self.dtype(c)}" for c in CLASSES)


def _scheme(q: dict, source: str) -> str:
    """The scheme of a quantization config, or a ScenarioError naming the key and value."""
    method = q.get("quant_method")
    algo = q.get("quant_algo")
    if method == "fp8":
        block = q.get("weight_block_size")
        if block is not None and list(block) != [128, 128]:
            raise ScenarioError(f"model.name: {source}.weight_block_size = {excerpt(block)} is not "
                                f"supported (allowed: [128, 128])")
        if algo == "MIXED_PRECISION":
            raise ScenarioError(f"model.name: {source}.quant_algo = 'MIXED_PRECISION' "
                                f"(per-layer precision) is not supported (allowed: FP8, "
                                f"NVFP4)")
        return "fp8_block" if block else "fp8"
    if method == "mxfp4":
        return "mxfp4"
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        w = [g.get("weights") or {} for g in groups.values()] if isinstance(groups,
                                                                            dict) else []
        if len(w) == 1 and w[0].get("num_bits") == 4 and w[0].get("type") == "int":
            return "int4"
        raise ScenarioError(f"model.name: {source}.config_groups: only one group of 4-bit "
                            f"integer weights (W4A16) is supported for compressed-tensors")
    if method in (None, "modelopt"):
        if algo == "NVFP4":
            return "nvfp4"
        if algo == "FP8":
            return "fp8"
        raise ScenarioError(f"model.name: {source}.quant_algo = {excerpt(algo)} is not supported "
                            f"(allowed: FP8, NVFP4)")
    raise ScenarioError(f"model.name: {source}.quant_method = {excerpt(method)} is not supported "
                        f"(allowed: fp8, mxfp4, modelopt, compressed-tensors; or remove "
                        f"quantization_config and set model.weight_dtype)")


def _excluded(patterns: list[str]):
    """A predicate: is a module name left 16-bit by ``patterns``."""
    # every glob as one alternation of their translations (fnmatchcase's own test; a
    # release lists hundreds of modules, matched against every projection of every layer)
    globs = [fnmatch.translate(p) for p in patterns if not p.startswith("re:")]
    glob = re.compile("|".join(globs)) if globs else None
    regexes = [re.compile(p[3:]) for p in patterns if p.startswith("re:")]

    def one(name: str) -> bool:
        return ((glob is not None and glob.match(name) is not None)
                or any(r.match(name) for r in regexes))

    def test(name: str) -> bool:
        # checkpoints of multimodal releases nest the text model one level down
        inner = name.removeprefix("model.")
        return any(one(n) for n in (name, "model.language_model." + inner,
                                    "language_model." + name))
    return test


def parse_quant(config: dict, hf_quant: dict | None, names: dict[str, list[str]],
                label: str) -> QuantSpec | None:
    """The :class:`QuantSpec` of a release, or None for a 16-bit one.

    ``names`` maps each class to the module names of its projections (all layers, spelt
    ``model.layers.<i>...``), as :func:`simulator.model.spec.module_names` lists them;
    ``label`` names the config file. Block-FP8 and int4 releases keep the LM head 16-bit
    (their loaders quantize the decoder's linear layers only).
    """
    q, source = config.get("quantization_config"), f"{label} quantization_config"
    if q is None and hf_quant is not None:
        q, source = hf_quant.get("quantization"), "hf_quant_config.json quantization"
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ScenarioError(f"model.name: {source} is not a JSON object")
    scheme = _scheme(q, source)
    skip = (q.get("modules_to_not_convert") or q.get("ignore") or q.get("exclude_modules")
            or [])
    if not isinstance(skip, list) or not all(isinstance(p, str) for p in skip):
        raise ScenarioError(f"model.name: {source}: the list of modules left unquantized "
                            f"is not a list of strings")
    test = _excluded(skip)
    dtype = SCHEMES[scheme]
    classes = {}
    for cls in CLASSES:
        mods = names.get(cls, [])
        left = sum(1 for n in mods if test(n))
        classes[cls] = "bf16" if not mods or 2 * left >= len(mods) else dtype
    if scheme in ("fp8_block", "int4"):
        classes["lm_head"] = "bf16"
    if scheme == "mxfp4":  # gpt-oss: only the experts are MXFP4, the rest ships 16-bit
        classes = {c: ("fp4" if c == "experts" else "bf16") for c in CLASSES}
    return QuantSpec(scheme, source=source, **classes)


def module_names(spec) -> dict[str, list[str]]:
    """Module names of each layer class's projections, as a checkpoint spells them
    (``model.layers.<i>.self_attn.q_proj``, ...) of a :class:`~simulator.model.spec.ModelSpec`,
    for :func:`parse_quant`."""
    lin = set(spec.linear.layers) if spec.linear else set()
    moe = set(spec.moe.layers) if spec.moe else set()
    attn = (("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
            if spec.mla else ("q_proj", "k_proj", "v_proj", "o_proj"))
    names: dict[str, list[str]] = {c: [] for c in ("attention", "dense_mlp", "shared_experts",
                                                   "experts")}
    for i in range(spec.layers):
        layer = f"model.layers.{i}."
        if i in lin:
            names["attention"] += [layer + "linear_attn.in_proj_qkvz", layer
                                   + "linear_attn.out_proj"]
        else:
            names["attention"] += [layer + "self_attn." + a for a in attn]
        if i in moe:
            names["experts"].append(layer + "mlp.experts.0.gate_proj")
            if spec.moe.shared_intermediate:
                names["shared_experts"] += [layer + "mlp.shared_experts.gate_proj",
                                            layer + "mlp.shared_expert.gate_proj"]
        else:
            names["dense_mlp"] += [layer + "mlp." + m for m in ("gate_proj", "up_proj",
                                                                "down_proj")]
    names["lm_head"] = ["lm_head"]
    return names
