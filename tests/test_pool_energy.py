"""Runs with pools: energy per request and per output token, power per pool,
node overhead counted once per node, cost with per-pool prices, MoE metrics."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simulator import run
from simulator.cluster.outcome import pool_hardware, stage_hardware
from simulator.hardware.prices import GPU_HOUR_USD
from simulator.metrics.power import NODE_OVERHEAD_W, StepFold, gpu_power_w, pool_power
from simulator.metrics.records import STEP_COLUMNS
from simulator.metrics.timeseries import window_edges
from simulator.metrics.utilization import gpu_windows, stage_work

H100_IDLE, H100_TDP, A100_IDLE = 80.0, 700.0, 50.0


def scenario(pools: list[dict] | None = None, **sections) -> dict:
    """Llama-3.1-8B on DGX H100 nodes, engine profile pinned, constant arrivals."""
    s = {"name": "pe", "seed": 5, "model": {"name": "llama-3.1-8b"},
         "cluster": {"topology": "dgx-h100"},
         "engine": {"profile": "vllm-v0.6"},
         "workload": {"arrival": "constant", "rate_per_s": 4.0, "num_requests": 12,
                      "prompt_tokens": 600, "output_tokens": 20}}
    if pools is not None:
        s["pools"] = pools
    for k, v in sections.items():
        s[k] = {**s.get(k, {}), **v}
    return s


DISAGG = [{"name": "p", "role": "prefill", "nodes": 1, "tp": 1},
          {"name": "d", "role": "decode", "nodes": 1, "tp": 2}]


def test_tiny_disaggregated_energy_by_hand():
    """One window longer than the run: each used GPU draws idle + (tdp - idle) x activity
    from its steps' FLOPs and bytes over that window; each pool's node adds its 7 (6) idle
    GPUs and its overhead once."""
    w = 100.0
    r = run(scenario(DISAGG, output={"window_s": w}))
    s, steps = r.summary, r.steps
    assert s["requests_completed"] == 12 and r.timeseries.shape[0] == 1
    expected = {}
    for pool in r.plan.pools:
        gpu_j = 0.0
        for st in pool_hardware(r.plan.graph, pool):
            g = steps[(steps["replica"] == st.replica) & (steps["stage"] == st.stage)]
            flops, hbm, _, _ = stage_work(st, g)
            act = gpu_power_w(flops.sum() / (st.peak_flops * w), hbm.sum() / (st.hbm_Bps * w),
                              H100_IDLE, H100_TDP)
            gpu_j += len(st.gpus) * float(act) * w
        used = pool.gpus
        expected[pool.spec.name] = gpu_j + ((8 - used) * H100_IDLE + NODE_OVERHEAD_W) * w
    assert s["pool_energy_j"] == pytest.approx(expected, rel=1e-9)
    assert s["pool_power_mean_w"] == pytest.approx({k: v / w for k, v in expected.items()})
    total = sum(expected.values())
    assert s["energy_j"] == pytest.approx(total, rel=1e-9)
    done = r.requests[r.requests["status"] == "completed"]
    assert s["energy_per_request_j"] == pytest.approx(total / 12, rel=1e-9)
    assert s["energy_per_output_token_j"] == pytest.approx(
        total / done["output_tokens"].sum(), rel=1e-9)
    # Both pools did work: more than idle; never more than every GPU at its TDP.
    for k, used in (("p", 1), ("d", 2)):
        idle_j = (8 * H100_IDLE + NODE_OVERHEAD_W) * w
        assert idle_j < expected[k] < idle_j + used * (H100_TDP - H100_IDLE) * w


def test_pool_energies_add_up_to_the_total_in_every_window():
    r = run(scenario(DISAGG, output={"window_s": 0.5}))
    ts, s = r.timeseries, r.summary
    w = 0.5
    per_pool = ts["power_w_p"] + ts["power_w_d"]
    assert np.allclose(per_pool, ts["power_w"], rtol=1e-12)
    assert sum(s["pool_energy_j"].values()) == pytest.approx(s["energy_j"], rel=1e-12)
    assert float(ts["power_w"].sum()) * w == pytest.approx(s["energy_j"], rel=1e-12)
    assert s["power_mean_w"] == pytest.approx(float(ts["power_w"].mean()))
    g = r.gpu_timeseries
    assert set(g["pool"]) == {"p", "d"} and set(g.loc[g["pool"] == "d", "gpu"]) == {8, 9}
    # The GPU part of each pool's energy is its GPUs' power_w; the rest its node's static draw.
    for name, used in (("p", 1), ("d", 2)):
        gpu_j = float(g.loc[g["pool"] == name, "power_w"].sum()) * w
        static_j = ((8 - used) * H100_IDLE + NODE_OVERHEAD_W) * w * len(ts)
        assert s["pool_energy_j"][name] == pytest.approx(gpu_j + static_j, rel=1e-12)


def test_one_mixed_pool_equals_the_colocated_run():
    colo = run(scenario(parallel={"tp": 2, "dp": 2}))
    pooled = run(scenario([{"name": "m", "role": "mixed", "nodes": 1, "tp": 2, "dp": 2}]))
    pd.testing.assert_frame_equal(colo.steps, pooled.steps)
    for k in ("energy_j", "energy_per_request_j", "energy_per_output_token_j",
              "power_mean_w"):
        assert pooled.summary[k] == pytest.approx(colo.summary[k], rel=1e-12), k
    assert pooled.summary["pool_energy_j"]["m"] == pytest.approx(colo.summary["energy_j"],
                                                                 rel=1e-12)
    assert np.allclose(pooled.timeseries["power_w"], colo.timeseries["power_w"], rtol=1e-12)
    assert np.allclose(pooled.timeseries["power_w_m"], colo.timeseries["power_w"], rtol=1e-12)


def test_heterogeneous_pools_own_idle_power_and_prices():
    pools = [{"name": "h100", "role": "mixed", "nodes": 1, "tp": 1, "gpu_hour_usd": 2.5},
             {"name": "a100", "role": "mixed", "nodes": 1, "tp": 1, "topology": "dgx-a100",
              "gpu_hour_usd": 1.3}]
    w = 100.0
    r = run(scenario(pools, output={"window_s": w}))
    s, req = r.summary, r.requests
    done = req[req["status"] == "completed"]
    span = float(done["finish_s"].max() - req["arrival_s"].min())
    mtok = done["output_tokens"].sum() / 1e6
    assert s["cost_per_million_tokens_usd"] == pytest.approx(
        (2.5 + 1.3) * span / 3600 / mtok, rel=1e-12)
    assert s["cost_per_million_output_tokens_usd"] == pytest.approx(
        s["cost_per_million_tokens_usd"], rel=1e-12)
    # The A100 node idles at 50 W per GPU; each pool's static draw is its own node's.
    g = r.gpu_timeseries
    for name, idle in (("h100", H100_IDLE), ("a100", A100_IDLE)):
        gpu_j = float(g.loc[g["pool"] == name, "power_w"].sum()) * w
        assert s["pool_energy_j"][name] == pytest.approx(
            gpu_j + (7 * idle + NODE_OVERHEAD_W) * w, rel=1e-12)
    assert set(g.loc[g["pool"] == "a100", "gpu"]) == {8}
    a100 = g.loc[g["pool"] == "a100", "power_w"]
    assert (a100 > A100_IDLE).all() and (a100 < 400.0).all()
    # Without prices: the default list prices of each pool's GPU.
    plain = [{k: v for k, v in p.items() if k != "gpu_hour_usd"} for p in pools]
    d = run(scenario(plain)).summary
    assert np.isnan(d["cost_per_million_tokens_usd"])
    assert d["gpu_hour_usd"] == pytest.approx((GPU_HOUR_USD["h100_sxm"]
                                               + GPU_HOUR_USD["a100_sxm"]) / 2)


def test_shared_node_overhead_counts_once():
    """Two pools on one 8-GPU node (3 and 1 GPUs used): the node's 4 idle GPUs and its
    overhead split 3:1, summing to one node's static draw."""
    edges = np.array([0.0, 1.0, 2.0])
    gpu_ts = pd.DataFrame({"window_start_s": [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0],
                           "gpu": [0, 1, 2, 5] * 2, "pool": ["a", "a", "a", "b"] * 2,
                           "power_w": [100.0, 100.0, 100.0, 300.0, 200.0, 200.0, 200.0, 80.0]})
    node_of = dict.fromkeys(range(8), 0)
    p = pool_power(gpu_ts, edges, ["a", "b"], node_of, {0: 8}, {0: 80.0}, overhead_w=2300.0)
    static = 4 * 80.0 + 2300.0
    assert p["a"] == pytest.approx([300.0 + 0.75 * static, 600.0 + 0.75 * static])
    assert p["b"] == pytest.approx([300.0 + 0.25 * static, 80.0 + 0.25 * static])
    assert p["a"] + p["b"] == pytest.approx([600.0 + static, 680.0 + static])


