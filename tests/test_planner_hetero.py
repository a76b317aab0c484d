"""Heterogeneous disaggregated pools in ``plan --disagg --nodes``: a prefill pool
on one node kind and a decode pool on another, estimated by hand, priced per kind, ranked
and simulated; plans without cross-kind pairs keep main's plan.csv."""

from __future__ import annotations

import copy
import dataclasses
import io
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
from test_planner_search import CONST

from simulator.cluster.pools import build_plan
from simulator.cluster.simulation import workload_requests
from simulator.errors import ScenarioError
from simulator.hardware.prices import gpu_hour_usd
from simulator.hardware.specs import load_node
from simulator.io.scenario import load_scenario
from simulator.model.spec import load_model
from simulator.parallel.collective import BANDWIDTH_EFFICIENCY
from simulator.planner import plan
from simulator.planner.estimate import StepModel, step_mix
from simulator.planner.hetero import CrossPairs, cross_pools, pool_nodes
from simulator.planner.kinds import budget, plan_kinds
from simulator.planner.nearmiss import est_slo, margins
from simulator.planner.objectives import est_power_w
from simulator.planner.plan import INTERVAL_COLUMNS
from simulator.planner.report import recommended_scenario
from simulator.planner.simulate import base_scenario
from simulator.planner.space import workload_stats
from simulator.sweep import resolve_point

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "data" / "plan_golden"

#: Llama-3.1-8B, constant lengths (the hand computation needs no means): the search
#: tests' scenario under its own name.
SC = {**CONST, "name": "golden"}
KINDS = ["dgx-h100", "dgx-a100"]

#: The plans whose plan.csv must not change (tests/data/plan_golden, written by main's
#: code before cross-kind pairs existed; `python tests/test_planner_hetero.py` rewrites
#: them).
UNCHANGED = {
    "one_kind": lambda: plan(SC, gpus=2, top=3, requests=40, jobs=1),
    "one_kind_disagg": lambda: plan(SC, gpus=2, top=3, requests=40, jobs=1, disagg=True),
    "two_kinds": lambda: plan_kinds(SC, KINDS, gpus=2, top=3, requests=40, jobs=1),
    "nodes_one_kind_disagg": lambda: plan_kinds(SC, ["dgx-a100"], gpus=2, top=3,
                                                requests=40, jobs=1, disagg=True),
}


def _csv(result) -> str:
    """plan.csv without the interval columns, which came later (the golden files predate
    them; the rest must not move)."""
    out = io.StringIO()
    result.table.drop(columns=INTERVAL_COLUMNS).to_csv(out, index=False)
    return out.getvalue()


@pytest.mark.parametrize("case", sorted(UNCHANGED))
def test_plans_without_cross_pairs_unchanged(case):
    """Without --disagg, without --nodes, or with one kind: main's plan.csv, byte for byte."""
    assert _csv(UNCHANGED[case]()) == (GOLDEN / f"{case}.csv").read_text()


def _setup():
    base = base_scenario(SC, None, 40)
    s = load_scenario(base)
    return base, s, workload_stats(s, workload_requests(s))


def _step_model(base: dict, s, kind: str) -> StepModel:
    cp = build_plan(load_scenario(resolve_point(
        base, {"cluster.topology": kind, "parallel.tp": 1, "parallel.dp": 1}, s.seed)))
    return StepModel(cp, 0.0 if cp.scenario.engine.cpu_overlap
                     else cp.scenario.engine.step_overhead_s, 1)


