"""The price of a prompt's KV transfer between a prefill and a decode pool replica on a
plan's graph, alone on the links (:class:`KVPrice`); the disaggregated search
(:mod:`simulator.planner.disagg`, :mod:`simulator.planner.hetero`) adds the contention
(:func:`simulator.planner.poolaxes.kv_contended`).
"""

from __future__ import annotations

import math

import numpy as np

from simulator.cluster.build import ClusterPlan
from simulator.cluster.transfer import kv_flows
from simulator.model.spec import BYTES_PER_DTYPE, ModelSpec
from simulator.parallel.collective import BANDWIDTH_EFFICIENCY, Links
from simulator.planner.space import Layout
from simulator.topology.flows import Flow, finish_times
from simulator.topology.graph import Paths, gpu_name


class KVPrice:
    """Uncontended seconds per token (and the latency) of a prompt's KV from prefill
    replica 0 to decode replica 0 as the packed placement puts them, over the plan's
    graph (cached per shape pair and decode offset)."""

    def __init__(self, cp: ClusterPlan, model: ModelSpec, kv_dtype: str):
        self.g, self.model = cp.graph, model
        self.per_node = cp.node.gpus_per_node
        self.total = sum(1 for _, d in self.g.nodes(data=True) if d.get("kind") == "gpu")
        self.paths = Paths(self.g)
        self.links = Links(self.paths)
        self.capacity = {(a, b): d["bandwidth_Bps"] * BANDWIDTH_EFFICIENCY
                         for a, b, d in self.g.edges(data=True)}
        self.kv_bytes = BYTES_PER_DTYPE[kv_dtype]
        self._cache: dict[tuple, tuple[float, float]] = {}

    def __call__(self, pre: Layout, dec: Layout, first: int) -> tuple[float, float]:
        """``(seconds_per_token, latency_s)``; nan when the decode replica has no room."""
        start = first
        if dec.tp <= self.per_node and start % self.per_node + dec.tp > self.per_node:
            start = -(-start // self.per_node) * self.per_node  # a TP group stays in a node
        key = (pre.tp, pre.pp, pre.attention_dp, dec.tp, dec.pp, dec.attention_dp, start)
        if key not in self._cache:
            if start + dec.tp * dec.pp > self.total:
                self._cache[key] = (math.nan, math.nan)
            else:
                src = [[gpu_name(j * pre.tp + i) for i in range(pre.tp)]
                       for j in range(pre.pp)]
                dst = [[gpu_name(start + j * dec.tp + i) for i in range(dec.tp)]
                       for j in range(dec.pp)]
                flows = kv_flows(self.model, self.kv_bytes, src, dst,
                                 0 if pre.attention_dp else None,
                                 0 if dec.attention_dp else None)
                alone = finish_times([Flow(self.links(a, b), x) for a, b, x in flows],
                                     self.capacity)
                self._cache[key] = (float(np.max(alone)),
                                    max(self.paths.latency(a, b) for a, b, _ in flows))
        return self._cache[key]
