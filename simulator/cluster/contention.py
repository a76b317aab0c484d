"""Pipeline hand-offs that share fabric links with other replicas' hand-offs.

A PP send whose path crosses a network link that another replica's PP send also crosses
goes through one :class:`simulator.topology.flows.FlowNetwork` shared by the cluster
(max-min fair sharing, recomputed at every start and finish); every other send keeps the
analytic cost ``latency + tokens * s_per_token``. Links run at the point-to-point
efficiency (``BANDWIDTH_EFFICIENCY``), so a shared send alone on its links takes the
analytic time (to a clock tick or two).
"""

from __future__ import annotations

from collections import defaultdict

import networkx as nx

from simulator.cluster.plan import ReplicaPlan
from simulator.model.cost import ACT_BYTES
from simulator.model.spec import ModelSpec
from simulator.parallel.collective import BANDWIDTH_EFFICIENCY, Links
from simulator.topology.flows import FlowNetwork
from simulator.topology.graph import Paths


class SharedSend(tuple):
    """A hand-off cost ``(latency_s, s_per_token)`` (what the engine unpacks) whose bytes
    go through ``network`` over ``edges``: ``bytes_per_token`` per token handed off."""

    network: FlowNetwork
    edges: tuple
    bytes_per_token: float

    def __new__(cls, cost: tuple[float, float], network: FlowNetwork, edges: tuple,
                bytes_per_token: float):
        self = super().__new__(cls, cost)
        self.network, self.edges, self.bytes_per_token = network, edges, bytes_per_token
        return self


def shared_sends(env, graph: nx.DiGraph, replicas: tuple[ReplicaPlan, ...], model: ModelSpec,
                 quantum_s: float) -> list[list[tuple]]:
    """Each replica's hand-off costs, with :class:`SharedSend` where the path shares a
    network link with another of ``replicas``' hand-offs (``replicas`` order)."""
    g = graph
    links = Links(Paths(g))
    routes = [[links(a[0], b[0]) for a, b in zip(rp.placement.stages, rp.placement.stages[1:],
                                                 strict=False)]
              for rp in replicas]
    users: dict[tuple, set[int]] = defaultdict(set)
    for r, paths in enumerate(routes):
        for edges in paths:
            for e in edges:
                if g.edges[e]["kind"] == "network":
                    users[e].add(r)
    shared = {e for e, rs in users.items() if len(rs) > 1}
    out: list[list[tuple]] = [list(rp.sends) for rp in replicas]
    if not shared:
        return out
    capacity = {(a, b): d["bandwidth_Bps"] * BANDWIDTH_EFFICIENCY
                for a, b, d in g.edges(data=True)}
    network = FlowNetwork(env, capacity, quantum_s)
    per_token = model.hidden * ACT_BYTES
    for r, paths in enumerate(routes):
        for i, edges in enumerate(paths):
            if shared.intersection(edges):
                out[r][i] = SharedSend(tuple(out[r][i]), network, edges, per_token)
    return out