ENERGY_KEYS = ("energy_j", "energy_per_request_j", "energy_per_output_token_j", "power_mean_w")


def _same_energy(kept, folded, keys=ENERGY_KEYS):
    for k in keys:
        assert np.isfinite(folded.summary[k]), k
        assert folded.summary[k] == pytest.approx(kept.summary[k], rel=1e-12), k
    pd.testing.assert_frame_equal(kept.requests, folded.requests)
    assert folded.steps.empty
    a, b = kept.gpu_timeseries, folded.gpu_timeseries
    assert a.shape == b.shape and (a["gpu"].to_numpy() == b["gpu"].to_numpy()).all()
    assert np.allclose(a["power_w"], b["power_w"], rtol=1e-12, atol=0)


def test_energy_without_step_records_equals_the_step_record_path():
    """Steps not kept: their work is folded per window as the run goes, giving the energy
    the kept records give (and the requests the engine gives with records)."""
    s = scenario(parallel={"tp": 2, "dp": 2}, output={"window_s": 0.25})
    kept = run(s)
    assert len(kept.steps) > 200
    _same_energy(kept, run(s, keep_steps=False, energy=True))
    off = run({**s, "output": {"window_s": 0.25, "steps": False, "energy": True}})
    _same_energy(kept, off)
    assert np.allclose(off.timeseries["power_w"], kept.timeseries["power_w"], rtol=1e-12)
    skipped = run(s, keep_steps=False, energy=False)  # the fold's cost declined
    assert np.isnan(skipped.summary["energy_j"]) and skipped.gpu_timeseries.empty
    pd.testing.assert_frame_equal(kept.requests, skipped.requests)
    # Without step records the fold is the scenario's choice (output.energy, default off).
    default = run({**s, "output": {"window_s": 0.25, "steps": False}})
    assert np.isnan(default.summary["energy_j"])
    pd.testing.assert_frame_equal(kept.requests, default.requests)


