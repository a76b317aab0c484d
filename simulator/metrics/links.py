"""Per-link utilization of a run, summarized per link kind (NVLink, PCIe, fabric).

Built from stream-level counters (tokens each replica stepped), so the summary keys exist
with per-step records off. Each replica's traffic is laid on the graph's links:

* TP: 2 all-reduces per layer of ``T * h * 2`` bytes (REFERENCE.md section 2), over the
  flows of the algorithm the stage cost chose at the replica's mean step size
  (:func:`simulator.parallel.collective.schedules`: ring neighbours, tree edges, switch
  reductions, the hierarchical phases; vLLM's custom all-reduce moves a ring's bytes);
* PP: ``T * h * 2`` bytes per step from each stage's first GPU to the next stage's.

``util(link) = bytes(link) / (bandwidth(link) * span)`` per directed link; a kind's mean is
over every directed link of that kind in the cluster (idle ones included), its max over the
same links. PCIe counts GPU-to-GPU and GPU-to-NIC links, not GPU-to-host (KV swapping is
not counted). A kind the cluster lacks reports 0.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from simulator.model.cost import ACT_BYTES
from simulator.parallel.collective import Links, schedules
from simulator.topology.graph import Paths

KEYS = ("nvlink_util_mean", "nvlink_util_max", "pcie_util_mean", "pcie_util_max",
        "fabric_util_mean", "fabric_util_max")


def link_bytes(plan, tokens: list[float], steps: list[int]) -> dict[tuple[str, str], float]:
    """Bytes each directed link carried: ``tokens[r]`` and ``steps[r]`` of replica r."""
    paths = Paths(plan.graph)
    links = Links(paths)
    h = plan.model.hidden
    out: dict[tuple[str, str], float] = defaultdict(float)
    for rp, t, n_steps in zip(plan.replicas, tokens, steps, strict=True):
        if t <= 0:
            continue
        groups = rp.placement.stages
        for i, (group, cost) in enumerate(zip(groups, rp.stages, strict=True)):
            if len(group) > 1:
                size = t / max(n_steps, 1) * h * ACT_BYTES
                chosen = cost.allreduce.algorithm(size)
                options = schedules(paths, "all_reduce", group,
                                    plan.node.gpu.calibration.collectives)
                sched = options.get(chosen, options["ring"])
                total = 2 * cost.layers * t * h * ACT_BYTES
                for ph in sched.phases:
                    for edges, share in ph.flows:
                        for e in edges:
                            out[e] += ph.steps * share * total
            if i + 1 < len(groups):
                for e in links(group[0], groups[i + 1][0]):
                    out[e] += t * h * ACT_BYTES
    return out


def link_utilization(plan, tokens: list[float], steps: list[int], span_s: float) -> dict:
    """``{nvlink,pcie,fabric}_util_{mean,max}`` over the run (see the module docstring)."""
    carried = link_bytes(plan, tokens, steps)
    g = plan.graph
    util: dict[str, list[float]] = {"nvlink": [], "pcie": [], "fabric": []}
    for a, b, d in g.edges(data=True):
        kind = {"nvlink": "nvlink", "pcie": "pcie", "network": "fabric"}.get(d["kind"])
        if kind == "pcie" and "host" in (g.nodes[a].get("kind"), g.nodes[b].get("kind")):
            continue
        if kind is None:
            continue
        u = carried.get((a, b), 0.0) / (d["bandwidth_Bps"] * span_s) if span_s > 0 else 0.0
        util[kind].append(u)
    out = {}
    for kind, values in util.items():
        out[f"{kind}_util_mean"] = float(np.mean(values)) if values else 0.0
        out[f"{kind}_util_max"] = float(np.max(values)) if values else 0.0
    return out
