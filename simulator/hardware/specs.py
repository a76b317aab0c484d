"""GPU and node presets as frozen data (datasheet numbers plus calibrated kernel parameters).

GPUs live in ``topologies/gpus/<name>.toml``, node types in ``topologies/<name>.toml``; a
scenario may also point at its own TOML file by path. Units are SI: bytes, bytes/s, FLOP/s, s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from simulator import files
from simulator.calibration.generations import (
    GENERATIONS,
    exp_factor,
    fitted_reference,
    transfer,
    transfer_chain,
)
from simulator.calibration.params import Calibration, from_toml
from simulator.errors import ScenarioError
from simulator.hardware.schema import check_gpu_file, check_node_file
from simulator.paths import GPUS, TOPOLOGIES, catalog

#: The GPU whose measured calibration other GPUs inherit when their file has none and
#: their generation reaches no other fitted one (calibration/generations.py: FITTED).
REFERENCE_GPU = fitted_reference("hopper")


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: float
    hbm_bandwidth_Bps: float
    peak_flops: dict[str, float]
    calibration: Calibration = field(default_factory=Calibration)
    sm_count: int = 1  # streaming multiprocessors (1: no wave quantization)
    description: str = ""
    # Generation facts (calibration/generations.py): the generation's name, the SM boost
    # clock (Hz; scales SM-second costs carried from another GPU) and the L2 size (bytes).
    generation: str = ""
    boost_clock_hz: float | None = None
    l2_bytes: float | None = None
    # Power (simulator/metrics/power.py): board power (TDP) and idle power, W; None when
    # the file has none (energy is then NaN).
    tdp_w: float | None = None
    idle_w: float | None = None

    def peak(self, dtype: str) -> float:
        """Dense tensor FLOP/s for ``dtype``; 16-bit math when the GPU lacks the dtype."""
        return self.peak_flops.get(dtype) or self.peak_flops["bf16"]

    @property
    def weight_dtypes(self) -> tuple[str, ...]:
        """Weight dtypes this GPU runs: 16-bit, weight-only int4 (16-bit math), and each
        low-precision dtype it has tensor cores for (fp8, int8, fp4)."""
        low = tuple(d for d in ("fp8", "int8", "fp4") if d in self.peak_flops)
        return ("bf16", "fp16", *low, "int4")


@dataclass(frozen=True)
class LinkSpec:
    bandwidth_Bps: float  # per direction
    latency_s: float
    kind: str = ""
    link: str = ""
    in_switch_reduction: bool = False  # the switch reduces all-reduce data (NVLS)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpu: GPUSpec
    gpus_per_node: int
    scale_up: LinkSpec
    host: LinkSpec
    nic: LinkSpec
    fabric_kind: str = "single_switch"
    switch_latency_s: float = 0.6e-6
    description: str = ""

    @property
    def scale_up_per_gpu_Bps(self) -> float:
        """A GPU's scale-up bandwidth per direction, all its links together: its one switch
        port, or on an ``xgmi_mesh`` node its ``gpus_per_node - 1`` links."""
        links = self.gpus_per_node - 1 if self.scale_up.kind == "xgmi_mesh" else 1
        return self.scale_up.bandwidth_Bps * max(links, 1)


def _read(path: Path, key: str) -> dict:
    """A node or GPU TOML file, read through :func:`simulator.files.load_toml`."""
    return files.load_toml(path, key)


def _locate(name: str, folder: Path, key: str, base_dir: str | Path) -> Path:
    preset = folder / f"{name}.toml"
    if preset.exists():
        return preset
    if name.endswith(".toml"):
        path = Path(name) if Path(name).is_absolute() else Path(base_dir) / name
        if path.exists():
            return path
        raise ScenarioError(f"{key}: file {str(path)!r} not found")
    raise ScenarioError(f"{key}: unknown preset {name!r} "
                        f"(presets: {', '.join(catalog(folder, '.toml'))}; or a path to a .toml)")


@lru_cache(maxsize=8)
def _reference_calibration(ref: str) -> Calibration:
    data = _read(GPUS / f"{ref}.toml", "gpu")
    cal = from_toml(data.get("calibration", {}), f"{ref}.calibration")
    return replace(cal, source=f"carried over from {ref}: {cal.source}")


@lru_cache(maxsize=8)
def _reference_clock(ref: str) -> float | None:
    clock = _read(GPUS / f"{ref}.toml", "gpu").get("boost_clock_hz")
    return None if clock is None else float(clock)


def _calibration(data: dict, key: str) -> Calibration:
    """The file's ``[calibration]``; else the
    calibration of the nearest fitted generation's GPU, which carries over by physics
    (docs/cost-model.md, docs/hardware.md; SM-second costs scaled by the clocks,
    :func:`~simulator.calibration.generations.transfer`)."""
    if "calibration" in data:
        return from_toml(data["calibration"], f"{key}: calibration")
    gen = data.get("generation", "")
    ref, clock = fitted_reference(gen), data.get("boost_clock_hz")
    return transfer(_reference_calibration(ref), _reference_clock(ref),
                    None if clock is None else float(clock),
                    exp=exp_factor(transfer_chain(gen)[-1], gen))


def read_gpu_file(name: str, base_dir: str | Path = ".", key: str = "--gpu") -> dict:
    """The raw TOML table of a GPU preset or file (for writing a refitted copy)."""
    return _read(_locate(name, GPUS, key, base_dir), key)


def load_gpu(name: str, base_dir: str | Path = ".", key: str = "gpu") -> GPUSpec:
    """A GPU preset by name or a GPU TOML file by path.

    Each file version (path and modification time) is read once: a GPU file's calibration
    table makes a read ~1.5 ms, and every :func:`load_node` (the planner's thousands of
    scenario loads among them) reads its GPU. The spec is frozen and shared (nothing
    mutates its ``peak_flops`` or calibration tables).
    """
    path = _locate(name, GPUS, key, base_dir)
    return _gpu(path, path.resolve(), path.stat().st_mtime_ns, name, key)


@lru_cache(maxsize=64)
def _gpu(path: Path, where: Path, mtime_ns: int, name: str, key: str) -> GPUSpec:
    """The GPU file at ``path`` (``where``, its absolute path, and ``mtime_ns`` key the
    cache to the file itself and its version: a relative ``path`` names another file from
    another working folder)."""
    data = _read(path, key)
    check_gpu_file(data, path, key)
    try:
        return GPUSpec(name=_text(data, "name"), memory_bytes=_number(data, "memory_bytes"),
                       hbm_bandwidth_Bps=_number(data, "hbm_bandwidth_Bps"),
                       peak_flops={k: _number(data["peak_flops"], k)
                                   for k in data["peak_flops"]},
                       calibration=_calibration(data, key),
                       sm_count=int(_number(data, "sm_count", 1)),
                       description=_text(data, "description", ""),
                       generation=_text(data, "generation", ""),
                       boost_clock_hz=_optional(data, "boost_clock_hz"),
                       l2_bytes=_optional(data, "l2_bytes"),
                       tdp_w=_optional(data, "tdp_w"), idle_w=_optional(data, "idle_w"))
    except ScenarioError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ScenarioError(f"{key}: GPU file for {files.excerpt(name)} is missing or has a "
                            f"bad field ({_why(exc)})") from None


def _why(exc: Exception) -> str:
    """What is wrong with a field, never echoing more than an excerpt of its value."""
    if isinstance(exc, KeyError):
        return f"lacks {files.excerpt(exc.args[0])}"
    return str(exc) if isinstance(exc, _BadField) else "a field of the wrong kind"


class _BadField(ValueError):
    """A field's value is of the wrong kind (the message shows an excerpt of it)."""


