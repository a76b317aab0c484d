"""A leaf-spine fabric over nodes of several presets (``[[pools]]`` on dgx-h100 and
hgx-h200 nodes with ``[cluster] fabric = "leaf_spine"``, or a plan's cross-kind pools).

Each node is added as :func:`simulator.topology.graph.add_server` adds it (its GPUs, scale-up
switch, host and one NIC per GPU, each NIC link at its own preset's NIC bandwidth and
latency plus half its preset's switch latency). How the rails are matched:

- rail-optimized (default): NIC ``r`` of every node sits on leaf ``r``. Nodes with fewer
  NICs than others (8 against a GB200 NVL72's 72) use rails ``0..n-1`` only; the extra
  leaves hold the larger nodes' NICs alone. So GPU ``r`` of a dgx-h100 node and GPU ``r``
  of an hgx-h200 node meet on one leaf; other pairs cross a spine (or first hop over
  NVLink to the GPU on the peer's rail, whichever path has the lower latency).
- not rail-optimized: every NIC of a node on its rack's leaf, ``nodes_per_leaf`` nodes
  (in node order, whatever their preset) per leaf.

Where NIC speeds differ, every link keeps its own line rate: a path's bandwidth is its
slowest link (:class:`simulator.topology.graph.Paths`), so a 25 GB/s dgx-a100 NIC bounds
a transfer from a 50 GB/s dgx-h100 NIC. A leaf's uplinks carry its downlinks over the
oversubscription ratio, the downlinks being the NICs wired to it at their own rates:
``per spine = sum(NIC bandwidth on the leaf) / oversubscription / spines``; a rack leaf
that holds fewer than ``nodes_per_leaf`` nodes (the last one) is sized as if its empty
slots held NICs like its present ones (as :func:`~simulator.topology.graph.build_graph`
sizes every leaf for ``nodes_per_leaf`` nodes). Leaf-spine links take the largest switch
latency of the presets (one fabric, bounded by its slowest switch); default spines: half
the largest NIC count, at least 1. Over nodes of one preset the graph equals
:func:`~simulator.topology.graph.build_graph`'s (same vertices, edges, attributes and
insertion order).
"""

from __future__ import annotations

from itertools import groupby

import networkx as nx

from simulator.hardware.specs import NodeSpec
from simulator.topology.graph import _link, add_server


def graph_name(nodes: list[NodeSpec]) -> str:
    """``2 x dgx-h100 + 1 x hgx-h200``: runs of one preset in node order."""
    return " + ".join(f"{len(list(run))} x {name}"
                      for name, run in groupby(n.name for n in nodes))


def leaf_spine_graph(nodes: list[NodeSpec], oversubscription: float = 1.0,
                     spines: int | None = None, rail_optimized: bool = True,
                     nodes_per_leaf: int = 1) -> nx.DiGraph:
    """Nodes of (possibly) different presets joined by a two-tier leaf-spine fabric.

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
        As :func:`simulator.topology.graph.build_graph` builds it (``fabric =
        "leaf_spine"``); ``gpu`` is the first node's GPU, ``in_switch_reduction`` holds
        when every node's scale-up switch reduces.

    Notes
    -----
    Leaf r's uplink to each spine (bytes/s per direction):
    ``sum_{NIC on r} B_nic / oversubscription / spines``, times ``nodes_per_leaf / k`` for
    a rack leaf holding ``k < nodes_per_leaf`` nodes. A path's bandwidth is the minimum of
    its links', so the slower end's NIC bounds a cross-kind transfer.
    """
    g = nx.DiGraph(name=graph_name(nodes), node_type=nodes[0].name, fabric="leaf_spine")
    g.graph["gpu"] = nodes[0].gpu
    g.graph["in_switch_reduction"] = all(
        n.scale_up.in_switch_reduction and n.scale_up.kind != "pcie_switch" for n in nodes)
    many = len(nodes) > 1
    first, down = 0, {}  # leaf -> bandwidth of the NICs under it, bytes/s
    for n, node in enumerate(nodes):
        add_server(g, node, n, first, None if not many else
                   (lambda local, n=n: f"leaf{local}" if rail_optimized
                    else f"leaf{n // nodes_per_leaf}"))
        for local in range(node.gpus_per_node):
            leaf = local if rail_optimized else n // nodes_per_leaf
            down[leaf] = down.get(leaf, 0.0) + node.nic.bandwidth_Bps
        first += node.gpus_per_node
    if not many:
        return g
    n_spines = spines or max(1, max(n.gpus_per_node for n in nodes) // 2)
    latency = max(n.switch_latency_s for n in nodes)
    for r in sorted(down):
        ports = down[r]
        if not rail_optimized:  # a rack leaf sized for nodes_per_leaf nodes
            ports = ports * nodes_per_leaf / min(nodes_per_leaf, len(nodes) - r * nodes_per_leaf)
        up = ports / oversubscription / n_spines
        g.add_node(f"leaf{r}", kind="switch", tier="leaf")
        for k in range(n_spines):
            g.add_node(f"spine{k}", kind="switch", tier="spine")
            _link(g, f"leaf{r}", f"spine{k}", up, latency, "network")
    return g
