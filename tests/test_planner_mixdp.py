"""Colocated DP over two node kinds in ``plan --nodes A,B``
(simulator/planner/mixdp.py): the mixes searched, one mixed candidate's estimate by hand
(load split by capacity, each kind at its share), its price and power per kind, and the
plan simulating mixes behind one least_outstanding router."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
from test_planner_search import CONST

from simulator import run
from simulator.cluster.pools import build_plan
from simulator.cluster.simulation import workload_requests
from simulator.hardware.prices import gpu_hour_usd
from simulator.hardware.specs import load_node
from simulator.io.scenario import load_scenario
from simulator.model.spec import load_model
from simulator.planner.candidates import memory_plan, point_overrides
from simulator.planner.estimate import estimate
from simulator.planner.kinds import plan_kinds
from simulator.planner.mixdp import ROUTER, MixedDP, mix_pools, mixes
from simulator.planner.nearmiss import group_of, margins
from simulator.planner.objectives import est_power_w
from simulator.planner.report import recommended_scenario
from simulator.planner.search import Mixed, candidate, candidates_of
from simulator.planner.simulate import base_scenario
from simulator.planner.space import Layout, Limits, engine_limits, workload_stats
from simulator.sweep import resolve_point

KINDS = ["dgx-h100", "dgx-a100"]
H100, A100 = load_node("dgx-h100"), load_node("dgx-a100")
MODEL = load_model("llama-3.1-8b")
LIM = Limits(64, 2048)


def test_mixes_use_whole_nodes_within_the_budget():
    """Llama-3.1-8B: ten replica shapes fill an 8-GPU node (tp x pp in 1, 2, 4, 8); 16
    GPUs hold one node of each kind, 32 GPUs the six (n_a, n_b) with n_a + n_b <= 4;
    three kinds give three pairs; under 16 GPUs no mix."""
    two = {k: load_node(k) for k in KINDS}
    assert mixes(two, MODEL, 15) == []
    sixteen = mixes(two, MODEL, 16)
    assert len(sixteen) == 10
    assert {(m.a, m.n_a, m.b, m.n_b) for m in sixteen} == {("dgx-h100", 1, "dgx-a100", 1)}
    assert {(m.shape.tp, m.shape.pp) for m in sixteen} == {
        (1, 1), (1, 2), (1, 4), (1, 8), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (8, 1)}
    big = mixes(two, MODEL, 32)
    assert {(m.n_a, m.n_b) for m in big} == {(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (3, 1)}
    assert len(big) == 60
    three = {k: load_node(k) for k in [*KINDS, "hgx-h200"]}
    assert {(m.a, m.b) for m in mixes(three, MODEL, 16)} == {
        ("dgx-h100", "dgx-a100"), ("dgx-h100", "hgx-h200"), ("dgx-a100", "hgx-h200")}
    m = sixteen[0]
    assert m.dp(8, 1) == 8 // (m.shape.tp * m.shape.pp)


def _setup(rate: float = 10.0):
    sc = {**CONST, "name": "mix", "workload": {**CONST["workload"], "rate_per_s": rate}}
    base = base_scenario(sc, None, 40)
    s = load_scenario(base)
    return base, s, workload_stats(s, workload_requests(s))


def _rows(base, s, stats) -> pd.DataFrame:
    limits = engine_limits(s)
    probe = min(limits, key=lambda lim: (lim.budget, lim.max_num_seqs))
    return pd.DataFrame(MixedDP(base, KINDS).rows(MODEL, 16, stats, limits, probe, 2000))


def _kind(base, s, kind: str, lay: Layout):
    data = resolve_point(base, {"cluster.topology": kind, "cluster.nodes": 1}, s.seed)
    return build_plan(load_scenario(resolve_point(data, point_overrides(lay, LIM), s.seed)))


def test_mixed_estimate_by_hand():
    """One DGX H100 TP8 replica + one DGX A100 TP8 replica behind one router at 10 req/s:
    each kind's capacity C_k from its own step costs, the load split lambda_k = lambda C_k /
    (C_h + C_a), each kind estimated at its share (both at one utilization), the mix's
    capacity the sum, TTFT p99 and TPOT the slower kind's, TTFT mean weighted."""
    base, s, st = _setup()
    df = _rows(base, s, st)
    r = df[(df["tp"] == 8) & (df["max_num_seqs"] == 64)
           & (df["max_num_batched_tokens"] == 2048)].iloc[0]
    assert (r["node"], r["mix_node"], r["dp"], r["mix_dp"], r["gpus"]) == (
        "dgx-h100", "dgx-a100", 2, 1, 16)
    lay = Layout(8, 1, 1)
    cp_h, cp_a = _kind(base, s, "dgx-h100", lay), _kind(base, s, "dgx-a100", lay)
    kv_h, kv_a = memory_plan(cp_h, LIM).kv_tokens, memory_plan(cp_a, LIM).kv_tokens
    assert r["kv_tokens_per_replica"] == min(kv_h, kv_a)
    full = [estimate(cp, LIM, kv, st, 1.0, 0.05) for cp, kv in ((cp_h, kv_h), (cp_a, kv_a))]
    cap = full[0].capacity_req_per_s + full[1].capacity_req_per_s
    assert full[0].capacity_req_per_s > full[1].capacity_req_per_s  # 3.35 vs 2.0 TB/s HBM
    w = [e.capacity_req_per_s / cap for e in full]
    at = [estimate(cp, LIM, kv, dataclasses.replace(st, rate_per_s=st.rate_per_s * share),
                   1.0, 0.05)
          for (cp, kv), share in zip(((cp_h, kv_h), (cp_a, kv_a)), w, strict=True)]
    rho = st.rate_per_s / cap
    for e, share in zip(at, w, strict=True):  # split by capacity: one utilization
        assert e.utilization == pytest.approx(rho, rel=1e-12)
        assert e.capacity_req_per_s == pytest.approx(cap * share, rel=1e-12)
    assert r["est_capacity_req_per_s"] == pytest.approx(cap, rel=1e-12)
    assert r["est_utilization"] == pytest.approx(rho, rel=1e-12)
    assert r["est_tpot_s"] == max(e.tpot_s for e in at) == at[1].tpot_s  # the A100's
    assert r["est_ttft_p99_s"] == max(e.ttft_p99_s for e in at)
    assert r["est_ttft_s"] == pytest.approx(w[0] * at[0].ttft_s + w[1] * at[1].ttft_s,
                                            rel=1e-12)
    # Little's law on the A100 at its share: B = lambda_a / R x O x cycle(B).
    assert at[1].batch == pytest.approx(st.rate_per_s * w[1] * st.output_mean
                                        * at[1].cycle_s, rel=5e-3)
    assert r["est_goodput_req_per_s"] == st.rate_per_s  # both kinds meet the SLOs


