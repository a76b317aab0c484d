"""What a GPU file and a node file may hold: their keys and the enumerated values they take.

:func:`check_gpu_file` and :func:`check_node_file` read nothing and build nothing: they
refuse, in one line naming the file, the key, the value and what is allowed, a key the
loader does not know (with a close match) or a value outside its enumeration (a GPU
generation, a peak-FLOP/s dtype, a scale-up or fabric kind). Numbers are checked where
they are read (:mod:`simulator.hardware.specs`).
"""

from __future__ import annotations

import difflib
from pathlib import Path

from simulator.calibration.generations import GENERATIONS
from simulator.errors import ScenarioError

#: Top-level keys of a GPU file (``topologies/gpus/<name>.toml``).
GPU_KEYS = ("name", "description", "source", "memory_bytes", "hbm_bandwidth_Bps",
            "sm_count", "generation", "boost_clock_hz", "l2_bytes", "tdp_w", "idle_w",
            "peak_flops", "calibration")
#: Dtypes a ``[peak_flops]`` table may give dense tensor FLOP/s for (fp6: OCP MXFP6, which
#: CDNA4 runs at its FP4 rate and Blackwell at its FP8 rate).
PEAK_DTYPES = ("bf16", "fp16", "fp8", "fp6", "fp4", "int8")
#: Top-level keys of a node file (``topologies/<name>.toml``) and of its tables.
NODE_KEYS = ("name", "description", "gpu", "gpus_per_node", "scale_up", "host", "nic",
             "fabric")
LINK_KEYS = {"scale_up": ("kind", "link", "bandwidth_Bps", "latency_s", "in_switch_reduction"),
             "host": ("kind", "link", "bandwidth_Bps", "latency_s"),
             "nic": ("kind", "link", "bandwidth_Bps", "latency_s"),
             "fabric": ("kind", "switch_latency_s")}
#: How a node's GPUs reach each other. ``nvswitch``: every GPU on one switch (NVLink
#: NVSwitch, or a rack's NVLink switch trays); ``pcie_switch``: peer-to-peer DMA over PCIe;
#: ``xgmi_mesh``: a direct link between every pair of GPUs (AMD Infinity Fabric, no
#: switch), ``bandwidth_Bps`` being one link's.
SCALE_UP_KINDS = ("nvswitch", "pcie_switch", "xgmi_mesh")
#: Fabrics joining nodes (:func:`simulator.topology.graph.build_graph`).
FABRIC_KINDS = ("single_switch", "leaf_spine")


def _refuse(where: str, key: str, value: object, allowed) -> ScenarioError:
    close = difflib.get_close_matches(str(value), list(allowed), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ScenarioError(f"{where}: {key} = {value!r} is not allowed ({hint}allowed: "
                         f"{', '.join(allowed)})")


def _keys(table: dict, allowed, where: str, prefix: str = "") -> None:
    for k in table:
        if k not in allowed:
            close = difflib.get_close_matches(k, list(allowed), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
            raise ScenarioError(f"{where}: unknown key {prefix + k!r} ({hint})")


def check_gpu_file(data: dict, path: Path, key: str) -> None:
    """Refuse an unknown key, generation or peak-FLOP/s dtype of the GPU file at ``path``."""
    where = f"{key}: GPU file {str(path)!r}"
    _keys(data, GPU_KEYS, where)
    gen = data.get("generation", "")
    if gen and gen not in GENERATIONS:
        raise _refuse(where, "generation", gen, GENERATIONS)
    peaks = data.get("peak_flops", {})
    if isinstance(peaks, dict):
        for dtype in peaks:
            if dtype not in PEAK_DTYPES:
                raise _refuse(where, "[peak_flops] dtype", dtype, PEAK_DTYPES)


def check_node_file(data: dict, path: Path, key: str) -> None:
    """Refuse an unknown key, scale-up kind or fabric kind of the node file at ``path``, and
    an in-switch reduction claimed where no NVSwitch is."""
    where = f"{key}: node file {str(path)!r}"
    _keys(data, NODE_KEYS, where)
    for section, allowed in LINK_KEYS.items():
        if isinstance(data.get(section), dict):
            _keys(data[section], allowed, where, f"{section}.")
    up, fabric = data.get("scale_up", {}), data.get("fabric", {})
    kind = up.get("kind", "nvswitch") if isinstance(up, dict) else "nvswitch"
    if kind not in SCALE_UP_KINDS:
        raise _refuse(where, "scale_up.kind", kind, SCALE_UP_KINDS)
    fkind = fabric.get("kind", "single_switch") if isinstance(fabric, dict) else ""
    if fkind and fkind not in FABRIC_KINDS:
        raise _refuse(where, "fabric.kind", fkind, FABRIC_KINDS)
    if kind != "nvswitch" and isinstance(up, dict) and up.get("in_switch_reduction"):
        raise ScenarioError(f"{where}: scale_up.in_switch_reduction = true needs kind = "
                            f"'nvswitch' (a {kind} has no switch that reduces)")
