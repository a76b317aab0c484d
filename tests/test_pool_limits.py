"""The pools' engine limits: the prefill pool's ``max_num_seqs`` searched
(poolaxes.prefill_limits, pareto_limits), estimated by hand here, and carried by plan.csv
and recommended.toml; the wait for a decode slot (poolaxes.decode_wait), by hand and
against the simulation."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
from test_planner_poolaxes import tp1_shape
from test_planner_search import CONST, search_setup

from simulator import run
from simulator.io.scenario import load_scenario
from simulator.model.spec import load_model
from simulator.planner import plan
from simulator.planner.disagg import disagg_rows, pools_of, prefill_sides, shapes, step_model
from simulator.planner.estimate import step_mix
from simulator.planner.poolaxes import (
    PREFILL_BUDGET,
    PREFILL_BUDGETS,
    PREFILL_SEQS,
    SEQS_MARGIN,
    decode_wait,
    pareto_limits,
    prefill_limits,
)
from simulator.planner.report import recommended_scenario
from simulator.planner.space import Limits, layout_label


def _long(prompt: int = 1500):
    """CONST with prompts of ``prompt`` tokens: the TP1 prefill shape and its stats."""
    sc = copy.deepcopy(CONST)
    sc["workload"]["prompt_tokens"] = prompt
    base, s, st = search_setup(sc)
    (lay, cp), *_ = shapes(base, s, load_model("llama-3.1-8b"), 2, Limits(64, 8192),
                           int(prompt))
    return base, s, st, lay, cp


def test_prefill_limits_put_the_scenarios_first():
    """The scenario's max_num_seqs at every budget first, then each other of PREFILL_SEQS;
    sarathi keeps its one budget for each."""
    e = load_scenario(CONST).engine  # max_num_seqs 64, budget 2048
    lims = prefill_limits(e)
    budgets = sorted({*PREFILL_BUDGETS, 2048})
    assert lims == [Limits(n, b) for n in (64, *PREFILL_SEQS) for b in budgets]
    sar = load_scenario({**CONST, "engine": {**CONST["engine"], "scheduler": "sarathi"}})
    assert prefill_limits(sar.engine) == [Limits(n, PREFILL_BUDGET) for n in (64, 1, 2, 4, 8)]
    four = load_scenario({**CONST, "engine": {**CONST["engine"], "max_num_seqs": 4}})
    assert [x.max_num_seqs for x in prefill_limits(four.engine)][::len(budgets)] == [
        4, 1, 2, 8]


def test_one_prompt_per_step_by_hand():
    """max_num_seqs = 1, prompts of 1500 tokens, budget 2048: every step holds one prompt
    (``F = min(2048, 1 x 1500)``), so the pool is an M/D/1 queue with service s(1500):
    capacity ``1 / s``, TTFT ``s + rho / (2 (1 - rho)) s``, p99 ``s + 4.6`` times that
    wait; with max_num_seqs = 2 a full step holds two prompts (3000 tokens, budget 4096),
    so capacity is ``2 / s(3000)`` and the step a prompt joins grows past one prompt."""
    base, s, st, lay, cp = _long()
    m = step_model(cp)  # the pool's step model
    rate = 20.0
    st = dataclasses.replace(st, rate_per_s=rate)

    def step(x: float) -> float:
        return m.cycle(*step_mix(0.0, x, 1500.0, 101.0))

    (one,) = [x for x in prefill_sides(lay, cp, st, 2, [Limits(1, 2048)]) if x.dp == 1]
    svc = step(1500)
    rho = rate * svc
    assert 0.3 < rho < 0.9
    assert one.capacity == pytest.approx(1 / svc, rel=1e-9)
    assert one.batch == pytest.approx(1.0, rel=1e-9)  # tokens / P: one prompt per step
    wait = rho / (2 * (1 - rho)) * svc
    assert one.ttft_s == pytest.approx(svc + wait, rel=1e-9)
    assert one.ttft_p99_s == pytest.approx(svc + 4.6 * wait, rel=1e-9)
    (two,) = [x for x in prefill_sides(lay, cp, st, 2, [Limits(2, 4096)]) if x.dp == 1]
    assert two.capacity == pytest.approx(2 / step(3000), rel=1e-9)
    assert 1.0 < two.batch < 2.0
    assert two.capacity > one.capacity and two.ttft_s > one.ttft_s


def test_a_prompt_cap_joins_the_search_where_it_beats_the_budgets():
    """Prompts of 1500 tokens at 20 req/s: one prompt per step (budget 2048) has a mean
    TTFT more than SEQS_MARGIN below every option at the scenario's max_num_seqs of the
    same replicas, so the search keeps it; its twins (max_num_seqs 2..8 with the 1024
    budget: the same 1024-token steps as 64) are dropped."""
    base, s, st, lay, cp = _long()
    st = dataclasses.replace(st, rate_per_s=20.0)
    sides = [x for x in prefill_sides(lay, cp, st, 2, prefill_limits(s.engine)) if x.dp == 1]
    own = [x for x in sides if x.limits.max_num_seqs == 64]
    new = [x for x in sides if x.limits.max_num_seqs != 64]
    assert own and [x.limits for x in new] == [Limits(1, 2048)]
    assert new[0].ttft_s < (1 - SEQS_MARGIN) * min(x.ttft_s for x in own)
    assert all(x.limits.max_num_batched_tokens != 1024 or x.limits.max_num_seqs == 64
               for x in sides)


def test_pareto_limits_keep_the_scenarios_options_and_drop_near_twins():
    """An option of another max_num_seqs within the margin of a kept one is dropped, even
    when a hair better; one that beats it by more is kept; the scenario's are filtered
    among themselves only."""
    lay, cp, st, _ = tp1_shape()
    (a,) = [x for x in prefill_sides(lay, cp, st, 2, [Limits(64, 2048)]) if x.dp == 1]
    hair = dataclasses.replace(a, limits=Limits(1, 2048), ttft_s=a.ttft_s * 0.99)
    better = dataclasses.replace(a, limits=Limits(2, 2048), ttft_s=a.ttft_s * 0.9)
    worse_own = dataclasses.replace(a, limits=Limits(64, 4096), capacity=a.capacity / 2)
    assert pareto_limits([a, worse_own, hair, better], 64) == [a, better]
    # Strictly better than a by more than the margin on every figure: a stays (the
    # scenario's own options are as before the axis), the newcomer joins.
    best = dataclasses.replace(a, limits=Limits(4, 2048), capacity=a.capacity * 1.5,
                               ttft_s=a.ttft_s / 2, ttft_p99_s=a.ttft_p99_s / 2)
    assert pareto_limits([a, best], 64) == [a, best]


def test_plan_carries_the_prefill_max_num_seqs(tmp_path):
    """A plan over the 1500-token prompts at 20 req/s: candidates.csv has the prompt cap,
    and a row's pools and recommended.toml carry it."""
    sc = copy.deepcopy(CONST)
    sc["workload"].update(prompt_tokens=1500, rate_per_s=20.0)
    r = plan(sc, gpus=2, top=2, requests=40, jobs=1, disagg=True)
    c = r.candidates
    dis = c[(c["kind"] == "disaggregated") & (c["status"] == "feasible")]
    assert set(dis["prefill_max_num_seqs"].astype(int)) == {64, 1}
    row = dis[dis["prefill_max_num_seqs"] == 1].iloc[0]
    assert int(row["prefill_max_num_batched_tokens"]) == 2048
    pre = pools_of(row, 1, r.scenario)[0]
    assert pre["engine"] == {"max_num_seqs": 1, "max_num_batched_tokens": 2048}
    rec = recommended_scenario(dataclasses.replace(r, best=row))
    assert rec["pools"][0]["engine"]["max_num_seqs"] == 1
    load_scenario(rec)


