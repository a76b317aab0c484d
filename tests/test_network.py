"""Fabrics joining nodes, the NVL72 preset, and `topology show`."""

from __future__ import annotations

import pytest

import simulator
from simulator.cli import main
from simulator.hardware.specs import load_node
from simulator.topology.graph import Paths, build_graph, nvlink_domains
from simulator.topology.summary import bisection_bandwidth


def test_rail_optimized_leaf_spine_paths_and_oversubscription():
    node = load_node("dgx-h100")
    g = build_graph(node, 4, "leaf_spine", oversubscription=4.0, spines=4)
    p = Paths(g)
    # Same rail (GPU 0 of node 0 -> GPU 0 of node 2): NIC, leaf, NIC; full NIC speed.
    assert p.path("gpu0", "gpu16") == ("gpu0", "nic0", "leaf0", "nic16", "gpu16")
    assert p.bandwidth("gpu0", "gpu16") == pytest.approx(50e9)
    # Across rails the detour over NVLink to the right rail's GPU is faster than a spine.
    assert "spine0" not in p.path("gpu0", "gpu17")
    # Leaf uplinks: 4 nodes x 50 GB/s down, 4:1, over 4 spines.
    assert g.edges["leaf0", "spine0"]["bandwidth_Bps"] == pytest.approx(4 * 50e9 / 4 / 4)
    blocking = build_graph(node, 4, "leaf_spine", oversubscription=1.0, spines=4)
    assert blocking.edges["leaf0", "spine0"]["bandwidth_Bps"] == pytest.approx(50e9)


def test_bisection_bandwidth_of_presets():
    node = load_node("dgx-h100")
    # Two nodes on one switch: the 8 NICs of one node carry 50 GB/s each.
    assert bisection_bandwidth(build_graph(node, 2)) == pytest.approx(8 * 50e9)
    nvl = build_graph(load_node("gb200-nvl72"), 1)
    assert [len(d) for d in nvlink_domains(nvl)] == [72]
    # 36 GPUs x 900 GB/s over NVLink, plus what the graph's C2C host links add.
    assert bisection_bandwidth(nvl) >= 36 * 900e9


def test_a_replica_can_span_the_nvl72_domain():
    sc = {"model": {"name": "llama-3.1-405b", "weight_dtype": "fp8"},
          "cluster": {"topology": "gb200-nvl72"}, "parallel": {"tp": 8, "pp": 9},
          "workload": {"rate_per_s": 1.0, "num_requests": 5}, "output": {"steps": False}}
    res = simulator.run(sc)
    assert res.summary["requests_completed"] == 5 and res.summary["gpus"] == 72


def test_topology_show_prints_a_summary_and_draws(tmp_path, capsys):
    png = tmp_path / "t.png"
    assert main(["topology", "show", "dgx-h100", "--nodes", "2", "--fabric", "leaf_spine",
                 "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "16 GPUs" in out and "2 x 8 GPUs" in out and "bisection" in out
    assert png.stat().st_size > 10_000
    assert main(["topology", "show", "workloads/llama70b-2xdgx.toml"]) == 0
    assert "2 x dgx-h100" in capsys.readouterr().out
