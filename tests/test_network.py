"""The network: fabrics, presets, `topology show`, max-min fair flows, collectives over any
GPU group, the `collective` command, TP across nodes, PCIe nodes, link utilization."""

from __future__ import annotations

import json

import pytest
import simpy

import simulator
from simulator.cli import main
from simulator.cluster.contention import SharedSend, shared_sends
from simulator.engine.clock import TICK
from simulator.hardware.specs import load_node
from simulator.metrics.links import KEYS, link_utilization
from simulator.parallel.collective import _phase_terms, allreduce, run_collectives, schedules
from simulator.parallel.placement import place
from simulator.topology.flows import Flow, finish_times, max_min_rates
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


# --- Max-min fair flows ---------------------------------------------------------------------

def test_two_flows_sharing_one_link_each_get_half():
    assert list(max_min_rates([("l",), ("l",)], {"l": 10.0})) == pytest.approx([5.0, 5.0])
    # 10 and 20 bytes at 5 B/s each; once the first ends at 2 s the second runs at 10 B/s.
    done = finish_times([Flow(("l",), 10.0), Flow(("l",), 20.0)], {"l": 10.0})
    assert list(done) == pytest.approx([2.0, 3.0])


def test_a_flow_gets_what_a_slower_shared_bottleneck_leaves():
    # f0 crosses a (10 B/s) and b (4 B/s), f1 only a, f2 only b. b is the bottleneck: f0
    # and f2 get 2 each; f1 gets what f0 leaves of a: 10 - 2 = 8.
    cap = {"a": 10.0, "b": 4.0}
    rates = max_min_rates([("a", "b"), ("a",), ("b",)], cap)
    assert list(rates) == pytest.approx([2.0, 8.0, 2.0])


def test_a_late_flow_slows_the_first_from_its_start():
    # f0 alone for 0.5 s at 10 B/s (5 B), then 5 B/s each: f0 ends at 1.5 s, f1 has moved
    # 5 B by then and finishes its last 5 B alone at 10 B/s: 2.0 s.
    done = finish_times([Flow(("l",), 10.0), Flow(("l",), 10.0, start_s=0.5)], {"l": 10.0})
    assert list(done) == pytest.approx([1.5, 2.0])
    assert list(finish_times([Flow((), 5.0), Flow(("l",), 0.0, 1.0)], {"l": 1.0})) == [0.0, 1.0]


# --- Collectives over any group -------------------------------------------------------------

def _dgx(nodes: int, **kw) -> tuple[Paths, object]:
    node = load_node("dgx-h100")
    return Paths(build_graph(node, nodes, **kw)), node.gpu.calibration.collectives


def _gpus(a: int, b: int) -> tuple[str, ...]:
    return tuple(f"gpu{i}" for i in range(a, b))


def test_flow_schedules_in_one_node_equal_the_calibrated_closed_forms():
    paths, cal = _dgx(1)
    closed = {name: (a, b) for name, a, b in allreduce(paths, _gpus(0, 8), cal, True).nccl}
    for name, sched in schedules(paths, "all_reduce", _gpus(0, 8), cal).items():
        assert _phase_terms(paths, [sched]) == pytest.approx(closed[name], rel=1e-9)