# -- the decode-admission wait -------------------------------------------------------------

def test_decode_wait_by_hand():
    """One slot: the Pollaczek-Khinchine M/G/1 wait, ``rho S / (1 - rho) (1 + Cs^2) / 2``;
    two slots: Erlang C is ``a^2 / (2 + a)``; past the slots' capacity: inf; a closed loop:
    none; far below the knee the wait vanishes (64 slots at half load)."""
    s = np.array([0.5, 0.5, 0.75, 0.5, 0.5])
    slots = np.array([1, 2, 2, 1, 64])
    w = decode_wait(1.5, slots, s, 0.25)
    rho = 0.75
    assert w[0] == pytest.approx(rho * 0.5 / (1 - rho) * 1.25 / 2, rel=1e-12)
    a = 0.75  # 1.5 req/s x 0.5 s on two slots
    assert w[1] == pytest.approx(a * a / (2 + a) * 0.5 / (2 - a) * 1.25 / 2, rel=1e-12)
    a = 1.125
    assert w[2] == pytest.approx(a * a / (2 + a) * 0.75 / (2 - a) * 1.25 / 2, rel=1e-12)
    w = decode_wait(2.0, slots, s, 0.0)
    assert w[3] == math.inf and np.isfinite(w[1])  # a = 1 on one slot: no steady state
    assert decode_wait(64.0, slots, s, 1.0)[4] < 1e-6 * 0.5
    assert list(decode_wait(None, slots, s, 1.0)) == [0.0] * 5


