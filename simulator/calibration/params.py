"""Fitted parameters of one GPU's kernel families and collectives, as frozen data.

Every dataclass default is *neutral*: it reduces its form to the plain roofline (efficiency
1, no launch latency, no tiles, perfect overlap of compute and memory), so an empty
``[calibration]`` table prices every kernel at its roofline. Parameters whose name ends in
``_sm_s`` are SM-seconds: the time one SM spends per unit of work, divided by the GPU's SM
count to give seconds of the whole GPU; they carry over between GPUs of similar SMs. Units
are SI (s, bytes/s as fractions of the datasheet numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from simulator.errors import ScenarioError
from simulator.files import excerpt

INF = math.inf

#: Ring all-reduce defaults of an uncalibrated fabric: NCCL call launch and synchronisation
#: (fits the 2/4/8-GPU small-message points of H100 NVSwitch), no extra software latency per
#: ring step, and the achieved fraction of link bandwidth for large messages.
RING_LAUNCH_S = 5.2e-6
RING_STEP_S = 0.0
RING_BANDWIDTH_EFF = 0.75

#: Weight dtypes whose GEMMs quantize their activations and run at the low-precision peak
#: (W8A8, W4A4); ``int4`` is weight-only: dequantized in the kernel, 16-bit math.
ACTIVATION_QUANTIZED = ("fp8", "int8", "fp4", "fp8_block")
#: Which fitted family prices a dtype that has no parameters of its own, in order.
FALLBACK = {"fp16": ("bf16",), "int4": ("bf16",), "int8": ("fp8", "bf16"),
            "fp4": ("fp8", "bf16"), "fp8": ("bf16",), "fp8_block": ("fp8", "bf16"),
            # MoE kernels (moe_forms.MOE_DTYPES): block-scaled FP8 prices as per-tensor FP8,
            # the 4-bit weight-only kernels as each other, then as 16-bit.
            "fp8_block_ep1": ("fp8_block", "fp8", "bf16"),
            "int4_wo": ("w4a16_mxfp4", "bf16"), "w4a16_mxfp4": ("int4_wo", "bf16"),
            "w4a16_mxfp4_marlin": ("int4_wo", "w4a16_mxfp4", "bf16"),
            # Blackwell's native 4-bit MoE kernels: NVFP4 (W4A4), MXFP4 x MXFP8 (W4A8).
            "nvfp4": ("w4a8_mxfp4_mxfp8", "fp8_block", "fp8", "bf16"),
            "w4a8_mxfp4_mxfp8": ("nvfp4", "fp8_block", "fp8", "bf16")}
#: Dtype names of the measured CSVs and the scenario names they mean.
CSV_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8": "fp8",
              "int8": "int8", "fp8_block": "fp8_block", "nvfp4": "fp4"}
#: GEMM dtypes whose tensor peak is another dtype's: 128 x 128 block-scaled FP8 runs on the
#: FP8 tensor cores (its scales are applied per K block in the epilogue of each block).
PEAK_DTYPE = {"fp8_block": "fp8"}
#: Bytes per weight of the GEMM dtypes the model's table lacks (scales ignored, as the
#: model's table does: 4 / 128^2 bytes per weight).
GEMM_BYTES = {"fp8_block": 1.0}


@dataclass(frozen=True)
class GemmParams:
    """One GEMM kernel family (one weight dtype); see ``forms.gemm_time``."""

    launch_s: float = 0.0  # fixed latency of one kernel (launch, prologue, epilogue)
    compute_eff: float = 1.0  # fraction of tensor peak reached by full waves of tiles
    bandwidth_eff: float = 1.0  # fraction of HBM bandwidth reached streaming operands
    overlap: float = INF  # p of the p-norm joining compute and memory time; inf = max
    tile_m: int = 1  # output tile (rows = tokens) of the large-M kernel; 1 = no tiles
    tile_n: int = 1
    split_k_s: float = INF  # cost of a split-K reduction; inf = the library never splits K
    quant_row_sm_s: float = 0.0  # activation quantization pass: SM-seconds per token row
    quant_bandwidth_eff: float = 0.0  # its fraction of HBM bandwidth; 0 = no such pass


@dataclass(frozen=True)
class PrefillParams:
    """Prefill (context) attention of one layer, one KV dtype; see ``forms.prefill_time``."""

    floor_s: float = 0.0  # fixed latency of the kernel
    seq_head_sm_s: float = 0.0  # per (sequence, KV head): block set-up
    token_head_sm_s: float = 0.0  # per (query token, query head): Q load, O store, rescale
    token_kv_head_sm_s: float = 0.0  # per (query token, KV head): K/V tile loads per q-tile
    compute_eff: float = 1.0  # fraction of 16-bit tensor peak in QK^T and PV
    exp_sm_s: float = 0.0  # per (query, key, head) score: the softmax exponential (SFU)
    block_k: int = 0  # key tile: the causal diagonal tile is computed whole
    block_q: int = 0  # query tile: the last tile's serial key loop; 0 = not modelled
    serial_eff: float = 1.0  # fraction of one SM's tensor peak in that serial loop
    bandwidth_eff: float = 1.0  # fraction of HBM bandwidth for Q, O and K/V traffic
    overlap: float = INF  # p of the p-norm joining compute, serial and memory time


@dataclass(frozen=True)
class DecodeParams:
    """Decode (generation) attention of one layer, one KV dtype; see ``forms.decode_time``."""

    floor_s: float = 0.0  # fixed latency of the kernel (per layer)
    seq_sm_s: float = 0.0  # per sequence (metadata, split-KV combine)
    seq_head_sm_s: float = 0.0  # per (sequence, KV head) block
    seq_head_dim_sm_s: float = 0.0  # per (sequence, KV head, head-dim element): Q, O, rescale
    bandwidth_eff: float = 1.0  # fraction of HBM bandwidth reading the KV cache
    compute_eff: float = 1.0  # fraction of 16-bit tensor peak
    exposed: float = 1.0  # share of the shorter of per-sequence work and KV stream not
    #                       hidden behind the longer: 1 = they add up, 0 = full overlap


@dataclass(frozen=True)
class CollectiveParams:
    """NCCL and custom all-reduce algorithms, alpha-beta each (``forms.allreduce_times``),
    and the ring all-gather / reduce-scatter and all-to-all (``forms.collective_time``).

    An algorithm with an infinite launch latency is unavailable. Link bandwidth and wire
    latency come from the topology, not from here.
    """

    ring_launch_s: float = RING_LAUNCH_S
    ring_step_s: float = RING_STEP_S  # software latency per ring step, on top of the wire
    ring_eff: float = RING_BANDWIDTH_EFF
    tree_launch_s: float = INF
    tree_step_s: float = 0.0
    tree_eff: float = 1.0
    nvls_launch_s: float = INF  # in-switch reduction (NVLink SHARP), 16/32-bit floats only
    nvls_eff: float = 1.0
    custom_launch_s: float = INF  # vLLM one-shot / two-shot all-reduce under CUDA graphs
    custom_step_s: float = 0.0  # one barrier across the group
    custom_eff: float = 1.0
    custom_max_bytes: float = 8 * 2**20  # larger messages fall back to NCCL (vLLM default)
    custom_eager_s: float = 0.0  # extra per call without CUDA graphs (copy into IPC buffer)
    gather_launch_s: float = INF  # ring all-gather / reduce-scatter; inf: the ring's values
    gather_step_s: float = 0.0
    gather_eff: float = 1.0
    alltoall_launch_s: float = INF  # pairwise all-to-all; inf: the ring's values
    alltoall_step_s: float = 0.0
    alltoall_eff: float = 1.0


@dataclass(frozen=True)
class ElementwiseParams:
    """Norms, rotary, activation, residual adds and KV-cache writes: bandwidth-bound."""

    launch_s: float = 0.0  # shortest kernel on this GPU (each elementwise kernel pays it)
    bandwidth_eff: float = 1.0


@dataclass(frozen=True)
class MoEParams:
    """MoE expert compute of one layer on one GPU, one weight dtype (and kernel); see
    ``moe_forms.expert_time``."""

    launch_s: float = 0.0  # fixed latency of the layer's kernels (permute, 2 GEMMs, act, combine)
    expert_sm_s: float = 0.0  # per expert that receives tokens: its GEMM problems' set-up
    local_sm_s: float = 0.0  # per expert held (active or not): expert map, block alignment
    row_sm_s: float = 0.0  # per (token, expert) row the permute scans: index, gather, scatter
    foreign_fill: float = 0.0  # share of the 16-bit row traffic still moved for scanned
    #                            rows routed to other ranks (vLLM EP, no all-to-all)
    compute_eff: float = 1.0  # fraction of the dtype's tensor peak in full tiles
    bandwidth_eff: float = 1.0  # fraction of HBM bandwidth streaming weights and activations
    overlap: float = INF  # p of the p-norm joining compute and memory time
    tile_m: int = 1  # rows (tokens) of one expert's output tile: each expert's M is padded
    tile_n: int = 1  # columns of the output tile (wave quantization over the SMs)


@dataclass(frozen=True)
class MLAParams:
    """Core of the MLA attention module (projections excluded: they are GEMMs), one KV
    dtype; see ``moe_forms.mla_prefill_time`` and ``moe_forms.mla_decode_time``."""

    floor_s: float = 0.0  # fixed latency of the module's non-GEMM kernels (norms, RoPE, cache)
    seq_sm_s: float = 0.0  # per sequence (block set-up, split-KV combine)
    token_head_sm_s: float = 0.0  # per (query token, head): Q load, O store, rescale
    compute_eff: float = 1.0  # fraction of the 16-bit tensor peak in QK^T and PV
    bandwidth_eff: float = 1.0  # fraction of HBM bandwidth for the KV / latent traffic
    overlap: float = INF  # p of the p-norm joining compute and memory time
    head_block: int = 1  # heads computed together: fewer heads on a GPU still pay a block
    block_q: int = 0  # query tile: the last causal tile's serial key loop; 0 = not modelled
    serial_eff: float = 1.0  # fraction of one SM's 16-bit tensor peak in that loop
    absorbed_max_q_len: float = 0.0  # prefill chunks up to this mean length take the
    #                                  weight-absorbed (decode) path; 0 = never


@dataclass(frozen=True)
class AllToAllParams:
    """DeepEP dispatch or combine, one mode and phase; see ``moe_forms.a2a_time``."""

    launch_s: float = 0.0  # fixed latency (launch, notify, barrier) of one call
    token_sm_s: float = 0.0  # per token sent (SM work of packing and unpacking)
    link_eff: float = 1.0  # fraction of the link bandwidth (per direction) reached


@dataclass(frozen=True)
class Calibration:
    """Everything fitted about one GPU. Kernel families are keyed by dtype (``bf16``...)."""

    gemm: dict[str, GemmParams] = field(default_factory=dict)
    prefill: dict[str, PrefillParams] = field(default_factory=dict)
    decode: dict[str, DecodeParams] = field(default_factory=dict)
    collectives: CollectiveParams = field(default_factory=CollectiveParams)
    elementwise: ElementwiseParams = field(default_factory=ElementwiseParams)
    moe: dict[str, MoEParams] = field(default_factory=dict)  # by MoE dtype / kernel
    mla_prefill: dict[str, MLAParams] = field(default_factory=dict)  # by KV dtype
    mla_decode: dict[str, MLAParams] = field(default_factory=dict)  # by KV dtype
    alltoall: dict[str, AllToAllParams] = field(default_factory=dict)  # "<mode>_<phase>"
    source: str = ""  # provenance: data, date, command, or what it was carried over from

    def gemm_for(self, dtype: str) -> GemmParams:
        return _lookup(self.gemm, dtype, GemmParams)

    def prefill_for(self, kv_dtype: str) -> PrefillParams:
        return _lookup(self.prefill, kv_dtype, PrefillParams)

    def decode_for(self, kv_dtype: str) -> DecodeParams:
        return _lookup(self.decode, kv_dtype, DecodeParams)

    def moe_for(self, key: str) -> MoEParams:
        return _lookup(self.moe, key, MoEParams)

    def mla_for(self, path: str, kv_dtype: str) -> MLAParams:
        table = self.mla_prefill if path == "prefill" else self.mla_decode
        return _lookup(table, kv_dtype, MLAParams)

    def alltoall_for(self, mode: str, phase: str) -> AllToAllParams:
        return _lookup(self.alltoall, f"{mode}_{phase}", AllToAllParams)


def _lookup(table: dict, dtype: str, cls: type):
    for key in (dtype, *FALLBACK.get(dtype, ())):
        if key in table:
            return table[key]
    return cls()


SECTIONS = {"gemm": GemmParams, "prefill_attention": PrefillParams,
            "decode_attention": DecodeParams, "moe": MoEParams, "mla_prefill": MLAParams,
            "mla_decode": MLAParams, "alltoall": AllToAllParams}
SINGLE = {"collectives": CollectiveParams, "elementwise": ElementwiseParams}
ATTRS = {"gemm": "gemm", "prefill_attention": "prefill", "decode_attention": "decode",
         "moe": "moe", "mla_prefill": "mla_prefill", "mla_decode": "mla_decode",
         "alltoall": "alltoall"}


def _params(cls: type, raw: Any, key: str) -> Any:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{key}: expected a table, got {excerpt(raw)}")
    names = {f.name: f for f in fields(cls)}
    values = {}
    for k, v in raw.items():
        if k not in names:
            raise ScenarioError(f"{key}.{k}: unknown key (allowed: {', '.join(names)})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v < 0:
            raise ScenarioError(f"{key}.{k}: expected a number >= 0 (or inf), got {excerpt(v)}")
        values[k] = v
    p = cls(**values)
    for name in ("compute_eff", "bandwidth_eff", "serial_eff", "ring_eff", "tree_eff",
                 "nvls_eff", "custom_eff", "quant_bandwidth_eff", "gather_eff", "alltoall_eff",
                 "exposed", "link_eff", "foreign_fill"):
        v = getattr(p, name, None)
        if v is not None and v > 1:
            # An efficiency above 1 would let a kernel beat the roofline.
            raise ScenarioError(f"{key}.{name}: a fraction; must be <= 1, got {v}")
    return p


def from_toml(raw: dict, key: str = "gpu.calibration") -> Calibration:
    """Parse a ``[calibration]`` table; every problem names its dotted key."""
    if not isinstance(raw, dict):
        raise ScenarioError(f"{key}: expected a table")
    out: dict[str, Any] = {"source": str(raw.get("source", ""))}
    for k, v in raw.items():
        if k == "source":
            continue
        if k in SECTIONS:
            if not isinstance(v, dict):
                raise ScenarioError(f"{key}.{k}: expected tables by dtype, got {excerpt(v)}")
            out[ATTRS[k]] = {dt: _params(SECTIONS[k], t, f"{key}.{k}.{dt}")
                             for dt, t in v.items()}
        elif k in SINGLE:
            out[k] = _params(SINGLE[k], v, f"{key}.{k}")
        else:
            allowed = ", ".join(["source", *SECTIONS, *SINGLE])
            raise ScenarioError(f"{key}.{k}: unknown key (allowed: {allowed})")
    return Calibration(**out)


def _fmt(v: float) -> str:
    if v == INF:
        return "inf"
    if abs(v) < 1e-15:  # a fitted latency at its bound of 0
        return "0"
    if isinstance(v, int) or float(v).is_integer() and abs(v) >= 1:
        return str(int(v))
    return f"{v:.4g}"


def to_toml(cal: Calibration, header: str = "") -> str:
    """The ``[calibration]`` tables as TOML text, non-default values only, ``header`` first."""
    lines = [header.rstrip()] if header else []
    lines += ["[calibration]", f"source = {cal.source!r}".replace("'", '"'), ""]
    for section, attr in ATTRS.items():
        for dtype, p in sorted(getattr(cal, attr).items()):
            lines.append(f"[calibration.{section}.{dtype}]")
            lines += [f"{f.name} = {_fmt(getattr(p, f.name))}" for f in fields(p)]
            lines.append("")
    for section in SINGLE:
        p = getattr(cal, section)
        lines.append(f"[calibration.{section}]")
        lines += [f"{f.name} = {_fmt(getattr(p, f.name))}" for f in fields(p)]
        lines.append("")
    return "\n".join(lines)


def with_family(cal: Calibration, section: str, dtype: str | None, p: Any) -> Calibration:
    """A copy of ``cal`` with one family's parameters replaced."""
    if section in SINGLE:
        return replace(cal, **{section: p})
    attr = ATTRS[section]
    return replace(cal, **{attr: {**getattr(cal, attr), dtype: p}})