def test_8_vs_16_gpu_all_reduce_ratio_follows_the_link_speeds():
    paths, cal = _dgx(2)
    S = 2**30
    nv, nic, eff = 450e9, 50e9, cal.ring_eff
    t8 = run_collectives(paths, "all_reduce", [_gpus(0, 8)], S, cal, "ring").time_s
    ring16 = run_collectives(paths, "all_reduce", [_gpus(0, 16)], S, cal, "ring").time_s
    hier16 = run_collectives(paths, "all_reduce", [_gpus(0, 16)], S, cal, "hierarchical").time_s
    # Hand formulas: 8 channels (one per rail) of a 16-rank ring; the bottleneck of each step
    # is the NIC crossing, S/(16*8) at 50 GB/s; in one node, S/8 per step over NVLink.
    beta8 = 2 * 7 / 8 / (nv * eff)
    beta_ring16 = 2 * 15 / 16 / (8 * nic * eff)
    beta_hier16 = 2 * 7 / 8 / (nv * eff) + 2 * (1 / 2) / 8 / (nic * eff)
    assert ring16 / t8 == pytest.approx(beta_ring16 / beta8, rel=0.03)
    assert hier16 / t8 == pytest.approx(beta_hier16 / beta8, rel=0.03)
    best = run_collectives(paths, "all_reduce", [_gpus(0, 16)], S, cal)
    assert best.algorithm == "ring" and best.time_s == pytest.approx(ring16)
    # Small messages: latency decides, and the 16-rank ring's 30 cross-node steps lose.
    assert run_collectives(paths, "all_reduce", [_gpus(0, 16)], 8192, cal).algorithm != "ring"


def test_collectives_sharing_nics_take_twice_as_long_disjoint_ones_as_long():
    paths, cal = _dgx(4)
    S = 2**30
    one = run_collectives(paths, "all_reduce", [_gpus(0, 16)], S, cal).time_s
    disjoint = run_collectives(paths, "all_reduce", [_gpus(0, 16), _gpus(16, 32)], S, cal)
    shared = run_collectives(paths, "all_reduce", [_gpus(0, 16), _gpus(0, 16)], S, cal)
    assert disjoint.time_s == pytest.approx(one, rel=0.01)
    assert shared.time_s / one == pytest.approx(2.0, rel=0.05)


def test_spine_oversubscription_slows_cross_spine_traffic_not_intra_node():
    S = 2**28
    # Not rail-optimized: every NIC of a node on its ToR leaf, one node per leaf, so node 0
    # -> node 1 traffic crosses the spines.
    times = {}
    for ratio in (1.0, 4.0):
        paths, cal = _dgx(2, fabric="leaf_spine", oversubscription=ratio,
                          rail_optimized=False, nodes_per_leaf=1)
        cross = [(f"gpu{i}", f"gpu{8 + i}") for i in range(8)]
        intra = [(f"gpu{i}", f"gpu{(i + 1) % 8}") for i in range(8)]
        times[ratio] = (run_collectives(paths, "send_recv", cross, S, cal).time_s,
                        run_collectives(paths, "send_recv", intra, S, cal).time_s)
    assert times[4.0][0] / times[1.0][0] == pytest.approx(4.0, rel=0.05)
    assert times[4.0][1] == pytest.approx(times[1.0][1])