def _decode_bound(rate: float, requests: int):
    """CONST with ``max_num_seqs`` 8 at ``rate``: the TP1 + TP1 pair whose decode replica
    holds 8 sequences (~11.6 req/s of 101-token replies), estimated and simulated."""
    sc = copy.deepcopy(CONST)
    sc["engine"]["max_num_seqs"] = 8
    sc["workload"].update(rate_per_s=rate, num_requests=requests)
    base, s, st = search_setup(sc, requests)
    rows = disagg_rows(base, s, load_model("llama-3.1-8b"), 2, st, 1501, 10.0, 1.0)
    r = next(x for x in rows if x["max_num_seqs"] == 8 and x["status"] == "feasible")
    return r, st, base, s


def test_decode_wait_joins_the_pair_tpot():
    """At 10 req/s into 8 decode slots the pair's TPOT is the step plus the transfer and
    the M/G/c wait over the O - 1 later tokens; ``S = t_kv + O cycle(B)``, ``Cs^2 = 0``
    (constant replies)."""
    r, st, _, _ = _decode_bound(10.0, 400)
    o = st.output_mean
    assert st.output_cv2 == 0.0
    service = r["est_kv_transfer_s"] + o * r["est_cycle_s"]
    (w,) = decode_wait(st.rate_per_s, np.array([8.0]), np.array([service]), 0.0)
    assert 0.05 < w < 1.0  # near the knee: tens of ms per token
    assert r["est_tpot_s"] == pytest.approx(
        r["est_cycle_s"] + (r["est_kv_transfer_s"] + w) / (o - 1), rel=1e-12)


def test_decode_wait_against_the_simulation():
    """1,000 requests at 10 req/s into 8 decode slots (utilization 0.87): the simulated mean
    wait for admission (requests.csv ``decode_wait_s``) is within 20% of the estimate, and
    the TPOT with the wait is closer to the simulation than the one without."""
    r, st, base, s = _decode_bound(10.0, 1000)
    o = st.output_mean
    data = copy.deepcopy(base)
    data["pools"] = pools_of(r, 1, s)
    q = run(data).requests
    sim = q["decode_wait_s"].mean()
    est = (r["est_tpot_s"] - r["est_cycle_s"]) * (o - 1) - r["est_kv_transfer_s"]
    assert sim > 0.05
    assert abs(est - sim) < 0.2 * sim
    without = r["est_tpot_s"] - est / (o - 1)
    tpot = q["tpot_s"].mean()
    assert abs(r["est_tpot_s"] - tpot) < 0.5 * abs(without - tpot)


def test_the_label_names_a_searched_prefill_max_num_seqs():
    """A prefill pool at one of the searched max_num_seqs says so in its label (the plan's
    printout and plan.csv's pools column); any other value is the scenario's and stays
    implicit, as before the axis."""
    row = {"kind": "disaggregated", "tp": 4, "pp": 1, "dp": 1, "prefill_tp": 2,
           "prefill_pp": 1, "prefill_dp": 2, "prefill_max_num_batched_tokens": 4096,
           "prefill_max_num_seqs": 2}
    assert layout_label(row) == ("prefill TP2 PP1 DP2 + decode TP4 PP1 DP1 "
                                 "(prefill budget 4096, max_num_seqs 2)")
    assert layout_label({**row, "prefill_max_num_seqs": 256}).endswith("(prefill budget 4096)")
