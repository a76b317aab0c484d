"""The search space: disaggregated layouts priced by the estimate and ranked with
the colocated ones, speculative decoding as a search axis, and near misses simulated."""

from __future__ import annotations

import copy
import dataclasses
import math

import pandas as pd
import pytest

from simulator.cluster.pools import build_plan
from simulator.cluster.simulation import workload_requests
from simulator.cluster.stepmodel import StepModel, step_mix
from simulator.hardware.specs import load_node
from simulator.io.scenario import load_scenario
from simulator.io.schema import SloKeys
from simulator.model.spec import load_model
from simulator.parallel.collective import BANDWIDTH_EFFICIENCY
from simulator.planner import nearmiss, plan
from simulator.planner.disagg import disagg_rows, pools_of
from simulator.planner.plan import enumerate_candidates
from simulator.planner.report import format_plan, recommended_scenario, write_plan
from simulator.planner.simulate import base_scenario
from simulator.planner.space import Layout, layout_label, workload_stats
from simulator.sweep import resolve_point

#: Llama-3.1-8B on one DGX H100, constant lengths (the hand computation needs no means).
CONST = {"name": "search", "seed": 2, "model": {"name": "llama-3.1-8b"},
         "cluster": {"topology": "dgx-h100", "nodes": 1},
         "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
         "workload": {"arrival": "poisson", "rate_per_s": 10.0, "num_requests": 40,
                      "prompt_tokens": 1000, "output_tokens": 101},
         "slo": {"ttft_s": 1.0, "tpot_s": 0.05}}


def search_setup(sc: dict, requests: int = 40):
    base = base_scenario(sc, None, requests)
    s = load_scenario(base)
    return base, s, workload_stats(s, workload_requests(s))


def test_pool_estimate_by_hand():
    """Prefill TP1 x 1 + decode TP1 x 1 of Llama-3.1-8B bf16, prompts of 1000 tokens,
    replies of 101: capacity, TTFT, TPOT and the KV transfer from first principles."""
    base, s, st = search_setup(CONST)
    rows = disagg_rows(base, s, load_model("llama-3.1-8b"), 2, st, 1000, 1.0, 0.05)
    assert {r["kind"] for r in rows} == {"disaggregated"}
    r = next(r for r in rows if r["max_num_seqs"] == 64
             and r["prefill_max_num_batched_tokens"] == 16384)
    assert (r["prefill_tp"], r["prefill_dp"], r["tp"], r["dp"], r["gpus"]) == (1, 1, 1, 1, 2)
    # KV of one token: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes = 131072 bytes,
    # GPU 0 -> NVSwitch -> GPU 1 at the NVLink bandwidth x the point-to-point efficiency.
    node = load_node("dgx-h100")
    per_token = 131072 / (node.scale_up.bandwidth_Bps * BANDWIDTH_EFFICIENCY)
    alone = 1000 * per_token  # shared with the other transfers into the one decode
    t_kv = alone / (1 - st.rate_per_s * alone) + 2 * node.scale_up.latency_s  # replica: PS
    assert r["est_kv_transfer_s"] == pytest.approx(t_kv, rel=1e-6)
    # The pools' steps, priced by the same stage costs the simulator uses.
    cp = build_plan(load_scenario(resolve_point(base, {"parallel.tp": 1, "parallel.dp": 1},
                                                s.seed)))
    m = StepModel(cp, 0.0 if cp.scenario.engine.cpu_overlap else
                  cp.scenario.engine.step_overhead_s, 1)
    full = m.cycle(*step_mix(0.0, 16384, 1000.0, 101.0))  # 16.4 prompts of 1000 tokens
    x_p = (16384 / 1000) / full
    rate = st.rate_per_s
    rho = rate / x_p
    # The step a prompt joins: its 1000 tokens plus, with the busy fraction u, those that
    # arrived during the step in flight (tests/test_planner_poolaxes.py checks it closely).
    one = r["est_prefill_s"]
    a = rate * 1000 * one  # x = 1000 + (a / x) a: x^2 - 1000 x - a^2 = 0
    joined = (1000 + math.sqrt(1000**2 + 4 * a * a)) / 2
    assert one == pytest.approx(m.cycle(*step_mix(0.0, joined, 1000.0, 101.0)), rel=2e-3)
    wait = rho / (2 * (1 - rho)) * one * 1000 / joined  # M/D/1 on a prompt's work
    assert r["est_ttft_s"] == pytest.approx(one + wait, rel=1e-4)  # x to half a token
    assert r["est_ttft_p99_s"] == pytest.approx(one + 4.6 * wait, rel=1e-4)
    # Decode: Little's law B = lambda x O x cycle(B) (one stream), TPOT = cycle + t_kv/(O-1).
    b = r["est_batch"]
    cyc = m.cycle(*step_mix(b, 0.0, 1000.0, 101.0))
    assert b == pytest.approx(rate * 101 * cyc, rel=2e-3)
    assert r["est_tpot_s"] == pytest.approx(cyc + t_kv / 100, rel=1e-9)
    b_max = 64  # max_num_seqs binds: the KV cache holds far more
    x_d = b_max / (101 * m.cycle(*step_mix(b_max, 0.0, 1000.0, 101.0)))
    assert r["est_capacity_req_per_s"] == pytest.approx(min(x_p, x_d), rel=1e-9)
    assert r["est_utilization"] == pytest.approx(rate / min(x_p, x_d), rel=1e-9)