@pytest.mark.parametrize("objective", ["goodput_per_gpu", "goodput_per_usd",
                                       "tokens_per_joule"])
def test_mixed_priced_per_kind(objective):
    """8 H100 GPUs + 8 A100 GPUs: per GPU over 16; per dollar at 8 x $6.16 + 8 x $2.70 an
    hour; per joule over an H100 node and an A100 node at the mix's utilization."""
    base, s, st = _setup()
    mx = MixedDP(base, KINDS)
    df = _rows(base, s, st)
    r = df[(df["tp"] == 8) & (df["max_num_seqs"] == 64)].iloc[[0]]
    value = mx.rank(r, objective, st, margins(None))["est_objective"].iloc[0]
    good, u = r["est_goodput_req_per_s"].iloc[0], r["est_utilization"].iloc[0]
    want = {"goodput_per_gpu": good / 16,
            "goodput_per_usd": good * 3600 / (8 * gpu_hour_usd(H100.gpu.name)
                                               + 8 * gpu_hour_usd(A100.gpu.name)),
            "tokens_per_joule": good * st.output_mean / (est_power_w(H100, 8, u)
                                                         + est_power_w(A100, 8, u))}
    assert value == pytest.approx(want[objective], rel=1e-12)


def test_least_outstanding_sends_more_to_the_faster_kind():
    """The mix's scenario (two mixed pools, one least_outstanding router) runs; the H100
    replicas (faster decode) take more of the requests than the A100 ones, as the
    estimate's split by capacity assumes (round robin would split them evenly)."""
    base, s, st = _setup(rate=30.0)
    df = _rows(base, s, st)
    r = df[(df["tp"] == 1) & (df["pp"] == 1) & (df["max_num_seqs"] == 64)
           & (df["max_num_batched_tokens"] == 2048)].iloc[0]
    point = MixedDP(base, KINDS).point(candidate(r))
    assert point["pools"] == mix_pools(r, s)  # the typed candidate's pools are the row's
    assert [(p["topology"], p["nodes"], p["dp"], p["router"]) for p in point["pools"]] == [
        ("dgx-h100", 1, 8, ROUTER), ("dgx-a100", 1, 8, ROUTER)]
    res = run(load_scenario(point))
    assert [p.node.name for p in res.plan.pools] == KINDS
    req = res.requests
    on_h100 = (req["replica"] < 8).mean()
    assert on_h100 > 0.55
    h, a = req[req["replica"] < 8], req[req["replica"] >= 8]
    assert h["tpot_s"].mean() < a["tpot_s"].mean()