def test_collective_cli_json_and_bad_input(capsys):
    assert main(["collective", "--topology", "dgx-h100", "--nodes", "2", "--op", "all_reduce",
                 "--gpus", "0-3,8-11", "--bytes", "64MiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["op"] == "all_reduce" and out["bytes"] == 64 * 2**20 and out["ranks"] == 8
    assert out["gpus"] == [[0, 1, 2, 3, 8, 9, 10, 11]] and out["concurrent"] == 1
    assert out["busbw_bytes_per_s"] == pytest.approx(out["bytes"] / out["time_s"] * 2 * 7 / 8)
    paths, cal = _dgx(2)
    expect = run_collectives(paths, "all_reduce", [tuple(f"gpu{i}" for i in (0, 1, 2, 3, 8, 9,
                                                                             10, 11))],
                             64 * 2**20, cal)
    assert out["time_s"] == pytest.approx(expect.time_s) and out["algorithm"] == expect.algorithm
    assert main(["collective", "--nodes", "2", "--op", "send_recv", "--gpus", "0,8",
                 "--bytes", "1e6", "--json"]) == 0
    p2p = json.loads(capsys.readouterr().out)
    assert p2p["busbw_bytes_per_s"] == pytest.approx(p2p["algbw_bytes_per_s"])
    for argv, words in [
        (["--gpus", "0-8"], ["--gpus", "GPU 8", "0-7"]),
        (["--gpus", "0-7", "--bytes", "12XB"], ["--bytes", "'12XB'", "64MiB"]),
        (["--gpus", "0-7", "--op", "bcast"], ["--op", "'bcast'", "all_gather"]),
        (["--gpus", "0-7", "--algorithm", "hierarchical"], ["--algorithm", "available"]),
        (["--gpus", "0-7", "--concurrent", "2"], ["--concurrent", "GPU 15", "--nodes"]),
        (["--gpus", "a-b"], ["--gpus", "'a-b'"]),
        (["--groups", "0-3;4-5"], ["--groups", "differ"]),
        (["--gpus", "0-2", "--op", "send_recv"], ["send_recv", "2 GPUs"]),
        (["--gpus", "0-7", "--topology", "dgx-x"], ["collective --topology", "'dgx-x'",
                                                    "dgx-h100"]),
    ]:
        assert main(["collective", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and all(w in err for w in words), err
    for argv, words in [(["--nodes", "0"], ["--nodes", "0", "at least 1"]),
                        (["--oversubscription", "0.5"], ["--oversubscription", "0.5"])]:
        assert main(["topology", "show", "dgx-h100", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_tp_larger_than_a_node_takes_whole_nodes_and_its_all_reduce_crosses_them():
    domains = nvlink_domains(build_graph(load_node("dgx-h100"), 4))
    reps = place(domains, tp=16, pp=1, dp=2)
    assert [r.stages[0] for r in reps] == [_gpus(0, 16), _gpus(16, 32)]
    with pytest.raises(simulator.ScenarioError, match="needs 2 whole NVLink domains"):
        place([list(_gpus(0, 8)), list(_gpus(8, 12)), list(_gpus(12, 16))], tp=16, pp=1, dp=1)
    paths, cal = _dgx(2)
    cross = allreduce(paths, _gpus(0, 16), cal, True, True)
    inside = allreduce(paths, _gpus(0, 8), cal, True, True)
    # No NVLS and no custom all-reduce across nodes; the algorithms of the flow schedules.
    assert {name for name, _, _ in cross.nccl} == {"ring", "tree", "hierarchical"}
    assert not cross.custom
    assert cross.time(64 * 8192 * 2) > 2 * inside.time(64 * 8192 * 2)


def test_tp16_across_two_nodes_is_slower_per_token_than_tp8_pp2_or_two_tp8_replicas():
    base = {"model": {"name": "llama-3.1-70b"}, "cluster": {"topology": "dgx-h100", "nodes": 2},
            "workload": {"rate_per_s": 2.0, "num_requests": 40,
                         "prompt_tokens": {"dist": "constant", "value": 128},
                         "output_tokens": {"dist": "constant", "value": 256}},
            "output": {"steps": False}}
    tpot = {}
    for tp, pp, dp in ((16, 1, 1), (8, 2, 1), (8, 1, 2)):
        res = simulator.run(dict(base, parallel={"tp": tp, "pp": pp, "dp": dp}))
        assert res.summary["requests_completed"] == 40
        tpot[(tp, pp, dp)] = res.summary["tpot_mean_s"]
    # Half the weights per GPU saves ~2.6 ms of HBM reads per step, but 160 all-reduces per
    # step over the NICs cost more (hierarchical, ~47 us each at 64 tokens vs ~15 us inside).
    assert tpot[(16, 1, 1)] > 1.1 * tpot[(8, 2, 1)]
    assert tpot[(16, 1, 1)] > 1.1 * tpot[(8, 1, 2)]


def test_l40s_pcie_preset_runs_tp_over_pcie_without_nvls_or_custom_all_reduce():
    node = load_node("l40s-pcie")
    assert node.gpu.peak("bf16") == pytest.approx(362.05e12)  # datasheet, dense
    g = build_graph(node, 1)
    assert [len(d) for d in nvlink_domains(g)] == [8]  # one PCIe scale-up domain
    paths, cal = Paths(g), node.gpu.calibration.collectives
    ar = allreduce(paths, _gpus(0, 8), cal, node.scale_up.in_switch_reduction, True)
    ring = dict((n, (a, b)) for n, a, b in ar.nccl)["ring"]
    assert "nvls" not in dict((n, a) for n, a, _ in ar.nccl)
    assert ring[1] == pytest.approx(2 * 7 / 8 / (32e9 * cal.ring_eff))
    sc = {"model": {"name": "llama-3.1-8b"}, "cluster": {"topology": "l40s-pcie"},
          "parallel": {"tp": 2, "dp": 4}, "output": {"steps": False},
          "workload": {"rate_per_s": 2.0, "num_requests": 20}}
    res = simulator.run(sc)
    assert res.summary["requests_completed"] == 20 and res.summary["gpus"] == 8
    stage = simulator.build_plan(simulator.load_scenario(sc)).replicas[0].stages[0]
    assert not stage.allreduce.custom  # vLLM's custom all-reduce needs NVLink


def test_link_utilization_from_token_counters_by_hand():
    sc = {"model": {"name": "llama-3.1-8b"}, "cluster": {"topology": "dgx-h100", "nodes": 2},
          "parallel": {"tp": 2, "pp": 2, "dp": 1}, "output": {"steps": False},
          "workload": {"rate_per_s": 1.0, "num_requests": 5}}
    plan = simulator.build_plan(simulator.load_scenario(sc))
    tokens, steps, span = 1000.0, 10, 2.0
    util = link_utilization(plan, [tokens], [steps], span)
    # Stage 0 on GPUs 0,1 (16 of 32 layers): a 2-rank ring moves S per direction per
    # all-reduce, 2 per layer; custom two-shot at 100 tokens moves a ring's bytes.
    h, layers = 4096, 16
    per_link = 2 * layers * tokens * h * 2
    send = tokens * h * 2  # the PP hand-off, GPU 0 -> NVSwitch -> GPU 2
    assert util["nvlink_util_max"] == pytest.approx((per_link + send) / (450e9 * span))
    # 16 GPUs x 2 directions of NVLink; both stages use 4 directed links each.
    assert util["nvlink_util_mean"] == pytest.approx((8 * per_link + 2 * send)
                                                     / (32 * 450e9 * span))
    assert util["fabric_util_max"] == 0.0  # both stages in node 0 (the replica fits there)
    assert set(KEYS) <= set(simulator.run(sc).summary)


def test_link_utilization_over_time_adds_up_to_the_run_figures():
    # TP8 x PP2 over two nodes: NVLink inside each stage, the hand-off over the fabric.
    sc = {"model": {"name": "llama-3.1-8b"}, "cluster": {"topology": "dgx-h100", "nodes": 2},
          "parallel": {"tp": 8, "pp": 2}, "output": {"window_s": 0.5},
          "workload": {"rate_per_s": 20.0, "num_requests": 120}}
    res = simulator.run(sc)
    ts, summary = res.timeseries, res.summary
    span = summary["simulated_time_s"]
    for kind in ("nvlink", "pcie", "fabric"):
        # Per-window bytes sum to the run's: sum(util_w * w) = util_run * span.
        assert (ts[f"{kind}_util_mean"] * 0.5).sum() == pytest.approx(
            summary[f"{kind}_util_mean"] * span, rel=1e-9, abs=1e-15)
        assert ts[f"{kind}_util_max"].max() >= summary[f"{kind}_util_max"] * (1 - 1e-9)
        assert (ts[f"{kind}_util_max"] >= ts[f"{kind}_util_mean"] - 1e-15).all()
    assert summary["fabric_util_max"] > 0 and (ts["fabric_util_max"] > 0).any()


def _racks(ratio: float, tp: int, pp: int, dp: int, nodes: int = 8) -> dict:
    """dgx-h100 nodes, one node per leaf (not rail-optimized), prefill-heavy load."""
    return {"model": {"name": "llama-3.1-70b"},
            "cluster": {"topology": "dgx-h100", "nodes": nodes, "fabric": "leaf_spine",
                        "oversubscription": ratio, "rail_optimized": False},
            "parallel": {"tp": tp, "pp": pp, "dp": dp},
            "workload": {"rate_per_s": 8.0, "num_requests": 40,
                         "prompt_tokens": {"dist": "constant", "value": 2048},
                         "output_tokens": {"dist": "constant", "value": 16}},
            "output": {"steps": False}}


def test_pp_hand_offs_sharing_a_spine_uplink_share_it_max_min_fairly():
    plan = simulator.build_plan(simulator.load_scenario(_racks(4.0, 4, 3, 2, nodes=3)))
    # Replica 0: stages 0-1 on node 0, stage 2 on node 1; replica 1: stages 0-1 on node 2,
    # stage 2 in node 1's other half. Both last hand-offs (GPUs 4 -> 8 and 20 -> 12) enter
    # node 1's leaf from the same spine (ECMP by sender's local index).
    assert [rp.placement.stages[2][0] for rp in plan.replicas] == ["gpu8", "gpu12"]
    env = simpy.Environment()
    sends = shared_sends(env, plan.graph, plan.replicas, plan.model, TICK)
    a, b = sends[0][1], sends[1][1]
    assert isinstance(a, SharedSend) and set(a.edges) & set(b.edges)
    assert not isinstance(sends[0][0], SharedSend)  # stage 0 -> 1 stays inside node 0
    tokens, done = 2048, {}
    for name, s in (("a", a), ("b", b)):
        s.network.transfer(s.edges, tokens * s.bytes_per_token, s[0]).callbacks.append(
            lambda _, n=name: done.__setitem__(n, env.now))
    env.run()
    lat, per_token = a
    # Alone: latency + tokens x s_per_token (the shared spine link at 4:1 is the
    # bottleneck); together: twice the transfer, to a tick.
    assert done["a"] == done["b"] == pytest.approx(lat + 2 * tokens * per_token, abs=4 * TICK)


def test_pp_stages_fill_a_domain_before_crossing_to_the_next():
    plan = simulator.build_plan(simulator.load_scenario(_racks(1.0, 4, 4, 1, nodes=2)))
    nodes = [plan.graph.nodes[st[0]]["node"] for st in plan.replicas[0].placement.stages]
    assert nodes == [0, 0, 1, 1]  # one crossing, not three


def test_spine_oversubscription_slows_cross_node_pp_replicas_not_single_node_ones():
    ttft = {}
    for ratio in (1.0, 4.0):
        for layout in ((8, 4, 2), (8, 1, 8)):
            ttft[ratio, layout] = simulator.run(_racks(ratio, *layout)).summary["ttft_mean_s"]
    assert ttft[4.0, (8, 4, 2)] > ttft[1.0, (8, 4, 2)] + 1e-3  # three hand-offs per prefill
    assert ttft[4.0, (8, 1, 8)] == ttft[1.0, (8, 1, 8)]


def test_nic_speed_and_switch_latency_are_scenario_keys():
    base = {"model": {"name": "llama-3.1-70b"},
            "cluster": {"topology": "dgx-h100", "nodes": 2},
            "parallel": {"tp": 8, "pp": 2},
            "workload": {"rate_per_s": 1.0, "num_requests": 1}}
    plan = simulator.build_plan(simulator.load_scenario(base))
    slow = simulator.build_plan(simulator.load_scenario(
        {**base, "cluster": {**base["cluster"], "nic_gbps": 200, "switch_latency_s": 5e-6}}))
    (lat, per_token), (slow_lat, slow_per_token) = plan.replicas[0].sends[0], \
        slow.replicas[0].sends[0]
    # 400 Gb/s NDR is the preset's 50 GB/s; 200 Gb/s halves it: twice the time per token.
    assert slow_per_token == pytest.approx(2 * per_token)
    # The path crosses one switch: 5 us instead of 0.6 us, half on each of its two links.
    assert slow_lat - lat == pytest.approx(5e-6 - 0.6e-6)
    with pytest.raises(simulator.ScenarioError, match="cluster.nic_gbps"):
        simulator.load_scenario({**base, "cluster": {**base["cluster"], "nic_gbps": 0}})