def test_cross_pair_estimate_by_hand():
    """Prefill TP1 x 1 on a DGX H100 + decode TP1 x 1 on a DGX A100, prompts of 1000
    tokens, replies of 101: the prefill from the H100's step costs, the decode from the
    A100's, the KV over GPU -> PCIe -> NIC -> switch -> NIC -> PCIe -> GPU."""
    base, s, st = _setup()
    rows = CrossPairs(KINDS).rows(base, s, load_model("llama-3.1-8b"), 2, st, 1000, 1.0,
                                  0.05)
    assert {r["decode_node"] for r in rows} == {"dgx-a100"}
    assert all(r["gpus"] <= 2 for r in rows)
    r = next(r for r in rows if r["max_num_seqs"] == 64
             and r["prefill_max_num_batched_tokens"] == 16384)
    assert (r["prefill_tp"], r["prefill_dp"], r["tp"], r["dp"], r["gpus"]) == (1, 1, 1, 1, 2)
    # KV of one token: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 131072 bytes; the
    # slowest link of the path is the A100's 200 Gb/s NIC (25 GB/s).
    h, a = load_node("dgx-h100"), load_node("dgx-a100")
    slowest = min(h.host.bandwidth_Bps, h.nic.bandwidth_Bps, a.nic.bandwidth_Bps,
                  a.host.bandwidth_Bps)
    assert slowest == 25e9
    latency = sum(n.host.latency_s / 2 + n.nic.latency_s + n.switch_latency_s / 2
                  for n in (h, a))
    alone = 1000 * 131072 / (slowest * BANDWIDTH_EFFICIENCY)
    rate = st.rate_per_s
    # Every transfer crosses the one pair of NICs: processor sharing, T / (1 - lambda T).
    t_kv = alone / (1 - rate * alone) + latency
    assert r["est_kv_transfer_s"] == pytest.approx(t_kv, rel=1e-9)
    # Prefill on the H100: full steps of 16384 tokens, the step a prompt joins at the load
    # (1000 tokens plus those that arrive during the step in flight), M/D/1 on its work.
    mp = _step_model(base, s, "dgx-h100")
    x_p = (16384 / 1000) / mp.cycle(*step_mix(0.0, 16384, 1000.0, 101.0))
    one = r["est_prefill_s"]
    arriving = rate * 1000 * one  # x = 1000 + (arriving / x) arriving
    joined = (1000 + math.sqrt(1000**2 + 4 * arriving**2)) / 2
    assert one == pytest.approx(mp.cycle(*step_mix(0.0, joined, 1000.0, 101.0)), rel=2e-3)
    rho = rate / x_p
    wait = rho / (2 * (1 - rho)) * one * 1000 / joined
    assert r["est_ttft_s"] == pytest.approx(one + wait, rel=1e-4)
    assert r["est_ttft_p99_s"] == pytest.approx(one + 4.6 * wait, rel=1e-4)
    # Decode on the A100: Little's law, TPOT = cycle + t_kv / (O - 1).
    md = _step_model(base, s, "dgx-a100")
    b = r["est_batch"]
    cyc = md.cycle(*step_mix(b, 0.0, 1000.0, 101.0))
    assert b == pytest.approx(rate * 101 * cyc, rel=2e-3)
    assert r["est_tpot_s"] == pytest.approx(cyc + t_kv / 100, rel=1e-9)
    x_d = 64 / (101 * md.cycle(*step_mix(64, 0.0, 1000.0, 101.0)))
    assert r["est_capacity_req_per_s"] == pytest.approx(min(x_p, x_d, 1 / alone), rel=1e-9)
    # The A100 decodes slower than an H100 would (memory bandwidth 2.0 vs 3.35 TB/s).
    assert cyc > mp.cycle(*step_mix(b, 0.0, 1000.0, 101.0))


@pytest.mark.parametrize("objective", ["goodput_per_usd", "tokens_per_joule"])
def test_cross_pair_priced_per_pool_kind(objective):
    """Goodput per dollar at 1 H100-hour + 1 A100-hour; tokens per joule over the powered
    H100 node and A100 node, each at the pair's utilization."""
    base, s, st = _setup()
    cross = CrossPairs(KINDS)
    df = pd.DataFrame(cross.rows(base, s, load_model("llama-3.1-8b"), 2, st, 1000, 1.0,
                                 0.05))
    df["est_slo"] = est_slo(df, s.slo, margins(None))
    df["est_objective"] = math.nan
    values = cross.values(df, objective, s, st)
    r = df.iloc[0]
    assert r["est_slo"] == "meets"
    good = r["est_goodput_req_per_s"]
    h, a = load_node("dgx-h100"), load_node("dgx-a100")
    if objective == "goodput_per_usd":
        want = good * 3600 / (gpu_hour_usd(h.gpu.name) + gpu_hour_usd(a.gpu.name))
    else:
        u = r["est_utilization"]
        want = good * 101 / (est_power_w(h, 1, u) + est_power_w(a, 1, u))
    assert values.iloc[0] == pytest.approx(want, rel=1e-12)


