"""build_graph's leaf-spine over one preset, now :func:`leaf_spine_graph` over copies of the
node: the same graph as the branch build_graph had before it delegated (kept below as the
reference), vertices, edges and attributes in the same order, for every preset, both rail
layouts and a NIC rate that is not a whole number of bytes/s; and ``[[pools]]`` on one
preset with ``fabric = "leaf_spine"`` (:func:`simulator.cluster.pools.fabric_graph`) get it
too."""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import pytest

from simulator.cluster.pools import fabric_graph
from simulator.hardware.specs import NodeSpec, load_node
from simulator.io.scenario import load_scenario
from simulator.topology.graph import _link, add_server, build_graph

PRESETS = ["dgx-a100", "dgx-h100", "gb200-nvl72", "hgx-b200", "hgx-h200", "l40s-pcie"]
CASES = [
    (1, {}),
    (2, {}),
    (3, {"oversubscription": 3.0}),
    (4, {"oversubscription": 4.0, "spines": 4}),
    (3, {"rail_optimized": False, "nodes_per_leaf": 2, "oversubscription": 3.0}),
    (5, {"rail_optimized": False, "nodes_per_leaf": 1, "spines": 2}),
    (7, {"rail_optimized": False, "nodes_per_leaf": 3, "oversubscription": 7.0, "spines": 3}),
]


def _reference(node: NodeSpec, nodes: int, oversubscription: float = 1.0,
               spines: int | None = None, rail_optimized: bool = True,
               nodes_per_leaf: int = 1) -> nx.DiGraph:
    """build_graph(node, nodes, "leaf_spine", ...) as it was written before it delegated."""
    g = nx.DiGraph(name=f"{nodes} x {node.name}", node_type=node.name, fabric="leaf_spine")
    g.graph["gpu"] = node.gpu
    pcie = node.scale_up.kind == "pcie_switch"
    g.graph["in_switch_reduction"] = node.scale_up.in_switch_reduction and not pcie
    per = node.gpus_per_node
    for n in range(nodes):
        add_server(g, node, n, n * per, None if nodes == 1 else
                   (lambda local, n=n: f"leaf{local}" if rail_optimized
                    else f"leaf{n // nodes_per_leaf}"))
    if nodes > 1:
        n_spines = spines or max(1, per // 2)
        leaves = per if rail_optimized else -(-nodes // nodes_per_leaf)
        ports = nodes if rail_optimized else nodes_per_leaf * per
        up = ports * node.nic.bandwidth_Bps / oversubscription / n_spines
        for r in range(leaves):
            g.add_node(f"leaf{r}", kind="switch", tier="leaf")
            for k in range(n_spines):
                g.add_node(f"spine{k}", kind="switch", tier="spine")
                _link(g, f"leaf{r}", f"spine{k}", up, node.switch_latency_s, "network")
    return g


def _same(a: nx.DiGraph, b: nx.DiGraph) -> None:
    """Same graph attributes, vertices and edges with attributes, in the same order (the
    order breaks ties between equal-latency routes); floats compared exactly."""
    assert a.graph == b.graph
    assert list(a.nodes(data=True)) == list(b.nodes(data=True))
    assert list(a.edges(data=True)) == list(b.edges(data=True))


def _odd_nic() -> NodeSpec:
    """A dgx-h100 with a NIC rate that k additions and k x B round differently."""
    h100 = load_node("dgx-h100")
    return replace(h100, nic=replace(h100.nic, bandwidth_Bps=0.1e9 / 3))


@pytest.mark.parametrize("nodes, kw", CASES)
@pytest.mark.parametrize("preset", PRESETS)
def test_build_graph_leaf_spine_as_before(preset, nodes, kw):
    node = load_node(preset)
    if preset == "gb200-nvl72" and nodes > 3:
        nodes = 3  # 72 GPUs a node: three racks show the layout
    _same(build_graph(node, nodes, "leaf_spine", **kw), _reference(node, nodes, **kw))


@pytest.mark.parametrize("nodes, kw", CASES)
def test_build_graph_leaf_spine_as_before_at_an_odd_nic_rate(nodes, kw):
    node = _odd_nic()
    _same(build_graph(node, nodes, "leaf_spine", **kw), _reference(node, nodes, **kw))


@pytest.mark.parametrize("nodes, kw", CASES)
def test_pools_of_one_preset_on_a_leaf_spine_as_before(nodes, kw):
    """fabric_graph over nodes of one preset: build_graph's graph, as it chose before."""
    s = load_scenario({"name": "ls", "model": {"name": "llama-3.1-8b"},
                       "cluster": {"topology": "dgx-h100", "fabric": "leaf_spine", **kw},
                       "workload": {"rate_per_s": 1.0, "num_requests": 1}})
    for node in (load_node("dgx-h100"), _odd_nic()):
        _same(fabric_graph(s, [node] * nodes), _reference(node, nodes, **kw))