@pytest.fixture(scope="module")
def mixed_plan():
    return plan(CONST, gpus=3, top=4, requests=40, jobs=1, disagg=True)


def test_disaggregated_and_colocated_points_in_one_ranking(mixed_plan, tmp_path):
    r = mixed_plan
    c = r.candidates
    feasible = c[c["status"] == "feasible"]
    assert set(feasible["kind"]) == {"colocated", "disaggregated"}
    # One est_rank sequence over both kinds, in the table's order.
    ranks = feasible["est_rank"].to_numpy()
    assert list(ranks) == sorted(ranks) and len(set(ranks)) == len(ranks)
    t = r.table
    assert set(t["kind"]) == {"colocated", "disaggregated"}
    assert list(t["rank"]) == list(range(1, len(t) + 1))
    dis = t[t["kind"] == "disaggregated"]
    assert (dis["status"] == "ok").all()
    assert dis["pools"].str.match(r"prefill TP\d PP\d DP\d \+ decode TP\d PP\d DP\d").all()
    assert (dis["gpus"] == dis["prefill_tp"] * dis["prefill_pp"] * dis["prefill_dp"]
            + dis["tp"] * dis["pp"] * dis["dp"]).all()
    assert set(r.rank_correlations) == {"colocated", "disaggregated"}
    assert not math.isnan(r.rank_correlations["colocated"])
    write_plan(r, tmp_path, figure=False)
    csv = pd.read_csv(tmp_path / "plan.csv")
    assert {"kind", "spec_k", "pools", "est_slo", "binds", "prefill_tp"} <= set(csv.columns)
    text = format_plan(r)
    assert "per kind: colocated" in text and "near miss" in text


def test_disaggregated_pools_build_where_the_estimate_placed_them():
    """The pool pair of a candidate row builds (prefill on the first GPUs, decode on the
    next, packed), GPU-granular: 3 + 5 GPUs of one node."""
    base, s, _ = search_setup(CONST)
    row = {"prefill_tp": 1, "prefill_pp": 1, "prefill_dp": 3, "tp": 1, "pp": 1, "dp": 5,
           "max_num_seqs": 64, "max_num_batched_tokens": 2048}
    data = copy.deepcopy(base)
    data["pools"] = pools_of(row, 1, s)
    p = build_plan(load_scenario(data))
    gpus = [sorted(g for rp in pool.replicas for g in rp.placement.gpus)
            for pool in p.pools]
    assert gpus == [[f"gpu{i}" for i in range(3)], [f"gpu{i}" for i in range(3, 8)]]


SPEC = {**CONST, "name": "spec",
        "workload": {"arrival": "poisson", "rate_per_s": 0.5, "num_requests": 30,
                     "prompt_tokens": 256, "output_tokens": 128},
        "speculative": {"method": "eagle", "num_speculative_tokens": 3, "acceptance": 0.7}}


def test_speculation_wins_at_batch_one():
    """At 0.5 req/s a 1-GPU 8B replica decodes about one sequence: a step is bound by
    reading the weights, so verifying k + 1 tokens costs little more than 1 and yields
    1 + E[A] tokens: the estimate ranks speculation first by TPOT and the simulation
    agrees."""
    r = plan(SPEC, gpus=1, top=4, requests=30, jobs=1, objective="min_tpot")
    c = r.candidates[r.candidates["status"] == "feasible"]
    assert set(c["spec_k"]) == {0, 1, 3, 5}
    assert c.iloc[0]["spec_k"] > 0
    t = r.table
    on, off = t[t["spec_k"] > 0], t[t["spec_k"] == 0]
    assert len(on) and len(off)
    assert on["tpot_slo_q_s"].min() < 0.8 * off["tpot_slo_q_s"].min()
    assert int(r.best["spec_k"]) > 0


