"""Build the cluster graph: GPUs, NVSwitches, hosts, NICs and the switch joining nodes.

:func:`build_graph` joins copies of one node preset on one switch or a leaf-spine;
:func:`leaf_spine_graph` builds every leaf-spine, over one preset's nodes or several.

Nodes carry ``kind`` (gpu, nvswitch, pcie_switch, host, nic, switch) and, for GPUs,
``node`` and ``index`` (global GPU number, as faults and placements name them). Every
physical link is two directed edges, each with ``bandwidth_Bps`` (per direction),
``latency_s`` and ``kind`` (nvlink, xgmi, pcie, network); scale-up links (the GPU-to-GPU
fabric of a node) carry ``scale_up = True``. Times of transfers come from paths in this
graph, never from constants in the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from itertools import groupby

import networkx as nx

from simulator.hardware.schema import FABRIC_KINDS
from simulator.hardware.specs import NodeSpec


def _link(g: nx.DiGraph, a: str, b: str, bw: float, lat: float, kind: str,
          scale_up: bool = False) -> None:
    g.add_edge(a, b, bandwidth_Bps=bw, latency_s=lat, kind=kind, scale_up=scale_up)
    g.add_edge(b, a, bandwidth_Bps=bw, latency_s=lat, kind=kind, scale_up=scale_up)


def gpu_name(index: int) -> str:
    return f"gpu{index}"


#: Edge kinds of a node's GPU-to-GPU fabric that the engines' NVLink-class features (custom
#: all-reduce, DeepEP's intra-node path) run over: NVLink through a switch, or AMD's
#: direct Infinity Fabric (xGMI) links.
PEER_LINKS = ("nvlink", "xgmi")


def full_mesh(g: nx.DiGraph, group: tuple[str, ...] | list[str]) -> bool:
    """Whether every pair of the group's GPUs has its own direct xGMI link (an AMD node's
    fully connected Infinity Fabric; no switch between them)."""
    return len(group) > 1 and all(
        g.has_edge(a, b) and g.edges[a, b]["kind"] == "xgmi"
        for a in group for b in group if a != b)


def add_server(g: nx.DiGraph, node: NodeSpec, n: int, first: int,
               edge: Callable[[int], str] | None) -> None:
    """Add node ``n`` of preset ``node`` to ``g``: its scale-up switch (NVSwitch, or a PCIe
    switch for a PCIe node) or, for an ``xgmi_mesh`` node, a direct link between every
    pair of its GPUs; its host, and its GPUs ``first``, ``first + 1``, ... each with its
    NIC; NIC ``local`` is wired to the fabric switch ``edge(local)`` (None: no fabric).
    """
    pcie, mesh = node.scale_up.kind == "pcie_switch", node.scale_up.kind == "xgmi_mesh"
    nvsw, host = (f"pcieswitch{n}" if pcie else f"nvswitch{n}"), f"host{n}"
    if not mesh:
        g.add_node(nvsw, kind="pcie_switch" if pcie else "nvswitch", node=n)
    g.add_node(host, kind="host", node=n)
    for local in range(node.gpus_per_node):
        i = first + local
        gpu, nic = gpu_name(i), f"nic{i}"
        g.add_node(gpu, kind="gpu", node=n, index=i)
        g.add_node(nic, kind="nic", node=n)
        if mesh:  # one xGMI link to each GPU added before this one
            for peer in range(first, i):
                _link(g, gpu, gpu_name(peer), node.scale_up.bandwidth_Bps,
                      node.scale_up.latency_s, "xgmi", scale_up=True)
        else:
            _link(g, gpu, nvsw, node.scale_up.bandwidth_Bps, node.scale_up.latency_s,
                  "pcie" if pcie else "nvlink", scale_up=True)
        _link(g, gpu, host, node.host.bandwidth_Bps, node.host.latency_s, "pcie")
        # GPUDirect RDMA: the GPU reaches its NIC through the PCIe switch.
        _link(g, gpu, nic, node.host.bandwidth_Bps, node.host.latency_s / 2, "pcie")
        if edge is not None:
            _link(g, nic, edge(local), node.nic.bandwidth_Bps,
                  node.nic.latency_s + node.switch_latency_s / 2, "network")


#: Fabrics joining nodes (their one home is the node-file schema).
FABRICS = FABRIC_KINDS


def build_graph(node: NodeSpec, nodes: int, fabric: str | None = None,
                oversubscription: float = 1.0, spines: int | None = None,
                rail_optimized: bool = True, nodes_per_leaf: int = 1) -> nx.DiGraph:
    """The graph of ``nodes`` copies of ``node`` joined by a fabric (when nodes > 1).

    Parameters
    ----------
    node : NodeSpec
        The node type (GPUs, NVSwitch bandwidth, host PCIe, NICs).
    nodes : int
        Number of nodes.
    fabric : {"single_switch", "leaf_spine"}, optional
        ``single_switch``: every NIC on one switch. ``leaf_spine``: rail-optimized two
        tiers, NIC r of every node on leaf r (same-rail traffic stays on the leaf), every
        leaf wired to every spine; default: the node preset's fabric.
    oversubscription : float
        Leaf downlink over uplink bandwidth (1 = non-blocking; 4 = 4:1).
    spines : int, optional
        Spine switches (default: half the rails, at least 1).
    rail_optimized : bool
        ``leaf_spine`` only. False: every NIC of a node on the node's top-of-rack leaf,
        ``nodes_per_leaf`` nodes per leaf, so traffic between racks crosses the spines.
    nodes_per_leaf : int
        Nodes under one leaf when not rail-optimized.

    Notes
    -----
    ``leaf_spine`` is :func:`leaf_spine_graph` over ``nodes`` copies of ``node``. A leaf's
    uplinks carry its downlinks' bandwidth over the ratio:
    ``per spine = ports * nic_bandwidth / oversubscription / spines``, with ``ports`` the
    NICs under the leaf (``nodes`` when rail-optimized, ``nodes_per_leaf * gpus_per_node``
    otherwise).
    """
    fabric = fabric or node.fabric_kind
    if fabric == "leaf_spine":
        return leaf_spine_graph([node] * nodes, oversubscription, spines, rail_optimized,
                                nodes_per_leaf)
    g = nx.DiGraph(name=f"{nodes} x {node.name}", node_type=node.name, fabric=fabric)
    g.graph["gpu"] = node.gpu
    # NVSwitch nodes join their GPUs over NVLink; a PCIe node (scale_up.kind = "pcie_switch")
    # joins them over PCIe: the same scale-up domain, priced on PCIe links, no NVLS.
    pcie = node.scale_up.kind == "pcie_switch"
    g.graph["in_switch_reduction"] = node.scale_up.in_switch_reduction and not pcie
    per = node.gpus_per_node
    if nodes > 1 and fabric == "single_switch":
        g.add_node("switch", kind="switch")
    # The leaf names below serve only a caller passing a fabric outside FABRICS (node files
    # are checked against them, hardware/schema.py): its NICs stay on leaves no spine joins.
    for n in range(nodes):
        add_server(g, node, n, n * per, None if nodes == 1 else
                   (lambda local, n=n: "switch" if fabric == "single_switch" else
                    f"leaf{local}" if rail_optimized else f"leaf{n // nodes_per_leaf}"))
    return g


def graph_name(nodes: list[NodeSpec]) -> str:
    """``2 x dgx-h100 + 1 x hgx-h200``: runs of one preset in node order."""
    return " + ".join(f"{len(list(run))} x {name}"
                      for name, run in groupby(n.name for n in nodes))


def leaf_spine_graph(nodes: list[NodeSpec], oversubscription: float = 1.0,
                     spines: int | None = None, rail_optimized: bool = True,
                     nodes_per_leaf: int = 1) -> nx.DiGraph:
    """Nodes of one or several presets joined by a two-tier leaf-spine fabric: the
    ``leaf_spine`` graph of :func:`build_graph` (over copies of one node) and of
    ``[[pools]]`` or a plan's cross-kind pools on nodes of several presets.

    Parameters
    ----------
    nodes : list of NodeSpec
        The nodes in order; node n's GPUs are numbered after those of nodes 0..n-1.
    oversubscription : float
        Leaf downlink over uplink bandwidth (1 = non-blocking).
    spines : int, optional
        Spine switches (default: half the largest NIC count of a node, at least 1).
    rail_optimized : bool
        True: NIC r of every node on leaf r. False: a node's NICs on its rack's leaf.
    nodes_per_leaf : int
        Nodes under one leaf when not rail-optimized.

    Returns
    -------
    nx.DiGraph
        Named by :func:`graph_name`, ``fabric = "leaf_spine"``; ``gpu`` is the first node's
        GPU, ``in_switch_reduction`` holds when every node's scale-up switch reduces.

    Notes
    -----
    Each node is added as :func:`add_server` adds it (its GPUs, scale-up switch, host and
    one NIC per GPU, each NIC link at its own preset's NIC bandwidth and latency plus half
    its preset's switch latency). How the rails are matched:

    - rail-optimized (default): NIC ``r`` of every node sits on leaf ``r``. Nodes with
      fewer NICs than others (8 against a GB200 NVL72's 72) use rails ``0..n-1`` only; the
      extra leaves hold the larger nodes' NICs alone. So GPU ``r`` of a dgx-h100 node and
      GPU ``r`` of an hgx-h200 node meet on one leaf; other pairs cross a spine (or first
      hop over NVLink to the GPU on the peer's rail, whichever path has the lower latency).
    - not rail-optimized: every NIC of a node on its rack's leaf, ``nodes_per_leaf`` nodes
      (in node order, whatever their preset) per leaf.

    Where NIC speeds differ, every link keeps its own line rate: a path's bandwidth is its
    slowest link (:class:`Paths`), so a 25 GB/s dgx-a100 NIC bounds a transfer from a
    50 GB/s dgx-h100 NIC. Leaf r's uplink to each spine (bytes/s per direction):
    ``sum_{NIC on r} B_nic / oversubscription / spines``, times ``nodes_per_leaf / k`` for
    a rack leaf holding ``k < nodes_per_leaf`` nodes (the last one, sized as if its empty
    slots held NICs like its present ones). Over one preset that is
    ``ports * B_nic / oversubscription / spines`` with ``ports`` the NICs a full leaf holds
    (``nodes`` when rail-optimized, ``nodes_per_leaf * gpus_per_node`` otherwise).
    Leaf-spine links take the largest switch latency of the presets (one fabric, bounded
    by its slowest switch).
    """
    g = nx.DiGraph(name=graph_name(nodes), node_type=nodes[0].name, fabric="leaf_spine")
    g.graph["gpu"] = nodes[0].gpu
    # NVSwitch nodes join their GPUs over NVLink; a PCIe node (scale_up.kind = "pcie_switch")
    # joins them over PCIe: the same scale-up domain, priced on PCIe links, no NVLS.
    g.graph["in_switch_reduction"] = all(
        n.scale_up.in_switch_reduction and n.scale_up.kind != "pcie_switch" for n in nodes)
    many = len(nodes) > 1
    # leaf -> bandwidth of the NICs under it (bytes/s), summed exactly so that k NICs of
    # one preset give the correctly rounded k * B_nic, whatever B_nic.
    first, down = 0, {}
    for n, node in enumerate(nodes):
        add_server(g, node, n, first, None if not many else
                   (lambda local, n=n: f"leaf{local}" if rail_optimized
                    else f"leaf{n // nodes_per_leaf}"))
        for local in range(node.gpus_per_node):
            leaf = local if rail_optimized else n // nodes_per_leaf
            down[leaf] = down.get(leaf, Fraction(0)) + Fraction(node.nic.bandwidth_Bps)
        first += node.gpus_per_node
    if not many:
        return g
    n_spines = spines or max(1, max(n.gpus_per_node for n in nodes) // 2)
    latency = max(n.switch_latency_s for n in nodes)
    for r in sorted(down):
        ports = down[r]
        if not rail_optimized:  # a rack leaf sized for nodes_per_leaf nodes
            ports = ports * nodes_per_leaf / min(nodes_per_leaf, len(nodes) - r * nodes_per_leaf)
        up = float(ports) / oversubscription / n_spines
        g.add_node(f"leaf{r}", kind="switch", tier="leaf")
        for k in range(n_spines):
            g.add_node(f"spine{k}", kind="switch", tier="spine")
            _link(g, f"leaf{r}", f"spine{k}", up, latency, "network")
    return g


def gpus(g: nx.DiGraph) -> list[str]:
    """GPU node names in global index order."""
    found = [(d["index"], n) for n, d in g.nodes(data=True) if d.get("kind") == "gpu"]
    return [n for _, n in sorted(found)]


def nvlink_domains(g: nx.DiGraph) -> list[list[str]]:
    """Scale-up domains: GPUs that reach each other over their node's GPU switch (NVSwitch,
    or the PCIe switches of a node without NVLink), as lists ordered by GPU index."""
    nv = nx.Graph()
    nv.add_nodes_from(n for n in gpus(g))
    nv.add_edges_from((a, b) for a, b, k in g.edges(data="scale_up") if k)
    index = nx.get_node_attributes(g, "index")
    domains = []
    for comp in nx.connected_components(nv):
        members = sorted((n for n in comp if n in index), key=index.get)
        if members:
            domains.append(members)
    return sorted(domains, key=lambda m: index[m[0]])


class Paths:
    """Point-to-point path queries, cached: the route is the lowest-latency path.

    ``bandwidth(a, b)`` is the path's bottleneck (bytes/s per direction), ``latency(a, b)``
    the sum of its link latencies (s).
    """

    def __init__(self, g: nx.DiGraph):
        self.g = g
        self._route = lru_cache(maxsize=None)(self._compute)

    def _compute(self, a: str, b: str) -> tuple[float, float, tuple[str, ...]]:
        path = nx.shortest_path(self.g, a, b, weight="latency_s")
        edges = [self.g.edges[u, v] for u, v in zip(path, path[1:], strict=False)]
        bw = min((e["bandwidth_Bps"] for e in edges), default=float("inf"))
        lat = sum(e["latency_s"] for e in edges)
        return bw, lat, tuple(path)

    def bandwidth(self, a: str, b: str) -> float:
        return self._route(a, b)[0]

    def latency(self, a: str, b: str) -> float:
        return self._route(a, b)[1]

    def path(self, a: str, b: str) -> tuple[str, ...]:
        return self._route(a, b)[2]

    def transfer_time(self, a: str, b: str, nbytes: float) -> float:
        """Uncontended time to move ``nbytes`` from a to b: latency + bytes / bottleneck."""
        if a == b or nbytes <= 0:
            return 0.0
        bw, lat, _ = self._route(a, b)
        return lat + nbytes / bw