def _number(data: dict, name: str, default: float | None = None) -> float:
    """Field ``name`` as a finite number (a missing field is ``default``, or an error)."""
    value = data.get(name, default) if default is not None else data[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value):
        raise _BadField(f"{name} = {files.excerpt(value)} is not a finite number")
    return float(value)


def _text(data: dict, name: str, default: str | None = None) -> str:
    value = data.get(name, default) if default is not None else data[name]
    if not isinstance(value, str):
        raise _BadField(f"{name} = {files.excerpt(value)} is not a string")
    return value


def transfer_note(gpu: GPUSpec) -> str:
    """What ``validate`` says of a GPU without a fit of its own: the fitted GPU and the
    generations its kernels carry over from; "" for a GPU with its own calibration."""
    if not gpu.calibration.source.startswith("carried over from "):
        return ""
    return (f"{gpu.name} has no fit of its own: kernels carried over from "
            f"{fitted_reference(gpu.generation)} by datasheet transfer "
            f"({' -> '.join(transfer_chain(gpu.generation))}; docs/hardware.md)")


def _optional(data: dict, name: str) -> float | None:
    return None if data.get(name) is None else _number(data, name)


def _check_nvls(data: dict, gpu: GPUSpec, path: Path, key: str) -> None:
    """NCCL's NVLS (in-switch reduction) needs NVSwitch 3 or later: a node of a generation
    without it (Ampere's NVSwitch 2, Ada without NVLink) cannot claim it."""
    claims = bool(data.get("scale_up", {}).get("in_switch_reduction", False))
    if claims and gpu.generation and not GENERATIONS[gpu.generation]["nvls"]:
        raise ScenarioError(f"{key}: node file {str(path)!r}: [scale_up] in_switch_reduction = "
                            f"true, but {gpu.name} is {gpu.generation}, whose switches do not "
                            f"reduce (NVLS needs NVSwitch 3+: "
                            f"{', '.join(g for g, f in GENERATIONS.items() if f['nvls'])})")


