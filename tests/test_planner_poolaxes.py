"""The disaggregated pools' search axes: the prefill pool's token budget, the
decode pool's speculation, and KV transfers contending on the links, each estimated by
hand here; plans without these axes keep their plan.csv (golden files written by the
code before the axes, tests/data/poolaxes)."""

from __future__ import annotations

import copy
import dataclasses
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_planner_search import CONST, SPEC, search_setup

from simulator import run
from simulator.cluster.pools import build_plan
from simulator.cluster.stepmodel import StepModel, step_mix
from simulator.io.scenario import load_scenario
from simulator.model.spec import load_model
from simulator.planner import plan
from simulator.planner.candidates import spec_options
from simulator.planner.disagg import decode_sides, disagg_rows, pools_of, prefill_sides, shapes
from simulator.planner.estimate import spec_step
from simulator.planner.plan import INTERVAL_COLUMNS
from simulator.planner.poolaxes import (
    PREFILL_BUDGETS,
    joined_step,
    kv_contended,
    pareto_budgets,
    spec_plan,
)
from simulator.planner.report import recommended_scenario, write_plan
from simulator.planner.space import Limits
from simulator.sweep import resolve_point

GOLDEN = Path(__file__).parent / "data" / "poolaxes"


def tp1_shape():
    """The TP1 pool shape of Llama-3.1-8B on a DGX H100, its stats and its step model."""
    base, s, st = search_setup(CONST)
    (lay, cp), *_ = shapes(base, s, load_model("llama-3.1-8b"), 2, Limits(64, 8192), 1000)
    plain = build_plan(load_scenario(resolve_point(base, {"parallel.tp": 1}, s.seed)))
    m = StepModel(plain, plain.scenario.engine.step_overhead_s
                  if not plain.scenario.engine.cpu_overlap else 0.0, 1)
    return lay, cp, st, m


def test_prefill_budget_by_hand():
    """Prompts of 1000 tokens at 30 req/s into one TP1 prefill replica, three budgets:
    capacity from a full step, the joined step's fixed point, the M/D/1 wait, and a
    512-token budget that splits every prompt into two chunks."""
    lay, cp, st, m = tp1_shape()
    st = dataclasses.replace(st, rate_per_s=30.0)

    def s(x: float) -> float:
        return m.cycle(*step_mix(0.0, x, 1000.0, 101.0))

    for budget in (512, 2048, 16384):
        (side,) = [x for x in prefill_sides(lay, cp, st, 2, [Limits(64, budget)])
                   if x.dp == 1]
        full = min(budget, 64 * 1000)
        cap = (full / 1000) / s(full)
        assert side.capacity == pytest.approx(cap, rel=1e-9)
        rho = 30.0 / cap
        if budget == 512:  # two full chunk steps per prompt, the step stays at 512 tokens
            x, own = 512, 2 * s(512)
        else:  # x = 1000 + (a s(x) / x) a s(x), a = 30 x 1000 tokens/s: x^2 - 1000x - b^2
            b = 30.0 * 1000 * (side.cycle_s)
            x = (1000 + math.sqrt(1000**2 + 4 * b * b)) / 2
            own = s(x)
            assert 1000 < x < full
        assert side.cycle_s == pytest.approx(own, rel=2e-3)
        wait = rho / (2 * (1 - rho)) * own / math.ceil(1000 / budget) * 1000 / x
        assert side.ttft_s == pytest.approx(side.cycle_s + wait, rel=1e-3)
        assert side.ttft_p99_s == pytest.approx(side.cycle_s + 4.6 * wait, rel=1e-3)


def test_joined_step_limits():
    """Idle stream: a prompt runs alone; past saturation the step fills the budget; a step
    of constant length d gives the closed form of x = c + (a d / x) a d."""
    assert joined_step(lambda x: 0.01, 1000.0, 8192.0, 0.0) == 1000.0
    assert joined_step(lambda x: 1e-4 * x, 1000.0, 8192.0, 20000.0) == 8192.0
    x = joined_step(lambda x: 0.05, 1000.0, 8192.0, 30000.0)  # a d = 1500 tokens
    assert x == pytest.approx((1000 + math.sqrt(1000**2 + 4 * 1500**2)) / 2, abs=0.5)