def test_step_fold_in_small_chunks_equals_gpu_windows():
    """Records fed one by one and as decode-run columns, folded every 64 steps."""
    r = run(scenario(parallel={"tp": 2, "dp": 2}, output={"window_s": 0.25}))
    stages = stage_hardware(r.plan)
    fold = StepFold(stages, 0.25, chunk=64)
    rows = list(r.steps[STEP_COLUMNS].itertuples(index=False, name=None))
    half = len(rows) // 2
    for row in rows[:half]:
        fold.append(row)
    for k in range(half, len(rows), 50):
        fold.bulk({c: r.steps[c].to_numpy()[k:k + 50] for c in STEP_COLUMNS})
    edges = window_edges(float(r.timeseries["window_end_s"].iloc[-1]), 0.25)
    pd.testing.assert_frame_equal(fold.gpu_windows(stages, edges),
                                  gpu_windows(r.steps, stages, edges), rtol=1e-12)
    # Windows widened at the end (a long run's MAX_WINDOWS): each folded window counts in
    # the wide one holding its start, so the total work is kept.
    wide = window_edges(float(edges[-1]), 1.0)
    a, b = fold.gpu_windows(stages, wide), gpu_windows(r.steps, stages, wide)
    assert a["compute_util"].sum() == pytest.approx(b["compute_util"].sum(), rel=1e-12)
    assert a["hbm_util"].sum() == pytest.approx(b["hbm_util"].sum(), rel=1e-12)