def _link(data: dict, section: str) -> LinkSpec:
    d = data[section]
    return LinkSpec(_number(d, "bandwidth_Bps"), _number(d, "latency_s"),
                    _text(d, "kind", section),
                    d.get("link", ""), bool(d.get("in_switch_reduction", False)))


@lru_cache(maxsize=64)
def _read_node(path: Path, where: Path, mtime_ns: int, key: str) -> dict:
    """The parsed node file (``where``, its absolute path, and ``mtime_ns`` key the cache
    to the file and its version); shared between loads, so read only."""
    return _read(path, key)


def load_node(name: str, base_dir: str | Path = ".", key: str = "cluster.topology"
              ) -> NodeSpec:
    """A node preset by name (``dgx-h100``) or a node TOML file by path; errors name
    ``key`` (the scenario key, or the command's flag).

    The node file and its GPU's are each parsed once per version (path and modification
    time), so a load costs a few file stats: engine profiles load the scenario's nodes at
    every scenario load (the planner loads thousands).
    """
    path = _locate(name, TOPOLOGIES, key, base_dir)
    data = _read_node(path, path.resolve(), path.stat().st_mtime_ns, key)
    check_node_file(data, path, key)
    try:
        if not isinstance(data["gpu"], str):
            raise _BadField(f"gpu = {files.excerpt(data['gpu'])}: expected a preset name or "
                            f"a path")
        gpu = load_gpu(data["gpu"], path.parent, key=f"{key} (gpu)")
        fabric = data.get("fabric", {})
        _check_nvls(data, gpu, path, key)
        per_node = _number(data, "gpus_per_node")
        if not per_node.is_integer():
            raise _BadField(f"gpus_per_node = {files.excerpt(data['gpus_per_node'])} is not a "
                            f"whole number of GPUs")
        node = NodeSpec(name=_text(data, "name"), gpu=gpu,
                        gpus_per_node=int(per_node),
                        scale_up=_link(data, "scale_up"), host=_link(data, "host"),
                        nic=_link(data, "nic"),
                        fabric_kind=fabric.get("kind", "single_switch"),
                        switch_latency_s=_number(fabric, "switch_latency_s", 0.6e-6),
                        description=_text(data, "description", ""))
    except ScenarioError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ScenarioError(f"{key}: node file {str(path)!r} is missing or has a bad field "
                            f"({_why(exc)})") from None
    if not 1 <= node.gpus_per_node <= 1024:
        raise ScenarioError(f"{key}: node file {str(path)!r}: gpus_per_node must be in "
                            f"[1, 1024], got {node.gpus_per_node}")
    return node