@pytest.fixture(scope="module")
def mixed_plan():
    sc = {**CONST, "name": "mix", "workload": {**CONST["workload"], "rate_per_s": 30.0}}
    return plan_kinds(sc, KINDS, gpus=16, top=2, requests=40, jobs=1)


def test_plan_simulates_mixes(mixed_plan):
    """Mixed rows in plan.csv: simulated, labelled with both kinds, ranked with the rest,
    in a group of their own; their candidates in candidates.csv."""
    t = mixed_plan.table
    mix = t[t["mix_node"].notna()]
    assert 1 <= len(mix) <= 2 and (mix["status"] == "ok").all()
    assert (mix["node"] == "dgx-h100").all() and (mix["mix_node"] == "dgx-a100").all()
    assert (mix["gpus"] == 16).all()
    for _, r in mix.iterrows():
        dp_b = int(r["mix_dp"])
        assert r["pools"] == (f"dgx-h100 TP{r['tp']} PP{r['pp']} DP{int(r['dp']) - dp_b} + "
                              f"dgx-a100 TP{r['tp']} PP{r['pp']} DP{dp_b}")
        assert math.isfinite(r["est_tpot_s"]) and math.isfinite(r["tpot_slo_q_s"])
    assert "colocated+mix" in mixed_plan.rank_correlations
    assert list(t["rank"]) == list(range(1, len(t) + 1))
    c = mixed_plan.candidates
    assert (c["mix_node"].notna() & c["simulated"]).sum() == len(mix)
    assert "dgx-h100 + dgx-a100" in mixed_plan.comparison


def test_mixed_recommended_scenario_runs(mixed_plan):
    t = mixed_plan.table
    row = t[t["mix_node"].notna()].iloc[0]
    data = recommended_scenario(dataclasses.replace(mixed_plan, best=row))
    assert data["pools"] == mix_pools(row, mixed_plan.scenario)
    assert "speculative" not in data
    res = run(load_scenario(data))
    assert res.summary["requests_completed"] == res.summary["requests_total"]


def test_every_candidate_reads_as_its_kind(mixed_plan):
    """The typed candidate of every row of a multi-kind plan's candidates table (colocated,
    speculative, mixed; simulator.planner.search.candidate) is in the row's simulation
    group, and a mixed one keeps its kinds and replicas."""
    c = mixed_plan.candidates
    typed = candidates_of(c)
    assert [t.group for t in typed.values()] == [group_of(r) for _, r in c.iterrows()]
    mixed = {i: t for i, t in typed.items() if isinstance(t, Mixed)}
    assert len(mixed) == c["mix_node"].notna().sum() > 0
    for i, t in mixed.items():
        assert (t.node, t.mix_node, t.mix_dp, t.layout.dp) == (
            c.loc[i, "node"], c.loc[i, "mix_node"], c.loc[i, "mix_dp"], c.loc[i, "dp"])
