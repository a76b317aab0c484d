"""GPU and node presets as frozen data (datasheet numbers plus calibrated efficiencies).

GPUs live in ``topologies/gpus/<name>.toml``, node types in ``topologies/<name>.toml``; a
scenario may also point at its own TOML file by path. Units are SI: bytes, bytes/s, FLOP/s, s.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.paths import GPUS, TOPOLOGIES, catalog

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of peak per operator family, and fixed kernel floors."""

    gemm_compute: float = 0.7
    gemm_bandwidth: float = 0.8
    attention_compute: float = 0.6
    attention_bandwidth: float = 0.7
    elementwise_bandwidth: float = 0.7
    attention_decode_floor_s: float = 12e-6


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: float
    hbm_bandwidth_Bps: float
    peak_flops: dict[str, float]
    efficiency: Efficiency = field(default_factory=Efficiency)
    description: str = ""

    def peak(self, dtype: str) -> float:
        """Dense tensor FLOP/s for ``dtype``; 16-bit math when the GPU lacks the dtype."""
        return self.peak_flops.get(dtype) or self.peak_flops["bf16"]


@dataclass(frozen=True)
class LinkSpec:
    bandwidth_Bps: float  # per direction
    latency_s: float
    kind: str = ""
    link: str = ""


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


def _read(path: Path, key: str) -> dict:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ScenarioError(f"{key}: cannot read {str(path)!r} ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{key}: {str(path)!r} is not valid TOML ({exc})") from None


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


def load_gpu(name: str, base_dir: str | Path = ".", key: str = "gpu") -> GPUSpec:
    """A GPU preset by name or a GPU TOML file by path."""
    data = _read(_locate(name, GPUS, key, base_dir), key)
    try:
        eff = Efficiency(**data.get("efficiency", {}))
        return GPUSpec(name=data["name"], memory_bytes=float(data["memory_bytes"]),
                       hbm_bandwidth_Bps=float(data["hbm_bandwidth_Bps"]),
                       peak_flops={k: float(v) for k, v in data["peak_flops"].items()},
                       efficiency=eff, description=data.get("description", ""))
    except (KeyError, TypeError) as exc:
        raise ScenarioError(f"{key}: GPU file for {name!r} is missing or has a bad field "
                            f"({exc})") from None


def _link(data: dict, section: str) -> LinkSpec:
    d = data[section]
    return LinkSpec(float(d["bandwidth_Bps"]), float(d["latency_s"]), d.get("kind", section),
                    d.get("link", ""))


def load_node(name: str, base_dir: str | Path = ".") -> NodeSpec:
    """A node preset by name (``dgx-h100``) or a node TOML file by path."""
    key = "cluster.topology"
    path = _locate(name, TOPOLOGIES, key, base_dir)
    data = _read(path, key)
    try:
        gpu = load_gpu(data["gpu"], path.parent, key=f"{key} (gpu)")
        fabric = data.get("fabric", {})
        return NodeSpec(name=data["name"], gpu=gpu, gpus_per_node=int(data["gpus_per_node"]),
                        scale_up=_link(data, "scale_up"), host=_link(data, "host"),
                        nic=_link(data, "nic"),
                        fabric_kind=fabric.get("kind", "single_switch"),
                        switch_latency_s=float(fabric.get("switch_latency_s", 0.6e-6)),
                        description=data.get("description", ""))
    except (KeyError, TypeError, ValueError) as exc:
        raise ScenarioError(f"{key}: node file {str(path)!r} is missing or has a bad field "
                            f"({exc})") from None
