"""A leaf-spine fabric over nodes of several presets (simulator/topology/graph.py):
its shape, a cross-kind path's bottleneck and latency by hand, the same graph as
build_graph over one preset, and [[pools]] on two presets running over it."""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import pandas as pd
import pytest

from simulator import run
from simulator.hardware.specs import load_node
from simulator.topology.graph import Paths, build_graph, graph_name, leaf_spine_graph

H100, A100 = load_node("dgx-h100"), load_node("dgx-a100")


def _same(a: nx.DiGraph, b: nx.DiGraph) -> None:
    """Same graph attributes, vertices and edges with attributes, in the same order (the
    order breaks ties between equal-latency routes)."""
    assert a.graph == b.graph
    assert list(a.nodes(data=True)) == list(b.nodes(data=True))
    assert list(a.edges(data=True)) == list(b.edges(data=True))


@pytest.mark.parametrize("nodes, kw", [
    (1, {}),
    (2, {}),
    (4, {"oversubscription": 4.0, "spines": 4}),
    (3, {"rail_optimized": False, "nodes_per_leaf": 2, "oversubscription": 3.0}),
    (5, {"rail_optimized": False, "nodes_per_leaf": 1, "spines": 2}),
])
def test_one_preset_gives_build_graphs_graph(nodes, kw):
    _same(leaf_spine_graph([H100] * nodes, **kw),
          build_graph(H100, nodes, "leaf_spine", **kw))


def test_two_presets_rail_optimized_shape():
    """dgx-h100 + dgx-a100 (8 NICs each, 50 and 25 GB/s): 8 leaves, 4 spines, leaf r holds
    NIC r of both nodes, its uplinks (50 + 25) GB/s / 2 / 4 spines at 2:1."""
    g = leaf_spine_graph([H100, A100], oversubscription=2.0)
    assert g.graph["name"] == "1 x dgx-h100 + 1 x dgx-a100"
    assert g.graph["fabric"] == "leaf_spine" and not g.graph["in_switch_reduction"]
    switches = {n: d["tier"] for n, d in g.nodes(data=True) if d["kind"] == "switch"}
    assert sorted(switches) == sorted([f"leaf{r}" for r in range(8)]
                                      + [f"spine{k}" for k in range(4)])
    for r in range(8):
        assert sorted(g.predecessors(f"leaf{r}")) == sorted(
            [f"nic{r}", f"nic{8 + r}"] + [f"spine{k}" for k in range(4)])
        assert g.edges[f"nic{r}", f"leaf{r}"]["bandwidth_Bps"] == 50e9
        assert g.edges[f"leaf{r}", f"nic{8 + r}"]["bandwidth_Bps"] == 25e9
        for k in range(4):
            assert g.edges[f"leaf{r}", f"spine{k}"]["bandwidth_Bps"] == 75e9 / 2 / 4
            assert g.edges[f"leaf{r}", f"spine{k}"]["latency_s"] == 0.6e-6
    assert [g.nodes[f"gpu{i}"]["node"] for i in (0, 7, 8, 15)] == [0, 0, 1, 1]
    # 2 x (8 GPUs + 8 NICs + NVSwitch + host) + 12 switches.
    assert g.number_of_nodes() == 2 * 18 + 12
    # Per node 8 x (NVLink, host PCIe, NIC PCIe, NIC network) links; 8 x 4 leaf-spine.
    assert g.number_of_edges() == 2 * (2 * 8 * 4) + 2 * 8 * 4


