"""The library side of ``python -m simulator collective``: parse GPU sets and sizes, build
the graph, time K collectives at once over it, report NCCL's figures.
"""

from __future__ import annotations

import math
import re

from simulator.errors import ScenarioError
from simulator.files import excerpt
from simulator.hardware.specs import load_node
from simulator.parallel.collective import (
    ALGORITHMS,
    OPS,
    CollectiveResult,
    bus_factor,
    run_collectives,
)
from simulator.topology.graph import FABRICS, Paths, build_graph, gpu_name

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "t": 1e12, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
#: Largest buffer a collective may move (1 PiB): above any real one, far below overflow.
MAX_BYTES = float(2**50)


def parse_bytes(text: str, key: str = "--bytes") -> float:
    """``64MiB``, ``1GB``, ``1e6``, ``4096`` -> bytes (KiB/MiB/GiB binary, KB/MB/GB decimal)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise ScenarioError(f"collective {key}: {excerpt(text)} is not a positive size (e.g. "
                            f"4096, 1e6, 64KiB, 64MiB, 1GB, 2GiB)")
    size = float(m.group(1)) * _UNITS[unit]
    if not size <= MAX_BYTES:  # inf too
        raise ScenarioError(f"collective {key}: {excerpt(text)} is above the {MAX_BYTES:.0f} "
                            f"bytes (1 PiB) a buffer may have")
    return size


def parse_gpus(text: str, total: int, key: str = "--gpus") -> tuple[int, ...]:
    """``0-3,8-11`` or ``0,8`` -> GPU indices, each in [0, total), none twice."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if m is None:
            raise ScenarioError(f"collective {key}: {excerpt(text)} is not a GPU list (ranges and "
                                f"lists of indices, e.g. 0-7, 0,8 or 0-3,8-11)")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        if b < a:
            raise ScenarioError(f"collective {key}: range {excerpt(part.strip())} runs "
                                f"backwards")
        if b >= total:  # before the range is built: 0-10**12 costs nothing
            raise ScenarioError(f"collective {key}: GPU {min(b, max(a, total))} does not "
                                f"exist (the cluster has GPUs 0-{total - 1})")
        out += range(a, b + 1)
        if len(out) > total:
            raise ScenarioError(f"collective {key}: {excerpt(text)} names a GPU twice")
    if len(set(out)) != len(out):
        raise ScenarioError(f"collective {key}: {excerpt(text)} names a GPU twice")
    return tuple(out)


def measure(topology: str, nodes: int, op: str, gpus: str | None, nbytes: str,
            concurrent: int = 1, groups: str | None = None, algorithm: str | None = None,
            fabric: str | None = None, oversubscription: float = 1.0,
            rail_optimized: bool = True, nodes_per_leaf: int = 1) -> tuple[CollectiveResult,
                                                                          list[tuple[int, ...]]]:
    """Build ``nodes`` x ``topology`` and time ``concurrent`` identical collectives.

    The groups are ``groups`` (``"0-7;8-15"``) when given, else ``gpus`` and the next
    ``concurrent - 1`` disjoint groups of the same size (``gpus`` shifted by its span).

    Raises
    ------
    ScenarioError
        One line naming the flag, the value and what is allowed.
    """
    if op not in OPS:
        raise ScenarioError(f"collective --op: {op!r} is not one of {', '.join(OPS)}")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ScenarioError(f"collective --algorithm: {algorithm!r} is not one of "
                            f"{', '.join(ALGORITHMS)}")
    if fabric is not None and fabric not in FABRICS:
        raise ScenarioError(f"collective --fabric: {fabric!r} is not one of {', '.join(FABRICS)}")
    if nodes < 1:
        raise ScenarioError(f"collective --nodes: {nodes} must be at least 1")
    if concurrent < 1:
        raise ScenarioError(f"collective --concurrent: {concurrent} must be at least 1")
    if not 0 < oversubscription < math.inf:
        raise ScenarioError(f"collective --oversubscription: {oversubscription} must be > 0")
    if nodes_per_leaf < 1:
        raise ScenarioError(f"collective --nodes-per-leaf: {nodes_per_leaf} must be at least 1")
    size = parse_bytes(nbytes)
    node = load_node(topology, key="collective --topology")
    total = node.gpus_per_node * nodes
    if groups:
        sets = [parse_gpus(part, total, "--groups") for part in groups.split(";")]
        if concurrent not in (1, len(sets)):
            raise ScenarioError(f"collective --concurrent: {concurrent} does not match the "
                                f"{len(sets)} groups of --groups")
        if len({len(s) for s in sets}) != 1:
            raise ScenarioError(f"collective --groups: {groups!r}: groups differ in size")
    else:
        if gpus is None:
            raise ScenarioError("collective --gpus: required (e.g. 0-7), or give --groups")
        first = parse_gpus(gpus, total)
        span = max(first) - min(first) + 1
        if concurrent > total:  # before building the groups
            raise ScenarioError(f"collective --concurrent: {concurrent} groups of "
                                f"{len(first)} GPUs need more than the {total} GPUs of "
                                f"{nodes} x {node.name}; add --nodes or give --groups")
        sets = [tuple(i + k * span for i in first) for k in range(concurrent)]
        if max(sets[-1]) >= total:
            raise ScenarioError(f"collective --concurrent: {concurrent} groups like {gpus!r} "
                                f"need GPU {max(sets[-1])}, but {nodes} x {node.name} has "
                                f"{total}; add --nodes or give --groups")
    g = build_graph(node, nodes, fabric, oversubscription, None, rail_optimized, nodes_per_leaf)
    named = [tuple(gpu_name(i) for i in s) for s in sets]
    res = run_collectives(Paths(g), op, named, size, node.gpu.calibration.collectives,
                          algorithm)
    return res, sets


def report(res: CollectiveResult, sets: list[tuple[int, ...]]) -> dict:
    """The JSON object of the command: time, algorithm, algbw, busbw and what was run."""
    return {"op": res.op, "algorithm": res.algorithm, "time_s": res.time_s,
            "bytes": res.nbytes, "gpus": [list(s) for s in sets], "ranks": res.ranks,
            "concurrent": res.concurrent, "algbw_bytes_per_s": res.algbw_bytes_per_s,
            "busbw_bytes_per_s": res.busbw_bytes_per_s,
            "bus_factor": bus_factor(res.op, res.ranks)}


def format_report(info: dict) -> str:
    """Human lines for the command."""
    k = info["concurrent"]
    what = f"{k} x " if k > 1 else ""
    return (f"{what}{info['op']} of {_size(info['bytes'])} over {info['ranks']} GPUs "
            f"({'; '.join(_ranges(s) for s in info['gpus'])})\n"
            f"  algorithm  {info['algorithm']}\n"
            f"  time       {info['time_s'] * 1e6:.1f} us\n"
            f"  algbw      {info['algbw_bytes_per_s'] / 1e9:.1f} GB/s\n"
            f"  busbw      {info['busbw_bytes_per_s'] / 1e9:.1f} GB/s "
            f"(algbw x {info['bus_factor']:.4g})")


def _size(nbytes: float) -> str:
    """``64 MiB (67,108,864 bytes)``: binary units, as sizes are given to the command."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit} ({nbytes:,.0f} bytes)"
    return f"{nbytes:,.0f} bytes"


def _ranges(ids: list[int]) -> str:
    parts, start = [], None
    for j, i in enumerate(ids):
        if start is None:
            start = i
        if j + 1 == len(ids) or ids[j + 1] != i + 1:
            parts.append(f"{start}-{i}" if i != start else f"{i}")
            start = None
    return ",".join(parts)