def test_bigger_budget_trades_ttft_for_capacity():
    """The trade-off the budget axis exists for: at 30 req/s a 16384-token budget has more
    capacity than 1024 (fewer steps per prompt, their fixed costs shared) but its prompts
    join longer steps, so TTFT is longer; both stay after the Pareto filter, the middle
    budgets that neither beats on anything are dropped."""
    lay, cp, st, _ = tp1_shape()
    st = dataclasses.replace(st, rate_per_s=30.0)
    lims = [Limits(64, b) for b in PREFILL_BUDGETS]
    sides = [x for x in prefill_sides(lay, cp, st, 2, lims) if x.dp == 1]
    by = {x.limits.max_num_batched_tokens: x for x in sides}
    assert {1024, 16384} <= set(by)
    small, big = by[1024], by[16384]
    assert big.capacity > 1.1 * small.capacity
    assert big.ttft_s > 1.1 * small.ttft_s
    assert big.cycle_s > small.cycle_s  # the step at the load
    # Every kept option is beaten by no other on all three figures.
    for a in sides:
        assert not any(b is not a and b.capacity >= a.capacity and b.ttft_s <= a.ttft_s
                       and b.ttft_p99_s <= a.ttft_p99_s for b in sides)


def test_pareto_keeps_the_first_of_equals():
    lay, cp, st, _ = tp1_shape()
    (one,) = [x for x in prefill_sides(lay, cp, st, 2, [Limits(64, 2048)]) if x.dp == 1]
    twin = dataclasses.replace(one, limits=Limits(64, 4096))
    worse = dataclasses.replace(one, limits=Limits(64, 8192), capacity=one.capacity / 2)
    other_dp = dataclasses.replace(worse, dp=2)
    assert pareto_budgets([one, twin, worse, other_dp]) == [one, other_dp]


@pytest.fixture(scope="module")
def disagg_plan():
    sc = copy.deepcopy(CONST)
    sc["workload"]["rate_per_s"] = 30.0
    return plan(sc, gpus=3, top=4, requests=60, jobs=1, disagg=True)


def test_plan_csv_and_recommendation_carry_the_prefill_limits(disagg_plan, tmp_path):
    r = disagg_plan
    c = r.candidates
    dis = c[(c["kind"] == "disaggregated") & (c["status"] == "feasible")]
    budgets = set(dis["prefill_max_num_batched_tokens"].astype(int))
    assert {1024, 16384} <= budgets <= set(PREFILL_BUDGETS)  # the trade-off, in the plan
    assert set(dis["prefill_max_num_seqs"].astype(int)) == {64}
    write_plan(r, tmp_path, figure=False)
    csv = pd.read_csv(tmp_path / "plan.csv")
    rows = csv[csv["kind"] == "disaggregated"]
    assert len(rows) and rows["prefill_max_num_batched_tokens"].notna().all()
    # The recommended pools carry the row's prefill limits (the pick, or any pooled row).
    row = rows.iloc[0]
    pre = pools_of(row, 1, r.scenario)[0]
    assert pre["engine"] == {"max_num_seqs": int(row["prefill_max_num_seqs"]),
                             "max_num_batched_tokens":
                                 int(row["prefill_max_num_batched_tokens"])}
    if r.best is not None and r.best["kind"] == "disaggregated":
        rec = recommended_scenario(r)
        assert rec["pools"][0]["engine"]["max_num_batched_tokens"] == int(
            r.best["prefill_max_num_batched_tokens"])


@pytest.mark.parametrize("name, sc, gpus, requests", [("colocated_plan", CONST, 2, 40),
                                                      ("spec_plan", SPEC, 1, 30)])
def test_plans_without_the_pool_axes_are_unchanged(name, sc, gpus, requests):
    """Plans without ``--disagg`` (colocated, and colocated with a speculation axis) give
    the plan.csv the code before these axes gave (golden files: ``plan(sc, gpus=gpus,
    top=4, requests=requests, jobs=1).table.to_csv(path, index=False)`` at commit 7b38831;
    a later change that moves colocated results on purpose rewrites them the same way)."""
    # the interval columns came later (the golden files predate them; the rest must not move)
    got = plan(sc, gpus=gpus, top=4, requests=requests, jobs=1).table.drop(
        columns=INTERVAL_COLUMNS)
    want = pd.read_csv(GOLDEN / f"{name}.csv")
    got = pd.read_csv(io.StringIO(got.to_csv(index=False)))
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12)


# -- 2. the decode pool speculates ---------------------------------------------------------

def _spec_decode(rate: float):
    """Decode sides of the TP1 shape for SPEC (EAGLE, k = 3, acceptance 0.7) at ``rate``,
    plain and with speculation, and what the hand computation needs."""
    base, s, st = search_setup(SPEC)
    st = dataclasses.replace(st, rate_per_s=rate)
    model = load_model("llama-3.1-8b")
    (lay, cp), *_ = shapes(base, s, model, 2, Limits(64, 2048), 1000)
    spec_cp = spec_plan(base, s.seed, lay, Limits(64, 2048), False)
    sides = decode_sides(lay, cp, st, 2, [Limits(64, 2048)], 1000, spec_cp)
    return sides, cp, spec_cp, st