def test_pool_nodes():
    assert pool_nodes(8, 1, 3, 8) == 3
    assert pool_nodes(2, 3, 2, 8) == 2  # 6 TP2 groups, 4 per node
    assert pool_nodes(4, 1, 3, 8) == 2
    assert pool_nodes(16, 1, 1, 8) == 2


def test_leaf_spine_cross_pairs_priced_on_the_leaf_spine(tmp_path):
    """A cross-kind pair on a leaf-spine over both presets (simulator/topology/graph.py).
    Rail-optimized: prefill GPU 0 and decode GPU 8 share rail 0's leaf, the same links as
    through one switch, so the same KV price. One leaf per node at 8:1 with 4 spines: the
    A100 leaf's uplink, 8 x 25 GB/s / 8 / 4 = 6.25 GB/s, bounds the transfer (by hand)."""
    base, s, st = _setup()
    model = load_model("llama-3.1-8b")
    plain = CrossPairs(KINDS).rows(base, s, model, 2, st, 1000, 1.0, 0.05)
    ls_base = resolve_point(base, {"cluster.fabric": "leaf_spine"}, s.seed)
    ls = load_scenario(ls_base)
    rows = CrossPairs(KINDS).rows(ls_base, ls, model, 2, st, 1000, 1.0, 0.05)
    assert {r["status"] for r in rows} == {"feasible"}
    assert [r["est_kv_transfer_s"] for r in rows] == [r["est_kv_transfer_s"] for r in plain]
    point = {**copy.deepcopy(ls_base), "pools": cross_pools(pd.Series(rows[0]), ls)}
    assert point["cluster"]["fabric"] == "leaf_spine"
    pooled = build_plan(load_scenario(point))
    assert [p.node.name for p in pooled.pools] == KINDS
    assert pooled.graph.graph["name"] == "1 x dgx-h100 + 1 x dgx-a100"
    racks_base = resolve_point(base, {"cluster.fabric": "leaf_spine",
                                      "cluster.rail_optimized": False,
                                      "cluster.oversubscription": 8.0}, s.seed)
    racks = CrossPairs(KINDS).rows(racks_base, load_scenario(racks_base), model, 2, st,
                                   1000, 1.0, 0.05)
    r = racks[0]
    h, a = load_node("dgx-h100"), load_node("dgx-a100")
    latency = (h.host.latency_s / 2 + h.nic.latency_s + h.switch_latency_s / 2
               + 2 * h.switch_latency_s  # leaf0 - spine - leaf1
               + a.nic.latency_s + a.switch_latency_s / 2 + a.host.latency_s / 2)
    alone = 1000 * 131072 / (6.25e9 * BANDWIDTH_EFFICIENCY)
    t_kv = alone / (1 - st.rate_per_s * alone) + latency
    assert r["est_kv_transfer_s"] == pytest.approx(t_kv, rel=1e-9)
    p = plan_kinds({**SC, "cluster": {**SC["cluster"], "fabric": "leaf_spine"}}, KINDS,
                   gpus=2, top=2, requests=40, jobs=1, disagg=True)
    assert "one switch" not in p.comparison
    cross = p.table[p.table["decode_node"].notna()
                    & (p.table["decode_node"] != p.table["node"])]
    assert len(cross) and (cross["status"] == "ok").all()


@pytest.fixture(scope="module")
def cross_plan():
    return plan_kinds(SC, KINDS, gpus=2, top=3, requests=40, jobs=1, disagg=True)


