"""Per-link utilization of a run, summarized per link kind (NVLink, PCIe, fabric).

Built from stream-level counters (tokens each replica stepped), so the summary keys exist
with per-step records off. Each replica's traffic is laid on the graph's links:

* TP: 2 all-reduces per layer of ``T * h * 2`` bytes (REFERENCE.md section 2), over the
  flows of the algorithm the stage cost chose at the replica's mean step size
  (:func:`simulator.parallel.collective.schedules`: ring neighbours, tree edges, switch
  reductions, the hierarchical phases; vLLM's custom all-reduce moves a ring's bytes);
* PP: ``T * h * 2`` bytes per step from each stage's first GPU to the next stage's;
* with prefill and decode pools, each KV transfer's bytes on the links its flows take
  (:mod:`simulator.cluster.transfer`).

``util(link) = bytes(link) / (bandwidth(link) * span)`` per directed link; a kind's mean is
over every directed link of that kind in the cluster (idle ones included), its max over the
same links. PCIe counts GPU-to-GPU and GPU-to-NIC links, not GPU-to-host (KV swapping is
not counted). A kind the cluster lacks reports 0.

Over time (:func:`link_windows`, when per-step records are kept): a replica's bytes on each
link are proportional to the tokens it steps, so each window's bytes are the tokens each
replica stepped in it (stage 0 steps, by midpoint, as ``gpu_timeseries.csv`` counts them)
times that replica's bytes per token on the link, plus the KV transfers that start in it;
the same mean and max per kind follow.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from simulator.parallel.collective import Links, schedules
from simulator.topology.graph import Paths

#: The KV transfers' bytes of a disaggregated run: ``(start_s, link, bytes)`` per transfer
#: and directed link (:meth:`simulator.cluster.transfer.KVTransfers.link_bytes`).
KVBytes = tuple[np.ndarray, list[tuple[str, str]], np.ndarray]

KEYS = ("nvlink_util_mean", "nvlink_util_max", "pcie_util_mean", "pcie_util_max",
        "fabric_util_mean", "fabric_util_max")


def replica_link_bytes(plan, tokens: list[float], steps: list[int]
                       ) -> list[dict[tuple[str, str], float]]:
    """Bytes each directed link carried for each replica: ``tokens[r]`` and ``steps[r]``
    of replica r (proportional to its tokens, the algorithm fixed by its mean step and
    the collective calibration of its pool's GPU)."""
    paths = Paths(plan.graph)
    links = Links(paths)
    out = []
    gpus = [p.node.gpu for p in plan.pools for _ in p.replicas]
    for rp, gpu, t, n_steps in zip(plan.replicas, gpus, tokens, steps, strict=True):
        carried: dict[tuple[str, str], float] = defaultdict(float)
        out.append(carried)
        if t <= 0:
            continue
        groups = rp.placement.stages
        for i, (group, cost) in enumerate(zip(groups, rp.stages, strict=True)):
            if len(group) > 1:
                size = cost.message_bytes(t / max(n_steps, 1))
                chosen = cost.allreduce.algorithm(size)
                options = schedules(paths, "all_reduce", group,
                                    gpu.calibration.collectives)
                sched = options.get(chosen, options["ring"])
                total = cost.allreduce_bytes(t)
                for ph in sched.phases:
                    for edges, share in ph.flows:
                        for e in edges:
                            carried[e] += ph.steps * share * total
            if i + 1 < len(groups):
                for e in links(group[0], groups[i + 1][0]):
                    carried[e] += cost.message_bytes(t)
    return out


def link_bytes(plan, tokens: list[float], steps: list[int],
               kv: KVBytes | None = None) -> dict[tuple[str, str], float]:
    """Bytes each directed link carried, all replicas together, and the KV transfers'
    ``kv`` (``(start_s, link, bytes)`` per transfer and link) with pools."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for carried in replica_link_bytes(plan, tokens, steps):
        for e, b in carried.items():
            out[e] += b
    if kv is not None:
        for e, b in zip(kv[1], kv[2].tolist(), strict=True):
            out[e] += b
    return out


def _measured_links(g) -> dict[str, list[tuple[tuple[str, str], float]]]:
    """The directed links each kind's figures are over, with their bandwidths."""
    out: dict[str, list[tuple[tuple[str, str], float]]] = {k: [] for k in KINDS}
    for a, b, d in g.edges(data=True):
        # xGMI (AMD's direct GPU links) is the scale-up fabric's column, as NVLink is.
        kind = {"nvlink": "nvlink", "xgmi": "nvlink", "pcie": "pcie",
                "network": "fabric"}.get(d["kind"])
        if kind == "pcie" and "host" in (g.nodes[a].get("kind"), g.nodes[b].get("kind")):
            continue
        if kind is not None:
            out[kind].append(((a, b), d["bandwidth_Bps"]))
    return out


KINDS = ("nvlink", "pcie", "fabric")


def _kv_windows(kv: KVBytes | None, index: dict, cap: np.ndarray, edges: np.ndarray,
                n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The KV bytes of ``kv`` on the links of ``index`` as (window, link, utilization)
    entries: each transfer in the window it starts in, over the link's capacity there."""
    if kv is None or not len(kv[0]):
        return np.zeros(0, dtype=int), np.zeros(0, dtype=int), np.zeros(0)
    link = np.array([index.get(e, -1) for e in kv[1]], dtype=int)
    on = link >= 0
    win = np.clip(np.searchsorted(edges, kv[0][on], side="right") - 1, 0, n - 1)
    return win, link[on], kv[2][on] / cap[link[on]]


def link_utilization(plan, tokens: list[float], steps: list[int], span_s: float,
                     kv: KVBytes | None = None) -> dict:
    """``{nvlink,pcie,fabric}_util_{mean,max}`` over the run (see the module docstring);
    ``kv``: the KV transfers' bytes of a disaggregated run (:func:`link_bytes`)."""
    carried = link_bytes(plan, tokens, steps, kv)
    out = {}
    for kind, links in _measured_links(plan.graph).items():
        values = [carried.get(e, 0.0) / (bw * span_s) if span_s > 0 else 0.0
                  for e, bw in links]
        out[f"{kind}_util_mean"] = float(np.mean(values)) if values else 0.0
        out[f"{kind}_util_max"] = float(np.max(values)) if values else 0.0
    return out


def link_windows(plan, tokens: list[float], steps: list[int], step_table: pd.DataFrame,
                 edges: np.ndarray, chunk: int = 256,
                 kv: KVBytes | None = None) -> pd.DataFrame:
    """``{nvlink,pcie,fabric}_util_{mean,max}`` per window of ``edges`` (module docstring).

    ``tokens`` and ``steps`` are each replica's totals (they fix its all-reduce algorithm,
    as in :func:`link_utilization`); ``step_table`` gives when the tokens were stepped;
    ``kv`` the KV transfers' bytes (:func:`link_bytes`), each in the window it starts in.
    """
    n, reps = len(edges) - 1, len(plan.replicas)
    width = edges[1] - edges[0]
    # Tokens each replica stepped in each window (stage 0, by the step's midpoint).
    first = step_table[step_table["stage"] == 0]
    mid = ((first["start_s"] + first["end_s"]) / 2).to_numpy()
    win = np.clip(np.searchsorted(edges, mid, side="right") - 1, 0, n - 1)
    rep = first["replica"].to_numpy()
    stepped = (first["prefill_tokens"] + first["decode_tokens"]).to_numpy(float)
    per_window = np.bincount(win * reps + rep, weights=stepped,
                             minlength=n * reps).reshape(n, reps)
    carried = replica_link_bytes(plan, tokens, steps)
    out = {}
    for kind, links in _measured_links(plan.graph).items():
        if not links:
            out[f"{kind}_util_mean"] = out[f"{kind}_util_max"] = np.zeros(n)
            continue
        index = {e: j for j, (e, _) in enumerate(links)}
        cap = np.array([bw for _, bw in links]) * width
        per_token = np.zeros((reps, len(links)))  # bytes per token stepped, replica x link
        for r, by_link in enumerate(carried):
            for e, b in by_link.items():
                if e in index:
                    per_token[r, index[e]] = b / tokens[r]
        per_cap = per_token / cap
        out[f"{kind}_util_mean"] = per_window @ per_cap.mean(axis=1)
        kv_win, kv_link, kv_util = _kv_windows(kv, index, cap, edges, n)
        if len(kv_win):
            out[f"{kind}_util_mean"] = out[f"{kind}_util_mean"] + np.bincount(
                kv_win, weights=kv_util, minlength=n) / len(links)
        peak = np.empty(n)
        for lo in range(0, n, chunk):  # windows x links, a chunk at a time
            part = per_window[lo:lo + chunk] @ per_cap
            if len(kv_win):
                mine = (kv_win >= lo) & (kv_win < lo + chunk)
                np.add.at(part, (kv_win[mine] - lo, kv_link[mine]), kv_util[mine])
            peak[lo:lo + chunk] = part.max(axis=1)
        out[f"{kind}_util_max"] = peak
    return pd.DataFrame({k: out[k] for k in KEYS})