def test_decode_speculation_by_hand():
    """k = 3 drafts with a geometric acceptance of 0.7: 1 + E[A] = 1 + 0.7 + 0.49 + 0.343
    tokens per step; the batch by Little's law over O / (1 + E[A]) steps; capacity from
    the largest batch; the drafter's weights and KV come out of the KV cache."""
    sides, cp, spec_cp, st = _spec_decode(20.0)
    by = {x.spec_k: x for x in sides if x.dp == 1}
    assert set(by) == {0, 1, 3, 5}
    plain, k3 = by[0], by[3]
    assert k3.gain == pytest.approx(1 + 0.7 + 0.49 + 0.343, rel=1e-9)
    assert plain.gain == 1.0
    assert k3.kv_tokens < plain.kv_tokens  # the EAGLE layer's KV and weights
    m = StepModel(cp, cp.scenario.engine.step_overhead_s
                  if not cp.scenario.engine.cpu_overlap else 0.0, 1)
    (spec,) = [x for x in spec_options(spec_cp) if x.k == 3]
    p, o = 256.0, 128.0

    def cyc(b: float) -> float:
        return spec_step(m, spec, b, 0.0, p, o)

    b = k3.batch
    assert k3.cycle_s == pytest.approx(cyc(b), rel=1e-9)
    assert b == pytest.approx(20.0 * o / k3.gain * cyc(b), rel=2e-3)  # Little's law
    b_max = 64  # max_num_seqs binds; 64 x 4 tokens fit the 2048-token budget
    assert k3.capacity == pytest.approx(b_max * k3.gain / (o * cyc(b_max)), rel=1e-9)
    # The TPOT the pair reports: a step per 1 + E[A] tokens (plus the KV transfer share).
    assert k3.cycle_s / k3.gain < 0.7 * plain.cycle_s


def test_decode_speculation_stops_where_the_engine_stops():
    """Past ``disable_by_batch_size`` the pool decodes plainly: one token per step."""
    sc = copy.deepcopy(SPEC)
    sc["speculative"]["disable_by_batch_size"] = 4
    base, s, st = search_setup(sc)
    st = dataclasses.replace(st, rate_per_s=100.0)
    (lay, cp), *_ = shapes(base, s, load_model("llama-3.1-8b"), 2, Limits(64, 2048), 1000)
    spec_cp = spec_plan(base, s.seed, lay, Limits(64, 2048), False)
    sides = decode_sides(lay, cp, st, 2, [Limits(64, 2048)], 1000, spec_cp)
    one = [x for x in sides if x.dp == 1]
    assert all(x.batch >= 4 and x.gain == 1.0 for x in one)
    plain = next(x for x in one if x.spec_k == 0)
    assert all(x.cycle_s == pytest.approx(plain.cycle_s, rel=1e-9) for x in one)


def test_plain_pool_rows_do_not_depend_on_the_speculative_section():
    """A scenario's [speculative] section adds rows; the plain (spec_k = 0) rows are those
    of the scenario without it."""
    sc = copy.deepcopy(SPEC)
    no = {k: v for k, v in sc.items() if k != "speculative"}
    rows = {}
    for name, scen in (("spec", sc), ("plain", no)):
        base, s, st = search_setup(scen)
        rows[name] = disagg_rows(base, s, load_model("llama-3.1-8b"), 2, st, 1000, 1.0, 0.05)
    assert {r["spec_k"] for r in rows["plain"]} == {0}
    assert {r["spec_k"] for r in rows["spec"]} == {0, 1, 3, 5}
    assert [r for r in rows["spec"] if r["spec_k"] == 0] == rows["plain"]


def test_pooled_run_speculates_on_the_decode_pool():
    """[speculative] with [[pools]]: the decode pool drafts (its KV cache pays for the
    drafter), the prefill pool does not; TPOT at low load falls."""
    base, s, _ = search_setup(SPEC, 30)
    row = {"prefill_tp": 1, "prefill_pp": 1, "prefill_dp": 1, "tp": 1, "pp": 1, "dp": 1,
           "max_num_seqs": 64, "max_num_batched_tokens": 2048}
    out = {}
    for spec in (True, False):
        data = copy.deepcopy(base)
        if not spec:
            del data["speculative"]
        data["pools"] = pools_of(row, 1, s)
        out[spec] = run(data)
    on, off = out[True], out[False]
    assert on.summary["kv_tokens_per_replica"][0] == off.summary["kv_tokens_per_replica"][0]
    assert on.summary["kv_tokens_per_replica"][1] < off.summary["kv_tokens_per_replica"][1]
    assert on.summary["acceptance_length_mean"] > 1.5
    assert "acceptance_length_mean" not in off.summary
    assert on.requests["tpot_s"].mean() < 0.7 * off.requests["tpot_s"].mean()
    # The first token comes from the prefill pool, which does not speculate.
    assert on.requests["ttft_s"].to_numpy() == pytest.approx(
        off.requests["ttft_s"].to_numpy(), rel=1e-9)