def test_kv_path_across_kinds_by_hand():
    """H100 GPU 0 to A100 GPU 8 share rail 0: GPU -(PCIe, 64 GB/s, 0.5 us)- NIC -(50 GB/s,
    1 + 0.3 us)- leaf0 -(25 GB/s, 1 + 0.3 us)- NIC -(PCIe Gen4, 32 GB/s, 0.5 us)- GPU: the
    A100's NIC bounds it at 25 GB/s, 3.6 us. GPU 0 to GPU 9 (rail 1): NVLink to the rail
    (0.4 + 0.4 us) then the same hops, 4.4 us, below the spine route's 4.8 us."""
    paths = Paths(leaf_spine_graph([H100, A100]))
    assert paths.path("gpu0", "gpu8") == ("gpu0", "nic0", "leaf0", "nic8", "gpu8")
    assert paths.bandwidth("gpu0", "gpu8") == 25e9
    assert paths.latency("gpu0", "gpu8") == pytest.approx(0.5e-6 + 1.3e-6 + 1.3e-6 + 0.5e-6)
    assert paths.bandwidth("gpu0", "gpu9") == 25e9
    assert paths.latency("gpu0", "gpu9") == pytest.approx(4.4e-6)
    assert "spine0" not in paths.path("gpu0", "gpu9")
    assert paths.transfer_time("gpu0", "gpu8", 1e9) == pytest.approx(3.6e-6 + 1e9 / 25e9)
    # One leaf per node, 4:1: every cross-node flow crosses a spine; the uplink of the
    # H100's leaf is 8 x 50 GB/s / 4 / 4 = 25 GB/s, the A100's 8 x 25 / 4 / 4 = 12.5 GB/s.
    racks = Paths(leaf_spine_graph([H100, A100], oversubscription=4.0, spines=4,
                                   rail_optimized=False))
    path = racks.path("gpu0", "gpu8")
    assert path[2] == "leaf0" and path[3].startswith("spine") and path[4] == "leaf1"
    assert racks.bandwidth("gpu0", "gpu8") == 12.5e9
    assert racks.latency("gpu0", "gpu8") == pytest.approx(3.6e-6 + 2 * 0.6e-6)


def test_nodes_with_more_rails():
    """A GB200 NVL72 (72 NICs) and a dgx-h100 (8): 72 leaves, 36 spines; leaves 8..71 hold
    the NVL72's NICs alone and size their uplinks from them."""
    nvl = load_node("gb200-nvl72")
    g = leaf_spine_graph([H100, nvl])
    assert graph_name([H100, nvl]) == "1 x dgx-h100 + 1 x gb200-nvl72"
    assert sum(1 for _, d in g.nodes(data=True) if d.get("tier") == "leaf") == 72
    assert sum(1 for _, d in g.nodes(data=True) if d.get("tier") == "spine") == 36
    assert g.edges["leaf0", "spine0"]["bandwidth_Bps"] == 100e9 / 36
    assert g.edges["leaf40", "spine0"]["bandwidth_Bps"] == 50e9 / 36
    assert g.has_edge("nic8", "leaf0") and g.has_edge("nic48", "leaf40")


def test_slower_switch_bounds_the_spine_links():
    slow = replace(A100, switch_latency_s=1.0e-6)
    g = leaf_spine_graph([H100, slow])
    assert g.edges["leaf0", "spine0"]["latency_s"] == 1.0e-6
    assert g.edges["nic0", "leaf0"]["latency_s"] == pytest.approx(1.3e-6)
    assert g.edges["nic8", "leaf0"]["latency_s"] == pytest.approx(1.5e-6)


def _pools(fabric: dict) -> dict:
    """Llama-3.1-8B, prefill TP8 on a dgx-h100 node, decode TP8 on a dgx-a100 node."""
    return {"name": "mixed-ls", "seed": 5, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100", **fabric},
            "engine": {"profile": "vllm-v0.6"},
            "workload": {"arrival": "constant", "rate_per_s": 4.0, "num_requests": 12,
                         "prompt_tokens": 600, "output_tokens": 20},
            "pools": [{"name": "p", "role": "prefill", "nodes": 1, "tp": 8},
                      {"name": "d", "role": "decode", "nodes": 1, "tp": 8,
                       "topology": "dgx-a100"}]}


def test_pools_of_two_presets_on_a_leaf_spine():
    """Rail-optimized, prefill rank r and decode rank r share leaf r: the KV moves over the
    same links as through one switch. One leaf per node at 8:1: through the spines, slower."""
    flat = run(_pools({})).requests
    rail = run(_pools({"fabric": "leaf_spine"}))
    assert rail.plan.graph.graph["fabric"] == "leaf_spine"
    assert [p.node.name for p in rail.plan.pools] == ["dgx-h100", "dgx-a100"]
    pd.testing.assert_series_equal(rail.requests["kv_transfer_s"], flat["kv_transfer_s"])
    racks = run(_pools({"fabric": "leaf_spine", "rail_optimized": False,
                        "nodes_per_leaf": 1, "oversubscription": 8.0})).requests
    assert (racks["kv_transfer_s"] > flat["kv_transfer_s"]).all()