def test_cross_pairs_ranked_and_simulated(cross_plan):
    t = cross_plan.table
    assert "decode_node" in t
    cross = t[t["decode_node"].notna() & (t["decode_node"] != t["node"])]
    # Both directions simulated, in a group of their own.
    assert set(zip(cross["node"], cross["decode_node"], strict=True)) == {
        ("dgx-h100", "dgx-a100"), ("dgx-a100", "dgx-h100")}
    assert (cross["status"] == "ok").all()
    assert "disaggregated+cross" in cross_plan.rank_correlations
    for _, r in cross.iterrows():
        assert r["pools"] == (f"prefill {r['node']} TP1 PP1 DP1 + decode "
                              f"{r['decode_node']} TP1 PP1 DP1 (prefill budget "
                              f"{int(r['prefill_max_num_batched_tokens'])})")
    # Every same-kind disaggregated row names its (one) kind in both columns.
    same = t[(t["kind"] == "disaggregated") & (t["decode_node"] == t["node"])]
    assert len(same) and not same["pools"].str.contains("dgx").any()
    assert t[t["kind"] == "colocated"]["decode_node"].isna().all()
    # The simulation measures the slower A100 decode: TPOT p99 above the H100 decode's.
    h_dec = cross[cross["decode_node"] == "dgx-h100"]["tpot_slo_q_s"].min()
    a_dec = cross[cross["decode_node"] == "dgx-a100"]["tpot_slo_q_s"].min()
    assert a_dec > h_dec
    # Each simulated run priced both pools' GPUs at their own prices.
    h, a = (gpu_hour_usd(load_node(k).gpu.name) for k in KINDS)
    assert cross["gpu_hour_usd"].to_numpy() == pytest.approx((h + a) / 2)
    assert "dgx-h100 -> dgx-a100" in cross_plan.comparison


def test_cross_kind_recommended_toml_runs(cross_plan, tmp_path):
    """The recommended.toml of a cross-kind pick: one pool per kind, runnable by `run`."""
    t = cross_plan.table
    row = t[(t["decode_node"] == "dgx-a100") & (t["node"] == "dgx-h100")].iloc[0]
    pick = recommended_scenario(dataclasses.replace(cross_plan, best=row))
    pools = pick["pools"]
    assert [(p["role"], p["topology"], p["nodes"]) for p in pools] == [
        ("prefill", "dgx-h100", 1), ("decode", "dgx-a100", 1)]
    assert "same_nodes_as" not in pools[1]
    built = build_plan(load_scenario(copy.deepcopy(pick)))
    assert [p.node.name for p in built.pools] == ["dgx-h100", "dgx-a100"]
    path = tmp_path / "recommended.toml"
    path.write_text(tomli_w.dumps(pick))
    out = subprocess.run([sys.executable, "-m", "simulator", "run", str(path), "--out",
                          str(tmp_path / "run"), "--quiet", "--no-trace"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    summary = pd.read_json(tmp_path / "run" / "summary.json", typ="series")
    assert summary["requests_completed"] == SC["workload"]["num_requests"]


def test_cross_pools_price_override():
    """A [cluster] gpu_hour_usd prices both pools (pools price their own GPUs)."""
    s = load_scenario({**SC, "cluster": {**SC["cluster"], "gpu_hour_usd": 3.0}})
    row = {"prefill_tp": 2, "prefill_pp": 1, "prefill_dp": 4, "tp": 4, "pp": 1, "dp": 3,
           "max_num_seqs": 64, "max_num_batched_tokens": 2048, "decode_node": "dgx-a100"}
    pre, dec = cross_pools(pd.Series(row), s)
    assert (pre["nodes"], dec["nodes"]) == (1, 2)
    assert pre["gpu_hour_usd"] == dec["gpu_hour_usd"] == 3.0


def test_pooled_scenario_with_nodes():
    """A scenario with pools on two presets (Splitwise-like) plans with --nodes: its pools
    size the default budget (one H100 + one A100 node: 16 GPUs), the search lays out its
    own. Without --nodes the one-preset search refuses it, naming the presets."""
    pooled = {**SC, "pools": [
        {"name": "prefill", "role": "prefill", "nodes": 1, "tp": 1},
        {"name": "decode", "role": "decode", "topology": "dgx-a100", "nodes": 1, "tp": 1}]}
    assert budget(load_scenario(pooled)) == 16
    assert budget(load_scenario(SC)) == 8
    r = plan_kinds(pooled, KINDS, gpus=2, top=2, requests=40, jobs=1, disagg=True)
    assert (r.table["decode_node"].notna() & (r.table["decode_node"] != r.table["node"])).any()
    with pytest.raises(ScenarioError, match="dgx-a100, dgx-h100"):
        plan(pooled, gpus=2, top=2, requests=40, jobs=1, disagg=True)


if __name__ == "__main__":  # rewrite the golden files (only from main's code)
    for name, make in UNCHANGED.items():
        (GOLDEN / f"{name}.csv").write_text(_csv(make()))