def test_disaggregated_speculative_pick_is_simulated_and_recommended(tmp_path):
    """At 0.5 req/s the estimate ranks the speculating decode pool first among the pairs
    by TPOT; it is simulated (status ok) and its simulated TPOT beats the plain pair's;
    the recommended.toml of such a row carries the pools, the k on the decode pool, and
    loads."""
    r = plan(SPEC, gpus=2, top=8, requests=30, jobs=1, disagg=True, objective="min_tpot")
    t = r.table
    dis = t[t["kind"] == "disaggregated"]
    on, off = dis[dis["spec_k"] > 0], dis[dis["spec_k"] == 0]
    assert len(on) and len(off) and (dis["status"] == "ok").all()
    assert on["tpot_slo_q_s"].min() < 0.8 * off["tpot_slo_q_s"].min()
    assert set(r.rank_correlations) >= {"disaggregated", "disaggregated+spec"}
    best = on.iloc[0]
    rec = recommended_scenario(dataclasses.replace(r, best=best))
    assert "speculative" not in rec  # on the decode pool only (tests/test_pool_speculation)
    assert rec["pools"][1]["speculative"]["num_speculative_tokens"] == int(best["spec_k"])
    assert [p["role"] for p in rec["pools"]] == ["prefill", "decode"]
    load_scenario(rec)


# -- 3. KV transfers contend on the links ---------------------------------------------------

def test_kv_contention_by_hand():
    """Processor sharing at the busiest end: 28 ms alone, 20 transfers/s into one decode
    replica: rho = 0.56, 28 / 0.44 = 63.6 ms; two ends halve rho; a closed loop or an idle
    link prices a transfer alone; at rho >= 1 the links cannot keep up."""
    alone, lat = np.array([0.028, 0.028, 0.028, 0.05]), np.array([1e-5] * 4)
    t, x = kv_contended(alone, lat, 20.0, np.array([1, 2, 4, 1]))
    assert t[0] == pytest.approx(0.028 / (1 - 0.56) + 1e-5, rel=1e-12)
    assert t[1] == pytest.approx(0.028 / (1 - 0.28) + 1e-5, rel=1e-12)
    assert t[2] == pytest.approx(0.028 / (1 - 0.14) + 1e-5, rel=1e-12)
    assert t[3] == math.inf  # 20 x 50 ms = 1 s of transfer per second on one end
    assert list(x) == pytest.approx([1 / 0.028, 2 / 0.028, 4 / 0.028, 20.0])
    t0, _ = kv_contended(alone, lat, None, np.array([1, 2, 4, 1]))
    assert list(t0) == list(alone + lat)


def _eight_to_one(rate: float):
    """Eight TP1 prefill replicas on node 0 send 8000-token prompts of Llama-3.1-8B to one
    TP1 decode replica on node 1 (over the NICs): every transfer shares its ingress."""
    sc = {"name": "kvc", "seed": 3, "model": {"name": "llama-3.1-8b"},
          "cluster": {"topology": "dgx-h100", "nodes": 2},
          "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 8192},
          "workload": {"arrival": "poisson", "rate_per_s": rate, "num_requests": 1000,
                       "prompt_tokens": 8000, "output_tokens": 101},
          "slo": {"ttft_s": 10.0, "tpot_s": 1.0}}
    base, s, st = search_setup(sc, 1000)
    rows = disagg_rows(base, s, load_model("llama-3.1-8b"), 9, st, 8101, 10.0, 1.0)
    r = next(r for r in rows if (r["prefill_tp"], r["prefill_dp"], r["tp"], r["dp"])
             == (1, 8, 1, 1) and r["max_num_seqs"] == 64 and r["status"] == "feasible")
    data = copy.deepcopy(base)
    data["pools"] = pools_of(r, 2, s)
    return r, st, run(data).requests


def test_kv_contention_against_the_simulation():
    """At 15 req/s the transfers into the one decode replica hold its NIC 42% of the time
    (15 x 28 ms): the simulated mean transfer is within 10% of the processor-sharing
    estimate and over 1.4x the transfer alone."""
    r, st, q = _eight_to_one(15.0)
    t = r["est_kv_transfer_s"]
    alone = t / (1 + st.rate_per_s * t)  # T of t = T / (1 - rate T) (latency: microseconds)
    assert st.rate_per_s * alone > 0.35
    sim = q["kv_transfer_s"].mean()
    assert abs(t - sim) < 0.1 * sim
    assert sim > 1.4 * alone
    assert r["est_capacity_req_per_s"] <= 1 / alone + 1e-9