def test_pooled_energy_and_moe_without_step_records():
    kept = run(scenario(DISAGG, output={"window_s": 0.5}))
    folded = run(scenario(DISAGG, output={"window_s": 0.5}), keep_steps=False, energy=True)
    _same_energy(kept, folded)
    for k in ("pool_energy_j", "pool_power_mean_w"):
        assert folded.summary[k] == pytest.approx(kept.summary[k], rel=1e-12)
    assert np.allclose(folded.timeseries["power_w_d"], kept.timeseries["power_w_d"],
                       rtol=1e-12)
    pools = [{"name": "p", "role": "prefill", "nodes": 1, "tp": 8, "ep": 8},
             {"name": "d", "role": "decode", "nodes": 1, "tp": 8, "ep": 8,
              "attention_dp": True}]
    kept, folded = run(deepseek(pools)), run(deepseek(pools), keep_steps=False, energy=True)
    _same_energy(kept, folded, ENERGY_KEYS + ("moe_imbalance_mean", "moe_a2a_share"))


def deepseek(pools: list[dict] | None = None, **parallel) -> dict:
    s = {"name": "ds", "seed": 2, "model": {"name": "deepseek-v3", "weight_dtype": "fp8",
                                             "kv_dtype": "fp8"},
         "cluster": {"topology": "hgx-h200"}, "engine": {"profile": "vllm-v0.6"},
         "workload": {"arrival": "constant", "rate_per_s": 2.0, "num_requests": 6,
                      "prompt_tokens": 1500, "output_tokens": 12}}
    if pools:
        s["pools"] = pools
    if parallel:
        s["parallel"] = parallel
    return s


def test_moe_metrics_of_disaggregated_deepseek():
    """TP attention on the prefill side combines experts by all-reduce (no all-to-all);
    DP attention on the decode side dispatches and combines by all-to-all."""
    pools = [{"name": "p", "role": "prefill", "nodes": 1, "tp": 8, "ep": 8},
             {"name": "d", "role": "decode", "nodes": 1, "tp": 8, "ep": 8,
              "attention_dp": True}]
    r = run(deepseek(pools))
    s, steps = r.summary, r.steps
    assert s["requests_completed"] == 6
    prefill, decode = steps[steps["replica"] == 0], steps[steps["replica"] == 1]
    assert (prefill["a2a_s"] == 0).all() and (decode["a2a_s"] > 0).all()
    assert (steps["imbalance"] >= 1.0).all()
    assert s["moe_imbalance_mean"] == pytest.approx(steps["imbalance"].mean())
    assert s["moe_a2a_share"] == pytest.approx(
        decode["a2a_s"].sum() / (steps["compute_s"] + steps["comm_s"]).sum())
    assert 0 < s["moe_a2a_share"] < 1


def test_moe_metrics_of_one_mixed_pool_equal_the_colocated_run():
    colo = run(deepseek(tp=8, ep=8, attention_dp=True)).summary
    pooled = run(deepseek([{"name": "m", "role": "mixed", "nodes": 1, "tp": 8, "ep": 8,
                            "attention_dp": True}])).summary
    for k in ("moe_imbalance_mean", "moe_a2a_share", "energy_j"):
        assert pooled[k] == pytest.approx(colo[k], rel=1e-12), k


# -- leaf-spine fabrics with pools ----------------------------------------------------------
TP8 = [{"name": "p", "role": "prefill", "nodes": 1, "tp": 8},
       {"name": "d", "role": "decode", "nodes": 1, "tp": 8}]


def test_pools_on_a_leaf_spine_fabric():
    """Rail-optimized: prefill rank r and decode rank r share rail r's leaf, so the KV
    moves over the same two NIC links as through one switch. One leaf per node (not
    rail-optimized) with 8:1 uplinks: every flow crosses a spine and the move is slower."""
    flat = run(scenario(TP8)).requests
    rail = run(scenario(TP8, cluster={"fabric": "leaf_spine"}))
    assert rail.plan.graph.graph["fabric"] == "leaf_spine"
    assert {"leaf0", "spine0"} <= set(rail.plan.graph.nodes)
    pd.testing.assert_series_equal(rail.requests["kv_transfer_s"], flat["kv_transfer_s"])
    racks = run(scenario(TP8, cluster={"fabric": "leaf_spine", "rail_optimized": False,
                                       "nodes_per_leaf": 1, "oversubscription": 8.0}))
    moved = racks.requests["kv_transfer_s"].notna()
    assert moved.all() and (racks.requests["kv_transfer_s"] > flat["kv_transfer_s"]).all()
    assert np.isfinite(racks.summary["energy_j"])