def test_speculation_loses_when_saturated():
    """Far past capacity with 512 sequences per step, the step is compute-bound: verifying
    k + 1 tokens per sequence costs about k + 1 times as much while it yields 1 + E[A] <
    k + 1 tokens, so every speculative setting has less capacity than plain decoding."""
    sc = copy.deepcopy(SPEC)
    sc["engine"] = {"max_num_seqs": 512, "max_num_batched_tokens": 8192}
    sc["workload"]["rate_per_s"] = 1000.0
    sc["speculative"]["acceptance"] = 0.6
    base, s, st = search_setup(sc, 200)
    c = enumerate_candidates(base, s, 1, st, "goodput_per_gpu", 1)
    big = c[(c["max_num_seqs"] == 512) & (c["max_num_batched_tokens"] == 8192)]
    cap = big.set_index("spec_k")["est_capacity_req_per_s"]
    assert cap[0] > cap[1] > cap[3] > cap[5]
    assert c.iloc[0]["spec_k"] == 0  # ranked first on capacity (everything misses TPOT)


def test_margin_from_the_error_distribution():
    table = pd.DataFrame({"status": ["ok"] * 5,
                          "est_tpot_s": [1.0, 1.05, 1.1, 1.2, 1.3],
                          "tpot_slo_q_s": [1.0] * 5,
                          "est_ttft_p99_s": [0.5, 0.6, 0.7, 0.8, 0.9],
                          "ttft_slo_q_s": [1.0] * 5})
    m = nearmiss.margins(table)
    assert m["tpot"] == pytest.approx(1.26)  # p90 of the ratios 1.0 ... 1.3
    assert m["ttft"] == 1.0  # an optimistic estimate needs no margin
    few = nearmiss.margins(table.head(2))  # too few points: the priors
    assert {k: few[k] for k in nearmiss.PRIOR_MARGIN} == nearmiss.PRIOR_MARGIN
    slo = SloKeys(ttft_s=1.0, tpot_s=0.1)
    cands = pd.DataFrame({"status": ["feasible"] * 4 + ["excluded"],
                          "est_goodput_req_per_s": [1.0, 0.0, 0.0, 0.0, math.nan],
                          "est_utilization": [0.5, 0.5, 0.5, 1.2, math.nan],
                          "est_ttft_p99_s": [0.5] * 5,
                          "est_tpot_s": [0.09, 0.12, 0.13, 0.11, math.nan]})
    assert list(nearmiss.est_slo(cands, slo, m)) == ["meets", "may meet", "misses",
                                                      "misses", ""]


def test_near_miss_brings_a_just_missing_candidate_into_simulation(monkeypatch):
    """The TPOT target is set 3% under the estimate of the one-GPU layout: without a
    margin the plan never simulates it (two-GPU layouts meet the SLOs by estimate and
    rank first); with the prior margin it may meet, ranks first on goodput per GPU and
    is simulated."""
    sc = copy.deepcopy(CONST)
    base, s, st = search_setup(sc)
    c = enumerate_candidates(base, s, 2, st, "goodput_per_gpu", 1)
    one = c[(c["gpus"] == 1) & (c["status"] == "feasible")]
    sc["slo"]["tpot_s"] = float(one["est_tpot_s"].min()) * 0.97

    def simulated_one_gpu(prior):
        monkeypatch.setattr(nearmiss, "PRIOR_MARGIN", prior)
        r = plan(sc, gpus=2, top=2, requests=40, jobs=1)
        c = r.candidates
        return c[(c["gpus"] == 1) & c["simulated"]], r

    none, r0 = simulated_one_gpu({"ttft": 1.0, "tpot": 1.0})
    assert none.empty and r0.best is not None and int(r0.best["gpus"]) == 2
    some, _ = simulated_one_gpu({"ttft": 1.0, "tpot": 1.1})
    assert len(some)


def test_labels_of_new_kinds():
    row = {"tp": 4, "pp": 1, "dp": 1, "kind": "disaggregated", "prefill_tp": 2,
           "prefill_pp": 1, "prefill_dp": 2, "spec_k": 0}
    assert layout_label(row) == "prefill TP2 PP1 DP2 + decode TP4 PP1 DP1"
    assert layout_label({"tp": 1, "pp": 1, "dp": 1, "spec_k": 3}) == "TP1 PP1 DP1 spec k=3"
    assert str(Layout(2, 1, 1)) == "TP2 PP1 DP1"


def test_recommended_scenario_of_a_disaggregated_pick_builds(mixed_plan):
    t = mixed_plan.table
    row = t[t["kind"] == "disaggregated"].iloc[0]
    data = recommended_scenario(dataclasses.replace(mixed_plan, best=row))
    pools = build_plan(load_scenario(data)).pools
    assert [(p.spec.role, p.spec.tp, p.spec.dp) for p in pools] == [
        ("prefill", int(row["prefill_tp"]), int(row["prefill_dp"])),
        ("decode", int(row["tp"]), int(row["dp"]))]
